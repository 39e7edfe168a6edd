// The C ABI (remat.h) over CachingAllocator and Runtime.
//
// Every entry point runs its body through Call(), which turns absl::Status
// failures and any C++ exception into a remat_status and a thread-local
// message: nothing C++ crosses the boundary.
//
// Pins. Runtime::Create and Runtime::Acquire return move-only Guards; the C
// caller holds pins by tensor id instead, so each runtime keeps the Guards in
// a map (id -> stack of guards) under its own lock. That lock is never held
// while calling into the Runtime (Guard::Release takes the runtime's lock), so
// the two locks never nest.
#include "integrations/c_api/remat.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "base/mutex.h"
#include "base/units.h"
#include "device/device.h"
#include "device/device_spec.h"
#include "device/sim_device.h"
#include "runtime/runtime.h"
#include "runtime/step_planner.h"

#ifndef REMAT_VERSION_STRING
#define REMAT_VERSION_STRING "0.0.0"
#endif

struct remat_allocator {
  std::unique_ptr<remat::Device> device;
  std::unique_ptr<remat::CachingAllocator> allocator;  // declared after: destroyed first
  // The device, where it is the simulated one: its streams are known, so a
  // handle it never made (or destroyed) is refused. (On CUDA any
  // cudaStream_t the caller holds is a stream.)
  remat::SimDevice* sim = nullptr;
  // The runtime installed as the allocator's pressure handler, if any.
  std::atomic<bool> has_runtime{false};
};

struct remat_runtime {
  remat_allocator* owner = nullptr;
  // Forwards the runtime's tensor events to remat_runtime_create_observed's
  // callback; declared before `runtime`, so it outlives it.
  std::unique_ptr<remat::RuntimeObserver> observer;
  std::unique_ptr<remat::Runtime> runtime;
  remat::Mutex mu;
  // Pins the C caller holds, per tensor. Destroyed before `runtime` by
  // remat_runtime_destroy (a Guard unpins through its runtime).
  absl::flat_hash_map<std::uint64_t, std::vector<remat::Guard>> pins ABSL_GUARDED_BY(mu);
  std::uint64_t pin_count ABSL_GUARDED_BY(mu) = 0;
};

struct remat_planner {
  explicit remat_planner(remat::StepPlanner p) : planner(std::move(p)) {}
  remat::StepPlanner planner ABSL_GUARDED_BY(mu);
  remat::Mutex mu;
};

namespace {

// --- Errors -------------------------------------------------------------------------

thread_local std::string tls_last_error;
// Set when recording a message itself ran out of memory.
thread_local bool tls_error_lost = false;
// What a failing recompute callback said through remat_recompute_set_error.
thread_local std::string tls_callback_error;

void SetError(absl::string_view message) noexcept {
  try {
    tls_last_error.assign(message.data(), message.size());
    tls_error_lost = false;
  } catch (...) {
    tls_error_lost = true;
  }
}

remat_status Fail(remat_status code, const char* fn, absl::string_view message) noexcept {
  try {
    SetError(absl::StrCat(fn, ": ", message));
  } catch (...) {
    tls_error_lost = true;
  }
  return code;
}

remat_status CodeOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return REMAT_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return REMAT_INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted:
      return REMAT_OUT_OF_MEMORY;
    case absl::StatusCode::kNotFound:
      return REMAT_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnavailable:
      return REMAT_FAILED_PRECONDITION;
    default:
      return REMAT_INTERNAL;
  }
}

remat_status FromStatus(const char* fn, const absl::Status& status) {
  if (status.ok()) return REMAT_OK;
  return Fail(CodeOf(status.code()), fn, status.message());
}

// Runs one entry point's body; no exception leaves it.
template <typename Body>
remat_status Call(const char* fn, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(REMAT_OUT_OF_MEMORY, fn, "out of host memory");
  } catch (const std::exception& e) {
    return Fail(REMAT_INTERNAL, fn, absl::StrCat("unexpected C++ exception: ", e.what()));
  } catch (...) {
    return Fail(REMAT_INTERNAL, fn, "unexpected C++ exception");
  }
}

// A copy of `text` the caller frees with remat_string_free, or
// nullptr where host memory ran out.
char* MallocCopy(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy != nullptr) std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

remat_status NullArgument(const char* fn, const char* name) {
  return Fail(REMAT_INVALID_ARGUMENT, fn, absl::StrCat(name, " is NULL"));
}

// REMAT_OK, or REMAT_INVALID_ARGUMENT for a stream the simulated device does
// not know (never made, or destroyed).
remat_status CheckStream(const remat_allocator* allocator, const char* fn, std::uint64_t stream) {
  if (allocator->sim == nullptr || stream == 0) return REMAT_OK;
  if (allocator->sim->StreamTimeNs(remat::Stream{static_cast<std::uintptr_t>(stream)}).ok()) {
    return REMAT_OK;
  }
  return Fail(REMAT_INVALID_ARGUMENT, fn,
              absl::StrCat("stream ", stream,
                           " is not a stream of this device (never created, or destroyed)"));
}

remat::Stream ToStream(std::uint64_t handle) {
  return remat::Stream{static_cast<std::uintptr_t>(handle)};
}

std::uint64_t U64(std::int64_t v) { return v < 0 ? 0 : static_cast<std::uint64_t>(v); }

// Tells a C callback each tensor event.
class CallbackObserver final : public remat::RuntimeObserver {
 public:
  CallbackObserver(remat_event_fn fn, void* user_data) : fn_(fn), user_data_(user_data) {}

