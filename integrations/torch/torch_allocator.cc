// libremat_torch.so: remat's caching allocator as PyTorch's CUDA allocator,
// loaded with
//
//   torch.cuda.memory.CUDAPluggableAllocator(path, "remat_malloc", "remat_free")
//
// One CachingAllocator per device, created on first use and configured from
// the environment (REMAT_BUDGET, REMAT_TRACE, REMAT_STATS, REMAT_SNAPSHOT,
// REMAT_DEVICE=sim; see integrations/env/env_allocator.h).
//
// A request remat_malloc cannot serve raises a C++ exception (a
// std::runtime_error whose message begins "CUDA out of memory." when the
// budget or the device is full; PyTorch's own allocator throws its own
// type): PyTorch turns it into a Python RuntimeError at the call that asked.
// A NULL would not be checked (PyTorch 2.11 builds a tensor without memory,
// and the kernel that writes it makes an illegal memory access, which ends
// the process's use of the GPU). C callers, which cannot catch it, and
// torch.cuda.MemPool (whose caching allocator checks for NULL and retries)
// use remat_try_malloc: NULL, and remat_torch_last_error() says why.
//
// Besides malloc and free, the optional hooks a pluggable allocator can have
// (PyTorch's set_init_fn, set_reset_fn, set_memory_fraction_fn and
// set_record_stream_fn take these signatures), a snapshot on request, and
// what remat.torch.budget needs to let this allocator's pressure drive its
// evictions: a budget in bytes, a pressure callback, and the peak's reset.
// Everything not named remat_* stays hidden (version script).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "allocator/snapshot_pickle.h"
#include "integrations/env/env_allocator.h"

#define REMAT_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using remat::env::Allocators;
using remat::env::SetLastError;

// As PyTorch's allocator, remat reads PyTorch's settings variable too.
[[maybe_unused]] const bool kReadsPyTorchConf = [] {
  remat::env::ReadPyTorchAllocConf();
  return true;
}();

std::uint64_t StreamValue(void* stream) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream));
}

// No C++ exception may reach a C caller (remat_malloc throws on purpose,
// after the call is done).
template <typename F>
auto Guarded(F f, decltype(f()) on_error) noexcept -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    SetLastError(absl::InternalError("remat: an unexpected C++ exception"));
    return on_error;
  }
}

absl::StatusOr<void*> TryAllocate(std::size_t size, int device, void* stream) noexcept {
  try {
    absl::StatusOr<void*> p = Allocators::Process().Allocate(device, size, StreamValue(stream));
    SetLastError(p.status());
    return p;
  } catch (...) {  // (the error is made here only: a served request allocates nothing more)
    absl::Status s = absl::InternalError("remat: an unexpected C++ exception");
    SetLastError(s);
    return s;
  }
}

}  // namespace

REMAT_EXPORT void* remat_try_malloc(std::size_t size, int device, void* stream) {
  absl::StatusOr<void*> p = TryAllocate(size, device, stream);
  return p.ok() ? *p : nullptr;
}

// PyTorch's alloc_fn: throws where remat_try_malloc returns NULL (no lock is
// held by then). Not for C callers: the exception would end the process.
REMAT_EXPORT void* remat_malloc(std::size_t size, int device, void* stream) {
  absl::StatusOr<void*> p = TryAllocate(size, device, stream);
  if (p.ok()) return *p;
  const std::string why(p.status().message());
  // PyTorch's own words for it, which tools that shrink a batch on out of
  // memory look for.
  if (absl::IsResourceExhausted(p.status())) throw std::runtime_error("CUDA out of memory. " + why);
  throw std::runtime_error("remat: " + why);
}

REMAT_EXPORT void remat_free(void* ptr, std::size_t size, int device, void* stream) {
  (void)size;
  Guarded(
      [&] {
        const std::uint64_t s = StreamValue(stream);
        SetLastError(Allocators::Process().FreeOn(device, ptr, &s));
        return 0;
      },
      0);
}

REMAT_EXPORT void remat_init(int device) {
  Guarded(
      [&] {
        SetLastError(Allocators::Process().For(device).status());
        return 0;
      },
      0);
}

REMAT_EXPORT void remat_reset(void) {
  Guarded(
      [] {
        SetLastError(Allocators::Process().EmptyCache());
        return 0;
      },
      0);
}

REMAT_EXPORT void remat_set_memory_fraction(double fraction, int device) {
  Guarded(
      [&] {
        SetLastError(Allocators::Process().SetMemoryFraction(device, fraction));
        return 0;
      },
      0);
}

REMAT_EXPORT void remat_record_stream(void* ptr, void* stream) {
  Guarded(
      [&] {
        SetLastError(Allocators::Process().RecordStream(ptr, StreamValue(stream)));
        return 0;
      },
      0);
}

// Bytes allocated to PyTorch and reserved from the device, now and at peak.
REMAT_EXPORT int remat_torch_memory_stats(int device, std::uint64_t out[4]) {
  return Guarded(
      [&]() -> int {
        absl::StatusOr<remat::CachingAllocator*> a = Allocators::Process().For(device);
        SetLastError(a.status());
        if (!a.ok() || out == nullptr) return -1;
        const remat::AllocatorStats s = (*a)->GetStats();
        out[0] = static_cast<std::uint64_t>(s.allocated_bytes.all().current);
        out[1] = static_cast<std::uint64_t>(s.allocated_bytes.all().peak);
        out[2] = static_cast<std::uint64_t>(s.reserved_bytes.all().current);
        out[3] = static_cast<std::uint64_t>(s.reserved_bytes.all().peak);
        return 0;
      },
      -1);
}

