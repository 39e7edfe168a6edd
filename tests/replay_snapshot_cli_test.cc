// `remat replay --snapshot/--timeline` as a user runs it, and the round trip
// back through tools/torch_snapshot_to_trace.py: the snapshot's history,
// turned into a log and replayed, gives the replay it came from.
//
// Why the numbers match exactly: the history records every allocator call of
// the replay with the caller's size (as PyTorch records it), so the converted
// log makes the same Allocate / FreeOnStream calls in the same order. It lacks
// only what never reached the allocator's pools: zero-byte allocations and the
// log's `allocate failure` lines.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/run_command.h"

namespace remat {
namespace {

using ::remat::testutil::CommandOutcome;
using ::remat::testutil::Python3;
using ::remat::testutil::RunCommand;
using ::remat::testutil::RunPython;
using ::remat::testutil::ShellQuote;
using ::remat::testutil::TempPath;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string SourcePath(const std::string& relative) {
  return ShellQuote(absl::StrCat(Env("REMAT_SOURCE_DIR"), "/", relative));
}

CommandOutcome Remat(const std::string& args) {
  return RunCommand(absl::StrCat(ShellQuote(Env("REMAT_BIN")), " ", args));
}

CommandOutcome PythonTool(const std::string& relative, const std::string& args) {
  return RunCommand(absl::StrCat(ShellQuote(Python3()), " ", SourcePath(relative), " ", args));
}

// The unsigned number after "key": in a one-line JSON report (0 if absent).
std::uint64_t JsonUint(const std::string& json, const std::string& key) {
  const std::string quoted = absl::StrCat("\"", key, "\":");
  const std::size_t at = json.find(quoted);
  if (at == std::string::npos) return 0;
  const std::size_t begin = at + quoted.size();
  const std::size_t end = json.find_first_not_of("0123456789", begin);
  std::uint64_t value = 0;
  return absl::SimpleAtoi(json.substr(begin, end - begin), &value) ? value : 0;
}

// Prints "<counter events> <max allocated> <max reserved>" of a timeline.
constexpr char kTimelineSummary[] = R"(import json, sys
trace = json.load(open(sys.argv[1]))
counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
assert all(isinstance(e["ts"], (int, float)) and e["pid"] == 0 for e in counters)
def peak(name):
    return max(e["args"]["bytes"] for e in counters if e["name"] == name)
print(len(counters), peak("allocated bytes"), peak("reserved bytes"), end="")
)";

// Whether a converted log has the original's (Time, Action, Size) rows, less
// zero-byte allocations and failures.
constexpr char kSameRows[] = R"(import csv, sys
def rows(path, keep):
    return [(r["Time"], r["Action"], r["Size"]) for r in csv.DictReader(open(path)) if keep(r)]
original = rows(sys.argv[1], lambda r: r["Action"] != "allocate failure" and r["Size"] != "0")
converted = rows(sys.argv[2], lambda r: True)
print("same" if original == converted else f"differ: {len(original)} vs {len(converted)} rows",
      end="")
)";

class ReplaySnapshotCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Env("REMAT_BIN").empty() || Env("REMAT_SOURCE_DIR").empty()) {
      GTEST_SKIP() << "REMAT_BIN and REMAT_SOURCE_DIR are set by CTest; run through ctest";
    }
    if (Python3().empty()) GTEST_SKIP() << "no python3 found at configure time";
  }
};

TEST_F(ReplaySnapshotCliTest, WritesASnapshotAndATimeline) {
  const std::string snapshot = TempPath("training_step.pickle");
  const std::string timeline = TempPath("training_step.json");
  const CommandOutcome run = Remat(
      absl::StrCat("replay --json ", SourcePath("examples/traces/training_step.csv"),
                   " --snapshot ", ShellQuote(snapshot), " --timeline ", ShellQuote(timeline)));
  ASSERT_EQ(run.status, 0) << run.out;

  const CommandOutcome checked = PythonTool("tests/check_snapshot_pickle.py", ShellQuote(snapshot));
  ASSERT_EQ(checked.status, 0) << checked.out;
  EXPECT_THAT(checked.out, HasSubstr("segment large "));
  EXPECT_THAT(checked.out, HasSubstr("  active_allocated "));
  EXPECT_THAT(checked.out, HasSubstr("\nalloc "));
  EXPECT_THAT(checked.out, HasSubstr("\nfree_completed "));

  // The timeline reaches the report's peaks (the history holds every event).
  const CommandOutcome counters = RunPython("timeline.py", kTimelineSummary, ShellQuote(timeline));
  ASSERT_EQ(counters.status, 0) << counters.out;
  const std::vector<std::string> fields = absl::StrSplit(counters.out, ' ');
  ASSERT_EQ(fields.size(), 3u) << counters.out;
  EXPECT_GT(std::stoull(fields[0]), 1000u) << "counter events";
  EXPECT_EQ(fields[1], absl::StrCat(JsonUint(run.out, "peak_allocated_bytes")));
  EXPECT_EQ(fields[2], absl::StrCat(JsonUint(run.out, "peak_reserved_bytes")));
}

