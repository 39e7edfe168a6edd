// EvictionPolicy: which tensors to evict, and how, when memory runs short.
//
// The runtime keeps all the bookkeeping (the tensor table, costs, access
// history, which evicted tensors a recompute would also need) and hands a
// policy one PressureContext per pressure event: the bytes it needs and a
// candidate for every tensor that may go. The policy returns a Plan, an
// ordered list of (tensor, drop | offload); the runtime carries it out in
// order until the request fits. A policy is therefore a few lines of
// scoring over a shared model of the tensors, as in the DTR simulator.
#ifndef REMAT_POLICIES_EVICTION_POLICY_H_
#define REMAT_POLICIES_EVICTION_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "absl/types/span.h"
#include "allocator/snapshot.h"
#include "device/device.h"

namespace remat::policies {

enum class EvictAction : std::uint8_t {
  kDrop,     // free the bytes; the recompute closure regenerates them on the next use
  kOffload,  // copy to pinned host memory; copied back on the next use (or by prefetch)
};
const char* EvictActionName(EvictAction action);  // "drop", "offload"

// One tensor that may be evicted now (resident and not pinned by a guard).
// A next use that never comes (Candidate::next_use_ns, Runtime::HintNextUse).
inline constexpr std::int64_t kNeverUsedAgain = INT64_MAX;

struct Candidate {
  std::uint64_t id = 0;            // the runtime's tensor id
  std::size_t bytes = 0;           // device bytes its eviction frees
  std::int64_t compute_ns = 0;     // cost of re-running its closure
  std::int64_t transfer_ns = 0;    // cost of copying it out and back
  bool can_drop = false;           // it has a recompute closure and allows dropping
  bool can_offload = false;        // it allows offloading
  // Its copy out was started before this pressure (RuntimeOptions::copy_ahead):
  // an offload frees its block with no copy out queued now, and leaves only
  // the copy back to pay (OffloadNs). (Beside the other flags: a candidate
  // fills two cache lines, not three.)
  bool copied_out = false;
  std::int64_t last_access_ns = 0; // the runtime's clock (Runtime::NowNs) at its last use
  std::uint64_t accesses = 0;      // uses so far
  // Cost of the evicted tensors a recompute of this one would also have to
  // regenerate, or that would need it regenerated (DTR's evicted
  // neighbourhood): ancestors_ns + consumers_ns.
  std::int64_t neighbourhood_ns = 0;
  std::int64_t ancestors_ns = 0;   // dropped ancestors it needs first (each once, up to 32)
  std::int64_t consumers_ns = 0;   // dropped tensors whose closures read it
  // DTR's equivalence-class estimate of the neighbourhood: the summed cost of
  // the distinct classes of dropped tensors adjacent to it (Needs::classes).
  std::int64_t classes_ns = 0;
  std::uint64_t recomputes = 0;    // times it has been regenerated
  std::uintptr_t address = 0;      // device address of its block
  // Free bytes right before and after its block (Needs::adjacent_free).
  std::size_t adjacent_free_bytes = 0;
  // Time until its next use, when the program told the runtime (a trace
  // replay knows it) or the runtime learned it from the step before; the
  // recomputes run since the hint are added (they delay the program);
  // kNeverUsedAgain if it will not be; -1 when unknown.
  std::int64_t next_use_ns = -1;
  std::int64_t first_access_ns = 0;  // the runtime's clock at its creation
};
static_assert(sizeof(Candidate) <= 128);  // two cache lines: ~250 are built per pressure event

// What offloading the candidate costs on the link: out and back
// (transfer_ns), or only back when it was copied out ahead.
inline std::int64_t OffloadNs(const Candidate& c) {
  return c.copied_out ? c.transfer_ns / 2 : c.transfer_ns;
}

// What a policy needs beyond the basic candidate fields; each costs the
// runtime work per pressure event, so only policies that ask get it.
struct Needs {
  // Candidate::ancestors_ns (and so neighbourhood_ns) in every candidate: a
  // walk over the dropped ancestors of each. Policies that do not score by it
  // say false and get it, through PressureContext::Complete, for the
  // candidates they evict (to choose drop or offload).
  bool neighbourhood = true;
  bool classes = false;        // Candidate::classes_ns
  bool adjacent_free = false;  // Candidate::adjacent_free_bytes
  bool memory_map = false;     // PressureContext::memory_map
  bool next_use = false;       // Candidate::next_use_ns: drivers that know the future hint it
};

struct PressureContext {
  std::size_t bytes_needed = 0;  // what the pending request lacks
  // For the allocator's requests (0 for the live budget's): what the pool
  // would grow by to serve the request, and how far the reserved bytes are
  // below the budget now.
  std::size_t growth_bytes = 0;
  std::size_t room_bytes = 0;
  Stream stream;                 // the stream of the pending request
  std::int64_t now_ns = 0;       // the runtime's clock (Runtime::NowNs)
  // The link has one copy engine each way, side by side (the runtime's
  // estimates, from its HostLink):
  // how long the device-to-host direction stays busy with the copies out
  // already queued: what an offload now waits for before it starts;
  std::int64_t link_backlog_ns = 0;
  // how long the host-to-device direction needs for the copies in already
  // queued and to bring back everything now offloaded (on host or on its way
  // there): what an offload's own restore competes with.
  std::int64_t restore_backlog_ns = 0;
  absl::Span<const Candidate> candidates;
  const MemoryMap* memory_map = nullptr;  // for allocator-aware policies; may be null

