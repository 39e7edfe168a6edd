#include "allocator/caching_allocator.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class AllocatorTest : public ::testing::Test {
 protected:
  void Make(AllocatorOptions options = {}, SimDeviceOptions device_options = {}) {
    alloc_.reset();
    device_ = std::move(SimDevice::Create(device_options)).value();
    auto a = CachingAllocator::Create(device_.get(), options);
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(a).value();
  }
  void SetUp() override { Make(); }

  void* Alloc(std::size_t bytes, Stream stream = kDefaultStream) {
    auto p = alloc_->Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  void Free(void* p) { ASSERT_TRUE(alloc_->Free(p).ok()); }
  AllocatorStats Stats() { return alloc_->GetStats(); }
  std::size_t Size(void* p) { return *alloc_->BlockSize(p); }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

// --- Sizes and pools --------------------------------------------------------

TEST_F(AllocatorTest, RoundsUpTo512Bytes) {
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  void* p = Alloc(700);
  EXPECT_EQ(Size(p), 1024u);
  AllocatorStats s = Stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 1024);
  EXPECT_EQ(s.requested_bytes.all().current, 700);
}

TEST_F(AllocatorTest, ChoosesPoolAndSegmentSizeByRequest) {
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSizeFor(11 * kMiB + 512), 12 * kMiB);

  Alloc(kMiB);  // small pool: a 2 MiB segment
  AllocatorStats s = Stats();
  EXPECT_EQ(s.segment.small().current, 1);
  EXPECT_EQ(s.reserved_bytes.small().current, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(s.allocation.small().current, 1);
  EXPECT_EQ(s.segment.large().current, 0);

  Alloc(kMiB + 1);  // large pool: a 20 MiB segment
  Alloc(3 * kMiB);  // shares it
  s = Stats();
  EXPECT_EQ(s.segment.large().current, 1);
  EXPECT_EQ(s.reserved_bytes.large().current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(s.allocation.large().current, 2);

  Alloc(33 * kMiB);  // its own segment, rounded to 2 MiB
  s = Stats();
  EXPECT_EQ(s.segment.large().current, 2);
  EXPECT_EQ(s.reserved_bytes.large().current, static_cast<std::int64_t>(54 * kMiB));
  EXPECT_EQ(s.num_device_alloc, 3);
}

TEST_F(AllocatorTest, GrowthIsTheUsualSegmentOrThePages) {
  // Fixed segments: the segment the request reserves when the budget does
  // not squeeze it.
  EXPECT_EQ(alloc_->GrowthFor(4096), 2 * kMiB);
  EXPECT_EQ(alloc_->GrowthFor(3 * kMiB), 20 * kMiB);
  EXPECT_EQ(alloc_->GrowthFor(33 * kMiB), 34 * kMiB);
  Alloc(3 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(20 * kMiB));
  // Expandable segments: the pages it covers.
  Make({.expandable_segments = true});
  EXPECT_EQ(alloc_->GrowthFor(4096), 2 * kMiB);
  EXPECT_EQ(alloc_->GrowthFor(3 * kMiB), 4 * kMiB);
}

TEST_F(AllocatorTest, SmallPoolSplitsRemaindersOfAtLeast512Bytes) {
  void* a = Alloc(kMiB);        // a 2 MiB small segment, split in half
  void* b = Alloc(kMiB - 512);  // leaves exactly 512 B: still split
  EXPECT_EQ(Size(b), kMiB - 512);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), reinterpret_cast<std::uintptr_t>(a) + kMiB);
  EXPECT_EQ(Stats().inactive_split.small().current, 1);
  EXPECT_EQ(Stats().inactive_split_bytes.small().current, 512);
  void* c = Alloc(512);  // the remainder, no new segment
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c), reinterpret_cast<std::uintptr_t>(a) + 2 * kMiB - 512);
  EXPECT_EQ(Stats().segment.all().current, 1);
  EXPECT_EQ(Stats().inactive_split.all().current, 0);
}

