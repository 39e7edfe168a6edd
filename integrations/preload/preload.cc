// libremat_preload.so: CUDA device allocations of an unmodified program served
// by remat's caching allocator, through LD_PRELOAD (see README.md).
//
// What is interposed, and how each finds us:
//   - the runtime API (cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync,
//     cudaMemGetInfo) and the driver API (cuMemAlloc_v2, cuMemFree_v2,
//     cuMemGetInfo_v2, cuMemAllocAsync, cuMemFreeAsync) by name, for programs
//     linked with the dynamic libcudart or libcuda, and the async calls'
//     per-thread default stream variants (the _ptsz names);
//   - cuGetProcAddress(_v2), through which cudart (since CUDA 11.3, static or
//     dynamic) finds the driver's entry points: asked for one of ours, it
//     hands out ours;
//   - dlsym, through which cudart finds cuGetProcAddress in the driver it
//     dlopen'ed: asked for one of our names, it hands out ours. Everything
//     else goes to the real dlsym by a tail jump, so the caller's return
//     address, which RTLD_NEXT depends on, is untouched.
//
// Reentrancy. While remat itself runs (tls_depth > 0), every interposed
// function forwards to the real one: the CUDA device we allocate from calls
// cudaMalloc, cudart calls the driver, and none of that may come back to us.
//
// Fork. Every call into the allocators holds one process-wide gate, which a
// pthread_atfork handler takes before fork() and releases in both processes,
// so a child never inherits an allocator lock held by a thread it lacks.
//
// Before main and after exit. The allocators are created on first use and
// never destroyed; the trace and statistics are written by an atexit handler
// registered at that first use, and later calls keep working.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "integrations/env/env_allocator.h"

// The interposed functions leave the library; everything else is hidden.
#define REMAT_EXPORT __attribute__((visibility("default")))

namespace {

using remat::env::Allocators;
using remat::env::Config;

// The CUDA types and codes we need, by value: no CUDA header is included, so
// the shim builds (and serves REMAT_DEVICE=sim) without the toolkit.
using cudaError = int;
using CUresult = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
using cuuint64 = std::uint64_t;
constexpr cudaError kCudaSuccess = 0;
constexpr cudaError kCudaErrorInvalidValue = 1;
constexpr cudaError kCudaErrorMemoryAllocation = 2;
constexpr cudaError kCudaErrorNoDevice = 100;
constexpr cudaError kCudaErrorUnknown = 999;
// The per-thread default stream's handle (cudaStreamPerThread and
// CU_STREAM_PER_THREAD): what a null stream means to the _ptsz entry points,
// which programs built with the per-thread default stream call.
constexpr std::uintptr_t kPerThreadStream = 0x2;
constexpr cuuint64 kProcAddressPerThreadStream = 1 << 1;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
constexpr CUresult kCuSuccess = 0;
constexpr CUresult kCuErrorInvalidValue = 1;
constexpr CUresult kCuErrorOutOfMemory = 2;
constexpr CUresult kCuErrorNoDevice = 100;
constexpr CUresult kCuErrorNotFound = 500;
constexpr CUresult kCuErrorUnknown = 999;

// Initial-exec: reached at a fixed offset from the thread pointer, never
// through __tls_get_addr. A sanitizer preloaded before us (ASan, TSan)
// intercepts __tls_get_addr and calls dlsym (ours) while it sets its
// interceptors up, before its own __tls_get_addr can forward anywhere: a
// general-dynamic access from the dlsym hook then jumps to address 0. (A
// preloaded library's TLS is in the static block, so initial-exec is sound.)
__attribute__((tls_model("initial-exec"))) thread_local int tls_depth = 0;

// strcmp without libc: the dlsym hook runs while a sanitizer's interceptors,
// strcmp among them, are still being set up.
bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

// Marks the thread as inside remat for a scope.
class Inside {
 public:
  Inside() { ++tls_depth; }
  ~Inside() { --tls_depth; }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
};

// The gate is a pthread mutex, not remat::Mutex: a program built with TSan
// sees through its interceptors that one allocator call happens before the
// next, and so does not report the allocator's own (uninstrumented) memory
// as racing. Statically initialized: nothing runs before it is usable.
pthread_mutex_t gate_mutex = PTHREAD_MUTEX_INITIALIZER;

class GateLock {
 public:
  GateLock() { pthread_mutex_lock(&gate_mutex); }
  ~GateLock() { pthread_mutex_unlock(&gate_mutex); }
  GateLock(const GateLock&) = delete;
  GateLock& operator=(const GateLock&) = delete;
};

bool Sim() {
  const auto& config = Allocators::Process().config();
  return config.ok() && config->device.kind == remat::DeviceSpec::Kind::kSim;
}

cudaError ToCuda(const absl::Status& s) {
  if (s.ok()) return kCudaSuccess;
  if (absl::IsResourceExhausted(s)) return kCudaErrorMemoryAllocation;
  if (absl::IsInvalidArgument(s) || absl::IsNotFound(s)) return kCudaErrorInvalidValue;
  if (absl::IsFailedPrecondition(s)) return kCudaErrorNoDevice;
  return kCudaErrorUnknown;
}

CUresult ToCu(const absl::Status& s) {
  if (s.ok()) return kCuSuccess;
  if (absl::IsResourceExhausted(s)) return kCuErrorOutOfMemory;
  if (absl::IsInvalidArgument(s) || absl::IsNotFound(s)) return kCuErrorInvalidValue;
  if (absl::IsFailedPrecondition(s)) return kCuErrorNoDevice;
  return kCuErrorUnknown;
}

}  // namespace

