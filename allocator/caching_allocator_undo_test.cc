// The undo fast path (AllocatorOptions::fast_undo) against the full path.
//
// Two allocators, on two identical simulated devices, take the same random
// calls: one with the fast path, one without. Calls are drawn so that the
// fast path has work (an allocation freed at once, then the same request
// again) among everything that may interrupt it: other sizes and streams,
// frees on other streams, RecordStream, work on the streams (so that
// events are in flight), pressure, emptying the cache, bad
// pointers, statistics resets. Every call must return the same thing on
// both (the same address, the same error), and the statistics, snapshots
// and memory maps must be equal wherever they are compared.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/caching_allocator.h"
#include "allocator/snapshot.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

// Seeds per configuration: REMAT_PROPERTY_SEEDS, as the property test.
std::uint64_t Seeds() {
  const char* env = std::getenv("REMAT_PROPERTY_SEEDS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) / 10 : 20;
}

struct Config {
  const char* name;
  AllocatorOptions options;
  bool pressure_handler = false;  // frees the oldest live block when asked
};

struct Side {
  std::unique_ptr<SimDevice> device;
  std::unique_ptr<CachingAllocator> alloc;
  std::vector<Stream> streams;
  std::vector<void*> live;  // oldest first
};

std::unique_ptr<Side> MakeSide(const Config& config, bool fast) {
  auto owned = std::make_unique<Side>();
  Side& side = *owned;
  side.device = std::move(SimDevice::Create({.capacity = 4 * kGiB})).value();
  AllocatorOptions options = config.options;
  options.fast_undo = fast;
  side.alloc = std::move(CachingAllocator::Create(side.device.get(), options)).value();
  side.streams = {kDefaultStream, *side.device->CreateStream(), *side.device->CreateStream()};
  if (config.pressure_handler) {
    Side* self = &side;  // (the handler goes with the allocator, before the side)
    side.alloc->SetPressureHandler([self](const PressureRequest&) {
      if (self->live.empty()) return false;
      void* oldest = self->live.front();
      self->live.erase(self->live.begin());
      return self->alloc->Free(oldest).ok();
    });
  }
  return owned;
}

std::string State(const CachingAllocator& alloc) {
  return StatsToJson(alloc.GetStats()) + "\n" + SnapshotToJson(alloc.TakeSnapshot());
}

// The two states (statistics and snapshot, as JSON) are the same; where they
// are not, the failure shows the neighbourhood of the first difference.
void ExpectSameState(const CachingAllocator& fast, const CachingAllocator& full) {
  const std::string a = State(fast), b = State(full);
  if (a == b) return;
  std::size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  const std::size_t from = at > 120 ? at - 120 : 0;
  ADD_FAILURE() << "states differ at character " << at << "\n  fast path: ..."
                << a.substr(from, 240) << "\n  full path: ..." << b.substr(from, 240);
}

// One run of `steps` random calls; adds how many the fast path served to
// `served`.
void RunBoth(const Config& config, std::uint64_t seed, int steps, std::uint64_t* served) {
  const std::unique_ptr<Side> fast_side = MakeSide(config, true);
  const std::unique_ptr<Side> full_side = MakeSide(config, false);
  Side& fast = *fast_side;
  Side& full = *full_side;
  std::mt19937_64 rng(seed);
  const std::size_t sizes[] = {512,   4096,     4000,      70000,     kMiB,
                               kMiB + 1, 3 * kMiB, 12 * kMiB, 25 * kMiB};
  std::size_t last_size = 4096;
  std::size_t last_stream = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(testing::Message() << config.name << " seed " << seed << " step " << step);
    const int op = static_cast<int>(rng() % 100);
    const std::size_t pick = rng();
    const std::size_t stream_pick = rng() % 3;
    if (op < 40) {  // allocate: mostly the last request again
      if (rng() % 2 == 0) last_size = sizes[rng() % std::size(sizes)];
      if (rng() % 5 == 0) last_stream = stream_pick;
      absl::StatusOr<void*> a = fast.alloc->Allocate(last_size, fast.streams[last_stream]);
      absl::StatusOr<void*> b = full.alloc->Allocate(last_size, full.streams[last_stream]);
      ASSERT_EQ(a.status(), b.status());
      if (a.ok()) {
        ASSERT_EQ(*a, *b);
        fast.live.push_back(*a);
        full.live.push_back(*b);
      }
    } else if (op < 85) {  // free: mostly the newest
      ASSERT_EQ(fast.live, full.live);
      if (fast.live.empty()) continue;
      const std::size_t i = op < 70 ? fast.live.size() - 1 : pick % fast.live.size();
      void* p = fast.live[i];
      fast.live.erase(fast.live.begin() + static_cast<std::ptrdiff_t>(i));
      full.live.erase(full.live.begin() + static_cast<std::ptrdiff_t>(i));
      if (op < 80) {
        ASSERT_EQ(fast.alloc->Free(p), full.alloc->Free(p));
      } else {
        ASSERT_EQ(fast.alloc->FreeOnStream(p, fast.streams[stream_pick]),
                  full.alloc->FreeOnStream(p, full.streams[stream_pick]));
      }
    } else if (op < 88) {
      if (fast.live.empty()) continue;
      void* p = fast.live[pick % fast.live.size()];
      ASSERT_EQ(fast.alloc->RecordStream(p, fast.streams[stream_pick]),
                full.alloc->RecordStream(p, full.streams[stream_pick]));
    } else if (op < 90) {  // a double free, or an interior pointer
      void* p = reinterpret_cast<void*>(0x10000 + pick % 4096);
      EXPECT_EQ(fast.alloc->Free(p), full.alloc->Free(p));
    } else if (op < 92) {  // work on a stream (events behind it wait), or time passes
      for (Side* side : {&fast, &full}) {
        if (pick % 3 == 0) {
          side->device->AdvanceHost(static_cast<std::int64_t>(pick % 3000000));
        } else {
          ASSERT_TRUE(side->device->Occupy(side->streams[stream_pick], 1000000).ok());
        }
      }
    } else if (op < 94) {
      if (fast.live.empty()) continue;
      void* p = fast.live[pick % fast.live.size()];
      const absl::StatusOr<std::size_t> a = fast.alloc->AdjacentFreeBytes(p);
      const absl::StatusOr<std::size_t> b = full.alloc->AdjacentFreeBytes(p);
      ASSERT_EQ(a.status(), b.status());
      if (a.ok()) {
        ASSERT_EQ(*a, *b);
      }
    } else if (op < 95) {
      ASSERT_EQ(fast.alloc->EmptyCache(), full.alloc->EmptyCache());
    } else if (op < 96) {
      fast.alloc->ResetPeakStats();
      full.alloc->ResetPeakStats();
      if (pick % 2 == 0) {  // and a step ends (placement learned from it: same on both)
        fast.alloc->EndStep();
        full.alloc->EndStep();
      }
    } else if (op < 97) {
      fast.alloc->ResetAccumulatedStats();
      full.alloc->ResetAccumulatedStats();
    } else {
      ExpectSameState(*fast.alloc, *full.alloc);
      if (testing::Test::HasFailure()) return;
    }
  }
  ExpectSameState(*fast.alloc, *full.alloc);
  for (Side* side : {&fast, &full}) {
    for (void* p : side->live) EXPECT_TRUE(side->alloc->Free(p).ok());
  }
  ExpectSameState(*fast.alloc, *full.alloc);
  const MemoryMap a = fast.alloc->GetMemoryMap(), b = full.alloc->GetMemoryMap();
  EXPECT_EQ(a.segments.size(), b.segments.size());
  EXPECT_EQ(full.alloc->fast_undo_count(), 0u);
  *served += fast.alloc->fast_undo_count();
}

