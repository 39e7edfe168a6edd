// CheapestCoveringRun: where evicting makes one hole a request fits.
//
// Under a reserved budget the bytes a request lacks must be free in one
// place: a run of address-neighbouring blocks, each free or held by an
// evictable tensor, in a segment of the pool the request is served from. Of
// all such runs covering the request, this finds the one whose tensors cost
// least to evict (free blocks cost nothing), after Coop's sliding window.
// The `window` policy plans this way at every pressure event; the runtime
// plans this way for any policy when the policy's own plan freed enough
// bytes but not in one place (PressureRequest::round > 0).
#ifndef REMAT_POLICIES_COVERING_RUN_H_
#define REMAT_POLICIES_COVERING_RUN_H_

#include <optional>

#include "absl/functional/function_ref.h"
#include "policies/eviction_policy.h"

namespace remat::policies {

// The run's evictable candidates in address order, each with CheaperAction;
// an empty plan when a covering run of free blocks alone exists (the hole is
// there already); nullopt when no run covers the request (it needs a new
// segment, or pinned and foreign blocks break every run) or ctx has no
// memory map. `cost` is never negative.
std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost);
// With `pair_cost` added for every pair of members of a run: what evicting
// the two together costs beyond their own costs (a recompute of one that must
// first recompute the other). Never negative.
// `price`, where given, receives the run's summed cost.
using PairCostFn = absl::FunctionRef<double(const Candidate&, const Candidate&)>;
std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost,
                                        PairCostFn pair_cost, double* price = nullptr);

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

// A block's price in a run, as `window` prices it by default: the cost of
// bringing its tensor back (recompute with its evicted neighbourhood, or the
// copy round trip) over its staleness. Fills in the neighbourhood (through
// ctx.Complete) where the policy did not ask for it.
double RunCost(const Candidate& c, const PressureContext& ctx);

}  // namespace remat::policies

#endif  // REMAT_POLICIES_COVERING_RUN_H_
