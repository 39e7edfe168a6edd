// Runtime's diagnostics (what an out-of-memory error says) and its
// invariants across the parts (CheckInvariants; each part checks its own).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace remat {
namespace {

using runtime_internal::CallGroup;
using runtime_internal::IsCandidate;
using runtime_internal::Storage;

// The error CheckInvariants returns: the invariant, and the storage it saw
// it broken on.
template <typename... Args>
absl::Status BrokenAt(const Storage* s, const absl::FormatSpec<Args...>& format,
                      const Args&... args) {
  return absl::InternalError(absl::StrFormat("runtime invariant broken: storage #%d (serial %d, %s): %s",
                                             s->FirstId(), s->serial, TensorStateName(s->state),
                                             absl::StrFormat(format, args...)));
}
template <typename... Args>
absl::Status Broken(const absl::FormatSpec<Args...>& format, const Args&... args) {
  return absl::InternalError(
      absl::StrCat("runtime invariant broken: ", absl::StrFormat(format, args...)));
}

bool OnDevice(const Storage& s) {
  return s.state == TensorState::kResident || s.state == TensorState::kPrefetching;
}

// A collected storage waiting in the pool is as Storage::Reset left it.
bool IsReset(const Storage& s) {
  return s.pins == 0 && s.handles == 0 && s.dependents == 0 && s.device == nullptr &&
         s.host == nullptr && s.ahead == nullptr && !s.copy_in_flight &&
         s.candidate_slot == Storage::kNoSlot &&
         s.class_node == Storage::kNoClass && s.group == nullptr && s.regen_owner == nullptr &&
         s.drop_charge_ns == 0 && s.dropped_inputs == 0 && s.dropped_consumer_ns == 0 &&
         s.round_trip_ns == 0 && s.planned_prefetch_at == -1 && !s.prefetch_evicted &&
         !s.recompute && s.inputs.empty() && s.consumers.empty() && s.used_streams.empty() &&
         s.tensor_ids.empty();
}

}  // namespace

