// Runs the `remat` binary as a user would and checks what comes out: the
// report, its JSON keys, help text and exit statuses. The binary's path comes
// from $REMAT_BIN, the repository's from $REMAT_SOURCE_DIR (set by CTest).
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  int status = -1;  // exit status
  std::string out;  // stdout and stderr together
};

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

Outcome Remat(const std::string& args) {
  const std::string command = absl::StrCat("'", Env("REMAT_BIN"), "' ", args, " 2>&1");
  Outcome run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

std::string Trace(const std::string& name) {
  return absl::StrCat("'", Env("REMAT_SOURCE_DIR"), "/examples/traces/", name, "'");
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

class RematCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Env("REMAT_BIN").empty() || Env("REMAT_SOURCE_DIR").empty()) {
      GTEST_SKIP() << "REMAT_BIN and REMAT_SOURCE_DIR are set by CTest; run through ctest";
    }
  }
};

TEST_F(RematCliTest, ReplayJsonHasTheReportKeys) {
  const Outcome run = Remat("replay --json " + Trace("tiny.csv"));
  ASSERT_EQ(run.status, 0) << run.out;
  for (const char* key : {"\"events\":14", "\"peak_requested_bytes\":", "\"peak_allocated_bytes\":",
                          "\"peak_reserved_bytes\":", "\"fragmentation\":", "\"ooms\":0",
                          "\"events_per_second\":", "\"segments_peak\":", "\"retries\":"}) {
    EXPECT_THAT(run.out, HasSubstr(key));
  }
  EXPECT_EQ(run.out.front(), '{');
  EXPECT_EQ(run.out, run.out.substr(0, run.out.find('\n') + 1)) << "one line of JSON";
}

TEST_F(RematCliTest, ReplayTextReport) {
  const Outcome run = Remat("replay " + Trace("tiny.csv") + " --capacity 1GiB --budget 30MiB");
  ASSERT_EQ(run.status, 3) << run.out;  // the report, and the status of a log that did not fit
  EXPECT_THAT(run.out, HasSubstr("peak requested"));
  EXPECT_THAT(run.out, HasSubstr("sim (unbacked, 1.00 GiB), budget 30.00 MiB"));
  EXPECT_THAT(run.out, HasSubstr("OOMs               1"));
}

TEST_F(RematCliTest, ExpandableSegmentsCutFragmentationOnTheMultistreamLog) {
  auto fragmentation = [](const std::string& json) {
    const std::size_t at = json.find("\"fragmentation\":");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + 16));
  };
  const Outcome fixed = Remat("replay --json " + Trace("multistream.csv"));
  const Outcome expandable = Remat("replay --json " + Trace("multistream.csv") +
                                   " --alloc-conf expandable_segments:True");
  ASSERT_EQ(fixed.status, 0) << fixed.out;
  ASSERT_EQ(expandable.status, 0) << expandable.out;
  EXPECT_GT(fragmentation(fixed.out), 0.2);
  EXPECT_GE(fragmentation(expandable.out), 0.0);
  EXPECT_LT(fragmentation(expandable.out), 0.05);
  EXPECT_THAT(expandable.out, HasSubstr("\"alloc_conf\":\"expandable_segments:True\""));
}

TEST_F(RematCliTest, ABadAllocConfIsAUsageErrorEverywhere) {
  for (const std::string& args :
       {"replay " + Trace("tiny.csv"), "sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5",
        "sweep " + Trace("chain_100.jsonl"), std::string("run --device sim")}) {
    SCOPED_TRACE(args);
    const Outcome run = Remat(args + " --alloc-conf expandable_segments:sometimes" +
                              (args.starts_with("run") ? " -- true" : ""));
    EXPECT_EQ(run.status, 2) << run.out;
    EXPECT_THAT(run.out, HasSubstr("expandable_segments:sometimes: want True or False"));
  }
  const Outcome unknown =
      Remat("replay " + Trace("tiny.csv") + " --alloc-conf pinned_use_cuda_host_register:True");
  EXPECT_EQ(unknown.status, 2) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("unknown key 'pinned_use_cuda_host_register'"));
}

TEST_F(RematCliTest, RunHandsTheAllocConfToTheProgram) {
  const Outcome run = Remat(
      "run --device sim --alloc-conf expandable_segments:True -- sh -c 'echo conf=$REMAT_ALLOC_CONF'");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("conf=expandable_segments:True"));
}

