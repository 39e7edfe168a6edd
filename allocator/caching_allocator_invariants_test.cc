// CachingAllocator::CheckInvariants: a sound allocator passes it after any
// mix of calls, and each kind of damage to its state (a counter, a link, a
// free set, a page, a pending free) is named rather than let through.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {

// Breaks one invariant at a time, reaching the allocator's private state.
class CachingAllocatorTestPeer {
 public:
  explicit CachingAllocatorTestPeer(CachingAllocator* alloc) : a_(alloc) {}

  void AddToAllocatedBytes(std::int64_t bytes) {
    MutexLock lock(&a_->mu_);
    a_->stats_.allocated_bytes.pools[kSmallPool].current += bytes;
    a_->stats_.allocated_bytes.pools[kAggregatePool].current += bytes;
  }
  void AddToInactiveSplit(std::int64_t n) {
    MutexLock lock(&a_->mu_);
    a_->stats_.inactive_split.pools[kSmallPool].current += n;
    a_->stats_.inactive_split.pools[kAggregatePool].current += n;
  }
  // The block after the live block at `ptr` forgets it (a one-way link).
  void UnlinkBack(void* ptr) {
    MutexLock lock(&a_->mu_);
    a_->live_.Find(reinterpret_cast<std::uintptr_t>(ptr))->next->prev = nullptr;
  }
  // The live block at `ptr` claims 512 bytes more than it has.
  void GrowBlock(void* ptr) {
    MutexLock lock(&a_->mu_);
    a_->live_.Find(reinterpret_cast<std::uintptr_t>(ptr))->size += kMinBlockSize;
  }
  // The free block after the live one at `ptr` leaves its pool's free set.
  void DropNextFromFreeSet(void* ptr) {
    MutexLock lock(&a_->mu_);
    CachingAllocator::Block* b = a_->live_.Find(reinterpret_cast<std::uintptr_t>(ptr))->next;
    a_->small_.free.erase(b->free_pos);
  }
  // The live block at `ptr` turns free in place, next to the free rest of
  // its segment, as if its free had skipped the merge.
  void FreeWithoutMerging(void* ptr) {
    MutexLock lock(&a_->mu_);
    CachingAllocator::Block* b = a_->live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
    a_->live_.Erase(b->addr);
    a_->stats_.allocation.Decrease(kSmallPool, 1);
    a_->stats_.allocated_bytes.Decrease(kSmallPool, static_cast<std::int64_t>(b->size));
    a_->stats_.requested_bytes.Decrease(kSmallPool, static_cast<std::int64_t>(b->requested));
    b->allocated = false;
    b->requested = 0;
    b->partition = CachingAllocator::PartitionOf(b->stream, b->shared);
    b->free_pos = a_->small_.free.insert(b).first;
    a_->stats_.inactive_split.Increase(kSmallPool, 1);
    a_->stats_.inactive_split_bytes.Increase(kSmallPool, static_cast<std::int64_t>(b->size));
  }
  // The allocator forgets the page under the live block at `ptr` (the
  // device keeps it mapped); returns its chunk, for PutPage.
  PhysicalChunk ForgetPage(void* ptr) {
    MutexLock lock(&a_->mu_);
    return std::exchange(PageOf(ptr), PhysicalChunk{});
  }
  void PutPage(void* ptr, PhysicalChunk chunk) {
    MutexLock lock(&a_->mu_);
    PageOf(ptr) = chunk;
  }
  // The first pending free waits for no event.
  void ClearPendingEvents() {
    MutexLock lock(&a_->mu_);
    a_->pending_frees_.front().block->pending_events = 0;
  }
  // The first pending free's event is also put among the spares.
  void SpareAPendingEvent() {
    MutexLock lock(&a_->mu_);
    a_->spare_events_.push_back(a_->pending_frees_.front().events.front());
  }
  void SetBudgetBehindItsBack(std::size_t budget) {
    MutexLock lock(&a_->mu_);
    a_->budget_ = budget;
  }

 private:
  PhysicalChunk& PageOf(void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a_->mu_) {
    CachingAllocator::Block* b = a_->live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
    CachingAllocator::Segment* seg = b->segment;
    return seg->pages[(b->addr - seg->addr) / a_->page_size_];
  }

  CachingAllocator* a_;
};