  void OnTensor(const remat::TensorEvent& e) override {
    remat_event out;
    std::memset(&out, 0, sizeof(out));
    switch (e.kind) {
      case remat::TensorEvent::Kind::kCreated:
        out.kind = REMAT_EVENT_CREATED;
        break;
      case remat::TensorEvent::Kind::kDropped:
        out.kind = REMAT_EVENT_DROPPED;
        break;
      case remat::TensorEvent::Kind::kOffloaded:
        out.kind = REMAT_EVENT_OFFLOADED;
        break;
      case remat::TensorEvent::Kind::kRestored:
        out.kind = REMAT_EVENT_RESTORED;
        break;
      case remat::TensorEvent::Kind::kRecomputed:
        out.kind = REMAT_EVENT_RECOMPUTED;
        break;
      case remat::TensorEvent::Kind::kCollected:
        out.kind = REMAT_EVENT_COLLECTED;
        break;
      case remat::TensorEvent::Kind::kCopiedAhead:
        out.kind = REMAT_EVENT_COPIED_AHEAD;
        break;
    }
    out.tensor = e.tensor;
    out.bytes = e.bytes;
    out.pressure = e.pressure ? 1 : 0;
    out.prefetch = e.prefetch ? 1 : 0;
    out.cost_ns = e.cost_ns;
    out.stream = static_cast<std::uint64_t>(e.stream.handle);
    out.ahead = e.ahead ? 1 : 0;
    out.directed = e.directed ? 1 : 0;
    out.refill = e.refill ? 1 : 0;
    fn_(user_data_, &out);
  }

 private:
  remat_event_fn fn_;
  void* user_data_;
};

// --- Devices ------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<remat::Device>> MakeDevice(const remat_allocator_options& o) {
  remat::DeviceSpec spec;
  switch (o.device) {
    case REMAT_DEVICE_SIM:
      spec.kind = remat::DeviceSpec::Kind::kSim;
      spec.sim.capacity = static_cast<std::size_t>(o.sim_capacity_bytes);
      spec.sim.backed = o.sim_backed != 0;
      break;
    case REMAT_DEVICE_CUDA:
      spec.kind = remat::DeviceSpec::Kind::kCuda;
      spec.cuda_ordinal = o.cuda_device;
      break;
    case REMAT_DEVICE_KIND_MAX_ENUM:
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown device kind %d (REMAT_DEVICE_SIM or REMAT_DEVICE_CUDA)",
                          static_cast<int>(o.device)));
  }
#if !defined(REMAT_HAVE_CUDA)
  if (spec.kind == remat::DeviceSpec::Kind::kCuda) {
    return absl::FailedPreconditionError(
        "this libremat was built without the CUDA toolkit; only REMAT_DEVICE_SIM is available");
  }
#endif
  return remat::MakeDevice(spec);
}

remat_tensor_state StateOf(remat::TensorState s) {
  switch (s) {
    case remat::TensorState::kResident:
      return REMAT_TENSOR_RESIDENT;
    case remat::TensorState::kOffloading:
      return REMAT_TENSOR_OFFLOADING;
    case remat::TensorState::kOnHost:
      return REMAT_TENSOR_ON_HOST;
    case remat::TensorState::kPrefetching:
      return REMAT_TENSOR_PREFETCHING;
    case remat::TensorState::kDropped:
      return REMAT_TENSOR_DROPPED;
    case remat::TensorState::kFreed:
      return REMAT_TENSOR_FREED;
  }
  return REMAT_TENSOR_FREED;
}

// --- Recompute callbacks -----------------------------------------------------------

// Owns a C callback's user_data: destroy() runs exactly once, when the
// closure holding this goes (or at once, if it is never handed over).
class CCallback {
 public:
  CCallback(remat_recompute_fn fn, void* user_data, void (*destroy)(void*))
      : fn_(fn), call_fn_(nullptr), user_data_(user_data), destroy_(destroy) {}
  CCallback(remat_call_recompute_fn fn, void* user_data, void (*destroy)(void*))
      : fn_(nullptr), call_fn_(fn), user_data_(user_data), destroy_(destroy) {}
  CCallback(const CCallback&) = delete;
  CCallback& operator=(const CCallback&) = delete;
  ~CCallback() {
    if (destroy_ != nullptr) destroy_(user_data_);
  }

  absl::Status Run(const remat::RecomputeArgs& args) const {
    try {
      tls_callback_error.clear();
      const auto stream = static_cast<std::uint64_t>(args.stream.handle);
      int rc = 0;
      if (fn_ != nullptr) {
        rc = fn_(user_data_, args.inputs.data(), args.inputs.size(), args.output, args.bytes,
                 stream);
      } else {
        absl::InlinedVector<int, 4> regenerate(args.regenerate.begin(), args.regenerate.end());
        rc = call_fn_(user_data_, args.inputs.data(), args.inputs.size(), args.outputs.data(),
                      args.output_bytes.data(), regenerate.data(), args.outputs.size(), stream);
      }
      if (rc == 0) return absl::OkStatus();
      std::string message = absl::StrFormat("the recompute callback returned %d", rc);
      if (!tls_callback_error.empty()) absl::StrAppend(&message, ": ", tls_callback_error);
      tls_callback_error.clear();
      return absl::InternalError(message);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("the recompute callback threw: ", e.what()));
    } catch (...) {
      return absl::InternalError("the recompute callback threw");
    }
  }

 private:
  const remat_recompute_fn fn_;            // one output
  const remat_call_recompute_fn call_fn_;  // a call's outputs
  void* const user_data_;
  void (*const destroy_)(void*);
};

// A host function handed to the device: fn(user_data), once.
struct HostFunc {
  void (*fn)(void*);
  void* user_data;
  void operator()() && { fn(user_data); }
};

// remat_tensor_options and remat_call_options share these fields.
//
// Takes user_data's ownership first, so that destroy runs on every path
// (also when creating the holder fails).
template <typename COptions>
remat_status TakeCallback(const char* fn, const COptions* options,
                          std::unique_ptr<CCallback>& callback) {
  if (options == nullptr || (options->recompute == nullptr && options->destroy == nullptr)) {
    return REMAT_OK;
  }
  try {
    callback =
        std::make_unique<CCallback>(options->recompute, options->user_data, options->destroy);
  } catch (...) {
    if (options->destroy != nullptr) options->destroy(options->user_data);
    return Fail(REMAT_OUT_OF_MEMORY, fn, "out of host memory");
  }
  return REMAT_OK;
}

