#include "policies/scored_policy.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace remat::policies {

const char* EvictActionName(EvictAction action) {
  return action == EvictAction::kDrop ? "drop" : "offload";
}

EvictAction CheaperAction(const Candidate& c) {
  if (!c.can_offload) return EvictAction::kDrop;
  if (!c.can_drop) return EvictAction::kOffload;
  return c.compute_ns + c.neighbourhood_ns <= OffloadNs(c) ? EvictAction::kDrop
                                                            : EvictAction::kOffload;
}

EvictAction ScoredPolicy::Action(const Candidate& c, const PressureContext&) const {
  return CheaperAction(c);
}

double Staleness(const Candidate& c, const PressureContext& ctx) {
  return static_cast<double>(std::max<std::int64_t>(ctx.now_ns - c.last_access_ns, 1));
}

double EvictionCost(const Candidate& c, double recompute_ns) {
  if (c.can_offload && (!c.can_drop || static_cast<double>(OffloadNs(c)) < recompute_ns)) {
    return static_cast<double>(OffloadNs(c));
  }
  return recompute_ns;
}

Plan ScoredPolicy::Choose(const PressureContext& ctx) {
  std::vector<std::pair<double, const Candidate*>> scored;
  scored.reserve(ctx.candidates.size());
  for (const Candidate& c : ctx.candidates) {
    if (!c.can_drop && !c.can_offload) continue;
    scored.emplace_back(Score(c, ctx), &c);
  }
  auto later = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->id > b.second->id;
  };
  Plan plan;
  std::size_t covered = 0;
  auto take = [&](const Candidate& c) {
    Candidate chosen = c;
    ctx.Complete(chosen);  // the neighbourhood the action weighs, if it was left out
    plan.push_back(PlanStep{chosen.id, Action(chosen, ctx)});
    covered += chosen.bytes;
  };
  if (scored.empty() || ctx.bytes_needed == 0) return plan;
  // Most decisions need only the lowest score: one pass finds it. Where it
  // does not cover the request, a heap orders the rest (the few next lowest
  // are usually enough).
  auto lowest = std::min_element(scored.begin(), scored.end(),
                                 [&](const auto& a, const auto& b) { return later(b, a); });
  take(*lowest->second);
  if (covered >= ctx.bytes_needed) return plan;
  std::iter_swap(lowest, scored.end() - 1);
  scored.pop_back();
  std::make_heap(scored.begin(), scored.end(), later);
  for (auto end = scored.end(); end != scored.begin() && covered < ctx.bytes_needed; --end) {
    std::pop_heap(scored.begin(), end, later);
    take(*(end - 1)->second);
  }
  return plan;
}

}  // namespace remat::policies
