#include "sim/alloc_replay.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trace/rmm_log.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

std::string TracePath(const std::string& name) {
  return std::string(REMAT_EXAMPLE_TRACES_DIR) + "/" + name;
}

AllocLog MustRead(const std::string& name) {
  absl::StatusOr<AllocLog> log = ReadRmmLog(TracePath(name));
  EXPECT_TRUE(log.ok()) << log.status();
  return log.ok() ? *std::move(log) : AllocLog{};
}

AllocLog MustParse(const std::string& body) {
  absl::StatusOr<AllocLog> log =
      ParseRmmLog("Thread,Time,Action,Pointer,Size,Stream\n" + body, "inline.csv");
  EXPECT_TRUE(log.ok()) << log.status();
  return log.ok() ? *std::move(log) : AllocLog{};
}

ReplayReport MustReplay(const AllocLog& log, ReplayOptions options = {}) {
  absl::StatusOr<ReplayReport> report = ReplayAllocLog(log, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : ReplayReport{};
}

// tiny.csv, worked out by hand (see scripts/make_alloc_traces.py):
//   1000 B and 3000 B share a 2 MiB small-pool segment (1024 + 3072 rounded);
//   4 MiB takes a 20 MiB large-pool segment; 512 B reuses the freed 1 KiB
//   block; 24 MiB is too big for the 16 MiB left in the 20 MiB segment and gets
//   a 24 MiB segment of its own. At that peak: 3000 + 4 MiB + 512 + 24 MiB
//   requested, 3072 + 4 MiB + 512 + 24 MiB allocated, 2 + 20 + 24 MiB reserved.
constexpr std::uint64_t kTinyPeakRequested = 3000 + 4 * kMiB + 512 + 24 * kMiB;
constexpr std::uint64_t kTinyPeakAllocated = 3072 + 4 * kMiB + 512 + 24 * kMiB;
constexpr std::uint64_t kTinyPeakReserved = 2 * kMiB + 20 * kMiB + 24 * kMiB;

TEST(AllocReplayTest, TinyLogGivesExactNumbers) {
  const ReplayReport r = MustReplay(MustRead("tiny.csv"));
  EXPECT_EQ(r.events, 14u);
  EXPECT_EQ(r.allocations, 7u);
  EXPECT_EQ(r.frees, 6u);
  EXPECT_EQ(r.alloc_failures_in_log, 1u);
  EXPECT_EQ(r.zero_byte_allocations, 2u);
  EXPECT_EQ(r.streams, 1u);
  EXPECT_EQ(r.peak_requested_bytes, kTinyPeakRequested);
  EXPECT_EQ(r.peak_allocated_bytes, kTinyPeakAllocated);
  EXPECT_EQ(r.peak_active_bytes, kTinyPeakAllocated);
  EXPECT_EQ(r.peak_reserved_bytes, kTinyPeakReserved);
  EXPECT_DOUBLE_EQ(r.fragmentation, 1.0 - static_cast<double>(kTinyPeakAllocated) /
                                              static_cast<double>(kTinyPeakReserved));
  EXPECT_EQ(r.segments_peak, 3u);
  EXPECT_EQ(r.device_allocs, 3u);
  EXPECT_EQ(r.device_frees, 0u);
  EXPECT_EQ(r.retries, 0u);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.skipped_frees, 0u);
  EXPECT_EQ(r.capacity, 80 * kGiB);
  EXPECT_EQ(r.budget, 0u);
  EXPECT_GT(r.events_per_second, 0);
}

