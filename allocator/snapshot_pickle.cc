#include "allocator/snapshot_pickle.h"

#include "base/file.h"
#include "base/pickle_writer.h"

namespace remat {
namespace {

constexpr int kDeviceIndex = 0;

void WriteBlock(const BlockInfo& block, PickleWriter& p) {
  p.BeginDict();
  p.Key("address").Uint(block.address);
  p.Key("size").Uint(block.size);
  p.Key("requested_size").Uint(block.requested_size);
  p.Key("state").String(BlockStateName(block.state));
  p.Key("frames").BeginList().EndList();
  p.EndDict();
}

void WriteSegment(const SegmentInfo& segment, PickleWriter& p) {
  p.BeginDict();
  p.Key("device").Int(kDeviceIndex);
  p.Key("address").Uint(segment.address);
  p.Key("total_size").Uint(segment.total_size);
  p.Key("allocated_size").Uint(segment.allocated_size);
  p.Key("active_size").Uint(segment.active_size);
  p.Key("requested_size").Uint(segment.requested_size);
  p.Key("stream").Uint(segment.stream.handle);
  p.Key("segment_type").String(segment.is_large ? "large" : "small");
  p.Key("segment_pool_id").BeginTuple().Int(0).Int(0).EndTuple();
  p.Key("is_expandable").Bool(segment.is_expandable);
  p.Key("frames").BeginList().EndList();
  p.Key("blocks").BeginList();
  for (const BlockInfo& block : segment.blocks) WriteBlock(block, p);
  p.EndList();
  p.EndDict();
}

void WriteTraceEntry(const TraceEvent& event, PickleWriter& p) {
  p.BeginDict();
  p.Key("action").String(TraceActionName(event.action));
  p.Key("addr").Uint(event.address);
  p.Key("size").Uint(event.requested_size);
  p.Key("stream").Uint(event.stream.handle);
  p.Key("time_us").Int(event.time_ns / 1000);
  p.Key("frames").BeginList().EndList();
  p.EndDict();
}

}  // namespace

std::string SnapshotToPickle(const Snapshot& snapshot) {
  PickleWriter p;
  p.BeginDict();
  p.Key("segments").BeginList();
  for (const SegmentInfo& segment : snapshot.segments) WriteSegment(segment, p);
  p.EndList();
  p.Key("device_traces").BeginList().BeginList();  // one device
  for (const TraceEvent& event : snapshot.events) WriteTraceEntry(event, p);
  p.EndList().EndList();
  p.Key("allocator_settings").BeginDict().EndDict();
  p.EndDict();
  return p.Finish();
}

absl::Status WriteSnapshotPickle(const Snapshot& snapshot, const std::string& path) {
  return WriteFile(path, SnapshotToPickle(snapshot));
}

}  // namespace remat
