#include "sim/chain_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "base/json_writer.h"
#include "device/sim_device.h"
#include "policies/registry.h"
#include "runtime/runtime.h"
#include "runtime/stack.h"

namespace remat {
namespace {

constexpr char kRevolve[] = "revolve";
constexpr std::size_t kMaxStateBytes = kGiB;

// The device, the allocator and the runtime of one run.
absl::StatusOr<Stack> MakeEnv(const policies::PolicySpec& policy, bool enable_drop,
                              std::size_t live_budget) {
  DeviceSpec device;
  device.kind = DeviceSpec::Kind::kSim;
  device.sim.capacity = SimDevice::kMaxCapacity;
  AllocatorOptions allocator;
  RuntimeOptions rt;
  ForOneThread(&device.sim, &allocator, &rt);  // one thread runs the chain
  rt.policy = policy;
  rt.enable_drop = enable_drop;
  rt.enable_offload = false;
  rt.live_budget = live_budget;
  return MakeStack(device, allocator, std::move(rt));
}

// An online run that computed more forward steps than it may.
absl::Status Stopped(std::uint64_t max) {
  return absl::OutOfRangeError(absl::StrFormat(
      "stopped after %d forward steps, the most a run may take: the policy recomputes more "
      "than this chain allows (try more slots, fewer steps, or --policy revolve)",
      max));
}

// What a run has done so far. The forward-step count is shared with the
// recompute closures, which the runtime may run after the run returns an error.
struct Progress {
  std::shared_ptr<std::uint64_t> forward = std::make_shared<std::uint64_t>(0);
  std::uint64_t reversed = 0;
  TensorId adjoint = 0;
};

class ChainRunner {
 public:
  ChainRunner(const ChainRunOptions& options, Stack& env) : o_(options), env_(env) {}

  // One forward step on the compute stream.
  absl::Status Step() {
    if (++*progress_.forward > o_.max_forward_steps) return Stopped(o_.max_forward_steps);
    return env_.device->LaunchHostFunc(
        kDefaultStream, [] {}, o_.step_ns);
  }

  // Reverses the next step from the pinned working state: the step again,
  // recorded, then its reverse, into the adjoint (created by the first turn).
  absl::Status Turn() {
    if (progress_.adjoint == 0) {
      absl::StatusOr<Guard> a = env_.runtime->Create(o_.state_bytes, TensorOptions{});
      if (!a.ok()) return a.status();
      progress_.adjoint = a->id();
    }
    absl::StatusOr<Guard> a = env_.runtime->Acquire(progress_.adjoint);
    if (!a.ok()) return a.status();
    // The recorded step writes its output like any other (it is of no use
    // after the reverse): a turn needs the same room as an advance, so the
    // room for a step's output never serves as one more slot.
    TensorId output = 0;
    {
      absl::StatusOr<Guard> out = env_.runtime->Create(o_.state_bytes, TensorOptions{});
      if (!out.ok()) return out.status();
      output = out->id();
      if (absl::Status s = Step(); !s.ok()) return s;
      ++progress_.reversed;
      if (absl::Status s = env_.device->LaunchHostFunc(
              kDefaultStream, [] {}, o_.reverse_ns);
          !s.ok()) {
        return s;
      }
    }
    return env_.runtime->Free(output);
  }

