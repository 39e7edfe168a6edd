#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/units.h"
#include "policies/registry.h"

namespace remat {

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

const char* TensorEventName(TensorEvent::Kind kind) {
  switch (kind) {
    case TensorEvent::Kind::kCreated: return "created";
    case TensorEvent::Kind::kDropped: return "dropped";
    case TensorEvent::Kind::kOffloaded: return "offloaded";
    case TensorEvent::Kind::kRestored: return "restored";
    case TensorEvent::Kind::kRecomputed: return "recomputed";
    case TensorEvent::Kind::kCollected: return "collected";
  }
  return "?";
}

// The outputs of a call with several: one closure regenerates all of them
// that are lost. Pooled; kept while any output is uncollected.
struct Runtime::CallGroup {
  RecomputeFn recompute;
  absl::InlinedVector<Storage*, 4> outputs;  // in the call's order; nullptr once collected
  std::size_t uncollected = 0;
  int dropped = 0;                           // outputs now dropped
  mutable std::uint64_t walk_mark = 0;       // the last DroppedChainCost walk that charged it

  void Reset() {
    recompute = nullptr;
    outputs.erase(outputs.begin(), outputs.end());
    uncollected = 0;
    dropped = 0;
    walk_mark = 0;
  }
};

// A storage's plain fields: a collected storage is reset by assigning a
// fresh copy (Storage::Reset), so every field here needs its initializer.
// The ones most calls read come first.
struct Runtime::StorageFields {
  TensorState state = TensorState::kFreed;  // not yet on the device: SetResident at creation
  // What the tensor and the runtime's options allow, fixed at creation.
  bool may_drop = false;     // allowed, enabled, and a closure to recompute it
  bool may_offload = false;  // allowed and enabled
  bool evictable = false;    // non-empty, and may_drop or may_offload
  bool copy_in_flight = false;
  int pins = 0;
  int handles = 0;     // tensors over this storage the owner has not freed
  int dependents = 0;  // uncollected storages whose closures read this one
  static constexpr std::size_t kNoSlot = SIZE_MAX;
  std::size_t candidate_slot = kNoSlot;  // index in candidates_, while a candidate
  std::size_t bytes = 0;
  void* device = nullptr;  // resident, prefetching
  std::uint64_t serial = 0;
  std::int64_t compute_ns = 0;
  std::int64_t last_access_ns = 0;
  std::uint64_t accesses = 0;
  void* host = nullptr;    // offloading, on_host, prefetching (until the copy in completes)
  Event copy_event;        // the offload's or the prefetch's copy, while copy_in_flight
  mutable std::uint64_t walk_mark = 0;   // the last DroppedChainCost walk that saw it
  // DroppedChainCost of this storage, valid during pressure event chain_epoch
  // (candidates sharing an input walk its ancestors once per event).
  mutable std::uint64_t chain_epoch = 0;
  mutable std::int64_t chain_cost = 0;
  // Kept by SetState, so building a candidate reads no neighbour that cannot matter.
  std::int64_t first_access_ns = 0;
  std::int64_t next_use_at = -1;          // HintNextUse's device time; -1 unknown
  std::uint64_t recomputes = 0;
  static constexpr std::uint32_t kNoClass = UINT32_MAX;
  std::uint32_t class_node = kNoClass;    // while dropped: its node in classes_
  int dropped_inputs = 0;                 // entries of `inputs` now dropped
  std::int64_t dropped_consumer_ns = 0;   // summed drop_charge_ns of `consumers` now dropped
  // A call's outputs: the group (nullptr for a one-output call), and its place in it.
  CallGroup* group = nullptr;
  std::uint32_t output_index = 0;
  // While dropped, what regenerating it adds to a neighbourhood: the call's
  // cost on one dropped output of a call, 0 on its dropped siblings (one run
  // regenerates them all, charged once).
  std::int64_t drop_charge_ns = 0;
  // The thread regenerating it now (it is claimed, and pinned), or nullptr.
  const void* regen_owner = nullptr;
};
struct Runtime::Storage : StorageFields {
  static_assert(std::is_trivially_copyable_v<StorageFields>);  // Reset assigns it whole
  RecomputeFn recompute;  // one-output calls (a group's outputs use the group's)
  // (Inline: most ops read two or three tensors, and are read by a few.)
  absl::InlinedVector<Storage*, 3> inputs;     // what the closure reads
  absl::InlinedVector<Storage*, 2> consumers;  // droppable storages whose closures read this one
  absl::InlinedVector<Stream, 2> used_streams;  // streams that used the device block
  absl::InlinedVector<TensorId, 1> tensor_ids;

  // Back to a fresh object, for reuse once collected. The lists keep the heap
  // space they grew (a reused object is likely to need it again): erase, as
  // clear would give it back.
  void Reset() {
    static_cast<StorageFields&>(*this) = StorageFields{};
    recompute = nullptr;
    inputs.erase(inputs.begin(), inputs.end());
    consumers.erase(consumers.begin(), consumers.end());
    used_streams.erase(used_streams.begin(), used_streams.end());
    tensor_ids.erase(tensor_ids.begin(), tensor_ids.end());
  }
};

// The runtime's lock, remembering which runtime the thread holds: the
// pressure handler runs on the thread that asked the allocator for memory,
// which usually is inside the runtime already.
namespace {
thread_local const void* tls_held_runtime = nullptr;
// Its address names the thread (a regeneration's claim).
thread_local char tls_thread_token;
const void* ThisThread() { return &tls_thread_token; }
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

// Lets go of the runtime's lock while a closure runs or a thread waits, and
// takes it back.
class Runtime::Unlocked {
 public:
  explicit Unlocked(const Runtime* r) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : r_(r), previous_(tls_held_runtime) {
    tls_held_runtime = nullptr;
    r_->mu_.Unlock();
  }
  ~Unlocked() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    r_->mu_.Lock();
    tls_held_runtime = previous_;
  }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  const Runtime* r_;
  const void* previous_;
};

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
  std::shared_ptr<policies::EvictionPolicy> policy = options.custom_policy;
  if (policy == nullptr) {
    absl::StatusOr<std::unique_ptr<policies::EvictionPolicy>> made =
        policies::Create(options.policy);
    if (!made.ok()) return made.status();
    policy = std::move(*made);
  }
  absl::StatusOr<Stream> copy_stream = allocator->device()->CreateStream();
  if (!copy_stream.ok()) return copy_stream.status();
  std::unique_ptr<Runtime> runtime(
      new Runtime(allocator, std::move(options), std::move(policy), *copy_stream));
  allocator->SetPressureHandler(
      [r = runtime.get()](const PressureRequest& request) { return r->OnPressure(request); });
  return runtime;
}

