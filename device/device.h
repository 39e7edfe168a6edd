// Device: the one interface to hardware.
//
// Everything above it (the caching allocator, the runtime's swap engine, the
// simulator) speaks only to this interface, so the same code runs on a real GPU
// (CudaDevice) and on a simulated one (SimDevice) that needs no GPU at all.
//
// Streams and events are opaque handles. On CUDA they carry cudaStream_t and
// cudaEvent_t values, so a stream that a framework hands us (PyTorch passes its
// cudaStream_t to the pluggable allocator) is a Stream without translation.
// The zero stream is each device's default (legacy) stream.
#ifndef REMAT_DEVICE_DEVICE_H_
#define REMAT_DEVICE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat {

struct Stream {
  std::uintptr_t handle = 0;

  friend bool operator==(Stream a, Stream b) { return a.handle == b.handle; }
  friend bool operator!=(Stream a, Stream b) { return a.handle != b.handle; }
  friend bool operator<(Stream a, Stream b) { return a.handle < b.handle; }
  template <typename H>
  friend H AbslHashValue(H h, Stream s) {
    return H::combine(std::move(h), s.handle);
  }
};

inline constexpr Stream kDefaultStream{0};

struct Event {
  std::uintptr_t handle = 0;
  friend bool operator==(Event a, Event b) { return a.handle == b.handle; }
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// Physical device memory made by CreateChunk, not yet at any address until
// mapped (a CUmemGenericAllocationHandle on CUDA).
struct PhysicalChunk {
  std::uintptr_t handle = 0;
  friend bool operator==(PhysicalChunk a, PhysicalChunk b) { return a.handle == b.handle; }
};

class Device {
 public:
  virtual ~Device() = default;

  // "sim (backed, 80.00 GiB)", "cuda:0 NVIDIA H200": for reports and errors.
  virtual std::string Describe() const = 0;
  // Total device memory in bytes.
  virtual std::size_t Capacity() const = 0;
  // Device memory not yet reserved by anyone (cudaMemGetInfo's free).
  virtual std::size_t FreeBytes() const = 0;
  // Nanoseconds on the device's clock: virtual time on SimDevice, a steady
  // wall clock on CudaDevice. Used to time-stamp events.
  virtual std::int64_t NowNs() const = 0;

  // Device memory segments (cudaMalloc / cudaFree). ReleaseSegment takes only
  // pointers ReserveSegment returned, and synchronizes as cudaFree does.
  virtual absl::StatusOr<void*> ReserveSegment(std::size_t bytes) = 0;
  virtual absl::Status ReleaseSegment(void* ptr) = 0;

  // Page-locked host memory (cudaMallocHost / cudaFreeHost).
  virtual absl::StatusOr<void*> AllocateHost(std::size_t bytes) = 0;
  virtual absl::Status FreeHost(void* ptr) = 0;

  virtual absl::StatusOr<Stream> CreateStream() = 0;
  virtual absl::Status DestroyStream(Stream stream) = 0;

  virtual absl::StatusOr<Event> CreateEvent() = 0;
  virtual absl::Status DestroyEvent(Event event) = 0;
  // The event completes once all work enqueued on `stream` so far has.
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  // True when the event has completed (or was never recorded).
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  // Work enqueued on `stream` after this call starts only once `event` completes.
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;
  // Blocks the host until the event / all work on the stream / all work completes.
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  virtual absl::Status SynchronizeStream(Stream stream) = 0;
  virtual absl::Status Synchronize() = 0;

  // Enqueues a copy of `bytes` on `stream`. Host pointers should come from
  // AllocateHost for the copy to be truly asynchronous.
  virtual absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                                 Stream stream) = 0;
  // Enqueues host work ordered on `stream`: it runs after the work before it and
  // before the work after it. `cost_ns` is how long the simulator charges the
  // stream for it (a stand-in for a kernel); CudaDevice ignores it. The
  // function must not call back into the device (as with cudaLaunchHostFunc).
  virtual absl::Status LaunchHostFunc(Stream stream, absl::AnyInvocable<void() &&> fn,
                                      std::int64_t cost_ns = 0) = 0;

  // --- Virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap, ...) ---
  // Address space is reserved without memory; physical chunks are made
  // separately and mapped into it, so a range can grow and shrink page by
  // page and keep its addresses while its memory comes and goes.
  //
  // The page size: every size and address below is a multiple of it. 0 when
  // the device has no virtual memory; every call below then fails with
  // Unimplemented.
  virtual std::size_t PageSize() const { return 0; }
  // `bytes` of address space, page-aligned, with nothing mapped; costs no memory.
  virtual absl::StatusOr<void*> ReserveAddressRange(std::size_t bytes);
  // Gives back a whole range ReserveAddressRange returned; nothing may be mapped in it.
  virtual absl::Status ReleaseAddressRange(void* ptr);
  // `bytes` of physical memory, counted against the capacity as a segment is.
  virtual absl::StatusOr<PhysicalChunk> CreateChunk(std::size_t bytes);
  // Frees an unmapped chunk.
  virtual absl::Status ReleaseChunk(PhysicalChunk chunk);
  // Maps the whole chunk at `ptr`, which lies in a reserved range where
  // nothing is mapped yet. The device may not touch it before SetAccess.
  virtual absl::Status Map(void* ptr, PhysicalChunk chunk);
  // Lets the device read and write [ptr, ptr + bytes), which must be mapped.
  virtual absl::Status SetAccess(void* ptr, std::size_t bytes);
  // Unmaps whole mappings covering exactly [ptr, ptr + bytes). Work that
  // still uses the range must have completed (the caller synchronizes). The
  // chunks stay until ReleaseChunk; their bytes are not kept.
  virtual absl::Status Unmap(void* ptr, std::size_t bytes);
};

}  // namespace remat

#endif  // REMAT_DEVICE_DEVICE_H_