std::vector<Config> Configs() {
  std::vector<Config> configs;
  configs.push_back({"default", {}});
  AllocatorOptions tight;
  tight.budget = 48 * kMiB;
  configs.push_back({"48 MiB budget", tight});
  configs.push_back({"48 MiB budget, pressure handler", tight, true});
  AllocatorOptions split;
  split.max_split_size = 20 * kMiB;
  split.roundup_divisions.fill(4);
  split.event_ring_capacity = 1000;
  configs.push_back({"split limit, power-of-two divisions, event ring", split});
  AllocatorOptions expandable;
  expandable.expandable_segments = true;
  configs.push_back({"expandable segments", expandable});
  AllocatorOptions expandable_tight = expandable;
  expandable_tight.budget = 48 * kMiB;
  configs.push_back({"expandable segments, 48 MiB budget, pressure handler", expandable_tight,
                     true});
  return configs;
}

TEST(CachingAllocatorUndoTest, TheFastPathGivesWhatTheFullPathGives) {
  for (const Config& config : Configs()) {
    std::uint64_t served = 0;
    for (std::uint64_t seed = 1; seed <= Seeds(); ++seed) {
      RunBoth(config, seed, 1500, &served);
      if (testing::Test::HasFatalFailure()) return;
    }
    // The comparison means something only where the fast path ran.
    EXPECT_GT(served, 500u) << config.name;
    std::cout << config.name << ": " << served << " allocations served by the fast path\n";
  }
}

