#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/covering_run.h"
#include "policies/policy_spec.h"
#include "policies/registry.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Candidate Make(std::uint64_t id, std::size_t bytes, std::int64_t last_access,
               std::int64_t compute_ns = 1000, std::int64_t transfer_ns = 1'000'000) {
  Candidate c;
  c.id = id;
  c.bytes = bytes;
  c.last_access_ns = last_access;
  c.compute_ns = compute_ns;
  c.transfer_ns = transfer_ns;
  c.can_drop = true;
  c.can_offload = true;
  return c;
}

std::vector<std::uint64_t> Ids(const Plan& plan) {
  std::vector<std::uint64_t> ids;
  for (const PlanStep& s : plan) ids.push_back(s.id);
  return ids;
}

Plan PlanFor(const std::string& spec, const std::vector<Candidate>& candidates, std::size_t needed,
         std::int64_t now = 1'000'000) {
  auto policy = Create(spec);
  EXPECT_TRUE(policy.ok()) << policy.status();
  PressureContext ctx;
  ctx.bytes_needed = needed;
  ctx.now_ns = now;
  ctx.candidates = candidates;
  return (*policy)->Choose(ctx);
}

// --- Specs and the registry ----------------------------------------------------

TEST(PolicySpecTest, ParsesNamesAndParameters) {
  auto plain = ParseSpec("lru");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->name, "lru");
  EXPECT_TRUE(plain->params.empty());
  auto with = ParseSpec("dtr: staleness_exp = 2 ,neighbourhood=false");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->name, "dtr");
  EXPECT_EQ(with->params.at("staleness_exp"), "2");
  EXPECT_EQ(with->params.at("neighbourhood"), "false");
}

TEST(PolicySpecTest, RejectsMalformedSpecs) {
  for (const char* bad : {"", ":a=1", "dtr:staleness_exp", "dtr:=1", "dtr:a=1,a=2", "dtr:", "dtr: ",
                          "dtr::", "dtr:a=", "dtr:a= ", "dtr:a=1,", "dtr:a=1,,b=2"}) {
    EXPECT_EQ(ParseSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseSpec("dtr:").status().message()),
              HasSubstr("has a ':' and no parameters after it"));
  EXPECT_THAT(std::string(ParseSpec("dtr:a=").status().message()),
              HasSubstr("'a' has no value after '='"));
}

TEST(RegistryTest, CreatesEveryKnownPolicy) {
  EXPECT_THAT(KnownPolicies(), ElementsAre("lru", "largest", "dtr", "dtr-eq", "dtr-local", "msps",
                                          "megengine", "window", "hybrid", "belady"));
  for (const std::string& name : KnownPolicies()) {
    auto policy = Create(name);
    ASSERT_TRUE(policy.ok()) << name << ": " << policy.status();
    // The spec a policy reports recreates it.
    auto again = Create((*policy)->Spec());
    ASSERT_TRUE(again.ok()) << (*policy)->Spec() << ": " << again.status();
    EXPECT_EQ((*again)->Spec(), (*policy)->Spec());
  }
  EXPECT_EQ((*Create("dtr:staleness_exp=2,neighbourhood=false"))->Spec(),
            "dtr:neighbourhood=false,staleness_exp=2");
}

TEST(PolicySpecTest, ASpecIsCheckedOnceAndMakesItsPolicyAgainAndAgain) {
  const PolicySpec spec("dtr: staleness_exp=2, neighbourhood=false");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec.name(), "dtr");
  EXPECT_EQ(spec.text(), "dtr:neighbourhood=false,staleness_exp=2");  // canonical
  EXPECT_EQ(spec.given(), "dtr: staleness_exp=2, neighbourhood=false");
  for (int i = 0; i < 2; ++i) {
    auto policy = spec.Make();
    ASSERT_TRUE(policy.ok()) << policy.status();
    EXPECT_EQ((*policy)->Spec(), spec.text());
  }
  // The same policy however it is written; the default is dtr with its defaults.
  EXPECT_EQ(spec, PolicySpec("dtr:neighbourhood=false,staleness_exp=2"));
  EXPECT_FALSE(spec == PolicySpec("dtr"));
  EXPECT_EQ(PolicySpec(), PolicySpec("dtr"));
  EXPECT_EQ(PolicySpec().text(), (*Create("dtr"))->Spec());
  // From text, wherever a spec is expected.
  std::vector<PolicySpec> specs = {"lru", std::string("hybrid")};
  EXPECT_EQ(specs[0].name(), "lru");
  EXPECT_EQ(specs[1].name(), "hybrid");
}

TEST(PolicySpecTest, ABadSpecKeepsItsErrorAndMakesNothing) {
  for (const char* bad : {"", "nope", "dtr:staleness=2", "dtr:staleness_exp=-1", "lru:sample=x"}) {
    const PolicySpec spec(bad);
    EXPECT_FALSE(spec.ok()) << bad;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(spec.text(), bad);
    EXPECT_TRUE(spec.name().empty()) << bad;
    EXPECT_EQ(spec.Make().status(), spec.status()) << bad;
    EXPECT_EQ(PolicySpec::Parse(bad).status(), spec.status()) << bad;
    EXPECT_EQ(Create(bad).status(), spec.status()) << bad;
  }
  EXPECT_FALSE(PolicySpec(static_cast<const char*>(nullptr)).ok());
  EXPECT_TRUE(PolicySpec::Parse("lru").ok());
}

TEST(RegistryTest, UnknownNamesAndKeysListWhatIsKnown) {
  auto unknown = Create("belady2");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown policy 'belady2' (known: lru, largest, dtr, dtr-eq, dtr-local, "
                        "msps, megengine, window, hybrid, belady, auto)"));
  auto bad_key = Create("dtr:staleness=2");
  EXPECT_THAT(std::string(bad_key.status().message()),
              HasSubstr("no parameter 'staleness' (it knows: staleness_exp, neighbourhood, sample)"));
  EXPECT_THAT(std::string(Create("lru:x=1").status().message()), HasSubstr("it knows: sample)"));
  EXPECT_THAT(std::string(Create("dtr:staleness_exp=abc").status().message()),
              HasSubstr("is not a number"));
  EXPECT_THAT(std::string(Create("dtr:staleness_exp=-1").status().message()),
              HasSubstr("out of range"));
  EXPECT_THAT(std::string(Create("dtr:neighbourhood=maybe").status().message()),
              HasSubstr("not true or false"));
}

