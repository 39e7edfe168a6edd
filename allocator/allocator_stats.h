// Allocator statistics, named and counted as PyTorch's CUDA caching allocator
// names them, so that numbers from remat and from torch.cuda.memory_stats()
// can be read side by side.
#ifndef REMAT_ALLOCATOR_ALLOCATOR_STATS_H_
#define REMAT_ALLOCATOR_ALLOCATOR_STATS_H_

#include <array>
#include <cstdint>
#include <string>

namespace remat {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed
  // While counting, `freed` is not kept up to date (a free then costs one
  // store less): it is allocated - (current - base), filled in by
  // StatArray::Complete() when statistics are read. `base` is `current` as
  // it was when the totals were last reset.
  std::int64_t base = 0;

  void Increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    // A branch rather than a conditional move: in a steady state the peak
    // is not passed, and the store is skipped.
    if (current > peak) [[unlikely]] peak = current;
  }
  void Decrease(std::int64_t amount) { current -= amount; }
};

enum StatPool : int { kAggregatePool = 0, kSmallPool = 1, kLargePool = 2 };
inline constexpr const char* kStatPoolNames[] = {"all", "small_pool", "large_pool"};

// One Stat for all blocks, one for the small pool, one for the large pool.
struct StatArray {
  std::array<Stat, 3> pools;

  const Stat& all() const { return pools[kAggregatePool]; }
  const Stat& small() const { return pools[kSmallPool]; }
  const Stat& large() const { return pools[kLargePool]; }
  // The aggregate's current and peak are kept as they change (a peak cannot
  // be derived from the pools' peaks); its allocated and freed totals are the
  // pools' sums, filled in by Complete() when statistics are read.
  void Add(StatPool pool, std::int64_t delta) {
    if (delta > 0) {
      Increase(pool, delta);
    } else {
      Decrease(pool, -delta);
    }
  }
  void Increase(StatPool pool, std::int64_t amount) {
    Stat& all = pools[kAggregatePool];
    all.current += amount;
    if (all.current > all.peak) [[unlikely]] all.peak = all.current;
    pools[pool].Increase(amount);
  }
  void Decrease(StatPool pool, std::int64_t amount) {
    pools[kAggregatePool].current -= amount;
    pools[pool].Decrease(amount);
  }
  // Up by `amount` and straight back down (Increase, then Decrease): the
  // peaks and the totals see it, the current values do not change.
  void Pass(StatPool pool, std::int64_t amount) {
    Stat& all = pools[kAggregatePool];
    if (all.current + amount > all.peak) [[unlikely]] all.peak = all.current + amount;
    Stat& s = pools[pool];
    s.allocated += amount;
    if (s.current + amount > s.peak) [[unlikely]] s.peak = s.current + amount;
  }
  // Down by `amount` and straight back up (Decrease, then Increase): only the
  // totals see it.
  void Dip(StatPool pool, std::int64_t amount) { pools[pool].allocated += amount; }
  void Complete() {
    for (int p : {kSmallPool, kLargePool}) {
      pools[p].freed = pools[p].allocated - (pools[p].current - pools[p].base);
    }
    pools[kAggregatePool].allocated = pools[kSmallPool].allocated + pools[kLargePool].allocated;
    pools[kAggregatePool].freed = pools[kSmallPool].freed + pools[kLargePool].freed;
  }
  void ResetPeak() {
    for (Stat& s : pools) s.peak = s.current;
  }
  void ResetAccumulated() {
    for (Stat& s : pools) {
      s.allocated = s.freed = 0;
      s.base = s.current;
    }
  }
};

struct AllocatorStats {
  StatArray allocation;            // live allocations (counted at Free, not when events complete)
  StatArray segment;               // device segments reserved
  StatArray active;                // blocks in use or waiting for their streams (pending free)
  StatArray inactive_split;        // free blocks inside segments that are split
  StatArray allocated_bytes;       // bytes of live allocations (rounded sizes)
  StatArray reserved_bytes;        // bytes of device segments
  StatArray active_bytes;          // bytes of active blocks
  StatArray inactive_split_bytes;  // bytes of inactive_split blocks
  StatArray requested_bytes;       // bytes callers asked for (before rounding)

  std::int64_t num_alloc_retries = 0;  // rounds that released cache or asked the pressure handler
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;  // segments reserved from the device
  std::int64_t num_device_free = 0;   // segments returned to the device
  std::int64_t num_pressure_calls = 0;

  void ResetPeaks();
  void ResetAccumulated();
  // Fills in the aggregate totals the hot path leaves out (see StatArray).
  void Complete();
};

// Flat "name.pool.field" keys, as torch.cuda.memory_stats() spells them
// ("allocated_bytes.all.current", "num_ooms", ...), as one JSON object.
std::string StatsToJson(const AllocatorStats& stats);
// A human-readable table like torch.cuda.memory_summary().
std::string StatsSummary(const AllocatorStats& stats);

}  // namespace remat

#endif  // REMAT_ALLOCATOR_ALLOCATOR_STATS_H_
