#include "allocator/snapshot_pickle.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/run_command.h"

namespace remat {
namespace {

using ::remat::testutil::Python3;
using ::remat::testutil::RunCommand;
using ::remat::testutil::ShellQuote;
using ::remat::testutil::TempPath;
using ::testing::HasSubstr;

// What tests/check_snapshot_pickle.py prints for a snapshot, built from the
// Snapshot itself.
std::string ExpectedSummary(const Snapshot& snap) {
  std::string out;
  for (const SegmentInfo& seg : snap.segments) {
    absl::StrAppendFormat(&out, "segment %s %d %d stream %d\n", seg.is_large ? "large" : "small",
                          seg.address, seg.total_size, seg.stream.handle);
    for (const BlockInfo& b : seg.blocks) {
      absl::StrAppendFormat(&out, "  %s %d %d %d\n", BlockStateName(b.state), b.address, b.size,
                            b.requested_size);
    }
  }
  for (const TraceEvent& e : snap.events) {
    absl::StrAppendFormat(&out, "%s %d %d %d %d\n", TraceActionName(e.action), e.address,
                          e.requested_size, e.stream.handle, e.time_ns / 1000);
  }
  return out;
}

class SnapshotPickleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Python3().empty()) GTEST_SKIP() << "no python3 found at configure time";
    device_ = SimDevice::Create({}).value();
    alloc_ = CachingAllocator::Create(device_.get(), {.event_ring_capacity = 1000}).value();
  }
  void TearDown() override {
    for (void* p : live_) ASSERT_TRUE(alloc_->Free(p).ok());
    if (device_ != nullptr) {
      ASSERT_TRUE(device_->Synchronize().ok());
    }
  }

  void* Alloc(std::size_t bytes, Stream stream = kDefaultStream) {
    void* p = alloc_->Allocate(bytes, stream).value();
    live_.push_back(p);
    return p;
  }
  void Free(void* p) {
    ASSERT_TRUE(alloc_->Free(p).ok());
    std::erase(live_, p);
  }

  // Runs the checker on the pickle of the allocator's snapshot; returns its output.
  std::string CheckedSummary(const Snapshot& snap) {
    const std::string path = TempPath("snapshot.pickle");
    EXPECT_TRUE(WriteSnapshotPickle(snap, path).ok());
    const auto run = RunCommand(absl::StrCat(
        ShellQuote(Python3()), " ", ShellQuote(REMAT_SOURCE_DIR "/tests/check_snapshot_pickle.py"),
        " ", ShellQuote(path)));
    EXPECT_EQ(run.status, 0) << run.out;
    return run.out;
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::vector<void*> live_;
};

TEST_F(SnapshotPickleTest, EmptyAllocator) {
  const Snapshot snap = alloc_->TakeSnapshot();
  EXPECT_EQ(CheckedSummary(snap), "");
}

TEST_F(SnapshotPickleTest, SegmentsBlocksAndHistoryRoundTrip) {
  device_->AdvanceHost(1'500);
  void* small = Alloc(700);  // small pool, a 2 MiB segment
  Alloc(3 * kMiB + 100);     // large pool, a 20 MiB segment, split
  Alloc(1000);               // next to `small`
  device_->AdvanceHost(2'000'000);
  Free(small);  // a free block ahead of an allocated one
  // A block another stream still uses: active_pending_free until it is done.
  const Stream s2 = device_->CreateStream().value();
  void* shared = Alloc(4096);
  ASSERT_TRUE(alloc_->RecordStream(shared, s2).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1'000'000).ok());
  Free(shared);

  const Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  const std::string summary = CheckedSummary(snap);
  EXPECT_EQ(summary, ExpectedSummary(snap));
  EXPECT_THAT(summary, HasSubstr("segment small "));
  EXPECT_THAT(summary, HasSubstr("segment large "));
  EXPECT_THAT(summary, HasSubstr("  inactive "));
  EXPECT_THAT(summary, HasSubstr("  active_pending_free "));
  // Trace sizes are the caller's, as in PyTorch; times are microseconds.
  EXPECT_THAT(summary, HasSubstr(absl::StrFormat("alloc %d 700 0 1\n",
                                                 reinterpret_cast<std::uintptr_t>(small))));
  EXPECT_THAT(summary, HasSubstr(absl::StrFormat("free_requested %d 700 0 2001\n",
                                                 reinterpret_cast<std::uintptr_t>(small))));
  EXPECT_THAT(summary, HasSubstr(absl::StrFormat("segment_alloc %d %d 0 1\n",
                                                 snap.segments[1].address, 20 * kMiB)));
}

TEST_F(SnapshotPickleTest, AddressesAndSizesBeyond32Bits) {
  Alloc(std::size_t{5} << 30);  // 5 GiB: its own segment
  const Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_GT(snap.segments.back().total_size, std::size_t{1} << 32);
  EXPECT_EQ(CheckedSummary(snap), ExpectedSummary(snap));
}

TEST_F(SnapshotPickleTest, UnwritablePathIsAnError) {
  const absl::Status status = WriteSnapshotPickle({}, "/nonexistent-dir/x.pickle");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent-dir/x.pickle: cannot create"));
}

}  // namespace
}  // namespace remat