TEST(SamplingTest, EveryPolicyTakesASampleParameterThatRoundTrips) {
  for (const std::string& name : KnownPolicies()) {
    for (const char* sample : {"sqrt", "64", "0.25"}) {
      auto policy = Create(name + ":sample=" + sample);
      ASSERT_TRUE(policy.ok()) << name << " " << sample << ": " << policy.status();
      EXPECT_THAT((*policy)->Spec(), HasSubstr(std::string("sample=") + sample));
      auto again = Create((*policy)->Spec());
      ASSERT_TRUE(again.ok()) << (*policy)->Spec() << ": " << again.status();
      EXPECT_EQ((*again)->Spec(), (*policy)->Spec());
    }
    // The default shows nothing: specs stay as they were.
    EXPECT_EQ((*Create(name + ":sample=all"))->Spec(), (*Create(name))->Spec());
  }
  EXPECT_EQ((*Create("dtr:sample=sqrt,staleness_exp=2"))->Spec(),
            "dtr:neighbourhood=true,staleness_exp=2,sample=sqrt");
}

TEST(SamplingTest, RejectsWhatIsNotASample) {
  for (const char* bad : {"0", "-1", "1.5", "abc", "", "nan", "1e13"}) {
    auto policy = Create(std::string("lru:sample=") + bad);
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(policy.status().message()), HasSubstr("sample=")) << bad;
  }
}

TEST(SamplingTest, SizesStayWithinOneAndN) {
  const Sampling all = *Sampling::Parse("all");
  const Sampling sqrt = *Sampling::Parse("sqrt");
  const Sampling count = *Sampling::Parse("64");
  const Sampling share = *Sampling::Parse("0.1");
  EXPECT_EQ(all.Size(10000), 10000u);
  EXPECT_EQ(sqrt.Size(10000), 100u);
  EXPECT_EQ(sqrt.Size(10), 4u);  // ceil(sqrt(10))
  EXPECT_EQ(count.Size(10000), 64u);
  EXPECT_EQ(count.Size(10), 10u);
  EXPECT_EQ(share.Size(10000), 1000u);
  EXPECT_EQ(share.Size(3), 1u);
  for (const Sampling& s : {all, sqrt, count, share}) {
    EXPECT_EQ(s.Size(0), 0u);
    EXPECT_EQ(s.Size(1), 1u);
  }
}

// --- Plans --------------------------------------------------------------------

