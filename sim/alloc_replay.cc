#include "sim/alloc_replay.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "base/json_writer.h"
#include "base/status_macros.h"
#include "device/sim_device.h"
#include "runtime/stack.h"

namespace remat {
namespace {

// One SimDevice stream per log stream, made before the timed loop. The log's
// stream 0 is the default stream, which every device has.
absl::StatusOr<std::vector<Stream>> MapStreams(const AllocLog& log, Device& device) {
  std::vector<Stream> streams;
  streams.reserve(log.streams.size());
  for (std::uint64_t handle : log.streams) {
    if (handle == 0) {
      streams.push_back(kDefaultStream);
    } else {
      REMAT_ASSIGN_OR_RETURN(Stream s, device.CreateStream());
      streams.push_back(s);
    }
  }
  return streams;
}

// Lets the device's host clock follow the log's, so recorded events carry the
// log's times. The log's clock reads time since midnight: a step back of more
// than half a day is taken as a midnight passed, a smaller one (threads
// writing out of order) leaves the clock where it is.
class LogClock {
 public:
  explicit LogClock(SimDevice* device) : device_(device) {}

  void Follow(std::int64_t log_time_ns) {
    std::int64_t step = log_time_ns - last_ns_;
    if (step < -kDayNs / 2) step += kDayNs;
    if (step <= 0) return;
    device_->AdvanceHost(step);
    last_ns_ = log_time_ns;
  }
  // The log starts again (ReplayOptions::steps): its times follow on from now.
  void Restart(std::int64_t first_ns) { last_ns_ = first_ns; }