  // Online: a forward sweep of droppable states, then the reverse, with the
  // runtime regenerating dropped states on access.
  absl::Status RunOnline() {
    const std::int64_t n = o_.steps;
    std::vector<TensorId> ids(static_cast<std::size_t>(n), 0);
    {
      absl::StatusOr<Guard> x0 = env_.runtime->Create(o_.state_bytes, TensorOptions{});
      if (!x0.ok()) return x0.status();
      ids[0] = x0->id();
    }
    for (std::int64_t q = 1; q < n; ++q) {
      absl::StatusOr<Guard> in = env_.runtime->Acquire(ids[q - 1]);
      if (!in.ok()) return in.status();
      TensorOptions options;
      options.inputs = {ids[q - 1]};
      options.compute_ns = o_.step_ns;
      options.allow_drop = true;
      options.recompute = [device = env_.device.get(), forward = progress_.forward, ns = o_.step_ns,
                           max = o_.max_forward_steps](const RecomputeArgs& args) -> absl::Status {
        if (++*forward > max) return Stopped(max);
        return device->LaunchHostFunc(
            args.stream, [] {}, ns);
      };
      absl::StatusOr<Guard> out = env_.runtime->Create(o_.state_bytes, std::move(options));
      if (!out.ok()) return out.status();
      ids[q] = out->id();
      if (absl::Status s = Step(); !s.ok()) return s;
    }
    for (std::int64_t m = n; m >= 1; --m) {
      {
        absl::StatusOr<Guard> x = env_.runtime->Acquire(ids[m - 1]);
        if (!x.ok()) return x.status();
        if (absl::Status s = Turn(); !s.ok()) return s;
      }
      if (absl::Status s = env_.runtime->Free(ids[m - 1]); !s.ok()) return s;
    }
    return env_.runtime->Free(progress_.adjoint);
  }

  // Revolve: the planner's schedule, with unevictable states freed once no
  // slot and no working state holds them.
  absl::Status RunSchedule(absl::Span<const revolve::Action> schedule) {
    absl::flat_hash_map<TensorId, int> holders;
    absl::flat_hash_map<std::int64_t, TensorId> slots;
    auto let_go = [&](TensorId id) -> absl::Status {
      if (--holders[id] > 0) return absl::OkStatus();
      holders.erase(id);
      return env_.runtime->Free(id);
    };
    TensorId working = 0;  // 0: spent by a turn
    {
      absl::StatusOr<Guard> x0 = env_.runtime->Create(o_.state_bytes, TensorOptions{});
      if (!x0.ok()) return x0.status();
      working = x0->id();
      holders[working] = 1;
    }
    for (const revolve::Action& a : schedule) {
      switch (a.kind) {
        case revolve::ActionKind::kTakeshot: {
          auto [it, fresh] = slots.try_emplace(a.slot, working);
          if (!fresh) {
            if (absl::Status s = let_go(it->second); !s.ok()) return s;
            it->second = working;
          }
          ++holders[working];
          break;
        }
        case revolve::ActionKind::kRestore:
          if (working != 0) {
            if (absl::Status s = let_go(working); !s.ok()) return s;
          }
          working = slots.at(a.slot);
          ++holders[working];
          break;
        case revolve::ActionKind::kAdvance:
          for (std::int64_t j = 0; j < a.steps; ++j) {
            TensorId next = 0;
            {
              absl::StatusOr<Guard> in = env_.runtime->Acquire(working);
              if (!in.ok()) return in.status();
              absl::StatusOr<Guard> out = env_.runtime->Create(o_.state_bytes, TensorOptions{});
              if (!out.ok()) return out.status();
              next = out->id();
              if (absl::Status s = Step(); !s.ok()) return s;
            }
            if (absl::Status s = let_go(working); !s.ok()) return s;
            working = next;
            holders[working] = 1;
          }
          break;
        case revolve::ActionKind::kFirstTurn:
        case revolve::ActionKind::kYouTurn: {
          {
            absl::StatusOr<Guard> x = env_.runtime->Acquire(working);
            if (!x.ok()) return x.status();
            if (absl::Status s = Turn(); !s.ok()) return s;
          }
          if (absl::Status s = let_go(working); !s.ok()) return s;
          working = 0;
          break;
        }
      }
    }
    for (const auto& [slot, id] : slots) {
      if (absl::Status s = let_go(id); !s.ok()) return s;
    }
    return env_.runtime->Free(progress_.adjoint);
  }

  const Progress& progress() const { return progress_; }

