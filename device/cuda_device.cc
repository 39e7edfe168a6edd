#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"

namespace remat {
namespace {

absl::StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    // No usable driver or GPU: the machine, not the call, is at fault.
    case cudaErrorInitializationError:
    case cudaErrorCudartUnloading:
    case cudaErrorStubLibrary:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorContextIsDestroyed:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "<where>: <what> failed: cudaErrorMemoryAllocation: out of memory".
absl::Status CudaError(cudaError_t err, std::string_view where, std::string_view what,
                       absl::StatusCode code) {
  // Clears a non-sticky error from cudart's last-error slot, so the caller's
  // next cudaGetLastError (after a kernel launch, say) does not report ours.
  (void)cudaGetLastError();
  return absl::Status(code, absl::StrFormat("%s: %s failed: %s: %s", where, what,
                                            cudaGetErrorName(err), cudaGetErrorString(err)));
}

absl::Status CudaError(cudaError_t err, std::string_view where, std::string_view what) {
  return CudaError(err, where, what, CodeFor(err));
}

cudaStream_t ToCuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream.handle); }
cudaEvent_t ToCuda(Event event) { return reinterpret_cast<cudaEvent_t>(event.handle); }

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

const char* CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
  }
  return "?";
}

// Makes `ordinal` the calling thread's current device while it lives, and
// restores the previous one after, so that we never move a framework's
// current device.
class DeviceGuard {
 public:
  DeviceGuard(int ordinal, std::string_view where) {
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess) {
      status_ = CudaError(err, where, "cudaGetDevice");
      return;
    }
    if (current == ordinal) return;
    err = cudaSetDevice(ordinal);
    if (err != cudaSuccess) {
      status_ = CudaError(err, where, absl::StrFormat("cudaSetDevice(%d)", ordinal));
      return;
    }
    previous_ = current;
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

#define REMAT_CUDA_ON_DEVICE_(where)                \
  DeviceGuard remat_device_guard_(ordinal_, where); \
  REMAT_RETURN_IF_ERROR(remat_device_guard_.status())

using HostFn = absl::AnyInvocable<void() &&>;

// cudart's callback thread runs this; it owns (and deletes) the function.
void CUDART_CB RunHostFunc(void* data) {
  const std::unique_ptr<HostFn> fn(static_cast<HostFn*>(data));
  HostFn& run = *fn;
  std::move(run)();
}

}  // namespace

int CudaDevice::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

bool CudaDevice::Available() { return DeviceCount() > 0; }

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int device_ordinal) {
  const std::string where = absl::StrFormat("CudaDevice::Create(%d)", device_ordinal);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Whatever the reason (no driver, no GPU, a driver too old for this
    // cudart), there is no device to use.
    return CudaError(err, where + ": no usable CUDA driver or GPU", "cudaGetDeviceCount",
                     absl::StatusCode::kFailedPrecondition);
  }
  if (count == 0) {
    return absl::FailedPreconditionError(where + ": no CUDA device on this machine");
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no such device; this machine has %d CUDA device(s)", where, count));
  }
  DeviceGuard guard(device_ordinal, where);
  if (!guard.status().ok()) {
    return absl::FailedPreconditionError(guard.status().message());
  }
  cudaDeviceProp props{};
  err = cudaGetDeviceProperties(&props, device_ordinal);
  if (err != cudaSuccess) {
    return CudaError(err, where, "cudaGetDeviceProperties", absl::StatusCode::kFailedPrecondition);
  }
  // Also creates the device's primary context: a device we cannot use
  // (exclusive-process mode taken, out of memory for a context) fails here,
  // not at the first allocation.
  std::size_t free_bytes = 0, total_bytes = 0;
  err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    return CudaError(err, where, "cudaMemGetInfo", absl::StatusCode::kFailedPrecondition);
  }
  std::string description = absl::StrFormat("cuda:%d %s", device_ordinal, props.name);
  return std::unique_ptr<CudaDevice>(
      new CudaDevice(device_ordinal, std::move(description), total_bytes));
}

CudaDevice::CudaDevice(int ordinal, std::string description, std::size_t capacity)
    : ordinal_(ordinal), description_(std::move(description)), capacity_(capacity) {}

