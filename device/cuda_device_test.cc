// Tests of CudaDevice on a real GPU (ctest -L gpu). Every test skips, saying
// why, when this machine has no usable CUDA device.
#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "base/units.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CudaDevice::Create();
    if (!device.ok()) GTEST_SKIP() << "no usable CUDA device: " << device.status();
    device_ = std::move(device).value();
  }

  // Pinned host memory filled with a byte pattern that depends on `seed`.
  void* PinnedPattern(std::size_t bytes, std::uint32_t seed) {
    auto host = device_->AllocateHost(bytes);
    EXPECT_TRUE(host.ok()) << host.status();
    if (!host.ok()) return nullptr;
    auto* words = static_cast<std::uint32_t*>(*host);
    for (std::size_t i = 0; i < bytes / sizeof(std::uint32_t); ++i) {
      words[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
    }
    return *host;
  }

  void* Pinned(std::size_t bytes, unsigned char fill) {
    auto host = device_->AllocateHost(bytes);
    EXPECT_TRUE(host.ok()) << host.status();
    if (!host.ok()) return nullptr;
    std::memset(*host, fill, bytes);
    return *host;
  }

  Stream NewStream() {
    auto stream = device_->CreateStream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.value_or(kDefaultStream);
  }

  Event NewEvent() {
    auto event = device_->CreateEvent();
    EXPECT_TRUE(event.ok()) << event.status();
    return event.value_or(Event{});
  }

  std::unique_ptr<CudaDevice> device_;
};

