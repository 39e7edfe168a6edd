#include "sim/op_replay.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "base/byte_pattern.h"
#include "base/units.h"
#include "device/sim_device.h"
#include "policies/registry.h"
#include "runtime/observer.h"
#include "runtime/runtime.h"
#include "runtime/stack.h"
#include "runtime/step_planner.h"
#include "sim/sim_timeline.h"

namespace remat {
namespace {

// Replays a trace through a runtime of its own. It tells the runtime each
// tensor's next use where the policy wants it (the runtime then prefetches
// by itself where the policy has a prefetch window), and listens to the
// runtime (RuntimeObserver) only to record a timeline. A plain run installs
// no observer and pays a test of a null pointer per runtime event.
class Replayer final : public RuntimeObserver {
 public:
  Replayer(const OpTrace& trace, const OpReplayOptions& options)
      : trace_(trace), options_(options) {}

  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<OpReplayReport> Run() {
    const auto wall_start = std::chrono::steady_clock::now();
    SimDeviceOptions dev;
    AllocatorOptions allocator_options{.budget = options_.budget,
                                       .max_split_size = EffectiveMaxSplit(options_)};
    RuntimeOptions rt;
    // One thread owns the whole stack: no locks (a fifth of a record's time).
    ForOneThread(&dev, &allocator_options, &rt);
    dev.capacity = SimDevice::kMaxCapacity;
    dev.backed = options_.verify;
    dev.cost.host_to_device_gbps = dev.cost.device_to_host_gbps = options_.link_gbps;
    dev.cost.copy_latency_ns = options_.link_latency_ns;
    dev.host_capacity = std::max<std::size_t>(dev.host_capacity, options_.host_memory);
    absl::StatusOr<std::unique_ptr<SimDevice>> device = SimDevice::Create(dev);
    if (!device.ok()) return device.status();
    device_ = device->get();
    device_->CorruptNextCopiesIn(options_.corrupt_copies_in);
    rt.policy = options_.policy;
    rt.enable_drop = options_.enable_drop;
    rt.enable_offload = options_.enable_offload;
    rt.link_gbps = options_.link_gbps;
    rt.link_latency_ns = options_.link_latency_ns;
    rt.host_pool_bytes = options_.host_memory;
    rt.live_budget = options_.live_budget;
    rt.retry_in_one_place = options_.retry_in_one_place;
    rt.keep_regenerated = options_.keep_regenerated;
    rt.copy_ahead = options_.copy_ahead;
    const bool learned = options_.future == Future::kLearned;
    if (learned && options_.timeline != nullptr) {
      return absl::InvalidArgumentError(
          "a timeline is drawn of one step: not with the future learned (two steps)");
    }
    rt.learn_next_use = learned;
    // A learning step runs blind (a policy that goes by next uses may thrash
    // then, as a training loop's first step would) and only has to end: its
    // thrash limit is kLearningThrashFactor x the reported step's.
    thrash_limit_ = options_.thrash_limit * (learned ? kLearningThrashFactor : 1);
    rt.max_steps = MaxSteps(trace_.records.size(), thrash_limit_) +
                   (learned ? MaxSteps(trace_.records.size(), options_.thrash_limit) : 0);
    // The policy is made here, so that whether it wants next-use hints is
    // known before the runtime is.
    absl::StatusOr<std::unique_ptr<policies::EvictionPolicy>> policy = options_.policy.Make();
    if (!policy.ok()) return policy.status();
    rt.custom_policy = std::move(*policy);
    hints_ = options_.future == Future::kKnown &&
             (rt.custom_policy->needs().next_use || rt.custom_policy->prefetch_window_ns() > 0);
    budgeted_ = options_.budget != 0 || options_.live_budget != 0;
    timeline_ = options_.timeline;
    if (timeline_ != nullptr) {
      rt.observer = this;
      storage_of_.assign(trace_.tensors.size() + 1, kNoOpIndex);
    }
    if (absl::Status conf = ApplyAllocConf(options_.alloc_conf, &allocator_options); !conf.ok()) {
      return conf;
    }
    absl::StatusOr<Stack> stack = MakeStack(*std::move(device), allocator_options, std::move(rt));
    if (!stack.ok()) return stack.status();
    stack_ = std::move(*stack);
    alloc_ = stack_.allocator.get();
    runtime_ = stack_.runtime.get();

    ids_.assign(trace_.tensors.size(), 0);
    if (hints_) PlanTheFuture();
    checksums_ = std::make_shared<std::vector<std::uint64_t>>(trace_.tensors.size(), 0);
    counters_ = std::make_shared<Counters>();
    report_.policy = runtime_->policy().Spec();
    report_.budget_bytes = options_.live_budget != 0 ? options_.live_budget : options_.budget;
    report_.alloc_conf = options_.alloc_conf;
    const std::size_t max_split = alloc_->max_split_size();
    report_.max_split_bytes = max_split == std::numeric_limits<std::size_t>::max() ? 0 : max_split;
    report_.status = "ok";
    report_.future = FutureName(options_.future);
    if (timeline_ != nullptr) StartTimeline();
    auto loop_start = std::chrono::steady_clock::now();
    RuntimeStats before{};               // the runtime's counters as the reported step began
    std::int64_t& start_ns = start_ns_;  // and the simulated time
    for (int step = learned ? 0 : 1; step < 2 && report_.status == "ok"; ++step) {
      if (step == 1 && learned) {
        // The first step taught the runtime; the second is the one reported.
        if (absl::Status s = NextStep(); !s.ok()) return s;
        before = runtime_->stats();
        start_ns = device_->NowNs();
        loop_start = std::chrono::steady_clock::now();
      }
      reporting_ = step == 1;
      if (absl::Status s = ReplayRecords(); !s.ok()) return s;
      if (report_.status != "ok" && step == 0) {
        report_.message = "the first step, which the runtime learns from: " + report_.message;
      }
    }
    (void)device_->Synchronize();  // the simulated work still queued is part of the replay
    report_.replay_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    const RuntimeStats rs = runtime_->stats();
    const AllocatorStats as = alloc_->GetStats();
    report_.time_ns = device_->NowNs() - start_ns;
    if (timeline_ != nullptr) {
      timeline_->AddSample(
          {report_.time_ns, device_->ReservedBytes(), rs.resident_bytes, host_bytes_});
    }
    report_.peak_reserved_bytes = static_cast<std::uint64_t>(as.reserved_bytes.all().peak);
    report_.peak_live_bytes = rs.peak_resident_bytes;
    report_.recomputed_ops = rs.recomputes - before.recomputes;
    report_.recompute_ns = rs.recompute_ns - before.recompute_ns;
    report_.offloaded_bytes = rs.offloaded_bytes - before.offloaded_bytes;
    report_.restored_bytes = rs.restored_bytes - before.restored_bytes;
    report_.evictions = rs.drops + rs.offloads - before.drops - before.offloads;
    report_.directed_evictions = rs.directed_evictions - before.directed_evictions;
    report_.pressure_events = rs.pressure_events - before.pressure_events;
    report_.covering_runs = rs.covering_runs - before.covering_runs;
    report_.copies_ahead = rs.copies_ahead - before.copies_ahead;
    report_.ahead_offloads = rs.ahead_offloads - before.ahead_offloads;
    report_.copied_ahead_bytes = rs.copied_ahead_bytes - before.copied_ahead_bytes;
    report_.candidates_shown = rs.candidates_shown - before.candidates_shown;
    report_.choose_wall_ns = rs.choose_wall_ns - before.choose_wall_ns;
    report_.stall_ns =
        std::max<std::int64_t>(0, report_.time_ns - report_.compute_ns - report_.recompute_ns);
    report_.verified_accesses = counters_->verified;
    report_.mismatches = counters_->mismatches;
    report_.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    stack_.runtime.reset();
    runtime_ = nullptr;
    return report_;
  }