TEST_F(AllocatorTest, LargePoolSplitsOnlyRemaindersAboveOneMiB) {
  void* a = Alloc(19 * kMiB);  // 20 MiB segment, 1 MiB left: not worth a block
  EXPECT_EQ(Size(a), 20 * kMiB);
  EXPECT_EQ(Stats().inactive_split.large().current, 0);
  EXPECT_EQ(Stats().allocated_bytes.large().current, static_cast<std::int64_t>(20 * kMiB));
  Free(a);
  void* b = Alloc(19 * kMiB - 512);  // leaves 1 MiB + 512 B: split
  EXPECT_EQ(b, a);
  EXPECT_EQ(Size(b), 19 * kMiB - 512);
  EXPECT_EQ(Stats().inactive_split.large().current, 1);
  EXPECT_EQ(Stats().inactive_split_bytes.large().current, static_cast<std::int64_t>(kMiB + 512));
}

TEST_F(AllocatorTest, OversizeBlocksAreNeverSplitNorTakenBySmallRequests) {
  Make({.max_split_size = 32 * kMiB});
  void* big = Alloc(40 * kMiB);
  Free(big);
  // A request below max_split_size does not take the cached 40 MiB block.
  void* mid = Alloc(8 * kMiB);
  EXPECT_NE(mid, big);
  // An oversize request takes it whole, unsplit.
  void* big2 = Alloc(34 * kMiB);
  EXPECT_EQ(big2, big);
  EXPECT_EQ(Size(big2), 40 * kMiB);
  Free(big2);
  // ...but not when it would waste kLargeBuffer or more.
  Free(mid);
  Alloc(kLargeBuffer);  // fill so the 40 MiB block is the only oversize one
  void* far_smaller = Alloc(33 * kMiB + 0);  // 40 < 33 + 20: allowed
  EXPECT_EQ(far_smaller, big);
}

// A limit set on a live allocator holds from the next request: the cached
// 40 MiB block, split for small requests before, is kept whole after.
TEST_F(AllocatorTest, ALoweredSplitLimitKeepsLargeFreeBlocksWholeFromTheNextRequest) {
  Make({});
  EXPECT_EQ(alloc_->max_split_size(), std::numeric_limits<std::size_t>::max());
  void* big = Alloc(40 * kMiB);
  Free(big);
  void* small = Alloc(8 * kMiB);
  EXPECT_EQ(small, big);  // no limit: split
  Free(small);
  EXPECT_EQ(alloc_->SetMaxSplitSize(kMiB).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->max_split_size(), std::numeric_limits<std::size_t>::max());  // unchanged
  ASSERT_TRUE(alloc_->SetMaxSplitSize(32 * kMiB).ok());
  EXPECT_EQ(alloc_->max_split_size(), 32 * kMiB);
  void* again = Alloc(8 * kMiB);
  EXPECT_NE(again, big);  // kept whole for a large request
  void* whole = Alloc(34 * kMiB);
  EXPECT_EQ(whole, big);
  EXPECT_EQ(Size(whole), 40 * kMiB);  // not split either
}

TEST_F(AllocatorTest, OversizeRequestDoesNotTakeAMuchLargerBlock) {
  Make({.max_split_size = 16 * kMiB});
  void* huge = Alloc(64 * kMiB);
  Free(huge);
  void* p = Alloc(40 * kMiB);  // 64 >= 40 + 20: too wasteful, new segment
  EXPECT_NE(p, huge);
  EXPECT_EQ(Stats().segment.all().current, 2);
}

