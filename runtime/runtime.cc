// The public calls, construction, the lock, pins and collection. The rest
// of the Runtime's member functions live beside this file by job:
// runtime_state.cc (state changes), runtime_recompute.cc (regeneration),
// runtime_evict.cc (pressure and candidates), runtime_transfer.cc (copies
// and blocks), runtime_check.cc (diagnostics and invariants).
#include "runtime/runtime.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/units.h"
#include "base/status_macros.h"
#include "policies/registry.h"
#include "runtime/runtime_internal.h"

namespace remat {

const char* TensorEventName(TensorEvent::Kind kind) {
  switch (kind) {
    case TensorEvent::Kind::kCreated: return "created";
    case TensorEvent::Kind::kDropped: return "dropped";
    case TensorEvent::Kind::kOffloaded: return "offloaded";
    case TensorEvent::Kind::kCopiedAhead: return "copied_ahead";
    case TensorEvent::Kind::kRestored: return "restored";
    case TensorEvent::Kind::kRecomputed: return "recomputed";
    case TensorEvent::Kind::kCollected: return "collected";
  }
  return "?";
}

void Runtime::Tell(const Storage* s, TensorEvent event) {
  event.tensor = s->FirstId();
  event.bytes = s->bytes;
  event.directed = directing_ && event.pressure;
  options_.observer->OnTensor(event);
}

const char* TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kResident: return "resident";
    case TensorState::kOffloading: return "offloading";
    case TensorState::kOnHost: return "on_host";
    case TensorState::kPrefetching: return "prefetching";
    case TensorState::kDropped: return "dropped";
    case TensorState::kFreed: return "freed";
  }
  return "?";
}

// The runtime's lock, remembering which runtime the thread holds: the
// pressure handler runs on the thread that asked the allocator for memory,
// which usually is inside the runtime already.
namespace {
thread_local const void* tls_held_runtime = nullptr;

// A policy's prefetch lead, as a number the runtime can use: not negative,
// not NaN, at most 1e6 times the copy's time.
double SaneLead(double lead) {
  if (!(lead >= 0)) return 0;
  return std::min(lead, 1e6);
}

// Where nothing can be returned (the destructor), a failure is logged.
void LogIfError(const absl::Status& status, const char* what) {
  if (!status.ok()) REMAT_LOG(kWarning, "runtime: %s: %s", what, status.ToString());
}
}  // namespace

class ABSL_SCOPED_LOCKABLE Runtime::Lock {
 public:
  explicit Lock(const Runtime* r) ABSL_EXCLUSIVE_LOCK_FUNCTION(r->mu_) : r_(r) {
    r_->mu_.Lock();
    previous_ = tls_held_runtime;
    tls_held_runtime = r_;
  }
  ~Lock() ABSL_UNLOCK_FUNCTION() {
    tls_held_runtime = previous_;
    r_->mu_.Unlock();
  }

 private:
  const Runtime* r_;
  const void* previous_;
};

Runtime::Unlocked::Unlocked(const Runtime* r) ABSL_NO_THREAD_SAFETY_ANALYSIS
    : r_(r), previous_(tls_held_runtime) {
  tls_held_runtime = nullptr;
  r_->mu_.Unlock();
}

Runtime::Unlocked::~Unlocked() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  r_->mu_.Lock();
  tls_held_runtime = previous_;
}

// --- Guard ----------------------------------------------------------------------

Guard::Guard(Guard&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)),
      id_(other.id_),
      ptr_(other.ptr_),
      storage_(other.storage_) {}

Guard& Guard::operator=(Guard&& other) noexcept {
  if (this != &other) {
    Release();
    runtime_ = std::exchange(other.runtime_, nullptr);
    id_ = other.id_;
    ptr_ = other.ptr_;
    storage_ = other.storage_;
  }
  return *this;
}

Guard::~Guard() { Release(); }

void Guard::Release() {
  if (runtime_ != nullptr) std::exchange(runtime_, nullptr)->Unpin(storage_);
}