TEST_F(ReplaySnapshotCliTest, SnapshotConvertedBackReplaysTheSame) {
  for (const char* name : {"training_step.csv", "multistream.csv"}) {
    SCOPED_TRACE(name);
    const std::string original = SourcePath(absl::StrCat("examples/traces/", name));
    const std::string snapshot = TempPath(absl::StrCat(name, ".pickle"));
    const std::string converted = TempPath(absl::StrCat(name, ".converted.csv"));
    const CommandOutcome first =
        Remat(absl::StrCat("replay --json ", original, " --snapshot ", ShellQuote(snapshot)));
    ASSERT_EQ(first.status, 0) << first.out;

    const CommandOutcome convert =
        PythonTool("tools/torch_snapshot_to_trace.py",
                   absl::StrCat(ShellQuote(snapshot), " -o ", ShellQuote(converted)));
    ASSERT_EQ(convert.status, 0) << convert.out;
    EXPECT_THAT(convert.out, Not(HasSubstr("before the trace began")));

    const CommandOutcome again = Remat("replay --json " + ShellQuote(converted));
    ASSERT_EQ(again.status, 0) << again.out;
    for (const char* key : {"peak_requested_bytes", "peak_allocated_bytes", "peak_active_bytes",
                            "peak_reserved_bytes", "segments_peak", "device_allocs"}) {
      EXPECT_EQ(JsonUint(again.out, key), JsonUint(first.out, key)) << key;
    }
    EXPECT_GT(JsonUint(again.out, "peak_allocated_bytes"), 0u);

    const CommandOutcome rows =
        RunPython("same_rows.py", kSameRows, absl::StrCat(original, " ", ShellQuote(converted)));
    EXPECT_EQ(rows.out, "same");
  }
}

TEST_F(ReplaySnapshotCliTest, BadOutputPathsExitTwoBeforeReplaying) {
  const std::string log = SourcePath("examples/traces/tiny.csv");
  const CommandOutcome no_dir = Remat("replay " + log + " --snapshot /nonexistent-dir/x.pickle");
  EXPECT_EQ(no_dir.status, 2) << no_dir.out;
  EXPECT_THAT(no_dir.out, HasSubstr("/nonexistent-dir/x.pickle: cannot create"));
  EXPECT_THAT(no_dir.out, Not(HasSubstr("peak"))) << "no report";

  const CommandOutcome a_dir = Remat("replay " + log + " --timeline " + ShellQuote(TempPath("")));
  EXPECT_EQ(a_dir.status, 2) << a_dir.out;
  EXPECT_THAT(a_dir.out, HasSubstr("it is a directory"));

  EXPECT_EQ(Remat("replay " + log + " --snapshot").status, 2);
  EXPECT_EQ(Remat("replay " + log + " --snapshot x.pickle --history-events -1").status, 2);
  EXPECT_EQ(Remat("replay " + log + " --snapshot x.pickle --history-events 99999999999").status, 2);
}

TEST_F(ReplaySnapshotCliTest, ASmallHistorySaysSo) {
  const std::string snapshot = TempPath("tiny.pickle");
  const CommandOutcome run =
      Remat(absl::StrCat("replay ", SourcePath("examples/traces/tiny.csv"), " --snapshot ",
                         ShellQuote(snapshot), " --history-events 3"));
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("the history kept only the newest 3 events"));
  EXPECT_THAT(run.out, HasSubstr("snapshot           " + snapshot + " (3 segments, 3 events)"));
}

TEST_F(ReplaySnapshotCliTest, HelpNamesTheOptions) {
  const CommandOutcome help = Remat("replay --help");
  EXPECT_EQ(help.status, 0);
  for (const char* option : {"--snapshot", "--timeline", "--history-events", "memory_viz",
                             "torch_snapshot_to_trace.py"}) {
    EXPECT_THAT(help.out, HasSubstr(option));
  }
}

}  // namespace
}  // namespace remat