TEST_F(AllocatorTest, SmallRequestsBelowMaxSplitDoNotReserveOversizeSegments) {
  Make({.max_split_size = 4 * kMiB});
  void* p = Alloc(2 * kMiB);
  // A 20 MiB segment would exceed max_split_size and be unsplittable.
  EXPECT_EQ(Stats().reserved_bytes.large().current, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(Size(p), 2 * kMiB);
}

TEST_F(AllocatorTest, BestFitBySizeThenAddress) {
  // Carve one 20 MiB segment into blocks with free holes of 4, 2 and 3 MiB.
  void* a = Alloc(4 * kMiB);
  void* b = Alloc(2 * kMiB);
  void* c = Alloc(2 * kMiB);
  void* d = Alloc(3 * kMiB);
  void* e = Alloc(2 * kMiB);
  void* f = Alloc(3 * kMiB);
  void* g = Alloc(2 * kMiB);
  (void)b; (void)e; (void)g;
  Free(a);  // 4 MiB hole
  Free(c);  // 2 MiB hole
  Free(d);  // merges with c: 5 MiB hole
  Free(f);  // 3 MiB hole
  // 3 MiB: best fit is f's 3 MiB hole, not the 4 or 5 MiB ones.
  EXPECT_EQ(Alloc(3 * kMiB), f);
  // 4 MiB: a's hole exactly.
  EXPECT_EQ(Alloc(4 * kMiB), a);
}

TEST_F(AllocatorTest, FreedBlocksCoalesceWithFreeNeighbours) {
  void* a = Alloc(4096);
  void* b = Alloc(4096);
  void* c = Alloc(4096);
  EXPECT_EQ(Stats().inactive_split.small().current, 1);  // the segment's tail
  Free(a);
  Free(c);  // merges with the tail
  EXPECT_EQ(Stats().inactive_split.small().current, 2);
  Free(b);  // joins all three: the segment is whole again
  AllocatorStats s = Stats();
  EXPECT_EQ(s.inactive_split.small().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.small().current, 0);
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  ASSERT_EQ(snap.segments[0].blocks.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks[0].size, 2 * kMiB);
}

TEST_F(AllocatorTest, ReusesCachedBlocksWithoutNewSegments) {
  for (int i = 0; i < 100; ++i) Free(Alloc(3 * kMiB));
  EXPECT_EQ(Stats().num_device_alloc, 1);
  EXPECT_EQ(Stats().allocation.all().allocated, 100);
}

// --- Streams ----------------------------------------------------------------

TEST_F(AllocatorTest, FreedBlockIsReusableAtOnceOnItsStream) {
  Stream s1 = *device_->CreateStream();
  ASSERT_TRUE(device_->LaunchHostFunc(s1, [] {}, 1'000'000).ok());  // s1 is busy
  void* p = Alloc(kMiB, s1);
  Free(p);
  EXPECT_EQ(Alloc(kMiB, s1), p);
}

TEST_F(AllocatorTest, OtherStreamWaitsForAnEventBehindTheFree) {
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(12 * kMiB, s1);
  ASSERT_TRUE(device_->LaunchHostFunc(s1, [] {}, 1'000'000).ok());  // a kernel using p
  Free(p);
  // s1's kernel has not finished: s2 must not get p.
  void* q = Alloc(12 * kMiB, s2);
  EXPECT_NE(q, p);
  // Once s1's work is done, the block is fair game for s2.
  ASSERT_TRUE(device_->SynchronizeStream(s1).ok());
  EXPECT_EQ(Alloc(12 * kMiB, s2), p);
  EXPECT_EQ(Stats().segment.all().current, 2);
}

TEST_F(AllocatorTest, IdleStreamsBlocksAreSharedAtOnce) {
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(8 * kMiB, s1);
  Free(p);  // nothing queued on s1: an event behind it completes at once
  EXPECT_EQ(Alloc(8 * kMiB, s2), p);
  EXPECT_EQ(Stats().segment.all().current, 1);
}

TEST_F(AllocatorTest, RecordStreamDelaysReuseUntilThatStreamIsDone) {
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(kMiB, s1);
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1'000'000).ok());  // s2 reads p
  Free(p);
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks[0].state, BlockState::kActivePendingFree);
  AllocatorStats s = Stats();
  EXPECT_EQ(s.allocation.all().current, 0);  // freed by the caller...
  EXPECT_EQ(s.active.all().current, 1);      // ...but still active for s2
  // Even s1 cannot have it back while s2 may still read it.
  void* q = Alloc(kMiB, s1);
  EXPECT_NE(q, p);
  Free(q);
  ASSERT_TRUE(device_->SynchronizeStream(s2).ok());
  void* r = Alloc(kMiB, s1);
  void* t = Alloc(kMiB, s1);
  EXPECT_TRUE(r == p || t == p);
  EXPECT_EQ(Stats().active.all().current, 2);
}

