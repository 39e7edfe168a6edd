// Runtime under pressure: the live budget, the pressure handler's eviction,
// the candidates a policy sees and their features (evicted neighbourhood,
// adjacent drop classes, transfer cost, next use).
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "base/units.h"
#include "base/status_macros.h"
#include "policies/covering_run.h"
#include "policies/scored_policy.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace remat {

absl::StatusOr<void*> Runtime::AllocateDevice(std::size_t bytes, Stream stream,
                                              std::uint64_t owner) {
  REMAT_RETURN_IF_ERROR(MakeLiveRoom(bytes, stream));
  absl::StatusOr<void*> ptr = allocator_->Allocate(bytes, stream, owner);
  if (ptr.ok() || !absl::IsResourceExhausted(ptr.status())) return ptr;
  if (StepLimitReached()) return StepLimitError();
  return absl::ResourceExhaustedError(
      absl::StrCat(DescribePressure(bytes, /*live=*/false), "; allocator: ", ptr.status().message()));
}

absl::Status Runtime::MakeLiveRoom(std::size_t bytes, Stream stream) {
  if (options_.live_budget != 0) {
    // Outputs allocated for closures not yet run count as live already.
    while (stats_.resident_bytes + pending_live_bytes_ + bytes > options_.live_budget) {
      const std::size_t live = stats_.resident_bytes + pending_live_bytes_;
      // Bytes, not a place: the live budget's room need not be in one block.
      const PressureRequest request{live + bytes - options_.live_budget, stream,
                                    options_.live_budget, live, live, /*contiguous=*/false};
      if (!Evict(request)) {
        if (StepLimitReached()) return StepLimitError();
        return absl::ResourceExhaustedError(DescribePressure(bytes, /*live=*/true));
      }
    }
  }
  return absl::OkStatus();
}

policies::Candidate Runtime::MakeCandidate(const Storage* s, const policies::Needs& needs,
                                           std::int64_t now) {
  policies::Candidate c;
  c.bytes = s->bytes;
  c.compute_ns = s->compute_ns;
  c.transfer_ns = s->round_trip_ns;
  c.can_drop = s->may_drop;
  c.can_offload = s->may_offload;
  c.copied_out = s->ahead != nullptr;
  c.last_access_ns = s->last_access_ns;
  c.first_access_ns = s->first_access_ns;
  c.accesses = s->accesses;
  c.recomputes = s->recomputes;
  // A recompute of this tensor first regenerates its dropped ancestors; its
  // dropped consumers would need it regenerated in turn.
  if (needs.neighbourhood) c.ancestors_ns = AncestorsCost(s);
  c.consumers_ns = s->dropped_consumer_ns;
  c.neighbourhood_ns = c.ancestors_ns + c.consumers_ns;
  if (needs.classes) c.classes_ns = AdjacentClassesCost(s);
  c.address = reinterpret_cast<std::uintptr_t>(s->device);
  if (needs.adjacent_free) {
    absl::StatusOr<std::size_t> free = allocator_->AdjacentFreeBytes(s->device);
    c.adjacent_free_bytes = free.ok() ? *free : 0;
  }
  if (s->next_use_at >= 0) {
    // The hint was the program's own time to the use; recomputes run since
    // push the use back by theirs. Without this, under a tight budget a
    // tensor's hinted use soon lies in the past, and every policy reading
    // next uses takes it as due now (belady keeps it whatever it costs).
    const std::int64_t delay = stats_.recompute_ns - s->next_use_recomputed_ns;
    c.next_use_ns = s->next_use_at == kNeverUsedAgain
                        ? kNeverUsedAgain
                        : std::max<std::int64_t>(AddTimes(s->next_use_at, delay) - now, 0);
  }
  return c;
}

// How many storages ahead GatherCandidates asks for.
constexpr std::size_t kPrefetchAhead = 4;

void Runtime::GatherCandidates() {
  ++chain_epoch_;  // states may have changed since the last event: no memo carries over
  scratch_.clear();
  // All of them, or k distinct ones uniformly.
  candidates_.Sample(policy_->sampling().Size(candidates_.size()), scratch_storages_);
  if (prefetch_for_ns_ >= 0) {
    // Room for a planned prefetch: only what is next used after it may go
    // (a tensor with no hint is kept: nothing says it can wait).
    const std::int64_t prefetch_at = prefetch_for_ns_;
    std::erase_if(scratch_storages_,
                  [prefetch_at](const Storage* s) { return s->next_use_at <= prefetch_at; });
  }
  const policies::Needs needs = policy_->needs();
  const std::int64_t now = Clock();
  const std::size_t n = scratch_storages_.size();
  for (std::size_t i = 0; i < n; ++i) {
    // The storages lie apart in memory: ask for the next ones' candidate
    // fields while this one is built.
    if (i + kPrefetchAhead < n) __builtin_prefetch(&scratch_storages_[i + kPrefetchAhead]->bytes);
    scratch_.push_back(MakeCandidate(scratch_storages_[i], needs, now));
    scratch_.back().id = scratch_.size() - 1;
  }
}

