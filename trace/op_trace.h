// Op-level traces: what a program computed, tensor by tensor, as JSON Lines.
//
// One record per line; blank lines are allowed and unknown fields are ignored:
//
//   {"op":"constant","id":"w1","bytes":4096}
//   {"op":"call","name":"mm","inputs":["w1","x0"],
//    "outputs":[{"id":"x1","bytes":1048576}],"cost_ns":52000}
//   {"op":"call","name":"view","inputs":["x1"],"outputs":[{"id":"v1","alias_of":"x1"}],
//    "cost_ns":0}
//   {"op":"use","ids":["x1","v1"]}
//   {"op":"release","id":"x1"}
//   {"op":"phase","name":"backward"}
//   {"op":"evict","id":"x1","action":"drop"}
//   {"op":"prefetch","id":"x1"}
//
// - `constant` defines an input or parameter: resident, never evicted.
// - `call` runs op `name` on `inputs` (ids, possibly repeated, possibly none)
//   and defines one or more `outputs`. Re-running the call on its inputs
//   regenerates its outputs, which is what makes them recomputable. In-place
//   operations are written as calls that produce a new version.
// - An output with `alias_of` is a view: it shares the storage of the live
//   tensor it names (a view of a view shares the root's storage) and has no
//   bytes of its own (`bytes` is then ignored). Otherwise `bytes` is required.
// - `use` reads tensors outside any call (the program looks at them).
// - `release` drops the program's last reference to a tensor, constants
//   included. A storage lives until its root and all its views are released.
// - `phase` is a marker ("forward", "backward", ...).
// - `evict` asks for the live tensor's storage to leave the device now, by
//   `action` ("drop" or "offload"), as the program's own choice rather than a
//   policy's (a plan made ahead: `python -m remat.optimal --plan-out`). Its
//   next use brings it back as after any eviction. Constants cannot be
//   evicted. A replay under a budget carries it out where the storage is
//   resident and the run allows the action (Runtime::Evict), and skips it
//   otherwise; one without a budget (the reference run) skips it, as it
//   skips prefetches.
// - `prefetch` brings a tensor back ahead of its next use: an offloaded one
//   starts its copy back, a dropped one is recomputed then (a no-op where it
//   is resident).
//
// Required fields: `op`; `id` and `bytes` (constant); `name`, `inputs`,
// `outputs` and `cost_ns` (call); `ids` (use); `id` (release, prefetch);
// `name` (phase); `id` and `action` (evict).
// Ids are non-empty strings, each defined once in the whole trace (never
// reused, even after a release); bytes and costs are non-negative integers.
// Where an object repeats a key, the first one counts.
//
// The parser reads the whole trace before anything is replayed, so a bad line
// anywhere means no replay at all. Every error is InvalidArgument naming the
// line: "trace.jsonl:17: call 'mm' reads 'x9', which was released at line 12".
// Tensors, records and op names are dense indices, so a replayer keeps its
// per-tensor state in flat arrays.
#ifndef REMAT_TRACE_OP_TRACE_H_
#define REMAT_TRACE_OP_TRACE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

namespace remat {

enum class OpKind : std::uint8_t { kConstant, kCall, kUse, kRelease, kPhase, kEvict, kPrefetch };

// "constant", "call", "use", "release", "phase", "evict", "prefetch": the
// `op` field's spelling.
std::string_view OpKindName(OpKind kind);

// A missing index: a record without a name, a tensor never released, a root's alias_of.
inline constexpr std::uint32_t kNoOpIndex = UINT32_MAX;

struct OpTensor {
  std::string id;
  // The bytes of its own storage; 0 for a view (tensors[storage].bytes has them).
  std::uint64_t bytes = 0;
  // The tensor owning the storage it lives in: itself, unless a view.
  std::uint32_t storage = 0;
  // The tensor a view was made from (a view itself, for a view of a view);
  // kNoOpIndex for a tensor with storage of its own.
  std::uint32_t alias_of = kNoOpIndex;
  std::uint32_t producer = 0;              // the constant or call record defining it
  std::uint32_t released_by = kNoOpIndex;  // its release record; kNoOpIndex if live at the end
  bool constant = false;                   // defined by a `constant` record

  bool is_view() const { return alias_of != kNoOpIndex; }
};

struct OpRecord {
  OpKind kind = OpKind::kCall;
  std::uint32_t line = 0;           // 1-based line in the trace
  std::uint32_t name = kNoOpIndex;  // index into OpTrace::names: a call's op or a phase's name
  std::int64_t cost_ns = 0;         // calls only
  bool offload = false;             // evict records: "offload" (else "drop")
  // Tensor indices. A call reads `inputs` and defines `outputs`; a constant
  // defines its one output; a use reads `inputs`; a release drops its one
  // input; an evict or a prefetch names its one input.
  // (Most records have a few of each: these keep up to 4 without allocating.)
  absl::InlinedVector<std::uint32_t, 4> inputs;
  absl::InlinedVector<std::uint32_t, 4> outputs;
};

struct OpTrace {
  std::string name;                // for messages: the file name
  std::vector<OpTensor> tensors;   // in order of definition
  std::vector<OpRecord> records;   // in trace order (blank lines have none)
  std::vector<std::string> names;  // op and phase names, by first appearance

  std::uint64_t calls = 0;
  std::uint64_t constants = 0;
  std::uint64_t views = 0;
  std::uint64_t evicts = 0;      // evict records
  std::uint64_t prefetches = 0;  // prefetch records
  std::uint64_t total_cost_ns = 0;   // sum over calls
  std::uint64_t constant_bytes = 0;  // sum over constants
  // Peak of the sum of live storage bytes, constants included, running the
  // trace as written (no eviction); views add nothing. A call's outputs are
  // counted while its inputs are still live.
  std::uint64_t peak_live_bytes = 0;
  std::uint32_t peak_record = kNoOpIndex;  // the first record after which the peak is reached
  std::uint64_t live_bytes_at_end = 0;
  // The least live budget the trace could run in: the largest, over calls, of
  // the bytes of a call's inputs and outputs (distinct storages) plus the
  // constants live then, which nothing evicts (a lower bound: a recompute may
  // need more at once). least_budget_record: the call that sets it.
  std::uint64_t least_budget_bytes = 0;
  std::uint32_t least_budget_record = kNoOpIndex;
};

// Parses `text` (a whole trace). `name` prefixes error messages. InvalidArgument
// on any malformed or inconsistent line.
absl::StatusOr<OpTrace> ParseOpTrace(std::string_view text, std::string_view name);

// Reads and parses the file at `path`. NotFound when it cannot be opened.
absl::StatusOr<OpTrace> ReadOpTrace(const std::string& path);

// The tensor with id `id`, by linear search (for tests and tools, not hot paths).
std::optional<std::uint32_t> FindOpTensor(const OpTrace& trace, std::string_view id);

}  // namespace remat

#endif  // REMAT_TRACE_OP_TRACE_H_
