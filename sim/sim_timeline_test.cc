#include "sim/sim_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/snapshot_timeline.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/op_replay.h"
#include "simdjson.h"
#include "tests/run_command.h"
#include "trace/op_trace.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One trace event as read back.
struct Event {
  std::string ph, name, cat, scope;
  double ts = 0, dur = 0;  // microseconds
  std::int64_t tid = -1;
  bool has_tensor = false;
  std::string tensor;
  std::uint64_t bytes = 0;  // args.bytes (counters, copies, instants)
  std::string message;
};

std::string Str(simdjson::dom::element e, const char* key) {
  std::string_view v;
  return e[key].get_string().get(v) == simdjson::SUCCESS ? std::string(v) : std::string();
}

// The number at `key`, or 0 without one.
template <typename T>
T Number(simdjson::dom::element e, const char* key) {
  T value{};
  if (e[key].get<T>().get(value) != simdjson::SUCCESS) return T{};
  return value;
}

// Parses a timeline; fails the test (and returns nothing) unless it is a JSON
// object whose traceEvents is an array of objects.
std::vector<Event> Parse(const std::string& json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (simdjson::error_code e = parser.parse(json).get(doc); e != simdjson::SUCCESS) {
    ADD_FAILURE() << "not JSON: " << simdjson::error_message(e);
    return {};
  }
  simdjson::dom::array array;
  if (doc["traceEvents"].get_array().get(array) != simdjson::SUCCESS) {
    ADD_FAILURE() << "no traceEvents array";
    return {};
  }
  std::string_view unit;
  EXPECT_EQ(doc["displayTimeUnit"].get_string().get(unit), simdjson::SUCCESS);
  std::vector<Event> events;
  for (simdjson::dom::element e : array) {
    Event ev;
    ev.ph = Str(e, "ph");
    ev.name = Str(e, "name");
    ev.cat = Str(e, "cat");
    ev.scope = Str(e, "s");
    ev.ts = Number<double>(e, "ts");
    ev.dur = Number<double>(e, "dur");
    ev.tid = Number<std::int64_t>(e, "tid");
    simdjson::dom::element args;
    if (e["args"].get(args) == simdjson::SUCCESS) {
      std::string_view tensor;
      ev.has_tensor = args["tensor"].get_string().get(tensor) == simdjson::SUCCESS;
      ev.tensor = std::string(tensor);
      ev.bytes = Number<std::uint64_t>(args, "bytes");
      ev.message = Str(args, "message");
    }
    events.push_back(std::move(ev));
  }
  return events;
}

OpTrace Load(const std::string& name) {
  absl::StatusOr<OpTrace> trace = ReadOpTrace(std::string(REMAT_EXAMPLE_TRACES_DIR) + "/" + name);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return std::move(trace).value();
}

