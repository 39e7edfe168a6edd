#include "policies/covering_run.h"

#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "allocator/caching_allocator.h"
#include "policies/scored_policy.h"

namespace remat::policies {
namespace {

// Whether freeing the blocks at `freed` (besides the free ones) makes room.
bool MakesRoom(const PressureContext& ctx, const absl::flat_hash_set<std::uintptr_t>& freed) {
  const bool small = ctx.bytes_needed <= kSmallSize;
  std::size_t given_back = 0;  // what the allocator could release for growth
  for (const MemoryMapSegment& seg : ctx.memory_map->segments) {
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
    for (const MemoryMapBlock& b : seg.blocks) {
      if (seg.merge_boundary != 0 && b.address % seg.merge_boundary == 0) {
        count_pages(b.address);
        run = 0;
      }
      if (b.free() || freed.contains(b.address)) {
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

absl::flat_hash_map<std::uint64_t, const Candidate*> ById(const PressureContext& ctx) {
  absl::flat_hash_map<std::uint64_t, const Candidate*> by_id;
  for (const Candidate& c : ctx.candidates) by_id.emplace(c.id, &c);
  return by_id;
}

}  // namespace

bool PlanMakesRoom(const PressureContext& ctx, const Plan& plan) {
  if (ctx.memory_map == nullptr) return false;
  const absl::flat_hash_map<std::uint64_t, const Candidate*> by_id = ById(ctx);
  absl::flat_hash_set<std::uintptr_t> freed;
  std::size_t bytes = 0;
  for (const PlanStep& step : plan) {
    auto it = by_id.find(step.id);
    if (it == by_id.end()) continue;
    freed.insert(it->second->address);
    bytes += it->second->bytes;
    if (bytes >= ctx.bytes_needed) break;
  }
  return MakesRoom(ctx, freed);
}

std::optional<std::size_t> StepsToMakeRoom(const PressureContext& ctx, const Plan& plan) {
  if (ctx.memory_map == nullptr) return std::nullopt;
  const absl::flat_hash_map<std::uint64_t, const Candidate*> by_id = ById(ctx);
  auto room_after = [&](std::size_t steps) {
    absl::flat_hash_set<std::uintptr_t> freed;
    for (std::size_t i = 0; i < steps; ++i) {
      auto it = by_id.find(plan[i].id);
      if (it != by_id.end()) freed.insert(it->second->address);
    }
    return MakesRoom(ctx, freed);
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
  absl::flat_hash_map<std::uintptr_t, const Candidate*> by_address;
  for (const Candidate& c : ctx.candidates) {
    if (c.can_drop || c.can_offload) by_address.emplace(c.address, &c);
  }
  // Each candidate's cost once: a block joins and leaves the window once
  // per segment scan.
  absl::flat_hash_map<const Candidate*, double> costs;
  auto cost_of = [&](const Candidate* c) {
    auto [it, inserted] = costs.try_emplace(c, 0.0);
    if (inserted) it->second = cost(*c);
    return it->second;
  };
  // The window's members and its cost, kept as blocks join and leave it:
  // O(blocks x related pairs) per segment.
  absl::flat_hash_set<const Candidate*> members;
  double run_cost = 0;
  auto join = [&](const Candidate* c) {
    run_cost += cost_of(c);
    if (related != nullptr) {
      (*related)(*c, [&](const Candidate& other, double extra) {
        if (members.contains(&other)) run_cost += extra;
      });
    }
    members.insert(c);
  };
  auto leave = [&](const Candidate* c) {
    members.erase(c);
    run_cost -= cost_of(c);
    if (related != nullptr) {
      (*related)(*c, [&](const Candidate& other, double extra) {
        if (members.contains(&other)) run_cost -= extra;
      });
    }
    if (members.empty()) run_cost = 0;  // no drift carried from one run to the next
  };
  const bool small = ctx.bytes_needed <= kSmallSize;
  double best_cost = std::numeric_limits<double>::infinity();
  const MemoryMapSegment* best_segment = nullptr;
  std::size_t best_first = 0, best_last = 0;
  for (const MemoryMapSegment& seg : ctx.memory_map->segments) {
    if (seg.is_large == small || seg.size < ctx.bytes_needed) continue;
    std::vector<const Candidate*> held(seg.blocks.size(), nullptr);
    for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
      if (seg.blocks[i].free()) continue;
      auto it = by_address.find(seg.blocks[i].address);
      if (it != by_address.end()) held[i] = it->second;
    }
    // The cheapest covering run ending at each block is the shortest one
    // (costs and extras are never negative).
    std::size_t first = 0, bytes = 0;
    auto restart = [&](std::size_t at) {
      for (std::size_t i = first; i < at; ++i) {
        if (held[i] != nullptr && members.contains(held[i])) leave(held[i]);
      }
      first = at;
      bytes = 0;
    };
    for (std::size_t last = 0; last < seg.blocks.size(); ++last) {
      const MemoryMapBlock& b = seg.blocks[last];
      if (!b.free() && held[last] == nullptr) {  // pinned, foreign or pending: the run breaks
        restart(last + 1);
        continue;
      }
      if (seg.merge_boundary != 0 && b.address % seg.merge_boundary == 0) {
        restart(last);  // free blocks never merge across it
      }
      bytes += b.size;
      if (held[last] != nullptr) join(held[last]);
      while (first < last && bytes - seg.blocks[first].size >= ctx.bytes_needed) {
        bytes -= seg.blocks[first].size;
        if (held[first] != nullptr) leave(held[first]);
        ++first;
      }
      if (bytes >= ctx.bytes_needed && run_cost < best_cost) {
        best_cost = std::max(run_cost, 0.0);
        best_segment = &seg;
        best_first = first;
        best_last = last;
      }
    }
    restart(seg.blocks.size());
  }
  if (best_segment == nullptr) return std::nullopt;
  if (price != nullptr) *price = best_cost;
  Plan plan;
  for (std::size_t i = best_first; i <= best_last; ++i) {
    const MemoryMapBlock& b = best_segment->blocks[i];
    if (b.free()) continue;
    const Candidate* c = by_address.at(b.address);
    plan.push_back(PlanStep{c->id, CheaperAction(*c)});
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
