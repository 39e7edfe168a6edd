#include "device/cuda_device.h"

#include <cuda.h>  // driver types only: the entry points come through cudart
#include <cudaTypedefs.h>
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

// The driver's virtual-memory calls, found once through cudart.
struct DriverVmm {
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  bool ok = false;
};

template <typename Fn>
bool FindDriverFn(const char* symbol, unsigned int version, Fn* fn) {
#if CUDART_VERSION < 12050
  // cudaGetDriverEntryPointByVersion came with CUDA 12.5: no virtual memory before.
  (void)symbol;
  (void)version;
  (void)fn;
  return false;
#else
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
#endif
}

const DriverVmm& Vmm() {
  static const DriverVmm vmm = [] {
    DriverVmm v;
    v.ok = FindDriverFn("cuMemAddressReserve", 10020, &v.address_reserve) &&
           FindDriverFn("cuMemAddressFree", 10020, &v.address_free) &&
           FindDriverFn("cuMemCreate", 10020, &v.create) &&
           FindDriverFn("cuMemRelease", 10020, &v.release) &&
           FindDriverFn("cuMemMap", 10020, &v.map) &&
           FindDriverFn("cuMemUnmap", 10020, &v.unmap) &&
           FindDriverFn("cuMemSetAccess", 10020, &v.set_access) &&
           FindDriverFn("cuMemGetAllocationGranularity", 10020, &v.granularity) &&
           FindDriverFn("cuDeviceGet", 2000, &v.device_get) &&
           FindDriverFn("cuDeviceGetAttribute", 2000, &v.device_attribute);
    FindDriverFn("cuGetErrorName", 6000, &v.error_name);
    return v;
  }();
  return vmm;
}

CUmemAllocationProp ChunkProp(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}

absl::Status DriverError(CUresult r, std::string_view where, std::string_view what) {
  const char* name = nullptr;
  if (Vmm().error_name == nullptr || Vmm().error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  const absl::StatusCode code = r == CUDA_ERROR_OUT_OF_MEMORY ? absl::StatusCode::kResourceExhausted
                                : r == CUDA_ERROR_INVALID_VALUE ? absl::StatusCode::kInvalidArgument
                                                                : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s: %s failed: %s (%d)", where, what,
                                            name != nullptr ? name : "CUresult", static_cast<int>(r)));
}

// The driver's minimum granularity for device memory, or 0 without virtual
// memory management (no entry points, or a device that does not support it).
std::size_t QueryPageSize(int ordinal) {
  if (!Vmm().ok) return 0;
  CUdevice device = 0;
  int supported = 0;
  if (Vmm().device_get(&device, ordinal) != CUDA_SUCCESS ||
      Vmm().device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             device) != CUDA_SUCCESS ||
      supported == 0) {
    return 0;
  }
  const CUmemAllocationProp prop = ChunkProp(ordinal);
  std::size_t granularity = 0;
  if (Vmm().granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
    return 0;
  }
  return granularity;
}

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
  return std::unique_ptr<CudaDevice>(new CudaDevice(device_ordinal, std::move(description),
                                                    total_bytes, QueryPageSize(device_ordinal)));
}

CudaDevice::CudaDevice(int ordinal, std::string description, std::size_t capacity,
                       std::size_t page_size)
    : ordinal_(ordinal),
      description_(std::move(description)),
      capacity_(capacity),
      page_size_(page_size) {}

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

// ---------------------------------------------------------------------------
// Virtual memory

#define REMAT_CUDA_VMM_(op)                                                          \
  if (page_size_ == 0) {                                                             \
    return absl::UnimplementedError(                                                 \
        absl::StrFormat("%s has no virtual memory management (%s)", description_, op)); \
  }                                                                                  \
  REMAT_CUDA_ON_DEVICE_(description_)

absl::StatusOr<void*> CudaDevice::ReserveAddressRange(std::size_t bytes) {
  REMAT_CUDA_VMM_("ReserveAddressRange");
  if (bytes == 0 || bytes % page_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReserveAddressRange of %d bytes: not a positive multiple of the %s page", bytes,
        FormatBytes(page_size_)));
  }
  CUdeviceptr ptr = 0;
  const CUresult r = Vmm().address_reserve(&ptr, bytes, page_size_, 0, 0);
  if (r != CUDA_SUCCESS) {
    return DriverError(r, description_, absl::StrFormat("cuMemAddressReserve(%s)", FormatBytes(bytes)));
  }
  MutexLock lock(&mu_);
  vm_ranges_.emplace(static_cast<std::uintptr_t>(ptr), bytes);
  return reinterpret_cast<void*>(ptr);
}