Runtime::Runtime(CachingAllocator* allocator, RuntimeOptions options,
                 std::shared_ptr<policies::EvictionPolicy> policy, Stream copy_stream)
    : allocator_(allocator),
      device_(allocator->device()),
      options_(std::move(options)),
      policy_(std::move(policy)),
      copy_stream_(copy_stream),
      track_classes_(policy_->needs().classes),
      host_pool_(allocator->device(), options_.host_pool_bytes) {}

Runtime::~Runtime() {
  allocator_->SetPressureHandler(nullptr);
  Lock lock(this);
  (void)device_->Synchronize();
  for (auto& s : storages_) {
    if (s->device != nullptr) (void)allocator_->Free(s->device);
    if (s->host != nullptr) (void)host_pool_.FreeAfter(s->host, copy_stream_);
  }
  for (Event e : spare_events_) (void)device_->DestroyEvent(e);
  (void)device_->DestroyStream(copy_stream_);
}

// --- Small helpers --------------------------------------------------------------

absl::StatusOr<Event> Runtime::TakeEvent() {
  if (!spare_events_.empty()) {
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return device_->CreateEvent();
}

absl::Status Runtime::WaitOn(Stream waiter, Stream producer) {
  if (waiter == producer) return absl::OkStatus();
  absl::StatusOr<Event> e = TakeEvent();
  if (!e.ok()) return e.status();
  absl::Status s = device_->RecordEvent(*e, producer);
  if (s.ok()) s = device_->StreamWaitEvent(waiter, *e);
  spare_events_.push_back(*e);  // the wait captured it; it may be recorded again
  return s;
}

inline bool Runtime::Issued(TensorId id) const { return id != 0 && id < next_id_; }

ABSL_ATTRIBUTE_ALWAYS_INLINE inline Runtime::Tensor* Runtime::FindTensor(TensorId id) const {
  // Id 0 wraps to a page past the end: one bounds check covers it.
  const std::size_t page = (id - 1) / kTensorPage;
  if (id >= next_id_ || page >= tensor_pages_.size()) return nullptr;
  TensorPage* p = tensor_pages_[page].get();
  return p == nullptr ? nullptr : &p->entries[(id - 1) % kTensorPage];
}

TensorId Runtime::NewTensorId(Storage* s) {
  const TensorId id = next_id_++;
  const std::size_t page = (id - 1) / kTensorPage;
  if (page == tensor_pages_.size()) {
    tensor_pages_.push_back(std::make_unique<TensorPage>());
    ++stats_.tensor_pages;
  }
  TensorPage& p = *tensor_pages_[page];
  p.entries[(id - 1) % kTensorPage] = Tensor{s, false};
  ++p.uncollected;
  s->tensor_ids.push_back(id);
  return id;
}

void Runtime::ForgetTensors(const Storage* s) {
  for (TensorId id : s->tensor_ids) {
    const std::size_t page = (id - 1) / kTensorPage;
    TensorPage& p = *tensor_pages_[page];
    p.entries[(id - 1) % kTensorPage].storage = nullptr;
    // A page is let go once its last id is handed out and all its tensors are gone.
    if (--p.uncollected == 0 && (page + 1) * kTensorPage < next_id_) {
      tensor_pages_[page].reset();
      --stats_.tensor_pages;
    }
  }
}

Runtime::Storage* Runtime::NewStorage() {
  if (free_storages_.empty()) {
    storages_.push_back(std::make_unique<Storage>());
    ++stats_.storage_objects;
    return storages_.back().get();
  }
  Storage* s = free_storages_.back();
  free_storages_.pop_back();
  return s;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline Runtime::Storage* Runtime::LiveOrNull(TensorId id) const {
  const Tensor* t = FindTensor(id);
  return t == nullptr || t->freed ? nullptr : t->storage;
}

absl::Status Runtime::NotLive(TensorId id) const {
  if (!Issued(id)) return absl::NotFoundError(absl::StrFormat("tensor %d does not exist", id));
  // An id whose page was given back was freed and collected.
  return absl::FailedPreconditionError(absl::StrFormat("tensor %d was freed", id));
}

void Runtime::Tell(const Storage* s, TensorEvent event) {
  event.tensor = s->tensor_ids.empty() ? 0 : s->tensor_ids.front();
  event.bytes = s->bytes;
  options_.observer->OnTensor(event);
}

void Runtime::SetState(Storage* s, TensorState state) {
  const bool was_dropped = s->state == TensorState::kDropped;
  const bool dropped = state == TensorState::kDropped;
  s->state = state;
  if (was_dropped != dropped) {
    const int sign = dropped ? 1 : -1;
    if (dropped) {
      // One run regenerates every dropped output of a call: the first to go
      // carries the call's cost.
      s->drop_charge_ns = s->group != nullptr && s->group->dropped > 0 ? 0 : s->compute_ns;
      if (s->group != nullptr) ++s->group->dropped;
    }
    for (Storage* in : s->inputs) in->dropped_consumer_ns += sign * s->drop_charge_ns;
    for (Storage* out : s->consumers) out->dropped_inputs += sign;
    if (track_classes_) {
      if (dropped) {
        ++dropped_count_;
        JoinClasses(s);
      } else {
        // Classes only merge (as DTR's union-find does); a member that comes
        // back takes its own cost out of its class.
        classes_[ClassRoot(s->class_node)].cost_ns -= s->drop_charge_ns;
        s->class_node = Storage::kNoClass;
        if (--dropped_count_ == 0) classes_.clear();
      }
    }
    if (!dropped && s->group != nullptr && --s->group->dropped > 0 && s->drop_charge_ns > 0) {
      PassDropCharge(s);
    }
    if (!dropped) s->drop_charge_ns = 0;
  }
  Reindex(s);
}

void Runtime::PassDropCharge(Storage* s) {
  // A sibling still dropped (its output collected while the others stay
  // dropped) carries the call's cost from now on.
  for (Storage* m : s->group->outputs) {
    if (m == nullptr || m == s || m->state != TensorState::kDropped) continue;
    m->drop_charge_ns = s->drop_charge_ns;
    for (Storage* in : m->inputs) in->dropped_consumer_ns += m->drop_charge_ns;
    if (track_classes_ && m->class_node != Storage::kNoClass) {
      classes_[ClassRoot(m->class_node)].cost_ns += m->drop_charge_ns;
    }
    return;
  }
}

std::uint32_t Runtime::ClassRoot(std::uint32_t node) {
  while (classes_[node].parent != node) {
    classes_[node].parent = classes_[classes_[node].parent].parent;  // path halving
    node = classes_[node].parent;
  }
  return node;
}

void Runtime::JoinClasses(Storage* s) {
  s->class_node = static_cast<std::uint32_t>(classes_.size());
  classes_.push_back(ClassNode{s->class_node, s->drop_charge_ns});
  auto join = [&](const Storage* other) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (other->state != TensorState::kDropped || other->class_node == Storage::kNoClass) return;
    const std::uint32_t a = ClassRoot(s->class_node), b = ClassRoot(other->class_node);
    if (a == b) return;
    classes_[b].parent = a;
    classes_[a].cost_ns += classes_[b].cost_ns;
  };
  for (const Storage* in : s->inputs) join(in);
  for (const Storage* out : s->consumers) join(out);
  if (s->group != nullptr) {  // dropped siblings come back in one run: one class
    for (const Storage* m : s->group->outputs) {
      if (m != nullptr && m != s) join(m);
    }
  }
}

std::int64_t Runtime::AdjacentClassesCost(const Storage* s) {
  absl::InlinedVector<std::uint32_t, 8> roots;
  std::int64_t cost = 0;
  auto add = [&](const Storage* other) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (other->state != TensorState::kDropped || other->class_node == Storage::kNoClass) return;
    const std::uint32_t root = ClassRoot(other->class_node);
    if (std::find(roots.begin(), roots.end(), root) != roots.end()) return;
    roots.push_back(root);
    cost += std::max<std::int64_t>(classes_[root].cost_ns, 0);
  };
  if (s->dropped_inputs > 0) {
    for (const Storage* in : s->inputs) add(in);
  }
  if (s->dropped_consumer_ns > 0) {
    for (const Storage* out : s->consumers) add(out);
  }
  return cost;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Runtime::Reindex(Storage* s) {
  // A prefetched tensor (its copy in may still run) can go again: its block
  // is handed back behind the copy, like any other use.
  const bool on_device = s->state == TensorState::kResident || s->state == TensorState::kPrefetching;
  const bool candidate = on_device && s->pins == 0 && s->evictable;
  const bool indexed = s->candidate_slot != Storage::kNoSlot;
  if (candidate != indexed) MoveInIndex(s, candidate);
}

void Runtime::MoveInIndex(Storage* s, bool candidate) {
  if (candidate) {
    s->candidate_slot = candidates_.size();
    candidates_.push_back(s);
    return;
  }
  Storage* last = candidates_.back();
  candidates_[s->candidate_slot] = last;
  last->candidate_slot = s->candidate_slot;
  candidates_.pop_back();
  s->candidate_slot = Storage::kNoSlot;
}

void Runtime::SetResident(Storage* s, void* ptr) {
  SetState(s, TensorState::kResident);
  s->device = ptr;
  stats_.resident_bytes += s->bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
}

void Runtime::LeaveDevice(Storage* s) {
  stats_.resident_bytes -= s->bytes;
  s->device = nullptr;
  s->used_streams.clear();
}

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

void Runtime::EndDeferral() {
  if (--deferring_depth_ > 0) return;
  // Collecting one may collect another of the list first, and its object may
  // then hold a newer storage: the serial tells.
  for (auto [s, serial] : deferred_collect_) {
    if (s->serial == serial) MaybeCollect(s);
  }
  deferred_collect_.clear();
}

void Runtime::SettleCopies(Storage* s) {
  if (!s->copy_in_flight || s->state != TensorState::kOffloading) return;
  absl::StatusOr<bool> done = device_->QueryEvent(s->copy_event);
  if (done.ok() && *done) {
    s->copy_in_flight = false;
    spare_events_.push_back(s->copy_event);
    SetState(s, TensorState::kOnHost);
  }
}

std::string Runtime::DescribePressure(std::size_t bytes) const {
  std::size_t pinned_bytes = 0, evictable_bytes = 0, pinned_count = 0;
  std::vector<std::pair<std::size_t, TensorId>> pinned;
  for (const auto& s : storages_) {
    if (s->state != TensorState::kResident) continue;
    if (s->pins > 0) {
      pinned_bytes += s->bytes;
      ++pinned_count;
      pinned.emplace_back(s->bytes, s->tensor_ids.empty() ? 0 : s->tensor_ids.front());
    } else if (s->evictable) {
      evictable_bytes += s->bytes;
    }
  }
  std::sort(pinned.rbegin(), pinned.rend());
  std::string largest;
  for (std::size_t i = 0; i < pinned.size() && i < 5; ++i) {
    absl::StrAppendFormat(&largest, "%s#%d (%s)", i == 0 ? "" : ", ", pinned[i].second,
                          FormatBytes(pinned[i].first));
  }
  return absl::StrFormat(
      "remat runtime cannot make room for %s: %d tensors pinned (%s; largest: %s), %s still "
      "evictable, budget %s, policy %s, pinned host pool %s of %s in use",
      FormatBytes(bytes), pinned_count, FormatBytes(pinned_bytes),
      largest.empty() ? "none" : largest, FormatBytes(evictable_bytes),
      FormatBytes(allocator_->budget()), policy_->Spec(), FormatBytes(host_pool_.in_use_bytes()),
      FormatBytes(host_pool_.capacity()));
}

absl::StatusOr<void*> Runtime::AllocateDevice(std::size_t bytes, Stream stream,
                                              std::uint64_t owner) {
  if (options_.live_budget != 0) {
    // Outputs allocated for closures not yet run count as live already.
    while (stats_.resident_bytes + pending_live_bytes_ + bytes > options_.live_budget) {
      const std::size_t live = stats_.resident_bytes + pending_live_bytes_;
      const PressureRequest request{live + bytes - options_.live_budget, stream,
                                    options_.live_budget, live, live};
      if (!Evict(request)) {
        if (StepLimitReached()) return StepLimitError();
        return absl::ResourceExhaustedError(absl::StrCat(
            DescribePressure(bytes), "; live budget ", FormatBytes(options_.live_budget),
            " with ", FormatBytes(stats_.resident_bytes), " resident"));
      }
    }
  }
  absl::StatusOr<void*> ptr = allocator_->Allocate(bytes, stream, owner);
  if (ptr.ok() || !absl::IsResourceExhausted(ptr.status())) return ptr;
  if (StepLimitReached()) return StepLimitError();
  return absl::ResourceExhaustedError(
      absl::StrCat(DescribePressure(bytes), "; allocator: ", ptr.status().message()));
}

// --- Tensors ---------------------------------------------------------------------

absl::Status Runtime::ResolveInputs(const TensorOptions& options,
                                    absl::InlinedVector<Storage*, 3>& inputs) const {
  if (options.allow_drop && !options.recompute) {
    return absl::InvalidArgumentError("a tensor that may be dropped needs a recompute closure");
  }
  if (options.compute_ns < 0) return absl::InvalidArgumentError("compute_ns must be >= 0");
  for (TensorId in : options.inputs) {
    Storage* s = LiveOrNull(in);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("input of the new tensor: %s", NotLive(in).message()));
    }
    inputs.push_back(s);
  }
  return absl::OkStatus();
}

