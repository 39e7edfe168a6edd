// largest: evict the largest tensor first (fewest evictions per byte).
#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Largest final : public ScoredPolicy {
 public:
  std::string OwnSpec() const override { return "largest"; }
  Needs needs() const override { return {.neighbourhood = false}; }

 private:
  double Score(const Candidate& c, const PressureContext&) const override {
    return -static_cast<double>(c.bytes);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLargest(PolicyParams&) {
  return std::make_unique<Largest>();
}

}  // namespace remat::policies