 private:
  const ChainRunOptions& o_;
  Stack& env_;
  Progress progress_;
};

// The least forward steps any run of the chain computes: t(N, C) advances
// and the N recorded steps.
std::uint64_t LeastWork(std::int64_t steps, std::int64_t slots) {
  absl::StatusOr<std::uint64_t> t = revolve::OptimalAdvances(steps, slots);
  if (!t.ok() || *t > UINT64_MAX - static_cast<std::uint64_t>(steps)) return UINT64_MAX;
  return *t + static_cast<std::uint64_t>(steps);
}

absl::Status CheckWork(const ChainRunOptions& o, std::uint64_t optimal) {
  const std::uint64_t n = static_cast<std::uint64_t>(o.steps);
  const std::uint64_t least = optimal > UINT64_MAX - n ? UINT64_MAX : optimal + n;
  if (least <= o.max_forward_steps) return absl::OkStatus();
  // The fewest slots that keep this chain under the limit (work falls as
  // slots grow; N slots store every state), and the most steps with these.
  std::int64_t lo = o.slots + 1, hi = o.steps;
  if (LeastWork(o.steps, hi) > o.max_forward_steps) hi = -1;  // no slots are enough
  while (hi > 0 && lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (LeastWork(o.steps, mid) <= o.max_forward_steps) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::int64_t most = 0;
  for (std::int64_t step = std::int64_t{1} << 40; step > 0; step /= 2) {
    if (most + step <= revolve::kMaxSteps &&
        LeastWork(most + step, o.slots) <= o.max_forward_steps) {
      most += step;
    }
  }
  const char* const slots = o.slots == 1 ? "slot" : "slots";
  std::string fix = absl::StrFormat("at most %d steps with %d %s", most, o.slots, slots);
  if (hi > 0) fix = absl::StrFormat("--slots %d or more, or %s", hi, fix);
  return absl::InvalidArgumentError(absl::StrFormat(
      "a chain of %d steps with %d %s takes at least %d forward steps (t(N,C) = %d "
      "advances and %d recorded), more than the %d a run may take (its time and memory grow "
      "with them): give %s",
      o.steps, o.slots, slots, least, optimal, o.steps, o.max_forward_steps, fix));
}

}  // namespace

absl::StatusOr<ChainRunReport> RunChain(const ChainRunOptions& o) {
  const auto wall_start = std::chrono::steady_clock::now();
  if (absl::Status s = revolve::CheckChain(o.steps, o.slots); !s.ok()) return s;
  if (o.state_bytes == 0 || o.state_bytes > kMaxStateBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the state size must be between 1 byte and %s (got %d bytes)",
                        FormatBytes(kMaxStateBytes), o.state_bytes));
  }
  if (o.step_ns < 0 || o.reverse_ns < 0) {
    return absl::InvalidArgumentError("step costs cannot be negative");
  }
  const bool offline = o.policy == kRevolve;
  // Parsed and checked once, here; the runtime makes its policy from it.
  const policies::PolicySpec spec(offline ? std::string_view("lru") : std::string_view(o.policy));
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.status().message(), "; or 'revolve', the offline binomial schedule"));
  }
  if (spec.name() == "belady") {
    return absl::InvalidArgumentError(
        "belady evicts by each state's next use, which remat chain does not tell the runtime "
        "(without it belady is lru): use revolve, the offline optimum that knows the future, "
        "or replay a chain trace with remat sim (examples/traces/chain_100.jsonl)");
  }
  absl::StatusOr<std::uint64_t> optimal = revolve::OptimalAdvances(o.steps, o.slots);
  if (!optimal.ok()) return optimal.status();
  if (absl::Status s = CheckWork(o, *optimal); !s.ok()) return s;

  ChainRunReport report;
  report.status = "ok";
  report.steps = o.steps;
  report.slots = o.slots;
  report.optimal_advances = *optimal;
  report.state_bytes = o.state_bytes;
  // Slots past N hold nothing; with them clamped the product fits easily.
  report.budget_states = std::min(o.slots, o.steps) + 3;
  report.budget_bytes = static_cast<std::uint64_t>(report.budget_states) * o.state_bytes;

  std::vector<revolve::Action> schedule;
  std::uint64_t planned = 0;
  if (offline) {
    absl::StatusOr<std::vector<revolve::Action>> plan = revolve::Plan(o.steps, o.slots);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<revolve::Execution> checked = revolve::Execute(*plan, o.steps, o.slots);
    if (!checked.ok()) {
      return absl::InternalError(
          absl::StrCat("the planner's schedule is invalid: ", checked.status().message()));
    }
    planned = checked->advances;
    schedule = std::move(*plan);
    report.schedule_actions = schedule.size();
  }

  absl::StatusOr<Stack> env =
      MakeEnv(spec, /*enable_drop=*/!offline, report.budget_bytes);
  if (!env.ok()) return env.status();
  report.policy = offline ? kRevolve : env->runtime->policy().Spec();
  ChainRunner runner(o, *env);
  absl::Status ran = offline ? runner.RunSchedule(schedule) : runner.RunOnline();
  if (*runner.progress().forward > o.max_forward_steps) return Stopped(o.max_forward_steps);
  if (absl::IsResourceExhausted(ran)) {
    report.status = "oom";
    report.message = std::string(ran.message());
  } else if (!ran.ok()) {
    return ran;
  }
  (void)env->device->Synchronize();
  const RuntimeStats rs = env->runtime->stats();
  const Progress& p = runner.progress();
  report.forward_steps = *p.forward;
  report.reversed_steps = p.reversed;
  report.advances = report.forward_steps - report.reversed_steps;
  const std::uint64_t sweep = static_cast<std::uint64_t>(o.steps - 1);
  report.repeated_advances = report.advances > sweep ? report.advances - sweep : 0;
  if (report.optimal_advances > 0) {
    report.ratio =
        static_cast<double>(report.advances) / static_cast<double>(report.optimal_advances);
  } else {
    report.ratio = report.advances == 0 ? 1.0 : HUGE_VAL;
  }
  report.recomputes = rs.recomputes;
  report.evictions = rs.drops + rs.offloads;
  report.peak_resident_bytes = rs.peak_resident_bytes;
  report.time_ns = env->device->NowNs();
  if (offline && report.status == "ok" &&
      (report.advances != planned || rs.recomputes != 0 || rs.drops != 0)) {
    return absl::InternalError(absl::StrFormat(
        "the runtime carried out the schedule with %d advances, %d recomputes and %d drops; "
        "the planner counted %d advances",
        report.advances, rs.recomputes, rs.drops, planned));
  }
  if (o.keep_schedule) report.schedule = std::move(schedule);
  env->runtime.reset();
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return report;
}