Runtime::Storage* Runtime::AddStorage(std::size_t bytes, void* ptr, std::uint64_t serial,
                                      bool may_drop, bool may_offload,
                                      const TensorOptions& options,
                                      absl::Span<Storage* const> inputs, Stream stream) {
  Storage* s = NewStorage();
  s->serial = serial;
  s->bytes = bytes;
  s->may_drop = may_drop;
  s->may_offload = may_offload;
  s->compute_ns = options.compute_ns;
  s->evictable = bytes > 0 && (s->may_drop || s->may_offload);
  if (s->may_drop) {
    // Only a closure that may run again keeps its inputs alive (with drops
    // disabled, none will: a released input then goes at once).
    s->inputs.assign(inputs.begin(), inputs.end());
    for (Storage* in : s->inputs) {
      ++in->dependents;
      in->consumers.push_back(s);
      if (in->state == TensorState::kDropped) ++s->dropped_inputs;
    }
  }
  NewTensorId(s);
  s->handles = 1;
  s->pins = 1;
  s->used_streams.push_back(stream);
  s->last_access_ns = s->first_access_ns = Clock();
  s->accesses = 1;
  SetResident(s, ptr);
  ++stats_.tensors_created;
  ++stats_.live_tensors;
  if (options_.observer != nullptr) Tell(s, {.kind = TensorEvent::Kind::kCreated});
  return s;
}

