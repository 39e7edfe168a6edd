#include "runtime/stack.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(StackTest, ASimulatedStackWithARuntimeWorks) {
  DeviceSpec spec;
  spec.kind = DeviceSpec::Kind::kSim;
  spec.sim.capacity = kGiB;
  absl::StatusOr<Stack> stack = MakeStack(spec, {.budget = 64 * kMiB}, RuntimeOptions{});
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE(stack->runtime, nullptr);
  EXPECT_EQ(stack->allocator->device(), stack->device.get());
  EXPECT_EQ(stack->device->Capacity(), kGiB);
  auto g = stack->runtime->Create(kMiB, TensorOptions{});
  ASSERT_TRUE(g.ok()) << g.status();
  // Moved, then replaced: each stack's runtime goes before its allocator and device
  // (a use after free here is what the sanitizer builds would report).
  Stack moved = std::move(*stack);
  g->Release();
  moved = std::move(MakeStack(spec, {}).value());
  EXPECT_EQ(moved.runtime, nullptr);
}

TEST(StackTest, BadPartsAreClearErrors) {
  DeviceSpec spec;
  spec.kind = DeviceSpec::Kind::kSim;
  spec.sim.capacity = 0;
  EXPECT_FALSE(MakeStack(spec, {}).ok());
  spec.sim.capacity = kGiB;
  RuntimeOptions bad;
  bad.policy = "no-such-policy";
  absl::StatusOr<Stack> stack = MakeStack(spec, {}, bad);
  ASSERT_FALSE(stack.ok());
  EXPECT_THAT(stack.status().message(), HasSubstr("no-such-policy"));
  EXPECT_EQ(MakeStack(std::unique_ptr<Device>(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StackTest, ForOneThreadTurnsEveryLockOff) {
  DeviceSpec device;
  device.kind = DeviceSpec::Kind::kSim;
  AllocatorOptions allocator;
  RuntimeOptions runtime;
  ASSERT_TRUE(device.sim.thread_safe && allocator.thread_safe && runtime.thread_safe);
  ForOneThread(&device.sim, &allocator, &runtime);
  EXPECT_FALSE(device.sim.thread_safe);
  EXPECT_FALSE(allocator.thread_safe);
  EXPECT_FALSE(runtime.thread_safe);
  // The three agree, so the stack is made (a runtime with locks over an
  // allocator without is refused).
  absl::StatusOr<Stack> stack = MakeStack(device, allocator, runtime);
  ASSERT_TRUE(stack.ok()) << stack.status();

  AllocatorOptions alone;
  SimDeviceOptions sim;
  ForOneThread(&sim, &alone);  // no runtime
  EXPECT_FALSE(sim.thread_safe);
  EXPECT_FALSE(alone.thread_safe);
}

TEST(DeviceSpecTest, ReadsTheEnvironmentAndNamesABadVariable) {
  setenv("REMAT_DEVICE", "sim", 1);
  setenv("REMAT_SIM_CAPACITY", "2GiB", 1);
  setenv("REMAT_SIM_BACKED", "1", 1);
  DeviceSpec spec;
  ASSERT_TRUE(spec.ReadEnvironment().ok());
  EXPECT_EQ(spec.kind, DeviceSpec::Kind::kSim);
  EXPECT_EQ(spec.sim.capacity, 2 * kGiB);
  EXPECT_TRUE(spec.sim.backed);
  EXPECT_EQ(spec.Describe(), "sim (2.00 GiB, backed)");

  setenv("REMAT_SIM_CAPACITY", "lots", 1);
  DeviceSpec kept;
  absl::Status bad = kept.ReadEnvironment();
  EXPECT_THAT(bad.message(), HasSubstr("REMAT_SIM_CAPACITY=lots"));
  EXPECT_EQ(kept.kind, DeviceSpec::Kind::kCuda);  // nothing changed
  setenv("REMAT_SIM_CAPACITY", "2GiB", 1);
  setenv("REMAT_DEVICE", "tpu", 1);
  EXPECT_THAT(kept.ReadEnvironment().message(), HasSubstr("REMAT_DEVICE=tpu"));
  EXPECT_EQ(kept.sim.capacity, DeviceSpec{}.sim.capacity);
  for (const char* v : {"REMAT_DEVICE", "REMAT_SIM_CAPACITY", "REMAT_SIM_BACKED"}) unsetenv(v);
}

}  // namespace
}  // namespace remat