// --- The real dlsym and the real CUDA functions -----------------------------------

extern "C" {
// Read by the dlsym trampoline below; set before the hook first returns.
// (`used`: only the assembly below reads it, which link-time optimisation cannot see.)
__attribute__((visibility("hidden"), used)) void* remat_preload_real_dlsym = nullptr;
}

namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn RealDlsym() {
  // No function-local static: its guard (__cxa_guard_acquire) is intercepted
  // by TSan, which calls this hook before its interceptors work. Threads that
  // race here find the same function and store the same pointer.
  void* f = __atomic_load_n(&remat_preload_real_dlsym, __ATOMIC_ACQUIRE);
  if (f == nullptr) {
    f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&remat_preload_real_dlsym, f, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<DlsymFn>(f);
}

// A CUDA function past us: the next definition in the global scope, or, for
// the driver that cudart dlopen'ed privately, libcuda.so.1's own.
void* RealFunction(const char* name) {
  Inside inside;
  DlsymFn dl = RealDlsym();
  if (dl == nullptr) return nullptr;
  if (void* f = dl(RTLD_NEXT, name)) return f;
  if (std::strncmp(name, "cu", 2) == 0 && std::strncmp(name, "cuda", 4) != 0) {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr && !Sim()) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (driver != nullptr) return dl(driver, name);
  }
  return nullptr;
}

template <typename F>
F Real(const char* name, std::atomic<void*>& cache) {
  void* f = cache.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = RealFunction(name);
    cache.store(f, std::memory_order_release);
  }
  return reinterpret_cast<F>(f);
}