// Active counts a block from its allocation until its free completes: a
// free pending on another stream's work keeps it active. Its peaks, totals
// and pools, through resets, by hand.
TEST_F(AllocatorTest, ActiveStatisticsCountPendingFreesThroughPeaksAndResets) {
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* a = Alloc(512 * kKiB, s1);  // the small pool
  ASSERT_TRUE(alloc_->RecordStream(a, s2).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1'000'000).ok());  // s2 reads a
  Free(a);                                                           // pending
  void* b = Alloc(4 * kMiB, s1);  // the large pool, while a is pending
  AllocatorStats s = Stats();
  EXPECT_EQ(s.allocation.all().current, 1);
  EXPECT_EQ(s.allocation.all().peak, 1);
  EXPECT_EQ(s.active.all().current, 2);
  EXPECT_EQ(s.active.all().peak, 2);
  EXPECT_EQ(s.active.small().current, 1);
  EXPECT_EQ(s.active.large().current, 1);
  EXPECT_EQ(s.active.small().peak, 1);
  EXPECT_EQ(s.active.all().allocated, 2);
  EXPECT_EQ(s.active.all().freed, 0);
  EXPECT_EQ(s.allocated_bytes.all().peak, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(s.active_bytes.all().current, static_cast<std::int64_t>(4 * kMiB + 512 * kKiB));
  EXPECT_EQ(s.active_bytes.all().peak, static_cast<std::int64_t>(4 * kMiB + 512 * kKiB));
  EXPECT_EQ(s.active_bytes.small().peak, static_cast<std::int64_t>(512 * kKiB));

  // Totals reset while a is still pending: its completion is a free after it.
  alloc_->ResetAccumulatedStats();
  ASSERT_TRUE(alloc_->EmptyCache().ok());  // waits for s2: a's free completes
  s = Stats();
  EXPECT_EQ(s.active.all().current, 1);
  EXPECT_EQ(s.active.all().peak, 2);  // peaks are not totals
  EXPECT_EQ(s.active.all().allocated, 0);
  EXPECT_EQ(s.active.all().freed, 1);
  EXPECT_EQ(s.active.small().freed, 1);
  EXPECT_EQ(s.active_bytes.all().freed, static_cast<std::int64_t>(512 * kKiB));

  alloc_->ResetPeakStats();
  EXPECT_EQ(Stats().active.all().peak, 1);
  Free(b);
  void* c = Alloc(kMiB, s1);
  s = Stats();
  EXPECT_EQ(s.active.all().current, 1);
  EXPECT_EQ(s.active.all().peak, 1);
  EXPECT_EQ(s.active.all().allocated, 1);
  EXPECT_EQ(s.active.all().freed, 2);
  EXPECT_EQ(s.active.large().freed, 1);
  Free(c);
}

TEST_F(AllocatorTest, FreeOnStreamHandsTheBlockToThatStream) {
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(kMiB, s1);
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1'000'000).ok());
  ASSERT_TRUE(alloc_->FreeOnStream(p, s2).ok());
  EXPECT_EQ(Alloc(kMiB, s2), p);
}

TEST_F(AllocatorTest, WaitsForPendingFreesBeforeGrowingPastTheBudget) {
  Make({.budget = 2 * kMiB});
  Stream s1 = *device_->CreateStream();
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(kMiB, s1);
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1'000'000).ok());
  Free(p);
  void* q = Alloc(2 * kMiB - 512, s1);  // only fits once p's events complete
  EXPECT_EQ(q, p);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
}

// --- Budget, cache release, pressure ------------------------------------------

