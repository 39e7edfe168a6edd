// Expandable segments: one reserved range per pool and stream, grown and
// shrunk page by page on the device's virtual memory.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

class ExpandableTest : public ::testing::Test {
 protected:
  void Make(bool expandable, std::size_t budget = 0, bool backed = false,
            std::size_t max_step_allocations = CachingAllocator::kMaxStepAllocations) {
    alloc_.reset();
    device_ = std::move(SimDevice::Create({.capacity = kGiB, .backed = backed})).value();
    auto a = CachingAllocator::Create(
        device_.get(), {.budget = budget, .event_ring_capacity = 1024,
                        .expandable_segments = expandable,
                        .max_step_allocations = max_step_allocations});
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(a).value();
  }
  void* Alloc(std::size_t bytes, Stream stream = kDefaultStream) {
    auto p = alloc_->Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  void Free(void* p) { ASSERT_TRUE(alloc_->Free(p).ok()); }
  std::int64_t Reserved() { return alloc_->GetStats().reserved_bytes.all().current; }
  std::int64_t PeakReserved() { return alloc_->GetStats().reserved_bytes.all().peak; }
  // What every view of the allocator must agree on.
  void CheckConsistent() {
    const absl::Status sound = alloc_->CheckInvariants();
    EXPECT_TRUE(sound.ok()) << sound;
    const std::int64_t reserved = Reserved();
    EXPECT_EQ(static_cast<std::int64_t>(device_->ReservedBytes()), reserved);
    EXPECT_EQ(static_cast<std::int64_t>(device_->MappedBytes()), reserved);
    Snapshot snap = alloc_->TakeSnapshot();
    std::int64_t in_segments = 0;
    for (const SegmentInfo& seg : snap.segments) {
      EXPECT_TRUE(seg.is_expandable);
      std::size_t tiled = 0;
      for (const BlockInfo& b : seg.blocks) {
        EXPECT_EQ(b.address, seg.address + tiled);
        tiled += b.size;
      }
      // Equal, less the pages of blocks that gave theirs up (Unback).
      EXPECT_GE(tiled, seg.total_size);
      in_segments += static_cast<std::int64_t>(seg.total_size);
    }
    EXPECT_EQ(in_segments, reserved);
    std::int64_t in_map = 0;
    for (const MemoryMapSegment& seg : alloc_->GetMemoryMap().segments) {
      in_map += static_cast<std::int64_t>(seg.size);
    }
    EXPECT_EQ(in_map, reserved);
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST_F(ExpandableTest, GrowsOneRangeByPages) {
  Make(true);
  void* a = Alloc(30 * kMiB);
  void* b = Alloc(30 * kMiB);
  // Adjacent in one range, each mapping only the pages it needs.
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 30 * static_cast<std::ptrdiff_t>(kMiB));
  EXPECT_EQ(Reserved(), 60 * static_cast<std::int64_t>(kMiB));
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].is_expandable);
  CheckConsistent();
  Free(a);
  Free(b);
}

TEST_F(ExpandableTest, FreedNeighboursServeALargerRequestWithoutNewMemory) {
  for (bool expandable : {false, true}) {
    SCOPED_TRACE(expandable ? "expandable" : "segments");
    Make(expandable);
    void* a = Alloc(30 * kMiB);
    void* b = Alloc(30 * kMiB);
    Free(a);
    Free(b);
    void* c = Alloc(60 * kMiB);
    // Two fixed segments strand their bytes; one range coalesces them.
    EXPECT_EQ(PeakReserved(), (expandable ? 60 : 120) * static_cast<std::int64_t>(kMiB));
    Free(c);
  }
}