TEST(AllocReplayTest, BudgetCountsOomsAndReplayContinues) {
  // 22 MiB reserved before the 24 MiB request, which a 30 MiB budget cannot add.
  ReplayOptions options;
  options.budget = 30 * kMiB;
  const ReplayReport r = MustReplay(MustRead("tiny.csv"), options);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.skipped_frees, 1u);  // the 24 MiB free, at the last line
  EXPECT_EQ(r.retries, 1u);
  EXPECT_EQ(r.events, 14u);
  EXPECT_EQ(r.peak_reserved_bytes, 22 * kMiB);
  EXPECT_EQ(r.peak_allocated_bytes, 1024 + 3072 + 4 * kMiB);
  EXPECT_EQ(r.peak_requested_bytes, kTinyPeakRequested);  // the log's, whatever the budget
  EXPECT_EQ(r.budget, 30 * kMiB);
}

// A run refused an allocation; the refusal gave the cached segment back, so
// the next allocation reserved a new one. Replayed under the same budget,
// the refusal is replayed and the replay does the same (skipping it, the
// next allocation would reuse the cached segment: a different run).
TEST(AllocReplayTest, RecordedRefusalsAreReplayedSoTheReplayFollowsTheRun) {
  const AllocLog log = MustParse(
      "1,10:00:00.000001,allocate,0x1000000,6291456,0x0\n"
      "1,10:00:00.000002,free,0x1000000,6291456,0x0\n"
      "1,10:00:00.000003,allocate failure,0x0,9437184,0x0\n"
      "1,10:00:00.000004,allocate,0x2000000,5242880,0x0\n"
      "1,10:00:00.000005,free,0x2000000,5242880,0x0\n");
  ReplayOptions options;
  options.budget = 8 * kMiB;
  const ReplayReport r = MustReplay(log, options);
  EXPECT_EQ(r.refusals_replayed, 1u);
  EXPECT_EQ(r.ooms, 0u);  // the log's own allocations all fit, as they did
  EXPECT_EQ(r.device_allocs, 2u);
  EXPECT_EQ(r.device_frees, 1u);
  // Nothing the program never held reaches the peaks, whatever the budget.
  options.budget = 64 * kMiB;
  const ReplayReport roomy = MustReplay(log, options);
  EXPECT_EQ(roomy.refusals_replayed, 1u);
  EXPECT_LT(roomy.peak_allocated_bytes, 9 * kMiB);
  // No budget: nothing refused it, and it is left out.
  const ReplayReport unlimited = MustReplay(log);
  EXPECT_EQ(unlimited.refusals_replayed, 0u);
  EXPECT_EQ(unlimited.device_allocs, 1u);
}

TEST(AllocReplayTest, OomSlotIsReusedCleanly) {
  // The failed 0x2000 is freed (skipped), then the address comes back and must
  // replay as a fresh allocation.
  AllocLog log = MustParse(
      "1,10:00:00.000001,allocate,0x1000,8388608,0x0\n"
      "1,10:00:00.000002,allocate,0x2000,8388608,0x0\n"
      "1,10:00:00.000003,free,0x2000,8388608,0x0\n"
      "1,10:00:00.000004,free,0x1000,8388608,0x0\n"
      "1,10:00:00.000005,allocate,0x2000,1024,0x0\n"
      "1,10:00:00.000006,free,0x2000,1024,0x0\n");
  ReplayOptions options;
  options.capacity = 12 * kMiB;  // an 8 MiB request wants a 20 MiB segment, then shrinks to 8
  const ReplayReport r = MustReplay(log, options);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.skipped_frees, 1u);
  EXPECT_EQ(r.peak_allocated_bytes, 8 * kMiB);
}

TEST(AllocReplayTest, AllocationLargerThanTheDeviceIsAnOom) {
  AllocLog log = MustParse(
      "1,10:00:00.000001,allocate,0x1000,2147483648,0x0\n"
      "1,10:00:00.000002,free,0x1000,2147483648,0x0\n");
  ReplayOptions options;
  options.capacity = 1 * kGiB;
  const ReplayReport r = MustReplay(log, options);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.skipped_frees, 1u);
}