// --- Construction -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(CachingAllocator* allocator,
                                                         RuntimeOptions options) {
  if (allocator == nullptr) return absl::InvalidArgumentError("Runtime needs an allocator");
  if (!(options.link_gbps > 0) || options.link_latency_ns < 0) {
    return absl::InvalidArgumentError("link bandwidth must be positive and latency >= 0");
  }
  if (options.thread_safe && !allocator->options().thread_safe) {
    return absl::InvalidArgumentError(
        "a thread-safe runtime needs a thread-safe allocator (AllocatorOptions::thread_safe)");
  }
  if (options.keep_addresses && !allocator->options().expandable_segments) {
    return absl::InvalidArgumentError(
        "keep_addresses needs an allocator with expandable segments (expandable_segments:True)");
  }
  std::shared_ptr<policies::EvictionPolicy> policy = options.custom_policy;
  if (policy == nullptr) {
    REMAT_ASSIGN_OR_RETURN(policy, options.policy.Make());
  }
  // Copies out and copies in go on streams of their own, as a GPU's two copy
  // engines run them: a prefetch does not queue behind the offloads.
  REMAT_ASSIGN_OR_RETURN(const Stream copy_stream, allocator->device()->CreateStream());
  absl::StatusOr<Stream> prefetch_stream = allocator->device()->CreateStream();
  if (!prefetch_stream.ok()) {
    LogIfError(allocator->device()->DestroyStream(copy_stream), "destroying the copy stream");
    return prefetch_stream.status();
  }
  std::unique_ptr<Runtime> runtime(new Runtime(allocator, std::move(options), std::move(policy),
                                               copy_stream, *prefetch_stream));
  allocator->SetPressureHandler(
      [r = runtime.get()](const PressureRequest& request) { return r->OnPressure(request); });
  return runtime;
}

Runtime::Runtime(CachingAllocator* allocator, RuntimeOptions options,
                 std::shared_ptr<policies::EvictionPolicy> policy, Stream copy_stream,
                 Stream prefetch_stream)
    : allocator_(allocator),
      device_(allocator->device()),
      options_(std::move(options)),
      policy_(std::move(policy)),
      copy_stream_(copy_stream),
      prefetch_stream_(prefetch_stream),
      track_classes_(policy_->needs().classes),
      prefetch_window_ns_(std::max<std::int64_t>(policy_->prefetch_window_ns(), 0)),
      prefetch_lead_(SaneLead(policy_->prefetch_lead())),
      mu_(options_.thread_safe),
      retry_in_one_place_(options_.retry_in_one_place),
      link_(options_.link_gbps, options_.link_latency_ns),
      events_(allocator->device()),
      host_pool_(allocator->device(), options_.host_pool_bytes) {}

Runtime::~Runtime() {
  allocator_->SetPressureHandler(nullptr);
  Lock lock(this);
  // A destructor returns nothing: failures are logged. After the sync no
  // work is left that a block or buffer given back could race with.
  LogIfError(device_->Synchronize(), "synchronizing before destruction");
  for (const auto& s : storages_.all()) {
    if (s->device != nullptr) LogIfError(allocator_->Free(s->device), "freeing a block");
    if (s->kept != nullptr) LogIfError(allocator_->Free(s->kept), "freeing a kept block");
    for (void* host : {s->host, s->ahead}) {
      if (host != nullptr) {
        LogIfError(host_pool_.FreeAfter(host, copy_stream_), "returning a host buffer");
      }
    }
    // Their events go back, so that DestroyAll destroys them.
    if (s->ahead != nullptr) events_.Give(s->ahead_event);
    if (s->copy_in_flight) events_.Give(s->copy_event);
  }
  events_.DestroyAll();
  LogIfError(device_->DestroyStream(copy_stream_), "destroying the copy stream");
  LogIfError(device_->DestroyStream(prefetch_stream_), "destroying the prefetch stream");
}

// --- Tensors ---------------------------------------------------------------------

absl::Status Runtime::NotLive(TensorId id) const {
  if (!tensors_.Issued(id)) {
    return absl::NotFoundError(absl::StrFormat("tensor %d does not exist", id));
  }
  // An id whose page was given back was freed and collected.
  return absl::FailedPreconditionError(absl::StrFormat("tensor %d was freed", id));
}

