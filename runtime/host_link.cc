#include "runtime/host_link.h"

#include "absl/strings/str_format.h"

namespace remat::runtime_internal {

absl::Status HostLink::CheckInvariants() const {
  if (!(gbps_ > 0)) {
    return absl::InternalError(absl::StrFormat("host link: bandwidth %g GB/s", gbps_));
  }
  if (latency_ns_ < 0) {
    return absl::InternalError(absl::StrFormat("host link: latency %d ns", latency_ns_));
  }
  for (std::int64_t free_at : free_at_ns_) {
    if (free_at < 0) return absl::InternalError(absl::StrFormat("host link: frees up at %d ns", free_at));
  }
  return absl::OkStatus();
}

}  // namespace remat::runtime_internal
