#include "integrations/env/env_allocator.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/alloc_replay.h"
#include "trace/rmm_log.h"

namespace remat::env {
namespace {

using ::testing::HasSubstr;

// Sets REMAT_* variables for one test and clears them after.
class EnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"REMAT_DEVICE", "REMAT_BUDGET", "REMAT_TRACE", "REMAT_STATS",
                          "REMAT_SNAPSHOT", "REMAT_SIM_CAPACITY", "REMAT_SIM_BACKED",
                          "REMAT_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
      unsetenv(v);
    }
  }
};

TEST_F(EnvTest, ReadsEveryVariable) {
  setenv("REMAT_DEVICE", "sim", 1);
  setenv("REMAT_BUDGET", "1.5GiB", 1);
  setenv("REMAT_TRACE", "/tmp/t.csv", 1);
  setenv("REMAT_STATS", "1", 1);
  setenv("REMAT_SIM_CAPACITY", "8GiB", 1);
  absl::StatusOr<Config> c = ConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device.kind, DeviceSpec::Kind::kSim);
  EXPECT_EQ(c->budget, 3 * kGiB / 2);
  EXPECT_EQ(c->trace_path, "/tmp/t.csv");
  EXPECT_TRUE(c->stats);
  EXPECT_EQ(c->device.sim.capacity, 8 * kGiB);
}

TEST_F(EnvTest, ABadVariableIsNamedInTheError) {
  setenv("REMAT_DEVICE", "tpu", 1);
  EXPECT_THAT(std::string(ConfigFromEnvironment().status().message()),
              HasSubstr("REMAT_DEVICE=tpu"));
  setenv("REMAT_DEVICE", "sim", 1);
  setenv("REMAT_BUDGET", "lots", 1);
  EXPECT_THAT(std::string(ConfigFromEnvironment().status().message()),
              HasSubstr("REMAT_BUDGET=lots"));
  // A bad configuration fails every call, with the same reason.
  Allocators bad(ConfigFromEnvironment());
  absl::StatusOr<void*> p = bad.Allocate(0, 1024, 0);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("REMAT_BUDGET=lots"));
}

TEST_F(EnvTest, AllocatorSettingsReachEveryDevicesAllocator) {
  setenv("REMAT_DEVICE", "sim", 1);
  setenv("REMAT_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:64", 1);
  // Not read by the preload shim: that variable configures PyTorch's own allocator.
  setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", 1);
  absl::StatusOr<Config> c = ConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status();
  Allocators allocators(c);
  absl::StatusOr<CachingAllocator*> a = allocators.For(1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->options().expandable_segments);
  EXPECT_EQ((*a)->options().max_split_size, 64 * kMiB);
  absl::StatusOr<void*> p = allocators.Allocate(1, 3 * kMiB, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE((*a)->TakeSnapshot().segments.at(0).is_expandable);
  ASSERT_TRUE(allocators.FreeOn(1, *p, nullptr).ok());
  // A bad string is named, with the variable it came from.
  setenv("REMAT_ALLOC_CONF", "expandable_segments:maybe", 1);
  EXPECT_THAT(std::string(ConfigFromEnvironment().status().message()),
              HasSubstr("REMAT_ALLOC_CONF=expandable_segments:maybe"));
  // As PyTorch's allocator, PYTORCH_CUDA_ALLOC_CONF counts when REMAT_ALLOC_CONF is unset; the
  // keys of PyTorch's own parts (its host allocator) stay PyTorch's.
  unsetenv("REMAT_ALLOC_CONF");
  ReadPyTorchAllocConf();
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:sometimes", 1);
  EXPECT_THAT(std::string(ConfigFromEnvironment().status().message()),
              HasSubstr("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:sometimes"));
  setenv("PYTORCH_CUDA_ALLOC_CONF",
         "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
         1);
  c = ConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status();
  Allocators from_pytorch(c);
  absl::StatusOr<CachingAllocator*> b = from_pytorch.For(0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->options().expandable_segments);
}

TEST_F(EnvTest, ServesUnderTheBudgetAndReportsMemInfo) {
  Config c;
  c.device.kind = DeviceSpec::Kind::kSim;
  c.budget = 64 * kMiB;
  c.device.sim.capacity = kGiB;
  Allocators a(c);
  absl::StatusOr<Allocators::MemInfo> info = a.GetMemInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total, 64 * kMiB);
  EXPECT_EQ(info->free, 64 * kMiB);
  absl::StatusOr<void*> p = a.Allocate(0, 40 * kMiB, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(a.Owns(*p));
  EXPECT_EQ(a.GetMemInfo(0)->free, 24 * kMiB);
  absl::StatusOr<void*> over = a.Allocate(0, 40 * kMiB, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  // Any stream a program names is served (on the simulator, as the default one).
  std::uint64_t stream = 0x1234;
  ASSERT_TRUE(a.Free(*p, &stream).ok());
  EXPECT_EQ(a.GetMemInfo(0)->free, 64 * kMiB);
  // A second free of a block in our (cached) segment is ours to refuse, never
  // a foreign pointer to hand to the real cudaFree.
  EXPECT_TRUE(a.Owns(*p));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(*p)));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(static_cast<char*>(*p) + 4096)));
  int foreign = 0;
  EXPECT_TRUE(absl::IsNotFound(a.Free(&foreign)));
  EXPECT_FALSE(a.Owns(&foreign));
  EXPECT_TRUE(a.Free(nullptr).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a.Allocate(-1, 1, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a.SetMemoryFraction(0, 1.5)));
  ASSERT_TRUE(a.SetMemoryFraction(0, 0.25).ok());
  EXPECT_EQ(a.GetMemInfo(0)->total, kGiB / 4);
}