TensorId Runtime::NewTensorId(Storage* s) {
  const TensorId id = tensors_.NewId(s);
  s->tensor_ids.push_back(id);
  return id;
}

absl::Status Runtime::CheckInputs(const TensorOptions& options) {
  if (options.allow_drop && !options.recompute) {
    return absl::InvalidArgumentError("a tensor that may be dropped needs a recompute closure");
  }
  if (options.compute_ns < 0) return absl::InvalidArgumentError("compute_ns must be >= 0");
  checked_inputs_.clear();
  for (TensorId in : options.inputs) {
    Storage* s = LiveOrNull(in);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("input of the new tensor: %s", NotLive(in).message()));
    }
    checked_inputs_.push_back(s);
  }
  return absl::OkStatus();
}

Runtime::Storage* Runtime::AddStorage(std::size_t bytes, void* ptr, std::uint64_t serial,
                                      bool may_drop, bool may_offload,
                                      const TensorOptions& options, Stream stream) {
  Storage* s = storages_.Take();
  s->serial = serial;
  s->bytes = bytes;
  s->round_trip_ns = link_.RoundTripNs(bytes);
  s->may_drop = may_drop;
  s->may_offload = may_offload;
  s->compute_ns = options.compute_ns;
  s->read_only = options.read_only;
  s->evictable = bytes > 0 && (s->may_drop || s->may_offload);
  if (s->may_drop) {
    // Only a closure that may run again keeps its inputs alive (with drops
    // disabled, none will: a released input then goes at once).
    // (CheckInputs found them live; the owner cannot have freed them since,
    // as the lock has been held throughout.)
    s->inputs.assign(checked_inputs_.begin(), checked_inputs_.end());
    for (Storage* in : s->inputs) {
      ++in->dependents;
      in->consumers.push_back(s);
      if (in->state == TensorState::kDropped) ++s->dropped_inputs;
    }
  }
  if (options_.estimate_replays) {
    const ReplayEstimate estimate = EstimateOver(checked_inputs_, bytes);
    if (free_estimates_.empty()) {
      s->replay_estimate = static_cast<std::uint32_t>(replay_estimates_.size());
      replay_estimates_.push_back(estimate);
    } else {
      s->replay_estimate = free_estimates_.back();
      free_estimates_.pop_back();
      replay_estimates_[s->replay_estimate] = estimate;
    }
  }
  NewTensorId(s);
  s->handles = 1;
  s->pins = 1;
  s->used_streams.push_back(stream);
  s->last_access_ns = s->first_access_ns = Clock();
  s->accesses = 1;
  if (options_.learn_next_use && runtime_internal::closures_running == 0) {
    LearnUse(s, /*created=*/true);
  }
  SetResident(s, ptr);
  ++stats_.tensors_created;
  ++stats_.live_tensors;
  if (options_.observer != nullptr) Tell(s, {.kind = TensorEvent::Kind::kCreated});
  return s;
}

absl::StatusOr<Guard> Runtime::Create(std::size_t bytes, TensorOptions&& options, Stream stream) {
  Lock lock(this);
  REMAT_RETURN_IF_ERROR(CheckInputs(options));
  // The block is tagged with the serial as it is allocated; a failed Create
  // uses none up (nothing else takes one meanwhile: eviction makes no storage).
  const std::uint64_t serial = next_serial_;
  REMAT_ASSIGN_OR_RETURN(void* const ptr, AllocateDevice(bytes, stream, serial));
  ++next_serial_;
  work_ns_ = AddTimes(work_ns_, options.compute_ns);  // its outputs are made once the call has run
  const bool may_drop =
      options_.enable_drop && options.allow_drop && static_cast<bool>(options.recompute);
  Storage* s = AddStorage(bytes, ptr, serial, may_drop,
                          options_.enable_offload && options.allow_offload, options, stream);
  s->recompute = std::move(options.recompute);
  MaybePrefetchDue(stream);
  MaybeCopyAhead();
  return Guard(this, s->tensor_ids.front(), ptr, s);
}

