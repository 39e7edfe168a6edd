// SimTimeline: an op-trace replay (`remat sim --timeline`) on the simulated
// device's clock, as a Chrome trace in the JSON object format, which
// https://ui.perfetto.dev and chrome://tracing open:
//
//   {"traceEvents":[
//     {"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"<trace>, <policy>, ..."}},
//     {"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"compute stream"}}, ...
//     {"name":"reserved bytes","ph":"C","ts":T,"pid":0,"tid":0,"args":{"bytes":N}},
//     {"name":"mm","cat":"compute","ph":"X","ts":T,"dur":D,"pid":0,"tid":1,"args":{"line":12}},
//     {"name":"drop","cat":"eviction","ph":"i","s":"t","ts":T,"pid":0,"tid":3,
//      "args":{"tensor":"x1","bytes":N}}, ...],
//    "displayTimeUnit":"ms"}
//
// ts and dur are microseconds of the SimDevice's virtual clock, written with
// their nanoseconds ("12.345"), so a run's timeline is deterministic. Events
// come out in time order (stable: equal times keep the order they happened in).
//
// Tracks:
//   counters (tid 0)    "reserved bytes" (the allocator's segments), "live bytes"
//                       (resident tensors, the runtime's resident_bytes) and
//                       "host bytes" (offloaded tensors held in pinned host
//                       memory): one sample per record that moves them, taken
//                       after the record and stamped with the time the record
//                       started on the compute stream, plus one at time 0 and
//                       one at the end of the run. Levels inside a record (a
//                       recompute cascade's transient peak) are not sampled.
//   compute stream (1)  slices, in the order the stream runs them:
//                       cat "compute": a call, named by its op (args: line);
//                       cat "recompute": "recompute <op>" (args: tensor);
//                       cat "copy": "restore", a copy back on access (args:
//                       tensor, bytes). A gap between slices is stall.
//   copy stream (2)     cat "copy": "offload" (device to host) and "copy
//                       ahead" (device to host before the eviction, the
//                       tensor resident until then: copy_ahead) (args:
//                       tensor, bytes).
//   prefetch stream (4) cat "copy": "prefetch" (host to device ahead of use),
//                       on the other copy engine: it may overlap offloads.
//   evictions (3)       instants: "offload" and "drop" (cat "eviction": the
//                       policy's evictions under pressure, and the trace's
//                       own with args.directed, as many as the
//                       report's evictions) and "released drop" (cat
//                       "release": a tensor its program released, its bytes
//                       dropped but kept recomputable for a closure that reads
//                       it) (args: tensor, bytes).
//   global              an "oom" or "thrash" instant (args: message) where the
//                       run stopped, when it did not finish.
//
// Slices are exact: a slice ends where the stream's clock stood right after
// the work was enqueued, and starts its cost earlier. An offload instant is
// at the compute stream's time when the runtime queued the copy out, and a
// drop at the compute stream's time when the runtime dropped it. The replay
// learns all of it from the runtime's events (runtime/observer.h).
#ifndef REMAT_SIM_SIM_TIMELINE_H_
#define REMAT_SIM_SIM_TIMELINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "device/device.h"
#include "device/sim_device.h"
#include "trace/op_trace.h"

namespace remat {

// Counter track names (the reserved one is allocator/snapshot_timeline.h's).
inline constexpr char kLiveBytesTrack[] = "live bytes";
inline constexpr char kHostBytesTrack[] = "host bytes";

class SimTimeline {
 public:
  enum class Kind : std::uint8_t {
    // Slices.
    kCompute,    // `index` is the call's record
    kRecompute,  // `index` is the tensor regenerated
    kRestore,    // host to device on the compute stream; `index` the tensor (or kNoOpIndex)
    kPrefetch,   // host to device ahead of use, on the prefetch stream
    kOffload,    // device to host
    kCopyAhead,  // device to host, ahead of the eviction (copy_ahead)
    kCopy,       // any other copy
    // Instants (`index` is the tensor, or kNoOpIndex when unknown).
    kEvictOffload,
    kEvictDrop,
    kReleasedDrop,
  };
  struct Entry {
    std::int64_t ts_ns = 0;
    std::int64_t dur_ns = 0;  // slices only
    std::uint64_t bytes = 0;  // copies and instants
    std::uint32_t index = kNoOpIndex;
    Kind kind = Kind::kCompute;
    bool directed = false;  // kEvictOffload, kEvictDrop: the trace's evict record asked for it
  };
  struct Sample {
    std::int64_t ts_ns = 0;
    std::uint64_t reserved = 0;
    std::uint64_t live = 0;
    std::uint64_t host = 0;
  };

  void Clear();
  // The process name the trace shows.
  void SetTitle(std::string title) { title_ = std::move(title); }
  void Add(const Entry& entry) { entries_.push_back(entry); }
  // Entries so far; SetKind relabels the one Add put at `index`.
  std::size_t num_entries() const { return entries_.size(); }
  void SetKind(std::size_t index, Kind kind) { entries_.at(index).kind = kind; }
  void AddSample(const Sample& sample) { samples_.push_back(sample); }
  // The run stopped early: "oom" or "thrash", why, and when.
  void SetEnd(std::string status, std::string message, std::int64_t ts_ns);

  const std::vector<Entry>& entries() const { return entries_; }
  const std::vector<Sample>& samples() const { return samples_; }
  const std::string& end_status() const { return end_status_; }

  // The Chrome trace; names come from `trace`, the trace that was replayed.
  std::string ToJson(const OpTrace& trace) const;
  // Writes ToJson(trace) to `path`; errors as base/file.h's WriteFile.
  absl::Status Write(const OpTrace& trace, const std::string& path) const;

 private:
  std::string title_;
  std::vector<Entry> entries_;
  std::vector<Sample> samples_;
  std::string end_status_;  // "" when the run finished
  std::string end_message_;
  std::int64_t end_ns_ = 0;
};

}  // namespace remat

#endif  // REMAT_SIM_SIM_TIMELINE_H_