void Runtime::FillContext(policies::PressureContext& ctx, std::size_t bytes, Stream stream) {
  ctx.bytes_needed = bytes;
  ctx.stream = stream;
  ctx.now_ns = Clock();
  ctx.link_backlog_ns = link_.BacklogNs(runtime_internal::HostLink::kOut, Clock());
  // The host buffers of what is offloaded (not the copies made ahead of
  // tensors still resident) come back over the link.
  const std::size_t in_use = host_pool_.in_use_bytes();
  const std::size_t offloaded = in_use - std::min(ahead_bytes_, in_use);
  ctx.restore_backlog_ns = link_.BacklogNs(runtime_internal::HostLink::kIn, Clock()) +
                           link_.CarryNs(offloaded);
  ctx.candidates = scratch_;
  if (!policy_->needs().neighbourhood) {
    ctx.complete_fn = &Runtime::CompleteCandidate;
    ctx.complete_arg = this;
  }
}

bool Runtime::Evict(const PressureRequest& request, std::size_t* freed_out) {
  if (StepLimitReached()) return false;  // AllocateDevice says why
  ++stats_.pressure_events;
  const auto choose_start = std::chrono::steady_clock::now();
  GatherCandidates();
  if (scratch_.empty()) {
    if (options_.observer != nullptr) {
      options_.observer->OnPressure({.bytes = request.bytes, .stream = request.stream});
    }
    return false;
  }
  stats_.candidates_shown += scratch_.size();
  last_pressure_bytes_ = request.bytes;
  if (const std::int64_t now = Clock(); now != last_pressure_at_) {
    if (last_pressure_at_ >= 0) {
      const std::int64_t gap = now - last_pressure_at_;
      pressure_gap_ns_ = pressure_gap_ns_ == 0 ? gap : (3 * pressure_gap_ns_ + gap) / 4;
    }
    last_pressure_at_ = now;
  }
  policies::PressureContext ctx;
  FillContext(ctx, request.bytes, request.stream);
  if (request.contiguous) {
    ctx.growth_bytes = allocator_->GrowthFor(request.bytes);
    ctx.room_bytes = request.budget > request.reserved ? request.budget - request.reserved : 0;
  }
  MemoryMap map;
  // An allocation (not the live budget's room, nor a kept address's pages)
  // needs its bytes free in one place. A plan whose bytes are scattered frees
  // them uselessly, and the allocator asks again (on an LSTM step under a
  // reserved budget, a 4 MiB request took eleven rounds and 44 MiB of
  // evictions). Two ways make room at once: the cheapest run of neighbouring
  // blocks that covers the request, or as much of the policy's own ranking as
  // it takes. The cheaper, priced alike, is carried out whole. Offloads that
  // keep their addresses keep their blocks: not with keep_addresses.
  const bool in_one_place =
      retry_in_one_place_ && request.contiguous && !options_.keep_addresses;
  bool whole_plan = false;
  if (policy_->needs().memory_map || in_one_place) {
    map = allocator_->GetMemoryMap();
    ctx.memory_map = &map;
  }
  policies::Plan plan = policy_->Choose(ctx);
  if (in_one_place && !policies::PlanMakesRoom(ctx, plan)) {
    if (MakeRoomInOnePlace(ctx, plan)) whole_plan = true;
  }
  stats_.choose_wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - choose_start)
                               .count();
  // The plan's storages, before carrying it out changes candidates_ (and so
  // possibly scratch_storages_'s source; the copy is ours).
  std::size_t freed = 0;
  std::size_t evicted = 0;
  bool progress = false;
  for (const policies::PlanStep& step : plan) {
    if (step.id >= scratch_storages_.size()) continue;  // a policy bug must not crash us
    Storage* s = scratch_storages_[step.id];
    if (s->pins > 0) continue;
    // Evicted before its use, a prefetch's copy in is abandoned (stream
    // order keeps the block until it completes) once the eviction succeeds;
    // if it fails the tensor stays prefetching, with its event to wait on.
    const bool prefetching = s->state == TensorState::kPrefetching;
    const Event prefetch_event = s->copy_event;
    const bool prefetch_in_flight = prefetching && s->copy_in_flight;
    const bool was_prefetch_evicted = s->prefetch_evicted;
    if (prefetching) {
      s->copy_in_flight = false;
      SetState(s, TensorState::kResident);
      // Before the offload, which plans prefetches (FinishOffload).
      s->prefetch_evicted = true;
    }
    if (s->state != TensorState::kResident) continue;
    const policies::Candidate& c = scratch_[step.id];
    bool done = false;
    if (step.action == policies::EvictAction::kOffload && c.can_offload) {
      done = OffloadStorage(s, request.stream);
      // The host pool is full: drop instead.
      if (!done && c.can_drop) done = DropStorage(s, request.stream, /*pressure=*/true);
    } else if (c.can_drop) {
      done = DropStorage(s, request.stream, /*pressure=*/true);
    }
    if (!done) {
      if (prefetching) {
        s->copy_event = prefetch_event;
        s->copy_in_flight = prefetch_in_flight;
        s->prefetch_evicted = was_prefetch_evicted;
        SetState(s, TensorState::kPrefetching);
      }
      continue;
    }
    if (prefetch_in_flight) events_.Give(prefetch_event);
    if (s->state == TensorState::kDropped) ++stats_.drops;
    progress = true;
    ++evicted;
    // A tensor whose address is kept gives up only the whole pages inside
    // its block; anything else, its whole block.
    freed += s->kept != nullptr ? s->kept_bytes : s->bytes;
    if (freed >= request.bytes && !whole_plan) break;
  }
  if (options_.observer != nullptr) {
    options_.observer->OnPressure({.bytes = request.bytes,
                                   .stream = request.stream,
                                   .candidates = scratch_.size(),
                                   .evicted = evicted,
                                   .freed_bytes = freed,
                                   .satisfied = progress});
  }
  if (freed_out != nullptr) *freed_out = freed;
  return progress;
}