absl::StatusOr<absl::InlinedVector<Guard, 4>> Runtime::CreateCall(
    absl::Span<const OutputSpec> outputs, TensorOptions&& options, Stream stream) {
  if (outputs.empty()) return absl::InvalidArgumentError("a call needs at least one output");
  if (outputs.size() > UINT32_MAX) return absl::InvalidArgumentError("too many outputs");
  Lock lock(this);
  REMAT_RETURN_IF_ERROR(CheckInputs(options));
  // All outputs' blocks first (serials in order, none used up on failure);
  // the ones allocated count as live while the rest are.
  absl::InlinedVector<void*, 4> ptrs;
  std::size_t pending = 0;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    absl::StatusOr<void*> ptr = AllocateDevice(outputs[i].bytes, stream, next_serial_ + i);
    if (!ptr.ok()) {
      for (void* p : ptrs) FreeBlockOnError(p, stream);
      pending_live_bytes_ -= pending;
      return ptr.status();
    }
    ptrs.push_back(*ptr);
    pending += outputs[i].bytes;
    pending_live_bytes_ += outputs[i].bytes;
  }
  pending_live_bytes_ -= pending;
  work_ns_ = AddTimes(work_ns_, options.compute_ns);
  CallGroup* group = outputs.size() > 1 ? groups_.Take() : nullptr;
  absl::InlinedVector<Guard, 4> guards;
  Storage* first = nullptr;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const bool may_drop = options_.enable_drop && options.allow_drop && outputs[i].allow_drop &&
                          static_cast<bool>(options.recompute);
    const bool may_offload =
        options_.enable_offload && options.allow_offload && outputs[i].allow_offload;
    Storage* s = AddStorage(outputs[i].bytes, ptrs[i], next_serial_++, may_drop, may_offload,
                            options, stream);
    if (group != nullptr) {
      s->group = group;
      s->output_index = static_cast<std::uint32_t>(i);
      group->outputs.push_back(s);
      ++group->uncollected;
    }
    s->call_closure = true;
    if (first == nullptr) first = s;
    guards.push_back(Guard(this, s->tensor_ids.front(), ptrs[i], s));
  }
  (group != nullptr ? group->recompute : first->recompute) = std::move(options.recompute);
  MaybePrefetchDue(stream);
  MaybeCopyAhead();
  return guards;
}

absl::StatusOr<Guard> Runtime::AddCallOutput(TensorId sibling, const OutputSpec& spec,
                                             Stream stream) {
  Lock lock(this);
  Storage* sib = LiveOrNull(sibling);
  if (sib == nullptr) return NotLive(sibling);
  if (!sib->call_closure) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor %d was made alone (Create, remat_tensor_create), with a closure that writes one "
        "output: make its call with CreateCall (remat_call_create) to add outputs to it",
        sibling));
  }
  CallGroup* group = sib->group;
  if (group == nullptr ? sib->regen_owner != nullptr
                       : std::any_of(group->outputs.begin(), group->outputs.end(),
                                     [](const Storage* m) {
                                       return m != nullptr && m->regen_owner != nullptr;
                                     })) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the call of tensor %d is being regenerated: add its outputs before or after", sibling));
  }
  if (group != nullptr && group->outputs.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError("too many outputs");
  }
  const std::uint64_t serial = next_serial_;
  // Pressure may evict the sibling here, never collect it (the owner holds
  // it), nor its inputs (it keeps them while it may be dropped).
  REMAT_ASSIGN_OR_RETURN(void* const ptr, AllocateDevice(spec.bytes, stream, serial));
  ++next_serial_;
  if (group == nullptr) {
    // The call had one output: it becomes a group, closure and all.
    group = groups_.Take();
    group->recompute = std::move(sib->recompute);
    sib->recompute = nullptr;
    group->outputs.push_back(sib);
    group->uncollected = 1;
    group->dropped = sib->state == TensorState::kDropped ? 1 : 0;
    sib->group = group;
    sib->output_index = 0;
  }
  // The call's inputs: the sibling's (kept only while it may be dropped,
  // which is what a drop of the new output needs).
  checked_inputs_.assign(sib->inputs.begin(), sib->inputs.end());
  TensorOptions options;
  options.compute_ns = sib->compute_ns;
  options.read_only = sib->read_only;
  const bool may_drop = sib->may_drop && spec.allow_drop;
  const bool may_offload = sib->may_offload && spec.allow_offload;
  Storage* s = AddStorage(spec.bytes, ptr, serial, may_drop, may_offload, options, stream);
  s->call_closure = true;
  s->group = group;
  s->output_index = static_cast<std::uint32_t>(group->outputs.size());
  group->outputs.push_back(s);
  ++group->uncollected;
  MaybePrefetchDue(stream);
  MaybeCopyAhead();
  return Guard(this, s->tensor_ids.front(), ptr, s);
}

