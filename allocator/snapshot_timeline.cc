#include "allocator/snapshot_timeline.h"

#include <cstdint>
#include <string_view>

#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/json_writer.h"

namespace remat {
namespace {

struct Levels {
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
};

// How one event moves the two counters.
Levels DeltaOf(const TraceEvent& event) {
  const auto size = static_cast<std::int64_t>(event.size);
  switch (event.action) {
    case TraceAction::kAlloc: return {size, 0};
    case TraceAction::kFreeRequested: return {-size, 0};
    case TraceAction::kSegmentAlloc: return {0, size};
    case TraceAction::kSegmentFree: return {0, -size};
    case TraceAction::kSegmentMap: return {0, size};
    case TraceAction::kSegmentUnmap: return {0, -size};
    case TraceAction::kFreeCompleted:
    case TraceAction::kOom: return {};
  }
  return {};
}

// The levels before the first event: the current ones less every event's move.
Levels StartingLevels(const Snapshot& snapshot) {
  Levels levels{snapshot.stats.allocated_bytes.all().current,
                snapshot.stats.reserved_bytes.all().current};
  for (const TraceEvent& event : snapshot.events) {
    const Levels delta = DeltaOf(event);
    levels.allocated -= delta.allocated;
    levels.reserved -= delta.reserved;
  }
  return levels;
}

// Microseconds with the nanoseconds kept, without going through a double.
std::string Microseconds(std::int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const std::uint64_t magnitude = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : ns;
  return absl::StrFormat("%s%d.%03d", sign, magnitude / 1000, magnitude % 1000);
}

void WriteProcessName(std::string_view name, JsonWriter& w) {
  w.BeginObject();
  w.Key("name").String("process_name").Key("ph").String("M").Key("pid").Int(0).Key("tid").Int(0);
  w.Key("args").BeginObject().Key("name").String(name).EndObject();
  w.EndObject();
}

void WriteCounter(const char* track, std::int64_t time_ns, std::int64_t bytes, JsonWriter& w) {
  w.BeginObject();
  w.Key("name").String(track).Key("ph").String("C");
  w.Key("ts").Raw(Microseconds(time_ns));
  w.Key("pid").Int(0).Key("tid").Int(0);
  w.Key("args").BeginObject().Key("bytes").Int(bytes).EndObject();
  w.EndObject();
}

void WriteCounters(const Snapshot& snapshot, JsonWriter& w) {
  Levels levels = StartingLevels(snapshot);
  const std::int64_t start = snapshot.events.empty() ? 0 : snapshot.events.front().time_ns;
  WriteCounter(kAllocatedTrack, start, levels.allocated, w);
  WriteCounter(kReservedTrack, start, levels.reserved, w);
  for (const TraceEvent& event : snapshot.events) {
    const Levels delta = DeltaOf(event);
    if (delta.allocated != 0) {
      levels.allocated += delta.allocated;
      WriteCounter(kAllocatedTrack, event.time_ns, levels.allocated, w);
    }
    if (delta.reserved != 0) {
      levels.reserved += delta.reserved;
      WriteCounter(kReservedTrack, event.time_ns, levels.reserved, w);
    }
  }
}

}  // namespace

std::string SnapshotToTimelineJson(const Snapshot& snapshot) {
  JsonWriter w;
  w.BeginObject();
  w.Key("traceEvents").BeginArray();
  WriteProcessName(snapshot.device, w);
  WriteCounters(snapshot, w);
  w.EndArray();
  w.Key("displayTimeUnit").String("ms");
  w.EndObject();
  return w.Take();
}

absl::Status WriteSnapshotTimeline(const Snapshot& snapshot, const std::string& path) {
  return WriteFile(path, SnapshotToTimelineJson(snapshot));
}

}  // namespace remat
