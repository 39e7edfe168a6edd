// hybrid: chooses per tensor between offloading and dropping, by what each
// puts on the program's path.
//
// A drop frees the block at once and costs the recompute (own closure, the
// dropped ancestors it needs first and, weighted by `consumers`, the dropped
// tensors that read it) when the tensor is next used. An offload frees the
// block only once the copy out is done, behind the copies already queued on
// the link: the request under pressure waits that long. Its copy back is
// hidden when the queued copies, the restores already owed for everything
// offloaded and its own round trip, times `slack`, fit before its next use
// (known from a trace replay's hints, or estimated online from the access
// history: its mean interval between uses); otherwise that is waited for too.
// Each tensor takes the cheaper action, and tensors rank by that cost /
// (bytes x staleness^staleness_exp) (staleness_exp=0: Capuchin's memory saved
// per second). Drivers that know the future prefetch restores so that they
// arrive before use: `slack` times the copy's time ahead, within `prefetch_us`.
//
// `rank` separates which tensors go from how each goes. `rank=own` ranks as
// above; `rank=NAME` takes the tensors another policy would evict (its plan,
// with that policy's defaults) and chooses drop or offload for each as above.
// `rank=auto` (the default) is `own` for a runtime that sees the step once;
// a driver that can replay the whole step (the simulator) tries every
// ranking, each with offload allowed and with drops only, and each other
// policy's own mixed plan, and keeps the cheapest run (Trials): so hybrid is
// never worse than the best policy with drops only, nor than any policy's
// mixed plan, and better wherever an offload pays over some ranking.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "policies/factories.h"
#include "policies/registry.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

class Hybrid final : public EvictionPolicy {
 public:
  Hybrid(double staleness_exp, double prefetch_us, double slack, double consumers,
         std::string rank, std::unique_ptr<EvictionPolicy> ranker)
      : staleness_exp_(staleness_exp),
        prefetch_us_(prefetch_us),
        slack_(slack),
        consumers_(consumers),
        rank_(std::move(rank)),
        ranker_(std::move(ranker)) {}
  std::string OwnSpec() const override {
    return absl::StrFormat("hybrid:%s", Params(rank_));
  }
  Needs needs() const override {
    if (ranker_ == nullptr) return {.next_use = true};
    Needs n = ranker_->needs();
    n.next_use = true;
    return n;
  }
  std::int64_t prefetch_window_ns() const override {
    return static_cast<std::int64_t>(prefetch_us_ * 1000);
  }
  // As early as the pricing takes a restore to be hidden.
  double prefetch_lead() const override { return slack_; }
  std::vector<Trial> Trials() const override {
    if (rank_ != "auto") return {};
    // Its own ranking first: where runs tie, the first is kept.
    // Each run samples candidates as this one would.
    const std::string sample = ",sample=" + sampling().ToString();
    std::vector<Trial> trials;
    const std::string own = "hybrid:" + Params("own") + sample;
    trials.push_back({own, own});
    for (const std::string& name : KnownPolicies()) {
      if (name == "hybrid") continue;
      const std::string plain = name + ":" + sample.substr(1);
      trials.push_back({"hybrid:" + Params(name) + sample, plain});
      // and the policy's own mixed plan (each tensor dropped when its
      // recompute costs no more than the round trip): where memory is
      // tightest it finishes runs that hybrid's pricing thrashes in.
      trials.push_back({plain, ""});
    }
    return trials;
  }

  Plan Choose(const PressureContext& ctx) override {
    return ranker_ == nullptr ? RankOwn(ctx) : RankBy(*ranker_, ctx);
  }

 private:
  std::string Params(const std::string& rank) const {
    return absl::StrFormat("consumers=%g,prefetch_us=%g,rank=%s,slack=%g,staleness_exp=%g",
                           consumers_, prefetch_us_, rank, slack_, staleness_exp_);
  }

  // The tensors `ranker` would evict, in its order, each going the cheaper
  // way; the link counted as in RankOwn.
  Plan RankBy(EvictionPolicy& ranker, const PressureContext& ctx) const {
    Plan plan = ranker.Choose(ctx);
    if (plan.empty()) return plan;
    absl::flat_hash_map<std::uint64_t, const Candidate*> by_id;
    by_id.reserve(ctx.candidates.size());
    for (const Candidate& c : ctx.candidates) by_id.emplace(c.id, &c);
    std::int64_t backlog = ctx.link_backlog_ns;
    for (PlanStep& step : plan) {
      const auto it = by_id.find(step.id);
      if (it == by_id.end()) continue;  // (a policy names only candidates)
      Candidate c = *it->second;
      ctx.Complete(c);  // the dropped ancestors, where the ranker did not ask for them
      step.action = Action(c, ctx, backlog);
      if (step.action == EvictAction::kOffload && !c.copied_out) backlog += c.transfer_ns / 2;
    }
    return plan;
  }

