// libremat_torch.so's C functions, called as PyTorch calls them: loaded with
// dlopen, on the simulated device.
#include <dlfcn.h>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

using Malloc = void* (*)(std::size_t, int, void*);
using Free = void (*)(void*, std::size_t, int, void*);
using Reset = void (*)();
using Fraction = void (*)(double, int);
using RecordStream = void (*)(void*, void*);
using Stats = int (*)(int, std::uint64_t*);
using Snapshot = int (*)(int, const char*);
using LastError = const char* (*)();
using SetBudget = int (*)(int, std::uint64_t);
using GetBudget = int (*)(int, std::uint64_t*);
using ResetPeak = int (*)(int);
using NumOoms = int (*)(int, std::uint64_t*);
struct Pressure {
  std::uint64_t bytes, budget, reserved, allocated;
  int device;
};
using PressureFn = int (*)(void*, const Pressure*);
using SetPressureFn = int (*)(int, PressureFn, void*);

class TorchAllocatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("REMAT_DEVICE", "sim", 1);
    setenv("REMAT_BUDGET", "64MiB", 1);
    setenv("REMAT_SIM_CAPACITY", "1GiB", 1);
    lib_ = dlopen(REMAT_TORCH_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  }
  template <typename F>
  F Get(const char* name) {
    return reinterpret_cast<F>(dlsym(lib_, name));
  }
  static void* lib_;
};
void* TorchAllocatorTest::lib_ = nullptr;

TEST_F(TorchAllocatorTest, ServesMallocAndFreeWithPyTorchsSignatures) {
  ASSERT_NE(lib_, nullptr) << dlerror();
  auto remat_malloc = Get<Malloc>("remat_malloc");
  auto try_malloc = Get<Malloc>("remat_try_malloc");
  auto remat_free = Get<Free>("remat_free");
  auto stats = Get<Stats>("remat_torch_memory_stats");
  auto last_error = Get<LastError>("remat_torch_last_error");
  ASSERT_TRUE(remat_malloc && try_malloc && remat_free && stats && last_error);
  void* stream = reinterpret_cast<void*>(0x1234);  // any stream PyTorch names
  void* p = remat_malloc(3 << 20, 0, stream);
  ASSERT_NE(p, nullptr) << last_error();
  std::uint64_t s[4] = {};
  ASSERT_EQ(stats(0, s), 0);
  EXPECT_EQ(s[0], 3u << 20);
  // Out of memory (remat_try_malloc, for C callers): NULL, and the reason
  // where the caller can read it.
  EXPECT_EQ(try_malloc(std::size_t{1} << 30, 0, stream), nullptr);
  EXPECT_THAT(last_error(), HasSubstr("out of memory"));
  remat_free(p, 3 << 20, 0, stream);
  EXPECT_STREQ(last_error(), "");
  ASSERT_EQ(stats(0, s), 0);
  EXPECT_EQ(s[0], 0u);
  EXPECT_EQ(s[1], 3u << 20);
  // A pointer it never handed out changes nothing and says so.
  int foreign = 0;
  remat_free(&foreign, 4, 0, stream);
  EXPECT_THAT(last_error(), HasSubstr("not allocated by remat"));
  EXPECT_EQ(try_malloc(16, -1, stream), nullptr);  // no such device
}