TEST_F(EnvTest, SimulatedDevicesHaveTheirOwnAddressesAndRefuseAnothersFree) {
  Config c;
  c.device.kind = DeviceSpec::Kind::kSim;
  c.device.sim.capacity = kGiB;
  Allocators a(c);
  absl::StatusOr<void*> p0 = a.Allocate(0, 4 * kMiB, 0);
  absl::StatusOr<void*> p1 = a.Allocate(1, 4 * kMiB, 0);
  ASSERT_TRUE(p0.ok() && p1.ok());
  EXPECT_NE(*p0, *p1);
  EXPECT_TRUE((*a.For(0))->ContainsAddress(*p0));
  EXPECT_FALSE((*a.For(0))->ContainsAddress(*p1));
  EXPECT_FALSE((*a.For(1))->ContainsAddress(*p0));
  absl::Status wrong = a.FreeOn(1, *p0);
  EXPECT_TRUE(absl::IsInvalidArgument(wrong)) << wrong;
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("allocated on device 0, not device 1"));
  EXPECT_EQ((*a.For(0))->GetStats().allocation.all().current, 1);  // still allocated
  EXPECT_TRUE(a.FreeOn(0, *p0).ok());
  EXPECT_TRUE(a.FreeOn(1, *p1).ok());
}

TEST_F(EnvTest, ABudgetLargerThanTheDeviceIsRefused) {
  Config c;
  c.device.kind = DeviceSpec::Kind::kSim;
  c.budget = 2 * kGiB;
  c.device.sim.capacity = kGiB;
  Allocators a(c);
  ::testing::internal::CaptureStderr();
  EXPECT_THAT(std::string(a.Allocate(0, 1, 0).status().message()),
              HasSubstr("larger than device 0"));
  EXPECT_FALSE(a.Allocate(0, 1, 0).ok());
  // Said once on stderr, whatever the program does with the errors.
  const std::string told = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(told, HasSubstr("larger than device 0"));
  EXPECT_THAT(told, HasSubstr("device 0: "));
  EXPECT_THAT(told, HasSubstr("allocations on it through remat fail"));
  EXPECT_EQ(told.find("remat:"), told.rfind("remat:"));
}

TEST_F(EnvTest, TheTraceAtFinishReplays) {
  const std::string dir = ::testing::TempDir();
  Config c;
  c.device.kind = DeviceSpec::Kind::kSim;
  c.budget = 64 * kMiB;
  c.trace_path = dir + "/env_trace.csv";
  c.snapshot_path = dir + "/env_snapshot.pickle";
  Allocators a(c);
  void* x = *a.Allocate(0, 3 * kMiB, 0);
  void* y = *a.Allocate(0, 1000, 0);
  EXPECT_FALSE(a.Allocate(0, 100 * kMiB, 0).ok());
  ASSERT_TRUE(a.Free(x).ok());
  ASSERT_TRUE(a.Free(y).ok());
  a.Finish();
  a.Finish();  // once only
  absl::StatusOr<AllocLog> log = ReadRmmLog(c.trace_path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->allocations, 2u);
  EXPECT_EQ(log->frees, 2u);
  EXPECT_EQ(log->alloc_failures, 1u);
  EXPECT_TRUE(std::filesystem::exists(c.snapshot_path));
}

TEST_F(EnvTest, NoAllocationAtAllIsSaidAtFinish) {
  Config c;
  c.device.kind = DeviceSpec::Kind::kSim;
  c.trace_path = ::testing::TempDir() + "/never_written.csv";
  Allocators a(c);
  ::testing::internal::CaptureStderr();
  a.Finish();
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("made no CUDA allocation through remat"));
  EXPECT_FALSE(std::filesystem::exists(c.trace_path));
}

}  // namespace
}  // namespace remat::env