// The runtime's options from the C ones (NULL: the defaults); the closure
// takes `callback` when there is a recompute function.
template <typename COptions>
remat_status ToTensorOptions(const char* fn, const COptions* options,
                             std::unique_ptr<CCallback>& callback, remat::TensorOptions& to) {
  if (options == nullptr) return REMAT_OK;
  if (options->num_inputs > 0 && options->inputs == nullptr) {
    return Fail(REMAT_INVALID_ARGUMENT, fn,
                absl::StrFormat("inputs is NULL but num_inputs is %d", options->num_inputs));
  }
  to.inputs.assign(options->inputs, options->inputs + options->num_inputs);
  to.compute_ns = options->compute_ns;
  to.allow_drop = options->allow_drop != 0;
  to.allow_offload = options->allow_offload != 0;
  to.read_only = options->read_only != 0;
  if (options->recompute != nullptr) {
    to.recompute = [cb = std::move(callback)](const remat::RecomputeArgs& args) {
      return cb->Run(args);
    };
  }
  return REMAT_OK;
}

}  // namespace

// --- Status ---------------------------------------------------------------------------

extern "C" {

const char* remat_last_error(void) {
  if (tls_error_lost) return "(the error message was lost: out of host memory)";
  return tls_last_error.c_str();
}

const char* remat_status_name(remat_status status) {
  switch (status) {
    case REMAT_OK:
      return "REMAT_OK";
    case REMAT_INVALID_ARGUMENT:
      return "REMAT_INVALID_ARGUMENT";
    case REMAT_OUT_OF_MEMORY:
      return "REMAT_OUT_OF_MEMORY";
    case REMAT_NOT_FOUND:
      return "REMAT_NOT_FOUND";
    case REMAT_FAILED_PRECONDITION:
      return "REMAT_FAILED_PRECONDITION";
    case REMAT_INTERNAL:
      return "REMAT_INTERNAL";
    case REMAT_STATUS_MAX_ENUM:
      break;
  }
  return "REMAT_UNKNOWN";
}

const char* remat_version(void) { return REMAT_VERSION_STRING; }
int remat_abi_version(void) { return REMAT_ABI_VERSION; }

void remat_string_free(char* str) { std::free(str); }

// --- Allocator --------------------------------------------------------------------------

remat_status remat_allocator_options_init(remat_allocator_options* options) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (options == nullptr) return NullArgument(fn, "options");
    std::memset(options, 0, sizeof(*options));
    options->device = REMAT_DEVICE_SIM;
    options->cuda_device = 0;
    options->sim_capacity_bytes = 80 * remat::kGiB;
    options->sim_backed = 0;
    options->alloc_conf = nullptr;
    return REMAT_OK;
  });
}

remat_status remat_allocator_create(const remat_allocator_options* options, remat_allocator** out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (out == nullptr) return NullArgument(fn, "out");
    remat_allocator_options o;
    if (options != nullptr) {
      o = *options;
    } else {
      remat_allocator_options_init(&o);
    }
    if (o.cuda_device < 0) {
      return Fail(REMAT_INVALID_ARGUMENT, fn,
                  absl::StrFormat("cuda_device must be >= 0, not %d", o.cuda_device));
    }
    absl::StatusOr<std::unique_ptr<remat::Device>> device = MakeDevice(o);
    if (!device.ok()) return FromStatus(fn, device.status());
    remat::AllocatorOptions ao;
    ao.budget = static_cast<std::size_t>(o.budget_bytes);
    if (o.max_split_bytes != 0) ao.max_split_size = static_cast<std::size_t>(o.max_split_bytes);
    ao.event_ring_capacity = static_cast<std::size_t>(o.history_events);
    if (o.alloc_conf != nullptr) {
      if (absl::Status conf = remat::ApplyAllocConf(o.alloc_conf, &ao); !conf.ok()) {
        return FromStatus(fn, conf);
      }
    }
    auto made = remat::CachingAllocator::Create(device->get(), ao);
    if (!made.ok()) return FromStatus(fn, made.status());
    auto handle = std::make_unique<remat_allocator>();
    handle->device = std::move(*device);
    handle->sim = dynamic_cast<remat::SimDevice*>(handle->device.get());
    handle->allocator = std::move(*made);
    *out = handle.release();
    return REMAT_OK;
  });
}

remat_status remat_allocator_destroy(remat_allocator* allocator) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return REMAT_OK;
    if (allocator->has_runtime.load()) {
      return Fail(REMAT_FAILED_PRECONDITION, fn,
                  "a runtime still uses this allocator; remat_runtime_destroy it first");
    }
    delete allocator;
    return REMAT_OK;
  });
}

remat_status remat_allocate(remat_allocator* allocator, size_t bytes, uint64_t stream, void** out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    if (remat_status st = CheckStream(allocator, fn, stream); st != REMAT_OK) return st;
    absl::StatusOr<void*> p = allocator->allocator->Allocate(bytes, ToStream(stream));
    if (!p.ok()) return FromStatus(fn, p.status());
    *out = *p;
    return REMAT_OK;
  });
}

remat_status remat_deallocate(remat_allocator* allocator, void* ptr) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    return FromStatus(fn, allocator->allocator->Free(ptr));
  });
}

remat_status remat_deallocate_on_stream(remat_allocator* allocator, void* ptr, uint64_t stream) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (remat_status st = CheckStream(allocator, fn, stream); st != REMAT_OK) return st;
    return FromStatus(fn, allocator->allocator->FreeOnStream(ptr, ToStream(stream)));
  });
}

remat_status remat_record_stream(remat_allocator* allocator, void* ptr, uint64_t stream) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (remat_status st = CheckStream(allocator, fn, stream); st != REMAT_OK) return st;
    return FromStatus(fn, allocator->allocator->RecordStream(ptr, ToStream(stream)));
  });
}

remat_status remat_empty_cache(remat_allocator* allocator) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    return FromStatus(fn, allocator->allocator->EmptyCache());
  });
}

remat_status remat_set_budget(remat_allocator* allocator, uint64_t budget_bytes) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    const std::size_t budget =
        budget_bytes == 0 ? allocator->device->Capacity() : static_cast<std::size_t>(budget_bytes);
    return FromStatus(fn, allocator->allocator->SetBudget(budget));
  });
}

remat_status remat_set_max_split(remat_allocator* allocator, uint64_t max_split_bytes) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    const std::size_t bytes = max_split_bytes == 0 || max_split_bytes > SIZE_MAX
                                  ? std::numeric_limits<std::size_t>::max()
                                  : static_cast<std::size_t>(max_split_bytes);
    return FromStatus(fn, allocator->allocator->SetMaxSplitSize(bytes));
  });
}