TEST_F(RematCliTest, MalformedLogExitsTwoNamingTheLine) {
  const std::string path = WriteTemp("bad.csv",
                                     "Thread,Time,Action,Pointer,Size,Stream\n"
                                     "1,10:00:00.000001,allocate,0x1000,100,0x0\n"
                                     "1,10:00:00.000002,free,0x2000,100,0x0\n");
  const Outcome run = Remat("replay " + path);
  EXPECT_EQ(run.status, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("bad.csv:3: free of 0x2000 which is not live"));
  EXPECT_THAT(run.out, Not(HasSubstr("peak"))) << "no partial report";
}

TEST_F(RematCliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Remat("replay " + Trace("tiny.csv") + " --no-such-flag").status, 2);
  EXPECT_EQ(Remat("replay").status, 2);
  EXPECT_EQ(Remat("").status, 2);
  EXPECT_EQ(Remat("frobnicate").status, 2);
  EXPECT_EQ(Remat("replay /nonexistent/trace.csv").status, 2);
  const Outcome bad_size = Remat("replay " + Trace("tiny.csv") + " --budget 12parsecs");
  EXPECT_EQ(bad_size.status, 2);
  EXPECT_THAT(bad_size.out, HasSubstr("12parsecs"));
  EXPECT_EQ(Remat("replay " + Trace("tiny.csv") + " --budget 0").status, 2);
  // A budget no segment fits in.
  const Outcome tiny = Remat("replay " + Trace("tiny.csv") + " --budget 1KiB");
  EXPECT_EQ(tiny.status, 2);
  EXPECT_THAT(tiny.out, HasSubstr("below the smallest segment"));
  // A budget beyond the device.
  EXPECT_EQ(Remat("replay " + Trace("tiny.csv") + " --capacity 1GiB --budget 2GiB").status, 2);
}

TEST_F(RematCliTest, AFlagTakesNoValue) {
  for (const char* args : {"replay --json=5 ", "replay --json=0 ", "replay --json= "}) {
    const Outcome run = Remat(args + Trace("tiny.csv"));
    EXPECT_EQ(run.status, 2) << args << run.out;
    EXPECT_THAT(run.out, HasSubstr("--json is a flag and takes no value")) << args;
  }
  EXPECT_EQ(Remat("chain --steps 10 --slots 2 --json").status, 0);
  // After "--", the program's own arguments are the program's.
  EXPECT_EQ(Remat("run --device sim -- true --json=5").status, 0);
}

TEST_F(RematCliTest, ChainJsonHoldsTheScheduleAndTheWorkIsBounded) {
  const Outcome json = Remat("chain --steps 3 --slots 1 --json --schedule");
  ASSERT_EQ(json.status, 0) << json.out;
  EXPECT_EQ(json.out.front(), '{') << json.out;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1) << "one JSON document";
  EXPECT_THAT(json.out, HasSubstr("\"schedule\":[{\"action\":\"takeshot\""));
  const Outcome quadratic = Remat("chain --steps 20000 --slots 1");
  EXPECT_EQ(quadratic.status, 2) << quadratic.out;
  EXPECT_THAT(quadratic.out, HasSubstr("more than the 10000000 a run may take"));
  EXPECT_THAT(quadratic.out, HasSubstr("at most 4471 steps with 1 slot"));
  const Outcome belady = Remat("chain --steps 10 --slots 2 --policy belady");
  EXPECT_EQ(belady.status, 2) << belady.out;
  EXPECT_THAT(belady.out, HasSubstr("belady evicts by each state's next use"));
}

TEST_F(RematCliTest, MalformedPolicySpecsAreRefused) {
  for (const char* spec : {"dtr:", "dtr:=1", "dtr:a=", "dtr::"}) {
    const Outcome run = Remat(
        absl::StrCat("sim ", Trace("chain_100.jsonl"), " --budget-ratio 0.5 --policy ", spec));
    EXPECT_EQ(run.status, 2) << spec << ": " << run.out;
    EXPECT_THAT(run.out, HasSubstr("policy spec")) << spec;
  }
}

