// Replays an allocation log through the CachingAllocator on an unbacked
// SimDevice, and reports what the allocator made of it: how much it reserved
// to serve the log's peak, how fragmented that was, and where a budget made it
// run out.
//
// The replay is a flat loop over the parsed records: the log's pointers were
// mapped to dense slots by the parser, so a record is one array access and
// one allocator call. Only that loop is timed (events_per_second), not the
// parsing nor the device and allocator set-up.
//
// Semantics, record by record:
// * allocate: Allocate(size) on the SimDevice stream standing for the log's
//   stream (log stream 0 is kDefaultStream; every other one gets a stream of
//   its own). Zero bytes give nullptr, as in PyTorch. An out-of-memory (a
//   budget or capacity too small) is counted and the replay goes on; the
//   allocation's later free is then skipped.
// * free: FreeOnStream on the free's stream, as RMM frees (stream-ordered).
// * allocate failure: counted, nothing replayed (the original run failed it).
//
// With history on (ReplayOptions::history_events), the allocator records its
// events and the device's clock follows the log's (each record first lets the
// host clock advance to the record's time), so the snapshot's events and the
// timeline drawn from them carry the log's times. Nothing else changes: the
// replay makes the same calls and reaches the same numbers.
#ifndef REMAT_SIM_ALLOC_REPLAY_H_
#define REMAT_SIM_ALLOC_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/snapshot.h"
#include "base/units.h"
#include "trace/rmm_log.h"

namespace remat {

struct ReplayOptions {
  // The simulated device's memory.
  std::size_t capacity = 80 * kGiB;
  // Cap on what the allocator may reserve (0: none beyond the capacity).
  std::size_t budget = 0;
  // Events the allocator keeps for the snapshot, the newest when there are
  // more (0: none; at most kMaxEventRingCapacity). The ring is sized to what
  // the log can produce when that is less: HistoryCapacity().
  std::size_t history_events = 0;
  // Take ReplayReport::snapshot at the end of the replay.
  bool snapshot = false;
  // Allocator settings with PyTorch's keys (allocator/alloc_conf.h).
  std::string alloc_conf;
  // After every record, CachingAllocator::CheckInvariants(): a broken one is
  // the replay's error, naming the line (for fuzzers and tests; linear in the
  // allocator's blocks per record).
  bool check_invariants = false;
  // Replay the log this many times, as the steps of a training loop
  // (CachingAllocator::BeginStep, EndStep): after each, what it left live is
  // freed and the cache emptied, and the next step places its blocks by what
  // the one before learned (with expandable segments). The report's figures
  // (peaks, fragmentation, retries, device allocs, OOMs) are the last step's;
  // the first's peak reserved bytes and fragmentation are kept beside them;
  // with history, each step's events follow the last's on the log's clock.
  int steps = 1;
};

// The event ring a replay of `log` uses for `history_events`: at most the 4
// events a record can produce (alloc, segment_alloc, and the segment_free that
// undoes it or an oom; free_requested and free_completed).
std::size_t HistoryCapacity(const AllocLog& log, std::size_t history_events);

struct ReplayReport {
  std::string log_name;
  std::string device;  // SimDevice::Describe()
  std::size_t capacity = 0;
  std::size_t budget = 0;  // 0: none
  std::string alloc_conf;  // as given ("" when none)

  // From the log.
  std::uint64_t events = 0;  // records replayed: every line after the header
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t alloc_failures_in_log = 0;
  std::uint64_t zero_byte_allocations = 0;
  std::uint64_t streams = 0;
  std::uint64_t threads = 0;
  std::uint64_t peak_requested_bytes = 0;  // peak of the sum of live log sizes

  // From the allocator's statistics.
  std::uint64_t peak_allocated_bytes = 0;  // rounded sizes of live blocks
  std::uint64_t peak_active_bytes = 0;     // allocated plus blocks waiting on streams
  std::uint64_t peak_reserved_bytes = 0;   // device segments
  double fragmentation = 0;                // 1 - peak active / peak reserved
  // With ReplayOptions::steps > 1: how many, the first step's peak reserved
  // bytes and fragmentation, and the allocations the last step placed apart
  // from those live at the peak before it.
  int steps = 1;
  std::uint64_t first_step_peak_reserved_bytes = 0;
  double first_step_fragmentation = 0;
  std::uint64_t placed_apart = 0;
  std::uint64_t segments_peak = 0;
  std::uint64_t device_allocs = 0;  // segments reserved from the device
  std::uint64_t device_frees = 0;   // segments given back to it
  std::uint64_t retries = 0;        // slow-path rounds that freed the cache

  // From the replay.
  std::uint64_t ooms = 0;           // allocations that did not fit
  std::uint64_t skipped_frees = 0;  // frees of those allocations
  // Under a budget, the log's `allocate failure` lines, each replayed as the
  // refusal it was: the allocator waits for what is in flight and gives its
  // cached segments back, as it did then. Without a budget they are left
  // out (0).
  std::uint64_t refusals_replayed = 0;
  double replay_seconds = 0;  // the replay loop alone (recording history included)
  double events_per_second = 0;

  // With ReplayOptions::snapshot: the allocator at the end of the replay,
  // before what the log left live is freed, with its event history.
  std::optional<Snapshot> snapshot;
  // The ring filled up: the snapshot's history lost its oldest events.
  bool history_truncated = false;
};

// Fails only on bad options (InvalidArgument: a zero or too large capacity, a
// budget beyond it) or when the allocator rejects a replayed call the parser
// has already checked (Internal: a bug).
absl::StatusOr<ReplayReport> ReplayAllocLog(const AllocLog& log, const ReplayOptions& options = {});

// One JSON object; keys are the field names above ("budget" is null when none).
std::string ReplayReportToJson(const ReplayReport& report);
// An aligned table for people.
std::string ReplayReportToText(const ReplayReport& report);

}  // namespace remat

#endif  // REMAT_SIM_ALLOC_REPLAY_H_
