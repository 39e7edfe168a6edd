// Regressions from review: each reproduces a bug that was fixed.
#include <atomic>
#include <thread>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

// A handler reporting no progress ended the request with an OOM even when
// another thread freed memory while the lock was released for the call.
TEST(AllocatorRegressionTest, MemoryFreedDuringTheHandlerIsUsed) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {.budget = 2 * kMiB})).value();
  void* p = *alloc->Allocate(kMiB);
  void* q = *alloc->Allocate(kMiB);  // the budget is full
  std::atomic<bool> entered{false}, go{false};
  alloc->SetPressureHandler([&](const PressureRequest&) {
    entered = true;
    while (!go) std::this_thread::yield();
    return false;  // this handler found nothing to evict
  });
  absl::StatusOr<void*> r;
  std::thread a([&] { r = alloc->Allocate(kMiB); });
  while (!entered) std::this_thread::yield();
  ASSERT_TRUE(alloc->Free(p).ok());  // meanwhile, another thread frees 1 MiB
  go = true;
  a.join();
  EXPECT_TRUE(r.ok()) << r.status();
  (void)q;
}

// A free private block next to a shared one it absorbed was not merged with
// a further private block of the same stream.
TEST(AllocatorRegressionTest, MergesAllTheWayAcrossAnAbsorbedSharedBlock) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  Stream s1 = *device->CreateStream();
  Stream s2 = *device->CreateStream();
  Stream s3 = *device->CreateStream();
  void* a = *alloc->Allocate(256 * kKiB, s1);
  void* b = *alloc->Allocate(256 * kKiB, s1);
  void* q = *alloc->Allocate(512 * kKiB, s1);
  void* rest = *alloc->Allocate(kMiB, s1);
  ASSERT_TRUE(alloc->FreeOnStream(b, s2).ok());  // private to idle s2
  ASSERT_TRUE(device->LaunchHostFunc(s1, [] {}, 1'000'000).ok());
  ASSERT_TRUE(alloc->Free(q).ok());  // private to busy s1
  void* other = *alloc->Allocate(kMiB, s3);  // shares s2's b
  ASSERT_TRUE(device->LaunchHostFunc(s3, [] {}, 1'000'000).ok());
  ASSERT_TRUE(alloc->Free(a).ok());  // a absorbs b, and must then absorb q
  const auto segments = alloc->GetStats().segment.all().current;
  EXPECT_EQ(*alloc->Allocate(kMiB, s1), a);  // a+b+q: 1 MiB, contiguous, s1's
  EXPECT_EQ(alloc->GetStats().segment.all().current, segments);
  (void)rest;
  (void)other;
}

// Blocks private to a destroyed stream were stranded; a block recorded on a
// destroyed stream could never be freed.
TEST(AllocatorRegressionTest, DestroyedStreamsStrandNothing) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  Stream s = *device->CreateStream();
  void* p = *alloc->Allocate(kMiB, s);
  void* q = *alloc->Allocate(kMiB, s);
  ASSERT_TRUE(alloc->Free(p).ok());
  ASSERT_TRUE(alloc->FreeOnStream(q, kDefaultStream).ok());
  ASSERT_TRUE(device->DestroyStream(s).ok());
  ASSERT_TRUE(alloc->EmptyCache().ok());
  EXPECT_EQ(alloc->GetStats().reserved_bytes.all().current, 0);

  Stream t = *device->CreateStream();
  void* r = *alloc->Allocate(4096);
  ASSERT_TRUE(alloc->RecordStream(r, t).ok());
  ASSERT_TRUE(device->DestroyStream(t).ok());
  EXPECT_TRUE(alloc->Free(r).ok());
  ASSERT_TRUE(alloc->EmptyCache().ok());
  EXPECT_EQ(alloc->GetStats().reserved_bytes.all().current, 0);
}

// SimDevice: Synchronize ignored work queued on destroyed streams, so a
// segment was unmapped under a copy that had not run yet.
TEST(SimDeviceRegressionTest, SynchronizeWaitsForDestroyedStreamsWork) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB, .backed = true})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  Stream s = *device->CreateStream();
  void* p = *alloc->Allocate(kMiB, s);
  void* host = *device->AllocateHost(kMiB);
  ASSERT_TRUE(device->CopyAsync(host, p, kMiB, CopyKind::kDeviceToHost, s).ok());
  ASSERT_TRUE(alloc->Free(p).ok());
  ASSERT_TRUE(device->DestroyStream(s).ok());
  ASSERT_TRUE(alloc->EmptyCache().ok());  // releases the segment: must wait for the copy
  EXPECT_EQ(device->ReservedBytes(), 0u);
  ASSERT_TRUE(device->Synchronize().ok());
}

// SimDevice: an event was reported complete while another thread was still
// running the work queued before it.
TEST(SimDeviceRegressionTest, EventIsNotDoneWhileItsWorkRuns) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  Stream s = *device->CreateStream();
  std::atomic<bool> running{false}, release{false};
  ASSERT_TRUE(device
                  ->LaunchHostFunc(
                      s,
                      [&] {
                        running = true;
                        while (!release) std::this_thread::yield();
                      },
                      1000)
                  .ok());
  Event e = *device->CreateEvent();
  ASSERT_TRUE(device->RecordEvent(e, s).ok());
  std::thread runner([&] { (void)device->SynchronizeStream(s); });
  while (!running) std::this_thread::yield();
  EXPECT_FALSE(*device->QueryEvent(e));  // the host clock passed it; the work has not
  release = true;
  runner.join();
  EXPECT_TRUE(*device->QueryEvent(e));
}

}  // namespace
}  // namespace remat