  // Fills in what Needs left out of a copy of a candidate (its
  // ancestors_ns and neighbourhood_ns); a no-op where nothing was left out.
  void Complete(Candidate& c) const {
    if (complete_fn != nullptr) complete_fn(complete_arg, c);
  }
  void (*complete_fn)(const void* arg, Candidate& c) = nullptr;  // set by the runtime
  const void* complete_arg = nullptr;
};

struct PlanStep {
  std::uint64_t id = 0;
  EvictAction action = EvictAction::kDrop;
  friend bool operator==(const PlanStep& a, const PlanStep& b) {
    return a.id == b.id && a.action == b.action;
  }
};
using Plan = std::vector<PlanStep>;

// How many of the evictable tensors a pressure event shows the policy: all of
// them (exact, O(n) per event), or a random sample (DTR's sqrt(n) sampling),
// which keeps a decision cheap when the tensor table is large.
struct Sampling {
  enum class Kind : std::uint8_t { kAll, kSqrt, kCount, kFraction };
  Kind kind = Kind::kAll;
  double value = 0;  // kCount: how many; kFraction: which share, in (0, 1)

  // Parses "all", "sqrt", a count ("64") or a fraction ("0.1").
  static absl::StatusOr<Sampling> Parse(std::string_view text);
  std::string ToString() const;  // what Parse reads back
  // How many of n candidates to sample: at least 1 when n > 0, at most n.
  std::size_t Size(std::size_t n) const;
};

// A whole-step run a driver that can replay the step more than once (the
// simulator) makes beside others, keeping the cheapest: the policy `mixed`
// with offload allowed, and the policy `drops` with drops only (specs;
// `drops` empty: no drop-only run).
struct Trial {
  std::string mixed;
  std::string drops;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // The spec that recreates this policy, parameters common to every policy
  // included: "dtr:staleness_exp=1,sample=sqrt".
  std::string Spec() const;
  // Steps whose candidates' bytes cover ctx.bytes_needed when they can (all
  // candidates' worth otherwise), most preferred first. Never names a
  // candidate twice, never one that allows neither action. The runtime may
  // ask twice in one pressure event: the second time with bytes_needed at
  // its largest, for a ranking of every candidate (see
  // RuntimeOptions::retry_in_one_place).
  virtual Plan Choose(const PressureContext& ctx) = 0;

  virtual Needs needs() const { return {}; }
  // How far ahead (in the program's time) a driver that knows the future
  // may prefetch offloaded tensors for this policy; 0: no prefetching.
  virtual std::int64_t prefetch_window_ns() const { return 0; }
  // Within that window, a prefetch starts this many times its copy's time
  // before the use (earlier by the copies in queued ahead of it; never while
  // the use is further off than the window).
  virtual double prefetch_lead() const { return 2.0; }
  // The runs a driver that can replay the whole step should make in place of
  // this policy's own, keeping the cheapest (hybrid with rank=auto: itself
  // over each policy's ranking). Empty: just this policy's run.
  virtual std::vector<Trial> Trials() const { return {}; }

  const Sampling& sampling() const { return sampling_; }
  void set_sampling(Sampling sampling) { sampling_ = sampling; }

 protected:
  // The policy's own part of the spec: "dtr:staleness_exp=1".
  virtual std::string OwnSpec() const = 0;

 private:
  Sampling sampling_;
};

}  // namespace remat::policies

#endif  // REMAT_POLICIES_EVICTION_POLICY_H_