TEST_F(RematCliTest, ChainStepsPastInt64AreNamedAsGivenNotClamped) {
  const Outcome huge = Remat("chain --steps 99999999999999999999 --slots 3");
  EXPECT_EQ(huge.status, 2);
  EXPECT_THAT(huge.out, HasSubstr("99999999999999999999 is more than the 10000000 steps"));
  EXPECT_THAT(huge.out, Not(HasSubstr("9223372036854775807")));
  const Outcome junk = Remat("chain --steps 12x --slots 3");
  EXPECT_EQ(junk.status, 2);
  EXPECT_THAT(junk.out, HasSubstr("a whole number of steps, not '12x'"));
}

TEST_F(RematCliTest, AnUnknownSizeUnitExplainsBinaryAndDecimal) {
  const Outcome run = Remat("sim " + Trace("chain_100.jsonl") + " --budget 3X");
  EXPECT_EQ(run.status, 2);
  EXPECT_THAT(run.out, HasSubstr("G or GiB"));
  EXPECT_THAT(run.out, HasSubstr("powers of 1000: KB, MB, GB, TB"));
}

TEST_F(RematCliTest, HelpExitsZero) {
  const Outcome top = Remat("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_THAT(top.out, HasSubstr("replay"));
  const Outcome replay = Remat("replay --help");
  EXPECT_EQ(replay.status, 0);
  EXPECT_THAT(replay.out, HasSubstr("--capacity"));
  EXPECT_THAT(replay.out, HasSubstr("--budget"));
  EXPECT_THAT(replay.out, HasSubstr("--json"));
}

TEST_F(RematCliTest, SimPrintsTheReportAndRejectsBadUsage) {
  const Outcome run = Remat("sim " + Trace("chain_100.jsonl") +
                            " --budget-ratio 0.5 --policy lru --verify --scale 64 --json");
  ASSERT_EQ(run.status, 0) << run.out;
  for (const char* key :
       {"\"status\":\"ok\"", "\"policy\":\"lru\"", "\"budget_bytes\":", "\"peak_reserved_bytes\":",
        "\"peak_live_bytes\":", "\"baseline_ns\":", "\"time_ns\":", "\"overhead\":",
        "\"recomputed_ops\":", "\"recompute_ns\":", "\"offloaded_bytes\":", "\"restored_bytes\":",
        "\"stall_ns\":", "\"evictions\":", "\"wall_seconds\":", "\"verified_accesses\":",
        "\"mismatches\":0", "\"pressure_events\":", "\"candidates_per_event\":",
        "\"choose_ns_per_event\":", "\"max_split_bytes\":67108864", "\"records_per_second\":",
        "\"baseline_records_per_second\":"}) {
    EXPECT_THAT(run.out, HasSubstr(key));
  }
  EXPECT_THAT(run.out, Not(HasSubstr("\"baseline_records_per_second\":0")));  // timed
  // Copies made ahead, by default; --no-copy-ahead makes none.
  EXPECT_THAT(run.out, Not(HasSubstr("\"copies_ahead\":0,")));
  EXPECT_THAT(run.out, HasSubstr("\"ahead_offloads\":"));
  const Outcome at_eviction = Remat("sim " + Trace("chain_100.jsonl") +
                                    " --budget-ratio 0.5 --policy lru --scale 64"
                                    " --no-copy-ahead --json");
  ASSERT_EQ(at_eviction.status, 0) << at_eviction.out;
  EXPECT_THAT(at_eviction.out, HasSubstr("\"copies_ahead\":0,"));
  // The split limit: a size, none or auto; too small or malformed is a usage error.
  const Outcome none = Remat("sim " + Trace("chain_100.jsonl") +
                             " --budget-ratio 0.5 --policy lru --max-split none --json");
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_THAT(none.out, HasSubstr("\"max_split_bytes\":0,"));
  const Outcome sized = Remat("sim " + Trace("chain_100.jsonl") +
                              " --budget-ratio 0.5 --policy lru --max-split 32MiB --json");
  ASSERT_EQ(sized.status, 0) << sized.out;
  EXPECT_THAT(sized.out, HasSubstr("\"max_split_bytes\":33554432"));
  for (const char* bad : {"1MiB", "lots", "0"}) {
    EXPECT_EQ(Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --max-split " + bad)
                  .status,
              2)
        << bad;
  }
  // A scattered request is retried as the policy plans it, by default: lru finishes the
  // README's transformer at a reserved 0.5 (meeting such requests in one place made it
  // thrash there); --retry-in-one-place still does, and contradicts --retry-anywhere.
  const std::string transformer =
      "sim " + Trace("transformer_small.jsonl") + " --budget-ratio 0.5 --policy lru --json";
  const Outcome anywhere = Remat(transformer);
  ASSERT_EQ(anywhere.status, 0) << anywhere.out;
  EXPECT_THAT(anywhere.out, HasSubstr("\"status\":\"ok\""));
  EXPECT_THAT(anywhere.out, HasSubstr("\"covering_runs\":0,"));
  const Outcome one_place = Remat(transformer + " --retry-in-one-place");
  EXPECT_THAT(one_place.out, Not(HasSubstr("\"covering_runs\":0,")));
  EXPECT_EQ(Remat(transformer + " --retry-in-one-place --retry-anywhere").status, 2);
  // belady at 0.35 finishes only with the split limit halved twice, and says so; a
  // limit asked for stays.
  const std::string belady =
      "sim " + Trace("transformer_small.jsonl") + " --budget-ratio 0.35 --policy belady";
  const Outcome halved = Remat(belady + " --json");
  ASSERT_EQ(halved.status, 0) << halved.out;
  EXPECT_THAT(halved.out, HasSubstr("\"max_split_bytes\":16777216,"));
  EXPECT_THAT(halved.out, HasSubstr("\"split_halvings\":2"));
  EXPECT_THAT(Remat(belady).out,
              HasSubstr("split limit      16.00 MiB (halved twice: run again so"));
  // The LSTM's stack finds no segment free beside its 128 inputs at 0.4: made outputs
  // first, dtr finishes, and says so; --inputs-held holds them, as before.
  const std::string lstm = "sim " + Trace("lstm_l2_h512_s128_b32_v256.jsonl") +
                           " --budget-ratio 0.4 --policy dtr --no-swap --json";
  const Outcome first = Remat(lstm);
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_THAT(first.out, HasSubstr("\"status\":\"ok\""));
  EXPECT_THAT(first.out, HasSubstr("\"outputs_first\":1,"));
  const Outcome held = Remat(lstm + " --inputs-held");
  EXPECT_THAT(held.out, HasSubstr("\"status\":\"oom\""));
  EXPECT_THAT(held.out, HasSubstr("\"outputs_first\":0,"));
  EXPECT_THAT(Remat(lstm.substr(0, lstm.size() - 7)).out,
              HasSubstr("outputs first    1 call: no room beside the inputs"));
  const Outcome kept_limit = Remat(belady + " --max-split 64MiB --json");
  EXPECT_EQ(kept_limit.status, 3) << kept_limit.out;
  EXPECT_THAT(kept_limit.out, HasSubstr("\"split_halvings\":0"));
  // A sampling policy names its sample; a bad sample is a usage error.
  const Outcome sampled = Remat("sim " + Trace("chain_100.jsonl") +
                                " --budget-ratio 0.5 --policy lru:sample=sqrt --json");
  ASSERT_EQ(sampled.status, 0) << sampled.out;
  EXPECT_THAT(sampled.out, HasSubstr("\"policy\":\"lru:sample=sqrt\""));
  EXPECT_EQ(Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --policy lru:sample=0")
                .status,
            2);
  // Exactly one of --budget-ratio and --budget.
  EXPECT_EQ(Remat("sim " + Trace("chain_100.jsonl")).status, 2);
  EXPECT_EQ(Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --budget 1GiB").status,
            2);
  // Unknown policy, unknown accounting, a malformed trace.
  const Outcome policy = Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --policy x");
  EXPECT_EQ(policy.status, 2);
  EXPECT_THAT(policy.out, HasSubstr("unknown policy 'x'"));
  EXPECT_EQ(Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio 0.5 --accounting y").status,
            2);
  const std::string bad = WriteTemp("bad.jsonl", "{\"op\":\"constant\",\"id\":\"a\",\"bytes\":1}\n{oops\n");
  const Outcome malformed = Remat("sim " + bad + " --budget-ratio 0.5");
  EXPECT_EQ(malformed.status, 2);
  EXPECT_THAT(malformed.out, HasSubstr("bad.jsonl:2"));
}

TEST_F(RematCliTest, SimRefusesAnEmptyTraceAndABudgetItCannotKeep) {
  const std::string empty = WriteTemp("empty.jsonl", "");
  const Outcome sim = Remat("sim " + empty + " --budget-ratio 0.5");
  EXPECT_EQ(sim.status, 2) << sim.out;
  EXPECT_THAT(sim.out, HasSubstr("no records"));
  const Outcome sweep =
      Remat("sweep " + empty + " --no-plot --out " + ::testing::TempDir() + "/empty_sweep");
  EXPECT_EQ(sweep.status, 2) << sweep.out;
  EXPECT_THAT(sweep.out, HasSubstr("no records"));
  // Half of a 2 MiB reserved peak is below the allocator's smallest segment:
  // refused, not run under a budget other than the one printed.
  const Outcome tiny =
      Remat("sim " + Trace("transformer_small.jsonl") + " --budget-ratio 0.5 --scale 256");
  EXPECT_EQ(tiny.status, 2) << tiny.out;
  EXPECT_THAT(tiny.out, HasSubstr("smallest segment"));
  const Outcome live = Remat("sim " + Trace("transformer_small.jsonl") +
                             " --budget-ratio 0.5 --scale 256 --accounting live --json");
  EXPECT_EQ(live.status, 0) << live.out;
  // A sweep refuses such a ratio before it runs anything.
  const Outcome swept = Remat("sweep " + Trace("chain_100.jsonl") +
                              " --ratios 0.0001,0.5 --policies lru --no-plot --out " +
                              ::testing::TempDir() + "/tiny_sweep");
  EXPECT_EQ(swept.status, 2) << swept.out;
  EXPECT_THAT(swept.out, HasSubstr("ratio 0.0001"));
  EXPECT_THAT(swept.out, HasSubstr("smallest segment"));
}

TEST_F(RematCliTest, NoOutputOverwritesAnInputOrAnotherOutput) {
  const std::string trace = WriteTemp("mine.jsonl", *remat::ReadFile(
      Env("REMAT_SOURCE_DIR") + "/examples/traces/chain_100.jsonl"));
  const Outcome sim = Remat("sim " + trace + " --budget-ratio 0.5 --timeline " + trace);
  EXPECT_EQ(sim.status, 2) << sim.out;
  EXPECT_THAT(sim.out, HasSubstr("refusing to overwrite"));
  const std::string log = WriteTemp("mine.csv", *remat::ReadFile(
      Env("REMAT_SOURCE_DIR") + "/examples/traces/tiny.csv"));
  EXPECT_EQ(Remat("replay " + log + " --snapshot " + log).status, 2);
  const std::string out = ::testing::TempDir() + "/both.out";
  const Outcome both = Remat("replay " + log + " --snapshot " + out + " --timeline " + out);
  EXPECT_EQ(both.status, 2) << both.out;
  EXPECT_THAT(both.out, HasSubstr("name the same file"));
  // What was handed in is as it was.
  EXPECT_EQ(*remat::ReadFile(trace),
            *remat::ReadFile(Env("REMAT_SOURCE_DIR") + "/examples/traces/chain_100.jsonl"));
  EXPECT_EQ(*remat::ReadFile(log),
            *remat::ReadFile(Env("REMAT_SOURCE_DIR") + "/examples/traces/tiny.csv"));
}

TEST_F(RematCliTest, AFailedSweepLeavesNoDirectoryItMadeAndKeepsTheUsers) {
  namespace fs = std::filesystem;
  const fs::path fresh = fs::path(::testing::TempDir()) / "sweep_fresh";
  fs::remove_all(fresh);
  const Outcome failed =
      Remat("sweep " + Trace("chain_100.jsonl") +
            " --ratios 0.5 --policies nosuch --no-plot --out " + (fresh / "a" / "b").string());
  EXPECT_EQ(failed.status, 2) << failed.out;
  EXPECT_FALSE(fs::exists(fresh)) << "the directories this run made are gone";
  // The user's own directory stays, with what was in it.
  const fs::path mine = fs::path(::testing::TempDir()) / "sweep_mine";
  fs::remove_all(mine);
  fs::create_directories(mine);
  const Outcome again =
      Remat("sweep " + Trace("chain_100.jsonl") +
            " --ratios 0.5 --policies nosuch --no-plot --out " + (mine / "new").string());
  EXPECT_EQ(again.status, 2) << again.out;
  EXPECT_TRUE(fs::is_directory(mine));
  EXPECT_FALSE(fs::exists(mine / "new"));
  const Outcome kept = Remat("sweep " + Trace("chain_100.jsonl") +
                             " --ratios 0.5 --policies nosuch --no-plot --out " + mine.string());
  EXPECT_EQ(kept.status, 2) << kept.out;
  EXPECT_TRUE(fs::is_directory(mine));
}

TEST_F(RematCliTest, ATraceLineOverTheCapIsRefusedByEveryReader) {
  // 17 MiB with no newline: over the 16 MiB a line may have.
  const std::string endless = WriteTemp("endless.txt", std::string(17 << 20, 'x'));
  for (const std::string& command :
       {"sim " + endless + " --budget-ratio 0.5", "replay " + endless,
        "sweep " + endless + " --no-plot --out " + ::testing::TempDir() + "/endless_sweep"}) {
    const Outcome run = Remat(command);
    EXPECT_EQ(run.status, 2) << command << ": " << run.out;
    EXPECT_THAT(run.out, HasSubstr(endless + ": line 1 is longer than 16.00 MiB")) << command;
  }
}

TEST_F(RematCliTest, BadInputGetsAMessageThatSaysWhatIsWrong) {
  // A directory is bad input (2), not a failed run (1).
  const Outcome dir = Remat("sim " + ::testing::TempDir() + " --budget-ratio 0.5");
  EXPECT_EQ(dir.status, 2) << dir.out;
  EXPECT_THAT(dir.out, HasSubstr("is a directory"));
  EXPECT_EQ(Remat("replay " + ::testing::TempDir()).status, 2);
  const Outcome nan = Remat("sim " + Trace("chain_100.jsonl") + " --budget-ratio nan");
  EXPECT_EQ(nan.status, 2) << nan.out;
  EXPECT_THAT(nan.out, HasSubstr("--budget-ratio must be a number"));
  // Binary input is quoted with its bytes escaped, never echoed raw.
  std::string garbage = "\x01\x9b[2J\xff\xfe,zz";
  garbage += std::string(1, '\0') + "tail\n";
  const Outcome binary = Remat("replay " + WriteTemp("garbage.bin", garbage));
  EXPECT_EQ(binary.status, 2) << binary.out;
  EXPECT_THAT(binary.out, HasSubstr("\\x01\\x9b[2J\\xff"));
  for (const char c : binary.out) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(byte == '\n' || (byte >= 0x20 && byte < 0x7f)) << "raw byte " << int{byte};
  }
}