remat_status remat_get_max_split(remat_allocator* allocator, uint64_t* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    const std::size_t bytes = allocator->allocator->max_split_size();
    *out = bytes == std::numeric_limits<std::size_t>::max() ? 0 : bytes;
    return REMAT_OK;
  });
}

remat_status remat_get_stats(remat_allocator* allocator, remat_stats* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    remat::AllocatorStats s = allocator->allocator->GetStats();
    remat_stats r;
    std::memset(&r, 0, sizeof(r));
    r.allocated_bytes = U64(s.allocated_bytes.all().current);
    r.allocated_bytes_peak = U64(s.allocated_bytes.all().peak);
    r.reserved_bytes = U64(s.reserved_bytes.all().current);
    r.reserved_bytes_peak = U64(s.reserved_bytes.all().peak);
    r.active_bytes = U64(s.active_bytes.all().current);
    r.active_bytes_peak = U64(s.active_bytes.all().peak);
    r.requested_bytes = U64(s.requested_bytes.all().current);
    r.requested_bytes_peak = U64(s.requested_bytes.all().peak);
    r.inactive_split_bytes = U64(s.inactive_split_bytes.all().current);
    r.allocations = U64(s.allocation.all().current);
    r.allocations_peak = U64(s.allocation.all().peak);
    r.segments = U64(s.segment.all().current);
    r.segments_peak = U64(s.segment.all().peak);
    r.num_alloc_retries = U64(s.num_alloc_retries);
    r.num_ooms = U64(s.num_ooms);
    r.num_device_alloc = U64(s.num_device_alloc);
    r.num_device_free = U64(s.num_device_free);
    r.budget_bytes = allocator->allocator->budget();
    r.device_capacity_bytes = allocator->device->Capacity();
    *out = r;
    return REMAT_OK;
  });
}

remat_status remat_reset_peak_stats(remat_allocator* allocator) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    allocator->allocator->ResetPeakStats();
    return REMAT_OK;
  });
}

remat_status remat_end_step(remat_allocator* allocator) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    allocator->allocator->EndStep();
    return REMAT_OK;
  });
}

remat_status remat_snapshot_json(remat_allocator* allocator, char** out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    const std::string json = remat::SnapshotToJson(allocator->allocator->TakeSnapshot());
    char* copy = MallocCopy(json);
    if (copy == nullptr) return Fail(REMAT_OUT_OF_MEMORY, fn, "out of host memory");
    *out = copy;
    return REMAT_OK;
  });
}

remat_status remat_stream_create(remat_allocator* allocator, uint64_t* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    absl::StatusOr<remat::Stream> s = allocator->device->CreateStream();
    if (!s.ok()) return FromStatus(fn, s.status());
    *out = static_cast<std::uint64_t>(s->handle);
    return REMAT_OK;
  });
}

remat_status remat_stream_destroy(remat_allocator* allocator, uint64_t stream) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    return FromStatus(fn, allocator->device->DestroyStream(ToStream(stream)));
  });
}

remat_status remat_stream_synchronize(remat_allocator* allocator, uint64_t stream) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    return FromStatus(fn, allocator->device->SynchronizeStream(ToStream(stream)));
  });
}

remat_status remat_launch_host_func(remat_allocator* allocator, uint64_t stream,
                                    void (*func)(void*), void* user_data, int64_t cost_ns) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (func == nullptr) return NullArgument(fn, "fn");
    if (cost_ns < 0) {
      return Fail(REMAT_INVALID_ARGUMENT, fn,
                  absl::StrFormat("cost_ns must be >= 0, not %d", cost_ns));
    }
    return FromStatus(fn, allocator->device->LaunchHostFunc(ToStream(stream),
                                                            HostFunc{func, user_data}, cost_ns));
  });
}

// --- Runtime -----------------------------------------------------------------------------

remat_status remat_runtime_options_init(remat_runtime_options* options) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (options == nullptr) return NullArgument(fn, "options");
    const remat::RuntimeOptions defaults;
    std::memset(options, 0, sizeof(*options));
    options->policy = nullptr;
    options->enable_drop = defaults.enable_drop ? 1 : 0;
    options->enable_offload = defaults.enable_offload ? 1 : 0;
    options->host_pool_bytes = defaults.host_pool_bytes;
    options->live_budget = defaults.live_budget;
    options->link_gbps = defaults.link_gbps;
    options->link_latency_ns = defaults.link_latency_ns;
    return REMAT_OK;
  });
}

namespace {
remat_status CreateRuntime(const char* fn, remat_allocator* allocator,
                           const remat_runtime_options* options, remat_event_fn on_event,
                           void* user_data, remat_runtime** out);
}  // namespace

remat_status remat_runtime_create_with_options(remat_allocator* allocator,
                                               const remat_runtime_options* options,
                                               remat_runtime** out) {
  return CreateRuntime(__func__, allocator, options, nullptr, nullptr, out);
}

remat_status remat_runtime_create_observed(remat_allocator* allocator,
                                           const remat_runtime_options* options,
                                           remat_event_fn on_event, void* user_data,
                                           remat_runtime** out) {
  return CreateRuntime(__func__, allocator, options, on_event, user_data, out);
}

