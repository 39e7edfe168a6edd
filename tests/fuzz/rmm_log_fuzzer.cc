// libFuzzer target: any text given to the RMM log parser either parses into a
// self-consistent log or fails with an error naming a line; it never crashes.
// A log that parses must replay without error, the allocator's invariants
// holding after every record.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sim/alloc_replay.h"
#include "trace/rmm_log.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<remat::AllocLog> log = remat::ParseRmmLog(text, "fuzz.csv");
  if (!log.ok()) {
    if (log.status().message().find("fuzz.csv") == absl::string_view::npos) __builtin_trap();
    return 0;
  }
  for (const remat::AllocRecord& r : log->records) {
    if (r.slot != remat::kNoSlot && r.slot >= log->num_slots) __builtin_trap();
    if (r.stream >= log->streams.size()) __builtin_trap();
  }
  remat::ReplayOptions options;
  options.capacity = std::size_t{1} << 40;
  options.check_invariants = true;  // the allocator's, after every record
  absl::StatusOr<remat::ReplayReport> report = remat::ReplayAllocLog(*log, options);
  if (!report.ok()) __builtin_trap();
  return 0;
}