TEST_F(RematCliTest, RunRefusesBadOutputsAndBudgetsBeforeTheProgramStarts) {
  const std::string marker = ::testing::TempDir() + "/ran_marker";
  std::remove(marker.c_str());
  const Outcome no_dir = Remat("run --device sim --trace " + ::testing::TempDir() +
                               "/no/such/dir/t.csv -- touch " + marker);
  EXPECT_EQ(no_dir.status, 2) << no_dir.out;
  EXPECT_THAT(no_dir.out, HasSubstr("cannot create"));
  const std::string same = ::testing::TempDir() + "/same.out";
  const Outcome twice =
      Remat("run --device sim --trace " + same + " --snapshot " + same + " -- touch " + marker);
  EXPECT_EQ(twice.status, 2) << twice.out;
  EXPECT_THAT(twice.out, HasSubstr("name the same file"));
  const Outcome tiny = Remat("run --device sim --budget 1KiB -- touch " + marker);
  EXPECT_EQ(tiny.status, 2) << tiny.out;
  EXPECT_THAT(tiny.out, HasSubstr("smallest segment"));
  EXPECT_FALSE(std::filesystem::exists(marker));  // the program never started
}

TEST_F(RematCliTest, RunNeverWritesOverTheProgramItRuns) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "run_own_program";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path program = dir / "my-program";
  fs::copy_file("/bin/true", program);
  fs::create_hard_link(program, dir / "hard-link");
  fs::create_symlink(program, dir / "soft-link");
  const std::string before = *remat::ReadFile(program.string());
  // As named; through a hard link; through a symbolic link.
  for (const char* output : {"my-program", "hard-link", "soft-link"}) {
    const Outcome run = Remat(absl::StrCat("run --device sim --trace ", (dir / output).string(),
                                           " -- ", program.string()));
    EXPECT_EQ(run.status, 2) << output << ": " << run.out;
    EXPECT_THAT(run.out, HasSubstr("is the program: refusing to overwrite an input"));
  }
  // Found through PATH, as exec finds it.
  const std::string path = Env("PATH");
  setenv("PATH", absl::StrCat(dir.string(), ":", path).c_str(), 1);
  const Outcome searched = Remat(
      absl::StrCat("run --device sim --snapshot ", (dir / "hard-link").string(), " -- my-program"));
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(searched.status, 2) << searched.out;
  EXPECT_THAT(searched.out, HasSubstr("is the program"));
  EXPECT_EQ(*remat::ReadFile(program.string()), before);
}