namespace {
// Errors name the entry point the caller used.
remat_status CreateRuntime(const char* fn, remat_allocator* allocator,
                           const remat_runtime_options* options, remat_event_fn on_event,
                           void* user_data, remat_runtime** out) {
  return Call(fn, [&] {
    if (allocator == nullptr) return NullArgument(fn, "allocator");
    if (out == nullptr) return NullArgument(fn, "out");
    remat_runtime_options o;
    if (options != nullptr) {
      o = *options;
    } else {
      remat_runtime_options_init(&o);
    }
    remat::RuntimeOptions ro;
    if (o.policy != nullptr) ro.policy = o.policy;
    ro.enable_drop = o.enable_drop != 0;
    ro.enable_offload = o.enable_offload != 0;
    ro.host_pool_bytes = static_cast<std::size_t>(o.host_pool_bytes);
    ro.live_budget = static_cast<std::size_t>(o.live_budget);
    ro.keep_addresses = o.keep_addresses != 0;
    ro.learn_next_use = o.learn_next_use != 0;
    ro.copy_ahead = o.copy_ahead != 0;
    ro.estimate_replays = o.estimate_replays != 0;
    // (A bandwidth of 0, as in a struct zeroed by hand: the default. A
    // latency of 0 is one: remat_runtime_options_init gives the default.)
    if (o.link_gbps != 0) ro.link_gbps = o.link_gbps;
    ro.link_latency_ns = o.link_latency_ns;
    if (!(ro.link_gbps > 0) || !std::isfinite(ro.link_gbps) || ro.link_latency_ns < 0) {
      return Fail(REMAT_INVALID_ARGUMENT, fn,
                  absl::StrFormat("the link needs a finite positive bandwidth and a latency of "
                                  "at least 0 (got %g GB/s, %d ns)",
                                  ro.link_gbps, ro.link_latency_ns));
    }
    std::unique_ptr<remat::RuntimeObserver> observer;
    if (on_event != nullptr) {
      observer = std::make_unique<CallbackObserver>(on_event, user_data);
      ro.observer = observer.get();
    }

    bool expected = false;
    if (!allocator->has_runtime.compare_exchange_strong(expected, true)) {
      return Fail(REMAT_FAILED_PRECONDITION, fn,
                  "the allocator already has a runtime (one per allocator)");
    }
    try {
      auto made = remat::Runtime::Create(allocator->allocator.get(), std::move(ro));
      if (!made.ok()) {
        allocator->has_runtime.store(false);
        return FromStatus(fn, made.status());
      }
      auto handle = std::make_unique<remat_runtime>();
      handle->owner = allocator;
      handle->observer = std::move(observer);
      handle->runtime = std::move(*made);
      *out = handle.release();
      return REMAT_OK;
    } catch (...) {
      allocator->has_runtime.store(false);
      throw;
    }
  });
}

}  // namespace

remat_status remat_runtime_create(remat_allocator* allocator, const char* policy_spec,
                                  remat_runtime** out) {
  remat_runtime_options o;
  remat_runtime_options_init(&o);
  o.policy = policy_spec;
  return CreateRuntime(__func__, allocator, &o, nullptr, nullptr, out);
}

remat_status remat_runtime_end_step(remat_runtime* runtime) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (absl::Status st = runtime->runtime->EndStep(); !st.ok()) return FromStatus(fn, st);
    return REMAT_OK;
  });
}

remat_status remat_runtime_set_retry_in_one_place(remat_runtime* runtime, int on) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    runtime->runtime->SetRetryInOnePlace(on != 0);
    return REMAT_OK;
  });
}

remat_status remat_runtime_destroy(remat_runtime* runtime) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return REMAT_OK;
    {
      // Pins go before the runtime they unpin through.
      absl::flat_hash_map<std::uint64_t, std::vector<remat::Guard>> pins;
      {
        remat::MutexLock lock(&runtime->mu);
        pins.swap(runtime->pins);
        runtime->pin_count = 0;
      }
    }
    remat_allocator* owner = runtime->owner;
    runtime->runtime.reset();
    owner->has_runtime.store(false);
    delete runtime;
    return REMAT_OK;
  });
}

remat_status remat_recompute_set_error(const char* message) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (message == nullptr) return NullArgument(fn, "message");
    tls_callback_error = message;
    return REMAT_OK;
  });
}

remat_status remat_tensor_options_init(remat_tensor_options* options) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (options == nullptr) return NullArgument(fn, "options");
    std::memset(options, 0, sizeof(*options));
    options->inputs = nullptr;
    options->recompute = nullptr;
    options->user_data = nullptr;
    options->destroy = nullptr;
    return REMAT_OK;
  });
}

remat_status remat_tensor_create(remat_runtime* runtime, size_t bytes,
                                 const remat_tensor_options* options, uint64_t stream,
                                 uint64_t* id_out, void** ptr_out) {
  const char* const fn = __func__;
  std::unique_ptr<CCallback> callback;
  if (remat_status st = TakeCallback(fn, options, callback); st != REMAT_OK) return st;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (id_out == nullptr) return NullArgument(fn, "id_out");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    remat::TensorOptions to;
    if (remat_status st = ToTensorOptions(fn, options, callback, to); st != REMAT_OK) return st;
    absl::StatusOr<remat::Guard> guard =
        // A temporary takes the closure, so a failed create destroys it (and
        // runs the user's destroy callback) before the error is recorded.
        runtime->runtime->Create(bytes, remat::TensorOptions(std::move(to)), ToStream(stream));
    if (!guard.ok()) return FromStatus(fn, guard.status());
    const std::uint64_t id = guard->id();
    void* const ptr = guard->ptr();
    {
      remat::MutexLock lock(&runtime->mu);
      runtime->pins[id].push_back(std::move(*guard));
      ++runtime->pin_count;
    }
    *id_out = id;
    if (ptr_out != nullptr) *ptr_out = ptr;
    return REMAT_OK;
  });
}

remat_status remat_call_create(remat_runtime* runtime, size_t num_outputs,
                               const size_t* output_bytes, const remat_call_options* options,
                               uint64_t stream, uint64_t* ids_out, void** ptrs_out) {
  const char* const fn = __func__;
  std::unique_ptr<CCallback> callback;
  if (remat_status st = TakeCallback(fn, options, callback); st != REMAT_OK) return st;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (ids_out == nullptr) return NullArgument(fn, "ids_out");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    if (num_outputs == 0) return Fail(REMAT_INVALID_ARGUMENT, fn, "a call needs an output");
    if (output_bytes == nullptr) return NullArgument(fn, "output_bytes");
    remat::TensorOptions to;
    std::vector<remat::OutputSpec> specs;
    for (std::size_t i = 0; i < num_outputs; ++i) specs.push_back({output_bytes[i]});
    if (remat_status st = ToTensorOptions(fn, options, callback, to); st != REMAT_OK) return st;
    absl::StatusOr<absl::InlinedVector<remat::Guard, 4>> guards =
        runtime->runtime->CreateCall(specs, remat::TensorOptions(std::move(to)), ToStream(stream));
    if (!guards.ok()) return FromStatus(fn, guards.status());
    {
      remat::MutexLock lock(&runtime->mu);
      for (std::size_t i = 0; i < num_outputs; ++i) {
        remat::Guard& g = (*guards)[i];
        ids_out[i] = g.id();
        if (ptrs_out != nullptr) ptrs_out[i] = g.ptr();
        runtime->pins[g.id()].push_back(std::move(g));
        ++runtime->pin_count;
      }
    }
    return REMAT_OK;
  });
}

