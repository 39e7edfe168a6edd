// Where evicting makes room for a request that needs its bytes in one place.
//
// Under a reserved budget the bytes an allocation lacks must be free in one
// place: a run of address-neighbouring blocks, each free or held by an
// evictable tensor, in a segment of the pool the request is served from, or
// enough memory given back (whole fixed segments, whole pages of expandable
// ones) that the pool can grow within the budget. CheapestCoveringRun finds
// the run whose tensors cost least to evict (free blocks cost nothing), after
// Coop's sliding window; PlanMakesRoom and StepsToMakeRoom say whether, and
// after how many steps, a plan makes room. The `window` policy plans with the
// first at every pressure event; the runtime (RuntimeOptions::
// retry_in_one_place) uses all three for any policy whose plan would free a
// request's bytes in scattered places.
#ifndef REMAT_POLICIES_COVERING_RUN_H_
#define REMAT_POLICIES_COVERING_RUN_H_

#include <cstddef>
#include <optional>

#include "absl/functional/function_ref.h"
#include "policies/eviction_policy.h"

namespace remat::policies {

// What evicting two candidates together costs beyond their own costs (a
// recompute of one that must first recompute the other): calls `visit` with
// each candidate related to `c` and the extra cost of the pair, the same
// from either side. Never negative.
using Related = absl::FunctionRef<void(
    const Candidate& c, absl::FunctionRef<void(const Candidate& other, double extra)> visit)>;

// The run's evictable candidates in address order, each with CheaperAction;
// an empty plan when a covering run of free blocks alone exists (the hole is
// there already); nullopt when no run covers the request (it needs a new
// segment, or pinned and foreign blocks break every run) or ctx has no
// memory map. `cost` is never negative. With `related`, a run also costs the
// extra of every related pair among its members; `price`, where given,
// receives the run's cost.
std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost);
std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost,
                                        Related related, double* price = nullptr);

// Whether carrying out `plan` (in order, until its candidates' bytes cover
// the request, as the runtime does) makes room for the request: one hole of
// free blocks that covers ctx.bytes_needed in a segment of the request's
// pool, or enough memory given back (whole free fixed segments, whole free
// pages of expandable ones) that the pool can grow by ctx.growth_bytes
// within the budget. False without a memory map.
bool PlanMakesRoom(const PressureContext& ctx, const Plan& plan);

// The fewest leading steps of `plan` that, all carried out, make room as
// above; nullopt when the whole plan does not (or there is no memory map).
std::optional<std::size_t> StepsToMakeRoom(const PressureContext& ctx, const Plan& plan);

// A block's price in a run, as `window` prices it: the cost of bringing its
// tensor back (recompute with its evicted neighbourhood, or the copy round
// trip) over its staleness^staleness_exp. Fills in the neighbourhood
// (through ctx.Complete) where the policy did not ask for it.
double RunCost(const Candidate& c, const PressureContext& ctx, double staleness_exp = 1.0);

}  // namespace remat::policies

#endif  // REMAT_POLICIES_COVERING_RUN_H_
