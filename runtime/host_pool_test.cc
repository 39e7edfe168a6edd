// PinnedHostPool: buffers handed back behind copies are reused once those
// copies end, stream by stream; an allocation asks after one running copy
// per stream, however many buffers wait; and past a bound the pool waits for
// the oldest rather than pin another buffer.
#include "runtime/host_pool.h"

#include <memory>
#include <utility>
#include <vector>

#include "base/units.h"
#include "device/forwarding_device.h"
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
  // (none came back) and pin a new one for each offload.
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

// A simulated device that counts the events it is asked about.
class CountingDevice final : public ForwardingDevice {
 public:
  explicit CountingDevice(Device* sim) : ForwardingDevice(sim) {}
  absl::StatusOr<bool> QueryEvent(Event e) override {
    ++queries;
    return ForwardingDevice::QueryEvent(e);
  }
  absl::Status SynchronizeEvent(Event e) override {
    ++waits;
    return ForwardingDevice::SynchronizeEvent(e);
  }

  int queries = 0;
  int waits = 0;
};

TEST_F(HostPoolTest, AnAllocationAsksAfterOneRunningCopyPerStream) {
  // Every allocation used to ask after every buffer still waiting: with
  // thousands of offloads in a step (and none coming back on a device
  // nothing synchronizes), a step's offloads cost quadratic time.
  CountingDevice counting(device_.get());
  PinnedHostPool pool(&counting, kGiB);
  const Stream a = NewStream();
  const Stream b = NewStream();
  std::vector<void*> buffers;
  for (int i = 0; i < 100; ++i) {
    auto p = pool.Allocate(4096);
    ASSERT_TRUE(p.ok()) << p.status();
    buffers.push_back(*p);
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Stream s = i % 2 ? a : b;
    Busy(s, 100'000);
    ASSERT_TRUE(pool.FreeAfter(buffers[i], s).ok());
  }
  ASSERT_EQ(pool.waiting(), 100u);
  counting.queries = 0;
  ASSERT_TRUE(pool.Allocate(4096).ok());
  EXPECT_EQ(counting.queries, 2);  // the front of each stream's queue
  EXPECT_EQ(counting.waits, 0);    // under the bound: a new buffer, no wait
  ASSERT_TRUE(device_->Synchronize().ok());
}

TEST_F(HostPoolTest, PastTheBoundACachedBufferThatFitsIsTakenWithoutWaiting) {
  // The pool waits only rather than pin a new buffer: on a GPU a cached one
  // that fits never holds the host back, however many wait on copies.
  CountingDevice counting(device_.get());
  PinnedHostPool pool(&counting, kGiB);
  const Stream busy = NewStream();
  const Stream idle = NewStream();
  std::vector<void*> buffers;
  for (std::size_t i = 0; i < PinnedHostPool::kMaxWaiting + 50; ++i) {
    auto p = pool.Allocate(4096);
    ASSERT_TRUE(p.ok()) << p.status();
    buffers.push_back(*p);
  }
  auto big = pool.Allocate(kMiB);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE(pool.FreeAfter(*big, idle).ok());  // no copy behind it: back at once
  for (void* p : buffers) {
    Busy(busy, 100'000);
    ASSERT_TRUE(pool.FreeAfter(p, busy).ok());
  }
  ASSERT_GT(pool.waiting(), PinnedHostPool::kMaxWaiting);
  auto again = pool.Allocate(kMiB);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *big);
  EXPECT_EQ(counting.waits, 0);
  auto small = pool.Allocate(4096);  // nothing cached fits: the oldest is waited for
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, buffers[0]);
  EXPECT_GE(counting.waits, 1);
  ASSERT_TRUE(device_->Synchronize().ok());
}

}  // namespace
}  // namespace remat
