// Many host threads allocating, freeing, recording streams and reading
// statistics at once, on real (backed) memory. Each thread fills its blocks
// with its own pattern and checks it before freeing: two threads handed the
// same bytes would see each other's writes. Also built with ThreadSanitizer
// (ctest -L tsan in the TSan build, as CI does).
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

TEST(AllocatorStressTest, ThreadsNeverShareBytes) {
  auto device = std::move(SimDevice::Create({.capacity = 4 * kGiB, .backed = true})).value();
  auto alloc =
      std::move(CachingAllocator::Create(device.get(), {.budget = 512 * kMiB})).value();
  constexpr int kThreads = 4;
  constexpr int kSteps = 3000;
  std::vector<Stream> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(*device->CreateStream());

  std::atomic<int> corrupted{0};
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      struct Held {
        void* p;
        std::size_t bytes;
      };
      std::vector<Held> held;
      const auto pattern = static_cast<unsigned char>(0x40 + t);
      auto check_and_free = [&](std::size_t i) {
        const Held h = held[i];
        const auto* bytes = static_cast<const unsigned char*>(h.p);
        for (std::size_t k = 0; k < h.bytes; k += 61) {
          if (bytes[k] != pattern) {
            ++corrupted;
            break;
          }
        }
        if (!alloc->Free(h.p).ok()) ++errors;
        held[i] = held.back();
        held.pop_back();
      };
      for (int step = 0; step < kSteps; ++step) {
        const Stream mine = streams[t];
        if (held.size() < 32 && rng() % 3 != 0) {
          const std::size_t bytes = rng() % 4 == 0 ? kMiB + rng() % (6 * kMiB) : 1 + rng() % 65536;
          absl::StatusOr<void*> p = alloc->Allocate(bytes, mine);
          if (!p.ok()) continue;  // over budget under contention: allowed
          std::memset(*p, pattern, bytes);
          held.push_back({*p, bytes});
          if (rng() % 8 == 0) {
            (void)alloc->RecordStream(*p, streams[rng() % kThreads]);
          }
        } else if (!held.empty()) {
          check_and_free(rng() % held.size());
        }
      }
      while (!held.empty()) check_and_free(held.size() - 1);
    });
  }
  // One observer reads statistics and snapshots while the others work.
  std::thread observer([&] {
    while (!stop.load()) {
      AllocatorStats s = alloc->GetStats();
      if (s.allocated_bytes.all().current > s.reserved_bytes.all().current) ++errors;
      (void)alloc->TakeSnapshot();
      (void)alloc->GetMemoryMap();
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  observer.join();

  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(device->Synchronize().ok());
  ASSERT_TRUE(alloc->EmptyCache().ok());
  AllocatorStats s = alloc->GetStats();
  EXPECT_EQ(s.allocation.all().current, 0);
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
}

TEST(AllocatorStressTest, PressureHandlerRunsConcurrentlyWithOtherThreads) {
  auto device = std::move(SimDevice::Create({.capacity = 4 * kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {.budget = 128 * kMiB})).value();
  // A shared pool of "evictable" blocks the handler frees from.
  Mutex mu;
  std::vector<void*> evictable;
  std::atomic<int> handler_calls{0};
  alloc->SetPressureHandler([&](const PressureRequest&) {
    ++handler_calls;
    void* victim = nullptr;
    {
      MutexLock lock(&mu);
      if (evictable.empty()) return false;
      victim = evictable.back();
      evictable.pop_back();
    }
    return alloc->Free(victim).ok();
  });
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(99 + t);
      for (int i = 0; i < 1500; ++i) {
        absl::StatusOr<void*> p = alloc->Allocate(kMiB + rng() % (8 * kMiB));
        if (!p.ok()) {
          ++failures;
          continue;
        }
        MutexLock lock(&mu);
        evictable.push_back(*p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(handler_calls.load(), 0);
  AllocatorStats s = alloc->GetStats();
  EXPECT_LE(s.reserved_bytes.all().peak, static_cast<std::int64_t>(128 * kMiB));
  EXPECT_EQ(s.num_ooms, failures.load());
  for (void* p : evictable) ASSERT_TRUE(alloc->Free(p).ok());
}

}  // namespace
}  // namespace remat
