// Runtime and simulator hot paths, each against a reference in the same run:
//
//   acquire_release/resident   Acquire + Release of a resident tensor, the
//                              runtime's fast path (reference: an allocator
//                              Allocate + Free pair of the same size)
//   choose/POLICY/10000        one eviction decision over 10,000 candidates
//                              (reference: sorting the same candidates by size)
//   parse/transformer_small    op-trace records parsed per second
//   replay/transformer_small/POLICY/RATIO
//                              op-trace records replayed per second through
//                              the runtime under a reserved-bytes budget of
//                              RATIO x the unlimited peak (reference: the
//                              same trace with no budget, no evictions)
//   replay/chain/N/POLICY      the same on a generated chain of N layers at
//                              half its peak: the cost of a pressure event as
//                              the tensor table grows
//   replay/gpt2_720_steps/POLICY/RATIO
//                              the same on a generated trace of over a
//                              million records (remat gen
//                              gpt2:layers=12,steps=720: 1,016,072), against
//                              its unlimited replay
#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/caching_allocator.h"
#include "benchmark/benchmark.h"
#include "device/sim_device.h"
#include "gen/model_gen.h"
#include "policies/registry.h"
#include "runtime/runtime.h"
#include "sim/op_replay.h"
#include "trace/op_trace.h"

