#include "policies/eviction_policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_format.h"

namespace remat::policies {

absl::StatusOr<Sampling> Sampling::Parse(std::string_view text) {
  Sampling s;
  if (text == "all") return s;
  if (text == "sqrt") {
    s.kind = Kind::kSqrt;
    return s;
  }
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc() && end == text.data() + text.size() && std::isfinite(v)) {
    if (v > 0 && v < 1) {
      s.kind = Kind::kFraction;
      s.value = v;
      return s;
    }
    if (v >= 1 && v == std::floor(v) && v <= 1e12) {
      s.kind = Kind::kCount;
      s.value = v;
      return s;
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "sample=%s: expected all, sqrt, a count of candidates (>= 1) or a fraction in (0, 1)",
      std::string(text)));
}

std::string Sampling::ToString() const {
  switch (kind) {
    case Kind::kAll: return "all";
    case Kind::kSqrt: return "sqrt";
    case Kind::kCount: return absl::StrFormat("%.0f", value);
    case Kind::kFraction: return absl::StrFormat("%g", value);
  }
  return "all";
}

std::size_t Sampling::Size(std::size_t n) const {
  if (n == 0) return 0;
  double k = static_cast<double>(n);
  switch (kind) {
    case Kind::kAll: return n;
    case Kind::kSqrt: k = std::ceil(std::sqrt(static_cast<double>(n))); break;
    case Kind::kCount: k = value; break;
    case Kind::kFraction: k = std::ceil(value * static_cast<double>(n)); break;
  }
  return std::clamp<std::size_t>(static_cast<std::size_t>(k), 1, n);
}

std::string EvictionPolicy::Spec() const {
  std::string spec = OwnSpec();
  if (sampling_.kind == Sampling::Kind::kAll) return spec;
  spec += spec.find(':') == std::string::npos ? ":" : ",";
  return spec + "sample=" + sampling_.ToString();
}

}  // namespace remat::policies
