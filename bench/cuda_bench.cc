// cuda_bench: remat on a real GPU, each figure beside a reference measured in
// the same run (every benchmark skips, saying why, without a CUDA device).
//
//   churn/SIZE/remat            CachingAllocator over CudaDevice: Allocate + Free
//   churn/SIZE/cudaMalloc       the driver's own: cudaMalloc + cudaFree
//   churn/SIZE/cudaMallocAsync  CUDA's stream-ordered pool: cudaMallocAsync + cudaFreeAsync
//   copy/d2h/SIZE, copy/h2d/SIZE  pinned copies through CudaDevice (the offload link)
//   runtime/acquire_release     Runtime::Acquire + Release of a resident tensor
//   runtime/offload_swap/SIZE   two tensors under a budget that holds one: each
//                               acquire offloads the other and restores its own
//
// Timings include a stream synchronize where the work is asynchronous (copies
// and swaps), so they are what the host waits for, not what it enqueues.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "base/units.h"
#include "device/cuda_device.h"
#include "runtime/runtime.h"

namespace remat {
namespace {

// Skips with `why` (this Google Benchmark takes a C string and may keep it).
void Skip(benchmark::State& state, std::string why) {
  static thread_local std::string last;
  last = std::move(why);
  state.SkipWithError(last.c_str());
}

std::unique_ptr<CudaDevice> OpenDevice(benchmark::State& state) {
  auto device = CudaDevice::Create();
  if (!device.ok()) {
    Skip(state, absl::StrCat("no usable CUDA device: ", device.status().ToString()));
    return nullptr;
  }
  return std::move(device).value();
}

void ChurnRemat(benchmark::State& state, std::size_t size) {
  auto device = OpenDevice(state);
  if (!device) return;
  auto alloc = CachingAllocator::Create(device.get());
  auto stream = device->CreateStream();
  if (!alloc.ok() || !stream.ok()) {
    state.SkipWithError("allocator or stream creation failed");
    return;
  }
  for (auto _ : state) {
    auto p = (*alloc)->Allocate(size, *stream);
    if (!p.ok()) {
      Skip(state, p.status().ToString());
      break;
    }
    benchmark::DoNotOptimize(*p);
    (void)(*alloc)->Free(*p);
  }
  alloc->reset();
  (void)device->DestroyStream(*stream);
}

void ChurnCudaMalloc(benchmark::State& state, std::size_t size) {
  if (!CudaDevice::Available()) {
    state.SkipWithError("no usable CUDA device");
    return;
  }
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      break;
    }
    benchmark::DoNotOptimize(p);
    cudaFree(p);
  }
}