absl::StatusOr<std::size_t> Runtime::EvictBytesLocked(std::size_t bytes, Stream stream) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("evicting 0 bytes asks for nothing: name the bytes needed");
  }
  std::size_t freed = 0;
  while (freed < bytes) {
    const std::size_t live = stats_.resident_bytes + pending_live_bytes_;
    // Bytes, not a place: the caller's memory is not ours to map.
    const PressureRequest request{bytes - freed, stream, options_.live_budget, live, live,
                                  /*contiguous=*/false};
    std::size_t now = 0;
    if (!Evict(request, &now) || now == 0) break;
    freed += now;
  }
  if (freed == 0 && StepLimitReached()) return StepLimitError();
  return freed;
}

bool Runtime::MakeRoomInOnePlace(const policies::PressureContext& ctx, policies::Plan& plan) {
  // Who reads whom among the candidates: recomputing a reader must first
  // recompute what it reads, so evicting both costs that once more (a run
  // along a chain of layers would otherwise look as cheap as one of
  // unrelated tensors). Both sides, once per event as flat lists (the
  // search visits a candidate's relations each time it joins or leaves its
  // window): reads[reads_at[i]..reads_at[i + 1]) are the candidates i
  // reads, in its inputs' order; readers[...] those that read i, by position.
  const std::size_t n = scratch_.size();
  absl::flat_hash_map<const Storage*, std::uint32_t> index_of;
  index_of.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    index_of.emplace(scratch_storages_[i], static_cast<std::uint32_t>(i));
  }
  std::vector<std::uint32_t> reads_at(n + 1, 0), reads;
  std::vector<std::uint32_t> readers_at(n + 1, 0), readers;
  for (std::size_t i = 0; i < n; ++i) {
    reads_at[i] = static_cast<std::uint32_t>(reads.size());
    for (const Storage* in : scratch_storages_[i]->inputs) {
      if (auto it = index_of.find(in); it != index_of.end()) {
        reads.push_back(it->second);
        ++readers_at[it->second + 1];
      }
    }
  }
  reads_at[n] = static_cast<std::uint32_t>(reads.size());
  for (std::size_t i = 0; i < n; ++i) readers_at[i + 1] += readers_at[i];
  readers.resize(reads.size());
  {
    std::vector<std::uint32_t> fill(readers_at.begin(), readers_at.end() - 1);
    for (std::size_t i = 0; i < n; ++i) {  // readers in increasing position
      for (std::uint32_t k = reads_at[i]; k < reads_at[i + 1]; ++k) {
        readers[fill[reads[k]]++] = static_cast<std::uint32_t>(i);
      }
    }
  }
  auto related = [&](const policies::Candidate& c,
                     absl::FunctionRef<void(const policies::Candidate&, double)> visit) {
    for (std::uint32_t k = reads_at[c.id]; k < reads_at[c.id + 1]; ++k) {
      const policies::Candidate& read = scratch_[reads[k]];
      visit(read, static_cast<double>(read.compute_ns) / policies::Staleness(c, ctx));
    }
    for (std::uint32_t k = readers_at[c.id]; k < readers_at[c.id + 1]; ++k) {
      const policies::Candidate& reader = scratch_[readers[k]];
      visit(reader, static_cast<double>(c.compute_ns) / policies::Staleness(reader, ctx));
    }
  };
  // A candidate's price, reckoned once for the run and the ranking alike.
  std::vector<double> prices(n, -1.0);  // (a price is never negative)
  auto price = [&](const policies::Candidate& c) {
    double& p = prices[c.id];
    if (p < 0) p = policies::RunCost(c, ctx);
    return p;
  };
  double run_price = std::numeric_limits<double>::infinity();
  std::optional<policies::Plan> run = policies::CheapestCoveringRun(ctx, price, related, &run_price);
  if (run.has_value() && run->empty()) run.reset();  // the hole is there already
  // The policy's ranking of every candidate, how much of it makes room, and
  // what that costs, priced as the run is.
  policies::PressureContext everything = ctx;
  everything.bytes_needed = std::numeric_limits<std::size_t>::max();
  policies::Plan ranking = policy_->Choose(everything);
  const std::optional<std::size_t> steps = policies::StepsToMakeRoom(ctx, ranking);
  double ranking_price = std::numeric_limits<double>::infinity();
  if (steps.has_value()) {
    ranking_price = 0;
    std::vector<char> taken(n, 0);
    for (std::size_t i = 0; i < *steps; ++i) {
      if (ranking[i].id >= n) continue;
      const policies::Candidate& c = scratch_[ranking[i].id];
      ranking_price += price(c);
      related(c, [&](const policies::Candidate& other, double extra) {
        if (taken[other.id]) ranking_price += extra;
      });
      taken[c.id] = 1;
    }
  }
  if (run.has_value() && run_price < ranking_price) {
    plan = *std::move(run);
    ++stats_.covering_runs;
    return true;
  }
  if (steps.has_value() && *steps > 0) {
    ranking.resize(*steps);
    plan = std::move(ranking);
    return true;
  }
  return false;  // neither makes room: the policy's plan, and the allocator asks again
}

