// The C ABI under threads: many threads allocating and freeing through one
// allocator, and creating, acquiring, releasing and freeing tensors through
// one runtime under a budget that keeps it evicting. Linked against
// libremat.so only (run it in the TSan build: ctest -L tsan).
#include <remat/remat.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr int kThreads = 8;

remat_allocator* MakeAllocator(std::uint64_t budget, bool backed) {
  remat_allocator_options options;
  EXPECT_EQ(remat_allocator_options_init(&options), REMAT_OK);
  options.sim_capacity_bytes = kGiB;
  options.budget_bytes = budget;
  options.sim_backed = backed ? 1 : 0;
  remat_allocator* allocator = nullptr;
  EXPECT_EQ(remat_allocator_create(&options, &allocator), REMAT_OK) << remat_last_error();
  return allocator;
}

TEST(CApiThreadsTest, AllocateAndFreeFromManyThreads) {
  remat_allocator* a = MakeAllocator(256 * kMiB, /*backed=*/false);
  ASSERT_NE(a, nullptr);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([a, t, &errors] {
      std::mt19937 rng(1234 + t);
      const std::size_t sizes[] = {512, 4096, 100000, kMiB, 3 * kMiB, 12 * kMiB};
      std::vector<void*> held;
      for (int i = 0; i < 3000; ++i) {
        if (held.size() < 16 && (held.empty() || rng() % 2 == 0)) {
          void* p = nullptr;
          const remat_status st = remat_allocate(a, sizes[rng() % 6], 0, &p);
          if (st == REMAT_OK) {
            held.push_back(p);
          } else if (st != REMAT_OUT_OF_MEMORY) {
            ++errors;
          }
        } else {
          const std::size_t k = rng() % held.size();
          if (remat_deallocate(a, held[k]) != REMAT_OK) ++errors;
          held[k] = held.back();
          held.pop_back();
        }
        if (i % 500 == 0) {
          remat_stats stats;
          if (remat_get_stats(a, &stats) != REMAT_OK) ++errors;
          if (stats.reserved_bytes > 256 * kMiB) ++errors;
        }
      }
      for (void* p : held) {
        if (remat_deallocate(a, p) != REMAT_OK) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  remat_stats stats;
  ASSERT_EQ(remat_get_stats(a, &stats), REMAT_OK);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.allocations, 0u);
  EXPECT_LE(stats.reserved_bytes_peak, 256 * kMiB);
  EXPECT_EQ(remat_allocator_destroy(a), REMAT_OK);
}

TEST(CApiThreadsTest, EachThreadSeesItsOwnLastError) {
  remat_allocator* a = MakeAllocator(0, /*backed=*/false);
  ASSERT_NE(a, nullptr);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([a, t, &wrong] {
      EXPECT_STREQ(remat_last_error(), "");
      for (int i = 0; i < 200; ++i) {
        // A size beyond the device, different on every thread.
        void* p = nullptr;
        const std::size_t bytes = 2 * kGiB + static_cast<std::size_t>(t);
        if (remat_allocate(a, bytes, 0, &p) != REMAT_INVALID_ARGUMENT) ++wrong;
        if (std::string(remat_last_error()).find(std::to_string(bytes)) == std::string::npos) {
          ++wrong;
        }
        if (remat_allocate(a, 4096, 0, &p) != REMAT_OK || remat_deallocate(a, p) != REMAT_OK) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(remat_allocator_destroy(a), REMAT_OK);
}

// user_data of every tensor's callback: the byte it fills the tensor with.
struct Fill {
  remat_allocator* allocator;
  unsigned char value;
  std::atomic<int>* destroyed;
};

struct FillJob {
  void* out;
  std::size_t bytes;
  unsigned char value;
};

void RunFill(void* arg) {
  auto* job = static_cast<FillJob*>(arg);
  std::memset(job->out, job->value, job->bytes);
  delete job;
}

int Recompute(void* user_data, void* const*, std::size_t, void* output, std::size_t bytes,
              std::uint64_t stream) {
  auto* fill = static_cast<Fill*>(user_data);
  auto* job = new FillJob{output, bytes, fill->value};
  if (remat_launch_host_func(fill->allocator, stream, RunFill, job, 1000) != REMAT_OK) {
    delete job;
    return 1;
  }
  return 0;
}

void DestroyFill(void* user_data) {
  auto* fill = static_cast<Fill*>(user_data);
  ++*fill->destroyed;
  delete fill;
}

TEST(CApiThreadsTest, TensorsFromManyThreadsUnderABudget) {
  // Backed: every acquire checks the bytes. Each thread keeps its own tensors;
  // together they need far more than the budget, so tensors are dropped and
  // offloaded while other threads acquire theirs. One thread alone keeps up
  // to 12 MiB of them, over the budget too: on a busy machine the threads
  // may well run one after another.
  remat_allocator* a = MakeAllocator(8 * kMiB, /*backed=*/true);
  ASSERT_NE(a, nullptr);
  remat_runtime* rt = nullptr;
  ASSERT_EQ(remat_runtime_create(a, "lru", &rt), REMAT_OK) << remat_last_error();
  std::atomic<int> errors{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> attempts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([a, rt, t, &errors, &destroyed, &attempts] {
      std::mt19937 rng(99 + t);
      const std::size_t bytes = 512 * 1024;
      struct Mine {
        std::uint64_t id;
        unsigned char value;
      };
      std::vector<Mine> mine;
      for (int i = 0; i < 300; ++i) {
        const unsigned r = rng() % 10;
        if (mine.size() < 24 && (mine.empty() || r < 4)) {
          const auto value = static_cast<unsigned char>(t * 31 + i);
          remat_tensor_options opts;
          remat_tensor_options_init(&opts);
          opts.compute_ns = 1000;
          opts.allow_drop = rng() % 2;
          opts.allow_offload = !opts.allow_drop || rng() % 2;
          opts.recompute = Recompute;
          opts.user_data = new Fill{a, value, &destroyed};
          opts.destroy = DestroyFill;
          std::uint64_t id = 0;
          void* ptr = nullptr;
          ++attempts;  // destroy runs once for each, created or not
          const remat_status st = remat_tensor_create(rt, bytes, &opts, 0, &id, &ptr);
          if (st == REMAT_OUT_OF_MEMORY) continue;  // every other thread's pins
          if (st != REMAT_OK) {
            ADD_FAILURE() << remat_last_error();
            ++errors;
            continue;
          }
          // Written in stream order, as a kernel would: the block may still be
          // the source of an offload's copy that has not run yet.
          auto* job = new FillJob{ptr, bytes, value};
          if (remat_launch_host_func(a, 0, RunFill, job, 1000) != REMAT_OK) {
            delete job;
            ++errors;
          }
          if (remat_tensor_release(rt, id) != REMAT_OK) ++errors;
          mine.push_back({id, value});
        } else if (r < 8) {
          const Mine& m = mine[rng() % mine.size()];
          void* ptr = nullptr;
          const remat_status st = remat_tensor_acquire(rt, m.id, 0, &ptr);
          if (st == REMAT_OUT_OF_MEMORY) continue;
          if (st != REMAT_OK) {
            ADD_FAILURE() << remat_last_error();
            ++errors;
            continue;
          }
          if (remat_stream_synchronize(a, 0) != REMAT_OK) ++errors;
          const auto* p = static_cast<const unsigned char*>(ptr);
          if (p[0] != m.value || p[bytes - 1] != m.value || p[bytes / 2] != m.value) {
            ADD_FAILURE() << "tensor " << m.id << " came back with other bytes";
            ++errors;
          }
          if (remat_tensor_release(rt, m.id) != REMAT_OK) ++errors;
        } else {
          const std::size_t k = rng() % mine.size();
          if (remat_tensor_free(rt, mine[k].id) != REMAT_OK) ++errors;
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (const Mine& m : mine) {
        if (remat_tensor_free(rt, m.id) != REMAT_OK) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  remat_runtime_stats stats;
  ASSERT_EQ(remat_runtime_get_stats(rt, &stats), REMAT_OK);
  EXPECT_EQ(stats.live_tensors, 0u);
  EXPECT_EQ(stats.pinned_by_api, 0u);
  EXPECT_GT(stats.drops + stats.offloads, 0u);
  std::printf("%d creates, %llu tensors, %llu drops, %llu offloads, %llu recomputes\n",
              attempts.load(), static_cast<unsigned long long>(stats.tensors_created),
              static_cast<unsigned long long>(stats.drops),
              static_cast<unsigned long long>(stats.offloads),
              static_cast<unsigned long long>(stats.recomputes));
  EXPECT_EQ(destroyed.load(), attempts.load());
  EXPECT_EQ(remat_runtime_destroy(rt), REMAT_OK);
  EXPECT_EQ(remat_allocator_destroy(a), REMAT_OK);
}

TEST(CApiThreadsTest, HeaderIsUsableFromCpp) {
  remat_status st = REMAT_OK;
  EXPECT_STREQ(remat_status_name(st), "REMAT_OK");
  EXPECT_THAT(std::string(remat_version()), HasSubstr("."));
}

}  // namespace