// Writes `device`'s state as a PyTorch memory snapshot pickle; 0 on success.
REMAT_EXPORT int remat_torch_write_snapshot(int device, const char* path) {
  return Guarded(
      [&]() -> int {
        if (path == nullptr) {
          SetLastError(absl::InvalidArgumentError("no snapshot path"));
          return -1;
        }
        absl::StatusOr<remat::CachingAllocator*> a = Allocators::Process().For(device);
        absl::Status s = a.ok() ? remat::WriteSnapshotPickle((*a)->TakeSnapshot(), path)
                                : a.status();
        SetLastError(s);
        return s.ok() ? 0 : -1;
      },
      -1);
}

namespace {

// The calls below that act on one device's allocator: `f(allocator)` runs
// once the device's allocator exists; its status is the call's last error,
// and 0 (OK) or -1 what it returns.
template <typename F>
int OnAllocator(int device, F f) noexcept {
  return Guarded(
      [&]() -> int {
        absl::StatusOr<remat::CachingAllocator*> a = Allocators::Process().For(device);
        const absl::Status s = a.ok() ? f(**a) : a.status();
        SetLastError(s);
        return s.ok() ? 0 : -1;
      },
      -1);
}

absl::Status NoOut() { return absl::InvalidArgumentError("out is NULL"); }

}  // namespace

// Caps `device`'s reserved bytes at `bytes` (0: the device's capacity, no
// cap). Below what is reserved, the cache is released; what stays allocated
// stays. 0 on success; -1 (and remat_torch_last_error) on a budget under the
// smallest segment or over the device.
REMAT_EXPORT int remat_torch_set_budget(int device, std::uint64_t bytes) {
  return OnAllocator(device, [&](remat::CachingAllocator& a) {
    return a.SetBudget(bytes == 0 ? a.device()->Capacity() : static_cast<std::size_t>(bytes));
  });
}

REMAT_EXPORT int remat_torch_get_budget(int device, std::uint64_t* out) {
  return OnAllocator(device, [&](remat::CachingAllocator& a) {
    if (out == nullptr) return NoOut();
    *out = a.budget();
    return absl::OkStatus();
  });
}

// Requests `device` could not serve, since the process began.
REMAT_EXPORT int remat_torch_num_ooms(int device, std::uint64_t* out) {
  return OnAllocator(device, [&](remat::CachingAllocator& a) {
    if (out == nullptr) return NoOut();
    *out = static_cast<std::uint64_t>(a.GetStats().num_ooms);
    return absl::OkStatus();
  });
}

// The peaks remat_torch_memory_stats reports start again from now.
REMAT_EXPORT int remat_torch_reset_peak_stats(int device) {
  return OnAllocator(device, [](remat::CachingAllocator& a) {
    a.ResetPeakStats();
    return absl::OkStatus();
  });
}

// A step of the program ended (a budget's `with` closed): with expandable
// segments the next step places its small blocks by what this one did
// (CachingAllocator::EndStep).
REMAT_EXPORT int remat_torch_end_step(int device) {
  return OnAllocator(device, [](remat::CachingAllocator& a) {
    a.EndStep();
    return absl::OkStatus();
  });
}

// What a pressure callback is told: the request that does not fit (rounded
// as the allocator rounds it) and the device's budget, reserved and
// allocated bytes.
struct remat_torch_pressure {
  std::uint64_t bytes;
  std::uint64_t budget;
  std::uint64_t reserved;
  std::uint64_t allocated;
  int device;
};
using remat_torch_pressure_fn = int (*)(void* user, const remat_torch_pressure* pressure);

// Called when `device` cannot serve a request within its budget, after its
// cache is released: the callback frees what it can (freeing through
// remat_free is allowed; it runs on the allocating thread, without the
// allocator's lock) and returns nonzero when it freed something, and the
// allocator tries again; 0 ends the tries unless another thread freed memory
// meanwhile (the request then fails: remat_malloc throws). NULL removes the
// callback. 0 on success; -1 on an unknown device, or with REMAT_TRACE set
// (its lock is held across the allocation, so a callback's free would wait
// on it).
REMAT_EXPORT int remat_torch_set_pressure_fn(int device, remat_torch_pressure_fn fn, void* user) {
  return OnAllocator(device, [&](remat::CachingAllocator& a) {
    if (fn == nullptr) {
      a.SetPressureHandler(nullptr);
      return absl::OkStatus();
    }
    // The trace writes a call and its record under one lock, held across the
    // allocation: a callback freeing through remat_free would wait on it.
    const absl::StatusOr<remat::env::Config>& config = Allocators::Process().config();
    if (config.ok() && !config->trace_path.empty()) {
      return absl::FailedPreconditionError(
          "REMAT_TRACE is set: a pressure callback cannot run while allocations are traced "
          "(unset REMAT_TRACE)");
    }
    a.SetPressureHandler([fn, user, device](const remat::PressureRequest& r) {
      const remat_torch_pressure p{r.bytes, r.budget, r.reserved, r.allocated, device};
      try {
        return fn(user, &p) != 0;
      } catch (...) {  // a C callback should not throw; one that does frees nothing
        return false;
      }
    });
    return absl::OkStatus();
  });
}

REMAT_EXPORT const char* remat_torch_last_error(void) { return remat::env::LastError(); }