std::size_t CudaDevice::FreeBytes() const {
  DeviceGuard guard(ordinal_, description_);
  if (!guard.status().ok()) return 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return free_bytes;
}

std::int64_t CudaDevice::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::size_t CudaDevice::ReservedBytes() const {
  MutexLock lock(&mu_);
  return reserved_bytes_;
}

std::size_t CudaDevice::num_segments() const {
  MutexLock lock(&mu_);
  return segments_.size();
}

std::size_t CudaDevice::HostBytes() const {
  MutexLock lock(&mu_);
  return host_bytes_;
}

absl::StatusOr<void*> CudaDevice::ReserveSegment(std::size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("ReserveSegment of 0 bytes");
  REMAT_CUDA_ON_DEVICE_(description_);
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    absl::Status status =
        CudaError(err, description_, absl::StrFormat("cudaMalloc(%s)", FormatBytes(bytes)));
    if (err == cudaErrorMemoryAllocation) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        return absl::ResourceExhaustedError(absl::StrFormat("%s; %s free of %s", status.message(),
                                                            FormatBytes(free_bytes),
                                                            FormatBytes(total_bytes)));
      }
      (void)cudaGetLastError();
    }
    return status;
  }
  MutexLock lock(&mu_);
  segments_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  reserved_bytes_ += bytes;
  return ptr;
}

absl::Status CudaDevice::ReleaseSegment(void* ptr) {
  std::size_t bytes = 0;
  {
    // Taken out before cudaFree, so that two racing releases free it once.
    MutexLock lock(&mu_);
    auto it = segments_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == segments_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ReleaseSegment(%p): not a segment of %s", ptr, description_));
    }
    bytes = it->second;
    segments_.erase(it);
    reserved_bytes_ -= bytes;
  }
  absl::Status status;
  {
    DeviceGuard guard(ordinal_, description_);
    status = guard.status();
    if (status.ok()) {
      const cudaError_t err = cudaFree(ptr);
      if (err != cudaSuccess)
        status = CudaError(err, description_, absl::StrFormat("cudaFree(%p)", ptr));
    }
  }
  if (!status.ok()) {
    // Still ours: a failed release changes nothing.
    MutexLock lock(&mu_);
    segments_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
    reserved_bytes_ += bytes;
  }
  return status;
}

absl::StatusOr<void*> CudaDevice::AllocateHost(std::size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateHost of 0 bytes");
  REMAT_CUDA_ON_DEVICE_(description_);
  void* ptr = nullptr;
  // Portable: pinned for every device's context, not only ours.
  const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return CudaError(
        err, description_,
        absl::StrFormat("cudaHostAlloc(%s of pinned host memory)", FormatBytes(bytes)));
  }
  MutexLock lock(&mu_);
  host_blocks_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  host_bytes_ += bytes;
  return ptr;
}

absl::Status CudaDevice::FreeHost(void* ptr) {
  std::size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = host_blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_blocks_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("FreeHost(%p): not pinned host memory of %s", ptr, description_));
    }
    bytes = it->second;
    host_blocks_.erase(it);
    host_bytes_ -= bytes;
  }
  absl::Status status;
  {
    DeviceGuard guard(ordinal_, description_);
    status = guard.status();
    if (status.ok()) {
      const cudaError_t err = cudaFreeHost(ptr);
      if (err != cudaSuccess)
        status = CudaError(err, description_, absl::StrFormat("cudaFreeHost(%p)", ptr));
    }
  }
  if (!status.ok()) {
    MutexLock lock(&mu_);
    host_blocks_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
    host_bytes_ += bytes;
  }
  return status;
}

absl::StatusOr<Stream> CudaDevice::CreateStream() {
  REMAT_CUDA_ON_DEVICE_(description_);
  cudaStream_t stream = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, description_, "cudaStreamCreateWithFlags");
  return Stream{reinterpret_cast<std::uintptr_t>(stream)};
}

absl::Status CudaDevice::DestroyStream(Stream stream) {
  if (stream == kDefaultStream)
    return absl::InvalidArgumentError("cannot destroy the default stream");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaStreamDestroy(ToCuda(stream));
  if (err != cudaSuccess) {
    return CudaError(err, description_, absl::StrFormat("cudaStreamDestroy(%#x)", stream.handle));
  }
  return absl::OkStatus();
}

