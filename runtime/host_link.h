// HostLink: the runtime's model of the link between device and host memory,
// which offloads, restores and prefetches cross: a bandwidth and a latency
// per copy, the same each way, and for each direction the backlog of copies
// queued on it. The two directions are independent, as a GPU's copy engines
// are: copies out queue behind copies out, copies in behind copies in.
//
// The model only estimates (for the policy's transfer costs and backlogs);
// the copies themselves run on the device's streams.
//
// Invariants (CheckInvariants): the bandwidth is positive, the
// latency is not negative, and the time the link frees up is not negative.
#ifndef REMAT_RUNTIME_HOST_LINK_H_
#define REMAT_RUNTIME_HOST_LINK_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "base/units.h"

namespace remat::runtime_internal {

class HostLink {
 public:
  enum Direction { kOut = 0, kIn = 1 };  // device to host, host to device

  // `gbps`: bytes per nanosecond; `latency_ns`: what each copy adds.
  HostLink(double gbps, std::int64_t latency_ns) : gbps_(gbps), latency_ns_(latency_ns) {}

  // Nanoseconds to carry `bytes`, latency aside.
  std::int64_t CarryNs(std::size_t bytes) const {
    return static_cast<std::int64_t>(static_cast<double>(bytes) / gbps_);
  }
  // One copy of `bytes`, its latency included.
  std::int64_t OneWayNs(std::size_t bytes) const { return latency_ns_ + CarryNs(bytes); }
  // A tensor's transfer cost for a policy: out and back, each with its latency.
  std::int64_t RoundTripNs(std::size_t bytes) const { return 2 * OneWayNs(bytes); }
  // A copy of `bytes` joins its direction's queue at `now_ns`: the runtime's
  // clock (Runtime::NowNs), which moves with the work done, also where the
  // host runs ahead of the device (a simulated device's host clock moves
  // only when the host waits, and the queue would never drain on it). On a
  // GPU that clock is the wall clock plus the estimated work, so the queue
  // drains faster than the copy engine does: an estimate on the short side.
  // (It saturates: a caller's compute estimates are unbounded.)
  void Queue(Direction dir, std::size_t bytes, std::int64_t now_ns) {
    std::int64_t& free_at = free_at_ns_[dir];
    const std::int64_t start = std::max(free_at, now_ns);
    free_at = AddTimes(start, OneWayNs(bytes));
  }
  // How long a copy queued at `now_ns` waits behind those of its direction
  // queued before it.
  std::int64_t BacklogNs(Direction dir, std::int64_t now_ns) const {
    return std::max<std::int64_t>(free_at_ns_[dir] - now_ns, 0);
  }

  absl::Status CheckInvariants() const;

 private:
  const double gbps_;
  const std::int64_t latency_ns_;
  // When each direction will have carried every copy queued on it so far.
  std::int64_t free_at_ns_[2] = {0, 0};
};

}  // namespace remat::runtime_internal

#endif  // REMAT_RUNTIME_HOST_LINK_H_