remat_status remat_call_add_output(remat_runtime* runtime, uint64_t sibling, size_t bytes,
                                   int allow_drop, int allow_offload, uint64_t stream,
                                   uint64_t* id_out, void** ptr_out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (id_out == nullptr) return NullArgument(fn, "id_out");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    const remat::OutputSpec spec{
        .bytes = bytes, .allow_drop = allow_drop != 0, .allow_offload = allow_offload != 0};
    absl::StatusOr<remat::Guard> guard =
        runtime->runtime->AddCallOutput(sibling, spec, ToStream(stream));
    if (!guard.ok()) return FromStatus(fn, guard.status());
    *id_out = guard->id();
    if (ptr_out != nullptr) *ptr_out = guard->ptr();
    remat::MutexLock lock(&runtime->mu);
    runtime->pins[guard->id()].push_back(std::move(*guard));
    ++runtime->pin_count;
    return REMAT_OK;
  });
}

remat_status remat_tensor_create_view(remat_runtime* runtime, uint64_t base, uint64_t* id_out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (id_out == nullptr) return NullArgument(fn, "id_out");
    absl::StatusOr<remat::TensorId> id = runtime->runtime->CreateView(base);
    if (!id.ok()) return FromStatus(fn, id.status());
    *id_out = *id;
    return REMAT_OK;
  });
}

namespace {

// remat_tensor_acquire and remat_tensor_refill: the pin the guard holds is
// this API's until the matching remat_tensor_release.
remat_status AcquireWith(
    const char* fn, remat_runtime* runtime, uint64_t id, uint64_t stream, void** ptr_out,
    absl::FunctionRef<absl::StatusOr<remat::Guard>(remat::Runtime&, remat::Stream)> bring) {
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    absl::StatusOr<remat::Guard> guard = bring(*runtime->runtime, ToStream(stream));
    if (!guard.ok()) return FromStatus(fn, guard.status());
    void* const ptr = guard->ptr();
    {
      remat::MutexLock lock(&runtime->mu);
      runtime->pins[id].push_back(std::move(*guard));
      ++runtime->pin_count;
    }
    if (ptr_out != nullptr) *ptr_out = ptr;
    return REMAT_OK;
  });
}

}  // namespace

remat_status remat_tensor_acquire(remat_runtime* runtime, uint64_t id, uint64_t stream,
                                  void** ptr_out) {
  return AcquireWith(__func__, runtime, id, stream, ptr_out,
                     [id](remat::Runtime& r, remat::Stream st) { return r.Acquire(id, st); });
}

remat_status remat_tensor_refill(remat_runtime* runtime, uint64_t id, uint64_t stream,
                                 void** ptr_out) {
  return AcquireWith(__func__, runtime, id, stream, ptr_out,
                     [id](remat::Runtime& r, remat::Stream st) { return r.Refill(id, st); });
}

remat_status remat_tensor_release(remat_runtime* runtime, uint64_t id) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    remat::Guard guard;
    {
      remat::MutexLock lock(&runtime->mu);
      auto it = runtime->pins.find(id);
      if (it != runtime->pins.end()) {
        guard = std::move(it->second.back());
        it->second.pop_back();
        if (it->second.empty()) runtime->pins.erase(it);
        --runtime->pin_count;
      }
    }
    if (!guard) {
      absl::StatusOr<remat::TensorState> state = runtime->runtime->State(id);
      if (!state.ok()) return FromStatus(fn, state.status());
      return Fail(REMAT_FAILED_PRECONDITION, fn,
                  absl::StrFormat("tensor %d is not pinned through this API (a release must "
                                  "follow remat_tensor_create, remat_tensor_acquire or "
                                  "remat_tensor_refill)",
                                  id));
    }
    guard.Release();  // outside our lock: it takes the runtime's
    return REMAT_OK;
  });
}

remat_status remat_tensor_free(remat_runtime* runtime, uint64_t id) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    return FromStatus(fn, runtime->runtime->Free(id));
  });
}

remat_status remat_tensor_prefetch(remat_runtime* runtime, uint64_t id, uint64_t stream) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    return FromStatus(fn, runtime->runtime->Prefetch(id, ToStream(stream)));
  });
}

remat_status remat_tensor_evict(remat_runtime* runtime, uint64_t id, remat_evict_action action,
                                uint64_t stream, int* evicted_out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (action != REMAT_EVICT_DROP && action != REMAT_EVICT_OFFLOAD) {
      return FromStatus(fn, absl::InvalidArgumentError(absl::StrFormat(
                                "unknown action %d (REMAT_EVICT_DROP or REMAT_EVICT_OFFLOAD)",
                                static_cast<int>(action))));
    }
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    absl::StatusOr<bool> evicted = runtime->runtime->Evict(
        id, action == REMAT_EVICT_DROP ? remat::policies::EvictAction::kDrop
                                       : remat::policies::EvictAction::kOffload,
        ToStream(stream));
    if (!evicted.ok()) return FromStatus(fn, evicted.status());
    if (evicted_out != nullptr) *evicted_out = *evicted ? 1 : 0;
    return REMAT_OK;
  });
}

remat_status remat_runtime_evict_bytes(remat_runtime* runtime, uint64_t bytes, uint64_t stream,
                                       uint64_t* freed_out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (remat_status st = CheckStream(runtime->owner, fn, stream); st != REMAT_OK) return st;
    absl::StatusOr<std::size_t> freed =
        runtime->runtime->EvictBytes(static_cast<std::size_t>(bytes), ToStream(stream));
    if (!freed.ok()) return FromStatus(fn, freed.status());
    if (freed_out != nullptr) *freed_out = *freed;
    return REMAT_OK;
  });
}

remat_status remat_tensor_get_state(remat_runtime* runtime, uint64_t id, remat_tensor_state* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (out == nullptr) return NullArgument(fn, "out");
    absl::StatusOr<remat::TensorState> state = runtime->runtime->State(id);
    if (!state.ok()) return FromStatus(fn, state.status());
    *out = StateOf(*state);
    return REMAT_OK;
  });
}