OpReplayReport Replay(const OpTrace& trace, const OpReplayOptions& options) {
  absl::StatusOr<OpReplayReport> report = ReplayOpTrace(trace, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : OpReplayReport{};
}

// The budgeted run `remat sim ... --budget-ratio 0.5 --policy lru` makes.
OpReplayOptions HalfBudget(const OpTrace& trace, const std::string& policy) {
  OpReplayOptions options;
  options.policy = policy;
  const OpReplayReport unlimited = Replay(trace, options);
  options.budget = std::max<std::uint64_t>(unlimited.peak_reserved_bytes / 2, 2 << 20);
  return options;
}

double SumDur(const std::vector<Event>& events, const std::string& cat) {
  double us = 0;
  for (const Event& e : events) {
    if (e.ph == "X" && e.cat == cat) us += e.dur;
  }
  return us;
}

std::size_t Count(const std::vector<Event>& events, const std::string& ph,
                  const std::string& name) {
  return std::count_if(events.begin(), events.end(),
                       [&](const Event& e) { return e.ph == ph && e.name == name; });
}

std::uint64_t SumBytes(const std::vector<Event>& events, const std::string& ph,
                       const std::string& name) {
  std::uint64_t bytes = 0;
  for (const Event& e : events) {
    if (e.ph == ph && e.name == name) bytes += e.bytes;
  }
  return bytes;
}

// Every track's timestamps never go back (a counter's track is its name, any
// other event's its tid), and the slices of one stream never overlap.
void ExpectOrdered(const std::vector<Event>& events) {
  std::map<std::string, double> last_ts;
  std::map<std::int64_t, double> busy_until;
  for (const Event& e : events) {
    if (e.ph == "M") continue;
    const std::string track = e.ph == "C" ? "C:" + e.name : absl::StrCat("tid:", e.tid);
    auto [it, fresh] = last_ts.emplace(track, e.ts);
    EXPECT_GE(e.ts, it->second) << e.name << " on " << track << " goes back in time";
    it->second = e.ts;
    if (e.ph == "X") {
      double& until = busy_until[e.tid];
      EXPECT_GE(e.ts + 1e-6, until) << e.name << " at " << e.ts << " overlaps the slice before";
      until = std::max(until, e.ts + e.dur);
    }
  }
}

class SimTimelineCopyAheadTest : public testing::TestWithParam<bool> {};

TEST_P(SimTimelineCopyAheadTest, BudgetedTransformerRunHasEveryTrackAndKind) {
  const OpTrace trace = Load("transformer_small.jsonl");
  OpReplayOptions options = HalfBudget(trace, "dtr");
  options.copy_ahead = GetParam();
  SimTimeline timeline;
  options.timeline = &timeline;
  const OpReplayReport r = Replay(trace, options);
  ASSERT_EQ(r.status, "ok") << r.message;
  ASSERT_GT(r.recomputed_ops, 0u);
  ASSERT_GT(r.offloaded_bytes, 0u);
  ASSERT_EQ(r.copies_ahead > 0, options.copy_ahead);
  const std::vector<Event> events = Parse(timeline.ToJson(trace));
  ASSERT_FALSE(events.empty());

  for (const char* track : {kReservedTrack, kLiveBytesTrack, kHostBytesTrack}) {
    EXPECT_GT(Count(events, "C", track), 1u) << track;
  }
  // A slice of each kind, on the streams they run on.
  std::map<std::string, std::size_t> slices;
  for (const Event& e : events) {
    if (e.ph != "X") continue;
    ++slices[e.cat == "copy" ? e.name : e.cat];
    if (e.cat == "compute" || e.cat == "recompute" || e.name == "restore") {
      EXPECT_EQ(e.tid, 1) << e.name;
    } else if (e.name == "prefetch") {
      EXPECT_EQ(e.tid, 4) << e.name;
    } else {
      EXPECT_EQ(e.tid, 2) << e.name;
    }
    if (e.cat == "recompute") {
      EXPECT_THAT(e.name, testing::StartsWith("recompute "));
    }
  }
  EXPECT_GT(slices["compute"], 0u);
  EXPECT_EQ(slices["recompute"], r.recomputed_ops);
  EXPECT_GT(slices["offload"], 0u);
  EXPECT_GT(slices["restore"], 0u);
  EXPECT_GT(Count(events, "i", "drop"), 0u);
  EXPECT_GT(Count(events, "i", "offload"), 0u);

  // The compute stream runs the trace's compute, and the recomputes the report counts.
  EXPECT_NEAR(SumDur(events, "compute") * 1000, static_cast<double>(r.compute_ns), 1.0);
  EXPECT_EQ(r.compute_ns, static_cast<std::int64_t>(trace.total_cost_ns));
  EXPECT_NEAR(SumDur(events, "recompute") * 1000, static_cast<double>(r.recompute_ns), 1.0);
  // Evictions and bytes as the report has them.
  EXPECT_EQ(Count(events, "i", "drop") + Count(events, "i", "offload"), r.evictions);
  EXPECT_EQ(SumBytes(events, "i", "offload"), r.offloaded_bytes);
  // An offload's copy is drawn when it is made: ahead, or at the eviction.
  EXPECT_EQ(Count(events, "X", "offload") + r.ahead_offloads, Count(events, "i", "offload"));
  EXPECT_EQ(Count(events, "X", "copy ahead"), r.copies_ahead);
  EXPECT_EQ(SumBytes(events, "X", "copy ahead"), r.copied_ahead_bytes);
  if (!options.copy_ahead) {
    EXPECT_EQ(SumBytes(events, "X", "offload"), r.offloaded_bytes);
  }
  EXPECT_EQ(SumBytes(events, "X", "restore") + SumBytes(events, "X", "prefetch"), r.restored_bytes);
  for (const Event& e : events) {
    if (e.ph == "i" && e.cat != "end") {
      EXPECT_TRUE(e.has_tensor) << e.name << " at " << e.ts;
      EXPECT_GT(e.bytes, 0u) << e.name << " at " << e.ts;
    }
    if (e.ph == "X" && e.cat == "copy") {
      EXPECT_TRUE(e.has_tensor) << e.name << " at " << e.ts;
    }
  }
  // Counters stay within the report's peaks and end where the run ends.
  double end = 0;
  for (const Event& e : events) {
    if (e.ph == "C" && e.name == kReservedTrack) {
      EXPECT_LE(e.bytes, r.peak_reserved_bytes);
    }
    if (e.ph == "C" && e.name == kLiveBytesTrack) {
      EXPECT_LE(e.bytes, r.peak_live_bytes);
    }
    end = std::max(end, e.ts + e.dur);
  }
  EXPECT_NEAR(end * 1000, static_cast<double>(r.time_ns), 1.0);
  EXPECT_EQ(Count(events, "i", "oom") + Count(events, "i", "thrash"), 0u);
  ExpectOrdered(events);
}

INSTANTIATE_TEST_SUITE_P(CopyAhead, SimTimelineCopyAheadTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "copy_ahead" : "copy_at_eviction";
                         });

