// ScoredPolicy: the shape most policies share. Score every candidate, evict
// the lowest scores first until the bytes needed are covered, and for each
// choose the cheaper way out: drop when recompute costs no more than the
// round trip over the link (or offloading is not allowed), else offload.
#ifndef REMAT_POLICIES_SCORED_POLICY_H_
#define REMAT_POLICIES_SCORED_POLICY_H_

#include <cmath>

#include "policies/eviction_policy.h"

namespace remat::policies {

class ScoredPolicy : public EvictionPolicy {
 public:
  Plan Choose(const PressureContext& ctx) final;

 protected:
  // Lower scores are evicted first. Ties go to the lower Candidate::id, so
  // plans are deterministic: the candidate's slot in the runtime's candidate
  // index (an array that moves its last entry into a freed slot), not the
  // tensor's id or age.
  virtual double Score(const Candidate& c, const PressureContext& ctx) const = 0;
  // How to evict a chosen candidate: CheaperAction unless a policy knows better.
  virtual EvictAction Action(const Candidate& c, const PressureContext& ctx) const;
};

// Time since the candidate's last use, at least 1 ns.
double Staleness(const Candidate& c, const PressureContext& ctx);
// x^e, without pow's cost for the usual exponents 1 and 0.
inline double Power(double x, double e) {
  if (e == 1.0) return x;
  if (e == 0.0) return 1.0;
  return std::pow(x, e);
}
// The cost of bringing it back the way CheaperAction would evict it:
// recompute (with `recompute_ns` as its cost) or the copy round trip.
double EvictionCost(const Candidate& c, double recompute_ns);

// The cheaper allowed way to evict `c` (it must allow at least one).
EvictAction CheaperAction(const Candidate& c);
// Never used again by the program, read by no dropped tensor's closure, and
// droppable: never recomputed, so a drop frees it for nothing (an offload
// would make the request wait for a copy no one reads).
inline bool FreeToDrop(const Candidate& c) {
  return c.can_drop && c.next_use_ns == kNeverUsedAgain && c.consumers_ns == 0;
}

}  // namespace remat::policies

#endif  // REMAT_POLICIES_SCORED_POLICY_H_
