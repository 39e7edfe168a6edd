// belady: Belady's rule. Evicts the tensor whose next use is farthest in the
// future (never used again: first), which is optimal for a cache of pages of
// one size and one cost. Tensors differ in both, so here it is a heuristic
// that knows the future, not a bound (remat.optimal gives a lower bound for
// drop-only runs). It needs the future:
// a trace replay tells the runtime each tensor's next use (Runtime::HintNextUse).
// A tensor without a hint goes after those never used again and before those
// with one, the least recently used first: run blind (an online program's
// first step, before next uses are learned), belady is lru.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Belady final : public ScoredPolicy {
 public:
  std::string OwnSpec() const override { return "belady"; }
  Needs needs() const override { return {.neighbourhood = false, .next_use = true}; }

 private:
  double Score(const Candidate& c, const PressureContext& ctx) const override {
    if (c.next_use_ns == kNeverUsedAgain) return -std::numeric_limits<double>::infinity();
    if (c.next_use_ns < 0) {
      // Below every hinted one (next uses are far under 2^62 ns).
      const double staleness = static_cast<double>(std::max<std::int64_t>(
          ctx.now_ns - c.last_access_ns, 0));
      return -0x1p62 - staleness;
    }
    return -static_cast<double>(c.next_use_ns);
  }
  EvictAction Action(const Candidate& c, const PressureContext&) const override {
    return FreeToDrop(c) ? EvictAction::kDrop : CheaperAction(c);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeBelady(PolicyParams&) {
  return std::make_unique<Belady>();
}

}  // namespace remat::policies
