#include "trace/rmm_log.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kHeader[] = "Thread,Time,Action,Pointer,Size,Stream\n";

std::string Log(const std::string& body) { return kHeader + body; }

// The error message of parsing `body` after a good header.
std::string ErrorOf(const std::string& body) {
  absl::StatusOr<AllocLog> log = ParseRmmLog(Log(body), "t.csv");
  EXPECT_FALSE(log.ok());
  if (log.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(log.status())) << log.status();
  return std::string(log.status().message());
}

TEST(RmmLogTest, ParsesRecordsAndMapsPointersToSlots) {
  absl::StatusOr<AllocLog> log = ParseRmmLog(Log("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                                                 "1,10:00:00.000002,allocate,0x2000,200,0x0\n"
                                                 "1,10:00:00.000003,free,0x1000,100,0x0\n"
                                                 "1,10:00:00.000004,allocate,0x3000,300,0x0\n"
                                                 "1,10:00:00.000005,free,0x2000,200,0x0\n"),
                                             "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->name, "t.csv");
  ASSERT_EQ(log->records.size(), 5u);
  EXPECT_EQ(log->allocations, 3u);
  EXPECT_EQ(log->frees, 2u);
  EXPECT_EQ(log->num_slots, 2u);  // 0x3000 reuses 0x1000's slot
  EXPECT_EQ(log->records[0].slot, 0u);
  EXPECT_EQ(log->records[1].slot, 1u);
  EXPECT_EQ(log->records[2].slot, 0u);
  EXPECT_EQ(log->records[3].slot, 0u);
  EXPECT_EQ(log->records[4].slot, 1u);
  EXPECT_EQ(log->records[0].line, 2u);
  EXPECT_EQ(log->records[0].size, 100u);
  EXPECT_EQ(log->records[2].action, AllocAction::kFree);
  EXPECT_EQ(log->peak_requested_bytes, 500u);  // 0x2000 and 0x3000
  EXPECT_EQ(log->live_at_end, 1u);
  EXPECT_EQ(log->live_bytes_at_end, 300u);
}

TEST(RmmLogTest, ParsesTimeStreamsAndThreads) {
  absl::StatusOr<AllocLog> log =
      ParseRmmLog(Log("2342727,15:47:02.841961,allocate,0x10012400000,1048576,0\n"
                      "2342781,15:47:02.841977,allocate,7f0000000000,16,0x55d0c8a41c60\n"
                      "2342727,23:59:59.5,free,0x10012400000,1048576,0x0\n"),
                  "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->records[0].time_ns, ((15 * 60 + 47) * 60 + 2) * 1000000000LL + 841961000);
  EXPECT_EQ(log->records[2].time_ns, ((23 * 60 + 59) * 60 + 59) * 1000000000LL + 500000000);
  // Decimal 0 and hex 0x0 are the same stream.
  EXPECT_THAT(log->streams, ::testing::ElementsAre(0u, 0x55d0c8a41c60u));
  EXPECT_EQ(log->records[2].stream, 0);
  EXPECT_EQ(log->records[1].stream, 1);
  EXPECT_THAT(log->threads, ::testing::ElementsAre(2342727u, 2342781u));
  EXPECT_EQ(log->records[1].thread, 1);
}

TEST(RmmLogTest, AcceptsCrlfBomAndBlankLines) {
  absl::StatusOr<AllocLog> log = ParseRmmLog(
      "\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream\r\n"
      "1,10:00:00.000001,allocate,0x1000,100,0x0\r\n"
      "\r\n"
      "1,10:00:00.000002,free,0x1000,100,0x0",
      "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->records.size(), 2u);
  EXPECT_EQ(log->records[1].line, 4u);
}

TEST(RmmLogTest, HeaderOnlyIsAnEmptyLog) {
  absl::StatusOr<AllocLog> log = ParseRmmLog(kHeader, "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE(log->records.empty());
}

TEST(RmmLogTest, AllocateFailuresAreCountedNotTracked) {
  absl::StatusOr<AllocLog> log =
      ParseRmmLog(Log("1,10:00:00.000001,allocate failure,0x0,107374182400,0x0\n"
                      "1,10:00:00.000002,allocate,0x1000,100,0x0\n"),
                  "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->alloc_failures, 1u);
  EXPECT_EQ(log->allocations, 1u);
  EXPECT_EQ(log->records[0].action, AllocAction::kAllocateFailure);
  EXPECT_EQ(log->records[0].slot, kNoSlot);
  EXPECT_EQ(log->peak_requested_bytes, 100u);
}

TEST(RmmLogTest, ZeroByteAllocationsAtNullRepeat) {
  absl::StatusOr<AllocLog> log = ParseRmmLog(Log("1,10:00:00.000001,allocate,0x0,0,0x0\n"
                                                 "1,10:00:00.000002,allocate,0x0,0,0x0\n"
                                                 "1,10:00:00.000003,free,0x0,0,0x0\n"
                                                 "1,10:00:00.000004,free,0x0,0,0x0\n"
                                                 "1,10:00:00.000005,free,0x0,0,0x0\n"),
                                             "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->zero_byte_allocations, 2u);
  EXPECT_EQ(log->num_slots, 0u);
  for (const AllocRecord& r : log->records) EXPECT_EQ(r.slot, kNoSlot);
  EXPECT_EQ(log->peak_requested_bytes, 0u);
}

TEST(RmmLogTest, ZeroByteAllocationsAtRealPointersAreTracked) {
  // A zero-byte allocation may share its address with a real one: each free
  // matches by size.
  absl::StatusOr<AllocLog> log = ParseRmmLog(Log("1,10:00:00.000001,allocate,0x1000,0,0x0\n"
                                                 "1,10:00:00.000002,allocate,0x1000,64,0x0\n"
                                                 "1,10:00:00.000003,allocate,0x1000,0,0x0\n"
                                                 "1,10:00:00.000004,free,0x1000,0,0x0\n"
                                                 "1,10:00:00.000005,free,0x1000,64,0x0\n"
                                                 "1,10:00:00.000006,free,0x1000,0,0x0\n"),
                                             "t.csv");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->zero_byte_allocations, 2u);
  EXPECT_EQ(log->records[0].slot, kNoSlot);
  EXPECT_EQ(log->records[1].slot, 0u);
  EXPECT_EQ(log->records[3].slot, kNoSlot);
  EXPECT_EQ(log->records[4].slot, 0u);
  EXPECT_EQ(log->live_at_end, 0u);

  // Freed more often than allocated: not live.
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,0,0x0\n"
                      "1,10:00:00.000002,free,0x1000,0,0x0\n"
                      "1,10:00:00.000003,free,0x1000,0,0x0\n"),
              StartsWith("t.csv:4: free of 0x1000 which is not live"));
}

TEST(RmmLogTest, MalformedStructure) {
  absl::StatusOr<AllocLog> empty = ParseRmmLog("", "t.csv");
  EXPECT_THAT(std::string(empty.status().message()), StartsWith("t.csv: empty log"));
  absl::StatusOr<AllocLog> header = ParseRmmLog("Thread,Time,Action,Pointer,Size\n", "t.csv");
  EXPECT_TRUE(absl::IsInvalidArgument(header.status()));
  EXPECT_THAT(std::string(header.status().message()), StartsWith("t.csv:1: expected the header"));

  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100\n"),
              StartsWith("t.csv:2: expected 6 fields"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                      "1,10:00:00.000001,allocate,0x2000,100,0x0,extra\n"),
              AllOf(StartsWith("t.csv:3: expected 6 fields"), HasSubstr("found 7")));
}

TEST(RmmLogTest, MalformedFields) {
  EXPECT_THAT(ErrorOf("x1,10:00:00.000001,allocate,0x1000,100,0x0\n"),
              StartsWith("t.csv:2: bad Thread 'x1'"));
  for (const char* time : {"10:00:00.", "1:00:00.000001", "24:00:00.000001", "10:60:00.000001",
                           "10:00:00;000001", "10:00:00.00000x", "", "10:00:00.0000000001"}) {
    EXPECT_THAT(ErrorOf(std::string("1,") + time + ",allocate,0x1000,100,0x0\n"),
                StartsWith("t.csv:2: bad Time"))
        << time;
  }
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,alloc,0x1000,100,0x0\n"),
              StartsWith("t.csv:2: unknown Action 'alloc'"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0xzz,100,0x0\n"),
              StartsWith("t.csv:2: bad Pointer '0xzz'"));
  for (const char* size : {"-5", "+5", "1e3", "", "12 ", "99999999999999999999999"}) {
    EXPECT_THAT(ErrorOf(std::string("1,10:00:00.000001,allocate,0x1000,") + size + ",0x0\n"),
                StartsWith("t.csv:2: bad Size"))
        << size;
  }
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,stream\n"),
              StartsWith("t.csv:2: bad Stream 'stream'"));
}

TEST(RmmLogTest, InconsistentLogs) {
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                      "1,10:00:00.000002,free,0x2000,100,0x0\n"),
              StartsWith("t.csv:3: free of 0x2000 which is not live"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                      "1,10:00:00.000002,free,0x1000,100,0x0\n"
                      "1,10:00:00.000003,free,0x1000,100,0x0\n"),
              StartsWith("t.csv:4: free of 0x1000 which is not live"));
  EXPECT_THAT(
      ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
              "1,10:00:00.000002,allocate,0x1000,100,0x0\n"),
      StartsWith("t.csv:3: allocate of 0x1000 which is already live (allocated at line 2)"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                      "1,10:00:00.000002,free,0x1000,101,0x0\n"),
              StartsWith("t.csv:3: free of 0x1000 with size 101, but it was allocated with 100 "
                         "bytes at line 2"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                      "1,10:00:00.000002,free,0x1000,0,0x0\n"),
              StartsWith("t.csv:3: free of 0x1000 with size 0"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,0,0x0\n"
                      "1,10:00:00.000002,free,0x1000,100,0x0\n"),
              StartsWith("t.csv:3: free of 0x1000 with size 100, but it was allocated with 0"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x0,100,0x0\n"),
              StartsWith("t.csv:2: allocate of 100 bytes at a null pointer"));
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,free,0x0,100,0x0\n"),
              StartsWith("t.csv:2: free of 0x0 which is not live"));
  // Live sizes past 2^64 bytes: refused at the line that passes it, not a
  // peak that wrapped around.
  EXPECT_THAT(ErrorOf("1,10:00:00.000001,allocate,0x1000,9223372036854775807,0x0\n"
                      "1,10:00:00.000002,allocate,0x2000,9223372036854775807,0x0\n"
                      "1,10:00:00.000003,allocate,0x3000,2,0x0\n"),
              StartsWith("t.csv:4: allocate of 2 bytes with 18446744073709551614 bytes already "
                         "live: the live sizes add up past 2^64 bytes"));
}

