#include "sim/op_replay.h"

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "runtime/runtime.h"

namespace remat {
namespace {

// The bytes a call writes into one output: a function of the output's index
// and of its inputs' bytes, cheap enough for large traces.
void WriteOutput(unsigned char* out, std::size_t bytes, std::uint32_t tensor,
                 const std::vector<const unsigned char*>& ins,
                 const std::vector<std::size_t>& sizes) {
  for (std::size_t k = 0; k < bytes; ++k) {
    std::uint32_t v = (tensor + 1) * 2654435761u + static_cast<std::uint32_t>(k) * 40503u;
    for (std::size_t j = 0; j < ins.size(); ++j) {
      if (sizes[j] != 0) v += ins[j][k % sizes[j]] * static_cast<std::uint32_t>(j + 3);
    }
    out[k] = static_cast<unsigned char>(v ^ (v >> 13));
  }
}

std::uint64_t Checksum(const unsigned char* p, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t k = 0; k < bytes; ++k) h = (h ^ p[k]) * 1099511628211ull;
  return h;
}

class Replayer {
 public:
  Replayer(const OpTrace& trace, const OpReplayOptions& options)
      : trace_(trace), options_(options) {}

  absl::StatusOr<OpReplayReport> Run() {
    const auto wall_start = std::chrono::steady_clock::now();
    SimDeviceOptions dev;
    dev.capacity = SimDevice::kMaxCapacity;
    dev.backed = options_.verify;
    dev.cost.host_to_device_gbps = dev.cost.device_to_host_gbps = options_.link_gbps;
    absl::StatusOr<std::unique_ptr<SimDevice>> device = SimDevice::Create(dev);
    if (!device.ok()) return device.status();
    device_ = std::move(*device);
    absl::StatusOr<std::unique_ptr<CachingAllocator>> alloc =
        CachingAllocator::Create(device_.get(), {.budget = options_.budget});
    if (!alloc.ok()) return alloc.status();
    alloc_ = std::move(*alloc);
    RuntimeOptions rt;
    rt.policy = options_.policy;
    rt.enable_drop = options_.enable_drop;
    rt.enable_offload = options_.enable_offload;
    rt.link_gbps = options_.link_gbps;
    rt.live_budget = options_.live_budget;
    absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Create(alloc_.get(), rt);
    if (!runtime.ok()) return runtime.status();
    runtime_ = std::move(*runtime);

    ids_.assign(trace_.tensors.size(), 0);
    hints_ = runtime_->policy().needs().next_use;
    prefetch_window_ns_ = runtime_->policy().prefetch_window_ns();
    if (hints_ || prefetch_window_ns_ > 0) PlanTheFuture();
    checksums_ = std::make_shared<std::vector<std::uint64_t>>(trace_.tensors.size(), 0);
    counters_ = std::make_shared<Counters>();
    report_.policy = runtime_->policy().Spec();
    report_.budget_bytes = options_.live_budget != 0 ? options_.live_budget : options_.budget;
    report_.status = "ok";
    const auto loop_start = std::chrono::steady_clock::now();
    for (const OpRecord& r : trace_.records) {
      absl::Status s = Step(r);
      if (s.ok() && (hints_ || prefetch_window_ns_ > 0)) s = LookAhead(r);
      ++report_.records;
      if (absl::IsResourceExhausted(s)) {
        report_.status = "oom";
        report_.message = absl::StrFormat("%s:%d: %s", trace_.name, r.line, s.message());
        break;
      }
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrFormat("%s:%d: %s", trace_.name, r.line, s.message()));
      }
      const RuntimeStats rs = runtime_->stats();
      if (static_cast<double>(rs.recompute_ns) >
          options_.thrash_limit * static_cast<double>(std::max<std::int64_t>(report_.compute_ns, 1))) {
        report_.status = "thrash";
        report_.message = absl::StrFormat(
            "%s:%d: recompute (%d ns) exceeded %g x the compute so far (%d ns)", trace_.name,
            r.line, rs.recompute_ns, options_.thrash_limit, report_.compute_ns);
        break;
      }
    }
    report_.replay_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    (void)device_->Synchronize();
    const RuntimeStats rs = runtime_->stats();
    const AllocatorStats as = alloc_->GetStats();
    report_.time_ns = device_->NowNs();
    report_.peak_reserved_bytes = static_cast<std::uint64_t>(as.reserved_bytes.all().peak);
    report_.peak_live_bytes = rs.peak_resident_bytes;
    report_.recomputed_ops = rs.recomputes;
    report_.recompute_ns = rs.recompute_ns;
    report_.offloaded_bytes = rs.offloaded_bytes;
    report_.restored_bytes = rs.restored_bytes;
    report_.evictions = rs.drops + rs.offloads;
    report_.pressure_events = rs.pressure_events;
    report_.candidates_shown = rs.candidates_shown;
    report_.choose_wall_ns = rs.choose_wall_ns;
    report_.stall_ns = std::max<std::int64_t>(
        0, report_.time_ns - report_.compute_ns - report_.recompute_ns);
    report_.verified_accesses = counters_->verified;
    report_.mismatches = counters_->mismatches;
    report_.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    runtime_.reset();
    return report_;
  }

 private:
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
        for (std::uint32_t t : r.inputs) next[trace_.tensors[t].storage] = static_cast<std::uint32_t>(i);
      }
    }
  }

  // After record `r`: hints the next use of what it touched, and prefetches
  // offloaded tensors read within the policy's window.
  absl::Status LookAhead(const OpRecord& r) {
    const auto i = static_cast<std::size_t>(&r - trace_.records.data());
    if (hints_) {
      const std::int64_t now = device_->NowNs();
      for (const auto& [t, next] : next_read_[i]) {
        if (trace_.tensors[t].released_by != kNoOpIndex && trace_.tensors[t].released_by <= i) {
          continue;
        }
        const std::int64_t at = next == kNoOpIndex
                                    ? Runtime::kNeverUsedAgain
                                    : now + (cum_cost_[next] - cum_cost_[i + 1]);
        (void)runtime_->HintNextUse(ids_[t], at);  // a view's storage may be gone: no matter
      }
    }
    if (prefetch_window_ns_ > 0) {
      for (std::size_t j = i + 1; j < trace_.records.size() && j <= i + 64 &&
                                  cum_cost_[j] - cum_cost_[i + 1] <= prefetch_window_ns_;
           ++j) {
        const OpRecord& ahead = trace_.records[j];
        if (ahead.kind != OpKind::kCall && ahead.kind != OpKind::kUse) continue;
        for (std::uint32_t t : ahead.inputs) {
          absl::StatusOr<TensorState> st = runtime_->State(ids_[t]);
          if (!st.ok() || (*st != TensorState::kOnHost && *st != TensorState::kOffloading)) {
            continue;
          }
          absl::Status s = runtime_->Prefetch(ids_[t], kDefaultStream);
          if (absl::IsResourceExhausted(s)) return absl::OkStatus();  // no room: on access then
          if (!s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  std::size_t Bytes(std::uint32_t t) const {
    const std::uint64_t b = trace_.tensors[trace_.tensors[t].storage].bytes;
    return static_cast<std::size_t>((b + options_.scale - 1) / options_.scale);
  }

  // Enqueues the call's work for `out` on the stream: the compute itself in
  // the cost, and in verify mode the bytes (and, the first time, their checksum).
  absl::Status Launch(Stream stream, std::uint32_t out, absl::Span<const std::uint32_t> inputs,
                      absl::Span<void* const> input_ptrs, void* out_ptr, std::int64_t cost_ns,
                      bool first) {
    if (!options_.verify) return device_->LaunchHostFunc(stream, [] {}, cost_ns);
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
          if (bytes != 0) WriteOutput(p, bytes, storage, ins, sizes);
          const std::uint64_t sum = Checksum(p, bytes);
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
    if (!options_.verify) return;
    const std::uint32_t storage = trace_.tensors[t].storage;
    const std::size_t bytes = Bytes(t);
    auto checksums = checksums_;
    auto counters = counters_;
    (void)device_->LaunchHostFunc(stream, [=] {
      ++counters->verified;
      if (Checksum(static_cast<const unsigned char*>(ptr), bytes) != (*checksums)[storage]) {
        ++counters->mismatches;
      }
    });
  }

  absl::Status Step(const OpRecord& r) {
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
        return Launch(compute, t, {}, {}, g->ptr(), 0, /*first=*/true);
      }
      case OpKind::kCall:
        return Call(r, compute);
    }
    return absl::OkStatus();
  }

  absl::Status Call(const OpRecord& r, Stream compute) {
    absl::InlinedVector<Guard, 4> in_guards;
    absl::InlinedVector<void*, 4> in_ptrs;
    std::vector<TensorId> in_ids;
    in_ids.reserve(r.inputs.size());
    const absl::Span<const std::uint32_t> inputs = r.inputs;
    for (std::uint32_t t : inputs) {
      absl::StatusOr<Guard> g = runtime_->Acquire(ids_[t], compute);
      if (!g.ok()) return g.status();
      Verify(compute, t, g->ptr());
      in_ptrs.push_back(g->ptr());
      in_ids.push_back(ids_[t]);
      in_guards.push_back(std::move(*g));
    }
    report_.compute_ns += r.cost_ns;
    bool charged = false;  // the call's cost once, on its first output with bytes
    for (std::uint32_t out : r.outputs) {
      const OpTensor& tensor = trace_.tensors[out];
      if (tensor.is_view()) {
        absl::StatusOr<TensorId> view = runtime_->CreateView(ids_[tensor.alias_of]);
        if (!view.ok()) return view.status();
        ids_[out] = *view;
        continue;
      }
      TensorOptions options;
      options.inputs = in_ids;
      options.compute_ns = r.cost_ns;
      options.allow_drop = true;
      options.allow_offload = true;
      // Two words, so the closure lives inside the AnyInvocable: the call's
      // inputs and cost are found through the output's producing record.
      options.recompute = [this, out](const RecomputeArgs& args) {
        const OpRecord& call = trace_.records[trace_.tensors[out].producer];
        return Launch(args.stream, out, call.inputs, args.inputs, args.output, call.cost_ns,
                      /*first=*/false);
      };
      absl::StatusOr<Guard> g = runtime_->Create(Bytes(out), std::move(options), compute);
      if (!g.ok()) return g.status();
      ids_[out] = g->id();
      const std::int64_t cost = charged ? 0 : r.cost_ns;
      charged = true;
      if (absl::Status s = Launch(compute, out, inputs, in_ptrs, g->ptr(), cost, /*first=*/true);
          !s.ok()) {
        return s;
      }
    }
    if (!charged) return device_->LaunchHostFunc(compute, [] {}, r.cost_ns);
    return absl::OkStatus();
  }

  const OpTrace& trace_;
  const OpReplayOptions options_;
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<Runtime> runtime_;
  std::vector<TensorId> ids_;  // trace tensor -> runtime tensor
  bool hints_ = false;
  std::int64_t prefetch_window_ns_ = 0;
  std::vector<std::int64_t> cum_cost_;  // compute before each record
  // Per record: (tensor it touched, the next record reading its storage).
  std::vector<absl::InlinedVector<std::pair<std::uint32_t, std::uint32_t>, 4>> next_read_;
  std::shared_ptr<std::vector<std::uint64_t>> checksums_;  // by storage
  std::shared_ptr<Counters> counters_;
  OpReplayReport report_;
};

}  // namespace

absl::StatusOr<OpReplayReport> ReplayOpTrace(const OpTrace& trace, const OpReplayOptions& options) {
  if (options.scale == 0) return absl::InvalidArgumentError("scale must be at least 1");
  if (!(options.link_gbps > 0)) return absl::InvalidArgumentError("link bandwidth must be positive");
  if (!(options.thrash_limit > 0)) return absl::InvalidArgumentError("thrash limit must be positive");
  Replayer replayer(trace, options);
  return replayer.Run();
}

}  // namespace remat