std::int64_t Runtime::AncestorsCost(const Storage* s) const {
  std::int64_t cost = 0;
  if (s->dropped_inputs > 0) {
    for (const Storage* in : s->inputs) cost += DroppedChainCost(in);
  }
  return cost;
}

void Runtime::CompleteCandidate(const void* self, policies::Candidate& c) {
  // Called from the policy's Choose, which Evict runs under the runtime's lock.
  const auto* rt = static_cast<const Runtime*>(self);
  if (c.id >= rt->scratch_storages_.size()) return;
  c.ancestors_ns = rt->AncestorsCost(rt->scratch_storages_[c.id]);
  c.neighbourhood_ns = c.ancestors_ns + c.consumers_ns;
}

std::int64_t Runtime::DroppedChainCost(const Storage* root) const {
  // What regenerating `root` would cost if it is dropped: its closure and
  // those of the dropped ancestors it needs first, each counted once (DTR's
  // evicted neighbourhood, upstream side). The walk stops after
  // kMaxNeighbourhood tensors: enough to see a cascade, bounded per decision
  // even when a 100,000-long chain behind it is dropped.
  constexpr std::size_t kMaxNeighbourhood = 32;
  if (root->state != TensorState::kDropped) return 0;
  if (root->chain_epoch == chain_epoch_) return root->chain_cost;
  // Visited storages carry this walk's mark: no search through `seen`.
  const std::uint64_t mark = ++walk_mark_;
  absl::InlinedVector<const Storage*, kMaxNeighbourhood> seen = {root};
  root->walk_mark = mark;
  std::int64_t cost = 0;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    // One run regenerates a call's dropped outputs: its cost counts once.
    const CallGroup* g = seen[i]->group;
    if (g == nullptr) {
      cost += seen[i]->compute_ns;
    } else if (g->walk_mark != mark) {
      g->walk_mark = mark;
      cost += seen[i]->compute_ns;
    }
    for (const Storage* in : seen[i]->inputs) {
      if (seen.size() >= kMaxNeighbourhood) break;
      if (in->state == TensorState::kDropped && in->walk_mark != mark) {
        in->walk_mark = mark;
        seen.push_back(in);
      }
    }
  }
  root->chain_epoch = chain_epoch_;
  root->chain_cost = cost;
  return cost;
}

}  // namespace remat