#define REMAT_REAL(type, name)                 \
  ([]() -> type {                              \
    static std::atomic<void*> cache{nullptr};  \
    return Real<type>(#name, cache);           \
  }())

int CurrentDevice() {
  if (Sim()) return 0;
  using GetDevice = cudaError (*)(int*);
  GetDevice get = REMAT_REAL(GetDevice, cudaGetDevice);
  int device = 0;
  if (get != nullptr) {
    Inside inside;
    if (get(&device) != kCudaSuccess) device = 0;
  }
  return device;
}

void AtForkPrepare() { pthread_mutex_lock(&gate_mutex); }
void AtForkRelease() { pthread_mutex_unlock(&gate_mutex); }

__attribute__((constructor)) void InstallForkHandlers() {
  RealDlsym();
  pthread_atfork(AtForkPrepare, AtForkRelease, AtForkRelease);
  // The program `remat run --stats` started reports at its exit even when it
  // never allocates (its report then says so): the allocators, and the exit
  // handler that reports, are made now rather than at the first allocation.
  const char* root = std::getenv("REMAT_ROOT_PID");
  const char* stats = std::getenv("REMAT_STATS");
  if (root != nullptr && stats != nullptr && std::strcmp(stats, "1") == 0 &&
      std::to_string(getpid()) == root) {
    Allocators::Process();
  }
}

// --- What every entry point does, under the gate and marked as inside --------------

absl::Status Allocate(void** out, std::size_t bytes, std::uint64_t stream) {
  const int device = CurrentDevice();
  Inside inside;
  GateLock gate;
  absl::StatusOr<void*> p = Allocators::Process().Allocate(device, bytes, stream);
  // A request larger than the whole device is out of memory to CUDA too
  // (programs probe by halving a size until it fits).
  if (absl::IsInvalidArgument(p.status())) return absl::ResourceExhaustedError(p.status().message());
  if (!p.ok()) return p.status();
  *out = *p;
  return absl::OkStatus();
}

// NotFound when the pointer is not ours.
absl::Status Free(const void* ptr, const std::uint64_t* stream) {
  Inside inside;
  GateLock gate;
  return Allocators::Process().Free(ptr, stream);
}

// The per-thread default stream (a null stream in the _ptsz entry points, or
// cudaStreamPerThread / CU_STREAM_PER_THREAD given explicitly) is a
// different stream in every thread under one handle, so the allocator must
// not treat it as one stream: a block one thread freed could go to another
// thread while the first thread's kernels still use it. Its blocks live on
// the legacy default stream (0), and each free records an event on the
// freeing thread's own per-thread stream (RecordStream, then the free: the
// allocator records it in this thread), so the block is reused only after
// the work queued before the free is done, whichever thread asks next.
absl::Status AllocatePerThread(void** out, std::size_t bytes) { return Allocate(out, bytes, 0); }

absl::Status FreePerThread(const void* ptr) {
  Inside inside;
  GateLock gate;
  absl::Status used = Allocators::Process().RecordStream(ptr, kPerThreadStream);
  if (!used.ok()) return used;  // not ours (NotFound: the real free tries), or a double free
  const std::uint64_t legacy = 0;
  return Allocators::Process().Free(ptr, &legacy);
}

bool IsPerThread(const void* stream) {
  return reinterpret_cast<std::uintptr_t>(stream) == kPerThreadStream;
}

absl::Status MemInfo(std::size_t* free, std::size_t* total) {
  const int device = CurrentDevice();
  Inside inside;
  GateLock gate;
  absl::StatusOr<Allocators::MemInfo> info = Allocators::Process().GetMemInfo(device);
  if (!info.ok()) return info.status();
  *free = info->free;
  *total = info->total;
  return absl::OkStatus();
}

}  // namespace

// --- The runtime API --------------------------------------------------------------

extern "C" {

REMAT_EXPORT cudaError cudaMalloc(void** ptr, std::size_t bytes) {
  using Fn = cudaError (*)(void**, std::size_t);
  if (tls_depth > 0) return REMAT_REAL(Fn, cudaMalloc)(ptr, bytes);
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  return ToCuda(Allocate(ptr, bytes, 0));
}

REMAT_EXPORT cudaError cudaMallocAsync(void** ptr, std::size_t bytes, void* stream) {
  using Fn = cudaError (*)(void**, std::size_t, void*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cudaMallocAsync)(ptr, bytes, stream);
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  if (IsPerThread(stream)) return ToCuda(AllocatePerThread(ptr, bytes));
  return ToCuda(Allocate(ptr, bytes, reinterpret_cast<std::uintptr_t>(stream)));
}

REMAT_EXPORT cudaError cudaFree(void* ptr) {
  using Fn = cudaError (*)(void*);
  if (tls_depth == 0) {
    // cudaFree(nullptr) is how programs create their context: let the driver
    // see it. On the simulator there is nothing to create.
    if (ptr == nullptr && Sim()) return kCudaSuccess;
    absl::Status s = ptr == nullptr ? absl::NotFoundError("") : Free(ptr, nullptr);
    if (!absl::IsNotFound(s)) return ToCuda(s);
    if (Sim()) return kCudaErrorInvalidValue;  // not ours, and no driver to ask
  }
  Fn real = REMAT_REAL(Fn, cudaFree);  // memory from before us, or not ours at all
  Inside inside;
  return real != nullptr ? real(ptr) : kCudaErrorInvalidValue;
}

REMAT_EXPORT cudaError cudaFreeAsync(void* ptr, void* stream) {
  using Fn = cudaError (*)(void*, void*);
  if (tls_depth == 0) {
    const auto s = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream));
    absl::Status st = IsPerThread(stream) ? FreePerThread(ptr) : Free(ptr, &s);
    if (!absl::IsNotFound(st)) return ToCuda(st);
    if (Sim()) return kCudaErrorInvalidValue;
  }
  Fn real = REMAT_REAL(Fn, cudaFreeAsync);
  Inside inside;
  return real != nullptr ? real(ptr, stream) : kCudaErrorInvalidValue;
}

