#include "trace/rmm_log_writer.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trace/rmm_log.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(RmmLogRecorderTest, WritesALogTheParserReadsBack) {
  RmmLogRecorder log;
  int a = 0, b = 0;
  log.Allocate(&a, 1000, 0);
  log.Allocate(&b, 4096, 7);
  log.Allocate(nullptr, 0, 0);  // a zero-byte allocation
  log.AllocateFailure(1ull << 40, 7);
  log.Free(&a, 0);
  log.Free(&a, 0);     // a second free: the program's error, not logged
  log.Free(&log, 0);   // never allocated: not logged
  log.Free(&b, 7);
  EXPECT_EQ(log.size(), 6u);
  const std::string text = log.Text();
  EXPECT_THAT(text, StartsWith("Thread,Time,Action,Pointer,Size,Stream\n"));
  EXPECT_THAT(text, HasSubstr(",allocate failure,0x0,1099511627776,0x7\n"));
  absl::StatusOr<AllocLog> parsed = ParseRmmLog(text, "recorded.csv");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->allocations, 3u);
  EXPECT_EQ(parsed->frees, 2u);
  EXPECT_EQ(parsed->alloc_failures, 1u);
  // The free carries the size of its allocation, which cudaFree never says.
  EXPECT_EQ(parsed->records[4].size, 1000u);
}

TEST(RmmLogRecorderTest, ManyThreadsRecordAConsistentLog) {
  RmmLogRecorder log;
  std::vector<std::thread> threads;
  std::vector<std::vector<char>> buffers(8, std::vector<char>(1000));
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        char* p = buffers[t].data() + i;
        log.Allocate(p, 1 + i, t);
        log.Free(p, t);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::StatusOr<AllocLog> parsed = ParseRmmLog(log.Text(), "threads.csv");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->allocations, 8000u);
  EXPECT_EQ(parsed->frees, 8000u);
  EXPECT_EQ(parsed->threads.size(), 8u);
}

TEST(RmmLogRecorderTest, AnUnwritablePathIsAClearError) {
  RmmLogRecorder log;
  absl::Status s = log.WriteTo("/nonexistent-dir/x.csv");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-dir/x.csv"));
}

}  // namespace
}  // namespace remat