absl::StatusOr<Guard> Runtime::Create(std::size_t bytes, TensorOptions&& options, Stream stream) {
  Lock lock(this);
  absl::InlinedVector<Storage*, 3> inputs;
  if (absl::Status st = ResolveInputs(options, inputs); !st.ok()) return st;
  // The block is tagged with the serial as it is allocated; a failed Create
  // uses none up (nothing else takes one meanwhile: eviction makes no storage).
  const std::uint64_t serial = next_serial_;
  absl::StatusOr<void*> ptr = AllocateDevice(bytes, stream, serial);
  if (!ptr.ok()) return ptr.status();
  ++next_serial_;
  work_ns_ += options.compute_ns;  // its outputs are made once the call has run
  const bool may_drop =
      options_.enable_drop && options.allow_drop && static_cast<bool>(options.recompute);
  Storage* s = AddStorage(bytes, *ptr, serial, may_drop,
                          options_.enable_offload && options.allow_offload, options, inputs,
                          stream);
  s->recompute = std::move(options.recompute);
  return Guard(this, s->tensor_ids.front(), *ptr, s);
}

absl::StatusOr<absl::InlinedVector<Guard, 4>> Runtime::CreateCall(
    absl::Span<const OutputSpec> outputs, TensorOptions&& options, Stream stream) {
  if (outputs.empty()) return absl::InvalidArgumentError("a call needs at least one output");
  if (outputs.size() > UINT32_MAX) return absl::InvalidArgumentError("too many outputs");
  Lock lock(this);
  absl::InlinedVector<Storage*, 3> inputs;
  if (absl::Status st = ResolveInputs(options, inputs); !st.ok()) return st;
  // All outputs' blocks first (serials in order, none used up on failure);
  // the ones allocated count as live while the rest are.
  absl::InlinedVector<void*, 4> ptrs;
  std::size_t pending = 0;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    absl::StatusOr<void*> ptr = AllocateDevice(outputs[i].bytes, stream, next_serial_ + i);
    if (!ptr.ok()) {
      for (void* p : ptrs) (void)allocator_->FreeOnStream(p, stream);
      pending_live_bytes_ -= pending;
      return ptr.status();
    }
    ptrs.push_back(*ptr);
    pending += outputs[i].bytes;
    pending_live_bytes_ += outputs[i].bytes;
  }
  pending_live_bytes_ -= pending;
  work_ns_ += options.compute_ns;
  CallGroup* group = outputs.size() > 1 ? NewGroup() : nullptr;
  absl::InlinedVector<Guard, 4> guards;
  Storage* first = nullptr;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const bool may_drop = options_.enable_drop && options.allow_drop && outputs[i].allow_drop &&
                          static_cast<bool>(options.recompute);
    const bool may_offload =
        options_.enable_offload && options.allow_offload && outputs[i].allow_offload;
    Storage* s = AddStorage(outputs[i].bytes, ptrs[i], next_serial_++, may_drop, may_offload,
                            options, inputs, stream);
    if (group != nullptr) {
      s->group = group;
      s->output_index = static_cast<std::uint32_t>(i);
      group->outputs.push_back(s);
      ++group->uncollected;
    }
    if (first == nullptr) first = s;
    guards.push_back(Guard(this, s->tensor_ids.front(), ptrs[i], s));
  }
  (group != nullptr ? group->recompute : first->recompute) = std::move(options.recompute);
  return guards;
}