TEST_F(AllocatorTest, EmptyCacheReturnsWholeFreeSegments) {
  void* a = Alloc(kMiB);       // small segment
  void* b = Alloc(5 * kMiB);   // large segment
  void* c = Alloc(64 * kMiB);  // large segment
  Free(a);
  Free(c);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  AllocatorStats s = Stats();
  EXPECT_EQ(s.segment.all().current, 1);
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(device_->ReservedBytes(), 20 * kMiB);
  Free(b);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(device_->ReservedBytes(), 0u);
}

TEST_F(AllocatorTest, ReleasesCacheAndRetriesBeforeFailing) {
  Make({.budget = 40 * kMiB});
  Free(Alloc(5 * kMiB));  // caches a 20 MiB segment
  void* big = Alloc(30 * kMiB);  // 20 + 30 > 40: the cache is released first
  EXPECT_NE(big, nullptr);
  AllocatorStats s = Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(30 * kMiB));
}

TEST_F(AllocatorTest, LargeRequestsShrinkTheirSegmentToFitATightBudget) {
  Make({.budget = 4 * kMiB});
  void* p = Alloc(3 * kMiB);  // would reserve 20 MiB; 4 MiB is what the budget allows
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kMiB));
}

TEST_F(AllocatorTest, PressureHandlerIsCalledWithSizeAndStreamAndRetriedWhileItProgresses) {
  Make({.budget = 64 * kMiB});
  Stream s = *device_->CreateStream();
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) held.push_back(Alloc(16 * kMiB, s));
  std::vector<PressureRequest> calls;
  alloc_->SetPressureHandler([&](const PressureRequest& r) {
    calls.push_back(r);
    if (held.empty()) return false;
    // Evict one tensor per call: it takes two calls to make room for 32 MiB.
    EXPECT_TRUE(alloc_->Free(held.back()).ok());
    held.pop_back();
    return true;
  });
  void* p = Alloc(32 * kMiB, s);
  EXPECT_NE(p, nullptr);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].bytes, 32 * kMiB);
  EXPECT_EQ(calls[0].stream, s);
  EXPECT_EQ(calls[0].budget, 64 * kMiB);
  EXPECT_EQ(calls[0].reserved, 64 * kMiB);
  EXPECT_EQ(calls[0].allocated, 64 * kMiB);
  EXPECT_EQ(Stats().num_pressure_calls, 2);
  EXPECT_EQ(Stats().num_ooms, 0);
}

TEST_F(AllocatorTest, FailsWithADiagnosisWhenTheHandlerCannotHelp) {
  Make({.budget = 64 * kMiB, .event_ring_capacity = 64});
  void* a = Alloc(30 * kMiB);
  void* b = Alloc(30 * kMiB);
  (void)a;
  (void)b;
  int calls = 0;
  alloc_->SetPressureHandler([&](const PressureRequest&) {
    ++calls;
    return false;
  });
  auto p = alloc_->Allocate(10 * kMiB);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(std::string(p.status().message()),
              AllOf(HasSubstr("10.00 MiB"), HasSubstr("budget 64.00 MiB"),
                    HasSubstr("reserved 60.00 MiB"), HasSubstr("allocated 60.00 MiB"),
                    HasSubstr("largest free block"), HasSubstr("fragmentation"),
                    // Each pool's share, which says where the memory is stuck.
                    HasSubstr("small pool: reserved 0 B, allocated 0 B, cached free 0 B"),
                    HasSubstr("large pool: reserved 60.00 MiB, allocated 60.00 MiB")));
  AllocatorStats s = Stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.allocation.all().current, 2);
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_FALSE(snap.events.empty());
  EXPECT_EQ(snap.events.back().action, TraceAction::kOom);
}

