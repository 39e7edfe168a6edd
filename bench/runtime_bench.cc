// Runtime and simulator hot paths, each against a reference in the same run:
//
//   acquire_release/resident   Acquire + Release of a resident tensor, the
//                              runtime's fast path (reference: an allocator
//                              Allocate + Free pair of the same size)
//   choose/POLICY/10000        one eviction decision over 10,000 candidates
//                              (reference: sorting the same candidates by size)
//   parse/transformer_small    op-trace records parsed per second
#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "benchmark/benchmark.h"
#include "policies/registry.h"
#include "runtime/runtime.h"
#include "sim/op_trace.h"

namespace remat {
namespace {

void BM_AcquireRelease(benchmark::State& state) {
  auto device = std::move(SimDevice::Create({.capacity = kTiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get())).value();
  auto runtime = std::move(Runtime::Create(alloc.get())).value();
  TensorOptions options;
  options.allow_offload = true;
  const TensorId id = std::move(runtime->Create(kMiB, std::move(options))).value().id();
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

}  // namespace
}  // namespace remat

BENCHMARK_MAIN();
