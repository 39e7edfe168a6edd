#include "policies/covering_run.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "allocator/caching_allocator.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

constexpr std::uint32_t kNone = UINT32_MAX;

// A pressure event's candidates by position in ctx.candidates, and each
// memory-map block's candidate: built once per call (one hash of addresses),
// so that the scans below, which run many times, look nothing up. With
// `evictable_only`, blocks map only to candidates that may be dropped or
// offloaded. Each candidate holds a block of its own; were two at one
// address, the block maps to the first, as a map keyed by address would.
class BlockIndex {
 public:
  BlockIndex(const PressureContext& ctx, bool evictable_only) : ctx_(ctx) {
    const absl::Span<const Candidate> cs = ctx.candidates;
    for (std::size_t i = 0; i < cs.size() && dense_; ++i) dense_ = cs[i].id == i;
    if (!dense_) {
      by_id_.reserve(cs.size());
      for (std::size_t i = 0; i < cs.size(); ++i) {
        by_id_.emplace(cs[i].id, static_cast<std::uint32_t>(i));
      }
    }
    absl::flat_hash_map<std::uintptr_t, std::uint32_t> by_address;
    by_address.reserve(cs.size());
    holder_.assign(cs.size(), kNone);
    for (std::size_t i = 0; i < cs.size(); ++i) {
      if (evictable_only && !cs[i].can_drop && !cs[i].can_offload) continue;
      holder_[i] = by_address.try_emplace(cs[i].address, static_cast<std::uint32_t>(i))
                       .first->second;
    }
    std::size_t blocks = 0;
    for (const MemoryMapSegment& seg : ctx.memory_map->segments) blocks += seg.blocks.size();
    owners_.reserve(blocks);
    starts_.reserve(ctx.memory_map->segments.size() + 1);
    for (const MemoryMapSegment& seg : ctx.memory_map->segments) {
      starts_.push_back(owners_.size());
      for (const MemoryMapBlock& b : seg.blocks) {
        std::uint32_t owner = kNone;
        if (!b.free()) {
          if (auto it = by_address.find(b.address); it != by_address.end()) owner = it->second;
        }
        owners_.push_back(owner);
      }
    }
    starts_.push_back(owners_.size());
  }

  // The position of the candidate with `id`, or kNone.
  std::uint32_t Of(std::uint64_t id) const {
    if (dense_) return id < ctx_.candidates.size() ? static_cast<std::uint32_t>(id) : kNone;
    auto it = by_id_.find(id);
    return it == by_id_.end() ? kNone : it->second;
  }
  // The position the blocks of candidate `pos` map to (kNone: none do).
  std::uint32_t Holder(std::uint32_t pos) const { return holder_[pos]; }
  // Segment `seg`'s blocks' candidates, in the map's order (kNone: none).
  absl::Span<const std::uint32_t> Owners(std::size_t seg) const {
    return absl::MakeConstSpan(owners_).subspan(starts_[seg], starts_[seg + 1] - starts_[seg]);
  }

 private:
  const PressureContext& ctx_;
  bool dense_ = true;  // candidate i has id i (the runtime's numbering)
  absl::flat_hash_map<std::uint64_t, std::uint32_t> by_id_;
  std::vector<std::uint32_t> holder_;
  std::vector<std::uint32_t> owners_;
  std::vector<std::size_t> starts_;
};