TEST_F(AllocatorTest, HandlerThatClaimsProgressForeverIsCutOff) {
  Make({.budget = 8 * kMiB, .max_pressure_rounds = 50});
  Alloc(6 * kMiB);
  int calls = 0;
  alloc_->SetPressureHandler([&](const PressureRequest&) {
    ++calls;
    return true;  // a lie
  });
  EXPECT_EQ(alloc_->Allocate(4 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 50);
}

TEST_F(AllocatorTest, RequestLargerThanTheBudgetFailsWithoutAskingTheHandler) {
  Make({.budget = 16 * kMiB});
  int calls = 0;
  alloc_->SetPressureHandler([&](const PressureRequest&) { return ++calls, true; });
  EXPECT_EQ(alloc_->Allocate(32 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 0);
}

TEST_F(AllocatorTest, BudgetValidation) {
  EXPECT_FALSE(CachingAllocator::Create(device_.get(), {.budget = 81 * kGiB}).ok());
  EXPECT_FALSE(CachingAllocator::Create(device_.get(), {.max_split_size = kMiB}).ok());
  EXPECT_FALSE(CachingAllocator::Create(nullptr).ok());
  EXPECT_FALSE(CachingAllocator::Create(device_.get(), {.budget = kSmallBuffer - 1}).ok());
  EXPECT_EQ(alloc_->SetBudget(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->SetBudget(kKiB).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->SetBudget(81 * kGiB).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->budget(), 80 * kGiB);
  Free(Alloc(64 * kMiB));
  ASSERT_TRUE(alloc_->SetBudget(32 * kMiB).ok());  // releases the cache to get under it
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(alloc_->Allocate(40 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
}

// --- Bad input ----------------------------------------------------------------

TEST_F(AllocatorTest, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  auto p = alloc_->Allocate(0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, nullptr);
  EXPECT_TRUE(alloc_->Free(nullptr).ok());
  AllocatorStats s = Stats();
  EXPECT_EQ(s.allocation.all().allocated, 0);
  EXPECT_EQ(s.segment.all().current, 0);
}

TEST_F(AllocatorTest, BadInputIsAClearErrorAndChangesNothing) {
  void* p = Alloc(4096);
  void* q = Alloc(4096);
  const std::string before = StatsToJson(Stats());

  auto too_big = alloc_->Allocate(81 * kGiB);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("larger than the device"));
  auto enormous = alloc_->Allocate(SIZE_MAX);
  EXPECT_EQ(enormous.status().code(), absl::StatusCode::kInvalidArgument);

  int local = 0;
  absl::Status foreign = alloc_->Free(&local);
  EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(foreign.message()), HasSubstr("not a pointer this allocator returned"));

  absl::Status interior = alloc_->Free(static_cast<char*>(p) + 16);
  EXPECT_EQ(interior.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(interior.message()), HasSubstr("interior pointer"));

  EXPECT_EQ(alloc_->RecordStream(&local, kDefaultStream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->SetOwner(&local, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatsToJson(Stats()), before);

  Free(q);
  const std::string after_free = StatsToJson(Stats());
  absl::Status twice = alloc_->Free(q);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.message()), HasSubstr("double free"));
  EXPECT_EQ(StatsToJson(Stats()), after_free);
  // The allocator still works.
  EXPECT_EQ(Alloc(4096), q);
}

TEST_F(AllocatorTest, DoubleFreeWhilePendingIsNamed) {
  Stream s2 = *device_->CreateStream();
  void* p = Alloc(4096);
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(s2, [] {}, 1000).ok());
  Free(p);
  EXPECT_THAT(std::string(alloc_->Free(p).message()), HasSubstr("waiting for its streams"));
}

// --- Statistics ---------------------------------------------------------------

TEST_F(AllocatorTest, StatisticsArithmetic) {
  void* a = Alloc(1000);         // small: 1024
  void* b = Alloc(3 * kMiB);     // large: 3 MiB in a 20 MiB segment
  void* c = Alloc(2 * kMiB + 1); // large: shares the segment
  AllocatorStats s = Stats();
  EXPECT_EQ(s.allocation.all().current, 3);
  EXPECT_EQ(s.allocation.small().current, 1);
  EXPECT_EQ(s.allocation.large().current, 2);
  EXPECT_EQ(s.allocated_bytes.all().current, static_cast<std::int64_t>(1024 + 3 * kMiB + 2 * kMiB + 512));
  EXPECT_EQ(s.requested_bytes.all().current, static_cast<std::int64_t>(1000 + 3 * kMiB + 2 * kMiB + 1));
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(22 * kMiB));
  EXPECT_EQ(s.active_bytes.all().current, s.allocated_bytes.all().current);
  EXPECT_EQ(s.inactive_split.all().current, 2);  // the tails of both segments
  EXPECT_EQ(s.inactive_split_bytes.all().current,
            static_cast<std::int64_t>(22 * kMiB) - s.allocated_bytes.all().current);

  Free(b);
  s = Stats();
  EXPECT_EQ(s.allocation.all().current, 2);
  EXPECT_EQ(s.allocation.all().peak, 3);
  EXPECT_EQ(s.allocation.all().allocated, 3);
  EXPECT_EQ(s.allocation.all().freed, 1);
  EXPECT_EQ(s.allocated_bytes.large().freed, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_EQ(s.allocated_bytes.all().peak, static_cast<std::int64_t>(1024 + 5 * kMiB + 512));
  EXPECT_EQ(s.inactive_split.large().current, 2);  // b's hole and the tail

  alloc_->ResetPeakStats();
  s = Stats();
  EXPECT_EQ(s.allocation.all().peak, 2);
  EXPECT_EQ(s.allocated_bytes.all().peak, s.allocated_bytes.all().current);
  alloc_->ResetAccumulatedStats();
  s = Stats();
  EXPECT_EQ(s.allocation.all().allocated, 0);
  EXPECT_EQ(s.allocation.all().current, 2);
  EXPECT_EQ(s.num_device_alloc, 0);
  Free(a);
  Free(c);
  s = Stats();
  EXPECT_EQ(s.allocation.all().current, 0);
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.requested_bytes.all().current, 0);
  EXPECT_EQ(s.active.all().current, 0);
  EXPECT_EQ(s.inactive_split.all().current, 0);
}

TEST_F(AllocatorTest, StatsJsonUsesPyTorchNames) {
  Alloc(1);
  const std::string json = StatsToJson(Stats());
  for (const char* key :
       {"\"allocation.all.current\":1", "\"segment.small_pool.peak\":1",
        "\"allocated_bytes.all.current\":512", "\"requested_bytes.all.current\":1",
        "\"inactive_split_bytes.large_pool.freed\":0", "\"reserved_bytes.all.allocated\":2097152",
        "\"active_bytes.all.peak\":512", "\"num_alloc_retries\":0", "\"num_ooms\":0",
        "\"num_device_alloc\":1", "\"num_device_free\":0"}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
}

// --- Snapshot, events, memory map -------------------------------------------

TEST_F(AllocatorTest, SnapshotBlocksTileEachSegmentInAddressOrder) {
  Make({.event_ring_capacity = 1024});
  std::vector<void*> live;
  for (int i = 0; i < 40; ++i) live.push_back(Alloc((i % 7 + 1) * 300 * 1024));
  for (int i = 0; i < 40; i += 3) Free(live[i]);
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_FALSE(snap.segments.empty());
  std::int64_t allocated = 0;
  for (std::size_t i = 0; i < snap.segments.size(); ++i) {
    const SegmentInfo& seg = snap.segments[i];
    if (i > 0) {
      EXPECT_GT(seg.address, snap.segments[i - 1].address);
    }
    std::uintptr_t at = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      EXPECT_EQ(b.address, at);
      at += b.size;
      if (b.state == BlockState::kActiveAllocated) {
        allocated += static_cast<std::int64_t>(b.size);
        EXPECT_GT(b.requested_size, 0u);
        EXPECT_LE(b.requested_size, b.size);
      }
    }
    EXPECT_EQ(at, seg.address + seg.total_size);
  }
  EXPECT_EQ(allocated, snap.stats.allocated_bytes.all().current);
  const std::string json = SnapshotToJson(snap);
  EXPECT_THAT(json, AllOf(HasSubstr("\"segments\":["), HasSubstr("\"blocks\":["),
                          HasSubstr("\"state\":\"active_allocated\""),
                          HasSubstr("\"state\":\"inactive\""), HasSubstr("\"action\":\"alloc\""),
                          HasSubstr("\"action\":\"segment_alloc\""),
                          HasSubstr("\"action\":\"free_completed\"")));
}

TEST_F(AllocatorTest, EventRingIsBoundedAndKeepsTheNewest) {
  Make({.event_ring_capacity = 5});
  std::vector<void*> ptrs;
  for (int i = 0; i < 4; ++i) ptrs.push_back(Alloc((i + 1) * 1024));  // 1 segment + 4 allocs
  Free(ptrs[3]);  // free_requested + free_completed
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.events.size(), 5u);
  EXPECT_EQ(snap.events[0].action, TraceAction::kAlloc);
  EXPECT_EQ(snap.events[0].size, 2048u);
  EXPECT_EQ(snap.events[3].action, TraceAction::kFreeRequested);
  EXPECT_EQ(snap.events[4].action, TraceAction::kFreeCompleted);
  EXPECT_EQ(snap.events[4].address, reinterpret_cast<std::uintptr_t>(ptrs[3]));
}

