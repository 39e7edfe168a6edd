#include "sim/sim_timeline.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/snapshot_timeline.h"
#include "base/file.h"
#include "base/json_writer.h"

namespace remat {
namespace {

// Track ids (Chrome's tids); counters live on the process (tid 0).
constexpr int kCountersTid = 0;
constexpr int kComputeTid = 1;
constexpr int kCopyTid = 2;
constexpr int kEvictionsTid = 3;
// Prefetches run on a stream of their own, on the host-to-device copy engine,
// beside the offloads' device-to-host one: their slices may overlap those.
constexpr int kPrefetchTid = 4;

// Microseconds with the nanoseconds kept, without going through a double.
std::string Microseconds(std::int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const std::uint64_t magnitude = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : ns;
  return absl::StrFormat("%s%d.%03d", sign, magnitude / 1000, magnitude % 1000);
}

void WriteMetadata(std::string_view what, int tid, std::string_view key, std::string_view name,
                   JsonWriter& w) {
  w.BeginObject();
  w.Key("name").String(what).Key("ph").String("M").Key("pid").Int(0).Key("tid").Int(tid);
  w.Key("args").BeginObject().Key(key).String(name).EndObject();
  w.EndObject();
}

void WriteSortIndex(int tid, JsonWriter& w) {
  w.BeginObject();
  w.Key("name").String("thread_sort_index").Key("ph").String("M").Key("pid").Int(0);
  w.Key("tid").Int(tid);
  w.Key("args").BeginObject().Key("sort_index").Int(tid).EndObject();
  w.EndObject();
}

void WriteCounter(const char* track, std::int64_t ts_ns, std::uint64_t bytes, JsonWriter& w) {
  w.BeginObject();
  w.Key("name").String(track).Key("ph").String("C");
  w.Key("ts").Raw(Microseconds(ts_ns));
  w.Key("pid").Int(0).Key("tid").Int(kCountersTid);
  w.Key("args").BeginObject().Key("bytes").Uint(bytes).EndObject();
  w.EndObject();
}

const OpTensor* TensorOf(const OpTrace& trace, std::uint32_t index) {
  return index < trace.tensors.size() ? &trace.tensors[index] : nullptr;
}

std::string_view OpName(const OpTrace& trace, std::uint32_t record) {
  if (record >= trace.records.size()) return "?";
  const std::uint32_t name = trace.records[record].name;
  return name < trace.names.size() ? std::string_view(trace.names[name]) : "?";
}

void WriteEntry(const OpTrace& trace, const SimTimeline::Entry& e, JsonWriter& w) {
  using Kind = SimTimeline::Kind;
  const OpTensor* tensor = TensorOf(trace, e.index);
  std::string name;
  std::string_view cat;
  int tid = kComputeTid;
  bool slice = true;
  switch (e.kind) {
    case Kind::kCompute:
      name = std::string(OpName(trace, e.index));
      cat = "compute";
      break;
    case Kind::kRecompute:
      name = "recompute ";
      name += tensor != nullptr ? OpName(trace, tensor->producer) : "?";
      cat = "recompute";
      break;
    case Kind::kRestore:
      name = "restore";
      cat = "copy";
      break;
    case Kind::kPrefetch:
      name = "prefetch";
      cat = "copy";
      tid = kPrefetchTid;
      break;
    case Kind::kOffload:
      name = "offload";
      cat = "copy";
      tid = kCopyTid;
      break;
    case Kind::kCopyAhead:
      name = "copy ahead";
      cat = "copy";
      tid = kCopyTid;
      break;
    case Kind::kCopy:
      name = "copy";
      cat = "copy";
      tid = kCopyTid;
      break;
    case Kind::kEvictOffload:
      name = "offload";
      cat = "eviction";
      slice = false;
      break;
    case Kind::kEvictDrop:
      name = "drop";
      cat = "eviction";
      slice = false;
      break;
    case Kind::kReleasedDrop:
      name = "released drop";
      cat = "release";
      slice = false;
      break;
  }
  if (!slice) tid = kEvictionsTid;
  w.BeginObject();
  w.Key("name").String(name).Key("cat").String(cat).Key("ph").String(slice ? "X" : "i");
  if (!slice) w.Key("s").String("t");
  w.Key("ts").Raw(Microseconds(e.ts_ns));
  if (slice) w.Key("dur").Raw(Microseconds(e.dur_ns));
  w.Key("pid").Int(0).Key("tid").Int(tid);
  w.Key("args").BeginObject();
  if (e.kind == Kind::kCompute) {
    if (e.index < trace.records.size()) w.Key("line").Uint(trace.records[e.index].line);
  } else {
    if (tensor != nullptr) w.Key("tensor").String(tensor->id);
    if (e.directed) w.Key("directed").Bool(true);
    if (e.kind != Kind::kRecompute) w.Key("bytes").Uint(e.bytes);
  }
  w.EndObject();
  w.EndObject();
}

}  // namespace

void SimTimeline::Clear() {
  title_.clear();
  entries_.clear();
  samples_.clear();
  end_status_.clear();
  end_message_.clear();
  end_ns_ = 0;
}

void SimTimeline::SetEnd(std::string status, std::string message, std::int64_t ts_ns) {
  end_status_ = std::move(status);
  end_message_ = std::move(message);
  end_ns_ = ts_ns;
}

std::string SimTimeline::ToJson(const OpTrace& trace) const {
  // Everything to write, put in time order; equal times keep the order of
  // recording (samples first within their record).
  enum class Type : std::uint8_t { kCounter, kEntry, kEnd };
  struct Item {
    std::int64_t ts_ns;
    Type type;
    std::uint8_t track;   // counters: 0 reserved, 1 live, 2 host
    std::uint32_t index;  // into samples_ or entries_
  };
  std::vector<Item> items;
  items.reserve(entries_.size() + samples_.size() + 1);
  // Of the samples at one time, the last; of those, only where a level moves,
  // and always the first and the last.
  const Sample* prev = nullptr;
  for (std::size_t i = 0; i < samples_.size(); ++i) {
    const Sample& s = samples_[i];
    const bool last = i + 1 == samples_.size();
    if (!last && samples_[i + 1].ts_ns == s.ts_ns) continue;
    const bool edge = prev == nullptr || last;
    const std::uint64_t now[3] = {s.reserved, s.live, s.host};
    const std::uint64_t before[3] = {prev ? prev->reserved : 0, prev ? prev->live : 0,
                                     prev ? prev->host : 0};
    for (std::uint8_t k = 0; k < 3; ++k) {
      if (edge || now[k] != before[k]) {
        items.push_back({s.ts_ns, Type::kCounter, k, static_cast<std::uint32_t>(i)});
      }
    }
    prev = &s;
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    items.push_back({entries_[i].ts_ns, Type::kEntry, 0, static_cast<std::uint32_t>(i)});
  }
  if (!end_status_.empty()) items.push_back({end_ns_, Type::kEnd, 0, 0});
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.ts_ns < b.ts_ns; });

  JsonWriter w;
  w.BeginObject();
  w.Key("traceEvents").BeginArray();
  WriteMetadata("process_name", 0, "name", title_.empty() ? trace.name : title_, w);
  WriteMetadata("thread_name", kComputeTid, "name", "compute stream", w);
  WriteMetadata("thread_name", kCopyTid, "name", "copy stream (device to host)", w);
  WriteMetadata("thread_name", kPrefetchTid, "name", "prefetch stream (host to device)", w);
  WriteMetadata("thread_name", kEvictionsTid, "name", "evictions", w);
  for (int tid : {kComputeTid, kCopyTid, kPrefetchTid, kEvictionsTid}) WriteSortIndex(tid, w);
  for (const Item& item : items) {
    switch (item.type) {
      case Type::kCounter: {
        const Sample& s = samples_[item.index];
        if (item.track == 0) WriteCounter(kReservedTrack, s.ts_ns, s.reserved, w);
        if (item.track == 1) WriteCounter(kLiveBytesTrack, s.ts_ns, s.live, w);
        if (item.track == 2) WriteCounter(kHostBytesTrack, s.ts_ns, s.host, w);
        break;
      }
      case Type::kEntry:
        WriteEntry(trace, entries_[item.index], w);
        break;
      case Type::kEnd:
        w.BeginObject();
        w.Key("name").String(end_status_).Key("cat").String("end").Key("ph").String("i");
        w.Key("s").String("g").Key("ts").Raw(Microseconds(end_ns_));
        w.Key("pid").Int(0).Key("tid").Int(kComputeTid);
        w.Key("args").BeginObject().Key("message").String(end_message_).EndObject();
        w.EndObject();
        break;
    }
  }
  w.EndArray();
  w.Key("displayTimeUnit").String("ms");
  w.EndObject();
  return w.Take();
}

absl::Status SimTimeline::Write(const OpTrace& trace, const std::string& path) const {
  return WriteFile(path, ToJson(trace));
}

}  // namespace remat