std::string ChainReportToJson(const ChainRunReport& r) {
  JsonWriter w;
  w.BeginObject();
  w.Key("steps").Int(r.steps);
  w.Key("slots").Int(r.slots);
  w.Key("policy").String(r.policy);
  w.Key("status").String(r.status);
  if (!r.message.empty()) w.Key("message").String(r.message);
  w.Key("advances").Uint(r.advances);
  w.Key("optimal_advances").Uint(r.optimal_advances);
  w.Key("ratio").Double(r.ratio);
  w.Key("repeated_advances").Uint(r.repeated_advances);
  w.Key("forward_steps").Uint(r.forward_steps);
  w.Key("reversed_steps").Uint(r.reversed_steps);
  w.Key("recomputes").Uint(r.recomputes);
  w.Key("evictions").Uint(r.evictions);
  w.Key("state_bytes").Uint(r.state_bytes);
  w.Key("budget_states").Int(r.budget_states);
  w.Key("budget_bytes").Uint(r.budget_bytes);
  w.Key("peak_resident_bytes").Uint(r.peak_resident_bytes);
  if (r.policy == kRevolve) w.Key("schedule_actions").Uint(r.schedule_actions);
  if (!r.schedule.empty()) {
    // One object an action: its kind, the state it starts from, and the
    // steps of an advance or the slot of a takeshot or restore.
    w.Key("schedule").BeginArray();
    for (const revolve::Action& a : r.schedule) {
      w.BeginObject();
      w.Key("action").String(revolve::ActionKindName(a.kind));
      w.Key("position").Int(a.position);
      if (a.kind == revolve::ActionKind::kAdvance) w.Key("steps").Int(a.steps);
      if (a.kind == revolve::ActionKind::kTakeshot || a.kind == revolve::ActionKind::kRestore) {
        w.Key("slot").Int(a.slot);
      }
      w.EndObject();
    }
    w.EndArray();
  }
  w.Key("time_ns").Int(r.time_ns);
  w.Key("wall_seconds").Double(r.wall_seconds);
  w.EndObject();
  return w.Take();
}

}  // namespace remat