TEST_F(AllocatorTest, EventRingIsOffByDefault) {
  Free(Alloc(1024));
  EXPECT_TRUE(alloc_->TakeSnapshot().events.empty());
  EXPECT_FALSE(CachingAllocator::Create(device_.get(),
                                        {.event_ring_capacity = kMaxEventRingCapacity + 1})
                   .ok());
}

TEST_F(AllocatorTest, EventsAreStampedWithDeviceTime) {
  Make({.event_ring_capacity = 16});
  Alloc(1024);
  device_->AdvanceHost(12345);
  Alloc(1024);
  Snapshot snap = alloc_->TakeSnapshot();
  EXPECT_EQ(snap.events.front().time_ns, 0);
  EXPECT_EQ(snap.events.back().time_ns, 12345);
}

TEST_F(AllocatorTest, MemoryMapShowsOwnersAndFreeNeighbours) {
  void* a = Alloc(4 * kMiB);
  void* b = Alloc(4 * kMiB);
  void* c = Alloc(4 * kMiB);
  ASSERT_TRUE(alloc_->SetOwner(a, 11).ok());
  ASSERT_TRUE(alloc_->SetOwner(c, 33).ok());
  Free(b);
  MemoryMap map = alloc_->GetMemoryMap();
  ASSERT_EQ(map.segments.size(), 1u);
  const auto& blocks = map.segments[0].blocks;
  ASSERT_EQ(blocks.size(), 4u);  // a, hole, c, tail
  EXPECT_EQ(blocks[0].owner, 11u);
  EXPECT_FALSE(blocks[0].free());
  EXPECT_TRUE(blocks[1].free());
  EXPECT_EQ(blocks[1].size, 4 * kMiB);
  EXPECT_EQ(blocks[2].owner, 33u);
  EXPECT_TRUE(blocks[3].free());
  // An owner tag does not survive the block's free.
  Free(a);
  EXPECT_EQ(Alloc(4 * kMiB), a);
  EXPECT_EQ(alloc_->GetMemoryMap().segments[0].blocks[0].owner, 0u);
}

TEST_F(AllocatorTest, AllocateTagsTheOwnerInOneStep) {
  // From a fresh segment (the slow path) and from a cached block (the fast one).
  absl::StatusOr<void*> a = alloc_->Allocate(4 * kMiB, kDefaultStream, 21);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(alloc_->GetMemoryMap().segments[0].blocks[0].owner, 21u);
  Free(*a);
  absl::StatusOr<void*> again = alloc_->Allocate(4 * kMiB, kDefaultStream, 22);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
  EXPECT_EQ(alloc_->GetMemoryMap().segments[0].blocks[0].owner, 22u);
  // Without a tag a reused block carries none of its last owner's.
  Free(*again);
  EXPECT_EQ(Alloc(4 * kMiB), *a);
  EXPECT_EQ(alloc_->GetMemoryMap().segments[0].blocks[0].owner, 0u);
}

}  // namespace
}  // namespace remat
