#include "base/units.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include "absl/strings/str_format.h"

namespace remat {
namespace {

struct Suffix {
  std::string_view name;
  double multiplier;
};

constexpr Suffix kSuffixes[] = {
    {"", 1.0},         {"b", 1.0},
    {"k", 0x1p10},     {"kib", 0x1p10},  {"kb", 1e3},
    {"m", 0x1p20},     {"mib", 0x1p20},  {"mb", 1e6},
    {"g", 0x1p30},     {"gib", 0x1p30},  {"gb", 1e9},
    {"t", 0x1p40},     {"tib", 0x1p40},  {"tb", 1e12},
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<std::uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return absl::InvalidArgumentError("empty byte size");
  std::size_t digits_end = 0;
  while (digits_end < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[digits_end])) || s[digits_end] == '.')) {
    ++digits_end;
  }
  if (digits_end == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("byte size '%s' does not start with a non-negative number", text));
  }
  std::string_view number = s.substr(0, digits_end);
  std::string suffix(Trim(s.substr(digits_end)));
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const Suffix* match = nullptr;
  for (const Suffix& candidate : kSuffixes) {
    if (candidate.name == suffix) match = &candidate;
  }
  if (match == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "byte size '%s' has unknown unit '%s' (binary, powers of 1024: B, K or KiB, M or MiB, "
        "G or GiB, T or TiB; decimal, powers of 1000: KB, MB, GB, TB)", text,
        suffix));
  }
  if (number.find('.') == std::string_view::npos) {
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || end != number.data() + number.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("byte size '%s' is out of range", text));
    }
    const auto mult = static_cast<std::uint64_t>(match->multiplier);
    if (mult != 0 && value > UINT64_MAX / mult) {
      return absl::InvalidArgumentError(absl::StrFormat("byte size '%s' is out of range", text));
    }
    return value * mult;
  }
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("byte size '%s' is not a number", text));
  }
  const double bytes = std::round(value * match->multiplier);
  if (!(bytes >= 0) || bytes >= 0x1p64) {
    return absl::InvalidArgumentError(absl::StrFormat("byte size '%s' is out of range", text));
  }
  return static_cast<std::uint64_t>(bytes);
}

std::string FormatBytes(std::uint64_t bytes) {
  if (bytes < kKiB) return absl::StrFormat("%d B", bytes);
  constexpr std::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace remat