 private:
  // Replays the trace's records once: a hard error is returned; an oom or a
  // thrash ends the loop with report_.status saying which.
  ABSL_ATTRIBUTE_NOINLINE absl::Status ReplayRecords() {
    for (const OpRecord& r : trace_.records) {
      absl::Status s = Step(r);
      if (s.ok() && hints_) s = LookAhead(r);
      if (s.ok()) s = CheckBeaten();
      if (options_.check_invariants) {
        // Whatever the record ended with (an oom or a thrash too), the
        // allocator and the runtime must be sound.
        absl::Status sound = alloc_->CheckInvariants();
        if (sound.ok()) sound = runtime_->CheckInvariants();
        if (!sound.ok()) {
          return absl::InternalError(
              absl::StrFormat("%s:%d: a broken invariant after this record: %s", trace_.name,
                              r.line, sound.message()));
        }
      }
      ++report_.records;
      if (!s.ok() && (absl::IsResourceExhausted(s) || absl::IsAborted(s))) {
        // Aborted: the thrash limit, reached inside a recompute, the
        // runtime's step bound (a run that would not end), or the time
        // another run already took (beaten_after_ns).
        report_.status = absl::IsResourceExhausted(s) ? "oom" : beaten_ ? "beaten" : "thrash";
        report_.message = absl::StrFormat("%s:%d: %s", trace_.name, r.line, s.message());
        if (timeline_ != nullptr) {
          EndRecord();
          timeline_->SetEnd(report_.status, report_.message, Frontier());
        }
        break;
      }
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrFormat("%s:%d: %s", trace_.name, r.line, s.message()));
      }
      // (Recompute grows only inside the closures, which check the thrash limit.)
      if (timeline_ != nullptr) EndRecord();
      if (options_.verify && device_->PendingWork() > options_.verify_queue_limit) {
        if (absl::Status waited = device_->Synchronize(); !waited.ok()) {
          return absl::Status(waited.code(),
                              absl::StrFormat("%s:%d: %s", trace_.name, r.line, waited.message()));
        }
        ++report_.verify_waits;
      }
    }
    return absl::OkStatus();
  }

  // Between the learning step and the reported one (Future::kLearned): what
  // the trace left alive goes, the runtime ends its step, and the figures
  // start again (peaks included).
  absl::Status NextStep() {
    for (std::size_t t = 0; t < trace_.tensors.size(); ++t) {
      if (ids_[t] == 0 || trace_.tensors[t].released_by != kNoOpIndex) continue;
      if (absl::Status s = runtime_->Free(ids_[t]); !s.ok()) return s;
    }
    if (absl::Status s = device_->Synchronize(); !s.ok()) return s;
    if (absl::Status s = runtime_->EndStep(); !s.ok()) return s;
    // The reported step starts from an empty cache, as a single step does
    // (its reserved peak is its own).
    if (absl::Status s = alloc_->EmptyCache(); !s.ok()) return s;
    ids_.assign(trace_.tensors.size(), 0);
    thrash_limit_ = options_.thrash_limit;
    alloc_->ResetPeakStats();
    runtime_->ResetPeakStats();
    report_.compute_ns = 0;
    report_.records = 0;
    recompute_ns_ = 0;
    return absl::OkStatus();
  }

  struct Counters {
    std::uint64_t verified = 0;
    std::uint64_t mismatches = 0;
  };

