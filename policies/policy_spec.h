// Policy specs as text, so sweeps and command lines name policies:
//
//   "lru"                       a policy with its defaults
//   "dtr:staleness_exp=2"       name:key=value,key=value
//
// A PolicyParams holds the parsed key=value pairs; a policy's factory takes
// the keys it knows (typed, range-checked) and then Finish() fails on any key
// left over, naming the keys the policy knows.
#ifndef REMAT_POLICIES_POLICY_SPEC_H_
#define REMAT_POLICIES_POLICY_SPEC_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat::policies {

struct ParsedSpec {
  std::string name;
  std::map<std::string, std::string> params;  // ordered: Spec() strings are canonical
};

// Splits "name:k=v,k=v". Rejects an empty name, an empty key, a key without
// '=', and a key given twice.
absl::StatusOr<ParsedSpec> ParseSpec(std::string_view spec);

class PolicyParams {
 public:
  PolicyParams(std::string policy, std::map<std::string, std::string> params)
      : policy_(std::move(policy)), params_(std::move(params)) {}

  // Each reads and consumes one key, or leaves `*value` at its default when
  // the key is absent. Errors name the policy, the key and the bad text.
  absl::Status Double(const std::string& key, double* value, double min, double max);
  absl::Status Bool(const std::string& key, bool* value);
  // The raw text, for parameters with their own syntax.
  absl::Status Text(const std::string& key, std::string* value);
  // Fails on any key no accessor consumed, listing the known keys.
  absl::Status Finish() const;

 private:
  std::string policy_;
  std::map<std::string, std::string> params_;
  std::vector<std::string> known_;
};

}  // namespace remat::policies

#endif  // REMAT_POLICIES_POLICY_SPEC_H_