absl::StatusOr<ReplayEstimate> Runtime::EstimateReplay(absl::Span<const TensorId> inputs,
                                                        std::size_t bytes) {
  Lock lock(this);
  if (!options_.estimate_replays) {
    return absl::FailedPreconditionError(
        "this runtime keeps no replay estimates: make it with estimate_replays");
  }
  absl::InlinedVector<Storage*, 8> storages;
  for (TensorId in : inputs) {
    Storage* s = LiveOrNull(in);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("input of the replay: %s", NotLive(in).message()));
    }
    if (std::find(storages.begin(), storages.end(), s) != storages.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %d is an input twice (or two views of one storage)", in));
    }
    storages.push_back(s);
  }
  return EstimateOver(storages, bytes);
}

ReplayEstimate Runtime::EstimateOver(absl::Span<Storage* const> given, std::size_t bytes) const {
  // Each storage once (a call may read one twice: Create allows it).
  absl::InlinedVector<Storage*, 8> inputs;
  for (Storage* s : given) {
    if (std::find(inputs.begin(), inputs.end(), s) == inputs.end()) inputs.push_back(s);
  }
  // (Saturating sums: the figures are compared with a budget, never wrap.)
  auto add = [](std::uint64_t a, std::uint64_t b) {
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
  };
  std::uint64_t held = 0;  // brought back before the next dropped input
  bool any_dropped = false;
  std::array<std::uint64_t, kReplayDepth> deeper{};  // level k+1's worst over the inputs
  absl::InlinedVector<const CallGroup*, 4> counted;  // calls whose other outputs are counted
  for (const Storage* in : inputs) {
    if (!in->may_drop) continue;
    // Its run regenerates its call's other live outputs with it, beside it.
    std::uint64_t siblings = 0;
    if (in->group != nullptr &&
        std::find(counted.begin(), counted.end(), in->group) == counted.end()) {
      counted.push_back(in->group);
      for (const Storage* m : in->group->outputs) {
        if (m != nullptr && m->handles > 0 &&
            std::find(inputs.begin(), inputs.end(), m) == inputs.end()) {
          siblings = add(siblings, m->bytes);
        }
      }
    }
    static constexpr ReplayEstimate kNone{};
    const ReplayEstimate& below = in->replay_estimate == Storage::kNoEstimate
                                      ? kNone
                                      : replay_estimates_[in->replay_estimate];
    for (std::size_t k = 0; k < kReplayDepth; ++k) {
      deeper[k] = std::max(deeper[k], add(add(held, siblings), below[k]));
    }
    any_dropped = true;
    held = add(held, in->bytes);
  }
  // The resident inputs, pinned; the output beside them all.
  for (const Storage* in : inputs) {
    if (!in->may_drop) held = add(held, in->bytes);
  }
  ReplayEstimate out;
  out[0] = add(held, bytes);
  for (std::size_t k = 0; k < kReplayDepth; ++k) {
    out[k + 1] = any_dropped ? std::max(out[0], deeper[k]) : out[0];
  }
  return out;
}

absl::StatusOr<TensorId> Runtime::CreateView(TensorId base) {
  Lock lock(this);
  Storage* s = LiveOrNull(base);
  if (s == nullptr) return NotLive(base);
  const TensorId id = NewTensorId(s);
  ++s->handles;
  ++stats_.tensors_created;
  ++stats_.live_tensors;
  return id;
}

