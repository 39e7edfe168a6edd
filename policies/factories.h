// The factory of each policy, for the registry. Each reads its parameters
// from `params` (the registry then rejects any left over).
#ifndef REMAT_POLICIES_FACTORIES_H_
#define REMAT_POLICIES_FACTORIES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "policies/eviction_policy.h"
#include "policies/policy_spec.h"

namespace remat::policies {

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLru(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLargest(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtr(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtrEq(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeDtrLocal(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeMsps(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeMegEngine(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeWindow(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeHybrid(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeBelady(PolicyParams& params);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeAuto(PolicyParams& params);

}  // namespace remat::policies

#endif  // REMAT_POLICIES_FACTORIES_H_
