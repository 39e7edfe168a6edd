// allocator_bench: remat's CachingAllocator against glibc malloc, jemalloc and
// mimalloc, on the same operation sequences in the same run.
//
//   churn/SIZE/ALLOC        one allocate + free of SIZE bytes per iteration (ns per pair)
//   random/4096ops/ALLOC    RMM-style random allocate/free sequence (ns per call)
//   replay/NAME/ALLOC       an RMM log replayed in log order (ns per call)
//
// After Google Benchmark's own output it prints, per benchmark, the ns per
// operation of each allocator and remat's ratio to each reference (ours /
// theirs: below 1, remat is faster), then the floors the issue sets.
//
// Flags of ours (everything else goes to Google Benchmark):
//   --remat_out=DIR     also write DIR/ratios.{json,csv,md}
//   --remat_trace=PATH  the RMM log to replay (default: examples/traces/training_step.csv)
//   --remat_random_ops=N  steps of the random sequence (default 4096)
//
// Host memory is never touched by the loops: they compare the allocators'
// bookkeeping, like for like, since remat's device memory is unbacked (address
// ranges only) and cannot be touched at all.
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/json_writer.h"
#include "base/units.h"
#include "bench/host_allocators.h"
#include "bench/op_sequence.h"
#include "bench/ratio_report.h"

#ifndef REMAT_BENCH_BUILD_TYPE
#define REMAT_BENCH_BUILD_TYPE "unknown"
#endif
#ifndef REMAT_EXAMPLE_TRACES_DIR
#define REMAT_EXAMPLE_TRACES_DIR "examples/traces"
#endif

