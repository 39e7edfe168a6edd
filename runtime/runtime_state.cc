// Runtime's state changes and what they keep in step: the candidate index,
// the dropped-neighbour counts and charges, and DTR's drop classes.
#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace remat {

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
        JoinClasses(s);
      } else {
        // Classes only merge (as DTR's union-find does); a member that comes
        // back takes its own cost out of its class.
        classes_.Leave(s->class_node, s->drop_charge_ns);
        s->class_node = Storage::kNoClass;
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
      classes_.AddCost(m->class_node, m->drop_charge_ns);
    }
    return;
  }
}

void Runtime::JoinClasses(Storage* s) {
  s->class_node = classes_.Add(s->drop_charge_ns);
  auto join = [&](const Storage* other) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (other->state != TensorState::kDropped || other->class_node == Storage::kNoClass) return;
    classes_.Join(s->class_node, other->class_node);
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
    const std::uint32_t root = classes_.Root(other->class_node);
    if (std::find(roots.begin(), roots.end(), root) != roots.end()) return;
    roots.push_back(root);
    cost += std::max<std::int64_t>(classes_.Cost(root), 0);
  };
  if (s->dropped_inputs > 0) {
    for (const Storage* in : s->inputs) add(in);
  }
  if (s->dropped_consumer_ns > 0) {
    for (const Storage* out : s->consumers) add(out);
  }
  return cost;
}

void Runtime::SetResident(Storage* s, void* ptr, const Stream* written_on) {
  SetState(s, TensorState::kResident);
  s->device = ptr;
  s->runtime_wrote = written_on != nullptr;
  if (written_on != nullptr) s->written_on = *written_on;
  stats_.resident_bytes += s->bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
}

void Runtime::LeaveDevice(Storage* s) {
  stats_.resident_bytes -= s->bytes;
  s->device = nullptr;
  s->used_streams.clear();
}

}  // namespace remat
