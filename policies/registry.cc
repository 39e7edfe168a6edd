#include "policies/registry.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "policies/factories.h"
#include "policies/policy_spec.h"

namespace remat::policies {
namespace {

using Factory = absl::StatusOr<std::unique_ptr<EvictionPolicy>> (*)(PolicyParams&);

struct Entry {
  const char* name;
  Factory make;
};

constexpr Entry kPolicies[] = {
    {"lru", &MakeLru},
    {"largest", &MakeLargest},
    {"dtr", &MakeDtr},
    {"dtr-eq", &MakeDtrEq},
    {"dtr-local", &MakeDtrLocal},
    {"msps", &MakeMsps},
    {"megengine", &MakeMegEngine},
    {"window", &MakeWindow},
    {"hybrid", &MakeHybrid},
    {"belady", &MakeBelady},
    {"auto", &MakeAuto},
};

// The policy named, with `params` (consumed); every key must be known.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeFrom(const std::string& name,
                                                         std::map<std::string, std::string> params) {
  for (const Entry& e : kPolicies) {
    if (name != e.name) continue;
    PolicyParams p(name, std::move(params));
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = e.make(p);
    if (!policy.ok()) return policy.status();
    // Parameters every policy has.
    std::string sample = "all";
    if (absl::Status st = p.Text("sample", &sample); !st.ok()) return st;
    absl::StatusOr<Sampling> sampling = Sampling::Parse(sample);
    if (!sampling.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy %s: %s", name, sampling.status().message()));
    }
    (*policy)->set_sampling(*sampling);
    if (absl::Status leftover = p.Finish(); !leftover.ok()) return leftover;
    return policy;
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown policy '%s' (known: %s, %s)", name,
                                                    absl::StrJoin(KnownPolicies(), ", "), kAuto));
}

}  // namespace

std::vector<std::string> KnownPolicies() {
  std::vector<std::string> names;
  for (const Entry& e : kPolicies) {
    if (e.name != std::string_view(kAuto)) names.emplace_back(e.name);
  }
  return names;
}

PolicySpec::PolicySpec() {
  static const PolicySpec* const kDefault = new PolicySpec("dtr");
  *this = *kDefault;
}

PolicySpec::PolicySpec(std::string_view text) : text_(text), given_(text) {
  absl::StatusOr<ParsedSpec> parsed = ParseSpec(text);
  if (!parsed.ok()) {
    status_ = parsed.status();
    return;
  }
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakeFrom(parsed->name, parsed->params);
  if (!policy.ok()) {
    status_ = policy.status();
    return;
  }
  name_ = std::move(parsed->name);
  params_ = std::move(parsed->params);
  text_ = (*policy)->Spec();
}

absl::StatusOr<PolicySpec> PolicySpec::Parse(std::string_view text) {
  PolicySpec spec(text);
  if (!spec.ok()) return spec.status();
  return spec;
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> PolicySpec::Make() const {
  if (!ok()) return status_;
  return MakeFrom(name_, params_);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> Create(std::string_view spec) {
  return PolicySpec(spec).Make();
}

}  // namespace remat::policies
