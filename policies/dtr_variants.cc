// The DTR family's other heuristics, and two from the systems that followed:
//
//   dtr-eq     (cost + summed cost of the distinct classes of dropped tensors
//              adjacent to it) / (bytes x staleness^e): DTR's union-find
//              estimate of the evicted neighbourhood. With future=true, where
//              the runtime knows a tensor's next use (a trace's, or one
//              learned from the steps before), staleness is the lesser of the
//              time since its last use and the time until its next: a tensor
//              counts as idle only while it is idle both ways, so what the
//              backward is about to read stays, however long ago the forward
//              made it. A tensor never used again goes first, unless the
//              closure of a dropped tensor reads it (then its eviction is no
//              free drop: scored by staleness). A tensor with no hint is
//              scored as without the option.
//   dtr-local  cost / (bytes x staleness^e): no neighbourhood at all
//   msps       (cost + cost of its dropped ancestors) / bytes: memory saved
//              per second of recompute, as Capuchin ranks, no staleness
//   megengine  (cost + neighbourhood)^a x r^(times recomputed)
//              / ((bytes + adjacent free bytes)^b x staleness^c): freeing a
//              block next to free space makes a larger hole (fragmentation
//              aware), and tensors recomputed often are kept
//
// Costs are those of the cheaper way out (recompute or the copy round trip),
// as in dtr.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class DtrEq final : public ScoredPolicy {
 public:
  DtrEq(double staleness_exp, bool future) : staleness_exp_(staleness_exp), future_(future) {}
  std::string OwnSpec() const override {
    return absl::StrFormat("dtr-eq:%sstaleness_exp=%g", future_ ? "future=true," : "",
                           staleness_exp_);
  }
  Needs needs() const override {
    return {.neighbourhood = false, .classes = true, .next_use = future_};
  }

 private:
  double Score(const Candidate& c, const PressureContext& ctx) const override {
    // Never used again and read by no dropped tensor's closure: first, and
    // dropped where it may be (Action); where it may only be offloaded, its
    // copy out is still all its eviction costs.
    if (future_ && c.next_use_ns == kNeverUsedAgain && c.consumers_ns == 0) {
      return -std::numeric_limits<double>::infinity();
    }
    const double cost = EvictionCost(c, static_cast<double>(c.compute_ns + c.classes_ns));
    const double bytes = static_cast<double>(std::max<std::size_t>(c.bytes, 1));
    double idle = Staleness(c, ctx);
    if (future_ && c.next_use_ns >= 0 && c.next_use_ns != kNeverUsedAgain) {
      idle = std::min(idle, static_cast<double>(std::max<std::int64_t>(c.next_use_ns, 1)));
    }
    return cost / (bytes * Power(idle, staleness_exp_));
  }
  EvictAction Action(const Candidate& c, const PressureContext&) const override {
    return future_ && FreeToDrop(c) ? EvictAction::kDrop : CheaperAction(c);
  }
  double staleness_exp_;
  bool future_;
};

class DtrLocal final : public ScoredPolicy {
 public:
  explicit DtrLocal(double staleness_exp) : staleness_exp_(staleness_exp) {}
  std::string OwnSpec() const override {
    return absl::StrFormat("dtr-local:staleness_exp=%g", staleness_exp_);
  }
  Needs needs() const override { return {.neighbourhood = false}; }

 private:
  double Score(const Candidate& c, const PressureContext& ctx) const override {
    const double cost = EvictionCost(c, static_cast<double>(c.compute_ns));
    const double bytes = static_cast<double>(std::max<std::size_t>(c.bytes, 1));
    return cost / (bytes * Power(Staleness(c, ctx), staleness_exp_));
  }
  double staleness_exp_;
};

class Msps final : public ScoredPolicy {
 public:
  std::string OwnSpec() const override { return "msps"; }

 private:
  double Score(const Candidate& c, const PressureContext&) const override {
    const double cost = EvictionCost(c, static_cast<double>(c.compute_ns + c.ancestors_ns));
    return cost / static_cast<double>(std::max<std::size_t>(c.bytes, 1));
  }
};

class MegEngine final : public ScoredPolicy {
 public:
  MegEngine(double a, double b, double c, double r) : a_(a), b_(b), c_(c), r_(r) {}
  std::string OwnSpec() const override {
    return absl::StrFormat("megengine:a=%g,b=%g,c=%g,r=%g", a_, b_, c_, r_);
  }
  Needs needs() const override { return {.adjacent_free = true}; }

 private:
  double Score(const Candidate& cand, const PressureContext& ctx) const override {
    const double cost =
        EvictionCost(cand, static_cast<double>(cand.compute_ns + cand.neighbourhood_ns));
    const double bytes = static_cast<double>(cand.bytes + cand.adjacent_free_bytes);
    // +1 ns: a free recompute still ranks by size and staleness.
    return Power(cost + 1, a_) * Power(r_, static_cast<double>(cand.recomputes)) /
           (Power(std::max(bytes, 1.0), b_) * Power(Staleness(cand, ctx), c_));
  }
  double a_, b_, c_, r_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtrEq(PolicyParams& params) {
  double e = 1.0;
  if (absl::Status s = params.Double("staleness_exp", &e, 0.0, 16.0); !s.ok()) return s;
  bool future = false;
  if (absl::Status s = params.Bool("future", &future); !s.ok()) return s;
  return std::make_unique<DtrEq>(e, future);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtrLocal(PolicyParams& params) {
  double e = 1.0;
  if (absl::Status s = params.Double("staleness_exp", &e, 0.0, 16.0); !s.ok()) return s;
  return std::make_unique<DtrLocal>(e);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeMsps(PolicyParams&) {
  return std::make_unique<Msps>();
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeMegEngine(PolicyParams& params) {
  double a = 1.0, b = 1.0, c = 1.0, r = 1.2;
  if (absl::Status s = params.Double("a", &a, 0.0, 8.0); !s.ok()) return s;
  if (absl::Status s = params.Double("b", &b, 0.0, 8.0); !s.ok()) return s;
  if (absl::Status s = params.Double("c", &c, 0.0, 8.0); !s.ok()) return s;
  if (absl::Status s = params.Double("r", &r, 1.0, 16.0); !s.ok()) return s;
  return std::make_unique<MegEngine>(a, b, c, r);
}

}  // namespace remat::policies
