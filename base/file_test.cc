#include "base/file.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Dir() {
  const std::string dir = ::testing::TempDir() + "/file_test";
  fs::create_directories(dir);
  return dir;
}

TEST(FileTest, WriteFileReplacesTheFileWholeAndLeavesNothingBeside) {
  const std::string path = Dir() + "/out.txt";
  ASSERT_TRUE(WriteFile(path, "first").ok());
  ASSERT_TRUE(WriteFile(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
  for (const auto& entry : fs::directory_iterator(Dir())) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp.")));
  }
  EXPECT_EQ(WriteFile(Dir() + "/no/such/dir/x", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileTest, WriteFileWritesThroughLinksAndToDevicesAndKeepsTheMode) {
  const std::string target = Dir() + "/target.txt";
  const std::string link = Dir() + "/via_link.txt";
  ASSERT_TRUE(WriteFile(target, "old").ok());
  fs::permissions(target, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  fs::remove(link);
  fs::create_symlink(target, link);
  ASSERT_TRUE(CheckWritable(link).ok());
  ASSERT_TRUE(WriteFile(link, "new").ok());
  EXPECT_TRUE(fs::is_symlink(link));  // still a link, to the file now holding the bytes
  EXPECT_EQ(*ReadFile(target), "new");
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  ASSERT_TRUE(CheckWritable("/dev/null").ok());
  EXPECT_TRUE(WriteFile("/dev/null", "gone").ok());
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

TEST(FileTest, AnOutputNamingAnInputOrAnotherOutputIsRefused) {
  const std::string in = Dir() + "/trace.jsonl";
  ASSERT_TRUE(WriteFile(in, "kept").ok());
  // However the path is spelled.
  const std::string spelled = Dir() + "/../file_test/./trace.jsonl";
  absl::Status same = CheckOutputPaths({{"the trace", in}}, {{"--timeline", spelled}});
  EXPECT_EQ(same.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(same.message(), HasSubstr("--timeline"));
  EXPECT_THAT(same.message(), HasSubstr("the trace"));
  const std::string link = Dir() + "/link.jsonl";
  fs::remove(link);
  fs::create_symlink(in, link);
  EXPECT_FALSE(CheckOutputPaths({{"the trace", link}}, {{"--timeline", in}}).ok());
  absl::Status twice = CheckOutputPaths(
      {{"the log", in}}, {{"--snapshot", Dir() + "/a.out"}, {"--timeline", Dir() + "/a.out"}});
  EXPECT_THAT(twice.message(), HasSubstr("--snapshot and --timeline name the same file"));
  EXPECT_TRUE(CheckOutputPaths({{"the trace", in}},
                               {{"--snapshot", Dir() + "/a.out"}, {"--timeline", ""}, {"-o", "-"}})
                  .ok());
  EXPECT_EQ(*ReadFile(in), "kept");
}

}  // namespace
}  // namespace remat