std::string Runtime::DescribePressure(std::size_t bytes, bool live) const {
  std::size_t pinned_bytes = 0, evictable_bytes = 0, pinned_count = 0;
  std::vector<std::pair<std::size_t, TensorId>> pinned;
  for (const auto& s : storages_.all()) {
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
  // The budget that bound: the live budget over resident bytes, or the
  // device's (with a live budget too, the device may be only an address space).
  const std::string budget =
      live
          ? absl::StrCat("live budget ", FormatBytes(options_.live_budget), " with ",
                         FormatBytes(stats_.resident_bytes), " resident")
          : absl::StrCat("device budget ", FormatBytes(allocator_->budget()));
  // The host pool matters only where offloads may fill it.
  const std::string host =
      options_.enable_offload
          ? absl::StrFormat(", pinned host pool %s of %s in use",
                            FormatBytes(host_pool_.in_use_bytes()),
                            FormatBytes(host_pool_.capacity()))
          : std::string();
  return absl::StrFormat(
      "remat runtime cannot make room for %s: %d tensors pinned (%s; largest: %s), %s still "
      "evictable, %s, policy %s%s",
      FormatBytes(bytes), pinned_count, FormatBytes(pinned_bytes),
      largest.empty() ? "none" : largest, FormatBytes(evictable_bytes), budget, policy_->Spec(),
      host);
}

absl::Status Runtime::CheckStorages() const {
  // What each storage's neighbours say its counts should be.
  struct Tally {
    int dependents = 0;
    std::int64_t dropped_consumer_ns = 0;
    std::vector<const Storage*> consumers;
  };
  absl::flat_hash_map<const Storage*, Tally> tally;
  std::uint64_t resident_bytes = 0;
  std::size_t indexed = 0, collected = 0;
  std::vector<std::uintptr_t> copy_events;
  std::size_t ahead_bytes = 0;
  const bool between_regenerations = deferring_depth_ == 0;
  for (const Storage* s : storages_.all()) {
    if (s->state == TensorState::kFreed) {
      if (!IsReset(*s)) return BrokenAt(s, "collected but not reset");
      ++collected;
      continue;
    }
    if (s->tensor_ids.empty()) return BrokenAt(s, "uncollected without an id");
    if (s->serial == 0 || s->serial >= next_serial_) {
      return BrokenAt(s, "serial not handed out (next %d)", next_serial_);
    }
    if (s->pins < 0 || s->handles < 0 || s->dependents < 0) {
      return BrokenAt(s, "negative count: %d pins, %d handles, %d dependents", s->pins, s->handles,
                    s->dependents);
    }
    if (OnDevice(*s)) resident_bytes += s->bytes;
    if ((s->device != nullptr) != (OnDevice(*s) && s->bytes > 0)) {
      return BrokenAt(s, "%s a device block", s->device != nullptr ? "holds" : "lacks");
    }
    const bool host_state =
        s->state == TensorState::kOffloading || s->state == TensorState::kOnHost;
    if ((s->host != nullptr) != host_state) {
      return BrokenAt(s, "%s a host buffer", s->host != nullptr ? "holds" : "lacks");
    }
    if (s->kept != nullptr && (!host_state || !options_.keep_addresses)) {
      return BrokenAt(s, "keeps a device address while %s", TensorStateName(s->state));
    }
    const bool copy_state =
        s->state == TensorState::kOffloading || s->state == TensorState::kPrefetching;
    if (s->copy_in_flight != copy_state) {
      return BrokenAt(s, "%s a copy in flight", s->copy_in_flight ? "holds" : "lacks");
    }
    if (s->copy_in_flight) copy_events.push_back(s->copy_event.handle);
    if (s->ahead != nullptr) {
      if (s->state != TensorState::kResident || !s->read_only || !s->may_offload) {
        return BrokenAt(s, "holds a copy made ahead while %s (read_only %d, may_offload %d)",
                        TensorStateName(s->state), static_cast<int>(s->read_only),
                        static_cast<int>(s->may_offload));
      }
      ahead_bytes += s->bytes;
      copy_events.push_back(s->ahead_event.handle);
    }
    if (s->round_trip_ns != link_.RoundTripNs(s->bytes)) {
      return BrokenAt(s, "round trip %d ns kept for %d bytes, where the link takes %d ns",
                    s->round_trip_ns, s->bytes, link_.RoundTripNs(s->bytes));
    }
    if (s->evictable != (s->bytes > 0 && (s->may_drop || s->may_offload))) {
      return BrokenAt(s, "evictable is %d with %d bytes, may_drop %d, may_offload %d",
                    static_cast<int>(s->evictable), s->bytes, static_cast<int>(s->may_drop),
                    static_cast<int>(s->may_offload));
    }
    // The candidate index holds exactly the candidates.
    const bool in_index = s->candidate_slot != Storage::kNoSlot;
    if (IsCandidate(*s) != in_index) {
      return BrokenAt(s, "%s the candidate index (%d pins)", in_index ? "wrongly in" : "missing from",
                    s->pins);
    }
    if (in_index) {
      if (s->candidate_slot >= candidates_.size() || candidates_.all()[s->candidate_slot] != s) {
        return BrokenAt(s, "its candidate slot %d holds another storage", s->candidate_slot);
      }
      ++indexed;
    }
    // Claims: pinned, dropped, and only while a regeneration runs.
    if (s->regen_owner != nullptr) {
      if (between_regenerations) return BrokenAt(s, "claimed with no regeneration running");
      if (s->pins <= 0 || s->state != TensorState::kDropped) {
        return BrokenAt(s, "claimed but %d pins", s->pins);
      }
    }
    // Drops: a closure to come back with, and the call's cost carried once.
    if (s->state == TensorState::kDropped) {
      const bool closure = s->group != nullptr ? static_cast<bool>(s->group->recompute)
                                               : static_cast<bool>(s->recompute);
      if (!s->may_drop || !closure) return BrokenAt(s, "dropped without a closure");
      if (s->group == nullptr && s->drop_charge_ns != s->compute_ns) {
        return BrokenAt(s, "dropped, charged %d ns of its %d", s->drop_charge_ns, s->compute_ns);
      }
    } else if (s->drop_charge_ns != 0) {
      return BrokenAt(s, "not dropped but charged %d ns", s->drop_charge_ns);
    }
    int dropped_inputs = 0;
    for (const Storage* in : s->inputs) {
      if (in->state == TensorState::kFreed) return BrokenAt(s, "reads a collected storage");
      if (in->state == TensorState::kDropped) ++dropped_inputs;
      Tally& t = tally[in];
      ++t.dependents;
      t.consumers.push_back(s);
      if (s->state == TensorState::kDropped) t.dropped_consumer_ns += s->drop_charge_ns;
    }
    if (s->dropped_inputs != dropped_inputs) {
      return BrokenAt(s, "counts %d dropped inputs, has %d", s->dropped_inputs, dropped_inputs);
    }
    if (s->group != nullptr && (s->output_index >= s->group->outputs.size() ||
                                s->group->outputs[s->output_index] != s)) {
      return BrokenAt(s, "its call's output %d is another storage", s->output_index);
    }
    if (between_regenerations && s->handles == 0 && s->pins == 0 && s->dependents == 0) {
      return BrokenAt(s, "nothing holds it, yet it is not collected");
    }
  }
  // The neighbours' side of each edge.
  for (const Storage* s : storages_.all()) {
    if (s->state == TensorState::kFreed) continue;
    auto it = tally.find(s);
    Tally t = it != tally.end() ? std::move(it->second) : Tally{};
    if (s->dependents != t.dependents) {
      return BrokenAt(s, "counts %d dependents, is read by %d", s->dependents, t.dependents);
    }
    std::vector<const Storage*> consumers(s->consumers.begin(), s->consumers.end());
    std::sort(consumers.begin(), consumers.end());
    std::sort(t.consumers.begin(), t.consumers.end());
    if (consumers != t.consumers) return BrokenAt(s, "its consumers are not its readers");
    if (s->dropped_consumer_ns != t.dropped_consumer_ns) {
      return BrokenAt(s, "counts %d ns of dropped consumers, they carry %d", s->dropped_consumer_ns,
                    t.dropped_consumer_ns);
    }
  }
  if (indexed != candidates_.size()) {
    return Broken("the candidate index holds %d storages, %d are candidates", candidates_.size(),
                  indexed);
  }
  if (collected != storages_.given_back().size()) {
    return Broken("%d storages collected, %d waiting in the pool", collected,
                  storages_.given_back().size());
  }
  for (const Storage* s : storages_.given_back()) {
    if (s->state != TensorState::kFreed) return BrokenAt(s, "in the pool but not collected");
  }
  if (resident_bytes != stats_.resident_bytes) {
    return Broken("resident_bytes is %d, storages on the device hold %d", stats_.resident_bytes,
                  resident_bytes);
  }
  if (stats_.peak_resident_bytes < stats_.resident_bytes) {
    return Broken("peak_resident_bytes %d below resident_bytes %d", stats_.peak_resident_bytes,
                  stats_.resident_bytes);
  }
  if (options_.live_budget != 0 &&
      stats_.resident_bytes + pending_live_bytes_ > options_.live_budget) {
    return Broken("%d bytes resident and %d pending, over the live budget of %d",
                  stats_.resident_bytes, pending_live_bytes_, options_.live_budget);
  }
  if (ahead_bytes != ahead_bytes_) {
    return Broken("ahead_bytes is %d, copies made ahead hold %d", ahead_bytes_, ahead_bytes);
  }
  // Copy events in flight: one storage each, none spare.
  std::sort(copy_events.begin(), copy_events.end());
  if (std::adjacent_find(copy_events.begin(), copy_events.end()) != copy_events.end()) {
    return Broken("two copies in flight share an event");
  }
  for (Event e : events_.spare()) {
    if (std::binary_search(copy_events.begin(), copy_events.end(), e.handle)) {
      return Broken("event %#x is spare while a copy in flight holds it", e.handle);
    }
  }
  return CheckGroups();
}

absl::Status Runtime::CheckGroups() const {
  absl::flat_hash_set<const CallGroup*> spare(groups_.given_back().begin(),
                                              groups_.given_back().end());
  for (const CallGroup* g : groups_.all()) {
    if (spare.contains(g)) {
      if (!g->outputs.empty() || g->uncollected != 0 || g->dropped != 0 || g->recompute) {
        return Broken("a call group in the pool is not reset");
      }
      continue;
    }
    std::size_t uncollected = 0;
    int dropped = 0;
    std::int64_t charged = 0, cost = 0;
    for (std::size_t i = 0; i < g->outputs.size(); ++i) {
      const Storage* m = g->outputs[i];
      if (m == nullptr) continue;
      ++uncollected;
      cost = m->compute_ns;
      if (m->state == TensorState::kFreed || m->group != g || m->output_index != i) {
        return BrokenAt(m, "output %d of a call group that is not its group", i);
      }
      if (m->state == TensorState::kDropped) {
        ++dropped;
        charged += m->drop_charge_ns;
      }
    }
    if (uncollected == 0 || uncollected != g->uncollected) {
      return Broken("a call group counts %d uncollected outputs, holds %d", g->uncollected,
                    uncollected);
    }
    if (dropped != g->dropped) {
      return Broken("a call group counts %d dropped outputs, has %d", g->dropped, dropped);
    }
    if (dropped > 0 && charged != cost) {
      return Broken("a call's dropped outputs carry %d ns of its %d", charged, cost);
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::CheckClasses() const {
  if (!track_classes_) {
    if (classes_.nodes() != 0) return Broken("drop classes kept for a policy that reads none");
    return absl::OkStatus();
  }
  std::uint64_t dropped = 0;
  absl::flat_hash_map<std::uint32_t, std::int64_t> class_cost;  // root -> summed charges
  for (const Storage* s : storages_.all()) {
    const bool has_node = s->class_node != Storage::kNoClass;
    if ((s->state == TensorState::kDropped) != has_node) {
      return BrokenAt(s, "%s a drop class", has_node ? "holds" : "lacks");
    }
    if (!has_node) continue;
    if (s->class_node >= classes_.nodes()) return BrokenAt(s, "its class node is not a node");
    ++dropped;
    class_cost[classes_.RootOf(s->class_node)] += s->drop_charge_ns;
  }
  if (dropped != classes_.members()) {
    return Broken("drop classes count %d members, %d storages are dropped", classes_.members(),
                  dropped);
  }
  for (std::uint32_t node = 0; node < classes_.nodes(); ++node) {
    if (!classes_.IsRoot(node)) continue;
    auto it = class_cost.find(node);
    const std::int64_t want = it != class_cost.end() ? it->second : 0;
    if (classes_.Cost(node) != want) {
      return Broken("drop class %d costs %d ns, its dropped members carry %d", node,
                    classes_.Cost(node), want);
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::CheckTableAndStats() const {
  // Ids to storages and back.
  std::uint64_t not_freed = 0, with_storage = 0;
  absl::Status status;
  tensors_.ForEachEntry([&](TensorId id, const Tensor& e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!e.freed) ++not_freed;
    if (e.storage == nullptr || !status.ok()) return;
    ++with_storage;
    const auto& ids = e.storage->tensor_ids;
    if (e.storage->state == TensorState::kFreed || std::find(ids.begin(), ids.end(), id) == ids.end()) {
      status = Broken("tensor %d names a storage that does not name it", id);
    }
  });
  if (!status.ok()) return status;
  std::uint64_t ids = 0, handles = 0;
  for (const Storage* s : storages_.all()) {
    if (s->state == TensorState::kFreed) continue;
    int not_freed_here = 0;
    for (TensorId id : s->tensor_ids) {
      const Tensor* t = tensors_.Find(id);
      if (t == nullptr || t->storage != s) return BrokenAt(s, "tensor %d does not name it", id);
      if (!t->freed) ++not_freed_here;
    }
    if (s->handles != not_freed_here) {
      return BrokenAt(s, "counts %d handles, %d of its tensors are not freed", s->handles,
                    not_freed_here);
    }
    ids += s->tensor_ids.size();
    handles += static_cast<std::uint64_t>(s->handles);
  }
  if (ids != with_storage) {
    return Broken("%d table entries name a storage, storages name %d ids", with_storage, ids);
  }
  if (stats_.live_tensors != not_freed || handles != not_freed) {
    return Broken("live_tensors is %d, %d ids are not freed, storages count %d handles",
                  stats_.live_tensors, not_freed, handles);
  }
  if (stats_.tensors_created != tensors_.next_id() - 1) {
    return Broken("tensors_created is %d, %d ids were handed out", stats_.tensors_created,
                  tensors_.next_id() - 1);
  }
  // Regenerations: what only lives while one runs.
  if (deferring_depth_ < 0 || regen_waiters_ < 0) {
    return Broken("%d regenerations deferring, %d threads waiting", deferring_depth_,
                  regen_waiters_);
  }
  if (deferring_depth_ == 0 && (!deferred_collect_.empty() || pending_live_bytes_ != 0)) {
    return Broken("no regeneration runs, yet %d storages wait to be collected and %d bytes pend",
                  deferred_collect_.size(), pending_live_bytes_);
  }
  return absl::OkStatus();
}

}  // namespace remat
