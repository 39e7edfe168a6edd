// PinnedHostPool: buffers handed back behind copies are reused once those
// copies end, stream by stream, and what waits stays bounded on a device
// that nothing synchronizes.
#include "runtime/host_pool.h"

#include <memory>

#include "base/units.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

class HostPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = SimDevice::Create({.capacity = kGiB});
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    pool_ = std::make_unique<PinnedHostPool>(device_.get(), kGiB);
  }

  // A stream with `ns` of work queued on it (a copy still running).
  void Busy(Stream stream, std::int64_t ns) {
    ASSERT_TRUE(device_->LaunchHostFunc(stream, [] {}, ns).ok());
  }

  Stream NewStream() {
    auto s = device_->CreateStream();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Stream{};
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<PinnedHostPool> pool_;
};

TEST_F(HostPoolTest, ABufferBehindACopyIsReusedOnceTheCopyEnds) {
  const Stream s = NewStream();
  auto a = pool_->Allocate(kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  Busy(s, 1'000'000);
  ASSERT_TRUE(pool_->FreeAfter(*a, s).ok());
  EXPECT_EQ(pool_->waiting(), 1u);
  auto b = pool_->Allocate(kMiB);  // the copy may still read a
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*b, *a);
  EXPECT_EQ(pool_->held_bytes(), 2 * kMiB);
  ASSERT_TRUE(device_->SynchronizeStream(s).ok());
  auto c = pool_->Allocate(kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(pool_->waiting(), 0u);
  EXPECT_EQ(pool_->held_bytes(), 2 * kMiB);
  ASSERT_TRUE(pool_->FreeAfter(*b, s).ok());
  ASSERT_TRUE(pool_->FreeAfter(*c, s).ok());
}

TEST_F(HostPoolTest, AStreamWhoseCopiesEndedGivesItsBuffersBackBeforeASlowerOne) {
  const Stream slow = NewStream();
  const Stream quick = NewStream();
  auto x = pool_->Allocate(kMiB);
  auto y = pool_->Allocate(kMiB);
  ASSERT_TRUE(x.ok() && y.ok());
  Busy(slow, 50'000'000);
  Busy(quick, 1'000'000);
  ASSERT_TRUE(pool_->FreeAfter(*x, slow).ok());
  ASSERT_TRUE(pool_->FreeAfter(*y, quick).ok());
  ASSERT_TRUE(device_->SynchronizeStream(quick).ok());
  auto z = pool_->Allocate(kMiB);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(*z, *y);
  EXPECT_EQ(pool_->waiting(), 1u);  // x: its copy runs on
  ASSERT_TRUE(pool_->FreeAfter(*z, quick).ok());
}

TEST_F(HostPoolTest, WhatWaitsStaysBoundedOnADeviceNothingSynchronizes) {
  // Offload after offload on a simulated device whose clock moves only when
  // the host waits, and nothing waits: the pool used to keep every buffer
  // (none reusable) and scan them all at each allocation.
  const Stream s = NewStream();
  for (int i = 0; i < 4000; ++i) {
    auto p = pool_->Allocate(4096);
    ASSERT_TRUE(p.ok()) << i << ": " << p.status();
    Busy(s, 100'000);
    ASSERT_TRUE(pool_->FreeAfter(*p, s).ok());
  }
  // (The bound holds at each allocation: one more may wait after it.)
  EXPECT_LE(pool_->waiting(), PinnedHostPool::kMaxWaiting + 1);
  EXPECT_LE(pool_->held_bytes(), (PinnedHostPool::kMaxWaiting + 2) * 4096);
  EXPECT_EQ(pool_->in_use_bytes(), 0u);
}

}  // namespace
}  // namespace remat