TEST(PolicyTest, LruEvictsTheLeastRecentlyUsedUntilTheBytesAreCovered) {
  std::vector<Candidate> c = {Make(1, 100, 500), Make(2, 100, 100), Make(3, 100, 300),
                              Make(4, 100, 900)};
  EXPECT_THAT(Ids(PlanFor("lru", c, 150)), ElementsAre(2, 3));
  EXPECT_THAT(Ids(PlanFor("lru", c, 100)), ElementsAre(2));
  // Not enough in all: everything, oldest first; nothing needed: nothing.
  EXPECT_THAT(Ids(PlanFor("lru", c, 10'000)), ElementsAre(2, 3, 1, 4));
  EXPECT_TRUE(PlanFor("lru", c, 0).empty());
}

TEST(PolicyTest, LargestEvictsTheBiggestFirst) {
  std::vector<Candidate> c = {Make(1, 10, 0), Make(2, 500, 0), Make(3, 200, 0)};
  EXPECT_THAT(Ids(PlanFor("largest", c, 600)), ElementsAre(2, 3));
}

TEST(PolicyTest, DtrWeighsCostSizeAndStaleness) {
  const std::int64_t now = 1'000'000;
  // Same size and staleness: the cheaper to recompute goes first.
  std::vector<Candidate> cost = {Make(1, 100, 0, 5000), Make(2, 100, 0, 1000)};
  EXPECT_THAT(Ids(PlanFor("dtr", cost, 100, now)), ElementsAre(2));
  // Same cost and staleness: the larger goes first.
  std::vector<Candidate> size = {Make(1, 100, 0), Make(2, 400, 0)};
  EXPECT_THAT(Ids(PlanFor("dtr", size, 100, now)), ElementsAre(2));
  // Same cost and size: the staler goes first.
  std::vector<Candidate> stale = {Make(1, 100, now - 10), Make(2, 100, now - 1000)};
  EXPECT_THAT(Ids(PlanFor("dtr", stale, 100, now)), ElementsAre(2));
  // The evicted neighbourhood counts, unless turned off.
  std::vector<Candidate> hood = {Make(1, 100, 0, 1000), Make(2, 100, 0, 2000)};
  hood[0].neighbourhood_ns = 5000;
  EXPECT_THAT(Ids(PlanFor("dtr", hood, 100, now)), ElementsAre(2));
  EXPECT_THAT(Ids(PlanFor("dtr:neighbourhood=false", hood, 100, now)), ElementsAre(1));
}

TEST(PolicyTest, StalenessExponentChangesTheTradeOff) {
  const std::int64_t now = 1'000'000;
  // 1 is 4x cheaper; 2 is 100x staler. Linear staleness prefers 2, none prefers 1.
  std::vector<Candidate> c = {Make(1, 100, now - 10, 1000), Make(2, 100, now - 1000, 4000)};
  EXPECT_THAT(Ids(PlanFor("dtr", c, 100, now)), ElementsAre(2));
  EXPECT_THAT(Ids(PlanFor("dtr:staleness_exp=0", c, 100, now)), ElementsAre(1));
}

TEST(PolicyTest, ActionIsTheCheaperAllowedWayOut) {
  Candidate cheap_recompute = Make(1, 100, 0, /*compute=*/10, /*transfer=*/1000);
  Candidate cheap_copy = Make(2, 100, 0, /*compute=*/1000, /*transfer=*/10);
  Candidate drop_only = Make(3, 100, 0, 1000, 10);
  drop_only.can_offload = false;
  Candidate offload_only = Make(4, 100, 0, 10, 1000);
  offload_only.can_drop = false;
  EXPECT_EQ(CheaperAction(cheap_recompute), EvictAction::kDrop);
  EXPECT_EQ(CheaperAction(cheap_copy), EvictAction::kOffload);
  EXPECT_EQ(CheaperAction(drop_only), EvictAction::kDrop);
  EXPECT_EQ(CheaperAction(offload_only), EvictAction::kOffload);
  // Recompute that needs an evicted neighbourhood regenerated may cost more than a copy.
  Candidate with_hood = Make(5, 100, 0, 10, 1000);
  with_hood.neighbourhood_ns = 5000;
  EXPECT_EQ(CheaperAction(with_hood), EvictAction::kOffload);
}

TEST(PolicyTest, NeverPlansATensorThatAllowsNeither) {
  Candidate pinned = Make(1, 1000, 0);
  pinned.can_drop = pinned.can_offload = false;
  std::vector<Candidate> c = {pinned, Make(2, 10, 500)};
  for (const std::string& name : KnownPolicies()) {
    EXPECT_THAT(Ids(PlanFor(name, c, 1000)), ElementsAre(2)) << name;
  }
}

TEST(PolicyTest, PlansAreDeterministicOnTies) {
  std::vector<Candidate> c = {Make(7, 100, 5), Make(3, 100, 5), Make(5, 100, 5)};
  for (const std::string& name : KnownPolicies()) {
    EXPECT_THAT(Ids(PlanFor(name, c, 300)), ElementsAre(3, 5, 7)) << name;
  }
}

}  // namespace
}  // namespace remat::policies

namespace remat::policies {
namespace {

// --- The other policies ----------------------------------------------------------

TEST(PolicyTest, DtrEqCountsEachAdjacentClassOnce) {
  // Same size and staleness: the one next to the cheaper class of dropped tensors goes.
  Candidate a = Make(1, 100, 0, 1000), b = Make(2, 100, 0, 1000);
  a.classes_ns = 50'000;
  b.classes_ns = 5'000;
  a.neighbourhood_ns = b.neighbourhood_ns = 0;  // dtr-eq looks at classes only
  EXPECT_THAT(Ids(PlanFor("dtr-eq", {a, b}, 100)), ElementsAre(2));
  EXPECT_THAT(Ids(PlanFor("dtr", {a, b}, 100)), ElementsAre(1));  // a tie: the lower id
}

TEST(PolicyTest, DtrEqWithTheFutureCallsIdleOnlyWhatIsIdleBothWays) {
  // Both last used long ago. `soon` is the staler, so dtr-eq takes it; it is
  // read again in 10 us, so with the future it stays and `late` goes.
  Candidate soon = Make(1, 100, 0), late = Make(2, 100, 500'000);
  soon.next_use_ns = 10'000;
  late.next_use_ns = 800'000;
  soon.neighbourhood_ns = late.neighbourhood_ns = 0;
  EXPECT_THAT(Ids(PlanFor("dtr-eq", {soon, late}, 100)), ElementsAre(1));
  EXPECT_THAT(Ids(PlanFor("dtr-eq:future=true", {soon, late}, 100)), ElementsAre(2));
  // Used just now and next far ahead: idle by neither reading, so it stays
  // as under dtr-eq (the lesser of the two, not the next use alone).
  Candidate fresh = Make(3, 100, 999'999);
  fresh.next_use_ns = 900'000'000;
  fresh.neighbourhood_ns = 0;
  EXPECT_THAT(Ids(PlanFor("dtr-eq:future=true", {fresh, late}, 100)), ElementsAre(2));
  // Never used again: first, however dear its recompute.
  Candidate never = Make(4, 100, 999'000, 1'000'000'000);
  never.next_use_ns = kNeverUsedAgain;
  never.can_offload = false;
  EXPECT_THAT(Ids(PlanFor("dtr-eq:future=true", {soon, late, never}, 100)), ElementsAre(4));
  EXPECT_THAT(Ids(PlanFor("dtr-eq", {soon, late, never}, 100)), ElementsAre(1));
  // Unless a dropped tensor's closure reads it: then it is not free to drop,
  // and it is scored by its cost and staleness.
  never.consumers_ns = 1'000;
  EXPECT_THAT(Ids(PlanFor("dtr-eq:future=true", {soon, late, never}, 100)), ElementsAre(2));
  // No hint: scored as without the option.
  soon.next_use_ns = late.next_use_ns = -1;
  EXPECT_THAT(Ids(PlanFor("dtr-eq:future=true", {soon, late}, 100)), ElementsAre(1));
  // The option is asked for, and is part of the spec.
  auto future = Create("dtr-eq:future=true");
  ASSERT_TRUE(future.ok()) << future.status();
  EXPECT_TRUE((*future)->needs().next_use);
  EXPECT_EQ((*future)->Spec(), "dtr-eq:future=true,staleness_exp=1");
  EXPECT_EQ((*Create((*future)->Spec()))->Spec(), (*future)->Spec());
  EXPECT_EQ((*Create("dtr-eq:future=false"))->Spec(), "dtr-eq:staleness_exp=1");
  auto plain = Create("dtr-eq");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->needs().next_use);
  EXPECT_FALSE(Create("dtr-eq:future=maybe").ok());
}

TEST(PolicyTest, WhatIsNeverUsedAgainIsDroppedNotOffloaded) {
  // A dear recompute, a cheap copy: offloaded, unless nothing will read it
  // again (a copy out would be waited for, and never read back).
  Candidate dead = Make(1, 100, 0, /*compute_ns=*/1'000'000, /*transfer_ns=*/1'000);
  dead.next_use_ns = kNeverUsedAgain;
  for (const char* spec : {"dtr-eq:future=true", "belady"}) {
    const Plan plan = PlanFor(spec, {dead}, 100);
    ASSERT_EQ(plan.size(), 1u) << spec;
    EXPECT_EQ(plan[0].action, EvictAction::kDrop) << spec;
  }
  EXPECT_EQ(PlanFor("dtr-eq", {dead}, 100)[0].action, EvictAction::kOffload);  // no future read
  dead.consumers_ns = 10;  // a dropped tensor's closure reads it: the cheaper way out
  for (const char* spec : {"dtr-eq:future=true", "belady"}) {
    EXPECT_EQ(PlanFor(spec, {dead}, 100)[0].action, EvictAction::kOffload) << spec;
  }
}

TEST(PolicyTest, DtrLocalIgnoresTheNeighbourhood) {
  Candidate a = Make(1, 100, 0, 1000), b = Make(2, 100, 0, 2000);
  a.neighbourhood_ns = a.ancestors_ns = 1'000'000;
  EXPECT_THAT(Ids(PlanFor("dtr-local", {a, b}, 100)), ElementsAre(1));
  EXPECT_THAT(Ids(PlanFor("dtr", {a, b}, 100)), ElementsAre(2));
}

TEST(PolicyTest, MspsRanksMemorySavedPerSecondWithoutStaleness) {
  const std::int64_t now = 1'000'000;
  // b was used just now but saves more bytes per recompute second: msps takes it.
  Candidate a = Make(1, 100, 0, 1000), b = Make(2, 400, now - 1, 1000);
  EXPECT_THAT(Ids(PlanFor("msps", {a, b}, 100, now)), ElementsAre(2));
  EXPECT_THAT(Ids(PlanFor("dtr", {a, b}, 100, now)), ElementsAre(1));
  b.ancestors_ns = 100'000;  // its dropped ancestors make it dear
  EXPECT_THAT(Ids(PlanFor("msps", {a, b}, 100, now)), ElementsAre(1));
}

TEST(PolicyTest, MegEngineLikesFreeNeighboursAndKeepsTheOftenRecomputed) {
  Candidate a = Make(1, 100, 0, 1000), b = Make(2, 100, 0, 1000);
  b.adjacent_free_bytes = 1000;  // freeing b makes an 1100-byte hole
  EXPECT_THAT(Ids(PlanFor("megengine", {a, b}, 100)), ElementsAre(2));
  b.recomputes = 40;  // 1.2^40: recomputed too often
  EXPECT_THAT(Ids(PlanFor("megengine", {a, b}, 100)), ElementsAre(1));
  EXPECT_THAT(Ids(PlanFor("megengine:r=1", {a, b}, 100)), ElementsAre(2));
}

TEST(PolicyTest, BeladyEvictsWhatIsUsedFarthestAhead) {
  Candidate soon = Make(1, 100, 0), late = Make(2, 100, 0), never = Make(3, 100, 0);
  soon.next_use_ns = 10;
  late.next_use_ns = 10'000;
  never.next_use_ns = kNeverUsedAgain;
  EXPECT_THAT(Ids(PlanFor("belady", {soon, late, never}, 200)), ElementsAre(3, 2));
}

TEST(PolicyTest, HybridDoesNotCallFreeWhatADroppedTensorsRecomputeStillReads) {
  // Never used by the program again, but a dropped tensor's closure reads
  // it: dropping it costs that recompute a cascade, not nothing.
  Candidate needed = Make(1, 100, 0, 1000), cheap = Make(2, 100, 0, 10);
  needed.next_use_ns = kNeverUsedAgain;
  needed.consumers_ns = 1'000'000'000;
  cheap.next_use_ns = 5'000;
  for (Candidate* c : {&needed, &cheap}) c->can_offload = false;
  EXPECT_THAT(Ids(PlanFor("hybrid", {needed, cheap}, 100)), ElementsAre(2));
  needed.consumers_ns = 0;  // read by nothing dropped: free to drop
  EXPECT_THAT(Ids(PlanFor("hybrid", {needed, cheap}, 100)), ElementsAre(1));
}

TEST(PolicyTest, BeladyWithoutHintsEvictsTheLeastRecentlyUsedAfterTheNeverUsed) {
  // No hint: after what is never used again, before what has a hint, the
  // stalest first (run blind, belady is lru).
  Candidate hinted = Make(1, 100, 0), stale = Make(2, 100, 0), fresh = Make(3, 100, 0),
            never = Make(4, 100, 0);
  hinted.next_use_ns = 1'000'000'000;
  stale.last_access_ns = 10;
  fresh.last_access_ns = 500;
  never.next_use_ns = kNeverUsedAgain;
  EXPECT_THAT(Ids(PlanFor("belady", {hinted, fresh, stale, never}, 400)),
              ElementsAre(4, 2, 3, 1));
}

TEST(PolicyTest, PoliciesThatDoNotScoreByTheNeighbourhoodGetItForWhatTheyEvict) {
  // Cheap to recompute alone (10 us against a 100 us round trip): dropped;
  // with 1 ms of dropped ancestors it must come back through, offloaded.
  Candidate a = Make(1, 100, 0, 10'000, 100'000);
  for (const char* spec : {"lru", "largest", "dtr-local", "dtr-eq", "belady"}) {
    SCOPED_TRACE(spec);
    auto policy = Create(spec);
    ASSERT_TRUE(policy.ok());
    EXPECT_FALSE((*policy)->needs().neighbourhood);
    std::vector<Candidate> cs = {a};
    PressureContext ctx;
    ctx.bytes_needed = 100;
    ctx.now_ns = 1'000'000;
    ctx.candidates = cs;
    EXPECT_THAT((*policy)->Choose(ctx), ElementsAre(PlanStep{1, EvictAction::kDrop}));
    ctx.complete_fn = [](const void*, Candidate& c) {
      c.ancestors_ns = 1'000'000;
      c.neighbourhood_ns = c.ancestors_ns + c.consumers_ns;
    };
    EXPECT_THAT((*policy)->Choose(ctx), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  }
  for (const char* spec : {"dtr", "msps", "megengine", "window", "hybrid"}) {
    EXPECT_TRUE((*Create(spec))->needs().neighbourhood) << spec;
  }
}

// Hybrid's choice on the link's terms: a 40 us round trip (20 us out, 20 back)
// against a 50 us recompute.
Plan HybridPlan(const std::vector<Candidate>& candidates, std::size_t needed,
                std::int64_t link_backlog_ns = 0, std::int64_t restore_backlog_ns = 0,
                const std::string& spec = "hybrid") {
  auto policy = Create(spec);
  EXPECT_TRUE(policy.ok()) << policy.status();
  PressureContext ctx;
  ctx.bytes_needed = needed;
  ctx.now_ns = 1'000'000;
  ctx.link_backlog_ns = link_backlog_ns;
  ctx.restore_backlog_ns = restore_backlog_ns;
  ctx.candidates = candidates;
  return (*policy)->Choose(ctx);
}

TEST(PolicyTest, HybridOffloadsWhenWaitingForTheCopyCostsLessThanRecomputing) {
  Candidate a = Make(1, 100, 0, 50'000, 40'000);
  a.next_use_ns = 1'000'000;  // far: the copy back is hidden; the request waits 20 us for the copy out
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  a.next_use_ns = 1'000;  // near: out and back are both waited for, 40 us: still under 50
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  a.compute_ns = 30'000;  // near, and recomputing (30 us) beats 40 us of copies
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kDrop}));
  a.next_use_ns = 1'000'000;  // far again: 20 us of copy out beats 30 us of recompute
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  // ...unless the restores already owed fill the link until then: 2 x (500 + 40) > 1000.
  EXPECT_THAT(HybridPlan({a}, 100, 0, 500'000), ElementsAre(PlanStep{1, EvictAction::kDrop}));
  // ...or the link is busy: 15 us of backlog + 20 out > 30.
  EXPECT_THAT(HybridPlan({a}, 100, 15'000), ElementsAre(PlanStep{1, EvictAction::kDrop}));
  // The two directions run side by side: 400 us of copies out queued and 400
  // us of copies in owed still bring it back by max(400 + 20, 400) + 20 = 440
  // us (x2 slack = 880 < 1000: hidden), so the offload costs only its wait
  // and copy out, 420 us, under a 450 us recompute. (On one shared queue it
  // would be 400 + 400 + 40: not hidden, 460 us: a drop.)
  Candidate far = a;
  far.compute_ns = 450'000;
  EXPECT_THAT(HybridPlan({far}, 100, 400'000, 400'000),
              ElementsAre(PlanStep{1, EvictAction::kOffload}));
  // Online: the access history predicts the next use.
  Candidate c = Make(3, 100, 900'000, 50'000, 40'000);
  c.first_access_ns = 100'000;
  c.accesses = 3;  // every 400 us: next at 1.3 ms, 300 us from now; 2 x 40 fits
  c.compute_ns = 30'000;
  EXPECT_THAT(HybridPlan({c}, 100), ElementsAre(PlanStep{3, EvictAction::kOffload}));
  c.accesses = 1;  // no history: the copy back counts too, 40 us > 30
  EXPECT_THAT(HybridPlan({c}, 100), ElementsAre(PlanStep{3, EvictAction::kDrop}));
  EXPECT_EQ((*Create("hybrid:prefetch_us=500"))->prefetch_window_ns(), 500'000);
  // Never read again (the driver knows): dropping it costs nothing at all.
  Candidate gone = Make(4, 100, 0, 50'000, 40'000);
  gone.next_use_ns = std::numeric_limits<std::int64_t>::max();
  EXPECT_THAT(HybridPlan({gone}, 100), ElementsAre(PlanStep{4, EvictAction::kDrop}));
}

// A tensor copied out ahead (RuntimeOptions::copy_ahead) frees its block
// with no copy out now: only its copy back is left to pay.
TEST(PolicyTest, ATensorCopiedOutAheadCostsOnlyItsCopyBack) {
  Candidate a = Make(1, 100, 0, 30'000, 40'000);
  EXPECT_EQ(OffloadNs(a), 40'000);
  EXPECT_EQ(CheaperAction(a), EvictAction::kDrop);  // 30 us of recompute under 40 of copies
  EXPECT_DOUBLE_EQ(EvictionCost(a, 30'000), 30'000);
  a.copied_out = true;
  EXPECT_EQ(OffloadNs(a), 20'000);
  EXPECT_EQ(CheaperAction(a), EvictAction::kOffload);  // 20 us of copy back
  EXPECT_DOUBLE_EQ(EvictionCost(a, 30'000), 20'000);

  // hybrid: near its next use and with the link busy, a copy out and back
  // (15 + 20 + 20 us) loses to a 30 us recompute; copied ahead, only the
  // copy back (20 us) is waited for, and nothing queues behind it.
  a.next_use_ns = 1'000;
  a.copied_out = false;
  EXPECT_THAT(HybridPlan({a}, 100, 15'000), ElementsAre(PlanStep{1, EvictAction::kDrop}));
  a.copied_out = true;
  EXPECT_THAT(HybridPlan({a}, 100, 15'000), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  // Far from its next use, its copy back is hidden: it costs nothing, and
  // goes before a cheaper recompute.
  a.next_use_ns = 1'000'000;
  Candidate b = Make(2, 100, 0, 1'000, 40'000);
  EXPECT_THAT(HybridPlan({b, a}, 100), ElementsAre(PlanStep{1, EvictAction::kOffload}));
}

TEST(PolicyTest, HybridRanksByCostAndCountsItsOwnCopiesOnTheLink) {
  // Both far from their next use and dearer to recompute than to copy out.
  Candidate a = Make(1, 100, 0, 50'000, 40'000), b = Make(2, 100, 0, 50'000, 40'000);
  a.next_use_ns = b.next_use_ns = 1'000'000;
  // a goes first (lower id on a tie) and is offloaded; b's copy would queue
  // behind a's 20 us: 40 us of waiting, still under 50.
  EXPECT_THAT(HybridPlan({a, b}, 200), ElementsAre(PlanStep{1, EvictAction::kOffload},
                                                   PlanStep{2, EvictAction::kOffload}));
  b.compute_ns = 35'000;  // behind a's copy, b's 40 us now lose to its 35 us recompute
  EXPECT_THAT(HybridPlan({a, b}, 200), ElementsAre(PlanStep{1, EvictAction::kOffload},
                                                   PlanStep{2, EvictAction::kDrop}));
  b.compute_ns = 1'000;  // recomputing b is the cheapest eviction of all: first
  EXPECT_THAT(HybridPlan({a, b}, 200), ElementsAre(PlanStep{2, EvictAction::kDrop},
                                                   PlanStep{1, EvictAction::kOffload}));
  // Only one is needed: the cheaper alone.
  EXPECT_THAT(Ids(HybridPlan({a, b}, 100)), ElementsAre(2));
  // Without offload or drop allowed, the other action is taken whatever it costs.
  a.can_drop = false;
  a.next_use_ns = 1'000;
  a.compute_ns = 1;
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kOffload}));
  a.can_drop = true;
  a.can_offload = false;
  a.compute_ns = 1'000'000'000;
  EXPECT_THAT(HybridPlan({a}, 100), ElementsAre(PlanStep{1, EvictAction::kDrop}));
}

TEST(PolicyTest, HybridParametersAreCheckedAndEchoed) {
  auto policy = Create("hybrid:slack=3,consumers=1,staleness_exp=0");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT((*policy)->Spec(), HasSubstr("slack=3"));
  EXPECT_FALSE(Create("hybrid:slack=0.5").ok());  // a slack under 1 would promise the impossible
  EXPECT_FALSE(Create("hybrid:consumers=2").ok());
  EXPECT_FALSE(Create("hybrid:hidden_weight=0.1").ok());
}

// rank=NAME: the tensors another policy would evict, in its order, each
// going the way hybrid prices cheaper.
TEST(PolicyTest, HybridOverAnotherRankingEvictsWhatThatPolicyWouldEachTheCheaperWay) {
  // lru takes the stalest (1, then 2); hybrid's own ranking would take 3,
  // the cheapest to recompute.
  Candidate a = Make(1, 100, 100, 50'000, 40'000), b = Make(2, 100, 200, 30'000, 40'000),
            c = Make(3, 100, 900'000, 1'000, 40'000);
  a.next_use_ns = 1'000'000;  // far: its copy back hides, so 20 us of copy out beats 50 of recompute
  b.next_use_ns = 1'000;      // near: out and back, 40 us, lose to 30 us of recompute
  c.next_use_ns = 1'000;
  EXPECT_THAT(Ids(PlanFor("lru", {a, b, c}, 200)), ElementsAre(1, 2));
  EXPECT_THAT(HybridPlan({a, b, c}, 200, 0, 0, "hybrid:rank=lru"),
              ElementsAre(PlanStep{1, EvictAction::kOffload}, PlanStep{2, EvictAction::kDrop}));
  EXPECT_THAT(Ids(HybridPlan({a, b, c}, 100, 0, 0, "hybrid:rank=own")), ElementsAre(3));
  // The link is counted along the ranking: behind 25 us of backlog a's copy
  // out (45 us) still beats its recompute; behind 35 us (55) it does not.
  EXPECT_THAT(HybridPlan({a, b, c}, 100, 25'000, 0, "hybrid:rank=lru"),
              ElementsAre(PlanStep{1, EvictAction::kOffload}));
  EXPECT_THAT(HybridPlan({a, b, c}, 100, 35'000, 0, "hybrid:rank=lru"),
              ElementsAre(PlanStep{1, EvictAction::kDrop}));
  // The ranker's needs are asked for, and next uses for the choice.
  auto over_window = Create("hybrid:rank=window");
  ASSERT_TRUE(over_window.ok()) << over_window.status();
  EXPECT_TRUE((*over_window)->needs().memory_map);
  EXPECT_TRUE((*over_window)->needs().next_use);
  EXPECT_THAT((*over_window)->Spec(), HasSubstr("rank=window"));
  EXPECT_TRUE((*over_window)->Trials().empty());  // a ranking named: one run
}

// rank=auto (the default): one ranking, its own, where the step is seen
// once; a driver that can replay the step tries them all.
TEST(PolicyTest, HybridByDefaultAsksForATrialOverEveryRankingWithItsDropOnlyTwin) {
  auto policy = Create("hybrid:slack=3");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT((*policy)->Spec(), HasSubstr("rank=auto"));
  const std::vector<Trial> trials = (*policy)->Trials();
  // Its own ranking; and for every other policy, hybrid over its ranking
  // (with that policy's drop-only run) and that policy's own mixed plan.
  ASSERT_EQ(trials.size(), 2 * KnownPolicies().size() - 1);
  EXPECT_THAT(trials[0].mixed, HasSubstr("rank=own"));
  EXPECT_EQ(trials[0].drops, trials[0].mixed);
  std::vector<std::string> alone;
  for (const Trial& t : trials) {
    auto mixed = Create(t.mixed);
    ASSERT_TRUE(mixed.ok()) << t.mixed << ": " << mixed.status();
    EXPECT_TRUE((*mixed)->Trials().empty()) << t.mixed;  // no trials of trials
    if (t.drops.empty()) {
      alone.push_back(t.mixed);
      continue;
    }
    EXPECT_THAT(t.mixed, HasSubstr("slack=3"));  // the parameters travel
    ASSERT_TRUE(Create(t.drops).ok()) << t.drops;
    if (t.drops != t.mixed) {
      EXPECT_THAT(t.mixed, HasSubstr("rank=" + t.drops.substr(0, t.drops.find(':')) + ","));
    }
  }
  EXPECT_THAT(alone, ElementsAre("lru:sample=all", "largest:sample=all", "dtr:sample=all",
                                 "dtr-eq:sample=all", "dtr-local:sample=all", "msps:sample=all",
                                 "megengine:sample=all", "window:sample=all",
                                 "belady:sample=all"));
  // Every run samples as the policy asked.
  for (const Trial& t : (*Create("hybrid:sample=sqrt"))->Trials()) {
    EXPECT_THAT(t.mixed, HasSubstr("sample=sqrt"));
    EXPECT_EQ((*Create(t.mixed))->sampling().ToString(), "sqrt");
  }
  // Plans as its own ranking's.
  Candidate a = Make(1, 100, 100, 50'000, 40'000), c = Make(3, 100, 900'000, 1'000, 40'000);
  a.next_use_ns = c.next_use_ns = 1'000;
  EXPECT_EQ(HybridPlan({a, c}, 100), HybridPlan({a, c}, 100, 0, 0, "hybrid:rank=own"));
  EXPECT_TRUE((*Create("dtr"))->Trials().empty());
  for (const char* bad : {"hybrid:rank=hybrid", "hybrid:rank=nonesuch", "hybrid:rank="}) {
    EXPECT_EQ(Create(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(Create("hybrid:rank=nonesuch").status().message(), HasSubstr("nonesuch"));
}

// auto: dtr where the step is seen once; a driver that can replay the step
// tries dtr first (kept on a tie), then everything hybrid tries, each run once.
TEST(PolicyTest, AutoChoosesAsDtrOnceAndAsksForATrialOfEveryPolicy) {
  auto policy = Create("auto");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ((*policy)->Spec(), "auto");
  EXPECT_EQ((*Create("auto:sample=sqrt"))->Spec(), "auto:sample=sqrt");
  EXPECT_EQ(Create("auto:rank=dtr").status().code(), absl::StatusCode::kInvalidArgument);
  // One pass: dtr's plan, for every budget asked.
  const Candidate a = Make(1, 100, 100, 50'000, 40'000), b = Make(2, 300, 1'000, 5'000, 80'000),
                  c = Make(3, 200, 9'000, 1'000, 10'000);
  for (std::uint64_t need : {1, 150, 250, 600}) {
    EXPECT_EQ(PlanFor("auto", {a, b, c}, need), PlanFor("dtr", {a, b, c}, need)) << need;
  }
  // The trials: dtr's own runs first, then hybrid's, without a second dtr run,
  // then dtr-eq with next uses.
  const std::vector<Trial> trials = (*Create("auto:sample=sqrt"))->Trials();
  ASSERT_FALSE(trials.empty());
  EXPECT_EQ(trials[0].mixed, "dtr:sample=sqrt");
  EXPECT_EQ(trials[0].drops, "dtr:sample=sqrt");
  const std::vector<Trial> hybrid = (*Create("hybrid:sample=sqrt"))->Trials();
  // hybrid's "dtr alone" run became the first; dtr-eq with next uses, by
  // staleness and by its square, are the last two.
  ASSERT_EQ(trials.size(), hybrid.size() + 2);
  EXPECT_EQ(trials[trials.size() - 2].mixed, "dtr-eq:future=true,staleness_exp=1,sample=sqrt");
  EXPECT_EQ(trials[trials.size() - 2].drops, "dtr-eq:future=true,staleness_exp=1,sample=sqrt");
  EXPECT_EQ(trials.back().mixed, "dtr-eq:future=true,staleness_exp=2,sample=sqrt");
  EXPECT_EQ(trials.back().drops, "dtr-eq:future=true,staleness_exp=2,sample=sqrt");
  std::set<std::string> mixed, drops;
  for (const Trial& t : trials) {
    EXPECT_TRUE(mixed.insert(t.mixed).second) << t.mixed;
    if (!t.drops.empty()) EXPECT_TRUE(drops.insert(t.drops).second) << t.drops;
    EXPECT_EQ((*Create(t.mixed))->sampling().ToString(), "sqrt") << t.mixed;
  }
  for (const Trial& t : hybrid) {
    EXPECT_TRUE(mixed.contains(t.mixed)) << t.mixed;
    if (!t.drops.empty()) EXPECT_TRUE(drops.contains(t.drops)) << t.drops;
  }
  for (const std::string& name : KnownPolicies()) {
    if (name == "hybrid") continue;
    EXPECT_TRUE(drops.contains(name + ":sample=sqrt")) << name;  // every ranking, drops only
  }
  // auto ranks nothing of its own: it is no ranking for hybrid's trials.
  EXPECT_THAT(KnownPolicies(), testing::Not(testing::Contains("auto")));
}

// Two segments; the request needs 3 contiguous units.
TEST(PolicyTest, WindowEvictsTheCheapestContiguousRun) {
  MemoryMap map;
  MemoryMapSegment seg;
  seg.address = 0x10000;
  seg.size = 2 << 20;
  seg.is_large = true;
  // Blocks: [A 512K dear][free 512K][B 512K cheap][C 512K cheap]
  const std::size_t k = 512 << 10;
  seg.blocks = {{0x10000, k, BlockState::kActiveAllocated, 1},
                {0x10000 + k, k, BlockState::kInactive, 0},
                {0x10000 + 2 * k, k, BlockState::kActiveAllocated, 2},
                {0x10000 + 3 * k, k, BlockState::kActiveAllocated, 3}};
  map.segments.push_back(seg);
  Candidate a = Make(1, k, 0, 9'000'000), b = Make(2, k, 0, 1000), c = Make(3, k, 0, 1000);
  a.address = 0x10000;
  b.address = 0x10000 + 2 * k;
  c.address = 0x10000 + 3 * k;
  auto policy = Create("window");
  ASSERT_TRUE(policy.ok());
  EXPECT_TRUE((*policy)->needs().memory_map);
  std::vector<Candidate> cs = {a, b, c};
  PressureContext ctx;
  ctx.bytes_needed = 3 * k;  // 1.5 MiB: the free block, b and c
  ctx.now_ns = 1'000'000;
  ctx.candidates = cs;
  ctx.memory_map = &map;
  EXPECT_THAT(Ids((*policy)->Choose(ctx)), ElementsAre(2, 3));
  // Without the map it ranks like dtr and still covers the bytes.
  ctx.memory_map = nullptr;
  EXPECT_EQ((*policy)->Choose(ctx).size(), 3u);
}

TEST(PolicyTest, WindowWeighsEachBlockByItsStaleness) {
  // Four blocks of equal size and cost; the request needs two. A and B were
  // just used, C and D long ago: the run (C, D) is the one to evict, as
  // DTR's heuristic says. Without staleness every run costs the same and
  // the first, (A, B), is taken.
  MemoryMap map;
  MemoryMapSegment seg;
  const std::size_t k = 1 << 20;  // a request of 2 MiB: served from large segments
  seg.address = 0x10000;
  seg.size = 4 * k;
  seg.is_large = true;
  std::vector<Candidate> cs;
  for (std::uint64_t i = 0; i < 4; ++i) {
    seg.blocks.push_back({0x10000 + i * k, k, BlockState::kActiveAllocated, i + 1});
    cs.push_back(Make(i + 1, k, /*last_access=*/i < 2 ? 999'990 : 0));
    cs.back().address = 0x10000 + i * k;
  }
  map.segments.push_back(seg);
  PressureContext ctx;
  ctx.bytes_needed = 2 * k;
  ctx.now_ns = 1'000'000;
  ctx.candidates = cs;
  ctx.memory_map = &map;
  auto window = Create("window");
  ASSERT_TRUE(window.ok());
  EXPECT_THAT((*window)->Spec(), HasSubstr("staleness_exp=1"));
  EXPECT_THAT(Ids((*window)->Choose(ctx)), ElementsAre(3, 4));
  auto flat = Create("window:staleness_exp=0");
  ASSERT_TRUE(flat.ok());
  EXPECT_THAT(Ids((*flat)->Choose(ctx)), ElementsAre(1, 2));
  EXPECT_FALSE(Create("window:staleness_exp=-1").ok());
}

// One segment of 1 MiB blocks: [A][free][B][C][D], A, B and D evictable
// (C pinned: no candidate). A request of 2 MiB fits only around the free
// block: the run (A, free) or (free, B).
class CoveringRunTest : public ::testing::Test {
 protected:
  static constexpr std::size_t k = 1 << 20;
  void SetUp() override {
    seg_.address = 0x100000;
    seg_.size = 5 * k;
    seg_.is_large = true;
    for (std::uint64_t i = 0; i < 5; ++i) {
      const bool free = i == 1;
      seg_.blocks.push_back({0x100000 + i * k, k,
                             free ? BlockState::kInactive : BlockState::kActiveAllocated,
                             free ? 0 : i + 1});
      if (!free && i != 3) {
        cs_.push_back(Make(i + 1, k, /*last_access=*/0, /*compute_ns=*/(i + 1) * 1000));
        cs_.back().address = 0x100000 + i * k;
      }
    }
    ctx_.bytes_needed = 2 * k;
    ctx_.now_ns = 1'000'000;
  }
  PressureContext& Ctx() {
    map_.segments.assign(1, seg_);
    ctx_.candidates = cs_;
    ctx_.memory_map = &map_;
    return ctx_;
  }
  static double Compute(const Candidate& c) { return static_cast<double>(c.compute_ns); }

  MemoryMapSegment seg_;
  MemoryMap map_;
  std::vector<Candidate> cs_;
  PressureContext ctx_;
};

TEST_F(CoveringRunTest, TakesTheCheapestRunAroundPinnedBlocks) {
  std::optional<Plan> run = CheapestCoveringRun(Ctx(), Compute);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(1));  // A (1000 ns) with the free block, not B (3000 ns)
  // Needing 3 MiB: C is pinned, so only (A, free, B) covers it.
  ctx_.bytes_needed = 3 * k;
  run = CheapestCoveringRun(Ctx(), Compute);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(1, 3));
  // 4 MiB: every run breaks at C.
  ctx_.bytes_needed = 4 * k;
  EXPECT_FALSE(CheapestCoveringRun(Ctx(), Compute).has_value());
  // With A freed meanwhile, the 2 MiB hole is there already.
  ctx_.bytes_needed = 2 * k;
  seg_.blocks[0].state = BlockState::kInactive;
  run = CheapestCoveringRun(Ctx(), Compute);
  ASSERT_TRUE(run.has_value());
  EXPECT_TRUE(run->empty());
  // A small request is not served from a large segment, nor anything without a map.
  ctx_.bytes_needed = 4096;
  EXPECT_FALSE(CheapestCoveringRun(Ctx(), Compute).has_value());
  ctx_.memory_map = nullptr;
  ctx_.candidates = cs_;
  EXPECT_FALSE(CheapestCoveringRun(ctx_, Compute).has_value());
}

TEST_F(CoveringRunTest, RunsStopAtABoundaryFreeBlocksNeverCross) {
  seg_.merge_boundary = 2 * k;  // blocks 0-1, 2-3 and 4 merge only among themselves
  seg_.address = 0x200000;
  for (std::size_t i = 0; i < seg_.blocks.size(); ++i) seg_.blocks[i].address = 0x200000 + i * k;
  for (Candidate& c : cs_) c.address = 0x200000 + (c.id - 1) * k;
  cs_[0].compute_ns = 5000;  // A dearer than B: only the boundary keeps (free, B) out
  std::optional<Plan> run = CheapestCoveringRun(Ctx(), Compute);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(1));  // (A, free): within one 2 MiB unit
  seg_.merge_boundary = 0;
  run = CheapestCoveringRun(Ctx(), Compute);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(3));  // without it, (free, B) is cheaper
  seg_.merge_boundary = 2 * k;
  ctx_.bytes_needed = 3 * k;  // (A, free, B) crosses the boundary: no run
  EXPECT_FALSE(CheapestCoveringRun(Ctx(), Compute).has_value());
}

TEST_F(CoveringRunTest, ARunCostsTheExtraOfEachRelatedPairWithinItOnce) {
  ctx_.bytes_needed = 3 * k;  // only (A, free, B) covers it: 1000 + 3000 ns
  const Candidate stranger = Make(7, k, 0);  // not one of the event's candidates
  int visits = 0;
  auto related = [&](const Candidate& c, absl::FunctionRef<void(const Candidate&, double)> visit) {
    ++visits;
    visit(stranger, 1e9);  // never a member of a run: costs nothing
    if (c.id == 1) visit(cs_[1], 500);  // A and B: 500 ns more together, seen from either side
    if (c.id == 3) visit(cs_[0], 500);
  };
  double price = 0;
  std::optional<Plan> run = CheapestCoveringRun(Ctx(), Compute, related, &price);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(1, 3));
  EXPECT_DOUBLE_EQ(price, 4500);
  EXPECT_GT(visits, 0);
  // Needing 2 MiB, (A, free) at 1000 ns beats (free, B) at 3000: no pair within either.
  ctx_.bytes_needed = 2 * k;
  run = CheapestCoveringRun(Ctx(), Compute, related, &price);
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(Ids(*run), ElementsAre(1));
  EXPECT_DOUBLE_EQ(price, 1000);
}

TEST_F(CoveringRunTest, CandidatesNumberedByPositionOrNotGiveTheSamePlans) {
  // The runtime numbers candidates by position (ids 0, 1, ...); a policy's
  // own tests and callers may not. Both find the same blocks.
  auto plans = [&] {
    std::vector<std::vector<std::uint64_t>> out;
    for (std::size_t need : {2 * k, 3 * k, 4 * k}) {
      ctx_.bytes_needed = need;
      std::optional<Plan> run = CheapestCoveringRun(Ctx(), Compute);
      std::vector<std::uint64_t> blocks;
      for (const PlanStep& step : run.value_or(Plan{})) {
        for (const Candidate& c : cs_) {
          if (c.id == step.id) blocks.push_back(c.address);
        }
      }
      out.push_back(blocks);
      Plan everything;
      for (auto it = cs_.rbegin(); it != cs_.rend(); ++it) everything.push_back({it->id});
      const std::optional<std::size_t> steps = StepsToMakeRoom(Ctx(), everything);
      out.push_back({steps.value_or(99), PlanMakesRoom(Ctx(), {everything.front()})});
    }
    return out;
  };
  const auto sparse = plans();  // ids 1, 3, 5
  for (std::size_t i = 0; i < cs_.size(); ++i) cs_[i].id = i;
  EXPECT_EQ(plans(), sparse);
  EXPECT_EQ(sparse[0], std::vector<std::uint64_t>{0x100000});  // 2 MiB: A and the free block
  // An id the event does not have names nothing.
  ctx_.bytes_needed = 2 * k;
  EXPECT_FALSE(PlanMakesRoom(Ctx(), {{42, EvictAction::kDrop}}));
  EXPECT_EQ(StepsToMakeRoom(Ctx(), {{42, EvictAction::kDrop}, {0, EvictAction::kDrop}}),
            std::optional<std::size_t>(2));
}

TEST_F(CoveringRunTest, APlanMakesRoomWithAHoleOrWithWhatTheAllocatorGivesBack) {
  PressureContext& ctx = Ctx();
  // Evicting D alone leaves no 2 MiB hole (C is pinned); A or B next to
  // the free block does.
  EXPECT_FALSE(PlanMakesRoom(ctx, {{5, EvictAction::kDrop}}));
  EXPECT_TRUE(PlanMakesRoom(ctx, {{1, EvictAction::kDrop}}));
  EXPECT_TRUE(PlanMakesRoom(ctx, {{3, EvictAction::kDrop}}));
  // The runtime goes on until the bytes are covered: D, then A.
  EXPECT_TRUE(PlanMakesRoom(ctx, {{5, EvictAction::kDrop}, {1, EvictAction::kDrop}}));
  // How much of a ranking it takes: D alone makes no room, D and A do.
  EXPECT_EQ(StepsToMakeRoom(ctx, {{5, EvictAction::kDrop}, {1, EvictAction::kDrop},
                                  {3, EvictAction::kDrop}}),
            std::optional<std::size_t>(2));
  EXPECT_EQ(StepsToMakeRoom(ctx, {{5, EvictAction::kDrop}}), std::nullopt);
  ctx.bytes_needed = k;  // served from small segments: none here, and no room to grow
  EXPECT_EQ(StepsToMakeRoom(ctx, {{1, EvictAction::kDrop}}), std::nullopt);
  ctx.bytes_needed = 2 * k;
  // A whole fixed segment given back lets the pool grow, where the budget
  // has room for the rest.
  MemoryMapSegment other;
  other.address = 0x1000000;  // 16 MiB: pages of 2 MiB from its start
  other.size = 2 * k;
  other.is_large = false;
  other.blocks = {{0x1000000, 2 * k, BlockState::kActiveAllocated, 9}};
  map_.segments.push_back(other);
  cs_.push_back(Make(9, 2 * k, 0));
  cs_.back().address = 0x1000000;
  ctx.candidates = cs_;
  ctx.growth_bytes = 20 * k;
  ctx.room_bytes = 18 * k;
  EXPECT_TRUE(PlanMakesRoom(ctx, {{9, EvictAction::kDrop}}));
  ctx.room_bytes = 17 * k;
  EXPECT_FALSE(PlanMakesRoom(ctx, {{9, EvictAction::kDrop}}));
  // An expandable segment gives back its whole free pages.
  map_.segments.back().page_size = 2 * k;
  map_.segments.back().size = 4 * k;
  map_.segments.back().blocks = {{0x1000000, 3 * k, BlockState::kActiveAllocated, 9},
                                 {0x1000000 + 3 * k, k, BlockState::kActiveAllocated, 10}};
  cs_.back().bytes = 3 * k;
  ctx.candidates = cs_;
  ctx.room_bytes = 18 * k;
  EXPECT_TRUE(PlanMakesRoom(ctx, {{9, EvictAction::kDrop}}));  // page 0 whole, page 1 not
  ctx.room_bytes = 17 * k;
  EXPECT_FALSE(PlanMakesRoom(ctx, {{9, EvictAction::kDrop}}));
}

}  // namespace
}  // namespace remat::policies