TEST_F(ExpandableTest, UnmapsFreeHolesBeforePassingThePeak) {
  Make(true);
  std::vector<void*> x;
  for (int i = 0; i < 4; ++i) x.push_back(Alloc(10 * kMiB));
  EXPECT_EQ(Reserved(), 40 * static_cast<std::int64_t>(kMiB));
  Free(x[0]);
  Free(x[2]);
  // No 20 MiB hole: the two 10 MiB holes are unmapped, and 20 MiB mapped at the end.
  void* big = Alloc(20 * kMiB);
  EXPECT_EQ(PeakReserved(), 40 * static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(Reserved(), 40 * static_cast<std::int64_t>(kMiB));
  CheckConsistent();
  // The snapshot shows the mapped runs: [x1], [x3, big].
  Snapshot snap = alloc_->TakeSnapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_EQ(snap.segments[0].total_size, 10 * kMiB);
  EXPECT_EQ(snap.segments[1].total_size, 30 * kMiB);
  bool mapped = false, unmapped = false;
  for (const TraceEvent& e : snap.events) {
    mapped |= e.action == TraceAction::kSegmentMap;
    unmapped |= e.action == TraceAction::kSegmentUnmap;
  }
  EXPECT_TRUE(mapped && unmapped);
  // The holes map again when asked for.
  void* again = Alloc(10 * kMiB);
  EXPECT_EQ(again, x[0]);
  Free(again);
  Free(big);
  Free(x[1]);
  Free(x[3]);
  CheckConsistent();
}

TEST_F(ExpandableTest, PartialPagesStayMappedForTheirNeighbours) {
  Make(true);
  void* a = Alloc(3 * kMiB);  // pages 0-1, the rest of page 1 is free
  void* b = Alloc(3 * kMiB);  // rounds its block to the free 1 MiB tail: no split below 1 MiB
  void* c = Alloc(5 * kMiB);
  Free(b);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  // b's whole pages went; the pages a and c share with it stay.
  CheckConsistent();
  EXPECT_LT(Reserved(), 14 * static_cast<std::int64_t>(kMiB));
  Free(a);
  Free(c);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
  EXPECT_EQ(device_->num_chunks(), 0u);
}

TEST_F(ExpandableTest, SmallBlocksNeverStraddleAPage) {
  Make(true);
  const auto page = static_cast<std::uintptr_t>(2 * kMiB);
  void* a = Alloc(768 * kKiB);  // page 0
  void* b = Alloc(768 * kKiB);  // page 0; 512 KiB of it stay free
  // Carved from page 0's free tail and a new page, c would hold both pages;
  // it starts a page of its own instead.
  void* c = Alloc(768 * kKiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c) % page, 0u);
  EXPECT_EQ(Reserved(), 2 * static_cast<std::int64_t>(page));
  // The 512 KiB left in page 0 still serves a request that fits it.
  void* d = Alloc(512 * kKiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d) / page, reinterpret_cast<std::uintptr_t>(a) / page);
  // Page 0's blocks gone, page 0 goes back whole; c's page stays.
  Free(a);
  Free(b);
  Free(d);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(page));
  CheckConsistent();
  Free(c);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(ExpandableTest, BudgetCountsMappedPagesOnly) {
  Make(true, /*budget=*/40 * kMiB);
  std::vector<void*> x;
  for (int i = 0; i < 4; ++i) x.push_back(Alloc(10 * kMiB));
  Free(x[0]);
  Free(x[2]);
  // Fixed segments could not place 20 MiB in a full 40 MiB budget with two
  // 10 MiB holes; pages move to where they are needed.
  void* big = Alloc(20 * kMiB);
  EXPECT_NE(big, nullptr);
  auto over = alloc_->Allocate(2 * kMiB + 512);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  CheckConsistent();
  Free(big);
  Free(x[1]);
  Free(x[3]);
}

TEST_F(ExpandableTest, EachStreamGrowsItsOwnRange) {
  Make(true);
  auto s1 = device_->CreateStream();
  ASSERT_TRUE(s1.ok());
  void* a = Alloc(4 * kMiB);
  void* b = Alloc(4 * kMiB, *s1);
  void* small = Alloc(4096);
  EXPECT_EQ(alloc_->TakeSnapshot().segments.size(), 3u);
  EXPECT_EQ(alloc_->GetStats().segment.all().current, 3);
  CheckConsistent();
  Free(a);
  Free(b);
  Free(small);
}

TEST_F(ExpandableTest, DestructionGivesEverythingBack) {
  Make(true);
  void* a = Alloc(100 * kMiB);
  (void)a;  // left live on purpose: the destructor releases it
  Alloc(4096);
  alloc_.reset();
  EXPECT_EQ(device_->ReservedBytes(), 0u);
  EXPECT_EQ(device_->num_chunks(), 0u);
  EXPECT_EQ(device_->FreeBytes(), kGiB);
}

