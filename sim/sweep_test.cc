#include "sim/sweep.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

OpTrace Chain() {
  absl::StatusOr<OpTrace> t = ReadOpTrace(std::string(REMAT_EXAMPLE_TRACES_DIR) + "/chain_100.jsonl");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : OpTrace{};
}

TEST(SweepTest, ParsesRatiosAsRangesAndLists) {
  EXPECT_THAT(*ParseRatios("0.2:0.5:0.1"), ElementsAre(0.2, 0.3, 0.4, 0.5));
  EXPECT_THAT(*ParseRatios("0.3,0.7"), ElementsAre(0.3, 0.7));
  EXPECT_THAT(*ParseRatios("0.5"), ElementsAre(0.5));
  for (const char* bad : {"", "a:b:c", "0.9:0.2:0.1", "0.2:0.9:0", "0", "-1", "0.2:0.9", "1,x"}) {
    EXPECT_FALSE(ParseRatios(bad).ok()) << bad;
  }
}

TEST(SweepTest, RunsEveryPolicyAtEveryRatioInParallel) {
  const OpTrace trace = Chain();
  SweepOptions o;
  o.ratios = {0.4, 0.7};
  o.policies = {"lru", "dtr", "window"};
  o.jobs = 2;
  std::atomic<int> calls{0};
  o.progress = [&](std::size_t done, std::size_t total, const SweepRow&) {
    EXPECT_LE(done, total);
    ++calls;
  };
  absl::StatusOr<SweepResult> r = RunSweep(trace, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rows.size(), 6u);
  EXPECT_EQ(calls, 6);
  for (const SweepRow& row : r->rows) {
    EXPECT_EQ(row.report.status, "ok") << row.policy << " " << row.ratio;
    EXPECT_GE(r->Overhead(row), 1.0);
    EXPECT_LE(row.report.peak_reserved_bytes, std::max<std::uint64_t>(row.budget, 2 << 20));
  }
  // The same run alone gives the same figures: runs share nothing.
  SweepOptions one = o;
  one.policies = {"dtr"};
  one.ratios = {0.4};
  one.jobs = 1;
  one.progress = nullptr;
  absl::StatusOr<SweepResult> alone = RunSweep(trace, one);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->rows[0].report.time_ns, r->rows[2].report.time_ns);

  const std::string table = SweepTable(*r);
  EXPECT_THAT(table, HasSubstr("lru"));
  EXPECT_THAT(table, HasSubstr("*"));
  EXPECT_THAT(table, Not(HasSubstr("bound")));
  // With bounds: a last column, a cell per ratio, "-" where there is none.
  const std::map<double, std::string> bounds = {{0.4, "~1.234"}};
  const std::string with = SweepTable(*r, &bounds);
  EXPECT_THAT(with, HasSubstr("window    bound\n"));
  EXPECT_THAT(with, HasSubstr("~1.234 \n"));
  EXPECT_THAT(with, HasSubstr("-\n"));
  // With plans too: the plan's column comes before the bound's.
  const std::map<double, std::string> plans = {{0.4, "1.300"}};
  const std::string both = SweepTable(*r, &bounds, &plans);
  EXPECT_THAT(both, HasSubstr("window     plan    bound\n"));
  EXPECT_THAT(both, HasSubstr("1.300   ~1.234 \n"));
  const std::string csv = SweepCsv(*r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);
  EXPECT_THAT(csv, HasSubstr("\"window\",reserved,0.4,"));
  EXPECT_THAT(csv, HasSubstr(",plan,copies_ahead,ahead_offloads,kept_policy,in_one_place,"
                             "max_split_bytes\n"));
  // Each row ends with its copies ahead and the offloads that used one, in
  // that order, then the run a policy's trials kept (none here), whether it
  // met each request in one place, and the split limit it ran with.
  SweepResult kept = *r;
  SweepRow& last = kept.rows.back();
  last.report.in_one_place = false;
  last.report.max_split_bytes = 64 * kMiB;
  EXPECT_THAT(SweepCsv(kept), HasSubstr(absl::StrCat(",", last.report.copies_ahead, ",",
                                                     last.report.ahead_offloads, ",,0,",
                                                     64 * kMiB, "\n")));
  last.report.kept_policy = "hybrid:rank=msps,slack=2";
  last.report.in_one_place = true;
  last.report.max_split_bytes = 16 * kMiB;
  EXPECT_THAT(SweepCsv(kept),
              HasSubstr(absl::StrCat(",\"hybrid:rank=msps,slack=2\",1,", 16 * kMiB, "\n")));
  // Every field that may hold a comma or a quote is quoted: a trace named by
  // a --model spec, a policy spec with parameters.
  SweepResult named = *r;
  named.trace = "gpt2:layers=2,seq=64 \"x\"";
  named.rows.resize(1);
  named.rows[0].policy = "dtr:staleness_exp=2,sample=sqrt";
  EXPECT_THAT(SweepCsv(named),
              HasSubstr("\n\"gpt2:layers=2,seq=64 \"\"x\"\"\",\"dtr:staleness_exp=2,sample=sqrt\","
                        "reserved,0.4,"));
  EXPECT_THAT(SweepPlotScript("r.csv", "o.png", "p.py"), HasSubstr("savefig('o.png'"));
  // Paths that hold the template's own words come through whole.
  const std::string odd = SweepPlotScript("/tmp/PNG/CSV.csv", "/tmp/PNG/o.png", "/tmp/PNG/p.py");
  EXPECT_THAT(odd, HasSubstr("open('/tmp/PNG/CSV.csv')"));
  EXPECT_THAT(odd, HasSubstr("savefig('/tmp/PNG/o.png'"));
}