namespace remat::bench {
namespace {

// --- The benchmarks. `A` is one of the adapters in host_allocators.h.

template <class A>
void Churn(benchmark::State& state, std::size_t size) {
  A allocator;
  if (!allocator.ok()) {
    state.SkipWithError(allocator.error().c_str());
    return;
  }
  for (auto _ : state) {
    void* p = allocator.Allocate(size);
    benchmark::DoNotOptimize(p);
    if (p == nullptr || !allocator.Free(p)) {
      state.SkipWithError("allocate or free failed");
      break;
    }
  }
  state.counters["ops"] = 1;  // one alloc+free pair
  state.SetItemsProcessed(state.iterations());
}

template <class A>
void Replay(benchmark::State& state, const OpSequence* seq) {
  A allocator;
  if (!allocator.ok()) {
    state.SkipWithError(allocator.error().c_str());
    return;
  }
  std::vector<void*> slots(seq->num_slots, nullptr);
  std::int64_t device_allocs_after_first_pass = 0;
  if constexpr (std::is_same_v<A, RematAllocator>) {
    // One untimed pass fills the cache, as the host allocators' caches are
    // warm from earlier runs; the counters then show whether the timed passes
    // still reserve segments (a cache that fragments keeps reserving).
    for (const Op& op : seq->ops) {
      if (op.size != 0) {
        slots[op.slot] = allocator.Allocate(op.size);
      } else {
        allocator.Free(slots[op.slot]);
      }
    }
    device_allocs_after_first_pass = allocator.device_allocs();
  }
  for (auto _ : state) {
    for (const Op& op : seq->ops) {
      if (op.size != 0) {
        void* p = allocator.Allocate(op.size);
        if (p == nullptr) {
          state.SkipWithError("allocate failed");
          return;
        }
        slots[op.slot] = p;
      } else if (!allocator.Free(slots[op.slot])) {
        state.SkipWithError("free failed");
        return;
      }
    }
    benchmark::ClobberMemory();
  }
  state.counters["ops"] = static_cast<double>(seq->ops.size());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(seq->ops.size()));
  if constexpr (std::is_same_v<A, RematAllocator>) {
    state.counters["reserved_GiB"] = static_cast<double>(allocator.reserved_bytes()) / kGiB;
    state.counters["segments_per_pass"] =
        static_cast<double>(allocator.device_allocs() - device_allocs_after_first_pass) /
        static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  }
}

// Registers GROUP/NAME for each allocator, in this order (the table's columns).
template <class... Allocators, class F>
void RegisterEach(const std::string& group, F body) {
  (benchmark::RegisterBenchmark(
       (group + "/" + Allocators::kName).c_str(),
       [body](benchmark::State& s) { body.template operator()<Allocators>(s); }),
   ...);
}
template <class F>
void RegisterForEach(const std::string& group, F body) {
  RegisterEach<RematAllocator, GlibcMalloc, JemallocMalloc, MimallocMalloc>(group, std::move(body));
}

// --- Context: where the figures came from.

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

std::string Compiler() {
#if defined(__clang__)
  return absl::StrCat("clang ", __clang_version__);
#elif defined(__GNUC__)
  return absl::StrCat("gcc ", __VERSION__);
#else
  return "unknown";
#endif
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

struct Context {
  std::string date = UtcNow();
  std::string cpu = CpuModel();
  long cpus_online = sysconf(_SC_NPROCESSORS_ONLN);
  std::string compiler = Compiler();
  std::string build_type = REMAT_BENCH_BUILD_TYPE;
  std::string allocators;  // VerifyHostAllocators' report
  std::vector<std::pair<std::string, const OpSequence*>> sequences;

  std::string Text() const {
    std::string out = absl::StrFormat(
        "date:       %s\ncpu:        %s (%d online)\ncompiler:   %s\nbuild type: %s\n", date, cpu,
        cpus_online, compiler, build_type);
    absl::StrAppend(&out, "allocators:\n");
    for (absl::string_view line : absl::StrSplit(allocators, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
    absl::StrAppend(&out, "sequences:\n");
    for (const auto& [name, seq] : sequences) {
      absl::StrAppend(
          &out, absl::StrFormat("  %s: %s\n    %d calls per pass (%d allocate, %d free, "
                                "%d of them closing frees), peak live %s\n",
                                name, seq->description, seq->ops.size(), seq->allocations,
                                seq->frees, seq->closing_frees, FormatBytes(seq->peak_live_bytes)));
    }
    return out;
  }

  std::string Json() const {
    JsonWriter w;
    w.BeginObject()
        .Key("date")
        .String(date)
        .Key("cpu")
        .String(cpu)
        .Key("cpus_online")
        .Int(cpus_online)
        .Key("compiler")
        .String(compiler)
        .Key("build_type")
        .String(build_type)
        .Key("allocators")
        .String(allocators);
    w.Key("sequences").BeginArray();
    for (const auto& [name, seq] : sequences) {
      w.BeginObject()
          .Key("name")
          .String(name)
          .Key("description")
          .String(seq->description)
          .Key("calls_per_pass")
          .Uint(seq->ops.size())
          .Key("allocations")
          .Uint(seq->allocations)
          .Key("frees")
          .Uint(seq->frees)
          .Key("closing_frees")
          .Uint(seq->closing_frees)
          .Key("peak_live_bytes")
          .Uint(seq->peak_live_bytes)
          .EndObject();
    }
    w.EndArray().EndObject();
    return w.Take();
  }
};

// Removes --remat_NAME=VALUE from argv; returns VALUE or `fallback`.
std::string TakeFlag(int* argc, char** argv, const std::string& name, std::string fallback) {
  const std::string prefix = "--" + name + "=";
  std::string value = std::move(fallback);
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) {
      value = std::string(arg.substr(prefix.size()));
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return value;
}

bool WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

int Main(int argc, char** argv) {
  const std::string out_dir = TakeFlag(&argc, argv, "remat_out", "");
  const std::string trace_path =
      TakeFlag(&argc, argv, "remat_trace", REMAT_EXAMPLE_TRACES_DIR "/training_step.csv");
  const std::string random_ops = TakeFlag(&argc, argv, "remat_random_ops", "4096");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  Context context;
  if (std::string error; !LoadGlibcMalloc(&error)) {
    std::cerr << "allocator_bench: " << error << "\n";
    return 1;
  }
  if (!VerifyHostAllocators(&context.allocators)) {
    std::cerr << "allocator_bench: the host allocators are not what they should be:\n"
              << context.allocators;
    return 1;
  }

  // Sequences are built before any timing and live until the end.
  RandomSequenceOptions random_options;
  random_options.num_ops = static_cast<std::size_t>(std::strtoull(random_ops.c_str(), nullptr, 10));
  if (random_options.num_ops == 0) {
    std::cerr << "allocator_bench: --remat_random_ops must be a positive number\n";
    return 1;
  }
  const OpSequence random = MakeRandomSequence(random_options);
  OpSequence trace;
  std::string trace_name;
  if (absl::StatusOr<OpSequence> loaded = SequenceFromRmmLog(trace_path); loaded.ok()) {
    trace = *std::move(loaded);
    trace_name = std::filesystem::path(trace_path).stem().string();
  } else {
    std::cerr << "allocator_bench: " << loaded.status().message()
              << "; replaying a synthetic training step instead\n";
    trace = MakeSyntheticTrainingStep();
    trace_name = "synthetic_step";
  }
  const std::string random_group =
      absl::StrCat("random/", random.ops.size() - random.closing_frees, "ops");
  const std::string replay_group = absl::StrCat("replay/", trace_name);
  context.sequences = {{random_group, &random}, {replay_group, &trace}};
  std::cout << context.Text() << std::endl;

  for (std::size_t size : {4 * kKiB, 1 * kMiB, 64 * kMiB}) {
    RegisterForEach(absl::StrCat("churn/", size),
                    [size]<class A>(benchmark::State& s) { Churn<A>(s, size); });
  }
  RegisterForEach(random_group, [&random]<class A>(benchmark::State& s) { Replay<A>(s, &random); });
  RegisterForEach(replay_group, [&trace]<class A>(benchmark::State& s) { Replay<A>(s, &trace); });

  RatioReporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                                               : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  const RatioTable table(reporter.entries());
  const std::vector<Floor> floors = {
      {"(a) remat alloc+free pair under 100 ns", "churn/", 100.0, std::nullopt},
      {"(b) remat no slower than jemalloc", "random/", std::nullopt, std::string("jemalloc")},
  };
  const std::vector<FloorResult> floor_results = table.Check(floors);
  std::cout << "\n"
            << table.FormatText() << "(churn: one op = one alloc+free pair; random and "
            << "replay: one op = one allocate or free call)\n\n"
            << FormatFloorsText(floor_results);
  for (const std::string& e : reporter.errors()) std::cout << "ERROR " << e << "\n";

  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    const std::filesystem::path dir(out_dir);
    std::string md = absl::StrCat(
        "## Context\n\n```\n", context.Text(), "```\n\n", "## ns per operation and ratios\n\n",
        "churn: one op = one alloc+free pair; random and replay: one op "
        "= one allocate or free call. ns/op is thread CPU time (system time "
        "included), the median over repetitions (min–max in "
        "brackets). Ratio = remat / reference, of the medians (below "
        "1: remat is faster).\n\n",
        table.FormatMarkdown(), "\n## Floors\n\n", FormatFloorsMarkdown(floor_results));
    if (!WriteFile(dir / "ratios.json", table.FormatJson(context.Json(), floor_results)) ||
        !WriteFile(dir / "ratios.csv", table.FormatCsv()) || !WriteFile(dir / "ratios.md", md)) {
      std::cerr << "allocator_bench: cannot write to " << out_dir << "\n";
      return 1;
    }
    std::cout << "wrote " << (dir / "ratios.{json,csv,md}").string() << "\n";
  }
  return reporter.errors().empty() ? 0 : 1;
}

}  // namespace
}  // namespace remat::bench

int main(int argc, char** argv) { return remat::bench::Main(argc, argv); }
