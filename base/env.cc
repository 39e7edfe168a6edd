#include "base/env.h"

#include <cstdlib>
#include <string_view>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace remat {

const char* GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

absl::Status BytesFromEnv(const char* name, std::size_t* out) {
  const char* v = GetEnv(name);
  if (v == nullptr) return absl::OkStatus();
  absl::StatusOr<std::uint64_t> bytes = ParseBytes(v);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s=%s: %s", name, v, bytes.status().message()));
  }
  *out = static_cast<std::size_t>(*bytes);
  return absl::OkStatus();
}

absl::Status FlagFromEnv(const char* name, bool* out) {
  const char* v = GetEnv(name);
  if (v == nullptr) return absl::OkStatus();
  const std::string_view s(v);
  if (s == "1" || s == "true" || s == "yes") {
    *out = true;
  } else if (s == "0" || s == "false" || s == "no") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat("%s=%s: expected 1 or 0", name, v));
  }
  return absl::OkStatus();
}

}  // namespace remat