remat_status remat_runtime_get_stats(remat_runtime* runtime, remat_runtime_stats* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (out == nullptr) return NullArgument(fn, "out");
    const remat::RuntimeStats s = runtime->runtime->stats();
    remat_runtime_stats r;
    std::memset(&r, 0, sizeof(r));
    r.tensors_created = s.tensors_created;
    r.live_tensors = s.live_tensors;
    r.pressure_events = s.pressure_events;
    r.drops = s.drops;
    r.released_drops = s.released_drops;
    r.offloads = s.offloads;
    r.recomputes = s.recomputes;
    r.recompute_ns = s.recompute_ns;
    r.offloaded_bytes = s.offloaded_bytes;
    r.restored_bytes = s.restored_bytes;
    r.prefetches = s.prefetches;
    r.resident_bytes = s.resident_bytes;
    r.peak_resident_bytes = s.peak_resident_bytes;
    {
      remat::MutexLock lock(&runtime->mu);
      r.pinned_by_api = runtime->pin_count;
      r.learned_next_uses = s.learned_next_uses;
      r.steps_ended = s.steps_ended;
      r.copies_ahead = s.copies_ahead;
      r.ahead_offloads = s.ahead_offloads;
      r.refills = s.refills;
    }
    *out = r;
    return REMAT_OK;
  });
}

// --- Step planner -------------------------------------------------------------------

remat_status remat_planner_options_init(remat_planner_options* options) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (options == nullptr) return NullArgument(fn, "options");
    const remat::StepPlannerOptions defaults;
    options->learning_steps = defaults.learning_steps;
    options->timed_steps = defaults.timed_steps;
    options->in_one_place_after_failure = defaults.in_one_place_after_failure ? 1 : 0;
    options->split_limit_halvings_after_failure = defaults.split_limit_halvings_after_failure;
    return REMAT_OK;
  });
}

remat_status remat_planner_create(const remat_plan* plans, size_t num_plans,
                                  const remat_planner_options* options, remat_planner** out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (out == nullptr) return NullArgument(fn, "out");
    if (plans == nullptr && num_plans != 0) return NullArgument(fn, "plans");
    std::vector<remat::PlanSpec> specs;
    for (size_t i = 0; i < num_plans; ++i) {
      const remat_plan& p = plans[i];
      if (p.name == nullptr) return NullArgument(fn, "a plan's name");
      if (p.policy_spec == nullptr) return NullArgument(fn, "a plan's policy_spec");
      specs.push_back(remat::PlanSpec{p.name, p.policy_spec, p.allow_drop != 0,
                                      p.allow_offload != 0, p.drop_first != 0});
    }
    remat::StepPlannerOptions o;
    if (options != nullptr) {
      o.learning_steps = options->learning_steps;
      o.timed_steps = options->timed_steps;
      o.in_one_place_after_failure = options->in_one_place_after_failure != 0;
      o.split_limit_halvings_after_failure = options->split_limit_halvings_after_failure;
    }
    absl::StatusOr<remat::StepPlanner> made = remat::StepPlanner::Create(std::move(specs), o);
    if (!made.ok()) return FromStatus(fn, made.status());
    *out = new remat_planner(std::move(*made));
    return REMAT_OK;
  });
}

remat_status remat_planner_destroy(remat_planner* planner) {
  delete planner;
  return REMAT_OK;
}

remat_status remat_planner_step_begin(remat_planner* planner, remat_planner_step* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    if (out == nullptr) return NullArgument(fn, "out");
    remat::MutexLock lock(&planner->mu);
    absl::StatusOr<remat::StepPlanner::Step> step = planner->planner.Begin();
    if (!step.ok()) return FromStatus(fn, step.status());
    out->plan = step->plan;
    out->timed = step->timed ? 1 : 0;
    out->in_trial = step->in_trial ? 1 : 0;
    out->fresh_runtime = step->fresh_runtime ? 1 : 0;
    out->in_one_place = step->in_one_place ? 1 : 0;
    out->split_limit_halvings = step->split_limit_halvings;
    return REMAT_OK;
  });
}

remat_status remat_planner_step_end(remat_planner* planner, remat_step_outcome outcome,
                                    int64_t elapsed_ns, const char* message) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    remat::StepOutcome o;
    switch (outcome) {
      case REMAT_STEP_FIT:
        o = remat::StepOutcome::kFit;
        break;
      case REMAT_STEP_TOO_SMALL:
        o = remat::StepOutcome::kTooSmall;
        break;
      case REMAT_STEP_ABANDONED:
        o = remat::StepOutcome::kAbandoned;
        break;
      case REMAT_STEP_TOO_SLOW:
        o = remat::StepOutcome::kTooSlow;
        break;
      case REMAT_STEP_OUTCOME_MAX_ENUM:
      default:
        return Fail(REMAT_INVALID_ARGUMENT, fn,
                    absl::StrFormat("unknown step outcome %d", static_cast<int>(outcome)));
    }
    remat::MutexLock lock(&planner->mu);
    return FromStatus(fn, planner->planner.End(o, elapsed_ns, message == nullptr ? "" : message));
  });
}

remat_status remat_planner_runtime_restarted(remat_planner* planner, size_t plan) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    remat::MutexLock lock(&planner->mu);
    return FromStatus(fn, planner->planner.RuntimeRestarted(plan));
  });
}

remat_status remat_planner_get_state(remat_planner* planner, remat_planner_state* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    if (out == nullptr) return NullArgument(fn, "out");
    remat::MutexLock lock(&planner->mu);
    const remat::StepPlanner& p = planner->planner;
    remat_planner_state s;
    std::memset(&s, 0, sizeof(s));
    s.num_plans = p.num_plans();
    s.in_trial = p.in_trial() ? 1 : 0;
    s.trial_done = p.trial_done() ? 1 : 0;
    s.kept_plan = p.kept().value_or(0);
    s.steps_ended = p.steps_ended();
    *out = s;
    return REMAT_OK;
  });
}