  // For each record, the next record reading each storage it touches, and
  // the trace's compute time up to each record: what a policy that knows the
  // future (belady, hybrid) is told.
  void PlanTheFuture() {
    const std::size_t n = trace_.records.size();
    cum_cost_.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const OpRecord& r = trace_.records[i];
      cum_cost_[i + 1] = cum_cost_[i] + (r.kind == OpKind::kCall ? r.cost_ns : 0);
    }
    next_read_.assign(n, {});
    std::vector<std::uint32_t> next(trace_.tensors.size(), kNoOpIndex);  // by storage
    for (std::size_t i = n; i-- > 0;) {
      const OpRecord& r = trace_.records[i];
      auto& after = next_read_[i];
      for (std::uint32_t t : r.outputs) {
        after.emplace_back(t, next[trace_.tensors[t].storage]);
      }
      if (r.kind == OpKind::kCall || r.kind == OpKind::kUse) {
        for (std::uint32_t t : r.inputs) after.emplace_back(t, next[trace_.tensors[t].storage]);
        for (std::uint32_t t : r.inputs)
          next[trace_.tensors[t].storage] = static_cast<std::uint32_t>(i);
      }
    }
  }

  // After record `r`: hints the next use of what it touched (the runtime
  // prefetches from the hints where its policy has a prefetch window).
  absl::Status LookAhead(const OpRecord& r) {
    const auto i = static_cast<std::size_t>(&r - trace_.records.data());
    {
      const std::int64_t now = runtime_->NowNs();  // the clock hints are read on
      for (const auto& [t, next] : next_read_[i]) {
        if (trace_.tensors[t].released_by != kNoOpIndex && trace_.tensors[t].released_by <= i) {
          continue;
        }
        const std::int64_t at = next == kNoOpIndex ? Runtime::kNeverUsedAgain
                                                   : now + (cum_cost_[next] - cum_cost_[i + 1]);
        (void)runtime_->HintNextUse(ids_[t], at);  // a view's storage may be gone: no matter
      }
    }
    return absl::OkStatus();
  }

  std::size_t Bytes(std::uint32_t t) const {
    const std::uint64_t b = trace_.tensors[trace_.tensors[t].storage].bytes;
    if (options_.scale == 1) return static_cast<std::size_t>(b);  // no division
    return static_cast<std::size_t>((b + options_.scale - 1) / options_.scale);
  }

  // Enqueues the call's work for `out` on the stream: the compute itself in
  // the cost, and in verify mode the bytes (and, the first time, their checksum).
  absl::Status Launch(Stream stream, std::uint32_t out, absl::Span<const std::uint32_t> inputs,
                      absl::Span<void* const> input_ptrs, void* out_ptr, std::int64_t cost_ns,
                      bool first) {
    if (!options_.verify) return device_->Occupy(stream, cost_ns);
    return LaunchVerified(stream, out, inputs, input_ptrs, out_ptr, cost_ns, first);
  }
  ABSL_ATTRIBUTE_NOINLINE absl::Status LaunchVerified(Stream stream, std::uint32_t out,
                                                      absl::Span<const std::uint32_t> inputs,
                                                      absl::Span<void* const> input_ptrs,
                                                      void* out_ptr, std::int64_t cost_ns,
                                                      bool first) {
    std::vector<const unsigned char*> ins;
    std::vector<std::size_t> sizes;
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      ins.push_back(static_cast<const unsigned char*>(input_ptrs[j]));
      sizes.push_back(Bytes(inputs[j]));
    }
    const std::size_t bytes = Bytes(out);
    auto checksums = checksums_;
    auto counters = counters_;
    const std::uint32_t storage = trace_.tensors[out].storage;
    return device_->LaunchHostFunc(
        stream,
        [=] {
          auto* p = static_cast<unsigned char*>(out_ptr);
          if (bytes != 0) WriteDerivedBytes(p, bytes, storage, ins, sizes);
          const std::uint64_t sum = ByteChecksum(p, bytes);
          if (first) {
            (*checksums)[storage] = sum;
          } else {
            ++counters->verified;
            if (sum != (*checksums)[storage]) ++counters->mismatches;
          }
        },
        cost_ns);
  }

  // In verify mode, checks a tensor's bytes where the stream reads them.
  void Verify(Stream stream, std::uint32_t t, void* ptr) {
    if (options_.verify) VerifyNow(stream, t, ptr);
  }
  ABSL_ATTRIBUTE_NOINLINE void VerifyNow(Stream stream, std::uint32_t t, void* ptr) {
    const std::uint32_t storage = trace_.tensors[t].storage;
    const std::size_t bytes = Bytes(t);
    auto checksums = checksums_;
    auto counters = counters_;
    (void)device_->LaunchHostFunc(stream, [=] {
      ++counters->verified;
      if (ByteChecksum(static_cast<const unsigned char*>(ptr), bytes) != (*checksums)[storage]) {
        ++counters->mismatches;
      }
    });
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE absl::Status Step(const OpRecord& r) {
    const Stream compute = kDefaultStream;
    switch (r.kind) {
      case OpKind::kPhase:
        return absl::OkStatus();
      case OpKind::kRelease:
        return runtime_->Free(ids_[r.inputs[0]]);
      case OpKind::kUse:
        for (std::uint32_t t : r.inputs) {
          absl::StatusOr<Guard> g = runtime_->Acquire(ids_[t], compute);
          if (!g.ok()) return g.status();
          Verify(compute, t, g->ptr());
        }
        return absl::OkStatus();
      case OpKind::kConstant: {
        const std::uint32_t t = r.outputs[0];
        absl::StatusOr<Guard> g = runtime_->Create(Bytes(t), TensorOptions{}, compute);
        if (!g.ok()) return g.status();
        ids_[t] = g->id();
        if (!storage_of_.empty()) StorageOf(g->id()) = t;
        return Launch(compute, t, {}, {}, g->ptr(), 0, /*first=*/true);
      }
      case OpKind::kCall:
        return Call(r, compute);
      case OpKind::kEvict:
        return budgeted_ ? DirectedEvict(r, compute) : absl::OkStatus();
      case OpKind::kPrefetch:
        return budgeted_ ? BringBack(r, compute) : absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // A prefetch record: an offloaded tensor's copy back starts on the
  // prefetch stream; a dropped one is recomputed now, on the compute stream.
  absl::Status BringBack(const OpRecord& r, Stream compute) {
    const TensorId id = ids_[r.inputs[0]];
    absl::StatusOr<TensorState> state = runtime_->State(id);
    if (!state.ok()) return state.status();
    if (*state != TensorState::kDropped) return runtime_->Prefetch(id, compute);
    absl::StatusOr<Guard> g = runtime_->Acquire(id, compute);
    if (!g.ok()) return g.status();
    Verify(compute, r.inputs[0], g->ptr());
    return absl::OkStatus();
  }

  // An evict record: carried out where the storage is on the device and the
  // run allows the action (with --no-swap an offload is skipped, as is a drop
  // with --no-recompute, and an offload the host memory has no room for).
  absl::Status DirectedEvict(const OpRecord& r, Stream compute) {
    const auto action = r.offload ? policies::EvictAction::kOffload : policies::EvictAction::kDrop;
    absl::StatusOr<bool> evicted = runtime_->Evict(ids_[r.inputs[0]], action, compute);
    if (evicted.ok() && *evicted) return absl::OkStatus();
    if (evicted.ok() || absl::IsFailedPrecondition(evicted.status()) ||
        absl::IsResourceExhausted(evicted.status())) {
      if (reporting_) ++report_.skipped_evicts;
      return absl::OkStatus();
    }
    return evicted.status();
  }

  absl::Status Call(const OpRecord& r, Stream compute) {
    absl::InlinedVector<Guard, 4> in_guards;
    absl::InlinedVector<void*, 4> in_ptrs;
    const absl::Span<const std::uint32_t> inputs = r.inputs;
    auto acquire_inputs = [&]() -> absl::Status {
      for (std::uint32_t t : inputs) {
        absl::StatusOr<Guard> g = runtime_->Acquire(ids_[t], compute);
        if (!g.ok()) return g.status();
        Verify(compute, t, g->ptr());
        in_ptrs.push_back(g->ptr());
        in_guards.push_back(std::move(*g));
      }
      return absl::OkStatus();
    };
    if (absl::Status s = acquire_inputs(); !s.ok()) return s;
    report_.compute_ns += r.cost_ns;
    // The outputs with storage of their own are made before the views
    // (MakeOutputs). Their guards: `single` for one, `made` for several (most
    // calls have one output; no vector of guards for them).
    Guard single;
    absl::InlinedVector<Guard, 4> made;
    std::size_t owning = 0;
    std::uint32_t only = 0;
    for (std::uint32_t out : r.outputs) {
      if (trace_.tensors[out].is_view()) continue;
      ++owning;
      only = out;
    }
    if (absl::Status s = MakeOutputs(r, owning, only, compute, single, made); !s.ok()) {
      // No room for the outputs beside the inputs, which the call holds
      // while it runs: under a reserved budget they may be spread over
      // pages or segments none of which can then be given whole, though
      // the bytes would fit. Tried the other way round: the inputs let go
      // (evicted like anything else where room needs it), the outputs
      // made, the inputs brought back in the room left.
      if (!options_.outputs_first_after_oom || !absl::IsResourceExhausted(s) ||
          in_guards.empty()) {
        return s;
      }
      if (reporting_) ++report_.outputs_first;
      in_guards.clear();
      in_ptrs.clear();
      absl::Status again = MakeOutputs(r, owning, only, compute, single, made);
      if (again.ok()) again = acquire_inputs();
      if (!again.ok()) {  // (the first failure says why; the second, what followed)
        return absl::Status(s.code(), absl::StrCat(s.message(), "; made the other way round: ",
                                                   again.message()));
      }
    }
    bool charged = false;  // the call's cost once, on its first output with bytes
    std::size_t k = 0;
    for (std::uint32_t out : r.outputs) {
      const OpTensor& tensor = trace_.tensors[out];
      if (tensor.is_view()) {
        absl::StatusOr<TensorId> view = runtime_->CreateView(ids_[tensor.alias_of]);
        if (!view.ok()) return view.status();
        ids_[out] = *view;
        continue;
      }
      const Guard& g = owning == 1 ? single : made[k++];
      ids_[out] = g.id();
      if (!storage_of_.empty()) StorageOf(g.id()) = out;
      const std::int64_t cost = charged ? 0 : r.cost_ns;
      const bool charge = !charged;  // the timeline's compute slice
      charged = true;
      if (absl::Status s = Launch(compute, out, inputs, in_ptrs, g.ptr(), cost, /*first=*/true);
          !s.ok()) {
        return s;
      }
      if (charge && timeline_ != nullptr) OnCompute(r, compute);
    }
    if (!charged) {  // no output with bytes: the cost alone
      absl::Status s = device_->Occupy(compute, r.cost_ns);
      if (s.ok() && timeline_ != nullptr) OnCompute(r, compute);
      return s;
    }
    return absl::OkStatus();
  }

  // Makes a call's outputs with storage of their own (`owning` of them;
  // `only` where there is one): one is a tensor (Create); several are one
  // runtime call (CreateCall), whose recompute regenerates every lost output
  // in one run, charged the call's cost once.
  absl::Status MakeOutputs(const OpRecord& r, std::size_t owning, std::uint32_t only,
                           Stream compute, Guard& single, absl::InlinedVector<Guard, 4>& made) {
    // One options object for every tensor made: Create only reads its
    // inputs, so the list keeps its heap space from call to call.
    TensorOptions& options = create_options_;
    options.inputs.clear();
    for (std::uint32_t t : r.inputs) options.inputs.push_back(ids_[t]);
    options.compute_ns = r.cost_ns;
    options.allow_drop = true;
    options.allow_offload = true;
    options.read_only = true;  // a trace's tensors are written once, by the call that makes them
    if (owning == 1) {
      // Two words, so the closure lives inside the AnyInvocable: the call's
      // inputs and cost are found through the output's producing record.
      options.recompute = [this, out = only](const RecomputeArgs& args) {
        const OpRecord& call = trace_.records[trace_.tensors[out].producer];
        absl::Status launched = Launch(args.stream, out, call.inputs, args.inputs, args.output,
                                       call.cost_ns, /*first=*/false);
        if (!launched.ok()) return launched;
        // As the runtime counts it (RuntimeStats::recompute_ns), without asking
        // it after every record.
        recompute_ns_ += call.cost_ns;
        return CheckThrash();
      };
      absl::StatusOr<Guard> g = runtime_->Create(Bytes(only), std::move(options), compute);
      if (!g.ok()) return g.status();
      single = std::move(*g);
    } else if (owning > 1) {
      absl::InlinedVector<OutputSpec, 4> specs;
      for (std::uint32_t out : r.outputs) {
        if (!trace_.tensors[out].is_view()) specs.push_back(OutputSpec{Bytes(out)});
      }
      const auto record = static_cast<std::uint32_t>(&r - trace_.records.data());
      options.recompute = [this, record](const RecomputeArgs& args) {
        return RecomputeCall(trace_.records[record], args);
      };
      absl::StatusOr<absl::InlinedVector<Guard, 4>> guards =
          runtime_->CreateCall(specs, std::move(options), compute);
      if (!guards.ok()) return guards.status();
      made = std::move(*guards);
    }
    return absl::OkStatus();
  }

  // The recompute of a call with several outputs of their own: the outputs
  // the runtime lost, its cost once (on the first of them).
  absl::Status RecomputeCall(const OpRecord& call, const RecomputeArgs& args) {
    bool charged = false;
    std::size_t k = 0;  // the runtime's outputs: the call's owning outputs, in order
    for (std::uint32_t out : call.outputs) {
      if (trace_.tensors[out].is_view()) continue;
      if (!args.regenerate[k++]) continue;
      const std::int64_t cost = charged ? 0 : call.cost_ns;
      charged = true;
      if (absl::Status s = Launch(args.stream, out, call.inputs, args.inputs, args.outputs[k - 1],
                                  cost, /*first=*/false);
          !s.ok()) {
        return s;
      }
    }
    recompute_ns_ += call.cost_ns;
    return CheckThrash();
  }

  // Inside a record too (a cascade of recomputes can run long before the
  // record ends): past the thrash limit, the closure fails and the run stops.
  absl::Status CheckThrash() {
    if (absl::Status beaten = CheckBeaten(); !beaten.ok()) return beaten;
    if (static_cast<double>(recompute_ns_) <=
        thrash_limit_ * static_cast<double>(std::max<std::int64_t>(report_.compute_ns, 1))) {
      return absl::OkStatus();
    }
    return absl::AbortedError(
        absl::StrFormat("thrash: recompute (%d ns) exceeded %g x the compute so far (%d ns)",
                        recompute_ns_, thrash_limit_, report_.compute_ns));
  }

  // Past options_.beaten_after_ns of the reported step, the run cannot end
  // sooner than that (the step's time is at least where the program stands
  // now) and stops.
  absl::Status CheckBeaten() {
    if (options_.beaten_after_ns <= 0 || !reporting_) return absl::OkStatus();
    const std::int64_t so_far = Frontier() - start_ns_;
    if (so_far <= options_.beaten_after_ns) return absl::OkStatus();
    beaten_ = true;
    return absl::AbortedError(
        absl::StrFormat("beaten: %d ns into the step, past the %d ns another run took", so_far,
                        options_.beaten_after_ns));
  }

  // --- Listening to the runtime ------------------------------------------------------
  //
  // The runtime names a storage by its first tensor's id; the replay's
  // storage of an id is recorded as the id is made.

  std::uint32_t& StorageOf(TensorId id) {
    if (id >= storage_of_.size()) storage_of_.resize(id + 1, kNoOpIndex);
    return storage_of_[id];
  }

  // The copy out the event enqueued, which ends at its stream's time now.
  void AddCopyOut(const TensorEvent& e, std::uint32_t s, SimTimeline::Kind kind) {
    const std::int64_t end = StreamEnd(e.stream);
    const std::int64_t dur = device_->cost_model().CopyNs(e.bytes, CopyKind::kDeviceToHost);
    timeline_->Add({end - dur, dur, e.bytes, s, kind});
  }

  // Under the runtime's lock: no runtime calls here.
  void OnTensor(const TensorEvent& e) override {
    const std::uint32_t s = e.tensor < storage_of_.size() ? storage_of_[e.tensor] : kNoOpIndex;
    switch (e.kind) {
      case TensorEvent::Kind::kOffloaded:
        host_bytes_ += e.bytes;
        if (timeline_ != nullptr) {
          // (A copy made ahead was drawn then.)
          if (!e.ahead) AddCopyOut(e, s, SimTimeline::Kind::kOffload);
          timeline_->Add({Frontier(), 0, e.bytes, s, SimTimeline::Kind::kEvictOffload, e.directed});
        }
        break;
      case TensorEvent::Kind::kCopiedAhead:
        if (timeline_ != nullptr) AddCopyOut(e, s, SimTimeline::Kind::kCopyAhead);
        break;
      case TensorEvent::Kind::kRestored:
        host_bytes_ -= e.bytes;
        if (timeline_ != nullptr) {
          const std::int64_t end = StreamEnd(e.stream);
          const std::int64_t dur = device_->cost_model().CopyNs(e.bytes, CopyKind::kHostToDevice);
          timeline_->Add({end - dur, dur, e.bytes, s,
                          e.prefetch ? SimTimeline::Kind::kPrefetch : SimTimeline::Kind::kRestore});
        }
        break;
      case TensorEvent::Kind::kCollected:
        if (e.from == TensorState::kOnHost || e.from == TensorState::kOffloading) {
          host_bytes_ -= e.bytes;
        }
        break;
      case TensorEvent::Kind::kDropped:
        if (timeline_ != nullptr) {
          timeline_->Add(
              {Frontier(), 0, e.bytes, s,
               e.pressure ? SimTimeline::Kind::kEvictDrop : SimTimeline::Kind::kReleasedDrop,
               e.directed});
        }
        break;
      case TensorEvent::Kind::kRecomputed:
        if (timeline_ != nullptr && e.cost_ns > 0) {
          const std::int64_t end = StreamEnd(e.stream);
          timeline_->Add({end - e.cost_ns, e.cost_ns, 0, s, SimTimeline::Kind::kRecompute});
        }
        break;
      case TensorEvent::Kind::kCreated:
        break;  // the replay knows: it made it
    }
  }

  // --- Timeline recording (with options.timeline) -------------------------------------

  ABSL_ATTRIBUTE_NOINLINE void StartTimeline() {
    timeline_->Clear();
    const char* accounting = options_.live_budget != 0 ? "live" : "reserved";
    timeline_->SetTitle(absl::StrFormat(
        "remat sim %s: %s, %s", trace_.name, report_.policy,
        report_.budget_bytes == 0
            ? std::string("unlimited")
            : absl::StrFormat("budget %s (%s)", FormatBytes(report_.budget_bytes), accounting)));
    timeline_->AddSample({0, device_->ReservedBytes(), 0, 0});
  }

  // Where the program stands: the compute stream's clock (work enqueued now
  // starts there, or later if the host is ahead).
  std::int64_t Frontier() const {
    return std::max(device_->NowNs(), device_->StreamTimeNs(kDefaultStream).value_or(0));
  }

  // Stream time right after `stream`'s last work was enqueued.
  std::int64_t StreamEnd(Stream stream) const {
    return device_->StreamTimeNs(stream).value_or(device_->NowNs());
  }

  ABSL_ATTRIBUTE_NOINLINE void OnCompute(const OpRecord& r, Stream stream) {
    const std::int64_t end = StreamEnd(stream);
    const auto record = static_cast<std::uint32_t>(&r - trace_.records.data());
    timeline_->Add({end - r.cost_ns, r.cost_ns, 0, record, SimTimeline::Kind::kCompute});
  }

  // After each record: the counters, stamped with the time the record began.
  ABSL_ATTRIBUTE_NOINLINE void EndRecord() {
    const RuntimeStats rs = runtime_->stats();
    timeline_->AddSample(
        {record_start_ns_, device_->ReservedBytes(), rs.resident_bytes, host_bytes_});
    record_start_ns_ = Frontier();
  }

  const OpTrace& trace_;
  const OpReplayOptions options_;
  Stack stack_;
  SimDevice* device_ = nullptr;  // stack_'s, typed
  CachingAllocator* alloc_ = nullptr;
  Runtime* runtime_ = nullptr;
  std::vector<TensorId> ids_;  // trace tensor -> runtime tensor
  bool hints_ = false;
  // Under a budget: the trace's evict and prefetch records are carried out
  // (without one, the replay is the reference run, and skips them).
  bool budgeted_ = false;
  std::vector<std::int64_t> cum_cost_;  // compute before each record
  // Per record: (tensor it touched, the next record reading its storage).
  std::vector<absl::InlinedVector<std::pair<std::uint32_t, std::uint32_t>, 4>> next_read_;
  std::shared_ptr<std::vector<std::uint64_t>> checksums_;  // by storage
  std::shared_ptr<Counters> counters_;
  OpReplayReport report_;
  std::int64_t recompute_ns_ = 0;  // summed cost of the recomputes run so far
  double thrash_limit_ = 1;        // options_.thrash_limit, or a learning step's
  std::int64_t start_ns_ = 0;      // the simulated time as the reported step began
  bool reporting_ = false;         // in the reported step (not a learning one)
  bool beaten_ = false;            // stopped by CheckBeaten
  TensorOptions create_options_;   // Call's, refilled for every tensor it makes

  // Kept only where the replay listens to the runtime (a timeline).
  std::vector<std::uint32_t> storage_of_;  // runtime tensor id -> trace storage
  std::uint64_t host_bytes_ = 0;           // offloaded bytes held on the host
  SimTimeline* timeline_ = nullptr;
  std::int64_t record_start_ns_ = 0;  // the compute stream's time as the record began
};

}  // namespace

absl::StatusOr<Accounting> ParseAccounting(std::string_view text) {
  if (text == "reserved") return Accounting::kReserved;
  if (text == "live") return Accounting::kLive;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown accounting '%s': expected reserved or live", text));
}

absl::StatusOr<Future> ParseFuture(std::string_view text) {
  if (text == "known") return Future::kKnown;
  if (text == "learned") return Future::kLearned;
  if (text == "none") return Future::kNone;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown future '%s': expected known, learned or none", text));
}

const char* FutureName(Future future) {
  switch (future) {
    case Future::kKnown:
      return "known";
    case Future::kLearned:
      return "learned";
    case Future::kNone:
      return "none";
  }
  return "known";
}

const char* AccountingName(Accounting accounting) {
  return accounting == Accounting::kLive ? "live" : "reserved";
}

MemoryBudget MemoryBudget::FromRatio(double ratio, const OpReplayReport& unlimited,
                                     Accounting accounting) {
  const std::uint64_t peak =
      accounting == Accounting::kLive ? unlimited.peak_live_bytes : unlimited.peak_reserved_bytes;
  return {static_cast<std::uint64_t>(ratio * static_cast<double>(peak)), accounting};
}

absl::Status MemoryBudget::Check() const {
  if (accounting == Accounting::kReserved && bytes < kSmallBuffer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a reserved budget of %s is below the allocator's smallest segment (%s), so the replay "
        "could not keep to it: give a larger budget, or --accounting live",
        FormatBytes(bytes), FormatBytes(kSmallBuffer)));
  }
  return absl::OkStatus();
}