 private:
  static constexpr std::int64_t kDayNs = std::int64_t{86'400} * 1'000'000'000;
  SimDevice* device_;
  std::int64_t last_ns_ = 0;  // the device clock starts at the log's midnight
};

absl::Status ReplayBug(const AllocLog& log, const AllocRecord& record, const absl::Status& status) {
  return absl::InternalError(
      absl::StrFormat("%s:%d: the allocator rejected a call the log allows: %s", log.name,
                      record.line, status.message()));
}

// 1 - peak active / peak reserved.
double Fragmentation(const AllocatorStats& stats) {
  const auto reserved = static_cast<double>(stats.reserved_bytes.all().peak);
  const auto active = static_cast<double>(stats.active_bytes.all().peak);
  return reserved == 0 ? 0.0 : 1.0 - active / reserved;
}

}  // namespace

std::size_t HistoryCapacity(const AllocLog& log, std::size_t history_events) {
  return std::min<std::size_t>(history_events, 4 * log.records.size());
}

absl::StatusOr<ReplayReport> ReplayAllocLog(const AllocLog& log, const ReplayOptions& options) {
  SimDeviceOptions device_options;
  device_options.capacity = options.capacity;
  device_options.backed = false;
  AllocatorOptions allocator_options;
  ForOneThread(&device_options, &allocator_options);  // this thread alone replays
  REMAT_ASSIGN_OR_RETURN(std::unique_ptr<SimDevice> made, SimDevice::Create(device_options));
  SimDevice* const device = made.get();
  allocator_options.budget = options.budget;
  REMAT_RETURN_IF_ERROR(ApplyAllocConf(options.alloc_conf, &allocator_options));
  // Off unless asked for: the report reads statistics, never the event ring,
  // and keeping it costs a device clock read per event.
  allocator_options.event_ring_capacity = HistoryCapacity(log, options.history_events);
  REMAT_ASSIGN_OR_RETURN(Stack stack, MakeStack(std::move(made), allocator_options));
  CachingAllocator* const allocator = stack.allocator.get();
  REMAT_ASSIGN_OR_RETURN(std::vector<Stream> streams, MapStreams(log, *device));

  if (options.steps < 1 || options.steps > 1000) {
    return absl::InvalidArgumentError(
        absl::StrFormat("steps must be 1 to 1000, not %d", options.steps));
  }
  std::vector<void*> slots(log.num_slots, nullptr);
  std::uint64_t ooms = 0;
  std::uint64_t skipped_frees = 0;
  std::uint64_t refusals_replayed = 0;
  std::uint64_t first_peak_reserved = 0;
  double first_fragmentation = 0;
  std::optional<LogClock> clock;
  if (allocator_options.event_ring_capacity > 0) clock.emplace(device);
  if (options.steps > 1) allocator->BeginStep();
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < options.steps; ++step) {
    if (step > 0) {
      // The step before: its figures, then what it left live freed and the
      // cache emptied, so that this one starts from nothing but what was learned.
      const AllocatorStats before = allocator->GetStats();
      if (step == 1) {
        first_peak_reserved = static_cast<std::uint64_t>(before.reserved_bytes.all().peak);
        first_fragmentation = Fragmentation(before);
      }
      for (void*& ptr : slots) {
        if (ptr != nullptr) (void)allocator->Free(ptr);
        ptr = nullptr;
      }
      allocator->EndStep();
      if (absl::Status s = allocator->EmptyCache(); !s.ok()) return s;
      allocator->ResetPeakStats();
      allocator->ResetAccumulatedStats();  // (retries, device allocs: the last step's too)
      if (clock && !log.records.empty()) clock->Restart(log.records.front().time_ns);
      ooms = skipped_frees = refusals_replayed = 0;
      start = std::chrono::steady_clock::now();
    }
    for (const AllocRecord& record : log.records) {
      if (clock) clock->Follow(record.time_ns);
      switch (record.action) {
        case AllocAction::kAllocate: {
          absl::StatusOr<void*> ptr = allocator->Allocate(record.size, streams[record.stream]);
          if (ptr.ok()) {
            if (record.slot != kNoSlot) slots[record.slot] = *ptr;
            break;
          }
          // Larger than the device is an out-of-memory too, as on a real GPU.
          const bool oom =
              absl::IsResourceExhausted(ptr.status()) ||
              (absl::IsInvalidArgument(ptr.status()) && record.size > options.capacity);
          if (!oom) return ReplayBug(log, record, ptr.status());
          ++ooms;
          if (record.slot != kNoSlot) slots[record.slot] = nullptr;
          break;
        }
        case AllocAction::kFree: {
          if (record.slot == kNoSlot) break;  // zero-byte: nothing was allocated
          void*& ptr = slots[record.slot];
          if (ptr == nullptr) {
            ++skipped_frees;  // its allocation ran out of memory
            break;
          }
          absl::Status freed = allocator->FreeOnStream(ptr, streams[record.stream]);
          if (!freed.ok()) return ReplayBug(log, record, freed);
          ptr = nullptr;
          break;
        }
        case AllocAction::kAllocateFailure:
          // The recorded run was refused this allocation. Under a budget the
          // replay does what the refusal did to the allocator: it waited for
          // what was in flight and gave the cached segments back before
          // failing; so the replay follows a run recorded under that budget.
          // (It does not try the allocation: one that fit now would raise the
          // peaks above anything the program held.) Without a budget there is
          // nothing to follow: the line is left out, as the program never held
          // the memory.
          if (options.budget == 0) break;
          if (absl::Status s = allocator->EmptyCache(); !s.ok()) return ReplayBug(log, record, s);
          ++refusals_replayed;
          break;
      }
      if (options.check_invariants) {
        if (absl::Status s = allocator->CheckInvariants(); !s.ok()) {
          return ReplayBug(log, record, s);
        }
      }
    }
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;

  // Statistics first, then free what the log left live, so that the allocator
  // is not destroyed holding allocations (it would warn about them).
  const AllocatorStats stats = allocator->GetStats();
  ReplayReport report;
  if (options.snapshot) {
    report.snapshot = allocator->TakeSnapshot();
    report.history_truncated =
        report.snapshot->events.size() == allocator_options.event_ring_capacity &&
        allocator_options.event_ring_capacity < 4 * log.records.size();
  }
  for (void* ptr : slots) {
    if (ptr != nullptr) (void)allocator->Free(ptr);
  }

  report.log_name = log.name;
  report.device = device->Describe();
  report.capacity = options.capacity;
  report.budget = options.budget;
  report.alloc_conf = options.alloc_conf;
  report.events = log.records.size();
  report.allocations = log.allocations;
  report.frees = log.frees;
  report.alloc_failures_in_log = log.alloc_failures;
  report.refusals_replayed = refusals_replayed;
  report.zero_byte_allocations = log.zero_byte_allocations;
  report.streams = log.streams.size();
  report.threads = log.threads.size();
  report.peak_requested_bytes = log.peak_requested_bytes;
  report.peak_allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes.all().peak);
  report.peak_active_bytes = static_cast<std::uint64_t>(stats.active_bytes.all().peak);
  report.peak_reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes.all().peak);
  report.fragmentation = Fragmentation(stats);
  report.steps = options.steps;
  if (options.steps > 1) {
    report.first_step_peak_reserved_bytes = first_peak_reserved;
    report.first_step_fragmentation = first_fragmentation;
    report.placed_apart = allocator->learned_transient();
  }
  report.segments_peak = static_cast<std::uint64_t>(stats.segment.all().peak);
  report.device_allocs = static_cast<std::uint64_t>(stats.num_device_alloc);
  report.device_frees = static_cast<std::uint64_t>(stats.num_device_free);
  report.retries = static_cast<std::uint64_t>(stats.num_alloc_retries);
  report.ooms = ooms;
  report.skipped_frees = skipped_frees;
  report.replay_seconds = elapsed.count();
  report.events_per_second =
      elapsed.count() > 0 ? static_cast<double>(report.events) / elapsed.count() : 0.0;
  return report;
}