Runtime::CallGroup* Runtime::NewGroup() {
  if (free_groups_.empty()) {
    groups_.push_back(std::make_unique<CallGroup>());
    return groups_.back().get();
  }
  CallGroup* g = free_groups_.back();
  free_groups_.pop_back();
  return g;
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
  s->last_access_ns = Clock();
  ++s->accesses;
  if (std::find(s->used_streams.begin(), s->used_streams.end(), stream) == s->used_streams.end()) {
    s->used_streams.push_back(stream);
  }
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
  SettleCopies(s);
  if (s->state != TensorState::kOnHost && s->state != TensorState::kOffloading) {
    return absl::OkStatus();  // resident, on its way, or dropped: nothing to copy
  }
  absl::StatusOr<void*> ptr = AllocateDevice(s->bytes, stream, s->serial);
  if (!ptr.ok()) return ptr.status();
  // The copy stream writes the block only after `stream`'s earlier work on it,
  // and (same stream) after the offload's copy out.
  // On any failure the block goes back, and the tensor stays on the host.
  absl::StatusOr<Event> done = TakeEvent();
  absl::Status st = done.ok() ? WaitOn(copy_stream_, stream) : done.status();
  if (st.ok()) {
    st = device_->CopyAsync(*ptr, s->host, s->bytes, CopyKind::kHostToDevice, copy_stream_);
  }
  if (st.ok()) st = device_->RecordEvent(*done, copy_stream_);
  if (!st.ok()) {
    if (done.ok()) spare_events_.push_back(*done);
    (void)allocator_->FreeOnStream(*ptr, stream);
    return st;
  }
  if (s->copy_in_flight) spare_events_.push_back(s->copy_event);
  s->copy_event = *done;
  s->copy_in_flight = true;
  (void)host_pool_.FreeAfter(s->host, copy_stream_);
  s->host = nullptr;
  SetResident(s, *ptr);
  SetState(s, TensorState::kPrefetching);
  s->used_streams.assign({stream, copy_stream_});
  stats_.restored_bytes += s->bytes;
  QueueOnLink(s->bytes);
  ++stats_.prefetches;
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kRestored, .stream = copy_stream_, .prefetch = true});
  }
  return absl::OkStatus();
}

absl::Status Runtime::Free(TensorId id) {
  Lock lock(this);
  Tensor* t = FindTensor(id);
  if (t == nullptr || t->freed) return NotLive(id);
  Storage* s = t->storage;
  t->freed = true;
  --stats_.live_tensors;
  --s->handles;
  MaybeCollect(s);
  return absl::OkStatus();
}

absl::Status Runtime::HintNextUse(TensorId id, std::int64_t at_ns) {
  if (at_ns < 0) return absl::InvalidArgumentError("a next use cannot be before time 0");
  Lock lock(this);
  Storage* s = LiveOrNull(id);
  if (s == nullptr) return NotLive(id);
  s->next_use_at = at_ns;
  return absl::OkStatus();
}

absl::StatusOr<TensorState> Runtime::State(TensorId id) const {
  Lock lock(this);
  if (!Issued(id)) return NotLive(id);
  const Tensor* t = FindTensor(id);
  if (t == nullptr || t->storage == nullptr) return TensorState::kFreed;
  return t->storage->state;
}

RuntimeStats Runtime::stats() const {
  Lock lock(this);
  return stats_;
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
      if (s->state == TensorState::kResident && s->bytes > 0 && s->may_drop) {
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
    if (s->host != nullptr) (void)host_pool_.FreeAfter(s->host, copy_stream_);
    if (s->copy_in_flight) spare_events_.push_back(s->copy_event);
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
    ForgetTensors(s);
    if (CallGroup* g = s->group; g != nullptr) {
      g->outputs[s->output_index] = nullptr;
      if (--g->uncollected == 0) {
        g->Reset();
        free_groups_.push_back(g);
      }
    }
    dead.push_back(s);
  }
  for (Storage* s : dead) {
    // Kept for reuse, as a fresh one (a new serial at creation).
    s->Reset();
    free_storages_.push_back(s);
  }
}

// --- Making tensors resident -----------------------------------------------------

absl::Status Runtime::Restore(Storage* s, Stream stream) {
  SettleCopies(s);
  if (s->state == TensorState::kPrefetching) {
    if (absl::Status st = device_->StreamWaitEvent(stream, s->copy_event); !st.ok()) return st;
    spare_events_.push_back(s->copy_event);
    s->copy_in_flight = false;
    SetState(s, TensorState::kResident);
    return absl::OkStatus();
  }
  // On host (or still being copied out: the copy in on `stream` then waits
  // for the copy out).
  absl::StatusOr<void*> ptr = AllocateDevice(s->bytes, stream, s->serial);
  if (!ptr.ok()) return ptr.status();
  if (s->copy_in_flight) {
    if (absl::Status st = device_->StreamWaitEvent(stream, s->copy_event); !st.ok()) {
      (void)allocator_->FreeOnStream(*ptr, stream);
      return st;
    }
    spare_events_.push_back(s->copy_event);
    s->copy_in_flight = false;
  }
  if (absl::Status st =
          device_->CopyAsync(*ptr, s->host, s->bytes, CopyKind::kHostToDevice, stream);
      !st.ok()) {
    (void)allocator_->FreeOnStream(*ptr, stream);
    return st;
  }
  (void)host_pool_.FreeAfter(s->host, stream);
  s->host = nullptr;
  SetResident(s, *ptr);
  s->used_streams.push_back(stream);
  stats_.restored_bytes += s->bytes;
  QueueOnLink(s->bytes);
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kRestored, .stream = stream});
  }
  return absl::OkStatus();
}

bool Runtime::Claimable(const Storage* s) const {
  if (s->group == nullptr) return s->regen_owner == nullptr;
  for (const Storage* m : s->group->outputs) {
    if (m != nullptr && m->regen_owner != nullptr) return false;
  }
  return true;
}

bool Runtime::ClaimedHere(const Storage* s) const {
  if (s->group == nullptr) return s->regen_owner == ThisThread();
  for (const Storage* m : s->group->outputs) {
    if (m != nullptr && m->regen_owner == ThisThread()) return true;
  }
  return false;
}

void Runtime::Claim(Storage* s) {
  auto claim = [&](Storage* m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    m->regen_owner = ThisThread();
    Pin(m);
  };
  if (s->group == nullptr) {
    claim(s);
    return;
  }
  for (Storage* m : s->group->outputs) {
    if (m != nullptr && m->state == TensorState::kDropped) claim(m);
  }
}

void Runtime::Unclaim(Storage* s, const Storage* keep_pinned) {
  // Unpinning may collect an output (and with the last, reset the group):
  // the list is copied first.
  absl::InlinedVector<Storage*, 4> mine;
  if (s->group == nullptr) {
    if (s->regen_owner == ThisThread()) mine.push_back(s);
  } else {
    for (Storage* m : s->group->outputs) {
      if (m != nullptr && m->regen_owner == ThisThread()) mine.push_back(m);
    }
  }
  for (Storage* m : mine) {
    m->regen_owner = nullptr;
    if (m != keep_pinned) UnpinStorage(m);
  }
  NotifyRegenerated();
}