// Random programs on a backed device: every live block keeps its bytes
// while pages are mapped and unmapped around it, and the views agree.
TEST_F(ExpandableTest, LiveBytesSurviveGrowthAndShrinking) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(seed);
    Make(true, /*budget=*/96 * kMiB, /*backed=*/true);
    std::mt19937 rng(seed);
    struct Live {
      void* ptr;
      std::size_t bytes;
      unsigned char fill;
      std::vector<unsigned char> saved;  // while unbacked: its bytes on the host
      bool unbacked = false;
    };
    std::vector<Live> live;
    std::vector<unsigned char> host;
    // An unbacked block comes back at its address, with the bytes copied in.
    auto reback = [&](Live& l) {
      if (!l.unbacked) return;
      absl::Status s = alloc_->Reback(l.ptr);
      if (absl::IsResourceExhausted(s)) return;  // no room now: it stays on the host
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(device_->CopyAsync(l.ptr, l.saved.data(), l.bytes, CopyKind::kHostToDevice,
                                     kDefaultStream).ok());
      ASSERT_TRUE(device_->Synchronize().ok());
      l.unbacked = false;
    };
    auto check = [&](const Live& l) {
      if (l.unbacked) {
        for (std::size_t i = 0; i < l.bytes; i += 4093) ASSERT_EQ(l.saved[i], l.fill) << i;
        return;
      }
      host.assign(l.bytes, 0);
      ASSERT_TRUE(device_->CopyAsync(host.data(), l.ptr, l.bytes, CopyKind::kDeviceToHost,
                                     kDefaultStream).ok());
      ASSERT_TRUE(device_->Synchronize().ok());
      for (std::size_t i = 0; i < l.bytes; i += 4093) ASSERT_EQ(host[i], l.fill) << i;
      ASSERT_EQ(host[l.bytes - 1], l.fill);
    };
    for (int step = 0; step < 300; ++step) {
      const unsigned roll = rng() % 100;
      const bool allocate = live.empty() || roll < 50;
      if (!allocate && roll < 62) {
        // Offload one that keeps its address, or bring one back.
        Live& l = live[rng() % live.size()];
        if (l.unbacked) {
          reback(l);
          continue;
        }
        l.saved.assign(l.bytes, 0);
        ASSERT_TRUE(device_->CopyAsync(l.saved.data(), l.ptr, l.bytes, CopyKind::kDeviceToHost,
                                       kDefaultStream).ok());
        auto gone = alloc_->Unback(l.ptr);
        ASSERT_TRUE(gone.ok()) << gone.status();
        ASSERT_TRUE(device_->Synchronize().ok());  // the host buffer is read below
        l.unbacked = *gone > 0;
        continue;
      }
      if (allocate) {
        const std::size_t sizes[] = {4096, 300 * 1024, 1536 * 1024, 3 * kMiB, 7 * kMiB + 512};
        const std::size_t bytes = sizes[rng() % 5] + rng() % 4096;
        auto p = alloc_->Allocate(bytes);
        if (!p.ok()) {
          ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          continue;
        }
        const auto fill = static_cast<unsigned char>(rng());
        host.assign(bytes, fill);
        ASSERT_TRUE(device_->CopyAsync(*p, host.data(), bytes, CopyKind::kHostToDevice,
                                       kDefaultStream).ok());
        ASSERT_TRUE(device_->Synchronize().ok());
        live.push_back({*p, bytes, fill});
      } else {
        const std::size_t i = rng() % live.size();
        check(live[i]);
        Free(live[i].ptr);
        live[i] = std::move(live.back());
        live.pop_back();
      }
      if (step % 50 == 0) {
        for (const Live& l : live) check(l);
        CheckConsistent();
      }
    }
    for (Live& l : live) {
      reback(l);
      check(l);
      Free(l.ptr);
    }
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_EQ(Reserved(), 0);
  }
}