remat_status remat_planner_get_plan(remat_planner* planner, size_t plan, remat_plan_state* out,
                                    int64_t* times_ns, size_t times_capacity, char** refusal) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    if (out == nullptr) return NullArgument(fn, "out");
    remat::MutexLock lock(&planner->mu);
    const remat::StepPlanner& p = planner->planner;
    if (plan >= p.num_plans()) {
      return Fail(REMAT_INVALID_ARGUMENT, fn,
                  absl::StrFormat("no plan %d: the planner has %d", plan, p.num_plans()));
    }
    char* text = nullptr;
    if (refusal != nullptr && p.refused(plan)) {
      text = MallocCopy(p.refusal(plan));
      if (text == nullptr) return Fail(REMAT_OUT_OF_MEMORY, fn, "out of host memory");
    }
    remat_plan_state s;
    std::memset(&s, 0, sizeof(s));
    s.live = p.live(plan) ? 1 : 0;
    s.refused = p.refused(plan) ? 1 : 0;
    s.blind = p.blind(plan) ? 1 : 0;
    s.learns_fits = p.learns_fits(plan) ? 1 : 0;
    s.runtime_steps = p.runtime_steps(plan);
    absl::Span<const std::int64_t> times = p.times_ns(plan);
    s.num_times = times.size();
    if (times_ns != nullptr) {
      std::copy_n(times.begin(), std::min(times.size(), times_capacity), times_ns);
    }
    *out = s;
    if (refusal != nullptr) *refusal = text;
    return REMAT_OK;
  });
}

remat_status remat_planner_saw_replay(remat_planner* planner, uint64_t kind, uint64_t bytes,
                                      int fit) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    remat::MutexLock lock(&planner->mu);
    return FromStatus(fn, planner->planner.SawReplay(kind, bytes, fit != 0));
  });
}

remat_status remat_planner_saw_pinned(remat_planner* planner, uint64_t kind, uint64_t bytes,
                                      uint64_t pinned_bytes) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    remat::MutexLock lock(&planner->mu);
    return FromStatus(fn, planner->planner.SawPinned(kind, bytes, pinned_bytes));
  });
}

remat_status remat_planner_kind_seen(remat_planner* planner, uint64_t kind, uint64_t bytes,
                                     remat_kind_seen* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    if (out == nullptr) return NullArgument(fn, "out");
    remat::MutexLock lock(&planner->mu);
    absl::StatusOr<remat::StepPlanner::Seen> seen = planner->planner.Lookup(kind, bytes);
    if (!seen.ok()) return FromStatus(fn, seen.status());
    out->seen_to_fit = seen->seen_to_fit ? 1 : 0;
    out->seen_to_fail = seen->seen_to_fail ? 1 : 0;
    out->pinned_beside = seen->pinned_beside;
    return REMAT_OK;
  });
}

remat_status remat_runtime_estimate_replay(remat_runtime* runtime, const uint64_t* inputs,
                                           size_t num_inputs, uint64_t bytes,
                                           uint64_t out[REMAT_REPLAY_DEPTH + 1]) {
  const char* const fn = __func__;
  static_assert(REMAT_REPLAY_DEPTH == remat::kReplayDepth);
  return Call(fn, [&] {
    if (runtime == nullptr) return NullArgument(fn, "runtime");
    if (out == nullptr) return NullArgument(fn, "out");
    if (inputs == nullptr && num_inputs != 0) return NullArgument(fn, "inputs");
    absl::StatusOr<remat::ReplayEstimate> e = runtime->runtime->EstimateReplay(
        absl::MakeConstSpan(inputs, num_inputs), static_cast<std::size_t>(bytes));
    if (!e.ok()) return FromStatus(fn, e.status());
    std::copy(e->begin(), e->end(), out);
    return REMAT_OK;
  });
}

remat_status remat_planner_admit_drop(remat_planner* planner, uint64_t kind, uint64_t bytes,
                                      const uint64_t* replay_bytes, size_t num_replay_bytes,
                                      uint64_t room, remat_drop_admission* out) {
  const char* const fn = __func__;
  return Call(fn, [&] {
    if (planner == nullptr) return NullArgument(fn, "planner");
    if (out == nullptr) return NullArgument(fn, "out");
    if (replay_bytes == nullptr) return NullArgument(fn, "replay_bytes");
    if (num_replay_bytes != remat::kReplayDepth + 1) {
      return Fail(REMAT_INVALID_ARGUMENT, fn,
                  absl::StrFormat("replay_bytes has %d entries, not REMAT_REPLAY_DEPTH + 1 (%d)",
                                  num_replay_bytes, remat::kReplayDepth + 1));
    }
    remat::ReplayEstimate replay;
    std::copy_n(replay_bytes, replay.size(), replay.begin());
    remat::MutexLock lock(&planner->mu);
    absl::StatusOr<remat::StepPlanner::Admission> a =
        planner->planner.AdmitDrop(kind, bytes, replay, room);
    if (!a.ok()) return FromStatus(fn, a.status());
    switch (a->verdict) {
      case remat::StepPlanner::DropVerdict::kDrop:
        out->verdict = REMAT_DROP;
        break;
      case remat::StepPlanner::DropVerdict::kOffloadOverShare:
        out->verdict = REMAT_OFFLOAD_OVER_SHARE;
        break;
      case remat::StepPlanner::DropVerdict::kOffloadBesidePinned:
        out->verdict = REMAT_OFFLOAD_BESIDE_PINNED;
        break;
      case remat::StepPlanner::DropVerdict::kOffloadSeenToFail:
        out->verdict = REMAT_OFFLOAD_SEEN_TO_FAIL;
        break;
    }
    out->copy_first = a->copy_first ? 1 : 0;
    return REMAT_OK;
  });
}

}  // extern "C"

namespace remat::c_api_testing {

absl::Status CheckInvariants(const remat_allocator* allocator, const remat_runtime* runtime) {
  if (allocator == nullptr) return absl::InvalidArgumentError("no allocator");
  if (absl::Status s = allocator->allocator->CheckInvariants(); !s.ok()) return s;
  if (runtime == nullptr) return absl::OkStatus();
  if (runtime->owner != allocator) {
    return absl::InvalidArgumentError("the runtime was not created over this allocator");
  }
  return runtime->runtime->CheckInvariants();
}

}  // namespace remat::c_api_testing