  // Ranks by score, then walks the ranking keeping count of the link: each
  // offload's copy out queues behind those planned before it.
  Plan RankOwn(const PressureContext& ctx) const {
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
      if (action == EvictAction::kOffload && !c->copied_out) backlog += c->transfer_ns / 2;
      plan.push_back(PlanStep{c->id, action});
      covered += c->bytes;
    }
    return plan;
  }

  // Time until the next use: the hint, else the access history's estimate, else -1.
  static std::int64_t NextUse(const Candidate& c, const PressureContext& ctx) {
    if (c.next_use_ns >= 0) return c.next_use_ns;
    if (c.accesses < 2) return -1;
    const std::int64_t interval =
        (c.last_access_ns - c.first_access_ns) / static_cast<std::int64_t>(c.accesses - 1);
    const std::int64_t expected = c.last_access_ns + interval - ctx.now_ns;
    return expected > 0 ? expected : -1;
  }
  // When its copy out would be done: behind the backlog, or already under
  // way when it was copied ahead (taken as done).
  static std::int64_t OutDone(const Candidate& c, std::int64_t backlog) {
    return c.copied_out ? 0 : backlog + c.transfer_ns / 2;
  }
  bool RestoreHidden(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) const {
    const std::int64_t next = NextUse(c, ctx);
    // The copy in starts once the copy out is done and the copies in ahead
    // of it are carried (the two directions run side by side).
    const std::int64_t one_way = c.transfer_ns / 2;
    const std::int64_t back_at = std::max(OutDone(c, backlog), ctx.restore_backlog_ns) + one_way;
    return next >= 0 && static_cast<double>(back_at) * slack_ <= static_cast<double>(next);
  }
  double OffloadCost(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) const {
    const double out = static_cast<double>(OutDone(c, backlog));
    return RestoreHidden(c, ctx, backlog) ? out : out + static_cast<double>(c.transfer_ns / 2);
  }
  double DropCost(const Candidate& c) const {
    if (FreeToDrop(c)) return 0;  // never recomputed
    return static_cast<double>(c.compute_ns + c.ancestors_ns) +
           consumers_ * static_cast<double>(c.consumers_ns);
  }
  // The cheaper allowed action and its cost (a tie drops).
  struct Choice {
    EvictAction action;
    double cost;
  };
  Choice Cheaper(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) const {
    if (!c.can_offload) return {EvictAction::kDrop, DropCost(c)};
    const double offload = OffloadCost(c, ctx, backlog);
    if (!c.can_drop) return {EvictAction::kOffload, offload};
    const double drop = DropCost(c);
    return offload < drop ? Choice{EvictAction::kOffload, offload} : Choice{EvictAction::kDrop, drop};
  }
  EvictAction Action(const Candidate& c, const PressureContext& ctx, std::int64_t backlog) const {
    return Cheaper(c, ctx, backlog).action;
  }
  double Score(const Candidate& c, const PressureContext& ctx) const {
    const double cost = Cheaper(c, ctx, ctx.link_backlog_ns).cost;
    const double bytes = static_cast<double>(std::max<std::size_t>(c.bytes, 1));
    return cost / (bytes * Power(Staleness(c, ctx), staleness_exp_));  // Power(x, 0) is 1
  }

  double staleness_exp_, prefetch_us_, slack_, consumers_;
  std::string rank_;                        // "auto", "own" or a policy's name
  std::unique_ptr<EvictionPolicy> ranker_;  // the named policy; null for auto and own
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeHybrid(PolicyParams& params) {
  double e = 0.25, prefetch_us = 2000, slack = 2.0, consumers = 0.0;
  if (absl::Status s = params.Double("staleness_exp", &e, 0.0, 16.0); !s.ok()) return s;
  if (absl::Status s = params.Double("prefetch_us", &prefetch_us, 0.0, 1e9); !s.ok()) return s;
  if (absl::Status s = params.Double("slack", &slack, 1.0, 1e6); !s.ok()) return s;
  if (absl::Status s = params.Double("consumers", &consumers, 0.0, 1.0); !s.ok()) return s;
  std::string rank = "auto";
  if (absl::Status s = params.Text("rank", &rank); !s.ok()) return s;
  std::unique_ptr<EvictionPolicy> ranker;
  if (rank != "auto" && rank != "own") {
    const std::vector<std::string> known = KnownPolicies();
    if (rank == "hybrid" || std::find(known.begin(), known.end(), rank) == known.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "policy hybrid: rank '%s' is not auto, own or another policy's name", rank));
    }
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> made = Create(rank);
    if (!made.ok()) return made.status();
    ranker = *std::move(made);
  }
  return std::make_unique<Hybrid>(e, prefetch_us, slack, consumers, std::move(rank),
                                  std::move(ranker));
}

}  // namespace remat::policies
