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
  return c.compute_ns + c.neighbourhood_ns <= c.transfer_ns ? EvictAction::kDrop
                                                            : EvictAction::kOffload;
}

Plan ScoredPolicy::Choose(const PressureContext& ctx) {
  std::vector<std::pair<double, const Candidate*>> scored;
  scored.reserve(ctx.candidates.size());
  for (const Candidate& c : ctx.candidates) {
    if (!c.can_drop && !c.can_offload) continue;
    scored.emplace_back(Score(c, ctx), &c);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second->id < b.second->id;
  });
  Plan plan;
  std::size_t covered = 0;
  for (const auto& [score, c] : scored) {
    if (covered >= ctx.bytes_needed) break;
    plan.push_back(PlanStep{c->id, CheaperAction(*c)});
    covered += c->bytes;
  }
  return plan;
}

}  // namespace remat::policies
