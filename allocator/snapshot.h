// What the allocator holds at one moment (segments and their blocks, tiling
// each segment exactly in address order) and what it did recently (a bounded
// ring of events). Laid out after PyTorch's memory snapshot so the same
// questions get the same answers; exported as JSON.
#ifndef REMAT_ALLOCATOR_SNAPSHOT_H_
#define REMAT_ALLOCATOR_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/allocator_stats.h"
#include "device/device.h"

namespace remat {

enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };
const char* BlockStateName(BlockState state);  // "active_allocated", ...

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 unless active
  BlockState state = BlockState::kInactive;
  Stream stream;                   // allocation stream, or the stream it was freed on
  std::uint64_t owner = 0;         // tag set by the runtime (0: none)
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;  // bytes of active_allocated blocks
  std::size_t active_size = 0;     // bytes of active blocks (allocated or pending free)
  std::size_t requested_size = 0;
  bool is_large = false;           // large pool (false: small pool)
  // A run of mapped pages of an expandable segment (one entry per run).
  bool is_expandable = false;
  Stream stream;                   // stream that first asked for it
  std::vector<BlockInfo> blocks;   // address order, tiling the segment
};

// kSegmentMap / kSegmentUnmap: pages of an expandable segment gaining or
// losing their memory (PyTorch's segment_map / segment_unmap).
enum class TraceAction {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kOom,
  kSegmentMap,
  kSegmentUnmap
};
const char* TraceActionName(TraceAction action);  // "alloc", "free_requested", ...

struct TraceEvent {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;            // the block's (rounded) or the segment's bytes
  std::size_t requested_size = 0;  // the caller's bytes (alloc, frees, oom); segments: size
  Stream stream;
  std::int64_t time_ns = 0;  // the device's clock (virtual on SimDevice)
};

struct Snapshot {
  std::string device;
  std::size_t budget = 0;
  std::vector<SegmentInfo> segments;  // address order
  std::vector<TraceEvent> events;     // oldest first
  AllocatorStats stats;
};

std::string SnapshotToJson(const Snapshot& snapshot);

// The view eviction policies plan over: every segment's blocks in address
// order, each free, pending free, or allocated with the owner tag the runtime
// set (0 for allocations the runtime does not own, which cannot be evicted).
struct MemoryMapBlock {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  BlockState state = BlockState::kInactive;
  std::uint64_t owner = 0;
  bool free() const { return state == BlockState::kInactive; }
};

struct MemoryMapSegment {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  bool is_large = false;
  // Free blocks never merge across a multiple of this (an expandable
  // segment's small-pool pages); 0: anywhere within the segment.
  std::size_t merge_boundary = 0;
  // An expandable segment's page (whole free pages are given back one by
  // one); 0: a fixed segment, given back only when all of it is free.
  std::size_t page_size = 0;
  std::vector<MemoryMapBlock> blocks;
};

struct MemoryMap {
  std::vector<MemoryMapSegment> segments;
};

}  // namespace remat

#endif  // REMAT_ALLOCATOR_SNAPSHOT_H_