void ChurnCudaMallocAsync(benchmark::State& state, std::size_t size) {
  if (!CudaDevice::Available()) {
    state.SkipWithError("no usable CUDA device");
    return;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMallocAsync(&p, size, stream) != cudaSuccess) {
      state.SkipWithError("cudaMallocAsync failed");
      break;
    }
    benchmark::DoNotOptimize(p);
    cudaFreeAsync(p, stream);
  }
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void Copy(benchmark::State& state, CopyKind kind, std::size_t size) {
  auto device = OpenDevice(state);
  if (!device) return;
  auto host = device->AllocateHost(size);
  auto dev = device->ReserveSegment(size);
  auto stream = device->CreateStream();
  if (!host.ok() || !dev.ok() || !stream.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  std::memset(*host, 0x5a, size);
  void* dst = kind == CopyKind::kDeviceToHost ? *host : *dev;
  const void* src = kind == CopyKind::kDeviceToHost ? *dev : *host;
  (void)device->CopyAsync(dst, src, size, kind, *stream);  // warm-up
  (void)device->SynchronizeStream(*stream);
  for (auto _ : state) {
    (void)device->CopyAsync(dst, src, size, kind, *stream);
    (void)device->SynchronizeStream(*stream);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
  (void)device->DestroyStream(*stream);
  (void)device->ReleaseSegment(*dev);
  (void)device->FreeHost(*host);
}

// Both directions at once: a copy out on one stream and a copy in on another,
// as the runtime's offloads and prefetches run. Bytes processed count both,
// so a link that carries the two side by side shows about twice one way's
// rate (the simulator's model: one copy engine per direction).
void CopyBothWays(benchmark::State& state, std::size_t size) {
  auto device = OpenDevice(state);
  if (!device) return;
  auto host_out = device->AllocateHost(size);
  auto host_in = device->AllocateHost(size);
  auto dev_out = device->ReserveSegment(size);
  auto dev_in = device->ReserveSegment(size);
  auto out_stream = device->CreateStream();
  auto in_stream = device->CreateStream();
  if (!host_out.ok() || !host_in.ok() || !dev_out.ok() || !dev_in.ok() || !out_stream.ok() ||
      !in_stream.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  std::memset(*host_in, 0x5a, size);
  auto both = [&] {
    (void)device->CopyAsync(*host_out, *dev_out, size, CopyKind::kDeviceToHost, *out_stream);
    (void)device->CopyAsync(*dev_in, *host_in, size, CopyKind::kHostToDevice, *in_stream);
    (void)device->SynchronizeStream(*out_stream);
    (void)device->SynchronizeStream(*in_stream);
  };
  both();  // warm-up
  for (auto _ : state) both();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * size));
  (void)device->DestroyStream(*out_stream);
  (void)device->DestroyStream(*in_stream);
  (void)device->ReleaseSegment(*dev_out);
  (void)device->ReleaseSegment(*dev_in);
  (void)device->FreeHost(*host_out);
  (void)device->FreeHost(*host_in);
}

void AcquireRelease(benchmark::State& state) {
  auto device = OpenDevice(state);
  if (!device) return;
  auto alloc = CachingAllocator::Create(device.get());
  if (!alloc.ok()) return Skip(state, alloc.status().ToString());
  auto runtime = Runtime::Create(alloc->get(), {.policy = "lru"});
  if (!runtime.ok()) return Skip(state, runtime.status().ToString());
  auto guard = (*runtime)->Create(kMiB, {.allow_offload = true});
  if (!guard.ok()) {
    Skip(state, guard.status().ToString());
    return;
  }
  const TensorId id = guard->id();
  guard->Release();
  for (auto _ : state) {
    auto g = (*runtime)->Acquire(id);
    if (!g.ok()) return Skip(state, g.status().ToString());
    benchmark::DoNotOptimize(g->ptr());
  }
  (void)(*runtime)->Free(id);
}

void OffloadSwap(benchmark::State& state, std::size_t size) {
  auto device = OpenDevice(state);
  if (!device) return;
  // Room for one tensor and a little, not for two.
  auto alloc = CachingAllocator::Create(device.get(), {.budget = size + size / 2});
  if (!alloc.ok()) return Skip(state, alloc.status().ToString());
  auto runtime = Runtime::Create(alloc->get(), {.policy = "lru", .enable_drop = false});
  if (!runtime.ok()) return Skip(state, runtime.status().ToString());
  auto stream = device->CreateStream();
  if (!stream.ok()) return Skip(state, stream.status().ToString());
  TensorId ids[2];
  for (TensorId& id : ids) {
    auto g = (*runtime)->Create(size, {.allow_offload = true}, *stream);
    if (!g.ok()) {
      Skip(state, g.status().ToString());
      return;
    }
    id = g->id();
  }
  // Two swaps before timing: the first offloads pin their host buffers
  // (cudaHostAlloc of hundreds of MiB takes longer than the copies), which the
  // pool then reuses.
  for (int turn = 0; turn < 2; ++turn) {
    auto g = (*runtime)->Acquire(ids[turn], *stream);
    if (!g.ok()) {
      Skip(state, g.status().ToString());
      return;
    }
  }
  (void)device->SynchronizeStream(*stream);
  int turn = 0;
  for (auto _ : state) {
    auto g = (*runtime)->Acquire(ids[turn], *stream);
    if (!g.ok()) {
      Skip(state, g.status().ToString());
      break;
    }
    g->Release();
    (void)device->SynchronizeStream(*stream);
    turn ^= 1;
  }
  // Each acquire moves the tensor in and the other out.
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size * 2));
  const RuntimeStats stats = (*runtime)->stats();
  state.counters["offloads"] = static_cast<double>(stats.offloads);
  for (TensorId id : ids) (void)(*runtime)->Free(id);
  (void)device->Synchronize();
  runtime->reset();
  (void)device->DestroyStream(*stream);
}

// "512B", "64KiB", "2MiB": benchmark names without spaces.
std::string SizeName(std::size_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, "MiB");
  if (bytes >= kKiB && bytes % kKiB == 0) return absl::StrCat(bytes / kKiB, "KiB");
  return absl::StrCat(bytes, "B");
}

void RegisterAll() {
  for (std::size_t size : {std::size_t{512}, 64 * kKiB, 2 * kMiB, 64 * kMiB}) {
    const std::string s = SizeName(size);
    benchmark::RegisterBenchmark(absl::StrCat("churn/", s, "/remat").c_str(), ChurnRemat, size);
    benchmark::RegisterBenchmark(absl::StrCat("churn/", s, "/cudaMalloc").c_str(), ChurnCudaMalloc, size);
    benchmark::RegisterBenchmark(absl::StrCat("churn/", s, "/cudaMallocAsync").c_str(),
                                 ChurnCudaMallocAsync, size);
  }
  for (std::size_t size : {2 * kMiB, 64 * kMiB, 512 * kMiB}) {
    const std::string s = SizeName(size);
    benchmark::RegisterBenchmark(absl::StrCat("copy/d2h/", s).c_str(), Copy, CopyKind::kDeviceToHost,
                                 size)->UseRealTime();
    benchmark::RegisterBenchmark(absl::StrCat("copy/h2d/", s).c_str(), Copy, CopyKind::kHostToDevice,
                                 size)->UseRealTime();
    benchmark::RegisterBenchmark(absl::StrCat("copy/both_ways/", s).c_str(), CopyBothWays, size)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("runtime/acquire_release", AcquireRelease);
  for (std::size_t size : {2 * kMiB, 64 * kMiB, 512 * kMiB}) {
    benchmark::RegisterBenchmark(absl::StrCat("runtime/offload_swap/", SizeName(size)).c_str(),
                                 OffloadSwap, size)->UseRealTime();
  }
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  remat::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