namespace {

using ::testing::HasSubstr;

class InvariantsTest : public ::testing::Test {
 protected:
  void Make(bool expandable, std::size_t budget = 0) {
    alloc_.reset();
    device_ = std::move(SimDevice::Create({.capacity = kGiB})).value();
    auto a = CachingAllocator::Create(device_.get(),
                                      {.budget = budget, .expandable_segments = expandable});
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(a).value();
  }
  void* Alloc(std::size_t bytes, Stream stream = kDefaultStream) {
    auto p = alloc_->Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  // The check's verdict, with the kind of error it must be when it fails.
  std::string Broken() {
    absl::Status s = alloc_->CheckInvariants();
    if (s.ok()) return "";
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return std::string(s.message());
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST_F(InvariantsTest, ASoundAllocatorPassesAfterEveryCall) {
  for (bool expandable : {false, true}) {
    SCOPED_TRACE(expandable ? "expandable" : "fixed");
    Make(expandable, 256 * kMiB);
    ASSERT_TRUE(alloc_->CheckInvariants().ok());
    const Stream other = *device_->CreateStream();
    std::vector<void*> live;
    for (std::size_t bytes : {std::size_t{1}, 700 * std::size_t{1024}, 3 * kMiB, std::size_t{5000},
                              25 * kMiB, std::size_t{512}}) {
      live.push_back(Alloc(bytes));
      ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
      live.push_back(Alloc(bytes, other));
      ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    }
    ASSERT_TRUE(alloc_->RecordStream(live[0], other).ok());
    ASSERT_TRUE(alloc_->Free(live[0]).ok());  // pending on `other`
    ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    void* again = Alloc(5000);
    ASSERT_TRUE(alloc_->Free(again).ok());  // set aside by the undo fast path
    ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    for (std::size_t i = 1; i < live.size(); i += 2) {
      ASSERT_TRUE(alloc_->FreeOnStream(live[i], other).ok());
      ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    }
    if (expandable) {
      auto gone = alloc_->Unback(live[8]);  // 25 MiB: whole pages inside
      ASSERT_TRUE(gone.ok()) << gone.status();
      ASSERT_GT(*gone, 0u);
      ASSERT_TRUE(alloc_->EmptyCache().ok());  // the pages go
      ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
      ASSERT_TRUE(alloc_->Reback(live[8]).ok());
      ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    }
    ASSERT_TRUE(alloc_->SetBudget(4 * kMiB).ok());  // below what is live: it stays
    ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    for (std::size_t i = 2; i < live.size(); i += 2) ASSERT_TRUE(alloc_->Free(live[i]).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    EXPECT_EQ(alloc_->GetStats().reserved_bytes.all().current, 0);
  }
}

TEST_F(InvariantsTest, NamesACounterThatDisagreesWithTheBlocks) {
  Make(false);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer(alloc_.get()).AddToAllocatedBytes(512);
  EXPECT_THAT(Broken(), HasSubstr("allocated_bytes[all] is 4608, the walk counts 4096"));
  (void)p;
}

TEST_F(InvariantsTest, NamesASplitCounterThatDisagreesWithTheFreeBlocks) {
  Make(false);
  void* p = Alloc(4096);  // splits its segment: one free remainder
  CachingAllocatorTestPeer(alloc_.get()).AddToInactiveSplit(1);
  EXPECT_THAT(Broken(), HasSubstr("inactive_split[all] is 2, the walk counts 1"));
  (void)p;
}

TEST_F(InvariantsTest, NamesALinkThatDoesNotPointBack) {
  Make(false);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer(alloc_.get()).UnlinkBack(p);
  EXPECT_THAT(Broken(), HasSubstr("its next block's prev does not point back"));
}

TEST_F(InvariantsTest, NamesBlocksThatOverlap) {
  Make(false);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer(alloc_.get()).GrowBlock(p);
  EXPECT_THAT(Broken(), HasSubstr("(a gap or an overlap)"));
}

TEST_F(InvariantsTest, NamesAFreeBlockMissingFromItsFreeSet) {
  Make(false);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer(alloc_.get()).DropNextFromFreeSet(p);
  EXPECT_THAT(Broken(),
              HasSubstr("the small pool's free set holds 0 blocks, its segments 1 free ones"));
}

TEST_F(InvariantsTest, NamesFreeNeighboursLeftUncoalesced) {
  Make(false);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer(alloc_.get()).FreeWithoutMerging(p);
  EXPECT_THAT(Broken(), HasSubstr("were not coalesced"));
}

TEST_F(InvariantsTest, NamesAPageUnmappedUnderALiveBlock) {
  Make(true);
  void* p = Alloc(4096);
  CachingAllocatorTestPeer peer(alloc_.get());
  const PhysicalChunk page = peer.ForgetPage(p);
  EXPECT_THAT(Broken(), HasSubstr("is not mapped"));
  peer.PutPage(p, page);
  EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
}

TEST_F(InvariantsTest, NamesAPendingFreeWithNoEvent) {
  Make(false);
  void* p = Alloc(4096);
  const Stream other = *device_->CreateStream();
  ASSERT_TRUE(alloc_->RecordStream(p, other).ok());
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(
                      other, [] {}, 1000)
                  .ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
  CachingAllocatorTestPeer(alloc_.get()).ClearPendingEvents();
  EXPECT_THAT(Broken(), HasSubstr("waits for no event"));
}

TEST_F(InvariantsTest, NamesAnEventBothSpareAndWaitedOn) {
  Make(false);
  void* p = Alloc(4096);
  const Stream other = *device_->CreateStream();
  ASSERT_TRUE(alloc_->RecordStream(p, other).ok());
  ASSERT_TRUE(device_->LaunchHostFunc(other, [] {}, 1000).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  CachingAllocatorTestPeer(alloc_.get()).SpareAPendingEvent();
  EXPECT_THAT(Broken(), HasSubstr("is spare and in use"));
}

TEST_F(InvariantsTest, NamesReservedBytesAboveTheBudget) {
  Make(false);
  void* p = Alloc(30 * kMiB);
  ASSERT_TRUE(alloc_->CheckInvariants().ok());
  // Lowered without SetBudget, which would have kept what is reserved.
  CachingAllocatorTestPeer(alloc_.get()).SetBudgetBehindItsBack(4 * kMiB);
  EXPECT_THAT(Broken(), HasSubstr("above the budget"));
  (void)p;
}

}  // namespace
}  // namespace remat
