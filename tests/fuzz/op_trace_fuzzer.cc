// libFuzzer target: any text given to the op-trace parser either parses into
// a self-consistent trace or fails with an error naming the trace; it never
// crashes. A trace that parses replays, unlimited and under half its peak,
// ending ok, oom or thrash, never with an error, with the allocator's and the
// runtime's invariants checked after every record.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sim/op_replay.h"
#include "trace/op_trace.h"

namespace {

bool Broken(const absl::Status& s) {
  return s.message().find("a broken invariant") != absl::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<remat::OpTrace> trace = remat::ParseOpTrace(text, "fuzz.jsonl");
  if (!trace.ok()) {
    if (trace.status().message().find("fuzz.jsonl") == absl::string_view::npos) __builtin_trap();
    return 0;
  }
  for (const remat::OpRecord& r : trace->records) {
    for (std::uint32_t t : r.inputs) {
      if (t >= trace->tensors.size()) __builtin_trap();
    }
    for (std::uint32_t t : r.outputs) {
      if (t >= trace->tensors.size()) __builtin_trap();
    }
  }
  if (trace->least_budget_bytes > trace->peak_live_bytes) __builtin_trap();
  if (trace->calls == 0 || trace->peak_live_bytes > (std::uint64_t{1} << 40)) return 0;
  remat::OpReplayOptions options;
  options.check_invariants = true;  // the allocator and the runtime after every record
  absl::StatusOr<remat::OpReplayReport> unlimited = remat::ReplayOpTrace(*trace, options);
  if (!unlimited.ok()) {
    if (Broken(unlimited.status())) __builtin_trap();
    return 0;  // a trace the replay refuses, saying why
  }
  options.live_budget = unlimited->peak_live_bytes / 2 + 1;
  options.thrash_limit = 4;
  absl::StatusOr<remat::OpReplayReport> half = remat::ReplayOpTrace(*trace, options);
  if (!half.ok() && Broken(half.status())) __builtin_trap();
  if (half.ok() && half->status != "ok" && half->status != "oom" && half->status != "thrash") {
    __builtin_trap();
  }
  return 0;
}