// Addresses that survive eviction: an offload gives the pages up, the
// restore maps fresh ones at the same address, and the bytes come back.
TEST_F(ExpandableTest, UnbackedBlocksKeepTheirAddressAndGetTheirBytesBack) {
  Make(true, /*budget=*/16 * kMiB, /*backed=*/true);
  void* a = Alloc(5 * kMiB / 2);
  void* b = Alloc(10 * kMiB);  // [2.5, 12.5) MiB: whole pages [4, 12) inside
  ASSERT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 5 * static_cast<std::ptrdiff_t>(kMiB) / 2);
  std::vector<unsigned char> pattern(10 * kMiB), back(10 * kMiB);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 131 + 7);
  ASSERT_TRUE(device_->CopyAsync(b, pattern.data(), pattern.size(), CopyKind::kHostToDevice,
                                 kDefaultStream).ok());
  // The copy out, then the pages go.
  ASSERT_TRUE(device_->CopyAsync(back.data(), b, back.size(), CopyKind::kDeviceToHost,
                                 kDefaultStream).ok());
  auto gone = alloc_->Unback(b);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(*gone, 8 * kMiB);
  EXPECT_EQ(alloc_->Unback(b).status().code(), absl::StatusCode::kFailedPrecondition);
  // Memory is needed: the unbacked pages are what makes room.
  void* c = Alloc(8 * kMiB);
  ASSERT_NE(c, nullptr);
  EXPECT_LE(Reserved(), 16 * static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(std::memcmp(back.data(), pattern.data(), pattern.size()), 0);  // the copy out was whole
  // Nothing backs the middle now: the device refuses to touch it.
  EXPECT_FALSE(device_->CopyAsync(back.data(), static_cast<char*>(b) + 2 * kMiB, 4096,
                                  CopyKind::kDeviceToHost, kDefaultStream).ok());
  // No room to map it back while c lives...
  EXPECT_EQ(alloc_->Reback(b).code(), absl::StatusCode::kResourceExhausted);
  Free(c);
  // ...and once c's pages are free, they move.
  ASSERT_TRUE(alloc_->Reback(b).ok());
  ASSERT_TRUE(device_->CopyAsync(b, back.data(), back.size(), CopyKind::kHostToDevice,
                                 kDefaultStream).ok());
  std::vector<unsigned char> check(10 * kMiB);
  ASSERT_TRUE(device_->CopyAsync(check.data(), b, check.size(), CopyKind::kDeviceToHost,
                                 kDefaultStream).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(std::memcmp(check.data(), pattern.data(), pattern.size()), 0);
  EXPECT_EQ(alloc_->Reback(b).code(), absl::StatusCode::kFailedPrecondition);
  CheckConsistent();
  Free(a);
  Free(b);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(ExpandableTest, FreeingAnUnbackedBlockLeavesItsMiddleUnmapped) {
  Make(true, /*budget=*/64 * kMiB);
  void* a = Alloc(5 * kMiB / 2);
  void* b = Alloc(10 * kMiB);  // [2.5, 12.5) MiB
  void* c = Alloc(5 * kMiB / 2);
  ASSERT_TRUE(alloc_->Unback(b).ok());
  // Freed before its pages went: an ordinary free.
  Free(b);
  CheckConsistent();
  void* again = Alloc(10 * kMiB);
  ASSERT_EQ(again, b);
  ASSERT_TRUE(alloc_->Unback(b).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());  // the pages go now
  EXPECT_EQ(Reserved(), 8 * static_cast<std::int64_t>(kMiB));  // a, c and b's edge pages
  Free(b);
  CheckConsistent();
  EXPECT_EQ(Reserved(), 8 * static_cast<std::int64_t>(kMiB));
  // The hole maps again for whoever needs it (with the free bytes before it,
  // it takes the fewest new pages).
  void* d = Alloc(19 * kMiB / 2);
  EXPECT_EQ(d, b);
  CheckConsistent();
  Free(a);
  Free(c);
  Free(d);
  // Without expandable segments there is nothing to unback.
  Make(false);
  void* e = Alloc(30 * kMiB);
  EXPECT_EQ(alloc_->Unback(e).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(alloc_->Unback(static_cast<char*>(e) + 512).ok());
  Free(e);
}


// Steps (BeginStep, EndStep): a block freed before the step's peak took the
// page a block live at the peak needed; the next step places it apart, and
// the peak holds a page less.
TEST_F(ExpandableTest, AStepPlacesWhatIsGoneByThePeakApartFromWhatIsLiveThere) {
  Make(true);
  // One step: L1 and T on one page, L2 on a second (T holds the first's
  // room); T goes; a large block then needs a third page, though L1 and L2
  // would share one.
  const auto step = [&]() -> std::int64_t {
    void* l1 = Alloc(512 * kKiB);
    void* t = Alloc(kMiB);
    void* l2 = Alloc(kMiB);
    Free(t);
    void* big = Alloc(2 * kMiB);  // the peak: L1, L2 and this
    CheckConsistent();
    const std::int64_t peak = PeakReserved();
    for (void* p : {l1, l2, big}) Free(p);
    alloc_->EndStep();
    EXPECT_TRUE(alloc_->EmptyCache().ok());
    alloc_->ResetPeakStats();
    CheckConsistent();
    return peak;
  };
  alloc_->BeginStep();
  alloc_->EndStep();  // steps that made nothing are not judged
  alloc_->EndStep();
  EXPECT_EQ(alloc_->learned_allocations(), 0u);
  EXPECT_EQ(step(), 6 * kMiB);  // placed plainly: three pages
  EXPECT_EQ(alloc_->learned_allocations(), 4u);
  EXPECT_EQ(alloc_->learned_transient(), 1u);  // T
  alloc_->EndStep();                           // (nor in the trial)
  EXPECT_EQ(alloc_->learned_allocations(), 4u);
  EXPECT_EQ(step(), 4 * kMiB);  // T on a page of its own, gone before the peak
  EXPECT_EQ(step(), 4 * kMiB);  // kept: it held fewer pages than the plain step
  EXPECT_EQ(alloc_->learned_transient(), 1u);
  // Another sequence (other sizes) starts the trial over, from a plain step.
  void* other = Alloc(4 * kKiB);
  Free(other);
  alloc_->EndStep();
  EXPECT_EQ(alloc_->learned_allocations(), 0u);
  CheckConsistent();
  EXPECT_EQ(step(), 6 * kMiB);
  EXPECT_EQ(step(), 4 * kMiB);
}

// Only small blocks are placed apart: a large one not live at the peak is
// counted as learned but not as placed apart (it goes to the large pool).
TEST_F(ExpandableTest, ALargeBlockNotLiveAtThePeakIsNotCountedAsPlacedApart) {
  Make(true);
  alloc_->EndStep();
  void* l = Alloc(512 * kKiB);
  Free(Alloc(4 * kMiB));         // the peak: 4.5 MiB allocated
  Free(Alloc(kMiB));             // small, made after the peak
  void* late = Alloc(2 * kMiB);  // large, made after the peak
  Free(l);
  Free(late);
  alloc_->EndStep();
  EXPECT_EQ(alloc_->learned_allocations(), 4u);
  EXPECT_EQ(alloc_->learned_transient(), 1u);
  CheckConsistent();
}

// A step past max_step_allocations is not judged, and no step after it is
// placed by steps: a short one that would be learned is not.
TEST_F(ExpandableTest, AStepPastItsAllocationLimitEndsThePlacementByStepsForGood) {
  for (const bool too_long : {false, true}) {
    SCOPED_TRACE(too_long ? "too long" : "within the limit");
    Make(true, 0, false, /*max_step_allocations=*/too_long ? 3 : 4);
    alloc_->EndStep();
    void* l = Alloc(512 * kKiB);
    Free(Alloc(kMiB));  // gone by the peak
    void* peak = Alloc(2 * kMiB);
    Free(Alloc(4 * kKiB));  // the fourth
    Free(l);
    Free(peak);
    alloc_->EndStep();
    EXPECT_EQ(alloc_->learned_allocations(), too_long ? 0u : 4u);
    // Short steps (within the limit) after it are not learned either. (The
    // first of them, another sequence, starts over where steps are learned.)
    for (int i = 0; i < 2; ++i) {
      void* a = Alloc(512 * kKiB);
      Free(Alloc(kMiB));  // gone by the peak
      void* b = Alloc(2 * kMiB);
      Free(a);
      Free(b);
      alloc_->EndStep();
      EXPECT_EQ(alloc_->learned_allocations(), too_long || i == 0 ? 0u : 3u) << i;
    }
    CheckConsistent();
  }
  auto bad = CachingAllocator::Create(device_.get(), {.max_step_allocations = 0});
  EXPECT_FALSE(bad.ok());
  bad = CachingAllocator::Create(
      device_.get(), {.max_step_allocations = CachingAllocator::kMaxStepAllocations + 1});
  EXPECT_FALSE(bad.ok());
}

// A step whose request was refused (out of memory) is not judged: it says
// nothing of the step that fits.
TEST_F(ExpandableTest, AStepWithARefusedRequestTeachesNothing) {
  Make(true, 16 * kMiB);
  alloc_->EndStep();
  for (bool refused : {true, false}) {
    void* l1 = Alloc(512 * kKiB);
    void* t = Alloc(kMiB);
    Free(t);
    void* l2 = Alloc(kMiB);                                       // the peak: T is gone by it
    if (refused) EXPECT_FALSE(alloc_->Allocate(32 * kMiB).ok());  // past the budget
    Free(l1);
    Free(l2);
    alloc_->EndStep();
    EXPECT_EQ(alloc_->learned_allocations(), refused ? 0u : 3u);
  }
  CheckConsistent();
}

// The undo fast path hands a freed block back to the next request of its
// size only where that request would be placed in the same pool: B, live at
// the peak, does not take the page T (gone by then) was placed on.
TEST_F(ExpandableTest, AFreedBlockPlacedApartIsNotHandedBackToABlockLiveAtThePeak) {
  Make(true);
  const auto step = [&]() -> std::int64_t {
    void* l1 = Alloc(512 * kKiB);
    Free(Alloc(kMiB));      // (its page is mapped for it: no fast path)
    void* t = Alloc(kMiB);  // from the free block: the fast path
    Free(t);                // sets the block aside
    void* b = Alloc(kMiB);
    void* big = Alloc(2 * kMiB);  // the peak: L1, B and this
    CheckConsistent();
    const std::int64_t peak = PeakReserved();
    for (void* p : {l1, b, big}) Free(p);
    alloc_->EndStep();
    EXPECT_TRUE(alloc_->EmptyCache().ok());
    alloc_->ResetPeakStats();
    return peak;
  };
  alloc_->EndStep();
  EXPECT_EQ(step(), 4 * kMiB);  // plain: B takes T's block back
  EXPECT_EQ(alloc_->learned_transient(), 2u);
  EXPECT_EQ(step(), 4 * kMiB);  // apart: T's page is given back before the peak, B is not on it
}

// Under the budget, apart is a preference: a request whose own pool cannot
// grow takes the other small pool's free room before anything fails.
TEST_F(ExpandableTest, UnderTheBudgetABlockPlacedApartTakesRoomBesideTheOthers) {
  Make(true, 4 * kMiB);
  const auto step = [&] {
    const std::int64_t ooms = alloc_->GetStats().num_ooms;
    void* a = Alloc(kMiB);
    void* x = Alloc(2 * kMiB);  // the budget is reserved: two pages
    void* t = Alloc(512 * kKiB);
    Free(t);
    void* b = Alloc(512 * kKiB);  // the peak: A, X and B
    CheckConsistent();
    for (void* p : {a, x, b}) Free(p);
    alloc_->EndStep();
    EXPECT_EQ(alloc_->GetStats().num_ooms, ooms);
  };
  alloc_->EndStep();
  step();
  EXPECT_EQ(alloc_->learned_transient(), 1u);
  step();  // T, placed apart, finds its pool full and takes A's page's room
  step();
}

// Placed apart, the two kinds of blocks cannot share a page: where the step
// fits in one, the trial step reserves more, and every later step is placed
// plainly again.
TEST_F(ExpandableTest, AStepWhosePlacementReservedMoreIsNotPlacedSoAgain) {
  Make(true);
  const auto step = [&]() -> std::int64_t {
    void* l1 = Alloc(4 * kKiB);
    void* t = Alloc(4 * kKiB);
    Free(t);
    void* l2 = Alloc(4 * kKiB);
    void* l3 = Alloc(4 * kKiB);  // the peak
    const std::int64_t peak = PeakReserved();
    for (void* p : {l1, l2, l3}) Free(p);
    alloc_->EndStep();
    EXPECT_TRUE(alloc_->EmptyCache().ok());
    alloc_->ResetPeakStats();
    CheckConsistent();
    return peak;
  };
  EXPECT_EQ(step(), 2 * kMiB);  // (EndStep alone starts recording: nothing learned yet)
  EXPECT_EQ(alloc_->learned_allocations(), 0u);
  EXPECT_EQ(step(), 2 * kMiB);  // recorded, plainly
  EXPECT_EQ(alloc_->learned_transient(), 1u);
  EXPECT_EQ(step(), 4 * kMiB);                   // the trial: T's page beside the others'
  EXPECT_EQ(alloc_->learned_allocations(), 0u);  // refused
  EXPECT_EQ(step(), 2 * kMiB);
  EXPECT_EQ(step(), 2 * kMiB);
}

// Without expandable segments steps change nothing.
TEST_F(ExpandableTest, StepsDoNothingOnFixedSegments) {
  Make(false);
  alloc_->BeginStep();
  void* a = Alloc(4 * kKiB);
  Free(a);
  alloc_->EndStep();
  EXPECT_EQ(alloc_->learned_allocations(), 0u);
  EXPECT_TRUE(alloc_->CheckInvariants().ok());
}

}  // namespace
}  // namespace remat