// Whether freeing the blocks of the candidates marked in `freed` (by
// position, besides the free blocks) makes room.
bool MakesRoom(const PressureContext& ctx, const BlockIndex& index,
               const std::vector<char>& freed) {
  const bool small = ctx.bytes_needed <= kSmallSize;
  std::size_t given_back = 0;  // what the allocator could release for growth
  const std::vector<MemoryMapSegment>& segments = ctx.memory_map->segments;
  for (std::size_t si = 0; si < segments.size(); ++si) {
    const MemoryMapSegment& seg = segments[si];
    const absl::Span<const std::uint32_t> owners = index.Owners(si);
    const bool right_pool = seg.is_large != small && seg.size >= ctx.bytes_needed;
    std::size_t run = 0;
    std::uintptr_t run_start = 0;
    bool all_free = true;
    auto count_pages = [&](std::uintptr_t end) {
      if (seg.page_size == 0 || run == 0) return;
      const std::uintptr_t lo = (run_start + seg.page_size - 1) / seg.page_size * seg.page_size;
      const std::uintptr_t hi = end / seg.page_size * seg.page_size;
      if (hi > lo) given_back += hi - lo;
    };
    for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
      const MemoryMapBlock& b = seg.blocks[i];
      if (seg.merge_boundary != 0 && b.address % seg.merge_boundary == 0) {
        count_pages(b.address);
        run = 0;
      }
      if (b.free() || (owners[i] != kNone && freed[owners[i]])) {
        if (run == 0) run_start = b.address;
        run += b.size;
        if (right_pool && run >= ctx.bytes_needed) return true;
      } else {
        count_pages(b.address);
        run = 0;
        all_free = false;
      }
    }
    if (!seg.blocks.empty()) count_pages(seg.blocks.back().address + seg.blocks.back().size);
    if (seg.page_size == 0 && all_free) given_back += seg.size;
  }
  return ctx.growth_bytes > 0 && given_back + ctx.room_bytes >= ctx.growth_bytes;
}

// Marks in `freed` the block of the plan's step `step`'s candidate; its
// bytes, or 0 for a step naming no candidate.
std::size_t MarkFreed(const PressureContext& ctx, const BlockIndex& index, const PlanStep& step,
                      std::vector<char>& freed) {
  const std::uint32_t pos = index.Of(step.id);
  if (pos == kNone) return 0;
  if (const std::uint32_t holder = index.Holder(pos); holder != kNone) freed[holder] = 1;
  return ctx.candidates[pos].bytes;
}

}  // namespace

bool PlanMakesRoom(const PressureContext& ctx, const Plan& plan) {
  if (ctx.memory_map == nullptr) return false;
  const BlockIndex index(ctx, /*evictable_only=*/false);
  std::vector<char> freed(ctx.candidates.size(), 0);
  std::size_t bytes = 0;
  for (const PlanStep& step : plan) {
    if (index.Of(step.id) == kNone) continue;
    bytes += MarkFreed(ctx, index, step, freed);
    if (bytes >= ctx.bytes_needed) break;
  }
  return MakesRoom(ctx, index, freed);
}

std::optional<std::size_t> StepsToMakeRoom(const PressureContext& ctx, const Plan& plan) {
  if (ctx.memory_map == nullptr) return std::nullopt;
  const BlockIndex index(ctx, /*evictable_only=*/false);
  std::vector<char> freed(ctx.candidates.size(), 0);
  auto room_after = [&](std::size_t steps) {
    std::fill(freed.begin(), freed.end(), 0);
    for (std::size_t i = 0; i < steps; ++i) MarkFreed(ctx, index, plan[i], freed);
    return MakesRoom(ctx, index, freed);
  };
  // Room only grows as more is freed: the least number of steps, by halves.
  if (!room_after(plan.size())) return std::nullopt;
  std::size_t lo = 0, hi = plan.size();  // room after hi steps, none after lo (or lo = 0)
  if (room_after(0)) return 0;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (room_after(mid) ? hi : lo) = mid;
  }
  return hi;
}

double RunCost(const Candidate& c, const PressureContext& ctx, double staleness_exp) {
  Candidate full = c;
  ctx.Complete(full);
  return EvictionCost(full, static_cast<double>(full.compute_ns + full.neighbourhood_ns)) /
         Power(Staleness(full, ctx), staleness_exp);  // Power(x, 0) is 1
}