absl::StatusOr<Guard> Runtime::Acquire(TensorId id, Stream stream) {
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  Pin(s);  // first: bringing it back may wait, unlocked, for another thread
  if (s->state != TensorState::kResident) {  // (the common case needs no call)
    if (absl::Status st = MakeResident(s, stream); !st.ok()) {
      UnpinStorage(s);
      return st;
    }
  }
  if (s->runtime_wrote && s->written_on != stream) {
    // Regenerated or copied in on another stream (for another acquire, say):
    // this stream's use comes after that write.
    if (absl::Status st = events_.WaitOn(stream, s->written_on); !st.ok()) {
      UnpinStorage(s);
      return st;
    }
  }
  s->last_access_ns = Clock();
  ++s->accesses;
  if (runtime_internal::closures_running == 0) {
    s->prefetch_evicted = false;  // the program's use (a closure's is the runtime's)
    if (options_.learn_next_use) LearnUse(s, /*created=*/false);
  }
  if (std::find(s->used_streams.begin(), s->used_streams.end(), stream) == s->used_streams.end()) {
    s->used_streams.push_back(stream);
  }
  MaybePrefetchDue(stream);
  MaybeCopyAhead();
  return Guard(this, id, s->device, s);
}

absl::StatusOr<Guard> Runtime::Refill(TensorId id, Stream stream) {
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  if (s->state != TensorState::kDropped || !Claimable(s)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor %d is %s%s: only a dropped tensor is refilled from its owner's copy", id,
        TensorStateName(s->state), Claimable(s) ? "" : ", being regenerated"));
  }
  Pin(s);
  absl::StatusOr<void*> block = AllocateDevice(s->bytes, stream, s->serial);
  if (!block.ok()) {
    UnpinStorage(s);
    return block.status();
  }
  SetResident(s, *block, &stream);
  s->used_streams.push_back(stream);
  s->last_access_ns = Clock();
  ++s->accesses;
  ++stats_.refills;
  if (runtime_internal::closures_running == 0) {
    s->prefetch_evicted = false;
    if (options_.learn_next_use) LearnUse(s, /*created=*/false);
  }
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kRestored, .stream = stream, .refill = true});
  }
  MaybePrefetchDue(stream);
  MaybeCopyAhead();
  return Guard(this, id, s->device, s);
}

void Runtime::Unpin(void* storage) {
  Lock lock(this);
  UnpinStorage(static_cast<Storage*>(storage));
}

absl::Status Runtime::Prefetch(TensorId id, Stream stream) {
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  return PrefetchStorage(s, stream);
}

absl::StatusOr<bool> Runtime::Evict(TensorId id, policies::EvictAction action, Stream stream) {
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  SettleCopies(s);
  // (An empty storage frees nothing: as pressure, it leaves it be.)
  if (s->state != TensorState::kResident || s->bytes == 0) return false;
  const bool drop = action == policies::EvictAction::kDrop;
  if (s->pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor %d is in use (pinned%s): it cannot be evicted now", id,
                        s->regen_owner != nullptr ? ", being regenerated" : ""));
  }
  if (drop ? !s->may_drop : !s->may_offload) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor %d may not be %s", id, drop ? "dropped" : "offloaded"));
  }
  directing_ = true;
  const bool done = drop ? DropStorage(s, stream, /*pressure=*/true) : OffloadStorage(s, stream);
  directing_ = false;
  if (!done) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tensor %d could not be offloaded: the pinned host pool has no room for %s, or the "
        "copy out failed (logged)",
        id, FormatBytes(s->bytes)));
  }
  if (drop) ++stats_.drops;
  ++stats_.directed_evictions;
  return true;
}

absl::StatusOr<std::size_t> Runtime::EvictBytes(std::size_t bytes, Stream stream)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Not from an observer's event: the runtime is in the middle of an
  // operation there (a pressure event's plan, say), which a nested eviction
  // would disturb. (A closure runs without the lock: it may ask.)
  if (tls_held_runtime == this) {
    return absl::FailedPreconditionError(
        "EvictBytes from inside the runtime (an observer's event): the runtime is in the "
        "middle of an operation");
  }
  Lock lock(this);
  return EvictBytesLocked(bytes, stream);
}