TEST_F(RematCliTest, RunSaysWhenTheProgramMadeNoCudaAllocation) {
  const std::string trace = ::testing::TempDir() + "/never.csv";
  std::remove(trace.c_str());
  const Outcome run = Remat("run --device sim --trace " + trace + " -- true");
  EXPECT_EQ(run.status, 0) << run.out;  // the program's own status
  EXPECT_THAT(run.out, HasSubstr("nothing written to " + trace));
  EXPECT_THAT(run.out, HasSubstr("made no CUDA allocation through remat, or did not reach"));
}

TEST_F(RematCliTest, RunOnTheSimulatorSaysPyTorchCannotRunThere) {
  const Outcome python = Remat("run --device sim -- python3 -c pass");
  EXPECT_EQ(python.status, 0) << python.out;
  EXPECT_THAT(python.out, HasSubstr("PyTorch cannot run on it"));
  EXPECT_THAT(Remat("run --device sim -- true").out, Not(HasSubstr("PyTorch")));
}

TEST_F(RematCliTest, RunStatsReportsAProgramThatMadeNoAllocation) {
  const Outcome run = Remat("run --device sim --stats -- true");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("made no CUDA allocation through remat"));
}

TEST_F(RematCliTest, RunStatsSpeaksOnceForAChildForkedBeforeAnyAllocation) {
  // The child inherits the exit handler; it exits through exit(), not _exit.
  const Outcome run = Remat(
      "run --device sim --stats -- python3 -c "
      "'import os, sys\npid = os.fork()\nif pid == 0: sys.exit(0)\nos.waitpid(pid, 0)'");
  EXPECT_EQ(run.status, 0) << run.out;
  const std::string said = "made no CUDA allocation through remat";
  std::size_t times = 0;
  for (std::size_t at = run.out.find(said); at != std::string::npos;
       at = run.out.find(said, at + 1)) {
    ++times;
  }
  EXPECT_EQ(times, 1u) << run.out;
}