// The per-thread default stream's variants (nvcc --default-stream per-thread,
// or CUDA_API_PER_THREAD_DEFAULT_STREAM): a null stream is this thread's
// default stream, not the legacy one.
REMAT_EXPORT cudaError cudaMallocAsync_ptsz(void** ptr, std::size_t bytes, void* stream) {
  using Fn = cudaError (*)(void**, std::size_t, void*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cudaMallocAsync_ptsz)(ptr, bytes, stream);
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  if (stream == nullptr || IsPerThread(stream)) return ToCuda(AllocatePerThread(ptr, bytes));
  return ToCuda(Allocate(ptr, bytes, reinterpret_cast<std::uintptr_t>(stream)));
}

REMAT_EXPORT cudaError cudaFreeAsync_ptsz(void* ptr, void* stream) {
  using Fn = cudaError (*)(void*, void*);
  if (tls_depth == 0) {
    const std::uint64_t s = reinterpret_cast<std::uintptr_t>(stream);
    absl::Status st =
        stream == nullptr || IsPerThread(stream) ? FreePerThread(ptr) : Free(ptr, &s);
    if (!absl::IsNotFound(st)) return ToCuda(st);
    if (Sim()) return kCudaErrorInvalidValue;
  }
  Fn real = REMAT_REAL(Fn, cudaFreeAsync_ptsz);
  Inside inside;
  return real != nullptr ? real(ptr, stream) : kCudaErrorInvalidValue;
}

REMAT_EXPORT cudaError cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  using Fn = cudaError (*)(std::size_t*, std::size_t*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cudaMemGetInfo)(free, total);
  if (free == nullptr || total == nullptr) return kCudaErrorInvalidValue;
  return ToCuda(MemInfo(free, total));
}

// --- The driver API ---------------------------------------------------------------

REMAT_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* ptr, std::size_t bytes) {
  using Fn = CUresult (*)(CUdeviceptr*, std::size_t);
  if (tls_depth > 0) return REMAT_REAL(Fn, cuMemAlloc_v2)(ptr, bytes);
  if (ptr == nullptr || bytes == 0) return kCuErrorInvalidValue;  // as the driver does
  void* p = nullptr;
  const CUresult r = ToCu(Allocate(&p, bytes, 0));
  if (r == kCuSuccess) *ptr = reinterpret_cast<std::uintptr_t>(p);
  return r;
}

REMAT_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* ptr, std::size_t bytes, void* stream) {
  using Fn = CUresult (*)(CUdeviceptr*, std::size_t, void*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cuMemAllocAsync)(ptr, bytes, stream);
  if (ptr == nullptr || bytes == 0) return kCuErrorInvalidValue;
  void* p = nullptr;
  const CUresult r = ToCu(IsPerThread(stream) ? AllocatePerThread(&p, bytes)
                                              : Allocate(&p, bytes, reinterpret_cast<std::uintptr_t>(stream)));
  if (r == kCuSuccess) *ptr = reinterpret_cast<std::uintptr_t>(p);
  return r;
}

REMAT_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  using Fn = CUresult (*)(CUdeviceptr);
  if (tls_depth == 0) {
    absl::Status s = Free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), nullptr);
    if (!absl::IsNotFound(s)) return ToCu(s);
    if (Sim()) return kCuErrorInvalidValue;
  }
  Fn real = REMAT_REAL(Fn, cuMemFree_v2);
  Inside inside;
  return real != nullptr ? real(ptr) : kCuErrorInvalidValue;
}