// Blocks a stream (from a host function) until the test opens it, so that
// what is queued behind it is certainly not done yet. Opens itself when it
// goes out of scope, so a failing test does not leave a stream stuck.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { Open(); }

  absl::AnyInvocable<void() &&> Waiter() const {
    return [open = open_] {
      while (!open->load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    };
  }
  void Open() { open_->store(true, std::memory_order_release); }

 private:
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

TEST_F(CudaDeviceTest, DescribesItself) {
  EXPECT_EQ(device_->Describe().rfind("cuda:0 ", 0), 0u) << device_->Describe();
  EXPECT_GT(device_->Describe().size(), 7u);
  EXPECT_GT(device_->Capacity(), 0u);
  EXPECT_GT(device_->FreeBytes(), 0u);
  EXPECT_LE(device_->FreeBytes(), device_->Capacity());
  EXPECT_TRUE(CudaDevice::Available());
  EXPECT_GE(CudaDevice::DeviceCount(), 1);
  const std::int64_t t0 = device_->NowNs();
  EXPECT_LE(t0, device_->NowNs());
  EXPECT_EQ(CudaDevice::Create(CudaDevice::DeviceCount()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDevice::Create(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, ReservesAndReleasesSegments) {
  auto a = device_->ReserveSegment(64 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(*a, nullptr);
  auto b = device_->ReserveSegment(2 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(device_->num_segments(), 2u);
  EXPECT_EQ(device_->ReservedBytes(), 66 * kMiB);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, *a), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);

  EXPECT_TRUE(device_->ReleaseSegment(*a).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*b).ok());
  EXPECT_EQ(device_->num_segments(), 0u);
  EXPECT_EQ(device_->ReservedBytes(), 0u);
}

TEST_F(CudaDeviceTest, RejectsBadSegmentRequests) {
  EXPECT_EQ(device_->ReserveSegment(0).status().code(), absl::StatusCode::kInvalidArgument);

  auto seg = device_->ReserveSegment(4 * kMiB);
  ASSERT_TRUE(seg.ok()) << seg.status();
  int on_stack = 0;
  // Foreign, interior and null pointers are refused and free nothing.
  EXPECT_EQ(device_->ReleaseSegment(&on_stack).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->ReleaseSegment(static_cast<char*>(*seg) + 512).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->ReleaseSegment(nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Memory cudart allocated for someone else is not ours to free.
  void* foreign = nullptr;
  ASSERT_EQ(cudaMalloc(&foreign, kMiB), cudaSuccess);
  EXPECT_EQ(device_->ReleaseSegment(foreign).code(), absl::StatusCode::kInvalidArgument);
  cudaPointerAttributes attributes{};
  EXPECT_EQ(cudaPointerGetAttributes(&attributes, foreign), cudaSuccess);
  EXPECT_EQ(cudaFree(foreign), cudaSuccess);

  EXPECT_EQ(device_->num_segments(), 1u);
  ASSERT_TRUE(device_->ReleaseSegment(*seg).ok());
  EXPECT_EQ(device_->ReleaseSegment(*seg).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, OutOfMemoryIsResourceExhaustedAndLeavesNoError) {
  auto huge = device_->ReserveSegment(2 * device_->Capacity());
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("cudaErrorMemoryAllocation"), std::string::npos)
      << huge.status();
  // Not left in cudart's last-error slot for the caller's next check.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // And the device still works.
  auto small = device_->ReserveSegment(kMiB);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(device_->ReleaseSegment(*small).ok());
}

TEST_F(CudaDeviceTest, AllocatesPinnedHostMemory) {
  EXPECT_EQ(device_->AllocateHost(0).status().code(), absl::StatusCode::kInvalidArgument);
  auto host = device_->AllocateHost(3 * kMiB + 5);
  ASSERT_TRUE(host.ok()) << host.status();
  std::memset(*host, 0xab, 3 * kMiB + 5);  // writable, every byte
  EXPECT_EQ(device_->HostBytes(), 3 * kMiB + 5);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, *host), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);

  int on_stack = 0;
  EXPECT_EQ(device_->FreeHost(&on_stack).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->FreeHost(*host).ok());
  EXPECT_EQ(device_->FreeHost(*host).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->HostBytes(), 0u);
}

TEST_F(CudaDeviceTest, CopiesRoundTripOnAStream) {
  constexpr std::size_t kBytes = 64 * kMiB;
  void* src = PinnedPattern(kBytes, 7);
  void* dst = Pinned(kBytes, 0);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  auto d1 = device_->ReserveSegment(kBytes);
  auto d2 = device_->ReserveSegment(kBytes);
  ASSERT_TRUE(d1.ok() && d2.ok());
  const Stream s = NewStream();
  ASSERT_NE(s, kDefaultStream);

  ASSERT_TRUE(device_->CopyAsync(*d1, src, kBytes, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(device_->CopyAsync(*d2, *d1, kBytes, CopyKind::kDeviceToDevice, s).ok());
  ASSERT_TRUE(device_->CopyAsync(dst, *d2, kBytes, CopyKind::kDeviceToHost, s).ok());
  ASSERT_TRUE(device_->SynchronizeStream(s).ok());
  EXPECT_EQ(std::memcmp(src, dst, kBytes), 0);

  // Zero bytes is a no-op; null pointers are refused.
  EXPECT_TRUE(device_->CopyAsync(nullptr, nullptr, 0, CopyKind::kHostToDevice, s).ok());
  EXPECT_EQ(device_->CopyAsync(nullptr, src, 8, CopyKind::kHostToDevice, s).code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(device_->DestroyStream(s).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d1).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d2).ok());
  EXPECT_TRUE(device_->FreeHost(src).ok());
  EXPECT_TRUE(device_->FreeHost(dst).ok());
}

TEST_F(CudaDeviceTest, DefaultStreamIsHandleZero) {
  constexpr std::size_t kBytes = 4 * kMiB;
  void* src = PinnedPattern(kBytes, 11);
  void* dst = Pinned(kBytes, 0);
  auto d = device_->ReserveSegment(kBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(device_->CopyAsync(*d, src, kBytes, CopyKind::kHostToDevice, kDefaultStream).ok());
  ASSERT_TRUE(device_->CopyAsync(dst, *d, kBytes, CopyKind::kDeviceToHost, kDefaultStream).ok());
  ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
  EXPECT_EQ(std::memcmp(src, dst, kBytes), 0);
  EXPECT_EQ(device_->DestroyStream(kDefaultStream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->Synchronize().ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d).ok());
  EXPECT_TRUE(device_->FreeHost(src).ok());
  EXPECT_TRUE(device_->FreeHost(dst).ok());
}

TEST_F(CudaDeviceTest, EventsCompleteAfterTheWorkBeforeThem) {
  constexpr std::size_t kBytes = 16 * kMiB;
  void* src = PinnedPattern(kBytes, 3);
  auto d = device_->ReserveSegment(kBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  const Stream s = NewStream();
  const Event e = NewEvent();
  ASSERT_NE(e.handle, 0u);

  // Never recorded: complete.
  auto fresh = device_->QueryEvent(e);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(*fresh);

  ASSERT_TRUE(device_->CopyAsync(*d, src, kBytes, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(device_->RecordEvent(e, s).ok());
  ASSERT_TRUE(device_->SynchronizeEvent(e).ok());
  auto done = device_->QueryEvent(e);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);

  // Behind a stalled stream the event is not ready, and saying so leaves no
  // error behind.
  Gate gate;
  ASSERT_TRUE(device_->LaunchHostFunc(s, gate.Waiter()).ok());
  ASSERT_TRUE(device_->RecordEvent(e, s).ok());
  auto pending = device_->QueryEvent(e);
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_FALSE(*pending);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  gate.Open();
  ASSERT_TRUE(device_->SynchronizeEvent(e).ok());
  EXPECT_TRUE(device_->QueryEvent(e).value_or(false));

  EXPECT_EQ(device_->QueryEvent(Event{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->DestroyEvent(e).ok());
  EXPECT_TRUE(device_->DestroyStream(s).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d).ok());
  EXPECT_TRUE(device_->FreeHost(src).ok());
}

TEST_F(CudaDeviceTest, StreamWaitEventOrdersTwoStreams) {
  constexpr std::size_t kBytes = 64 * kMiB;
  void* pattern = PinnedPattern(kBytes, 42);
  void* zeros = Pinned(kBytes, 0);
  void* out = Pinned(kBytes, 0xff);
  auto d = device_->ReserveSegment(kBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  const Stream s1 = NewStream();
  const Stream s2 = NewStream();
  const Event written = NewEvent();
  const Event read = NewEvent();
  ASSERT_TRUE(device_->CopyAsync(*d, zeros, kBytes, CopyKind::kHostToDevice, s1).ok());
  ASSERT_TRUE(device_->SynchronizeStream(s1).ok());

  // s1 is held back before it writes the pattern; s2 reads only after s1's
  // write, so it cannot see the zeros however the streams are scheduled.
  Gate gate;
  ASSERT_TRUE(device_->LaunchHostFunc(s1, gate.Waiter()).ok());
  ASSERT_TRUE(device_->CopyAsync(*d, pattern, kBytes, CopyKind::kHostToDevice, s1).ok());
  ASSERT_TRUE(device_->RecordEvent(written, s1).ok());
  ASSERT_TRUE(device_->StreamWaitEvent(s2, written).ok());
  ASSERT_TRUE(device_->CopyAsync(out, *d, kBytes, CopyKind::kDeviceToHost, s2).ok());
  ASSERT_TRUE(device_->RecordEvent(read, s2).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(device_->QueryEvent(read).value_or(true));
  gate.Open();
  ASSERT_TRUE(device_->SynchronizeStream(s2).ok());
  EXPECT_TRUE(device_->QueryEvent(read).value_or(false));
  EXPECT_EQ(std::memcmp(pattern, out, kBytes), 0);

  EXPECT_TRUE(device_->DestroyEvent(written).ok());
  EXPECT_TRUE(device_->DestroyEvent(read).ok());
  EXPECT_TRUE(device_->DestroyStream(s1).ok());
  EXPECT_TRUE(device_->DestroyStream(s2).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d).ok());
  for (void* p : {pattern, zeros, out}) EXPECT_TRUE(device_->FreeHost(p).ok());
}

TEST_F(CudaDeviceTest, HostFunctionsRunInStreamOrder) {
  constexpr int kFunctions = 200;
  constexpr std::size_t kBytes = kMiB;
  void* src = PinnedPattern(kBytes, 5);
  auto d = device_->ReserveSegment(kBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  const Stream s = NewStream();
  std::atomic<int> counter{0};
  std::atomic<int> out_of_order{0};
  // A move-only capture, released once its function has run.
  auto witness = std::make_shared<int>(0);
  for (int i = 0; i < kFunctions; ++i) {
    auto token = std::make_unique<std::shared_ptr<int>>(witness);
    ASSERT_TRUE(device_
                    ->LaunchHostFunc(
                        s,
                        [&counter, &out_of_order, i, token = std::move(token)] {
                          if (counter.load() != i) out_of_order.fetch_add(1);
                          counter.fetch_add(1);
                        },
                        /*cost_ns=*/1000)
                    .ok());
    ASSERT_TRUE(device_->CopyAsync(*d, src, kBytes, CopyKind::kHostToDevice, s).ok());
  }
  ASSERT_TRUE(device_->SynchronizeStream(s).ok());
  EXPECT_EQ(counter.load(), kFunctions);
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_EQ(witness.use_count(), 1);  // every function freed after running

  EXPECT_EQ(device_->LaunchHostFunc(s, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_
                ->LaunchHostFunc(
                    s, [] {}, -1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->DestroyStream(s).ok());
  EXPECT_TRUE(device_->ReleaseSegment(*d).ok());
  EXPECT_TRUE(device_->FreeHost(src).ok());
}

TEST_F(CudaDeviceTest, LeavesTheCallersCurrentDeviceAlone) {
  if (CudaDevice::DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  auto seg = device_->ReserveSegment(kMiB);
  ASSERT_TRUE(seg.ok()) << seg.status();
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, *seg), cudaSuccess);
  EXPECT_EQ(attributes.device, 0);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  EXPECT_TRUE(device_->ReleaseSegment(*seg).ok());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(CudaDeviceTest, IsSafeToUseFromManyThreads) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, &failures] {
      for (int r = 0; r < kRounds; ++r) {
        auto seg = device_->ReserveSegment(kMiB);
        auto stream = device_->CreateStream();
        auto event = device_->CreateEvent();
        if (!seg.ok() || !stream.ok() || !event.ok()) {
          failures.fetch_add(1);
          continue;
        }
        if (!device_->RecordEvent(*event, *stream).ok() ||
            !device_->SynchronizeEvent(*event).ok() || !device_->DestroyEvent(*event).ok() ||
            !device_->DestroyStream(*stream).ok() || !device_->ReleaseSegment(*seg).ok()) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(device_->num_segments(), 0u);
}

// --- The caching allocator over a real GPU ---

TEST_F(CudaDeviceTest, CachingAllocatorReusesAndReturnsSegments) {
  auto allocator = CachingAllocator::Create(device_.get());
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  CachingAllocator& alloc = **allocator;
  constexpr std::size_t kBytes = 24 * kMiB;
  const Stream s = NewStream();
  void* pattern = PinnedPattern(kBytes, 99);
  void* back = Pinned(kBytes, 0);

  auto p = alloc.Allocate(kBytes, s);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_NE(*p, nullptr);
  ASSERT_TRUE(device_->CopyAsync(*p, pattern, kBytes, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(device_->CopyAsync(back, *p, kBytes, CopyKind::kDeviceToHost, s).ok());
  ASSERT_TRUE(device_->SynchronizeStream(s).ok());
  EXPECT_EQ(std::memcmp(pattern, back, kBytes), 0);
  ASSERT_TRUE(alloc.Free(*p).ok());
  EXPECT_GT(alloc.GetStats().reserved_bytes.all().current, 0);

  // Same size, same stream: the cached block, with no new segment.
  const std::size_t segments_before = device_->num_segments();
  auto again = alloc.Allocate(kBytes, s);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *p);
  EXPECT_EQ(device_->num_segments(), segments_before);

  // A small request comes from the small pool.
  auto small = alloc.Allocate(4096, s);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(alloc.Free(*small).ok());
  ASSERT_TRUE(alloc.Free(*again).ok());

  ASSERT_TRUE(alloc.EmptyCache().ok());
  EXPECT_EQ(alloc.GetStats().reserved_bytes.all().current, 0);
  EXPECT_EQ(device_->num_segments(), 0u);
  EXPECT_EQ(device_->ReservedBytes(), 0u);

  allocator->reset();
  EXPECT_TRUE(device_->DestroyStream(s).ok());
  EXPECT_TRUE(device_->FreeHost(pattern).ok());
  EXPECT_TRUE(device_->FreeHost(back).ok());
}

TEST_F(CudaDeviceTest, CachingAllocatorHandsBlocksAcrossStreams) {
  auto allocator = CachingAllocator::Create(device_.get());
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  CachingAllocator& alloc = **allocator;
  constexpr std::size_t kBytes = 32 * kMiB;
  const Stream s1 = NewStream();
  const Stream s2 = NewStream();
  void* pattern = PinnedPattern(kBytes, 1234);
  void* out = Pinned(kBytes, 0);

  auto p = alloc.Allocate(kBytes, s1);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(device_->CopyAsync(*p, pattern, kBytes, CopyKind::kHostToDevice, s1).ok());
  ASSERT_TRUE(alloc.Free(*p).ok());
  // s2 may get the block only once s1's copy into it is done (the allocator
  // records and waits on an event); either way s2's bytes are its own.
  auto q = alloc.Allocate(kBytes, s2);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(device_->CopyAsync(*q, pattern, kBytes, CopyKind::kHostToDevice, s2).ok());
  ASSERT_TRUE(device_->CopyAsync(out, *q, kBytes, CopyKind::kDeviceToHost, s2).ok());
  ASSERT_TRUE(device_->SynchronizeStream(s2).ok());
  EXPECT_EQ(std::memcmp(pattern, out, kBytes), 0);
  ASSERT_TRUE(alloc.Free(*q).ok());
  ASSERT_TRUE(alloc.EmptyCache().ok());
  EXPECT_EQ(device_->num_segments(), 0u);

  allocator->reset();
  EXPECT_TRUE(device_->DestroyStream(s1).ok());
  EXPECT_TRUE(device_->DestroyStream(s2).ok());
  EXPECT_TRUE(device_->FreeHost(pattern).ok());
  EXPECT_TRUE(device_->FreeHost(out).ok());
}

TEST_F(CudaDeviceTest, CachingAllocatorBudgetRefusesWhatDoesNotFit) {
  auto allocator = CachingAllocator::Create(device_.get(), {.budget = 64 * kMiB});
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  auto too_big = (*allocator)->Allocate(100 * kMiB);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_EQ(device_->num_segments(), 0u);

  auto fits = (*allocator)->Allocate(48 * kMiB);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ((*allocator)->Allocate(32 * kMiB).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE((*allocator)->Free(*fits).ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaDeviceTest, VirtualMemoryMapsPagesThatHoldBytes) {
  const std::size_t page = device_->PageSize();
  if (page == 0) GTEST_SKIP() << device_->Describe() << " has no virtual memory management";
  const std::size_t before = device_->ReservedBytes();
  auto range = device_->ReserveAddressRange(4 * page);
  ASSERT_TRUE(range.ok()) << range.status();
  char* base = static_cast<char*>(*range);
  std::vector<PhysicalChunk> chunks;
  for (int i = 0; i < 2; ++i) {
    auto chunk = device_->CreateChunk(page);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_TRUE(device_->Map(base + i * page, *chunk).ok());
    chunks.push_back(*chunk);
  }
  EXPECT_EQ(device_->ReservedBytes(), before + 2 * page);
  ASSERT_TRUE(device_->SetAccess(base, 2 * page).ok());
  // A copy across the page boundary comes back byte for byte.
  const std::size_t bytes = page;
  void* in = PinnedPattern(bytes, 7);
  void* out = Pinned(bytes, 0);
  ASSERT_TRUE(in != nullptr && out != nullptr);
  char* at = base + page / 2;
  ASSERT_TRUE(device_->CopyAsync(at, in, bytes, CopyKind::kHostToDevice, kDefaultStream).ok());
  ASSERT_TRUE(device_->CopyAsync(out, at, bytes, CopyKind::kDeviceToHost, kDefaultStream).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(std::memcmp(in, out, bytes), 0);
  ASSERT_TRUE(device_->Unmap(base, page).ok());
  ASSERT_TRUE(device_->Unmap(base + page, page).ok());
  for (PhysicalChunk c : chunks) ASSERT_TRUE(device_->ReleaseChunk(c).ok());
  EXPECT_EQ(device_->ReservedBytes(), before);
  ASSERT_TRUE(device_->ReleaseAddressRange(*range).ok());
  EXPECT_FALSE(device_->ReleaseAddressRange(*range).ok());
  EXPECT_FALSE(device_->ReleaseChunk(chunks[0]).ok());
  ASSERT_TRUE(device_->FreeHost(in).ok());
  ASSERT_TRUE(device_->FreeHost(out).ok());
}

TEST_F(CudaDeviceTest, ExpandableSegmentsKeepAnUnbackedBlocksAddress) {
  if (device_->PageSize() == 0) GTEST_SKIP() << device_->Describe() << " has no virtual memory";
  auto made = CachingAllocator::Create(device_.get(),
                                       {.budget = 64 * kMiB, .expandable_segments = true});
  ASSERT_TRUE(made.ok()) << made.status();
  CachingAllocator& alloc = **made;
  const std::size_t page = device_->PageSize();
  auto a = alloc.Allocate(5 * page / 4);  // the next block starts mid-page
  auto b = alloc.Allocate(6 * page);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::size_t bytes = 6 * page;
  void* in = PinnedPattern(bytes, 11);
  void* out = Pinned(bytes, 0);
  ASSERT_TRUE(in != nullptr && out != nullptr);
  ASSERT_TRUE(device_->CopyAsync(*b, in, bytes, CopyKind::kHostToDevice, kDefaultStream).ok());
  ASSERT_TRUE(device_->CopyAsync(out, *b, bytes, CopyKind::kDeviceToHost, kDefaultStream).ok());
  auto gone = alloc.Unback(*b);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_GE(*gone, 4 * page);
  ASSERT_TRUE(alloc.EmptyCache().ok());  // the pages go now, after a sync
  EXPECT_EQ(std::memcmp(in, out, bytes), 0);
  // Someone else may use the memory meanwhile.
  auto c = alloc.Allocate(*gone);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(alloc.Free(*c).ok());
  ASSERT_TRUE(alloc.Reback(*b).ok());
  std::memset(out, 0, bytes);
  ASSERT_TRUE(device_->CopyAsync(*b, in, bytes, CopyKind::kHostToDevice, kDefaultStream).ok());
  ASSERT_TRUE(device_->CopyAsync(out, *b, bytes, CopyKind::kDeviceToHost, kDefaultStream).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(std::memcmp(in, out, bytes), 0);
  ASSERT_TRUE(alloc.Free(*a).ok());
  ASSERT_TRUE(alloc.Free(*b).ok());
  ASSERT_TRUE(alloc.EmptyCache().ok());
  EXPECT_EQ(alloc.GetStats().reserved_bytes.all().current, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_TRUE(device_->FreeHost(in).ok());
  ASSERT_TRUE(device_->FreeHost(out).ok());
}

}  // namespace
}  // namespace remat