TEST_F(RematCliTest, ARunThatDoesNotFitExitsThreeWithNoOverhead) {
  const Outcome json = Remat("sim " + Trace("chain_100.jsonl") +
                             " --budget-ratio 0.2 --accounting live --policy belady --json");
  EXPECT_EQ(json.status, 3) << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"status\":\"oom\""));
  EXPECT_THAT(json.out, HasSubstr("\"overhead\":null"));
  const Outcome text = Remat("sim " + Trace("chain_100.jsonl") +
                             " --budget-ratio 0.2 --accounting live --policy belady");
  EXPECT_EQ(text.status, 3) << text.out;
  EXPECT_THAT(text.out, HasSubstr("overhead none: the run did not finish"));
  // In a sweep's results.csv the overhead of such a run is empty.
  const std::string out = ::testing::TempDir() + "/unfinished_sweep";
  const Outcome sweep = Remat("sweep " + Trace("chain_100.jsonl") +
                              " --ratios 0.2,0.9 --policies belady --accounting live --no-plot --out " +
                              out);
  ASSERT_EQ(sweep.status, 0) << sweep.out;
  absl::StatusOr<std::string> csv = remat::ReadFile(out + "/results.csv");
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_THAT(*csv, HasSubstr(",oom,,"));
  EXPECT_THAT(*csv, ::testing::ContainsRegex(",ok,[0-9]"));
}

