#include "base/line_reader.h"

#include "base/fifo_feeder_for_tests.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace remat {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> AllLines(const std::string& path, std::size_t chunk,
                                  std::size_t padding = 0) {
  auto reader = LineReader::Open(path, padding, chunk);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> lines;
  std::string_view line;
  for (;;) {
    absl::StatusOr<bool> more = (*reader)->Next(&line);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    // The padding after the line is readable (ASan would say otherwise).
    for (std::size_t i = 0; i < padding; ++i) (void)*(volatile const char*)(line.data() + line.size() + i);
    lines.emplace_back(line);
  }
  return lines;
}

TEST(LineReaderTest, SplitsLinesAcrossChunkBoundariesAndGrowsForLongLines) {
  const std::string path = TempPath("lines.txt");
  std::string text;
  std::vector<std::string> expected;
  for (int i = 0; i < 500; ++i) {
    std::string line(static_cast<std::size_t>(i % 97), static_cast<char>('a' + i % 26));
    if (i % 50 == 7) line = std::string(1000, 'z');  // longer than the chunk
    expected.push_back(line);
    text += line + (i % 3 == 0 ? "\r\n" : "\n");
  }
  text += "last line without a newline";
  expected.emplace_back("last line without a newline");
  Write(path, text);
  for (std::size_t chunk : {16, 17, 64, 1000, 1 << 20}) {
    EXPECT_EQ(AllLines(path, chunk, /*padding=*/64), expected) << "chunk " << chunk;
  }
}

TEST(LineReaderTest, EmptyFilesBlankLinesAndBadPaths) {
  const std::string empty = TempPath("empty.txt");
  Write(empty, "");
  EXPECT_TRUE(AllLines(empty, 16).empty());
  const std::string blanks = TempPath("blanks.txt");
  Write(blanks, "\n\r\n\n");
  EXPECT_EQ(AllLines(blanks, 16), (std::vector<std::string>{"", "", ""}));
  auto missing = LineReader::Open(TempPath("no-such-file"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto dir = LineReader::Open(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  auto reader = LineReader::Open(blanks);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->file_size(), 4u);
}

// The first line comes back before the file is read to its end: a pipe whose
// writer offers 8 MiB sees the reader go away after the first line (its write
// fails with EPIPE) instead of the reader waiting for all of it.
TEST(LineReaderTest, TheFirstLineComesBeforeTheRestOfTheFile) {
  FifoFeeder feeder(TempPath("lines.fifo"), "the first line\n", 'x');
  ASSERT_TRUE(feeder.ok()) << std::strerror(errno);
  {
    auto reader = LineReader::Open(feeder.path());
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::string_view line;
    absl::StatusOr<bool> more = (*reader)->Next(&line);
    ASSERT_TRUE(more.ok() && *more);
    EXPECT_EQ(line, "the first line");
    EXPECT_LT((*reader)->bytes_read(), 2u * LineReader::kDefaultChunk);
  }  // closed: the writer's next write fails
  EXPECT_TRUE(feeder.WriterWasCutOff());
}

TEST(LineReaderTest, ALineOverTheCapIsRefusedNamingItsNumberAndTheCap) {
  const std::string path = TempPath("capped.txt");
  const std::size_t cap = 100;
  // At the cap (with or without a '\r') it is a line; one byte more is not,
  // whether a newline ends it or the file does.
  Write(path, "short\n" + std::string(cap, 'a') + "\r\n" + std::string(cap, 'b') + "\n" +
                  std::string(cap + 1, 'c') + "\n");
  for (const std::size_t chunk : {std::size_t{16}, std::size_t{4096}}) {
    auto reader = LineReader::Open(path, 0, chunk, cap);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::string_view line;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<bool> more = (*reader)->Next(&line);
      ASSERT_TRUE(more.ok() && *more) << i << ": " << more.status();
    }
    EXPECT_EQ(line, std::string(cap, 'b'));
    absl::StatusOr<bool> more = (*reader)->Next(&line);
    ASSERT_FALSE(more.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(more.status())) << more.status();
    EXPECT_NE(more.status().message().find(path + ": line 4 is longer than 100 B"),
              std::string::npos)
        << more.status();
  }
  Write(path, std::string(cap + 1, 'x'));  // the last line, with no newline
  auto reader = LineReader::Open(path, 0, 4096, cap);
  ASSERT_TRUE(reader.ok());
  std::string_view line;
  EXPECT_FALSE((*reader)->Next(&line).ok());
}

TEST(LineReaderTest, ALineWithNoEndIsRefusedBeforeItIsAllRead) {
  // 8 MiB with no newline after the first line: refused at the cap, with the
  // writer cut off (the reader did not read on to the end).
  FifoFeeder feeder(TempPath("endless.fifo"), "the first line\n", 'x');
  ASSERT_TRUE(feeder.ok()) << std::strerror(errno);
  {
    auto reader = LineReader::Open(feeder.path(), 0, 64 * 1024, 1 << 20);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::string_view line;
    ASSERT_TRUE(*(*reader)->Next(&line));
    absl::StatusOr<bool> more = (*reader)->Next(&line);
    ASSERT_FALSE(more.ok());
    EXPECT_NE(more.status().message().find("line 2 is longer than 1.00 MiB"), std::string::npos)
        << more.status();
    EXPECT_LT((*reader)->bytes_read(), 2u << 20);
  }
  EXPECT_TRUE(feeder.WriterWasCutOff());
}

}  // namespace
}  // namespace remat
