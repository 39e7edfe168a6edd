#include "allocator/snapshot_timeline.h"

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Counter(const char* track, const char* ts, std::int64_t bytes) {
  return absl::StrFormat(R"({"name":"%s","ph":"C","ts":%s,"pid":0,"tid":0,"args":{"bytes":%d}})",
                         track, ts, bytes);
}

class SnapshotTimelineTest : public ::testing::Test {
 protected:
  void Make(std::size_t ring) {
    device_ = SimDevice::Create({}).value();
    alloc_ = CachingAllocator::Create(device_.get(), {.event_ring_capacity = ring}).value();
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST_F(SnapshotTimelineTest, OneSamplePerEventThatMovesACounter) {
  Make(100);
  device_->AdvanceHost(1'500);
  void* p = alloc_->Allocate(700).value();  // segment_alloc 2 MiB, alloc 1024
  device_->AdvanceHost(2'000'001);
  ASSERT_TRUE(alloc_->Free(p).ok());       // free_requested, free_completed
  ASSERT_TRUE(alloc_->EmptyCache().ok());  // segment_free
  const std::string json = SnapshotToTimelineJson(alloc_->TakeSnapshot());
  const std::string expected = absl::StrCat(
      R"({"traceEvents":[{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":")",
      device_->Describe(), R"("}},)", Counter(kAllocatedTrack, "1.500", 0), ",",
      Counter(kReservedTrack, "1.500", 0), ",", Counter(kReservedTrack, "1.500", 2 * kMiB), ",",
      Counter(kAllocatedTrack, "1.500", 1024), ",", Counter(kAllocatedTrack, "2001.501", 0), ",",
      Counter(kReservedTrack, "2001.501", 0), R"(],"displayTimeUnit":"ms"})");
  EXPECT_EQ(json, expected);
}

TEST_F(SnapshotTimelineTest, LevelsBeforeALostHistoryComeFromTheStatistics) {
  Make(2);  // keeps only the last two events
  void* a = alloc_->Allocate(1000).value();
  void* b = alloc_->Allocate(3000).value();
  device_->AdvanceHost(7'000);
  ASSERT_TRUE(alloc_->Free(a).ok());  // free_requested, free_completed: the two kept
  const std::string json = SnapshotToTimelineJson(alloc_->TakeSnapshot());
  // Before the free: 1024 + 3072 allocated in one 2 MiB segment.
  EXPECT_THAT(json, HasSubstr(Counter(kAllocatedTrack, "7.000", 4096) + "," +
                              Counter(kReservedTrack, "7.000", 2 * kMiB) + "," +
                              Counter(kAllocatedTrack, "7.000", 3072) + "]"));
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(SnapshotTimelineTest, WithoutHistoryTheCurrentLevelsAtZero) {
  Make(0);
  void* p = alloc_->Allocate(kMiB).value();
  const std::string json = SnapshotToTimelineJson(alloc_->TakeSnapshot());
  EXPECT_THAT(json, StartsWith(R"({"traceEvents":[{"name":"process_name")"));
  EXPECT_THAT(json, HasSubstr(Counter(kAllocatedTrack, "0.000", kMiB) + "," +
                              Counter(kReservedTrack, "0.000", 2 * kMiB) + "]"));
  ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(SnapshotTimelineTest, UnwritablePathIsAnError) {
  const absl::Status status = WriteSnapshotTimeline({}, "/nonexistent-dir/t.json");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent-dir/t.json: cannot create"));
}

}  // namespace
}  // namespace remat
