// lru: evict the tensor used longest ago.
#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Lru final : public ScoredPolicy {
 public:
  std::string OwnSpec() const override { return "lru"; }
  Needs needs() const override { return {.neighbourhood = false}; }

 private:
  double Score(const Candidate& c, const PressureContext&) const override {
    return static_cast<double>(c.last_access_ns);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLru(PolicyParams&) {
  return std::make_unique<Lru>();
}

}  // namespace remat::policies