TEST(SimTimelineTest, RecordingChangesNothingInTheRun) {
  const OpTrace trace = Load("transformer_small.jsonl");
  for (const char* policy : {"lru", "dtr", "hybrid", "belady"}) {
    SCOPED_TRACE(policy);
    OpReplayOptions options = HalfBudget(trace, policy);
    const OpReplayReport plain = Replay(trace, options);
    SimTimeline timeline;
    options.timeline = &timeline;
    const OpReplayReport recorded = Replay(trace, options);
    EXPECT_EQ(
        std::tie(plain.status, plain.time_ns, plain.compute_ns, plain.recompute_ns,
                 plain.recomputed_ops, plain.offloaded_bytes, plain.restored_bytes, plain.evictions,
                 plain.peak_reserved_bytes, plain.peak_live_bytes, plain.records),
        std::tie(recorded.status, recorded.time_ns, recorded.compute_ns, recorded.recompute_ns,
                 recorded.recomputed_ops, recorded.offloaded_bytes, recorded.restored_bytes,
                 recorded.evictions, recorded.peak_reserved_bytes, recorded.peak_live_bytes,
                 recorded.records));
    const std::vector<Event> events = Parse(timeline.ToJson(trace));
    EXPECT_EQ(Count(events, "i", "drop") + Count(events, "i", "offload"), recorded.evictions);
    ExpectOrdered(events);
  }
}

TEST(SimTimelineTest, HostBytesFollowOffloadsRestoresAndReleases) {
  const OpTrace trace = Load("chain_100.jsonl");
  OpReplayOptions options;
  options.policy = "lru";
  options.enable_drop = false;
  options.thrash_limit = 100;
  options.verify = true;  // the closures do real work: recording must not disturb it
  options.scale = 64;
  options.live_budget = trace.peak_live_bytes / 64 / 2;
  SimTimeline timeline;
  options.timeline = &timeline;
  const OpReplayReport r = Replay(trace, options);
  ASSERT_EQ(r.status, "ok") << r.message;
  EXPECT_EQ(r.mismatches, 0u);
  ASSERT_GT(r.offloaded_bytes, 0u);
  const std::vector<Event> events = Parse(timeline.ToJson(trace));
  // Host bytes rise with each offload and fall with restores and with
  // releases of tensors still on the host, never below zero.
  std::int64_t host = -1, peak = 0;
  for (const Event& e : events) {
    if (e.ph == "C" && e.name == kHostBytesTrack) {
      host = static_cast<std::int64_t>(e.bytes);
      peak = std::max(peak, host);
    }
  }
  EXPECT_GT(peak, 0);
  EXPECT_LE(host, static_cast<std::int64_t>(r.offloaded_bytes - r.restored_bytes));
  EXPECT_GE(host, 0);
  EXPECT_EQ(Count(events, "i", "offload"), r.evictions);
  EXPECT_EQ(Count(events, "i", "drop"), 0u);
  ExpectOrdered(events);
}

