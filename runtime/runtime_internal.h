// The runtime's own records, shared by its .cc files (runtime.cc,
// runtime_state.cc, runtime_recompute.cc, runtime_evict.cc,
// runtime_transfer.cc, runtime_check.cc) and the parts that touch storages
// (candidate_index.cc). Nothing outside runtime/ includes it: the public
// interface is runtime.h.
#ifndef REMAT_RUNTIME_RUNTIME_INTERNAL_H_
#define REMAT_RUNTIME_RUNTIME_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "absl/base/attributes.h"
#include "absl/container/inlined_vector.h"
#include "runtime/runtime.h"

namespace remat::runtime_internal {

struct Storage;

// The outputs of a call with several: one closure regenerates all of them
// that are lost. Pooled; kept while any output is uncollected.
struct CallGroup {
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
struct StorageFields {
  TensorState state = TensorState::kFreed;  // not yet on the device: SetResident at creation
  // What the tensor and the runtime's options allow, fixed at creation.
  bool may_drop = false;     // allowed, enabled, and a closure to recompute it
  bool may_offload = false;  // allowed and enabled
  bool evictable = false;    // non-empty, and may_drop or may_offload
  bool copy_in_flight = false;
  int pins = 0;
  int handles = 0;     // tensors over this storage the owner has not freed
  int dependents = 0;  // uncollected storages whose closures read this one
  // The program released its last handle and no collection has looked at it
  // since (it was pinned then, say): its bytes go at that collection, kept
  // or not (RuntimeOptions::keep_regenerated keeps only what a regeneration
  // brought back).
  bool just_released = false;
  static constexpr std::size_t kNoSlot = SIZE_MAX;
  std::size_t candidate_slot = kNoSlot;  // its slot in the CandidateIndex, while a candidate
  std::size_t bytes = 0;
  void* device = nullptr;  // resident, prefetching
  // What a pressure event's candidate reads (Runtime::MakeCandidate), kept
  // together after the state: building ~250 candidates an event otherwise
  // misses the cache on several lines of each storage.
  std::int64_t compute_ns = 0;
  std::int64_t round_trip_ns = 0;  // HostLink::RoundTripNs(bytes), reckoned once
  std::int64_t last_access_ns = 0;
  std::uint64_t accesses = 0;
  // copy_ahead: while resident, a host buffer with its bytes (once
  // ahead_event is reached), copied out before any pressure asked for it.
  void* ahead = nullptr;
  std::int64_t first_access_ns = 0;
  std::int64_t next_use_at = -1;          // HintNextUse's device time; -1 unknown
  // RuntimeStats::recompute_ns when next_use_at was set: the recomputes run
  // since then delay the use by as much (Runtime::MakeCandidate).
  std::int64_t next_use_recomputed_ns = 0;
  std::uint64_t recomputes = 0;
  static constexpr std::uint32_t kNoClass = DropClasses::kNone;
  std::uint32_t class_node = kNoClass;    // while dropped: its node in the DropClasses
  // Kept by SetState, so building a candidate reads no neighbour that cannot matter.
  int dropped_inputs = 0;                 // entries of `inputs` now dropped
  std::int64_t dropped_consumer_ns = 0;   // summed drop_charge_ns of `consumers` now dropped
  std::uint64_t serial = 0;
  void* host = nullptr;    // offloading, on_host
  void* kept = nullptr;    // offloading, on_host with keep_addresses: the block, unbacked
  std::size_t kept_bytes = 0;  // with `kept`: the bytes of the pages given up (whole pages only)
  // Resident bytes the runtime itself wrote (a recompute, a restore, a
  // prefetch) on `written_on`: an acquire on another stream waits for that
  // stream first (the program ordered nothing after the runtime's write).
  bool runtime_wrote = false;
  Stream written_on;
  Event copy_event;        // the offload's or the prefetch's copy, while copy_in_flight
  bool read_only = false;  // TensorOptions::read_only
  Event ahead_event;       // with `ahead`: its copy out
  mutable std::uint64_t walk_mark = 0;   // the last DroppedChainCost walk that saw it
  // DroppedChainCost of this storage, valid during pressure event chain_epoch
  // (candidates sharing an input walk its ancestors once per event).
  mutable std::uint64_t chain_epoch = 0;
  mutable std::int64_t chain_cost = 0;
  // learn_next_use: its place among the tensors made in its step, and that
  // step (0: none, or a step that has ended).
  std::uint32_t step_index = 0;
  std::uint32_t step_epoch = 0;
  bool next_use_learned = false;  // next_use_at is LearnUse's estimate (not a hint)
  std::int64_t planned_prefetch_at = -1;  // its entry in Runtime::planned_ (-1: none)
  // A prefetch of it was evicted before the program used it: no other is
  // planned until the program does (it comes back on access).
  bool prefetch_evicted = false;
  // RuntimeOptions::estimate_replays: its entry in Runtime::replay_estimates_
  // (what a replay of it holds at once), or kNoEstimate.
  static constexpr std::uint32_t kNoEstimate = UINT32_MAX;
  std::uint32_t replay_estimate = kNoEstimate;
  // A call's outputs: the group (nullptr for a one-output call), and its place in it.
  CallGroup* group = nullptr;
  std::uint32_t output_index = 0;
  // Made by CreateCall: its closure regenerates by `outputs` and
  // `regenerate`, so AddCallOutput may give its call more outputs.
  bool call_closure = false;
  // While dropped, what regenerating it adds to a neighbourhood: the call's
  // cost on one dropped output of a call, 0 on its dropped siblings (one run
  // regenerates them all, charged once).
  std::int64_t drop_charge_ns = 0;
  // The thread regenerating it now (it is claimed, and pinned), or nullptr.
  const void* regen_owner = nullptr;
};

struct Storage : StorageFields {
  static_assert(std::is_trivially_copyable_v<StorageFields>);  // Reset assigns it whole
  RecomputeFn recompute;  // one-output calls (a group's outputs use the group's)
  // (Inline: most ops read up to four tensors, and are read by a few.)
  absl::InlinedVector<Storage*, 4> inputs;     // what the closure reads
  absl::InlinedVector<Storage*, 4> consumers;  // droppable storages whose closures read this one
  absl::InlinedVector<Stream, 2> used_streams;  // streams that used the device block
  absl::InlinedVector<TensorId, 2> tensor_ids;  // (a storage and a view of it, inline)

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
  // The first id over it (0 if none), for messages.
  TensorId FirstId() const { return tensor_ids.empty() ? 0 : tensor_ids.front(); }
};

// Recompute closures this thread is running (RunCall): what they create and
// acquire is the runtime's own work, not the program's, and teaches
// learn_next_use nothing.
inline thread_local int closures_running = 0;

// What a policy may evict now: on the device, unpinned, evictable. A
// prefetched tensor (its copy in may still run) can go again: its block is
// handed back behind the copy, like any other use.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool IsCandidate(const StorageFields& s) {
  const bool on_device = s.state == TensorState::kResident || s.state == TensorState::kPrefetching;
  return on_device && s.pins == 0 && s.evictable;
}

// What a copy ahead may be made of (RuntimeOptions::copy_ahead): resident,
// unpinned, allowed to be offloaded, and never written after its creation.
inline bool CanCopyAhead(const StorageFields& s) {
  return s.state == TensorState::kResident && s.read_only && s.may_offload && s.pins == 0;
}

}  // namespace remat::runtime_internal

namespace remat {

// Lets go of the runtime's lock while a closure runs or a thread waits, and
// takes it back (runtime.cc, beside the lock).
class Runtime::Unlocked {
 public:
  explicit Unlocked(const Runtime* r);
  ~Unlocked();
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  const Runtime* r_;
  const void* previous_;
};

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Runtime::Reindex(Storage* s) {
  const bool candidate = runtime_internal::IsCandidate(*s);
  const bool indexed = s->candidate_slot != Storage::kNoSlot;
  if (candidate != indexed) {
    if (candidate) {
      candidates_.Add(s);
    } else {
      candidates_.Remove(s);
    }
  }
}

inline std::int64_t Runtime::Clock() const { return AddTimes(device_->NowNs(), work_ns_); }

ABSL_ATTRIBUTE_ALWAYS_INLINE inline Runtime::Storage* Runtime::LiveOrNull(TensorId id) const {
  const Tensor* t = tensors_.Find(id);
  return t == nullptr || t->freed ? nullptr : t->storage;
}

}  // namespace remat

#endif  // REMAT_RUNTIME_RUNTIME_INTERNAL_H_