absl::Status Runtime::Free(TensorId id) {
  Lock lock(this);
  Tensor* t = tensors_.Find(id);
  if (t == nullptr || t->freed) return NotLive(id);
  Storage* s = t->storage;
  t->freed = true;
  --stats_.live_tensors;
  if (--s->handles == 0) s->just_released = true;
  MaybeCollect(s);
  return absl::OkStatus();
}

absl::Status Runtime::HintNextUse(TensorId id, std::int64_t at_ns) {
  if (at_ns < 0) return absl::InvalidArgumentError("a next use cannot be before time 0");
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  s->next_use_at = at_ns;
  s->next_use_recomputed_ns = stats_.recompute_ns;
  s->next_use_learned = false;
  PlanPrefetch(s);
  MaybePrefetchDue(kDefaultStream);
  return absl::OkStatus();
}

void Runtime::ResetPeakStats() {
  Lock lock(this);
  stats_.peak_resident_bytes = stats_.resident_bytes;
}

void Runtime::SetRetryInOnePlace(bool on) {
  Lock lock(this);
  retry_in_one_place_ = on;
}

absl::Status Runtime::EndStep() {
  Lock lock(this);
  if (!options_.learn_next_use) {
    return absl::FailedPreconditionError(
        "EndStep needs RuntimeOptions::learn_next_use (remat_runtime_options.learn_next_use)");
  }
  last_step_uses_.swap(step_uses_);
  step_uses_.clear();
  if (step_use_count_ > 0) {
    ns_per_use_ = std::max<std::int64_t>(1, (Clock() - step_start_ns_) / step_use_count_);
  }
  step_use_count_ = 0;
  // Epoch 0 is "none" (a storage made in a closure, or before the option).
  if (++step_epoch_ == 0) step_epoch_ = 1;
  // A tensor that outlives its step has no estimate from here on: the one it
  // has came from a step that is over.
  for (Storage* s : storages_.all()) {
    if (s->state != TensorState::kFreed && s->next_use_learned) {
      s->next_use_at = -1;
      s->next_use_learned = false;
    }
  }
  ++stats_.steps_ended;
  return absl::OkStatus();
}

absl::StatusOr<TensorState> Runtime::State(TensorId id) const {
  Lock lock(this);
  if (!tensors_.Issued(id)) return NotLive(id);
  const Tensor* t = tensors_.Find(id);
  // Freed by its owner: kFreed, even while a view (or a closure) keeps the
  // storage it shared, as every other call on the id says.
  if (t == nullptr || t->storage == nullptr || t->freed) return TensorState::kFreed;
  return t->storage->state;
}

absl::StatusOr<TensorState> Runtime::StorageState(TensorId id) const {
  Lock lock(this);
  if (!tensors_.Issued(id)) return NotLive(id);
  const Tensor* t = tensors_.Find(id);
  if (t == nullptr || t->storage == nullptr) return TensorState::kFreed;
  return t->storage->state;
}

RuntimeStats Runtime::stats() const {
  Lock lock(this);
  RuntimeStats stats = stats_;
  stats.tensor_pages = tensors_.pages_held();
  stats.storage_objects = storages_.made();
  return stats;
}

std::int64_t Runtime::NowNs() const {
  Lock lock(this);
  return Clock();
}

absl::Status Runtime::CheckInvariants() const {
  Lock lock(this);
  REMAT_RETURN_IF_ERROR(tensors_.CheckInvariants());
  REMAT_RETURN_IF_ERROR(storages_.CheckInvariants("storage"));
  REMAT_RETURN_IF_ERROR(groups_.CheckInvariants("call group"));
  REMAT_RETURN_IF_ERROR(candidates_.CheckInvariants());
  REMAT_RETURN_IF_ERROR(classes_.CheckInvariants());
  REMAT_RETURN_IF_ERROR(link_.CheckInvariants());
  REMAT_RETURN_IF_ERROR(events_.CheckInvariants());
  REMAT_RETURN_IF_ERROR(CheckStorages());
  REMAT_RETURN_IF_ERROR(CheckClasses());
  return CheckTableAndStats();
}

bool Runtime::OnPressure(const PressureRequest& request) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (tls_held_runtime == this) return Evict(request);  // called from inside the runtime
  Lock lock(this);
  return Evict(request);
}

// --- Pins and collection -----------------------------------------------------------

