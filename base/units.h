// Byte sizes as people write them on command lines and in logs.
#ifndef REMAT_BASE_UNITS_H_
#define REMAT_BASE_UNITS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace remat {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;
inline constexpr std::size_t kTiB = std::size_t{1} << 40;

// Parses "4096", "512B", "64KiB", "1.5 GiB", "80GB" (decimal units: KB, MB, GB,
// TB are powers of 1000; KiB... and the bare K, M, G, T are powers of 1024).
// Rejects empty text, negative numbers, unknown suffixes and overflow.
absl::StatusOr<std::uint64_t> ParseBytes(std::string_view text);

// "1.50 GiB", "512 B": for reports.
std::string FormatBytes(std::uint64_t bytes);

// a + b for times in ns, b >= 0 meant: a sum past 2^63 ns stops at the
// largest time instead of wrapping into the past (a caller's costs are
// unbounded: the simulated device's stream clocks and the runtime's work
// clock both add them). A negative b counts as 0.
inline std::int64_t AddTimes(std::int64_t a, std::int64_t b) {
  if (b <= 0) return a;
  return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max()
                                                          : a + b;
}

}  // namespace remat

#endif  // REMAT_BASE_UNITS_H_