TEST(RmmLogTest, ReadRmmLogReportsMissingFiles) {
  absl::StatusOr<AllocLog> log = ReadRmmLog("/nonexistent/trace.csv");
  EXPECT_TRUE(absl::IsNotFound(log.status())) << log.status();
  EXPECT_THAT(std::string(log.status().message()), HasSubstr("/nonexistent/trace.csv"));
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// Reading a file streams it; parsing text in memory must give the same log.
TEST(RmmLogTest, ReadingAFileMatchesParsingItsText) {
  for (const char* name : {"training_step.csv", "multistream.csv", "tiny.csv"}) {
    const std::string path = std::string(REMAT_EXAMPLE_TRACES_DIR) + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<AllocLog> read = ReadRmmLog(path);
    absl::StatusOr<AllocLog> parsed = ParseRmmLog(text.str(), path);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_EQ(read->records.size(), parsed->records.size()) << name;
    for (std::size_t i = 0; i < read->records.size(); ++i) {
      const AllocRecord& a = read->records[i];
      const AllocRecord& b = parsed->records[i];
      ASSERT_TRUE(a.size == b.size && a.time_ns == b.time_ns && a.slot == b.slot &&
                  a.line == b.line && a.stream == b.stream && a.thread == b.thread &&
                  a.action == b.action)
          << name << " record " << i;
    }
    EXPECT_EQ(read->streams, parsed->streams);
    EXPECT_EQ(read->peak_requested_bytes, parsed->peak_requested_bytes);
  }
}

}  // namespace
}  // namespace remat