TEST(AllocReplayTest, ZeroByteAllocationsTakeNoMemory) {
  AllocLog log = MustParse(
      "1,10:00:00.000001,allocate,0x0,0,0x0\n"
      "1,10:00:00.000002,allocate,0x0,0,0x0\n"
      "1,10:00:00.000003,allocate,0x7f00,0,0x0\n"
      "1,10:00:00.000004,free,0x0,0,0x0\n"
      "1,10:00:00.000005,free,0x7f00,0,0x0\n");
  const ReplayReport r = MustReplay(log);
  EXPECT_EQ(r.events, 5u);
  EXPECT_EQ(r.zero_byte_allocations, 3u);
  EXPECT_EQ(r.peak_allocated_bytes, 0u);
  EXPECT_EQ(r.peak_reserved_bytes, 0u);
  EXPECT_EQ(r.fragmentation, 0.0);
  EXPECT_EQ(r.ooms, 0u);
}

TEST(AllocReplayTest, StreamsGetTheirOwnBlocks) {
  // Two streams, each freeing and reallocating: stream-ordered reuse keeps a
  // block on the stream that freed it, and nothing is rejected.
  AllocLog log = MustParse(
      "1,10:00:00.000001,allocate,0x1000,4096,0x0\n"
      "2,10:00:00.000002,allocate,0x9000,4096,0x55d0c8a41c60\n"
      "1,10:00:00.000003,free,0x1000,4096,0x0\n"
      "2,10:00:00.000004,free,0x9000,4096,0x55d0c8a41c60\n"
      "2,10:00:00.000005,allocate,0x9000,4096,0x55d0c8a41c60\n"
      "1,10:00:00.000006,allocate,0x1000,4096,0x0\n");
  const ReplayReport r = MustReplay(log);
  EXPECT_EQ(r.streams, 2u);
  EXPECT_EQ(r.threads, 2u);
  EXPECT_EQ(r.peak_allocated_bytes, 8192u);
  EXPECT_EQ(r.ooms, 0u);
}

TEST(AllocReplayTest, ShippedLogsReplayWithoutOoms) {
  for (const char* name : {"training_step.csv", "multistream.csv"}) {
    SCOPED_TRACE(name);
    const AllocLog log = MustRead(name);
    const ReplayReport r = MustReplay(log);
    EXPECT_EQ(r.events, log.records.size());
    EXPECT_GT(r.events, 1000u);
    EXPECT_EQ(r.ooms, 0u);
    EXPECT_GE(r.peak_allocated_bytes, r.peak_requested_bytes);
    EXPECT_GE(r.peak_reserved_bytes, r.peak_allocated_bytes);
    EXPECT_GT(r.zero_byte_allocations, 0u);
  }
}

TEST(AllocReplayTest, TheAllocatorIsSoundAfterEveryRecordUnderABudget) {
  const AllocLog log = MustRead("multistream.csv");
  for (const char* conf : {"", "expandable_segments:True"}) {
    SCOPED_TRACE(conf);
    ReplayOptions options;
    options.budget = log.peak_requested_bytes * 3 / 4;
    options.alloc_conf = conf;
    options.check_invariants = true;
    const ReplayReport r = MustReplay(log, options);
    EXPECT_EQ(r.events, log.records.size());
  }
}

TEST(AllocReplayTest, TightBudgetOnTrainingStepOoms) {
  const AllocLog log = MustRead("training_step.csv");
  ReplayOptions options;
  options.budget = log.peak_requested_bytes / 2;
  const ReplayReport r = MustReplay(log, options);
  EXPECT_GT(r.ooms, 0u);
  EXPECT_GT(r.retries, 0u);
  EXPECT_LE(r.peak_reserved_bytes, options.budget);
  EXPECT_EQ(r.events, log.records.size());
}

