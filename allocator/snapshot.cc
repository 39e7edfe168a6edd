#include "allocator/snapshot.h"

#include "absl/strings/str_format.h"
#include "base/json_writer.h"

namespace remat {

const char* BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kActiveAllocated: return "active_allocated";
    case BlockState::kActivePendingFree: return "active_pending_free";
    case BlockState::kInactive: return "inactive";
  }
  return "?";
}

const char* TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
    case TraceAction::kOom: return "oom";
  }
  return "?";
}

std::string SnapshotToJson(const Snapshot& snapshot) {
  JsonWriter w;
  w.BeginObject();
  w.Key("device").String(snapshot.device);
  w.Key("budget").Uint(snapshot.budget);
  w.Key("segments").BeginArray();
  for (const SegmentInfo& seg : snapshot.segments) {
    w.BeginObject();
    w.Key("address").Uint(seg.address);
    w.Key("total_size").Uint(seg.total_size);
    w.Key("allocated_size").Uint(seg.allocated_size);
    w.Key("active_size").Uint(seg.active_size);
    w.Key("requested_size").Uint(seg.requested_size);
    w.Key("segment_type").String(seg.is_large ? "large" : "small");
    w.Key("is_expandable").Bool(seg.is_expandable);
    w.Key("stream").Uint(seg.stream.handle);
    w.Key("blocks").BeginArray();
    for (const BlockInfo& b : seg.blocks) {
      w.BeginObject();
      w.Key("address").Uint(b.address);
      w.Key("size").Uint(b.size);
      w.Key("requested_size").Uint(b.requested_size);
      w.Key("state").String(BlockStateName(b.state));
      w.Key("stream").Uint(b.stream.handle);
      if (b.owner != 0) w.Key("owner").Uint(b.owner);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("events").BeginArray();
  for (const TraceEvent& e : snapshot.events) {
    w.BeginObject();
    w.Key("action").String(TraceActionName(e.action));
    w.Key("addr").Uint(e.address);
    w.Key("size").Uint(e.size);
    w.Key("requested_size").Uint(e.requested_size);
    w.Key("stream").Uint(e.stream.handle);
    w.Key("time_ns").Int(e.time_ns);
    w.EndObject();
  }
  w.EndArray();
  w.Key("stats").Raw(StatsToJson(snapshot.stats));
  w.EndObject();
  return w.Take();
}

}  // namespace remat
