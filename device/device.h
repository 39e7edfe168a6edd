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
};

}  // namespace remat

#endif  // REMAT_DEVICE_DEVICE_H_
