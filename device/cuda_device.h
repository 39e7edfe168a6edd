// CudaDevice: the Device interface over the CUDA runtime (cudart).
//
// Why cudart only. This file is plain C++ compiled by the host compiler; it
// includes <cuda_runtime_api.h> and links libcudart, never libcuda (the
// driver). cudart loads the driver itself, at run time, on first use, so a
// binary linked with this library starts on a machine with no GPU and no
// driver: Create() then fails with a status that says why (the error name and
// string cudart reports), and everything else keeps working on SimDevice.
// Should we ever need driver entry points (virtual memory, cuMemMap), they are
// to be resolved at run time through cudaGetDriverEntryPoint, not linked.
//
// How the interface maps.
//   ReserveSegment / ReleaseSegment   cudaMalloc / cudaFree (which synchronizes)
//   AllocateHost / FreeHost           cudaHostAlloc(portable) / cudaFreeHost
//   Stream.handle                     the cudaStream_t value itself, so a stream a
//                                     framework hands us (PyTorch passes its
//                                     cudaStream_t) needs no translation; handle 0
//                                     is the legacy default stream. CreateStream
//                                     makes non-blocking streams, which do not
//                                     synchronize with the legacy stream.
//   Event.handle                      the cudaEvent_t value, created with
//                                     cudaEventDisableTiming (cheaper to record and
//                                     query; we never time with events).
//   QueryEvent                        cudaEventQuery; cudaErrorNotReady is "false".
//   CopyAsync                         cudaMemcpyAsync with the matching kind.
//   LaunchHostFunc                    cudaLaunchHostFunc; the AnyInvocable lives on
//                                     the heap until it has run. cost_ns is ignored.
//   Capacity / FreeBytes              cudaMemGetInfo (total cached at Create).
//   NowNs                             std::chrono::steady_clock.
//
// Current device. Every call makes this device current for its duration (it
// matters for stream 0, which is the current device's, for allocations, and
// so that cudart never creates a context on a GPU we do not use) and restores
// the caller's current device afterwards: a CudaDevice never moves the
// current device under a framework's feet, and several CudaDevices (one per
// GPU) can be used from one thread.
//
// Errors. Every CUDA error becomes an absl::Status naming the error
// (cudaErrorMemoryAllocation: out of memory), the device and what was being
// done. cudaErrorMemoryAllocation maps to ResourceExhausted; invalid values,
// handles and pointers to InvalidArgument; a missing or unusable driver or GPU
// to FailedPrecondition; anything else to Internal. Non-sticky errors are
// cleared from cudart's last-error slot so they are not blamed on a later
// kernel launch of the caller.
//
// State. cudart is thread-safe; the only state of our own is the set of
// segments and pinned host blocks this device handed out, kept so that a
// foreign or interior pointer is rejected with InvalidArgument instead of
// being freed (it might belong to another allocator in the process).
// Segments and host blocks still outstanding when the device is destroyed are
// left alone: their owner frees them (the caching allocator frees its own).
#ifndef REMAT_DEVICE_CUDA_DEVICE_H_
#define REMAT_DEVICE_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "device/device.h"

namespace remat {

class CudaDevice final : public Device {
 public:
  // Fails with FailedPrecondition when cudart finds no usable driver or GPU
  // (the message carries cudart's error name and string), and with
  // InvalidArgument when `device_ordinal` is not a device of this machine.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int device_ordinal = 0);
  // True when cudart sees at least one usable CUDA device. Never fails.
  static bool Available();
  // Number of usable CUDA devices (0 without a driver or GPU). Never fails.
  static int DeviceCount();

  ~CudaDevice() override = default;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string Describe() const override { return description_; }
  std::size_t Capacity() const override { return capacity_; }
  // 0 when cudaMemGetInfo fails.
  std::size_t FreeBytes() const override;
  std::int64_t NowNs() const override;

  absl::StatusOr<void*> ReserveSegment(std::size_t bytes) override;
  absl::Status ReleaseSegment(void* ptr) override;
  absl::StatusOr<void*> AllocateHost(std::size_t bytes) override;
  absl::Status FreeHost(void* ptr) override;

  absl::StatusOr<Stream> CreateStream() override;
  absl::Status DestroyStream(Stream stream) override;
  absl::StatusOr<Event> CreateEvent() override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::Status Synchronize() override;

  absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                         Stream stream) override;
  absl::Status LaunchHostFunc(Stream stream, absl::AnyInvocable<void() &&> fn,
                              std::int64_t cost_ns = 0) override;

  // Virtual memory through the driver (cuMemAddressReserve, cuMemCreate,
  // cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease), reached through
  // cudart's driver entry points so that nothing links libcuda. PageSize() is
  // the driver's minimum granularity, or 0 when the device or driver has no
  // virtual memory management.
  std::size_t PageSize() const override { return page_size_; }
  absl::StatusOr<void*> ReserveAddressRange(std::size_t bytes) override;
  absl::Status ReleaseAddressRange(void* ptr) override;
  absl::StatusOr<PhysicalChunk> CreateChunk(std::size_t bytes) override;
  absl::Status ReleaseChunk(PhysicalChunk chunk) override;
  absl::Status Map(void* ptr, PhysicalChunk chunk) override;
  absl::Status SetAccess(void* ptr, std::size_t bytes) override;
  absl::Status Unmap(void* ptr, std::size_t bytes) override;

  int ordinal() const { return ordinal_; }
  // Bytes in segments this device reserved and has not released.
  std::size_t ReservedBytes() const;
  std::size_t num_segments() const;
  // Bytes of pinned host memory this device allocated and has not freed.
  std::size_t HostBytes() const;

 private:
  CudaDevice(int ordinal, std::string description, std::size_t capacity, std::size_t page_size);

  const int ordinal_;
  const std::string description_;  // "cuda:0 NVIDIA H200"
  const std::size_t capacity_;
  const std::size_t page_size_;

  mutable Mutex mu_;
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> host_blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> vm_ranges_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> chunks_ ABSL_GUARDED_BY(mu_);  // handle -> bytes
  // Segments and physical chunks alike.
  std::size_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t host_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace remat

#endif  // REMAT_DEVICE_CUDA_DEVICE_H_