TEST(SimTimelineTest, AStoppedRunEndsWithAnInstant) {
  const OpTrace trace = Load("chain_100.jsonl");
  OpReplayOptions oom;
  oom.budget = 2 << 20;  // not even the first activations
  SimTimeline timeline;
  oom.timeline = &timeline;
  const OpReplayReport r = Replay(trace, oom);
  ASSERT_EQ(r.status, "oom");
  std::vector<Event> events = Parse(timeline.ToJson(trace));
  ASSERT_EQ(Count(events, "i", "oom"), 1u);
  const Event& end =
      *std::find_if(events.begin(), events.end(), [](const Event& e) { return e.name == "oom"; });
  EXPECT_EQ(end.scope, "g");
  EXPECT_EQ(end.message, r.message);

  const OpTrace transformer = Load("transformer_small.jsonl");
  OpReplayOptions thrash = HalfBudget(transformer, "lru");
  thrash.enable_offload = false;
  thrash.thrash_limit = 0.01;
  thrash.timeline = &timeline;  // cleared before it records again
  const OpReplayReport t = Replay(transformer, thrash);
  ASSERT_EQ(t.status, "thrash");
  events = Parse(timeline.ToJson(transformer));
  EXPECT_EQ(Count(events, "i", "thrash"), 1u);
  EXPECT_EQ(Count(events, "i", "oom"), 0u);
  // Up to where it stopped, the compute slices are the report's compute.
  EXPECT_NEAR(SumDur(events, "compute") * 1000, static_cast<double>(t.compute_ns), 1.0);
  ExpectOrdered(events);
}

TEST(SimTimelineTest, WritesEachKindOfEventAsChromeExpectsIt) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"w","bytes":4096}
{"op":"call","name":"mm","inputs":["w"],"outputs":[{"id":"x","bytes":1024}],"cost_ns":2000}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  SimTimeline timeline;
  timeline.SetTitle("title");
  timeline.AddSample({0, 0, 0, 0});
  timeline.Add({1500, 2000, 0, 1, SimTimeline::Kind::kCompute});
  timeline.Add({3500, 2000, 0, 1, SimTimeline::Kind::kRecompute});
  timeline.Add({5500, 41, 1024, 1, SimTimeline::Kind::kOffload});
  timeline.Add({5500, 0, 1024, 1, SimTimeline::Kind::kEvictOffload});
  timeline.AddSample({5500, 2097152, 5120, 1024});
  timeline.SetEnd("oom", "no room", 6000);
  const std::string json = timeline.ToJson(*trace);
  EXPECT_THAT(json, testing::StartsWith(
                        R"({"traceEvents":[{"name":"process_name","ph":"M","pid":0,"tid":0,)"
                        R"("args":{"name":"title"}},)"));
  EXPECT_THAT(json, HasSubstr(R"({"name":"mm","cat":"compute","ph":"X","ts":1.500,)"
                              R"("dur":2.000,"pid":0,"tid":1,"args":{"line":2}})"));
  EXPECT_THAT(json, HasSubstr(R"({"name":"recompute mm","cat":"recompute","ph":"X",)"
                              R"("ts":3.500,"dur":2.000,"pid":0,"tid":1,"args":{"tensor":"x"}})"));
  EXPECT_THAT(json,
              HasSubstr(R"({"name":"offload","cat":"copy","ph":"X","ts":5.500,)"
                        R"("dur":0.041,"pid":0,"tid":2,"args":{"tensor":"x","bytes":1024}})"));
  EXPECT_THAT(json, HasSubstr(R"({"name":"offload","cat":"eviction","ph":"i","s":"t",)"
                              R"("ts":5.500,"pid":0,"tid":3,"args":{"tensor":"x","bytes":1024}})"));
  EXPECT_THAT(json, HasSubstr(R"({"name":"host bytes","ph":"C","ts":5.500,"pid":0,"tid":0,)"
                              R"("args":{"bytes":1024}})"));
  EXPECT_THAT(json, HasSubstr(R"({"name":"oom","cat":"end","ph":"i","s":"g","ts":6.000,)"));
  EXPECT_THAT(json, testing::EndsWith(R"(],"displayTimeUnit":"ms"})"));
  ExpectOrdered(Parse(json));
}