// PyTorch 2.11 does not check its alloc_fn's NULL: remat_malloc throws
// instead, and PyTorch raises it in Python at the call that asked.
TEST_F(TorchAllocatorTest, MallocThrowsWhereTryMallocReturnsNull) {
  ASSERT_NE(lib_, nullptr) << dlerror();
  auto remat_malloc = Get<Malloc>("remat_malloc");
  auto remat_free = Get<Free>("remat_free");
  auto stats = Get<Stats>("remat_torch_memory_stats");
  ASSERT_TRUE(remat_malloc && remat_free && stats);
  std::uint64_t before[4] = {};
  ASSERT_EQ(stats(0, before), 0);
  try {
    remat_malloc(std::size_t{1} << 30, 0, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const std::exception& e) {
    // PyTorch's words, which tools that shrink a batch on out of memory match.
    EXPECT_THAT(e.what(), ::testing::StartsWith("CUDA out of memory. "));
  }
  try {
    remat_malloc(16, -1, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::StartsWith("remat: "));
  }
  std::uint64_t after[4] = {};
  ASSERT_EQ(stats(0, after), 0);
  EXPECT_EQ(after[0], before[0]);  // nothing allocated
  EXPECT_EQ(remat_malloc(0, 0, nullptr), nullptr);  // zero bytes: no memory, no error
  void* p = remat_malloc(1 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  remat_free(p, 1 << 20, 0, nullptr);
}

TEST_F(TorchAllocatorTest, TheOptionalHooksWork) {
  ASSERT_NE(lib_, nullptr) << dlerror();
  auto remat_malloc = Get<Malloc>("remat_malloc");
  auto try_malloc = Get<Malloc>("remat_try_malloc");
  auto remat_free = Get<Free>("remat_free");
  auto reset = Get<Reset>("remat_reset");
  auto fraction = Get<Fraction>("remat_set_memory_fraction");
  auto record = Get<RecordStream>("remat_record_stream");
  auto snapshot = Get<Snapshot>("remat_torch_write_snapshot");
  auto stats = Get<Stats>("remat_torch_memory_stats");
  auto last_error = Get<LastError>("remat_torch_last_error");
  ASSERT_TRUE(try_malloc && reset && fraction && record && snapshot && stats && last_error);
  void* p = remat_malloc(1 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  record(p, reinterpret_cast<void*>(0x99));
  EXPECT_STREQ(last_error(), "");
  remat_free(p, 1 << 20, 0, nullptr);
  reset();  // empty cache: reserved goes back to zero
  std::uint64_t s[4] = {};
  ASSERT_EQ(stats(0, s), 0);
  EXPECT_EQ(s[2], 0u);
  fraction(0.01, 0);  // 1% of 1 GiB
  EXPECT_EQ(try_malloc(20 << 20, 0, nullptr), nullptr);
  fraction(2.0, 0);
  EXPECT_THAT(last_error(), HasSubstr("not in (0, 1]"));
  fraction(1.0, 0);
  const std::string path = ::testing::TempDir() + "/torch_snapshot.pickle";
  ASSERT_EQ(snapshot(0, path.c_str()), 0) << last_error();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(snapshot(0, "/nonexistent-dir/s.pickle"), -1);
}

// remat.torch.budget's way in: a budget in bytes, and a callback that frees
// memory when a request does not fit.
TEST_F(TorchAllocatorTest, APressureCallbackFreesRoomAndTheRequestIsServed) {
  ASSERT_NE(lib_, nullptr) << dlerror();
  auto remat_malloc = Get<Malloc>("remat_malloc");
  auto try_malloc = Get<Malloc>("remat_try_malloc");
  auto remat_free = Get<Free>("remat_free");
  auto set_budget = Get<SetBudget>("remat_torch_set_budget");
  auto get_budget = Get<GetBudget>("remat_torch_get_budget");
  auto reset_peak = Get<ResetPeak>("remat_torch_reset_peak_stats");
  auto set_pressure = Get<SetPressureFn>("remat_torch_set_pressure_fn");
  auto num_ooms = Get<NumOoms>("remat_torch_num_ooms");
  auto stats = Get<Stats>("remat_torch_memory_stats");
  auto last_error = Get<LastError>("remat_torch_last_error");
  auto end_step = Get<ResetPeak>("remat_torch_end_step");  // (the same signature)
  ASSERT_TRUE(try_malloc && set_budget && get_budget && reset_peak && set_pressure && stats &&
              num_ooms && end_step);
  EXPECT_EQ(end_step(0), 0) << last_error();
  EXPECT_EQ(end_step(-1), -1);
  std::uint64_t ooms = 0;
  ASSERT_EQ(num_ooms(0, &ooms), 0);
  EXPECT_EQ(num_ooms(-1, &ooms), -1);
  EXPECT_EQ(num_ooms(0, nullptr), -1);  // no place for the answer: said, nothing changes
  EXPECT_THAT(last_error(), HasSubstr("out is NULL"));
  EXPECT_EQ(get_budget(0, nullptr), -1);
  EXPECT_THAT(last_error(), HasSubstr("out is NULL"));
  std::uint64_t was = 0;
  ASSERT_EQ(get_budget(0, &was), 0) << last_error();
  EXPECT_EQ(set_budget(0, 1024), -1);  // under the smallest segment
  EXPECT_THAT(last_error(), HasSubstr("budget must be between"));
  std::uint64_t now = 0;
  ASSERT_EQ(get_budget(0, &now), 0);
  EXPECT_EQ(now, was);  // refused: unchanged
  ASSERT_EQ(set_budget(0, 24 << 20), 0) << last_error();
  ASSERT_EQ(get_budget(0, &now), 0);
  EXPECT_EQ(now, 24u << 20);

  struct Held {
    Free free;
    void* ptr;
    int calls;
    Pressure last;
  } held{remat_free, remat_malloc(16 << 20, 0, nullptr), 0, {}};
  ASSERT_NE(held.ptr, nullptr) << last_error();
  auto callback = [](void* user, const Pressure* p) -> int {
    auto* h = static_cast<Held*>(user);
    ++h->calls;
    h->last = *p;
    if (h->ptr == nullptr) return 0;  // nothing left to give
    h->free(h->ptr, 0, p->device, nullptr);
    h->ptr = nullptr;
    return 1;
  };
  // Without a callback the request does not fit.
  EXPECT_EQ(try_malloc(16 << 20, 0, nullptr), nullptr);
  ASSERT_EQ(set_pressure(0, callback, &held), 0);
  void* p = remat_malloc(16 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << last_error();
  EXPECT_EQ(held.calls, 1);
  EXPECT_EQ(held.last.bytes, 16u << 20);
  EXPECT_EQ(held.last.budget, 24u << 20);
  EXPECT_EQ(held.last.allocated, 16u << 20);
  EXPECT_EQ(held.last.device, 0);
  std::uint64_t before = 0;
  ASSERT_EQ(num_ooms(0, &before), 0);
  // Nothing more to free: the callback says so and the request fails.
  EXPECT_EQ(try_malloc(16 << 20, 0, nullptr), nullptr);
  EXPECT_EQ(held.calls, 2);
  std::uint64_t after = 0;
  ASSERT_EQ(num_ooms(0, &after), 0);
  EXPECT_EQ(after, before + 1);
  ASSERT_EQ(set_pressure(0, nullptr, nullptr), 0);  // removed
  EXPECT_EQ(try_malloc(16 << 20, 0, nullptr), nullptr);
  EXPECT_EQ(held.calls, 2);
  EXPECT_EQ(set_pressure(-1, callback, &held), -1);
  remat_free(p, 16 << 20, 0, nullptr);
  ASSERT_EQ(reset_peak(0), 0);
  std::uint64_t s[4] = {};
  ASSERT_EQ(stats(0, s), 0);
  EXPECT_EQ(s[1], 0u);  // the peak allocated starts again from now
  ASSERT_EQ(set_budget(0, was), 0) << last_error();
}

TEST_F(TorchAllocatorTest, OnlyRematSymbolsAreExported) {
  ASSERT_NE(lib_, nullptr) << dlerror();
  // Abseil and our C++ code stay inside.
  EXPECT_EQ(dlsym(lib_, "_ZN5remat3env10Allocators7ProcessEv"), nullptr);
  EXPECT_NE(dlsym(lib_, "remat_malloc"), nullptr);
  EXPECT_NE(dlsym(lib_, "remat_try_malloc"), nullptr);
}

}  // namespace
