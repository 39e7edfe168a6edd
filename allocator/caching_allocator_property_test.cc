// Randomized operations against a reference model, over many seeds.
//
// The model is what a caller can know: which pointers are live, what was asked
// for. After every step the allocator must agree with it (statistics), and at
// intervals its own structure must be sound (blocks tile segments, no two live
// blocks overlap, the budget holds, the device agrees on reserved bytes), and
// after every step its own invariants must hold (CheckInvariants). In
// backed mode every live block carries a signature that must survive until
// its free: a block handed out twice would be caught by a clobbered signature.
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

struct LiveBlock {
  std::size_t requested;
  std::size_t size;
  Stream stream;
  std::uint64_t signature;
};

int SeedCount() {
  const char* env = std::getenv("REMAT_PROPERTY_SEEDS");
  return env != nullptr ? std::atoi(env) : 200;
}

std::size_t RandomSize(std::mt19937_64& rng) {
  const int kind = static_cast<int>(rng() % 100);
  if (kind < 55) return 1 + rng() % kMiB;                  // small pool
  if (kind < 90) return kMiB + 1 + rng() % (9 * kMiB);     // shared 20 MiB segments
  if (kind < 99) return 10 * kMiB + rng() % (90 * kMiB);   // own segments
  return 0;                                                // zero-byte tensors exist
}

void WriteSignature(void* p, std::size_t bytes, std::uint64_t sig) {
  std::memcpy(p, &sig, sizeof sig);
  std::memcpy(static_cast<char*>(p) + bytes - sizeof sig, &sig, sizeof sig);
}

bool SignatureIntact(const void* p, std::size_t bytes, std::uint64_t sig) {
  std::uint64_t head, tail;
  std::memcpy(&head, p, sizeof head);
  std::memcpy(&tail, static_cast<const char*>(p) + bytes - sizeof tail, sizeof tail);
  return head == sig && tail == sig;
}

void CheckStructure(const CachingAllocator& alloc, const SimDevice& device,
                    const std::map<std::uintptr_t, LiveBlock>& live, bool expandable) {
  Snapshot snap = alloc.TakeSnapshot();
  std::size_t reserved = 0, allocated = 0, active = 0;
  std::int64_t inactive_split = 0;
  std::size_t allocated_blocks = 0;
  for (const SegmentInfo& seg : snap.segments) {
    reserved += seg.total_size;
    std::uintptr_t at = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      ASSERT_EQ(b.address, at) << "blocks must tile the segment";
      ASSERT_GT(b.size, 0u);
      ASSERT_EQ(b.size % kMinBlockSize, 0u);
      at += b.size;
      if (b.state == BlockState::kActiveAllocated) {
        ++allocated_blocks;
        allocated += b.size;
        auto it = live.find(b.address);
        ASSERT_NE(it, live.end()) << "allocated block the caller does not hold";
        ASSERT_EQ(it->second.size, b.size);
      }
      if (b.state != BlockState::kInactive) active += b.size;
      if (b.state == BlockState::kInactive && seg.blocks.size() > 1) ++inactive_split;
    }
    ASSERT_EQ(at, seg.address + seg.total_size);
  }
  std::size_t live_nonzero = 0;
  for (const auto& [addr, b] : live) live_nonzero += addr != 0;
  ASSERT_EQ(allocated_blocks, live_nonzero);
  const AllocatorStats& s = snap.stats;
  ASSERT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(reserved));
  ASSERT_EQ(device.ReservedBytes(), reserved);
  ASSERT_LE(reserved, alloc.budget());
  ASSERT_EQ(s.allocated_bytes.all().current, static_cast<std::int64_t>(allocated));
  ASSERT_EQ(s.active_bytes.all().current, static_cast<std::int64_t>(active));
  // (A snapshot shows an expandable segment as its runs of mapped pages.)
  if (expandable) return;
  ASSERT_EQ(s.inactive_split.all().current, inactive_split);
  ASSERT_EQ(s.segment.all().current, static_cast<std::int64_t>(snap.segments.size()));
}