TEST_F(RematCliTest, ASweepOfTooManyRatiosSaysSo) {
  const Outcome run = Remat("sweep " + Trace("chain_100.jsonl") +
                            " --ratios 0.000001:1000000:0.000001 --out " + ::testing::TempDir() +
                            "/many");
  EXPECT_EQ(run.status, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("more than the 1000 a sweep takes"));
}

TEST_F(RematCliTest, SweepWritesTheCsvAndTheTableAndRejectsBadUsage) {
  const std::string out = ::testing::TempDir() + "/sweep_out";
  const Outcome run = Remat("sweep " + Trace("chain_100.jsonl") +
                            " --ratios 0.4,0.8 --policies lru:sample=4,dtr:staleness_exp=2,neighbourhood=false,"
                            "dtr:staleness_exp=0 --jobs 2 "
                            "--no-plot --out " + out);
  ASSERT_EQ(run.status, 0) << run.out;
  // Specs with parameters of their own stay whole in the list.
  EXPECT_THAT(run.out, HasSubstr("lru:sample=4"));
  EXPECT_THAT(run.out, HasSubstr("dtr:staleness_exp=2,neighbourhood=false"));
  EXPECT_THAT(run.out, HasSubstr("dtr:staleness_exp=0"));
  EXPECT_THAT(run.out, HasSubstr("*"));
  absl::StatusOr<std::string> csv = remat::ReadFile(out + "/results.csv");
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(std::count(csv->begin(), csv->end(), '\n'), 7);  // a header and 3 x 2 runs
  // --inputs-held reaches every run: the LSTM's stack at 0.4 then finds no segment free.
  for (const bool held : {false, true}) {
    const std::string dir = out + (held ? "_held" : "_first");
    const Outcome lstm = Remat("sweep " + Trace("lstm_l2_h512_s128_b32_v256.jsonl") +
                              " --ratios 0.4 --policies dtr --no-plot --out " + dir +
                              (held ? " --inputs-held" : ""));
    ASSERT_EQ(lstm.status, 0) << lstm.out;
    absl::StatusOr<std::string> rows = remat::ReadFile(dir + "/results.csv");
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_THAT(*rows, HasSubstr(held ? ",oom," : ",ok,")) << *rows;
  }
  EXPECT_EQ(Remat("sweep --out " + out).status, 2);  // neither a trace nor a model
  EXPECT_EQ(Remat("sweep " + Trace("chain_100.jsonl") + " --policies nope --out " + out).status, 2);
  EXPECT_EQ(Remat("sweep " + Trace("chain_100.jsonl") + " --ratios 0.9:0.1:0.1 --out " + out).status,
            2);
}