void Runtime::Pin(Storage* s) {
  if (s->pins++ == 0) Reindex(s);
}

void Runtime::UnpinStorage(Storage* s) {
  if (--s->pins > 0) return;
  Reindex(s);
  if (s->handles > 0) return;  // the owner still holds it: nothing to collect
  if (deferring_depth_ > 0 && s->dependents > 1) {  // another closure may read it again
    deferred_collect_.emplace_back(s, s->serial);
  } else {
    MaybeCollect(s);
  }
}

bool Runtime::HasWantedDroppedConsumer(const Storage* s) {
  for (const Storage* c : s->consumers) {
    if (c->state == TensorState::kDropped && c->handles > 0) return true;
  }
  return false;
}

void Runtime::MaybeCollect(Storage* first) {
  // Collecting a storage may free its inputs in turn. A storage can be
  // reached twice (an input read twice), so the dead are destroyed at the end.
  std::vector<Storage*>& work = collect_work_;
  std::vector<Storage*>& dead = collect_dead_;
  work.assign(1, first);
  dead.clear();
  while (!work.empty()) {
    Storage* s = work.back();
    work.pop_back();
    if (s->state == TensorState::kFreed) continue;
    if (s->handles > 0 || s->pins > 0) continue;
    if (s->dependents > 0) {
      // Freed by its owner but read by a closure that may run again: its bytes
      // go now if they can be regenerated (as DTR does); its metadata stays.
      // Brought back by a regeneration (not released just now), it stays
      // while a dropped consumer the program still holds would bring it back
      // again (RuntimeOptions::keep_regenerated).
      const bool wanted = !s->just_released && options_.keep_regenerated &&
                          HasWantedDroppedConsumer(s);
      if (s->just_released && options_.keep_regenerated) {
        // An input kept for s, a consumer the program held, may be wanted
        // no more: looked at again, as the inputs of a collected storage are.
        for (Storage* in : s->inputs) work.push_back(in);
      }
      s->just_released = false;
      if (!wanted && s->state == TensorState::kResident && s->bytes > 0 && s->may_drop) {
        DropStorage(s, s->used_streams.empty() ? kDefaultStream : s->used_streams.front(),
                    /*pressure=*/false);
        ++stats_.released_drops;
      }
      continue;
    }
    if (s->device != nullptr) {
      // Behind every stream that used the block (a prefetch's copy stream too).
      HandBack(s, s->used_streams.empty() ? kDefaultStream : s->used_streams.front());
    } else if (s->state == TensorState::kResident) {
      stats_.resident_bytes -= s->bytes;  // a zero-byte tensor
    }
    if (s->host != nullptr) ReturnHostBuffer(s->host, copy_stream_);
    if (s->ahead != nullptr) ReleaseAheadCopy(s);
    if (s->kept != nullptr) {
      // Behind the copy out, which is on the copy stream.
      LogIfError(allocator_->FreeOnStream(s->kept, copy_stream_), "freeing a kept block");
      s->kept = nullptr;
    }
    if (s->copy_in_flight) events_.Give(s->copy_event);
    if (options_.observer != nullptr) {
      Tell(s, {.kind = TensorEvent::Kind::kCollected, .from = s->state});
    }
    SetState(s, TensorState::kFreed);
    for (Storage* in : s->inputs) {
      --in->dependents;
      // (Order does not matter: consumers are only summed and joined.)
      auto& consumers = in->consumers;
      *std::find(consumers.begin(), consumers.end(), s) = consumers.back();
      consumers.pop_back();
      work.push_back(in);
    }
    tensors_.Forget(s->tensor_ids);
    if (CallGroup* g = s->group; g != nullptr) {
      g->outputs[s->output_index] = nullptr;
      if (--g->uncollected == 0) {
        g->Reset();
        groups_.Give(g);
      }
    }
    dead.push_back(s);
  }
  for (Storage* s : dead) {
    if (s->replay_estimate != Storage::kNoEstimate) free_estimates_.push_back(s->replay_estimate);
    // Kept for reuse, as a fresh one (a new serial at creation).
    s->Reset();
    storages_.Give(s);
  }
}

}  // namespace remat