// `remat sim --timeline` as a user runs it (the binary's path comes from CTest).
class SimTimelineCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Env("REMAT_BIN").empty() || Env("REMAT_SOURCE_DIR").empty()) {
      GTEST_SKIP() << "REMAT_BIN and REMAT_SOURCE_DIR are set by CTest; run through ctest";
    }
  }
  static std::string Env(const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? "" : value;
  }
  static testutil::CommandOutcome Remat(const std::string& args) {
    return testutil::RunCommand(testutil::ShellQuote(Env("REMAT_BIN")) + " " + args);
  }
  static std::string Trace(const std::string& name) {
    return testutil::ShellQuote(Env("REMAT_SOURCE_DIR") + "/examples/traces/" + name);
  }
};

// Loads the timeline with Python's json module and checks it against the trace.
constexpr char kCheckTimeline[] = R"(
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
compute = sum(r["cost_ns"] for r in map(json.loads, open(sys.argv[2])) if r["op"] == "call")
counters = {e["name"] for e in events if e["ph"] == "C"}
assert counters == {"reserved bytes", "live bytes", "host bytes"}, counters
kinds = {e["cat"] if e["cat"] != "copy" else e["name"] for e in events if e["ph"] == "X"}
assert {"compute", "recompute", "offload", "restore"} <= kinds, kinds
instants = {e["name"] for e in events if e["ph"] == "i"}
assert {"drop", "offload"} <= instants, instants
total = sum(e["dur"] for e in events if e["ph"] == "X" and e["cat"] == "compute")
assert abs(total * 1000 - compute) < 1, (total, compute)
last = {}
for e in events:
    if e["ph"] == "M":
        continue
    track = e["name"] if e["ph"] == "C" else e["tid"]
    assert e["ts"] >= last.get(track, 0), (track, e)
    last[track] = e["ts"]
print("timeline ok", len(events))
)";

TEST_F(SimTimelineCliTest, WritesATimelinePythonLoads) {
  const std::string path = testutil::TempPath("sim_timeline.json");
  std::remove(path.c_str());
  const testutil::CommandOutcome run =
      Remat("sim " + Trace("transformer_small.jsonl") +
            " --budget-ratio 0.5 --policy dtr --timeline " + testutil::ShellQuote(path));
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("timeline         " + path));
  const testutil::CommandOutcome json =
      Remat("sim " + Trace("transformer_small.jsonl") +
            " --budget-ratio 0.5 --policy dtr --json --timeline " + testutil::ShellQuote(path));
  ASSERT_EQ(json.status, 0) << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"timeline\":\"" + path + "\""));
  if (testutil::Python3().empty()) GTEST_SKIP() << "no python3";
  const testutil::CommandOutcome check =
      testutil::RunPython("check_timeline.py", kCheckTimeline,
                          testutil::ShellQuote(path) + " " + Trace("transformer_small.jsonl"));
  EXPECT_EQ(check.status, 0) << check.out;
  EXPECT_THAT(check.out, HasSubstr("timeline ok"));
}

TEST_F(SimTimelineCliTest, AnUnwritablePathExitsTwoBeforeTheReplay) {
  for (const std::string& bad :
       {std::string("/nonexistent-dir/run.json"), testutil::TempPath("")}) {
    const testutil::CommandOutcome run =
        Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --timeline " +
              testutil::ShellQuote(bad));
    EXPECT_EQ(run.status, 2) << run.out;
    EXPECT_THAT(run.out, HasSubstr("remat sim: " + bad + ": cannot create"));
    EXPECT_THAT(run.out, Not(HasSubstr("peak"))) << "no replay ran";
  }
}

TEST_F(SimTimelineCliTest, HelpDescribesTheTimeline) {
  const testutil::CommandOutcome help = Remat("sim --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_THAT(help.out, HasSubstr("--timeline"));
  EXPECT_THAT(help.out, HasSubstr("https://ui.perfetto.dev"));
}

}  // namespace
}  // namespace remat
