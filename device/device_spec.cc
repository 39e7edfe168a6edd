#include "device/device_spec.h"

#include "absl/strings/str_format.h"
#include "base/env.h"
#include "base/units.h"

namespace remat {

absl::StatusOr<DeviceSpec::Kind> DeviceSpec::ParseKind(std::string_view text) {
  if (text == "cuda") return Kind::kCuda;
  if (text == "sim") return Kind::kSim;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown device '%s': expected cuda or sim", text));
}

absl::Status DeviceSpec::ReadEnvironment() {
  DeviceSpec next = *this;
  if (const char* d = GetEnv("REMAT_DEVICE")) {
    absl::StatusOr<Kind> kind = ParseKind(d);
    if (!kind.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("REMAT_DEVICE=%s: expected cuda or sim", d));
    }
    next.kind = *kind;
  }
  if (absl::Status s = BytesFromEnv("REMAT_SIM_CAPACITY", &next.sim.capacity); !s.ok()) return s;
  if (absl::Status s = FlagFromEnv("REMAT_SIM_BACKED", &next.sim.backed); !s.ok()) return s;
  *this = next;
  return absl::OkStatus();
}

std::string DeviceSpec::Describe() const {
  if (kind == Kind::kCuda) return absl::StrFormat("cuda:%d", cuda_ordinal);
  return absl::StrFormat("sim (%s, %s)", FormatBytes(sim.capacity),
                         sim.backed ? "backed" : "unbacked");
}

}  // namespace remat