absl::Status CudaDevice::ReleaseAddressRange(void* ptr) {
  REMAT_CUDA_VMM_("ReleaseAddressRange");
  std::size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = vm_ranges_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == vm_ranges_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ReleaseAddressRange(%p): not an address range of %s", ptr, description_));
    }
    bytes = it->second;
  }
  const CUresult r = Vmm().address_free(reinterpret_cast<CUdeviceptr>(ptr), bytes);
  if (r != CUDA_SUCCESS) return DriverError(r, description_, "cuMemAddressFree");
  MutexLock lock(&mu_);
  vm_ranges_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  return absl::OkStatus();
}

absl::StatusOr<PhysicalChunk> CudaDevice::CreateChunk(std::size_t bytes) {
  REMAT_CUDA_VMM_("CreateChunk");
  if (bytes == 0 || bytes % page_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CreateChunk of %d bytes: not a positive multiple of the %s page", bytes,
        FormatBytes(page_size_)));
  }
  const CUmemAllocationProp prop = ChunkProp(ordinal_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult r = Vmm().create(&handle, bytes, &prop, 0);
  if (r != CUDA_SUCCESS) {
    return DriverError(r, description_, absl::StrFormat("cuMemCreate(%s)", FormatBytes(bytes)));
  }
  MutexLock lock(&mu_);
  chunks_.emplace(static_cast<std::uintptr_t>(handle), bytes);
  reserved_bytes_ += bytes;
  return PhysicalChunk{static_cast<std::uintptr_t>(handle)};
}

absl::Status CudaDevice::ReleaseChunk(PhysicalChunk chunk) {
  REMAT_CUDA_VMM_("ReleaseChunk");
  std::size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = chunks_.find(chunk.handle);
    if (it == chunks_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ReleaseChunk(%#x): not a chunk of %s", chunk.handle, description_));
    }
    bytes = it->second;
  }
  const CUresult r = Vmm().release(static_cast<CUmemGenericAllocationHandle>(chunk.handle));
  if (r != CUDA_SUCCESS) return DriverError(r, description_, "cuMemRelease");
  MutexLock lock(&mu_);
  chunks_.erase(chunk.handle);
  reserved_bytes_ -= bytes;
  return absl::OkStatus();
}

absl::Status CudaDevice::Map(void* ptr, PhysicalChunk chunk) {
  REMAT_CUDA_VMM_("Map");
  std::size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = chunks_.find(chunk.handle);
    if (it == chunks_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Map(%p, %#x): not a chunk of %s", ptr, chunk.handle, description_));
    }
    bytes = it->second;
  }
  const CUresult r = Vmm().map(reinterpret_cast<CUdeviceptr>(ptr), bytes, 0,
                               static_cast<CUmemGenericAllocationHandle>(chunk.handle), 0);
  if (r != CUDA_SUCCESS) return DriverError(r, description_, absl::StrFormat("cuMemMap(%p)", ptr));
  return absl::OkStatus();
}

absl::Status CudaDevice::SetAccess(void* ptr, std::size_t bytes) {
  REMAT_CUDA_VMM_("SetAccess");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult r = Vmm().set_access(reinterpret_cast<CUdeviceptr>(ptr), bytes, &access, 1);
  if (r != CUDA_SUCCESS) {
    return DriverError(r, description_, absl::StrFormat("cuMemSetAccess(%p, %d)", ptr, bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::Unmap(void* ptr, std::size_t bytes) {
  REMAT_CUDA_VMM_("Unmap");
  const CUresult r = Vmm().unmap(reinterpret_cast<CUdeviceptr>(ptr), bytes);
  if (r != CUDA_SUCCESS) {
    return DriverError(r, description_, absl::StrFormat("cuMemUnmap(%p, %d)", ptr, bytes));
  }
  return absl::OkStatus();
}

}  // namespace remat
