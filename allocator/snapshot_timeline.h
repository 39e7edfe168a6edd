// Allocated and reserved bytes over time, worked out from a snapshot's event
// history, as a Chrome trace that https://ui.perfetto.dev and chrome://tracing
// open (JSON object format): two counter tracks, one sample per event that
// moves them.
//
//   {"traceEvents":[
//     {"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"<device>"}},
//     {"name":"allocated bytes","ph":"C","ts":T,"pid":0,"tid":0,"args":{"bytes":N}},
//     {"name":"reserved bytes","ph":"C","ts":T,"pid":0,"tid":0,"args":{"bytes":N}}, ...],
//    "displayTimeUnit":"ms"}
//
// ts is the event's device time in microseconds (on a replay, the log's
// clock). Allocated bytes move with `alloc` (+ block size) and
// `free_requested` (-), reserved bytes with `segment_alloc` and
// `segment_free`, exactly as the allocator's statistics move. The levels
// before the first event are worked back from the snapshot's statistics, so a
// history that lost its oldest events to the ring still starts at the right
// level; the first sample of each track is at the first event's time (0
// without events).
#ifndef REMAT_ALLOCATOR_SNAPSHOT_TIMELINE_H_
#define REMAT_ALLOCATOR_SNAPSHOT_TIMELINE_H_

#include <string>

#include "absl/status/status.h"
#include "allocator/snapshot.h"

namespace remat {

inline constexpr char kAllocatedTrack[] = "allocated bytes";
inline constexpr char kReservedTrack[] = "reserved bytes";

std::string SnapshotToTimelineJson(const Snapshot& snapshot);

// Writes SnapshotToTimelineJson(snapshot) to `path`; errors as base/file.h's WriteFile.
absl::Status WriteSnapshotTimeline(const Snapshot& snapshot, const std::string& path);

}  // namespace remat

#endif  // REMAT_ALLOCATOR_SNAPSHOT_TIMELINE_H_