REMAT_EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, void* stream) {
  using Fn = CUresult (*)(CUdeviceptr, void*);
  if (tls_depth == 0) {
    const auto s = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream));
    void* const p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
    absl::Status st = IsPerThread(stream) ? FreePerThread(p) : Free(p, &s);
    if (!absl::IsNotFound(st)) return ToCu(st);
    if (Sim()) return kCuErrorInvalidValue;
  }
  Fn real = REMAT_REAL(Fn, cuMemFreeAsync);
  Inside inside;
  return real != nullptr ? real(ptr, stream) : kCuErrorInvalidValue;
}

REMAT_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* ptr, std::size_t bytes, void* stream) {
  using Fn = CUresult (*)(CUdeviceptr*, std::size_t, void*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cuMemAllocAsync_ptsz)(ptr, bytes, stream);
  if (ptr == nullptr || bytes == 0) return kCuErrorInvalidValue;
  void* p = nullptr;
  const CUresult r = ToCu(stream == nullptr || IsPerThread(stream)
                              ? AllocatePerThread(&p, bytes)
                              : Allocate(&p, bytes, reinterpret_cast<std::uintptr_t>(stream)));
  if (r == kCuSuccess) *ptr = reinterpret_cast<std::uintptr_t>(p);
  return r;
}

REMAT_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, void* stream) {
  using Fn = CUresult (*)(CUdeviceptr, void*);
  if (tls_depth == 0) {
    const std::uint64_t s = reinterpret_cast<std::uintptr_t>(stream);
    void* const p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
    absl::Status st = stream == nullptr || IsPerThread(stream) ? FreePerThread(p) : Free(p, &s);
    if (!absl::IsNotFound(st)) return ToCu(st);
    if (Sim()) return kCuErrorInvalidValue;
  }
  Fn real = REMAT_REAL(Fn, cuMemFreeAsync_ptsz);
  Inside inside;
  return real != nullptr ? real(ptr, stream) : kCuErrorInvalidValue;
}

REMAT_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  using Fn = CUresult (*)(std::size_t*, std::size_t*);
  if (tls_depth > 0) return REMAT_REAL(Fn, cuMemGetInfo_v2)(free, total);
  if (free == nullptr || total == nullptr) return kCuErrorInvalidValue;
  return ToCu(MemInfo(free, total));
}

REMAT_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64 flags,
                             int* status);
REMAT_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64 flags);

}  // extern "C"