TEST(AllocReplayTest, HistoryFollowsTheLogsClockAndChangesNothing) {
  const AllocLog log = MustRead("tiny.csv");
  ReplayOptions options;
  options.history_events = 1000;
  options.snapshot = true;
  const ReplayReport r = MustReplay(log, options);
  const ReplayReport plain = MustReplay(log);
  EXPECT_EQ(r.peak_allocated_bytes, plain.peak_allocated_bytes);
  EXPECT_EQ(r.peak_reserved_bytes, plain.peak_reserved_bytes);
  EXPECT_EQ(r.device_allocs, plain.device_allocs);
  EXPECT_FALSE(plain.snapshot.has_value());

  ASSERT_TRUE(r.snapshot.has_value());
  EXPECT_FALSE(r.history_truncated);
  const std::vector<TraceEvent>& events = r.snapshot->events;
  ASSERT_EQ(events.size(), 16u);
  constexpr std::int64_t k10am = std::int64_t{10} * 3600 * 1'000'000'000;
  EXPECT_EQ(events.front().action, TraceAction::kSegmentAlloc);
  EXPECT_EQ(events.front().time_ns, k10am + 125'000);
  EXPECT_EQ(events.back().action, TraceAction::kFreeCompleted);
  EXPECT_EQ(events.back().time_ns, k10am + 1'750'000);
  std::vector<std::size_t> requested;
  for (const TraceEvent& e : events) {
    if (e.action == TraceAction::kAlloc) requested.push_back(e.requested_size);
  }
  EXPECT_EQ(requested, (std::vector<std::size_t>{1000, 3000, 4 * kMiB, 512, 24 * kMiB}));
  // Taken before the leftovers are freed: the 512 B allocation is still live.
  std::size_t live_requested = 0;
  for (const SegmentInfo& seg : r.snapshot->segments) live_requested += seg.requested_size;
  EXPECT_EQ(live_requested, 512u);
}

TEST(AllocReplayTest, ASmallHistoryKeepsTheNewestEvents) {
  const AllocLog log = MustRead("tiny.csv");
  EXPECT_EQ(HistoryCapacity(log, 1000), 4 * log.records.size());
  EXPECT_EQ(HistoryCapacity(log, 3), 3u);
  ReplayOptions options;
  options.history_events = 3;
  options.snapshot = true;
  const ReplayReport r = MustReplay(log, options);
  ASSERT_TRUE(r.snapshot.has_value());
  EXPECT_TRUE(r.history_truncated);
  ASSERT_EQ(r.snapshot->events.size(), 3u);
  EXPECT_EQ(r.snapshot->events.back().action, TraceAction::kFreeCompleted);
  EXPECT_EQ(r.snapshot->events.back().requested_size, 24 * kMiB);
}

// --steps: the log replayed as a loop's steps; with expandable segments the
// second places a block gone by the peak apart, and keeps doing so only
// because it reserved less. L1 and T share a page, L2 takes a second (T
// holds the first's room), T goes, and the 2 MiB block at the peak needs a
// third page though L1 and L2 would share one.
TEST(AllocReplayTest, StepsPlaceWhatIsGoneByThePeakApart) {
  const AllocLog log = MustParse(
      "1,00:00:00.000001,allocate,0x1000,524288,0x0\n"
      "1,00:00:00.000002,allocate,0x2000,1048576,0x0\n"
      "1,00:00:00.000003,allocate,0x3000,1048576,0x0\n"
      "1,00:00:00.000004,free,0x2000,1048576,0x0\n"
      "1,00:00:00.000005,allocate,0x4000,2097152,0x0\n");
  ReplayOptions options;
  options.alloc_conf = "expandable_segments:True";
  options.check_invariants = true;
  const ReplayReport once = MustReplay(log, options);
  EXPECT_EQ(once.peak_reserved_bytes, 6 * kMiB);
  EXPECT_EQ(once.steps, 1);
  EXPECT_THAT(ReplayReportToJson(once), testing::Not(HasSubstr("first_step")));
  for (int steps : {2, 3, 5}) {
    SCOPED_TRACE(steps);
    options.steps = steps;
    const ReplayReport r = MustReplay(log, options);
    EXPECT_EQ(r.steps, steps);
    EXPECT_EQ(r.peak_reserved_bytes, 4 * kMiB);
    EXPECT_EQ(r.first_step_peak_reserved_bytes, 6 * kMiB);
    EXPECT_DOUBLE_EQ(r.first_step_fragmentation, once.fragmentation);
    EXPECT_EQ(r.placed_apart, 1u);
    EXPECT_EQ(r.peak_active_bytes, once.peak_active_bytes);
    EXPECT_THAT(ReplayReportToJson(r), HasSubstr("\"first_step_peak_reserved_bytes\":6291456"));
    EXPECT_THAT(ReplayReportToText(r), HasSubstr("steps"));
  }
  // Fixed segments: every step as the first.
  options.alloc_conf = "";
  options.steps = 3;
  const ReplayReport fixed = MustReplay(log, options);
  EXPECT_EQ(fixed.peak_reserved_bytes, fixed.first_step_peak_reserved_bytes);
  EXPECT_EQ(fixed.placed_apart, 0u);
}

TEST(AllocReplayTest, StepsKeepTheAllocatorSoundUnderABudget) {
  const AllocLog log = MustRead("multistream.csv");
  ReplayOptions options;
  options.budget = log.peak_requested_bytes * 3 / 4;
  options.alloc_conf = "expandable_segments:True";
  options.check_invariants = true;
  const ReplayReport once = MustReplay(log, options);
  options.steps = 3;
  const ReplayReport r = MustReplay(log, options);
  EXPECT_EQ(r.events, log.records.size());
  EXPECT_LE(r.peak_reserved_bytes, options.budget);
  EXPECT_LE(r.ooms, once.ooms);
}

TEST(AllocReplayTest, RejectsBadOptions) {
  const AllocLog log = MustRead("tiny.csv");
  ReplayOptions zero;
  zero.capacity = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayAllocLog(log, zero).status()));
  ReplayOptions over;
  over.capacity = 1 * kGiB;
  over.budget = 2 * kGiB;
  EXPECT_TRUE(absl::IsInvalidArgument(ReplayAllocLog(log, over).status()));
  for (int steps : {0, -1, 1001}) {
    ReplayOptions bad;
    bad.steps = steps;
    EXPECT_TRUE(absl::IsInvalidArgument(ReplayAllocLog(log, bad).status())) << steps;
  }
}

