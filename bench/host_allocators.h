// The four allocators the benchmarks compare, behind one tiny interface:
//
//   void* Allocate(std::size_t bytes);   // nullptr on failure
//   bool Free(void* ptr);                // false on failure
//
// * RematAllocator: our CachingAllocator on an unbacked SimDevice (addresses
//   only; the memory is never touched, and cannot be), default stream, default
//   options (so the event ring and statistics are on, as users get them).
// * GlibcMalloc: glibc's malloc, as glibc's own __libc_malloc / __libc_free,
//   looked up in libc.so.6 itself. Linking Debian's libjemalloc makes jemalloc
//   the process's `malloc`, so the plain name would not reach glibc; and
//   Debian's libmimalloc exports __libc_malloc too (mimalloc overrides that
//   name), so even the __libc_ name, bound by the linker, reaches mimalloc.
// * JemallocMalloc: jemalloc's own API, mallocx(bytes, 0) / dallocx(ptr, 0).
// * MimallocMalloc: mi_malloc / mi_free.
//
// Each adapter is a plain struct so the benchmark loops are templates and the
// calls inline; only RematAllocator carries state (the device and allocator).
#ifndef REMAT_BENCH_HOST_ALLOCATORS_H_
#define REMAT_BENCH_HOST_ALLOCATORS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <jemalloc/jemalloc.h>
#include <mimalloc.h>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"

namespace remat::bench {

class RematAllocator {
 public:
  static constexpr const char* kName = "remat";
  // An unbacked 4 TiB device: room for every sequence's peak, nothing touched.
  RematAllocator();
  bool ok() const { return allocator_ != nullptr; }
  const std::string& error() const { return error_; }

  void* Allocate(std::size_t bytes) {
    absl::StatusOr<void*> p = allocator_->Allocate(bytes);
    return p.ok() ? *p : nullptr;
  }
  bool Free(void* ptr) { return allocator_->Free(ptr).ok(); }
  // Segments reserved from the device so far and their bytes: whether a
  // benchmark reached a steady state that reuses the cache.
  std::int64_t device_allocs() const { return allocator_->GetStats().num_device_alloc; }
  std::int64_t reserved_bytes() const {
    return allocator_->GetStats().reserved_bytes.all().current;
  }

 private:
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::string error_;
};

struct GlibcMalloc {
  static constexpr const char* kName = "glibc";
  // Set by LoadGlibcMalloc.
  static inline void* (*malloc_fn)(std::size_t) = nullptr;
  static inline void (*free_fn)(void*) = nullptr;

  bool ok() const { return malloc_fn != nullptr; }
  std::string error() const { return "glibc's __libc_malloc was not loaded"; }
  void* Allocate(std::size_t bytes) { return malloc_fn(bytes); }
  bool Free(void* ptr) {
    free_fn(ptr);
    return true;
  }
};

// Finds __libc_malloc and __libc_free in libc.so.6 (not wherever the dynamic
// linker would bind the names). False, with the reason in `error`, when not.
bool LoadGlibcMalloc(std::string* error);

struct JemallocMalloc {
  static constexpr const char* kName = "jemalloc";
  bool ok() const { return true; }
  std::string error() const { return {}; }
  void* Allocate(std::size_t bytes) { return mallocx(bytes, 0); }
  bool Free(void* ptr) {
    dallocx(ptr, 0);
    return true;
  }
};

struct MimallocMalloc {
  static constexpr const char* kName = "mimalloc";
  bool ok() const { return true; }
  std::string error() const { return {}; }
  void* Allocate(std::size_t bytes) { return mi_malloc(bytes); }
  bool Free(void* ptr) {
    mi_free(ptr);
    return true;
  }
};

// Checks that the three host allocators are three different allocators and
// that the names reach the libraries they should: which shared object defines
// each entry point (and the process's `malloc`), the versions, and that a
// block from one is not counted by another (jemalloc's thread.allocated, and
// mimalloc's heap region). Appends what it found to `report`, one fact per
// line; returns false (with the reason in `report`) when a check fails.
bool VerifyHostAllocators(std::string* report);

}  // namespace remat::bench

#endif  // REMAT_BENCH_HOST_ALLOCATORS_H_
