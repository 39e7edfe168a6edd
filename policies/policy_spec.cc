#include "policies/policy_spec.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace remat::policies {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<ParsedSpec> ParseSpec(std::string_view spec) {
  ParsedSpec parsed;
  const std::size_t colon = spec.find(':');
  parsed.name = std::string(Trim(spec.substr(0, colon)));
  if (parsed.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy spec '%s' has no policy name", std::string(spec)));
  }
  if (colon == std::string_view::npos) return parsed;
  std::string_view rest = spec.substr(colon + 1);
  if (Trim(rest).empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy spec '%s' has a ':' and no parameters after it: give key=value pairs, or the "
        "name alone",
        std::string(spec)));
  }
  // Every piece between commas is a parameter: "a=1," and "a=1,,b=2" have an empty one.
  for (bool more = true; more;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    more = comma != std::string_view::npos;
    if (more) rest = rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    const std::string key(Trim(item.substr(0, eq)));
    if (eq == std::string_view::npos || key.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "policy spec '%s': '%s' is not key=value", std::string(spec), std::string(item)));
    }
    const std::string value(Trim(item.substr(eq + 1)));
    if (value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy spec '%s': '%s' has no value after '='", std::string(spec), key));
    }
    if (!parsed.params.emplace(key, value).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy spec '%s': '%s' is given twice", std::string(spec), key));
    }
  }
  return parsed;
}

absl::Status PolicyParams::Double(const std::string& key, double* value, double min, double max) {
  known_.push_back(key);
  auto it = params_.find(key);
  if (it == params_.end()) return absl::OkStatus();
  const std::string text = it->second;
  params_.erase(it);
  double parsed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(parsed)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy %s: %s=%s is not a number", policy_, key, text));
  }
  if (parsed < min || parsed > max) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy %s: %s=%s is out of range [%g, %g]", policy_, key, text, min, max));
  }
  *value = parsed;
  return absl::OkStatus();
}

absl::Status PolicyParams::Bool(const std::string& key, bool* value) {
  known_.push_back(key);
  auto it = params_.find(key);
  if (it == params_.end()) return absl::OkStatus();
  const std::string text = it->second;
  params_.erase(it);
  if (text == "true" || text == "1") {
    *value = true;
  } else if (text == "false" || text == "0") {
    *value = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy %s: %s=%s is not true or false", policy_, key, text));
  }
  return absl::OkStatus();
}

absl::Status PolicyParams::Text(const std::string& key, std::string* value) {
  known_.push_back(key);
  auto it = params_.find(key);
  if (it == params_.end()) return absl::OkStatus();
  *value = it->second;
  params_.erase(it);
  return absl::OkStatus();
}

absl::Status PolicyParams::Finish() const {
  if (params_.empty()) return absl::OkStatus();
  const std::string unknown = params_.begin()->first;
  return absl::InvalidArgumentError(absl::StrFormat(
      "policy %s has no parameter '%s' (it knows: %s)", policy_, unknown,
      known_.empty() ? std::string("none") : absl::StrJoin(known_, ", ")));
}

}  // namespace remat::policies