void Runtime::WaitForRegeneration() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // The epoch is read under the lock; whoever ends a regeneration bumps it
  // under the lock, so a bump after the read wakes (or skips) the wait.
  const std::uint64_t epoch = regen_epoch_.load(std::memory_order_acquire);
  ++regen_waiters_;
  {
    Unlocked unlocked(this);
    regen_epoch_.wait(epoch, std::memory_order_acquire);
  }
  --regen_waiters_;
}

void Runtime::NotifyRegenerated() {
  if (regen_waiters_ == 0) return;  // (the common case: no futex call)
  regen_epoch_.fetch_add(1, std::memory_order_release);
  regen_epoch_.notify_all();
}

bool Runtime::StepLimitReached() const {
  return options_.max_steps != 0 &&
         stats_.pressure_events + stats_.recomputes >= options_.max_steps;
}

absl::Status Runtime::StepLimitError() const {
  return absl::AbortedError(absl::StrFormat(
      "remat runtime: step limit reached (%d pressure events and recomputes; "
      "RuntimeOptions::max_steps)",
      options_.max_steps));
}

std::int64_t Runtime::Clock() const { return device_->NowNs() + work_ns_; }

std::int64_t Runtime::NowNs() const {
  Lock lock(this);
  return Clock();
}

absl::Status Runtime::RunCall(Storage* s, Stream stream) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (StepLimitReached()) return StepLimitError();
  // The call's outputs: the claimed ones are regenerated; resident ones stay
  // pinned while it runs (it may rewrite them); the rest are left alone.
  absl::InlinedVector<Storage*, 4> members;
  if (s->group == nullptr) {
    members.push_back(s);
  } else {
    members.assign(s->group->outputs.begin(), s->group->outputs.end());
  }
  const std::size_t n = members.size();
  absl::InlinedVector<void*, 4> out_ptrs(n, nullptr);
  absl::InlinedVector<std::size_t, 4> out_bytes(n, 0);
  absl::InlinedVector<bool, 4> regenerate(n, false);
  absl::InlinedVector<Storage*, 4> held;
  for (std::size_t i = 0; i < n; ++i) {
    Storage* m = members[i];
    if (m == nullptr) continue;
    out_bytes[i] = m->bytes;
    if (m->regen_owner == ThisThread()) {
      regenerate[i] = true;
    } else if (m->state == TensorState::kResident) {
      Pin(m);
      held.push_back(m);
      out_ptrs[i] = m->device;
    }
  }
  std::size_t pending = 0;
  auto give_back = [&](absl::Status error) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (std::size_t i = 0; i < n; ++i) {
      if (regenerate[i] && out_ptrs[i] != nullptr) (void)allocator_->FreeOnStream(out_ptrs[i], stream);
    }
    pending_live_bytes_ -= pending;
    for (Storage* m : held) UnpinStorage(m);
    return error;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (!regenerate[i]) continue;
    absl::StatusOr<void*> out = AllocateDevice(members[i]->bytes, stream, members[i]->serial);
    if (!out.ok()) return give_back(out.status());
    out_ptrs[i] = *out;
    pending += members[i]->bytes;
    pending_live_bytes_ += members[i]->bytes;
  }
  absl::InlinedVector<void*, 4> input_ptrs;
  for (Storage* in : s->inputs) input_ptrs.push_back(in->device);
  RecomputeArgs args;
  args.inputs = input_ptrs;
  args.output = out_ptrs[0];
  args.bytes = out_bytes[0];
  args.stream = stream;
  args.outputs = out_ptrs;
  args.output_bytes = out_bytes;
  args.regenerate = regenerate;
  RecomputeFn& closure = s->group != nullptr ? s->group->recompute : s->recompute;
  absl::Status ran;
  {
    // The closure may allocate, acquire and evict: everything it reads or
    // writes is pinned (the inputs by the frame, the outputs by the claim).
    Unlocked unlocked(this);
    ran = closure(args);
  }
  if (!ran.ok()) {
    return give_back(absl::Status(
        ran.code(), absl::StrFormat("recomputing tensor #%d: %s",
                                    s->tensor_ids.empty() ? 0 : s->tensor_ids.front(),
                                    ran.message())));
  }
  pending_live_bytes_ -= pending;
  ++stats_.recomputes;
  stats_.recompute_ns += s->compute_ns;
  work_ns_ += s->compute_ns;
  std::int64_t cost = s->compute_ns;  // told once, on the first output regenerated
  for (std::size_t i = 0; i < n; ++i) {
    if (!regenerate[i]) continue;
    Storage* m = members[i];
    SetResident(m, out_ptrs[i]);
    m->used_streams.push_back(stream);
    ++m->recomputes;
    if (options_.observer != nullptr) {
      Tell(m, {.kind = TensorEvent::Kind::kRecomputed, .stream = stream, .cost_ns = cost});
      cost = 0;
    }
  }
  for (Storage* m : held) UnpinStorage(m);
  return absl::OkStatus();
}