TEST(CachingAllocatorUndoTest, AnAllocationFreedAtOnceComesBackWithoutASearch) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  void* first = *alloc->Allocate(4096);  // (a new segment: the slow path)
  ASSERT_TRUE(alloc->Free(first).ok());
  ASSERT_EQ(*alloc->Allocate(4096), first);  // from the free set
  EXPECT_EQ(alloc->fast_undo_count(), 0u);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(alloc->Free(first).ok());
    void* again = *alloc->Allocate(4096);
    ASSERT_EQ(again, first);
  }
  EXPECT_EQ(alloc->fast_undo_count(), 100u);
  // Another size, another stream, or a call in between: the full path.
  ASSERT_TRUE(alloc->Free(first).ok());
  void* other = *alloc->Allocate(8192);
  ASSERT_TRUE(alloc->Free(other).ok());
  const Stream s = *device->CreateStream();
  void* on_s = *alloc->Allocate(8192, s);
  ASSERT_TRUE(alloc->Free(on_s).ok());
  void* p = *alloc->Allocate(4096);
  (void)alloc->GetStats();
  ASSERT_TRUE(alloc->Free(p).ok());
  (void)alloc->GetStats();
  ASSERT_EQ(*alloc->Allocate(4096), p);
  EXPECT_EQ(alloc->fast_undo_count(), 100u);
  // A double free of a block set aside is still refused.
  ASSERT_TRUE(alloc->Free(p).ok());
  EXPECT_FALSE(alloc->Free(p).ok());
}

// A block shared after its private neighbour was freed stays apart from it.
// Taken whole by that neighbour's stream and freed, it merges with the
// neighbour: the free must not be set aside, or the next request would get
// the block's old address instead of the merged block's start.
TEST(CachingAllocatorUndoTest, AFreeThatMergesWithMoreThanTheAllocationTookTakesTheFullPath) {
  std::vector<void*> got[2];
  for (bool fast : {true, false}) {
    auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
    AllocatorOptions options;
    options.fast_undo = fast;
    auto alloc = std::move(CachingAllocator::Create(device.get(), options)).value();
    const Stream t = *device->CreateStream();
    void* a = *alloc->Allocate(8192);
    void* b = *alloc->Allocate(4096);
    void* c = *alloc->Allocate(4096);  // (keeps b from merging with the rest)
    ASSERT_TRUE(alloc->FreeOnStream(b, t).ok());  // b: free, private to t
    ASSERT_TRUE(alloc->Free(a).ok());  // a: free, private to the default stream
    // Two requests that fit nothing: the first records an event on t, the
    // second, after the device is idle, shares t's free blocks (b).
    void* big1 = *alloc->Allocate(12 * kMiB);
    ASSERT_TRUE(device->Synchronize().ok());
    void* big2 = *alloc->Allocate(12 * kMiB);
    // b (shared, 4 KiB) fits better than a (8 KiB): taken whole, then freed.
    void* p = *alloc->Allocate(4096);
    ASSERT_EQ(p, b);
    ASSERT_TRUE(alloc->Free(p).ok());
    got[fast ? 0 : 1] = {a, p, *alloc->Allocate(4096)};
    EXPECT_EQ(alloc->fast_undo_count(), 0u);
    for (void* q : {c, big1, big2}) ASSERT_TRUE(alloc->Free(q).ok());
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0][2], got[0][0]) << "the merged block starts at a";
}

}  // namespace
}  // namespace remat