namespace {

std::optional<Plan> Search(const PressureContext& ctx,
                           absl::FunctionRef<double(const Candidate&)> cost,
                           const Related* related, double* price) {
  if (ctx.memory_map == nullptr) return std::nullopt;
  const absl::Span<const Candidate> cs = ctx.candidates;
  const BlockIndex index(ctx, /*evictable_only=*/true);
  // Each candidate's cost once: a block joins and leaves the window once
  // per segment scan.
  std::vector<double> costs(cs.size(), 0.0);
  std::vector<char> costed(cs.size(), 0);
  auto cost_of = [&](std::uint32_t c) {
    if (!costed[c]) {
      costs[c] = cost(cs[c]);
      costed[c] = 1;
    }
    return costs[c];
  };
  // The window's members (by position) and its cost, kept as blocks join
  // and leave it: O(blocks x related pairs) per segment.
  std::vector<char> member(cs.size(), 0);
  std::size_t members = 0;
  // (A related candidate outside ctx.candidates is never in the window;
  // addresses compared as integers, as pointers into other objects may not be.)
  const auto base = reinterpret_cast<std::uintptr_t>(cs.data());
  auto is_member = [&](const Candidate& other) {
    const auto at = reinterpret_cast<std::uintptr_t>(&other);
    if (at < base || at - base >= cs.size() * sizeof(Candidate)) return false;
    return member[(at - base) / sizeof(Candidate)] != 0;
  };
  double run_cost = 0;
  auto join = [&](std::uint32_t c) {
    run_cost += cost_of(c);
    if (related != nullptr) {
      (*related)(cs[c], [&](const Candidate& other, double extra) {
        if (is_member(other)) run_cost += extra;
      });
    }
    member[c] = 1;
    ++members;
  };
  auto leave = [&](std::uint32_t c) {
    member[c] = 0;
    --members;
    run_cost -= cost_of(c);
    if (related != nullptr) {
      (*related)(cs[c], [&](const Candidate& other, double extra) {
        if (is_member(other)) run_cost -= extra;
      });
    }
    if (members == 0) run_cost = 0;  // no drift carried from one run to the next
  };
  const bool small = ctx.bytes_needed <= kSmallSize;
  double best_cost = std::numeric_limits<double>::infinity();
  std::size_t best_segment = 0;
  bool found = false;
  std::size_t best_first = 0, best_last = 0;
  const std::vector<MemoryMapSegment>& segments = ctx.memory_map->segments;
  for (std::size_t si = 0; si < segments.size(); ++si) {
    const MemoryMapSegment& seg = segments[si];
    if (seg.is_large == small || seg.size < ctx.bytes_needed) continue;
    const absl::Span<const std::uint32_t> held = index.Owners(si);
    // The cheapest covering run ending at each block is the shortest one
    // (costs and extras are never negative).
    std::size_t first = 0, bytes = 0;
    auto restart = [&](std::size_t at) {
      for (std::size_t i = first; i < at; ++i) {
        if (held[i] != kNone && member[held[i]]) leave(held[i]);
      }
      first = at;
      bytes = 0;
    };
    for (std::size_t last = 0; last < seg.blocks.size(); ++last) {
      const MemoryMapBlock& b = seg.blocks[last];
      if (!b.free() && held[last] == kNone) {  // pinned, foreign or pending: the run breaks
        restart(last + 1);
        continue;
      }
      if (seg.merge_boundary != 0 && b.address % seg.merge_boundary == 0) {
        restart(last);  // free blocks never merge across it
      }
      bytes += b.size;
      if (held[last] != kNone) join(held[last]);
      while (first < last && bytes - seg.blocks[first].size >= ctx.bytes_needed) {
        bytes -= seg.blocks[first].size;
        if (held[first] != kNone) leave(held[first]);
        ++first;
      }
      if (bytes >= ctx.bytes_needed && run_cost < best_cost) {
        best_cost = std::max(run_cost, 0.0);
        best_segment = si;
        found = true;
        best_first = first;
        best_last = last;
      }
    }
    restart(seg.blocks.size());
  }
  if (!found) return std::nullopt;
  if (price != nullptr) *price = best_cost;
  Plan plan;
  const absl::Span<const std::uint32_t> held = index.Owners(best_segment);
  for (std::size_t i = best_first; i <= best_last; ++i) {
    if (segments[best_segment].blocks[i].free()) continue;
    const Candidate& c = cs[held[i]];
    plan.push_back(PlanStep{c.id, CheaperAction(c)});
  }
  return plan;
}

}  // namespace

std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost) {
  return Search(ctx, cost, nullptr, nullptr);
}

std::optional<Plan> CheapestCoveringRun(const PressureContext& ctx,
                                        absl::FunctionRef<double(const Candidate&)> cost,
                                        Related related, double* price) {
  return Search(ctx, cost, &related, price);
}

}  // namespace remat::policies
