// Eviction policies from text specs (see policy_spec.h for the syntax):
//
//   policies::PolicySpec spec("dtr:staleness_exp=2");  // parsed and checked here, once
//   if (!spec.ok()) return spec.status();              // names the bad key or value
//   std::unique_ptr<EvictionPolicy> p = *spec.Make();  // as many as runs need
//
// A PolicySpec is what travels: through RuntimeOptions, the simulator's and
// the sweep's options, and the command lines. It converts from text, so
// `options.policy = "lru"` reads as before; a text that is not a policy keeps
// its error, and whatever uses the spec returns it before running anything.
// An unknown name or parameter is an InvalidArgument that lists what is known.
#ifndef REMAT_POLICIES_REGISTRY_H_
#define REMAT_POLICIES_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/eviction_policy.h"

namespace remat::policies {

class PolicySpec {
 public:
  // "dtr" with its defaults.
  PolicySpec();
  // Parses `text` and checks every key and value (by making the policy once).
  // Implicit, so that a spec can be given as text wherever one is expected.
  PolicySpec(std::string_view text);  // NOLINT(google-explicit-constructor)
  PolicySpec(const char* text)  // NOLINT (null: no name, an error)
      : PolicySpec(std::string_view(text == nullptr ? "" : text)) {}
  PolicySpec(const std::string& text) : PolicySpec(std::string_view(text)) {}  // NOLINT

  // The same, with the error at once.
  static absl::StatusOr<PolicySpec> Parse(std::string_view text);

  // OK, or why the text is not a policy.
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  // The policy's name ("dtr"); empty when not ok.
  const std::string& name() const { return name_; }
  // The canonical spec (every parameter, sorted: EvictionPolicy::Spec()), or
  // the text as given when not ok.
  const std::string& text() const { return text_; }
  // The text as given ("dtr"), for labels a user will recognise.
  const std::string& given() const { return given_; }

  // A fresh policy; status() when not ok. Parses nothing.
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> Make() const;

  // Same canonical spec (both ok), or same text and error.
  friend bool operator==(const PolicySpec& a, const PolicySpec& b) {
    return a.text_ == b.text_ && a.status_ == b.status_;
  }

 private:
  absl::Status status_;
  std::string name_;
  std::string text_;
  std::string given_;
  std::map<std::string, std::string> params_;  // parsed, as given
};

// PolicySpec(spec).Make(): for callers that want one policy at once.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> Create(std::string_view spec);

// The names of the policies that rank tensors themselves, in a stable order:
// every name a spec may start with but "auto", which tries them all (kAuto).
std::vector<std::string> KnownPolicies();
inline constexpr const char kAuto[] = "auto";

}  // namespace remat::policies

#endif  // REMAT_POLICIES_REGISTRY_H_