// Runs the plot script on `csv` with `check` (Python, run after the script
// in its namespace) appended; false where no python3 with matplotlib is.
bool PlotChecks(const std::string& csv, const std::string& check, int* status) {
  // As remat sweep draws: the python3 on PATH, else the system's.
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (std::system(absl::StrCat(candidate, " -c 'import matplotlib' 2>/dev/null").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) return false;
  const std::string dir = ::testing::TempDir();
  EXPECT_TRUE(WriteFile(dir + "/plot.csv", csv).ok());
  const std::string script =
      SweepPlotScript(dir + "/plot.csv", dir + "/plot.png", dir + "/plot.py") + check;
  EXPECT_TRUE(WriteFile(dir + "/plot.py", script).ok());
  const int raw = std::system((python + " '" + dir + "/plot.py'").c_str());
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return true;
}

TEST(SweepTest, ThePlotShowsEveryFailureEveryLineAndALegendOffTheMarks) {
  // Two policies equal everywhere; failures of three policies at one ratio,
  // of two kinds.
  std::string csv = "trace,policy,accounting,ratio,status,overhead\n";
  for (const char* policy : {"lru", "dtr"}) {
    for (const char* row : {",0.3,oom,", ",0.5,ok,1.5", ",0.7,ok,1.2", ",0.9,ok,1.0"}) {
      absl::StrAppend(&csv, "t,", policy, ",live", row, "\n");
    }
  }
  absl::StrAppend(&csv, "t,msps,live,0.3,thrash,\n", "t,msps,live,0.5,ok,1.4\n");
  const std::string check = R"PY(
fig.canvas.draw()
renderer = fig.canvas.get_renderer()
points = {(p, tuple(o)) for p, c in enumerate(ax.collections) for o in c.get_offsets()}
spots = {o for _, o in points}
assert len(spots) == 3, f"each failure a mark of its own: {sorted(spots)}"
marks = {c.get_paths()[0].vertices.tobytes() for c in ax.collections}
assert len(marks) == 2, "oom and thrash marked apart"
lines = [l for l in ax.get_lines() if l.get_label() in policies]
looks = {(str(l.get_linestyle()), l.get_marker()) for l in lines}
assert len(looks) == len(lines), f"every line its own dash and marker: {looks}"
legend = ax.get_legend().get_window_extent(renderer)
assert not legend.overlaps(ax.get_window_extent(renderer)), "the legend is off the axes"
)PY";
  int status = -1;
  if (!PlotChecks(csv, check, &status)) GTEST_SKIP() << "no python3 with matplotlib";
  EXPECT_EQ(status, 0);
}

