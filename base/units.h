// Byte sizes as people write them on command lines and in logs.
#ifndef REMAT_BASE_UNITS_H_
#define REMAT_BASE_UNITS_H_

#include <cstddef>
#include <cstdint>
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

}  // namespace remat

#endif  // REMAT_BASE_UNITS_H_
