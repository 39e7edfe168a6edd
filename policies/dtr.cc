// dtr: Dynamic Tensor Rematerialization's heuristic (Kirisame et al., 2021):
//
//   h(t) = (cost(t) + cost of its evicted neighbourhood) / (bytes(t) * staleness(t)^e)
//
// evict the smallest h: cheap to bring back, large, and long unused. With
// neighbourhood=false it is DTR's local variant. The cost of bringing a tensor
// back is the cheaper of recompute and the transfer round trip, as the
// runtime would choose.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Dtr final : public ScoredPolicy {
 public:
  Dtr(double staleness_exp, bool neighbourhood)
      : staleness_exp_(staleness_exp), neighbourhood_(neighbourhood) {}

  std::string OwnSpec() const override {
    return absl::StrFormat("dtr:neighbourhood=%s,staleness_exp=%g",
                           neighbourhood_ ? "true" : "false", staleness_exp_);
  }

 private:
  double Score(const Candidate& c, const PressureContext& ctx) const override {
    double recompute = static_cast<double>(c.compute_ns);
    if (neighbourhood_) recompute += static_cast<double>(c.neighbourhood_ns);
    const double cost = EvictionCost(c, recompute);
    // A tensor used this very instant has staleness 1 ns, not 0.
    const double staleness = static_cast<double>(std::max<std::int64_t>(ctx.now_ns - c.last_access_ns, 1));
    const double bytes = static_cast<double>(std::max<std::size_t>(c.bytes, 1));
    return cost / (bytes * Power(staleness, staleness_exp_));
  }

  double staleness_exp_;
  bool neighbourhood_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtr(PolicyParams& params) {
  double staleness_exp = 1.0;
  bool neighbourhood = true;
  if (absl::Status s = params.Double("staleness_exp", &staleness_exp, 0.0, 16.0); !s.ok()) return s;
  if (absl::Status s = params.Bool("neighbourhood", &neighbourhood); !s.ok()) return s;
  return std::make_unique<Dtr>(staleness_exp, neighbourhood);
}

}  // namespace remat::policies