namespace remat {
namespace {

void BM_AcquireRelease(benchmark::State& state) {
  auto device = std::move(SimDevice::Create({.capacity = kTiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  auto runtime = std::move(Runtime::Create(alloc.get())).value();
  const TensorId id =
      std::move(runtime->Create(kMiB, TensorOptions{.allow_offload = true})).value().id();
  for (auto _ : state) {
    absl::StatusOr<Guard> g = runtime->Acquire(id);
    benchmark::DoNotOptimize(g->ptr());
  }
  state.SetLabel("ns per Acquire+Release");
}
BENCHMARK(BM_AcquireRelease)->Name("acquire_release/resident");

void BM_AllocFreeReference(benchmark::State& state) {
  auto device = std::move(SimDevice::Create({.capacity = kTiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  for (auto _ : state) {
    void* p = *alloc->Allocate(kMiB);
    benchmark::DoNotOptimize(p);
    (void)alloc->Free(p);
  }
  state.SetLabel("reference: allocator alloc+free of the same size");
}
BENCHMARK(BM_AllocFreeReference)->Name("acquire_release/reference_alloc_free");

std::vector<policies::Candidate> MakeCandidates(int n) {
  std::mt19937_64 rng(42);
  std::vector<policies::Candidate> c(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& x = c[static_cast<std::size_t>(i)];
    x.id = static_cast<std::uint64_t>(i);
    x.bytes = 512 * (1 + rng() % 65536);
    x.compute_ns = static_cast<std::int64_t>(rng() % 1'000'000);
    x.transfer_ns = static_cast<std::int64_t>(x.bytes / 25);
    x.can_drop = true;
    x.can_offload = rng() % 2 == 0;
    x.last_access_ns = static_cast<std::int64_t>(rng() % 1'000'000'000);
    x.neighbourhood_ns = static_cast<std::int64_t>(rng() % 100'000);
  }
  return c;
}

void BM_Choose(benchmark::State& state, const char* spec) {
  const std::vector<policies::Candidate> candidates = MakeCandidates(10000);
  auto policy = std::move(policies::Create(spec)).value();
  policies::PressureContext ctx;
  ctx.bytes_needed = 64 * kMiB;
  ctx.now_ns = 2'000'000'000;
  ctx.candidates = candidates;
  for (auto _ : state) benchmark::DoNotOptimize(policy->Choose(ctx));
  state.SetLabel("one decision over 10,000 candidates");
}
BENCHMARK_CAPTURE(BM_Choose, lru, "lru")->Name("choose/lru/10000")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Choose, largest, "largest")
    ->Name("choose/largest/10000")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Choose, dtr, "dtr")->Name("choose/dtr/10000")->Unit(benchmark::kMicrosecond);

void BM_SortReference(benchmark::State& state) {
  const std::vector<policies::Candidate> candidates = MakeCandidates(10000);
  for (auto _ : state) {
    std::vector<policies::Candidate> copy = candidates;
    std::sort(copy.begin(), copy.end(),
              [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetLabel("reference: copy and sort 10,000 candidates by size");
}
BENCHMARK(BM_SortReference)->Name("choose/reference_sort/10000")->Unit(benchmark::kMicrosecond);

void BM_ParseOpTrace(benchmark::State& state) {
  std::ifstream in(std::string(REMAT_EXAMPLE_TRACES_DIR) + "/transformer_small.jsonl");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::size_t records = 0;
  for (auto _ : state) {
    absl::StatusOr<OpTrace> trace = ParseOpTrace(text, "transformer_small.jsonl");
    if (!trace.ok()) {
      state.SkipWithError("cannot parse the shipped trace");
      return;
    }
    records += trace->records.size();
  }
  state.counters["records_per_second"] =
      benchmark::Counter(static_cast<double>(records), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(text.size() * state.iterations()));
}
BENCHMARK(BM_ParseOpTrace)->Name("parse/transformer_small")->Unit(benchmark::kMicrosecond);

// A shipped trace under examples/traces, read once (empty where it is missing:
// RunReplay then skips with an error).
const OpTrace& ShippedTrace(const std::string& name) {
  static auto* traces = new absl::flat_hash_map<std::string, OpTrace>();
  auto [it, inserted] = traces->try_emplace(name);
  if (inserted) {
    std::ifstream in(std::string(REMAT_EXAMPLE_TRACES_DIR) + "/" + name);
    std::stringstream buffer;
    buffer << in.rdbuf();
    absl::StatusOr<OpTrace> parsed = ParseOpTrace(buffer.str(), name);
    if (parsed.ok()) it->second = std::move(*parsed);
  }
  return it->second;
}

const OpTrace& TransformerTrace() { return ShippedTrace("transformer_small.jsonl"); }

// A chain of n layers, forward then backward: each forward activation is kept
// for the backward pass, so the tensor table grows to n activations.
OpTrace ChainTrace(int n) {
  std::string text = "{\"op\":\"constant\",\"id\":\"x0\",\"bytes\":1048576}\n";
  for (int i = 1; i <= n; ++i) {
    text += "{\"op\":\"call\",\"name\":\"f\",\"inputs\":[\"x" + std::to_string(i - 1) +
            "\"],\"outputs\":[{\"id\":\"x" + std::to_string(i) +
            "\",\"bytes\":1048576}],\"cost_ns\":50000}\n";
  }
  text += "{\"op\":\"constant\",\"id\":\"g" + std::to_string(n) + "\",\"bytes\":1048576}\n";
  for (int i = n; i >= 1; --i) {
    text += "{\"op\":\"call\",\"name\":\"df\",\"inputs\":[\"g" + std::to_string(i) + "\",\"x" +
            std::to_string(i - 1) + "\"],\"outputs\":[{\"id\":\"g" + std::to_string(i - 1) +
            "\",\"bytes\":1048576}],\"cost_ns\":100000}\n";
    text += "{\"op\":\"release\",\"id\":\"g" + std::to_string(i) + "\"}\n";
    text += "{\"op\":\"release\",\"id\":\"x" + std::to_string(i) + "\"}\n";
  }
  absl::StatusOr<OpTrace> parsed = ParseOpTrace(text, "chain");
  return parsed.ok() ? std::move(*parsed) : OpTrace{};
}

// How a budgeted replay counts and evicts: the simulator's default (reserved
// bytes, drops and offloads, the offload guard), or as DTR's simulator runs
// (live bytes, drops only: one run, the loop scripts/sim_speed_vs_dtr.py times).
enum class Accounting { kReserved, kLiveDropsOnly };

// Replays `trace` under `ratio` x its unlimited peak (reserved or live) with
// `policy` (ratio 1: no budget at all) and reports records per second of the
// record loop.
void RunReplay(benchmark::State& state, const OpTrace& trace, const std::string& policy,
               double ratio, Accounting accounting = Accounting::kReserved) {
  if (trace.records.empty()) {
    state.SkipWithError("no trace");
    return;
  }
  OpReplayOptions options;
  options.policy = policy;
  if (ratio < 1) {
    absl::StatusOr<OpReplayReport> unlimited = ReplayOpTrace(trace, options);
    if (!unlimited.ok()) {
      state.SkipWithError("unlimited replay failed");
      return;
    }
    if (accounting == Accounting::kReserved) {
      options.budget = static_cast<std::size_t>(
          ratio * static_cast<double>(unlimited->peak_reserved_bytes));
    } else {
      options.live_budget = static_cast<std::size_t>(
          ratio * static_cast<double>(unlimited->peak_live_bytes));
      options.enable_offload = false;
      options.thrash_limit = 999;
    }
  }
  double seconds = 0;
  std::uint64_t records = 0, evictions = 0;
  for (auto _ : state) {
    absl::StatusOr<OpReplayReport> report = ReplayOpTrace(trace, options);
    if (!report.ok() || report->status != "ok") {
      state.SkipWithError(report.ok() ? report->message.c_str() : "replay failed");
      return;
    }
    seconds += report->replay_seconds;
    records += report->records;
    evictions = report->evictions;
  }
  // The record loop alone: set-up (device, allocator) is not replay speed.
  state.counters["records_per_second"] = static_cast<double>(records) / seconds;
  state.counters["evictions"] = static_cast<double>(evictions);
}

void BM_ReplayTransformer(benchmark::State& state, const char* policy, double ratio) {
  RunReplay(state, TransformerTrace(), policy, ratio);
}
BENCHMARK_CAPTURE(BM_ReplayTransformer, unlimited, "lru", 1.0)
    ->Name("replay/transformer_small/reference_unlimited")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ReplayTransformer, lru, "lru", 0.5)
    ->Name("replay/transformer_small/lru/0.5")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ReplayTransformer, dtr, "dtr", 0.5)
    ->Name("replay/transformer_small/dtr/0.5")
    ->Unit(benchmark::kMicrosecond);

// DenseNet-121 (batch 8), recorded from torchvision: concatenations, calls with many inputs.
void BM_ReplayDensenet(benchmark::State& state, const char* policy, double ratio) {
  RunReplay(state, ShippedTrace("densenet121_b8.jsonl"), policy, ratio);
}
BENCHMARK_CAPTURE(BM_ReplayDensenet, unlimited, "dtr-eq", 1.0)
    ->Name("replay/densenet121_b8/reference_unlimited")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ReplayDensenet, dtr_eq, "dtr-eq", 0.5)
    ->Name("replay/densenet121_b8/dtr-eq/0.5")
    ->Unit(benchmark::kMicrosecond);
void BM_ReplayDensenetLive(benchmark::State& state, const char* policy, double ratio) {
  RunReplay(state, ShippedTrace("densenet121_b8.jsonl"), policy, ratio,
            Accounting::kLiveDropsOnly);
}
BENCHMARK_CAPTURE(BM_ReplayDensenetLive, dtr_eq, "dtr-eq", 0.5)
    ->Name("replay/densenet121_b8/dtr-eq/live_0.5_drops")
    ->Unit(benchmark::kMicrosecond);

void BM_ReplayChain(benchmark::State& state, const char* policy) {
  static const OpTrace* chains[2] = {nullptr, nullptr};
  const int n = static_cast<int>(state.range(0));
  const OpTrace*& trace = chains[n > 1000 ? 1 : 0];
  if (trace == nullptr) trace = new OpTrace(ChainTrace(n));
  RunReplay(state, *trace, policy, 0.5);
}
BENCHMARK_CAPTURE(BM_ReplayChain, lru, "lru")->Name("replay/chain/lru")->Arg(1000)->Arg(20000)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayChain, lru_sampled, "lru:sample=sqrt")
    ->Name("replay/chain/lru:sample=sqrt")->Arg(1000)->Arg(20000)
    ->Unit(benchmark::kMillisecond);

// GPT-2 small (batch 8, seq 1024), 720 training steps in a row.
const OpTrace& Gpt2Steps() {
  static const OpTrace* trace = [] {
    absl::StatusOr<GeneratedTrace> g = GenerateModelTrace("gpt2:layers=12,steps=720");
    if (!g.ok()) return new OpTrace();
    absl::StatusOr<OpTrace> parsed = ParseOpTrace(g->text, "gpt2_720_steps");
    return new OpTrace(parsed.ok() ? std::move(*parsed) : OpTrace{});
  }();
  return *trace;
}

void BM_ReplayGpt2Steps(benchmark::State& state, const char* policy, double ratio) {
  RunReplay(state, Gpt2Steps(), policy, ratio);
}
BENCHMARK_CAPTURE(BM_ReplayGpt2Steps, unlimited, "dtr-eq", 1.0)
    ->Name("replay/gpt2_720_steps/reference_unlimited")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayGpt2Steps, dtr_eq_05, "dtr-eq", 0.5)
    ->Name("replay/gpt2_720_steps/dtr-eq/0.5")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayGpt2Steps, dtr_eq_09, "dtr-eq", 0.9)
    ->Name("replay/gpt2_720_steps/dtr-eq/0.9")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayGpt2Steps, hybrid_05, "hybrid", 0.5)
    ->Name("replay/gpt2_720_steps/hybrid/0.5")
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace remat

BENCHMARK_MAIN();
