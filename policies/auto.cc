// auto: the best of every policy, for a driver that runs the step more than
// once; `dtr` for a runtime that sees it once.
//
// No single ranking is best on every step: on the project's traces `dtr-local`
// leads on an MLP, `msps` on a transformer, `lru` on a tree LSTM, and with
// offload allowed `hybrid` over some other policy's ranking. A training loop
// runs the same step thousands of times, so the first steps can try them all.
// `auto`'s trials (Trials) are `dtr` (listed first, so it is kept on a tie),
// then everything `hybrid` tries: its own ranking, its choice of drop or
// offload over each other policy's ranking, each policy's own run with
// drops only and with offload allowed, and `dtr-eq:future=true` with
// staleness to the power 1 and 2 (next uses, where the driver knows them:
// the simulator does). A driver that can replay the step (the
// simulator, a step planner) runs each and keeps the quickest. A runtime
// that sees the step once (a C or C++ program, LD_PRELOAD) chooses as `dtr`.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "policies/factories.h"
#include "policies/registry.h"

namespace remat::policies {
namespace {

class Auto final : public EvictionPolicy {
 public:
  explicit Auto(std::unique_ptr<EvictionPolicy> once) : once_(std::move(once)) {}

  std::string OwnSpec() const override { return kAuto; }
  Needs needs() const override { return once_->needs(); }
  Plan Choose(const PressureContext& ctx) override { return once_->Choose(ctx); }

  std::vector<Trial> Trials() const override {
    const std::string sample = "sample=" + sampling().ToString();
    const std::string dtr = "dtr:" + sample;
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> hybrid = Create("hybrid:" + sample);
    std::vector<Trial> trials = {{dtr, dtr}};
    if (!hybrid.ok()) return trials;  // (hybrid's defaults always parse)
    for (Trial t : (*hybrid)->Trials()) {
      if (t.mixed == dtr) continue;  // dtr's own run is listed first
      if (t.drops == dtr) t.drops.clear();
      trials.push_back(std::move(t));
    }
    // and dtr-eq reading next uses, where the driver knows them (a ranking
    // with a parameter, which hybrid's rank= does not name), with DTR's
    // staleness and with its square (idleness weighed harder: the quickest
    // in a few cells of the recorded GPT, MLP and tree LSTM steps, e.g. the
    // GPT at 0.7 of its live peak, 1.172 against 1.241 with the trace's
    // future).
    for (const char* exponent : {"1", "2"}) {
      const std::string future =
          absl::StrFormat("dtr-eq:future=true,staleness_exp=%s,%s", exponent, sample);
      trials.push_back({future, future});
    }
    return trials;
  }

 private:
  std::unique_ptr<EvictionPolicy> once_;  // what a runtime that sees the step once runs
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeAuto(PolicyParams& params) {
  (void)params;  // only the parameters every policy has (sample)
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> dtr = Create("dtr");
  if (!dtr.ok()) return dtr.status();
  return std::make_unique<Auto>(*std::move(dtr));
}

}  // namespace remat::policies