TEST_F(RematCliTest, ChainComparesAPolicyWithTheOptimum) {
  const Outcome revolve = Remat("chain --steps 100 --slots 5 --policy revolve --json");
  ASSERT_EQ(revolve.status, 0) << revolve.out;
  EXPECT_THAT(revolve.out, HasSubstr("\"advances\":316"));
  EXPECT_THAT(revolve.out, HasSubstr("\"optimal_advances\":316"));
  const Outcome dtr = Remat("chain --steps 100 --slots 5 --policy dtr --json");
  ASSERT_EQ(dtr.status, 0) << dtr.out;
  EXPECT_THAT(dtr.out, HasSubstr("\"optimal_advances\":316"));
  EXPECT_THAT(dtr.out, HasSubstr("\"ratio\":"));
  EXPECT_EQ(Remat("chain --steps 0 --slots 5").status, 2);
  EXPECT_EQ(Remat("chain --steps 10 --slots 2 --policy nope").status, 2);
}

TEST_F(RematCliTest, GenWritesATraceSimReads) {
  const std::string out = ::testing::TempDir() + "/gen_gpt2.jsonl";
  const Outcome gen = Remat("gen gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512 -o " + out);
  ASSERT_EQ(gen.status, 0) << gen.out;
  const Outcome sim = Remat("sim " + out + " --budget-ratio 0.7 --accounting live --policy dtr " +
                            "--verify --thrash-limit 100 --json");
  ASSERT_EQ(sim.status, 0) << sim.out;
  EXPECT_THAT(sim.out, HasSubstr("\"status\":\"ok\""));
  EXPECT_THAT(sim.out, HasSubstr("\"mismatches\":0"));
  const Outcome bad = Remat("gen gpt3:layers=2 -o " + out);
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.out, HasSubstr("gpt2"));  // the known models are listed
}

}  // namespace