TEST(AllocReplayTest, JsonHasTheReportedKeys) {
  const ReplayReport r = MustReplay(MustRead("tiny.csv"));
  const std::string json = ReplayReportToJson(r);
  for (const char* key :
       {"\"events\":14", "\"peak_requested_bytes\":29363640", "\"peak_allocated_bytes\":29363712",
        "\"peak_reserved_bytes\":48234496", "\"fragmentation\":", "\"ooms\":0",
        "\"events_per_second\":", "\"allocations\":7", "\"frees\":6", "\"alloc_failures_in_log\":1",
        "\"segments_peak\":3", "\"device_allocs\":3", "\"retries\":0", "\"budget\":null",
        "\"capacity\":85899345920"}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
}

TEST(AllocReplayTest, TextReportIsATable) {
  ReplayOptions options;
  options.budget = 30 * kMiB;
  const std::string text = ReplayReportToText(MustReplay(MustRead("tiny.csv"), options));
  EXPECT_THAT(text, HasSubstr("  peak requested     28.00 MiB (29363640 bytes)\n"));
  EXPECT_THAT(text, HasSubstr("  peak reserved      22.00 MiB (23068672 bytes)\n"));
  EXPECT_THAT(text, HasSubstr("budget 30.00 MiB"));
  EXPECT_THAT(text, HasSubstr("  OOMs               1 (1 later free skipped)\n"));
  EXPECT_THAT(text, HasSubstr("events/s"));
}

}  // namespace
}  // namespace remat