TEST(SweepTest, APlanIsReplayedWithTheSweepsSettingsAndItsEvictsCarriedOut) {
  // a is dropped by the plan before b is made; the fallback policy sees no
  // pressure. The plan recomputes a twice before the use, more than the
  // compute before it: the plan's thrash limit lets it.
  absl::StatusOr<OpTrace> planned = ParseOpTrace(R"(
{"op":"constant","id":"x","bytes":1048576}
{"op":"call","name":"f","inputs":["x"],"outputs":[{"id":"a","bytes":4194304}],"cost_ns":100}
{"op":"evict","id":"a","action":"drop"}
{"op":"call","name":"g","inputs":["x"],"outputs":[{"id":"b","bytes":4194304}],"cost_ns":10}
{"op":"release","id":"b"}
{"op":"prefetch","id":"a"}
{"op":"evict","id":"a","action":"drop"}
{"op":"prefetch","id":"a"}
{"op":"use","ids":["a"]}
)",
                                                 "plan.jsonl");
  ASSERT_TRUE(planned.ok()) << planned.status();
  SweepOptions o;
  o.live = true;
  o.enable_offload = false;
  absl::StatusOr<OpReplayReport> run =
      ReplayPlan(*planned, o, 6 * kMiB, policies::PolicySpec("lru"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status, "ok") << run->message;
  EXPECT_EQ(run->budget_bytes, 6 * kMiB);
  EXPECT_EQ(run->directed_evictions, 2u);
  EXPECT_EQ(run->pressure_events, 0u);
  EXPECT_EQ(run->recompute_ns, 200);  // more than the 110 ns of compute before it
  EXPECT_EQ(run->policy, "lru");
  EXPECT_FALSE(ReplayPlan(*planned, o, 6 * kMiB, policies::PolicySpec("nope")).ok());
}

TEST(SweepTest, TheFutureAskedForReachesEveryBudgetedRun) {
  const OpTrace trace = Chain();
  SweepOptions o;
  o.ratios = {0.5};
  o.policies = {"dtr"};
  o.live = true;
  o.future = Future::kLearned;
  absl::StatusOr<SweepResult> r = RunSweep(trace, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rows[0].report.future, "learned");
  EXPECT_EQ(r->baseline.future, "known");  // the unlimited run evicts nothing: one step
}

TEST(SweepTest, FailuresAreResultsAndBadPoliciesAreErrors) {
  const OpTrace trace = Chain();
  SweepOptions o;
  o.ratios = {0.01};
  o.policies = {"lru"};
  o.live = true;
  absl::StatusOr<SweepResult> r = RunSweep(trace, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->rows[0].report.status, "ok");
  EXPECT_THAT(SweepTable(*r), HasSubstr(r->rows[0].report.status));
  o.policies = {"lru", "nope"};
  EXPECT_THAT(std::string(RunSweep(trace, o).status().message()), HasSubstr("unknown policy"));
  o.policies = {};
  EXPECT_FALSE(RunSweep(trace, o).ok());
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

SweepRow Row(const std::string& policy, double ratio, std::int64_t time_ns, const char* status) {
  SweepRow row;
  row.policy = policy;
  row.ratio = ratio;
  row.budget = static_cast<std::uint64_t>(ratio * 1000) * kMiB;
  row.report.status = status;
  row.report.time_ns = time_ns;
  return row;
}

TEST(SweepTest, TheConclusionNamesTheSmallestBudgetThatRanAndTheBestAtHalf) {
  SweepResult result;
  result.baseline.time_ns = 1000;
  result.rows = {Row("lru", 0.3, 0, "oom"),      Row("dtr", 0.3, 0, "thrash"),
                 Row("lru", 0.4, 1500, "ok"),    Row("dtr", 0.4, 1300, "ok"),
                 Row("lru", 0.5, 1100, "ok"),    Row("dtr", 0.5, 1150, "ok"),
                 Row("lru", 0.9, 1000, "ok"),    Row("dtr", 0.9, 1000, "ok")};
  EXPECT_EQ(SweepConclusion(result),
            "conclusion: the step ran in 40% of its memory (reserved budget of 400.00 MiB with "
            "dtr, +30.0% time (overhead 1.300)); at 50%: 500.00 MiB with lru, +10.0% time "
            "(overhead 1.100).\n");
  for (SweepRow& row : result.rows) row.report.status = "oom";
  EXPECT_THAT(SweepConclusion(result), HasSubstr("no policy finished"));
}

}  // namespace
}  // namespace remat
