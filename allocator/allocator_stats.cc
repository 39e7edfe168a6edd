#include "allocator/allocator_stats.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json_writer.h"
#include "base/units.h"

namespace remat {
namespace {

template <typename Fn>
void ForEachStatArray(const AllocatorStats& s, Fn&& fn) {
  fn("allocation", s.allocation, false);
  fn("segment", s.segment, false);
  fn("active", s.active, false);
  fn("inactive_split", s.inactive_split, false);
  fn("allocated_bytes", s.allocated_bytes, true);
  fn("reserved_bytes", s.reserved_bytes, true);
  fn("active_bytes", s.active_bytes, true);
  fn("inactive_split_bytes", s.inactive_split_bytes, true);
  fn("requested_bytes", s.requested_bytes, true);
}

}  // namespace

void AllocatorStats::ResetPeaks() {
  for (StatArray* a : {&allocation, &segment, &active, &inactive_split, &allocated_bytes,
                       &reserved_bytes, &active_bytes, &inactive_split_bytes, &requested_bytes}) {
    a->ResetPeak();
  }
}

void AllocatorStats::Complete() {
  for (StatArray* a : {&allocation, &segment, &active, &inactive_split, &allocated_bytes,
                       &reserved_bytes, &active_bytes, &inactive_split_bytes, &requested_bytes}) {
    a->Complete();
  }
}

void AllocatorStats::ResetAccumulated() {
  for (StatArray* a : {&allocation, &segment, &active, &inactive_split, &allocated_bytes,
                       &reserved_bytes, &active_bytes, &inactive_split_bytes, &requested_bytes}) {
    a->ResetAccumulated();
  }
  num_alloc_retries = num_ooms = num_device_alloc = num_device_free = num_pressure_calls = 0;
}

std::string StatsToJson(const AllocatorStats& stats) {
  JsonWriter w;
  w.BeginObject();
  ForEachStatArray(stats, [&](const char* name, const StatArray& array, bool) {
    for (int pool = 0; pool < 3; ++pool) {
      const Stat& s = array.pools[pool];
      const std::string prefix = absl::StrCat(name, ".", kStatPoolNames[pool], ".");
      w.Key(prefix + "current").Int(s.current);
      w.Key(prefix + "peak").Int(s.peak);
      w.Key(prefix + "allocated").Int(s.allocated);
      w.Key(prefix + "freed").Int(s.freed);
    }
  });
  w.Key("num_alloc_retries").Int(stats.num_alloc_retries);
  w.Key("num_ooms").Int(stats.num_ooms);
  w.Key("num_device_alloc").Int(stats.num_device_alloc);
  w.Key("num_device_free").Int(stats.num_device_free);
  w.Key("num_pressure_calls").Int(stats.num_pressure_calls);
  w.EndObject();
  return w.Take();
}

std::string StatsSummary(const AllocatorStats& stats) {
  std::string out = absl::StrFormat("%-22s %-10s %14s %14s %14s %14s\n", "metric", "pool",
                                    "current", "peak", "allocated", "freed");
  ForEachStatArray(stats, [&](const char* name, const StatArray& array, bool bytes) {
    for (int pool = 0; pool < 3; ++pool) {
      const Stat& s = array.pools[pool];
      auto cell = [bytes](std::int64_t v) {
        return bytes ? FormatBytes(static_cast<std::uint64_t>(v < 0 ? 0 : v)) : absl::StrCat(v);
      };
      absl::StrAppendFormat(&out, "%-22s %-10s %14s %14s %14s %14s\n", pool == 0 ? name : "",
                            kStatPoolNames[pool], cell(s.current), cell(s.peak),
                            cell(s.allocated), cell(s.freed));
    }
  });
  absl::StrAppendFormat(&out,
                        "alloc retries %d, OOMs %d, device allocs %d, device frees %d, "
                        "pressure calls %d\n",
                        stats.num_alloc_retries, stats.num_ooms, stats.num_device_alloc,
                        stats.num_device_free, stats.num_pressure_calls);
  return out;
}

}  // namespace remat