absl::Status Runtime::MakeResident(Storage* target, Stream stream) {
  // The caller pins `target`, so no wait below can see it collected.
  //
  // Regenerate dropped tensors with an explicit stack: a frame's inputs are
  // made resident and pinned one by one (a dropped input pushes its own
  // frame), then its call runs (without the lock) and the inputs are unpinned.
  // A frame claims the outputs its call regenerates; a storage another thread
  // has claimed is waited for (claims follow the graph's edges towards its
  // inputs, so two threads never wait on each other).
  //
  // Tensors the program has released but a closure still needs are dropped
  // as soon as nothing pins them (MaybeCollect). Within one regeneration that
  // would drop a shared ancestor after its first consumer ran and regenerate
  // it for the next, again and again down a graph of diamonds (a ResNet's
  // skip connections): exponential. Until every regeneration has ended they
  // stay resident, unpinned, for the policy to evict like any other tensor.
  auto reentered = [](const Storage* s) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor #%d is being regenerated by this thread: a recompute closure acquired an "
        "output of its own call, or a tensor that needs it",
        s->tensor_ids.empty() ? 0 : s->tensor_ids.front()));
  };
  for (;;) {
    if (target->state == TensorState::kResident) return absl::OkStatus();
    if (target->state != TensorState::kDropped) return Restore(target, stream);
    if (Claimable(target)) break;
    if (ClaimedHere(target)) return reentered(target);
    WaitForRegeneration();
  }
  ++deferring_depth_;
  struct Frame {
    Storage* s;
    std::size_t pinned = 0;  // inputs [0, pinned) are resident and pinned
  };
  std::vector<Frame> stack;
  Claim(target);
  stack.push_back(Frame{target});
  // Runs under the lock MakeResident holds (the analysis cannot see into lambdas).
  auto unwind = [&](absl::Status error) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const Frame& f : stack) {
      for (std::size_t i = 0; i < f.pinned; ++i) UnpinStorage(f.s->inputs[i]);
      Unclaim(f.s);
    }
    EndDeferral();
    return error;
  };
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Storage* s = frame.s;
    bool again = false;
    while (frame.pinned < s->inputs.size()) {
      Storage* in = s->inputs[frame.pinned];
      if (in->state == TensorState::kDropped) {
        if (Claimable(in)) {
          Claim(in);
          stack.push_back(Frame{in});
        } else if (ClaimedHere(in)) {
          return unwind(reentered(in));
        } else {
          WaitForRegeneration();  // then look again: it may be back, or gone again
        }
        again = true;
        break;
      }
      if (in->state != TensorState::kResident) {
        if (absl::Status st = Restore(in, stream); !st.ok()) return unwind(st);
      }
      Pin(in);
      ++frame.pinned;
    }
    if (again) continue;
    if (absl::Status st = RunCall(s, stream); !st.ok()) return unwind(st);
    for (Storage* in : s->inputs) UnpinStorage(in);
    stack.pop_back();
    // The frame below reads s next: its claim's pin becomes that frame's, so
    // a released s is not dropped again before it is read.
    Frame* below = stack.empty() ? nullptr : &stack.back();
    const bool hand_over = below != nullptr && below->s->inputs[below->pinned] == s;
    Unclaim(s, hand_over ? s : nullptr);
    if (hand_over) ++below->pinned;
  }
  EndDeferral();
  return absl::OkStatus();
}

// --- Eviction ----------------------------------------------------------------------

bool Runtime::OnPressure(const PressureRequest& request) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (tls_held_runtime == this) return Evict(request);  // called from inside the runtime
  Lock lock(this);
  return Evict(request);
}

policies::Candidate Runtime::MakeCandidate(const Storage* s, const policies::Needs& needs,
                                           std::int64_t now) {
  policies::Candidate c;
  c.bytes = s->bytes;
  c.compute_ns = s->compute_ns;
  c.transfer_ns =
      2 * (options_.link_latency_ns +
           static_cast<std::int64_t>(static_cast<double>(s->bytes) / options_.link_gbps));
  c.can_drop = s->may_drop;
  c.can_offload = s->may_offload;
  c.last_access_ns = s->last_access_ns;
  c.first_access_ns = s->first_access_ns;
  c.accesses = s->accesses;
  c.recomputes = s->recomputes;
  // A recompute of this tensor first regenerates its dropped ancestors; its
  // dropped consumers would need it regenerated in turn.
  if (needs.neighbourhood) c.ancestors_ns = AncestorsCost(s);
  c.consumers_ns = s->dropped_consumer_ns;
  c.neighbourhood_ns = c.ancestors_ns + c.consumers_ns;
  if (needs.classes) c.classes_ns = AdjacentClassesCost(s);
  c.address = reinterpret_cast<std::uintptr_t>(s->device);
  if (needs.adjacent_free) {
    absl::StatusOr<std::size_t> free = allocator_->AdjacentFreeBytes(s->device);
    c.adjacent_free_bytes = free.ok() ? *free : 0;
  }
  if (s->next_use_at >= 0) {
    c.next_use_ns = s->next_use_at == kNeverUsedAgain
                        ? kNeverUsedAgain
                        : std::max<std::int64_t>(s->next_use_at - now, 0);
  }
  return c;
}

void Runtime::GatherCandidates() {
  ++chain_epoch_;  // states may have changed since the last event: no memo carries over
  scratch_.clear();
  scratch_storages_.clear();
  const std::size_t n = candidates_.size();
  const std::size_t k = policy_->sampling().Size(n);
  if (k == n) {
    scratch_storages_.assign(candidates_.begin(), candidates_.end());
  } else {
    // k distinct slots, uniformly (a partial Fisher-Yates shuffle of the
    // index itself: the order of candidates_ carries no meaning).
    for (std::size_t i = 0; i < k; ++i) {
      rng_state_ ^= rng_state_ << 13;
      rng_state_ ^= rng_state_ >> 7;
      rng_state_ ^= rng_state_ << 17;
      const std::size_t j = i + static_cast<std::size_t>(rng_state_ % (n - i));
      std::swap(candidates_[i], candidates_[j]);
      candidates_[i]->candidate_slot = i;
      candidates_[j]->candidate_slot = j;
      scratch_storages_.push_back(candidates_[i]);
    }
  }
  const policies::Needs needs = policy_->needs();
  const std::int64_t now = Clock();
  for (const Storage* s : scratch_storages_) {
    scratch_.push_back(MakeCandidate(s, needs, now));
    scratch_.back().id = scratch_.size() - 1;
  }
}

