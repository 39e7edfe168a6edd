#include "policies/registry.h"

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
};

}  // namespace

std::vector<std::string> KnownPolicies() {
  std::vector<std::string> names;
  for (const Entry& e : kPolicies) names.emplace_back(e.name);
  return names;
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> Create(std::string_view spec) {
  absl::StatusOr<ParsedSpec> parsed = ParseSpec(spec);
  if (!parsed.ok()) return parsed.status();
  for (const Entry& e : kPolicies) {
    if (parsed->name != e.name) continue;
    PolicyParams params(parsed->name, std::move(parsed->params));
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = e.make(params);
    if (!policy.ok()) return policy.status();
    // Parameters every policy has.
    std::string sample = "all";
    if (absl::Status st = params.Text("sample", &sample); !st.ok()) return st;
    absl::StatusOr<Sampling> sampling = Sampling::Parse(sample);
    if (!sampling.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy %s: %s", parsed->name, sampling.status().message()));
    }
    (*policy)->set_sampling(*sampling);
    if (absl::Status leftover = params.Finish(); !leftover.ok()) return leftover;
    return policy;
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown policy '%s' (known: %s)",
                                                    parsed->name,
                                                    absl::StrJoin(KnownPolicies(), ", ")));
}

}  // namespace remat::policies