void RunSeed(std::uint64_t seed, bool backed, int steps, bool expandable = false) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << (backed ? " backed" : " unbacked")
                                  << (expandable ? " expandable" : ""));
  std::mt19937_64 rng(seed);
  SimDeviceOptions dev_options{.capacity = 8 * kGiB, .backed = backed};
  auto device = std::move(SimDevice::Create(dev_options)).value();
  AllocatorOptions options;
  options.budget = (256 + rng() % 1024) * kMiB;
  if (rng() % 3 == 0) options.max_split_size = (16 + rng() % 64) * kMiB;
  options.expandable_segments = expandable;
  auto alloc = std::move(CachingAllocator::Create(device.get(), options)).value();
  std::vector<Stream> streams = {kDefaultStream, *device->CreateStream(), *device->CreateStream()};

  std::map<std::uintptr_t, LiveBlock> live;  // by address; zero-byte ones are not kept
  std::size_t requested_sum = 0;
  std::int64_t ooms = 0;
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    const Stream stream = streams[rng() % streams.size()];
    if (op < 50 || live.empty()) {
      const std::size_t bytes = RandomSize(rng);
      absl::StatusOr<void*> p = alloc->Allocate(bytes, stream);
      if (!p.ok()) {
        ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
        ++ooms;
        continue;
      }
      if (bytes == 0) {
        ASSERT_EQ(*p, nullptr);
        continue;
      }
      const auto addr = reinterpret_cast<std::uintptr_t>(*p);
      ASSERT_EQ(addr % kMinBlockSize, 0u);
      const std::size_t size = *alloc->BlockSize(*p);
      ASSERT_GE(size, CachingAllocator::RoundSize(bytes));
      // No overlap with the live neighbours on either side.
      auto next = live.lower_bound(addr);
      if (next != live.end()) {
        ASSERT_LE(addr + size, next->first) << "overlaps the next block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.size, addr) << "overlaps the previous block";
      }
      const std::uint64_t sig = rng();
      if (backed) WriteSignature(*p, size, sig);
      live.emplace(addr, LiveBlock{bytes, size, stream, sig});
      requested_sum += bytes;
    } else if (op < 85) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      void* p = reinterpret_cast<void*>(it->first);
      if (backed) {
        ASSERT_TRUE(SignatureIntact(p, it->second.size, it->second.signature));
      }
      if (rng() % 4 == 0) {
        ASSERT_TRUE(alloc->FreeOnStream(p, stream).ok());
      } else {
        ASSERT_TRUE(alloc->Free(p).ok());
      }
      requested_sum -= it->second.requested;
      live.erase(it);
    } else if (op < 90) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(alloc->RecordStream(reinterpret_cast<void*>(it->first), stream).ok());
    } else if (op < 96) {
      ASSERT_TRUE(device->LaunchHostFunc(stream, [] {}, static_cast<std::int64_t>(rng() % 50000)).ok());
    } else if (op < 99) {
      device->AdvanceHost(static_cast<std::int64_t>(rng() % 40000));
    } else {
      ASSERT_TRUE(alloc->EmptyCache().ok());
    }
    // Before GetStats, which puts back a free the undo fast path set aside.
    const absl::Status sound = alloc->CheckInvariants();
    ASSERT_TRUE(sound.ok()) << "step " << step << ": " << sound;
    AllocatorStats s = alloc->GetStats();
    ASSERT_EQ(s.allocation.all().current, static_cast<std::int64_t>(live.size()));
    ASSERT_EQ(s.requested_bytes.all().current, static_cast<std::int64_t>(requested_sum));
    ASSERT_EQ(s.num_ooms, ooms);
    if (step % 97 == 0) {
      ASSERT_NO_FATAL_FAILURE(CheckStructure(*alloc, *device, live, expandable));
    }
  }
  ASSERT_NO_FATAL_FAILURE(CheckStructure(*alloc, *device, live, expandable));
  for (const auto& [addr, b] : live) {
    if (backed) {
      ASSERT_TRUE(SignatureIntact(reinterpret_cast<void*>(addr), b.size, b.signature));
    }
    ASSERT_TRUE(alloc->Free(reinterpret_cast<void*>(addr)).ok());
    ASSERT_TRUE(alloc->CheckInvariants().ok()) << alloc->CheckInvariants();
  }
  ASSERT_TRUE(alloc->EmptyCache().ok());
  ASSERT_TRUE(alloc->CheckInvariants().ok()) << alloc->CheckInvariants();
  AllocatorStats s = alloc->GetStats();
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.all().current, 0);
  EXPECT_EQ(device->ReservedBytes(), 0u);
}

TEST(AllocatorPropertyTest, AgreesWithTheModelUnbacked) {
  const int seeds = SeedCount();
  for (int seed = 1; seed <= seeds; ++seed) {
    ASSERT_NO_FATAL_FAILURE(RunSeed(static_cast<std::uint64_t>(seed), false, 1500));
  }
}

TEST(AllocatorPropertyTest, AgreesWithTheModelExpandable) {
  const int seeds = std::max(1, SeedCount() / 2);
  for (int seed = 1; seed <= seeds; ++seed) {
    ASSERT_NO_FATAL_FAILURE(RunSeed(static_cast<std::uint64_t>(seed) * 104729, false, 1500,
                                    /*expandable=*/true));
  }
}

TEST(AllocatorPropertyTest, LiveBlocksKeepTheirBytesBacked) {
  const int seeds = std::max(1, SeedCount() / 4);
  for (int seed = 1; seed <= seeds; ++seed) {
    ASSERT_NO_FATAL_FAILURE(RunSeed(static_cast<std::uint64_t>(seed) * 7919, true, 1000));
  }
}

}  // namespace
}  // namespace remat