bool Runtime::Evict(const PressureRequest& request) {
  if (StepLimitReached()) return false;  // AllocateDevice says why
  ++stats_.pressure_events;
  const auto choose_start = std::chrono::steady_clock::now();
  GatherCandidates();
  if (scratch_.empty()) {
    if (options_.observer != nullptr) {
      options_.observer->OnPressure({.bytes = request.bytes, .stream = request.stream});
    }
    return false;
  }
  stats_.candidates_shown += scratch_.size();
  policies::PressureContext ctx;
  ctx.bytes_needed = request.bytes;
  ctx.stream = request.stream;
  ctx.now_ns = Clock();
  ctx.link_backlog_ns = std::max<std::int64_t>(link_free_at_ns_ - device_->NowNs(), 0);
  ctx.restore_backlog_ns = static_cast<std::int64_t>(
      static_cast<double>(host_pool_.in_use_bytes()) / options_.link_gbps);
  ctx.candidates = scratch_;
  if (!policy_->needs().neighbourhood) {
    ctx.complete_fn = &Runtime::CompleteCandidate;
    ctx.complete_arg = this;
  }
  MemoryMap map;
  if (policy_->needs().memory_map) {
    map = allocator_->GetMemoryMap();
    ctx.memory_map = &map;
  }
  const policies::Plan plan = policy_->Choose(ctx);
  stats_.choose_wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - choose_start)
                               .count();
  // The plan's storages, before carrying it out changes candidates_ (and so
  // possibly scratch_storages_'s source; the copy is ours).
  std::size_t freed = 0;
  std::size_t evicted = 0;
  bool progress = false;
  for (const policies::PlanStep& step : plan) {
    if (step.id >= scratch_storages_.size()) continue;  // a policy bug must not crash us
    Storage* s = scratch_storages_[step.id];
    if (s->pins > 0) continue;
    if (s->state == TensorState::kPrefetching) {
      // Evicted before its use: the copy in is abandoned (stream order keeps
      // the block until it completes).
      if (s->copy_in_flight) spare_events_.push_back(s->copy_event);
      s->copy_in_flight = false;
      SetState(s, TensorState::kResident);
    }
    if (s->state != TensorState::kResident) continue;
    const policies::Candidate& c = scratch_[step.id];
    bool done = false;
    if (step.action == policies::EvictAction::kOffload && c.can_offload) {
      done = OffloadStorage(s, request.stream);
      // The host pool is full: drop instead.
      if (!done && c.can_drop) done = DropStorage(s, request.stream, /*pressure=*/true);
    } else if (c.can_drop) {
      done = DropStorage(s, request.stream, /*pressure=*/true);
    }
    if (!done) continue;
    if (s->state == TensorState::kDropped) ++stats_.drops;
    progress = true;
    ++evicted;
    freed += s->bytes;
    if (freed >= request.bytes) break;
  }
  if (options_.observer != nullptr) {
    options_.observer->OnPressure({.bytes = request.bytes,
                                   .stream = request.stream,
                                   .candidates = scratch_.size(),
                                   .evicted = evicted,
                                   .freed_bytes = freed,
                                   .satisfied = progress});
  }
  return progress;
}

std::int64_t Runtime::AncestorsCost(const Storage* s) const {
  std::int64_t cost = 0;
  if (s->dropped_inputs > 0) {
    for (const Storage* in : s->inputs) cost += DroppedChainCost(in);
  }
  return cost;
}

void Runtime::CompleteCandidate(const void* self, policies::Candidate& c) {
  // Called from the policy's Choose, which Evict runs under the runtime's lock.
  const auto* rt = static_cast<const Runtime*>(self);
  if (c.id >= rt->scratch_storages_.size()) return;
  c.ancestors_ns = rt->AncestorsCost(rt->scratch_storages_[c.id]);
  c.neighbourhood_ns = c.ancestors_ns + c.consumers_ns;
}

std::int64_t Runtime::DroppedChainCost(const Storage* root) const {
  // What regenerating `root` would cost if it is dropped: its closure and
  // those of the dropped ancestors it needs first, each counted once (DTR's
  // evicted neighbourhood, upstream side). The walk stops after
  // kMaxNeighbourhood tensors: enough to see a cascade, bounded per decision
  // even when a 100,000-long chain behind it is dropped.
  constexpr std::size_t kMaxNeighbourhood = 32;
  if (root->state != TensorState::kDropped) return 0;
  if (root->chain_epoch == chain_epoch_) return root->chain_cost;
  // Visited storages carry this walk's mark: no search through `seen`.
  const std::uint64_t mark = ++walk_mark_;
  absl::InlinedVector<const Storage*, kMaxNeighbourhood> seen = {root};
  root->walk_mark = mark;
  std::int64_t cost = 0;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    // One run regenerates a call's dropped outputs: its cost counts once.
    const CallGroup* g = seen[i]->group;
    if (g == nullptr) {
      cost += seen[i]->compute_ns;
    } else if (g->walk_mark != mark) {
      g->walk_mark = mark;
      cost += seen[i]->compute_ns;
    }
    for (const Storage* in : seen[i]->inputs) {
      if (seen.size() >= kMaxNeighbourhood) break;
      if (in->state == TensorState::kDropped && in->walk_mark != mark) {
        in->walk_mark = mark;
        seen.push_back(in);
      }
    }
  }
  root->chain_epoch = chain_epoch_;
  root->chain_cost = cost;
  return cost;
}

void Runtime::QueueOnLink(std::size_t bytes) {
  const std::int64_t start = std::max(link_free_at_ns_, device_->NowNs());
  link_free_at_ns_ = start + options_.link_latency_ns +
                     static_cast<std::int64_t>(static_cast<double>(bytes) / options_.link_gbps);
}

void Runtime::HandBack(Storage* s, Stream to) {
  for (Stream used : s->used_streams) (void)WaitOn(to, used);
  absl::Status freed = allocator_->FreeOnStream(s->device, to);
  if (!freed.ok()) REMAT_LOG(kError, "runtime: giving back a block: %s", freed.ToString());
  LeaveDevice(s);
}

bool Runtime::DropStorage(Storage* s, Stream to, bool pressure) {
  HandBack(s, to);
  SetState(s, TensorState::kDropped);
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kDropped, .pressure = pressure});
  }
  return true;
}

bool Runtime::OffloadStorage(Storage* s, Stream to) {
  absl::StatusOr<void*> host = host_pool_.Allocate(s->bytes);
  if (!host.ok()) return false;
  // Copy out on the copy stream, behind every use of the block.
  for (Stream used : s->used_streams) (void)WaitOn(copy_stream_, used);
  absl::StatusOr<Event> done = TakeEvent();
  absl::Status st = done.ok() ? device_->CopyAsync(*host, s->device, s->bytes,
                                                   CopyKind::kDeviceToHost, copy_stream_)
                              : done.status();
  if (st.ok()) st = device_->RecordEvent(*done, copy_stream_);
  if (!st.ok()) {
    REMAT_LOG(kWarning, "runtime: offload failed, trying another eviction: %s", st.ToString());
    if (done.ok()) spare_events_.push_back(*done);
    (void)host_pool_.FreeAfter(*host, copy_stream_);
    return false;
  }
  // The block goes back on `to`, which waits for the copy out: stream-ordered,
  // the host never blocks.
  s->used_streams.assign({copy_stream_});
  HandBack(s, to);
  s->host = *host;
  s->copy_event = *done;
  s->copy_in_flight = true;
  SetState(s, TensorState::kOffloading);
  stats_.offloaded_bytes += s->bytes;
  QueueOnLink(s->bytes);
  ++stats_.offloads;
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kOffloaded, .stream = copy_stream_, .pressure = true});
  }
  return true;
}

}  // namespace remat
