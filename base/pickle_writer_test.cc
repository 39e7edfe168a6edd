#include "base/pickle_writer.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "tests/run_command.h"

namespace remat {
namespace {

using ::remat::testutil::Python3;
using ::remat::testutil::RunPython;
using ::remat::testutil::ShellQuote;
using ::remat::testutil::WriteTempFile;

// What Python makes of the pickle: repr() of the loaded object.
std::string PythonRepr(const std::string& pickle) {
  const std::string path = WriteTempFile("value.pickle", pickle);
  const auto run = RunPython("repr.py",
                             "import pickle, sys\n"
                             "with open(sys.argv[1], 'rb') as f:\n"
                             "    print(repr(pickle.load(f)), end='')\n",
                             ShellQuote(path));
  EXPECT_EQ(run.status, 0) << run.out;
  return run.out;
}

class PickleWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Python3().empty()) GTEST_SKIP() << "no python3 found at configure time";
  }
};

TEST_F(PickleWriterTest, IntegersOfEveryWidth) {
  PickleWriter p;
  p.BeginList();
  for (std::int64_t v :
       {std::int64_t{0}, std::int64_t{255}, std::int64_t{256}, std::int64_t{65535},
        std::int64_t{65536}, std::int64_t{-1}, std::int64_t{-128}, std::int64_t{-129},
        std::int64_t{std::numeric_limits<std::int32_t>::max()},
        std::int64_t{std::numeric_limits<std::int32_t>::min()}, std::int64_t{1} << 31,
        -(std::int64_t{1} << 31) - 1, std::int64_t{1} << 40,
        std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()}) {
    p.Int(v);
  }
  p.Uint(std::uint64_t{0x7f3a00000000});
  p.Uint(std::numeric_limits<std::uint64_t>::max());
  p.Uint(std::uint64_t{1} << 63);
  p.EndList();
  EXPECT_EQ(PythonRepr(p.Finish()),
            "[0, 255, 256, 65535, 65536, -1, -128, -129, 2147483647, -2147483648, 2147483648, "
            "-2147483649, 1099511627776, 9223372036854775807, -9223372036854775808, "
            "139887084830720, 18446744073709551615, 9223372036854775808]");
}

TEST_F(PickleWriterTest, ScalarsStringsAndContainers) {
  PickleWriter p;
  p.BeginDict()
      .Key("text").String("caf\xc3\xa9 \"q\" 'x'\n")
      .Key("empty").String("")
      .Key("flags").BeginList().Bool(true).Bool(false).None().EndList()
      .Key("half").Double(0.5)
      .Key("tiny").Double(-1e-300)
      .Key("pool").BeginTuple().Int(0).Int(0).EndTuple()
      .Key("nothing").BeginDict().EndDict()
      .Key("no items").BeginList().EndList()
      .Key("unit").BeginTuple().EndTuple()
      .EndDict();
  EXPECT_EQ(PythonRepr(p.Finish()),
            "{'text': 'caf\xc3\xa9 \"q\" \\'x\\'\\n', 'empty': '', 'flags': [True, False, None], "
            "'half': 0.5, 'tiny': -1e-300, 'pool': (0, 0), 'nothing': {}, 'no items': [], "
            "'unit': ()}");
}

TEST_F(PickleWriterTest, LongListsAndNesting) {
  PickleWriter p;
  p.BeginList();
  for (int i = 0; i < 5000; ++i) p.BeginDict().Key("i").Int(i).EndDict();
  p.EndList();
  const std::string path = WriteTempFile("long.pickle", p.Finish());
  const auto run = RunPython("long.py",
                             "import pickle, sys\n"
                             "v = pickle.load(open(sys.argv[1], 'rb'))\n"
                             "assert [d['i'] for d in v] == list(range(5000))\n"
                             "print('ok', end='')\n",
                             ShellQuote(path));
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_EQ(run.out, "ok");
}

TEST(PickleWriterBytesTest, ExactOpcodes) {
  PickleWriter p;
  p.BeginList().Int(1).Uint(std::uint64_t{1} << 32).String("a").EndList();
  constexpr char kExpected[] = "\x80\x02]("     // PROTO 2, EMPTY_LIST, MARK
                               "K\x01"          // BININT1 1
                               "\x8a\x05\x00\x00\x00\x00\x01"  // LONG1, 5 bytes
                               "X\x01\x00\x00\x00" "a"  // BINUNICODE, length 1
                               "e.";            // APPENDS, STOP
  const std::string expected(kExpected, sizeof(kExpected) - 1);
  EXPECT_EQ(p.Finish(), expected);
}

}  // namespace
}  // namespace remat