namespace {

// Ours, for a driver entry-point name as cuGetProcAddress is asked for it
// (without the _v2 suffix), or null. `flags` may ask for the per-thread
// default stream's variant.
void* OursForProcName(const char* symbol, cuuint64 flags) {
  if ((flags & kProcAddressPerThreadStream) != 0) {
    if (std::strcmp(symbol, "cuMemAllocAsync") == 0) {
      return reinterpret_cast<void*>(&cuMemAllocAsync_ptsz);
    }
    if (std::strcmp(symbol, "cuMemFreeAsync") == 0) {
      return reinterpret_cast<void*>(&cuMemFreeAsync_ptsz);
    }
  }
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry kEntries[] = {
      {"cuMemAlloc", reinterpret_cast<void*>(&cuMemAlloc_v2)},
      {"cuMemFree", reinterpret_cast<void*>(&cuMemFree_v2)},
      {"cuMemGetInfo", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
      {"cuMemAllocAsync", reinterpret_cast<void*>(&cuMemAllocAsync)},
      {"cuMemFreeAsync", reinterpret_cast<void*>(&cuMemFreeAsync)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
  };
  for (const Entry& e : kEntries) {
    if (std::strcmp(symbol, e.name) == 0) return e.fn;
  }
  return nullptr;
}

// Ours, for a symbol name as dlsym is asked for it, or null.
void* OursForSymbol(const char* name) {
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry kEntries[] = {
      {"cudaMalloc", reinterpret_cast<void*>(&cudaMalloc)},
      {"cudaFree", reinterpret_cast<void*>(&cudaFree)},
      {"cudaMallocAsync", reinterpret_cast<void*>(&cudaMallocAsync)},
      {"cudaFreeAsync", reinterpret_cast<void*>(&cudaFreeAsync)},
      {"cudaMallocAsync_ptsz", reinterpret_cast<void*>(&cudaMallocAsync_ptsz)},
      {"cudaFreeAsync_ptsz", reinterpret_cast<void*>(&cudaFreeAsync_ptsz)},
      {"cudaMemGetInfo", reinterpret_cast<void*>(&cudaMemGetInfo)},
      {"cuMemAlloc_v2", reinterpret_cast<void*>(&cuMemAlloc_v2)},
      {"cuMemFree_v2", reinterpret_cast<void*>(&cuMemFree_v2)},
      {"cuMemGetInfo_v2", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
      {"cuMemAllocAsync", reinterpret_cast<void*>(&cuMemAllocAsync)},
      {"cuMemFreeAsync", reinterpret_cast<void*>(&cuMemFreeAsync)},
      {"cuMemAllocAsync_ptsz", reinterpret_cast<void*>(&cuMemAllocAsync_ptsz)},
      {"cuMemFreeAsync_ptsz", reinterpret_cast<void*>(&cuMemFreeAsync_ptsz)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
      {"cuGetProcAddress_v2", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
  };
  for (const Entry& e : kEntries) {
    if (SameName(name, e.name)) return e.fn;
  }
  return nullptr;
}

}  // namespace

extern "C" {

REMAT_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64 flags,
                             int* status) {
  using Fn = CUresult (*)(const char*, void**, int, cuuint64, int*);
  if (symbol == nullptr || pfn == nullptr) return kCuErrorInvalidValue;
  if (tls_depth == 0) {
    if (void* ours = OursForProcName(symbol, flags)) {
      *pfn = ours;
      if (status != nullptr) *status = 0;  // CU_GET_PROC_ADDRESS_SUCCESS
      return kCuSuccess;
    }
  }
  Fn real = REMAT_REAL(Fn, cuGetProcAddress_v2);
  if (real == nullptr) {
    *pfn = nullptr;
    if (status != nullptr) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    return kCuErrorNotFound;
  }
  Inside inside;
  return real(symbol, pfn, version, flags, status);
}

REMAT_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64 flags) {
  using Fn = CUresult (*)(const char*, void**, int, cuuint64);
  if (tls_depth == 0 && symbol != nullptr && pfn != nullptr) {
    if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
      // Asked through the old entry point, the old signature.
      *pfn = reinterpret_cast<void*>(&cuGetProcAddress);
      return kCuSuccess;
    }
    if (void* ours = OursForProcName(symbol, flags)) {
      *pfn = ours;
      return kCuSuccess;
    }
  }
  if (symbol == nullptr || pfn == nullptr) return kCuErrorInvalidValue;
  Fn real = REMAT_REAL(Fn, cuGetProcAddress);
  if (real == nullptr) {
    *pfn = nullptr;
    return kCuErrorNotFound;
  }
  Inside inside;
  return real(symbol, pfn, version, flags);
}

// Called by the dlsym trampoline: ours for one of our names (outside remat),
// else null, and then the trampoline jumps to the real dlsym.
__attribute__((visibility("hidden"), used)) void* remat_preload_dlsym_hook(void* handle,
                                                                    const char* name) {
  (void)handle;
  RealDlsym();  // sets remat_preload_real_dlsym for the jump
  if (tls_depth > 0 || name == nullptr) return nullptr;
  return OursForSymbol(name);
}

}  // extern "C"

// dlsym itself: the hook, then a tail jump to the real one with the caller's
// registers and return address intact.
#if defined(__x86_64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
dlsym:
  pushq %rdi
  pushq %rsi
  subq $8, %rsp
  call remat_preload_dlsym_hook
  addq $8, %rsp
  popq %rsi
  popq %rdi
  testq %rax, %rax
  jz 1f
  ret
1:
  jmpq *remat_preload_real_dlsym(%rip)
  .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, %function
dlsym:
  stp x29, x30, [sp, #-32]!
  stp x0, x1, [sp, #16]
  bl remat_preload_dlsym_hook
  mov x9, x0
  ldp x0, x1, [sp, #16]
  ldp x29, x30, [sp], #32
  cbz x9, 1f
  mov x0, x9
  ret
1:
  adrp x9, remat_preload_real_dlsym
  ldr x9, [x9, :lo12:remat_preload_real_dlsym]
  br x9
  .size dlsym, .-dlsym
)");
#else
#error "the dlsym trampoline is written for x86-64 and aarch64"
#endif