absl::StatusOr<Event> CudaDevice::CreateEvent() {
  REMAT_CUDA_ON_DEVICE_(description_);
  cudaEvent_t event = nullptr;
  // We order with events and never time with them; untimed ones are cheaper.
  const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) return CudaError(err, description_, "cudaEventCreateWithFlags");
  return Event{reinterpret_cast<std::uintptr_t>(event)};
}

// Even calls that need no current device (an event knows its own) enter
// ours: on a thread that has not used CUDA yet, cudart would otherwise create
// a context on device 0, which costs hundreds of MiB on a GPU we do not use.

absl::Status CudaDevice::DestroyEvent(Event event) {
  if (event.handle == 0) return absl::InvalidArgumentError("DestroyEvent of a null event");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaEventDestroy(ToCuda(event));
  if (err != cudaSuccess) {
    return CudaError(err, description_, absl::StrFormat("cudaEventDestroy(%#x)", event.handle));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::RecordEvent(Event event, Stream stream) {
  if (event.handle == 0) return absl::InvalidArgumentError("RecordEvent of a null event");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaEventRecord(ToCuda(event), ToCuda(stream));
  if (err != cudaSuccess) {
    return CudaError(
        err, description_,
        absl::StrFormat("cudaEventRecord(event %#x, stream %#x)", event.handle, stream.handle));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaDevice::QueryEvent(Event event) {
  if (event.handle == 0) return absl::InvalidArgumentError("QueryEvent of a null event");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaEventQuery(ToCuda(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  return CudaError(err, description_, absl::StrFormat("cudaEventQuery(%#x)", event.handle));
}

absl::Status CudaDevice::StreamWaitEvent(Stream stream, Event event) {
  if (event.handle == 0) return absl::InvalidArgumentError("StreamWaitEvent on a null event");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaStreamWaitEvent(ToCuda(stream), ToCuda(event), 0);
  if (err != cudaSuccess) {
    return CudaError(
        err, description_,
        absl::StrFormat("cudaStreamWaitEvent(stream %#x, event %#x)", stream.handle, event.handle));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::SynchronizeEvent(Event event) {
  if (event.handle == 0) return absl::InvalidArgumentError("SynchronizeEvent of a null event");
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaEventSynchronize(ToCuda(event));
  if (err != cudaSuccess) {
    return CudaError(err, description_, absl::StrFormat("cudaEventSynchronize(%#x)", event.handle));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::SynchronizeStream(Stream stream) {
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaStreamSynchronize(ToCuda(stream));
  if (err != cudaSuccess) {
    return CudaError(err, description_,
                     absl::StrFormat("cudaStreamSynchronize(%#x)", stream.handle));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::Synchronize() {
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return CudaError(err, description_, "cudaDeviceSynchronize");
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                                   Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s copy with a null pointer", CopyKindName(kind)));
  }
  REMAT_CUDA_ON_DEVICE_(description_);
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), ToCuda(stream));
  if (err != cudaSuccess) {
    return CudaError(err, description_,
                     absl::StrFormat("cudaMemcpyAsync(%p <- %p, %s, %s, stream %#x)", dst, src,
                                     FormatBytes(bytes), CopyKindName(kind), stream.handle));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LaunchHostFunc(Stream stream, absl::AnyInvocable<void() &&> fn,
                                        std::int64_t cost_ns) {
  // cost_ns only matters to the simulator; a negative one is refused on both
  // devices so that code tested on SimDevice behaves the same here.
  if (cost_ns < 0) return absl::InvalidArgumentError("LaunchHostFunc: negative cost");
  if (!fn) return absl::InvalidArgumentError("LaunchHostFunc of an empty function");
  REMAT_CUDA_ON_DEVICE_(description_);
  // Freed by RunHostFunc once it has run. (After a sticky context error cudart
  // never calls it and it leaks; the process cannot use the GPU by then.)
  auto* heap_fn = new HostFn(std::move(fn));
  const cudaError_t err = cudaLaunchHostFunc(ToCuda(stream), &RunHostFunc, heap_fn);
  if (err != cudaSuccess) {
    delete heap_fn;
    return CudaError(err, description_,
                     absl::StrFormat("cudaLaunchHostFunc(stream %#x)", stream.handle));
  }
  return absl::OkStatus();
}

}  // namespace remat