void MemoryBudget::ApplyTo(OpReplayOptions& options) const {
  if (accounting == Accounting::kLive) {
    options.live_budget = std::max<std::uint64_t>(bytes, 1);
  } else {
    options.budget = std::max<std::uint64_t>(bytes, 2 * kMiB);
  }
}

std::size_t EffectiveMaxSplit(const OpReplayOptions& options) {
  if (options.max_split_size != 0) return options.max_split_size;
  return options.budget != 0 ? kBudgetedMaxSplit : std::numeric_limits<std::size_t>::max();
}

std::uint64_t MaxSteps(std::uint64_t records, double thrash_limit) {
  const double per_record = kStepsPerRecord * std::max(1.0, std::ceil(thrash_limit));
  return static_cast<std::uint64_t>(per_record * static_cast<double>(records + 1));
}

absl::StatusOr<OpReplayReport> ReplayOpTrace(const OpTrace& trace, const OpReplayOptions& options) {
  if (options.scale == 0) return absl::InvalidArgumentError("scale must be at least 1");
  if (trace.records.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: the trace has no records", trace.name));
  }
  if (!(options.link_gbps > 0))
    return absl::InvalidArgumentError("link bandwidth must be positive");
  if (options.link_latency_ns < 0) {
    return absl::InvalidArgumentError("link latency cannot be negative");
  }
  if (options.host_memory == 0) return absl::InvalidArgumentError("host memory must be positive");
  if (!(options.thrash_limit > 0))
    return absl::InvalidArgumentError("thrash limit must be positive");
  // Recompute may reach thrash_limit x the compute before the run stops: the
  // simulated clock (signed 64-bit ns) must hold that with room for copies.
  const double limit =
      options.thrash_limit * (options.future == Future::kLearned ? kLearningThrashFactor + 1 : 1);
  if (limit * static_cast<double>(trace.total_cost_ns) > 0x1p62) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: thrash limit %g x the trace's compute (%d ns) passes 2^62 ns, more than the "
        "simulated clock holds: lower the thrash limit or the costs",
        trace.name, limit, trace.total_cost_ns));
  }
  const bool budgeted = options.budget != 0 || options.live_budget != 0;
  if (!options.policy.ok()) return options.policy.status();
  absl::StatusOr<std::unique_ptr<policies::EvictionPolicy>> asked = options.policy.Make();
  if (!asked.ok()) return asked.status();
  std::vector<policies::Trial> trials = (*asked)->Trials();
  const bool guard = options.offload_guard && options.enable_offload && options.enable_drop;
  // Under a reserved budget a run that does not finish runs again meeting
  // each request in one place (the step planner's in_one_place_after_failure).
  // (A live budget counts bytes, not places.)
  const bool places = budgeted && options.live_budget == 0;
  const bool place_again =
      places && options.in_one_place_after_failure && !options.retry_in_one_place;
  // A run that did not finish in one place either runs again with the
  // allocator's split limit halved (the step planner's
  // split_limit_halvings_after_failure), where the limit is the replay's
  // own default: a limit the user chose, or allocator settings (expandable
  // segments split anything), are left as asked.
  const std::size_t halvings = places && options.in_one_place_after_failure &&
                                       options.max_split_size == 0 && options.alloc_conf.empty()
                                   ? kBudgetedSplitHalvings
                                   : 0;
  // Outputs first after an out-of-memory under a reserved budget only (a
  // live one counts bytes, not places).
  const bool outputs_first = options.outputs_first_after_oom && places;
  if (!budgeted || (trials.empty() && !guard && !place_again && halvings == 0)) {
    OpReplayOptions o = options;
    o.outputs_first_after_oom = outputs_first;
    absl::StatusOr<OpReplayReport> r = Replayer(trace, o).Run();
    if (r.ok()) r->in_one_place = places && options.retry_in_one_place;
    return r;
  }
  // The runs: the policy's own, or each of its trials; with offload allowed
  // as asked, and (the offload guard) with drops only. Which is kept is the
  // step planner's choice, as for a framework's steps (runtime/step_planner.h):
  // each run is one timed trial step, a run that did not finish runs again in
  // one place (under a reserved budget) and then leaves the trial, and the
  // quickest is kept, the one listed first on a tie. The
  // mixed runs are listed first, so a drop-only run is kept only where it is
  // strictly quicker. Where none finished, the report is the first run's.
  const std::string own = options.policy.text();
  const bool with_trials = !trials.empty();
  if (!with_trials) trials.push_back({own, own});
  struct Run {
    std::string spec;
    bool drops_only;
  };
  std::vector<Run> runs;
  if (options.enable_offload) {
    for (const policies::Trial& t : trials) runs.push_back({t.mixed, false});
  }
  for (const policies::Trial& t : trials) {
    if (!t.drops.empty() && (!options.enable_offload || guard)) runs.push_back({t.drops, true});
  }
  if (runs.empty()) return absl::InvalidArgumentError("the policy's trials name no run to make");
  std::vector<PlanSpec> plans;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    plans.push_back(PlanSpec{absl::StrFormat("%s %d", run.drops_only ? "drop-only" : "mixed", i),
                             run.spec, options.enable_drop || run.drops_only,
                             options.enable_offload && !run.drops_only, false});
  }
  absl::StatusOr<StepPlanner> planner =
      StepPlanner::Create(std::move(plans), StepPlannerOptions{0, 1, place_again, halvings});
  if (!planner.ok()) return planner.status();
  // Each run's last report (in one place where it ran again so).
  std::vector<OpReplayReport> reports(runs.size());
  std::vector<SimTimeline> timelines(options.timeline != nullptr ? runs.size() : 0);
  // The placements each run was made with: bit in_one_place + 2 x halvings.
  std::vector<std::uint32_t> ran(runs.size(), 0);
  double wall_seconds = 0;
  std::size_t made = 0;
  std::uint64_t verified = 0, verify_waits = 0, mismatches = 0;
  // The best finished time of each kind of run so far (mixed, drop-only).
  std::optional<std::int64_t> best_ns[2];
  for (;;) {
    absl::StatusOr<StepPlanner::Step> step = planner->Begin();
    if (!step.ok()) return step.status();
    const std::size_t i = step->plan;
    if (i >= runs.size()) return absl::InternalError("the step planner named no run");
    const std::uint32_t placement = 1u << (step->in_one_place + 2 * step->split_limit_halvings);
    if ((ran[i] & placement) != 0) {
      // The last run left did not finish any way: nothing more to try.
      if (absl::Status s = planner->End(StepOutcome::kAbandoned, 0, ""); !s.ok()) return s;
      break;
    }
    ran[i] |= placement;
    const Run& run = runs[i];
    OpReplayOptions o = options;
    o.policy = run.spec;
    o.retry_in_one_place = options.retry_in_one_place || step->in_one_place;
    if (step->split_limit_halvings > 0) {
      o.max_split_size = kBudgetedMaxSplit >> step->split_limit_halvings;
    }
    if (run.drops_only) o.enable_offload = false;
    o.outputs_first_after_oom = outputs_first;
    // A trial that passes the time of the best finished run of its kind so
    // far cannot be the best of its kind: it stops there ("beaten"), which
    // bounds the cost of trials that thrash.
    std::optional<std::int64_t>& mine = best_ns[run.drops_only ? 1 : 0];
    if (with_trials && mine.has_value()) o.beaten_after_ns = *mine;
    if (options.timeline != nullptr) o.timeline = &timelines[i];
    absl::StatusOr<OpReplayReport> r = Replayer(trace, o).Run();
    if (!r.ok()) return r.status();
    wall_seconds += r->wall_seconds;
    ++made;
    // In verify mode every run's bytes were checked: a mismatch in any counts.
    verified += r->verified_accesses;
    verify_waits += r->verify_waits;
    mismatches += r->mismatches;
    const bool ok = r->status == "ok";
    if (ok && (!mine.has_value() || r->time_ns < *mine)) mine = r->time_ns;
    const StepOutcome outcome = ok                      ? StepOutcome::kFit
                                : r->status == "beaten" ? StepOutcome::kTooSlow
                                                        : StepOutcome::kTooSmall;
    if (absl::Status s = planner->End(outcome, ok ? r->time_ns : 0, r->message); !s.ok()) return s;
    r->in_one_place = places && o.retry_in_one_place;
    r->split_halvings = step->split_limit_halvings;
    reports[i] = *std::move(r);
    // After the trial (or with one run, none), only a run placed again.
    const bool again = !ok && (step->in_one_place != planner->in_one_place(i) ||
                               step->split_limit_halvings != planner->split_limit_halvings(i));
    if (!planner->in_trial() && !again) break;
  }
  const std::size_t kept = planner->kept().value_or(0);
  const bool keep_drops = runs[kept].drops_only;
  OpReplayReport report = reports[kept];
  if (guard) {  // both kinds ran: name the one kept, and the other's best
    // The other kind's best: its quickest finished run, else its first.
    std::optional<std::size_t> other;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].drops_only == keep_drops) continue;
      const bool better = other.has_value() && reports[i].status == "ok" &&
                          (reports[*other].status != "ok" ||
                           reports[i].time_ns < reports[*other].time_ns);
      if (!other.has_value() || better) other = i;
    }
    report.plan = keep_drops ? "drop-only" : "mixed";
    if (other.has_value()) {
      report.other_plan_status = reports[*other].status;
      report.other_plan_time_ns = reports[*other].time_ns;
    }
  }
  report.policy = own;
  report.trials = made;
  if (runs[kept].spec != own) report.kept_policy = runs[kept].spec;
  report.wall_seconds = wall_seconds;
  report.verified_accesses = verified;
  report.verify_waits = verify_waits;
  report.mismatches = mismatches;
  if (options.timeline != nullptr) *options.timeline = std::move(timelines[kept]);
  return report;
}

}  // namespace remat
