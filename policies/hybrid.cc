// hybrid: chooses per tensor between offloading and dropping.
//
// An offload is free when the copy out and back fits in the time until the
// tensor's next use (known from a trace replay's hints, or estimated online
// from its access history: its mean interval between uses); such tensors go
// first, by offload. Otherwise a tensor costs the cheaper of its recompute
// (own closure and dropped ancestors) and the copy round trip, and tensors
// rank DTR-like by cost / (bytes x staleness^e). It asks drivers that know
// the future to prefetch restores `prefetch_us` ahead, so they arrive before
// use.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "policies/factories.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Hybrid final : public EvictionPolicy {
 public:
  Hybrid(double staleness_exp, double prefetch_us, double hidden_weight)
      : staleness_exp_(staleness_exp), prefetch_us_(prefetch_us), hidden_weight_(hidden_weight) {}
  std::string OwnSpec() const override {
    return absl::StrFormat("hybrid:hidden_weight=%g,prefetch_us=%g,staleness_exp=%g",
                           hidden_weight_, prefetch_us_, staleness_exp_);
  }
  Needs needs() const override { return {.next_use = true}; }
  std::int64_t prefetch_window_ns() const override {
    return static_cast<std::int64_t>(prefetch_us_ * 1000);
  }

  // Ranks by score, then walks the ranking keeping count of the link: each
  // offload queues behind the copies before it, so a copy is hidden only if
  // the backlog and the round trip both fit before the next use.
  Plan Choose(const PressureContext& ctx) override {
    std::vector<std::pair<double, const Candidate*>> ranked;
    ranked.reserve(ctx.candidates.size());
    for (const Candidate& c : ctx.candidates) {
      if (c.can_drop || c.can_offload) ranked.emplace_back(Score(c, ctx), &c);
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second->id < b.second->id;
    });
    Plan plan;
    std::size_t covered = 0;
    std::int64_t backlog = ctx.link_backlog_ns;
    for (const auto& [score, c] : ranked) {
      if (covered >= ctx.bytes_needed) break;
      const EvictAction action = Action(*c, ctx, backlog);
      if (action == EvictAction::kOffload) backlog += c->transfer_ns / 2;  // the copy out
      plan.push_back(PlanStep{c->id, action});
      covered += c->bytes;
    }
    return plan;
  }

 private:
  // Time until the next use: the hint, else the access history's estimate, else -1.
  static std::int64_t NextUse(const Candidate& c, const PressureContext& ctx) {
    if (c.next_use_ns >= 0) return c.next_use_ns;
    if (c.accesses < 2) return -1;
    const std::int64_t interval =
        (c.last_access_ns - c.first_access_ns) / static_cast<std::int64_t>(c.accesses - 1);
    const std::int64_t expected = c.last_access_ns + interval - ctx.now_ns;
    return expected > 0 ? expected : -1;
  }
  static bool HiddenOffload(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) {
    if (!c.can_offload) return false;
    const std::int64_t next = NextUse(c, ctx);
    return next >= 0 && backlog + c.transfer_ns <= next;
  }
  double Score(const Candidate& c, const PressureContext& ctx) const {
    double cost;
    if (HiddenOffload(c, ctx, ctx.link_backlog_ns)) {
      cost = hidden_weight_ * static_cast<double>(c.transfer_ns);  // it still uses the link
    } else {
      cost = EvictionCost(c, static_cast<double>(c.compute_ns + c.neighbourhood_ns));
    }
    const double bytes = static_cast<double>(std::max<std::size_t>(c.bytes, 1));
    return cost / (bytes * std::pow(Staleness(c, ctx), staleness_exp_));
  }
  // Offload when the link hides it; else the cheaper of recompute (with the
  // dropped neighbours it drags along) and the copy round trip.
  static EvictAction Action(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) {
    if (HiddenOffload(c, ctx, backlog)) return EvictAction::kOffload;
    if (!c.can_offload) return EvictAction::kDrop;
    if (!c.can_drop) return EvictAction::kOffload;
    return c.compute_ns + c.neighbourhood_ns <= c.transfer_ns ? EvictAction::kDrop
                                                              : EvictAction::kOffload;
  }

  double staleness_exp_, prefetch_us_, hidden_weight_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeHybrid(PolicyParams& params) {
  double e = 1.0, prefetch_us = 2000, hidden_weight = 0.05;
  if (absl::Status s = params.Double("staleness_exp", &e, 0.0, 16.0); !s.ok()) return s;
  if (absl::Status s = params.Double("prefetch_us", &prefetch_us, 0.0, 1e9); !s.ok()) return s;
  if (absl::Status s = params.Double("hidden_weight", &hidden_weight, 0.0, 1.0); !s.ok()) return s;
  return std::make_unique<Hybrid>(e, prefetch_us, hidden_weight);
}

}  // namespace remat::policies