std::string ReplayReportToJson(const ReplayReport& r) {
  JsonWriter w;
  w.BeginObject();
  w.Key("log").String(r.log_name);
  w.Key("device").String(r.device);
  w.Key("capacity").Uint(r.capacity);
  w.Key("budget");
  if (r.budget == 0) {
    w.Null();
  } else {
    w.Uint(r.budget);
  }
  w.Key("alloc_conf").String(r.alloc_conf);
  w.Key("events").Uint(r.events);
  w.Key("allocations").Uint(r.allocations);
  w.Key("frees").Uint(r.frees);
  w.Key("alloc_failures_in_log").Uint(r.alloc_failures_in_log);
  w.Key("zero_byte_allocations").Uint(r.zero_byte_allocations);
  w.Key("streams").Uint(r.streams);
  w.Key("threads").Uint(r.threads);
  w.Key("peak_requested_bytes").Uint(r.peak_requested_bytes);
  w.Key("peak_allocated_bytes").Uint(r.peak_allocated_bytes);
  w.Key("peak_active_bytes").Uint(r.peak_active_bytes);
  w.Key("peak_reserved_bytes").Uint(r.peak_reserved_bytes);
  w.Key("fragmentation").Double(r.fragmentation);
  w.Key("steps").Int(r.steps);
  if (r.steps > 1) {
    w.Key("first_step_peak_reserved_bytes").Uint(r.first_step_peak_reserved_bytes);
    w.Key("first_step_fragmentation").Double(r.first_step_fragmentation);
    w.Key("placed_apart").Uint(r.placed_apart);
  }
  w.Key("segments_peak").Uint(r.segments_peak);
  w.Key("device_allocs").Uint(r.device_allocs);
  w.Key("device_frees").Uint(r.device_frees);
  w.Key("retries").Uint(r.retries);
  w.Key("ooms").Uint(r.ooms);
  w.Key("skipped_frees").Uint(r.skipped_frees);
  w.Key("refusals_replayed").Uint(r.refusals_replayed);
  w.Key("replay_seconds").Double(r.replay_seconds);
  w.Key("events_per_second").Double(r.events_per_second);
  w.EndObject();
  return w.Take();
}

namespace {

std::string Bytes(std::uint64_t bytes) {
  return absl::StrFormat("%s (%d bytes)", FormatBytes(bytes), bytes);
}

std::string Rate(double events_per_second) {
  if (events_per_second >= 1e6) return absl::StrFormat("%.2f M events/s", events_per_second / 1e6);
  if (events_per_second >= 1e3) return absl::StrFormat("%.1f k events/s", events_per_second / 1e3);
  return absl::StrFormat("%.0f events/s", events_per_second);
}

// "1 allocation", "2 allocations".
std::string Count(std::uint64_t n, std::string_view noun) {
  return absl::StrFormat("%d %s%s", n, noun, n == 1 ? "" : "s");
}

std::string Duration(double seconds) {
  if (seconds >= 1) return absl::StrFormat("%.2f s", seconds);
  if (seconds >= 1e-3) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.1f us", seconds * 1e6);
}

}  // namespace

std::string ReplayReportToText(const ReplayReport& r) {
  std::string out = absl::StrFormat("replay of %s\n", r.log_name);
  const auto row = [&out](std::string_view label, const std::string& value) {
    absl::StrAppendFormat(&out, "  %-18s %s\n", label, value);
  };
  row("device", absl::StrFormat(
                    "%s, %s", r.device,
                    r.budget == 0 ? std::string("no budget") : "budget " + FormatBytes(r.budget)));
  if (!r.alloc_conf.empty()) row("alloc conf", r.alloc_conf);
  row("events",
      absl::StrFormat("%d (%s, %s, %s in the log)", r.events, Count(r.allocations, "allocation"),
                      Count(r.frees, "free"), Count(r.alloc_failures_in_log, "allocate failure")));
  row("zero-byte allocs", absl::StrFormat("%d", r.zero_byte_allocations));
  row("streams", absl::StrFormat("%d (%s)", r.streams, Count(r.threads, "thread")));
  row("peak requested", Bytes(r.peak_requested_bytes));
  row("peak allocated", Bytes(r.peak_allocated_bytes));
  row("peak reserved", Bytes(r.peak_reserved_bytes));
  row("fragmentation",
      absl::StrFormat("%.1f%% (1 - peak active / peak reserved)", 100.0 * r.fragmentation));
  if (r.steps > 1) {
    row("steps", absl::StrFormat("%d; the figures above are the last's; the first: peak "
                                 "reserved %s, fragmentation %.1f%%; %d allocations placed apart",
                                 r.steps, FormatBytes(r.first_step_peak_reserved_bytes),
                                 100.0 * r.first_step_fragmentation, r.placed_apart));
  }
  row("segments", absl::StrFormat("%d at peak, %d device allocs, %d device frees", r.segments_peak,
                                  r.device_allocs, r.device_frees));
  row("retries", absl::StrFormat("%d", r.retries));
  row("OOMs", r.skipped_frees == 0 ? absl::StrFormat("%d", r.ooms)
                                   : absl::StrFormat("%d (%s skipped)", r.ooms,
                                                     Count(r.skipped_frees, "later free")));
  if (r.alloc_failures_in_log > 0) {
    row("log's failures",
        r.budget == 0
            ? absl::StrFormat("%d, left out (no budget to refuse them)", r.alloc_failures_in_log)
            : absl::StrFormat("%d, each replayed as the refusal it was (cache given back)",
                              r.refusals_replayed));
  }
  row("replay speed", absl::StrFormat("%s (%s for the replay loop)", Rate(r.events_per_second),
                                      Duration(r.replay_seconds)));
  return out;
}

}  // namespace remat
