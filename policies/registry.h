// Creates eviction policies from text specs (see policy_spec.h):
//
//   absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = policies::Create("dtr:staleness_exp=2");
//
// An unknown name or parameter is an InvalidArgument that lists what is known.
#ifndef REMAT_POLICIES_REGISTRY_H_
#define REMAT_POLICIES_REGISTRY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/eviction_policy.h"

namespace remat::policies {

absl::StatusOr<std::unique_ptr<EvictionPolicy>> Create(std::string_view spec);

// The policy names Create knows, in a stable order.
std::vector<std::string> KnownPolicies();

}  // namespace remat::policies

#endif  // REMAT_POLICIES_REGISTRY_H_
