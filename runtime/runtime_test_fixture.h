// What the runtime's tests share: deterministic tensor contents, and the
// RuntimeTest fixture (a simulated device, an allocator under a budget, a
// runtime, and tensors whose bytes are checked on every acquire). The tests
// are split by theme: runtime_test.cc (the basics and failures),
// runtime_candidates_test.cc (what policies see), runtime_calls_test.cc
// (calls, closures, threads), runtime_property_test.cc (random programs).
#ifndef REMAT_RUNTIME_RUNTIME_TEST_FIXTURE_H_
#define REMAT_RUNTIME_RUNTIME_TEST_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "base/byte_pattern.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"

namespace remat {

// x -> a -> b -> c -> d (1-5 MiB, costs 10, 20, 30, 40 us) under 22 MiB; then
// e (8 MiB, kept) forces two pressure events in which `policy` (scripted to
// drop b and c, then d) sees the candidates.
struct ScriptedChain {
  TensorId x, a, b, c, d, e;
};


class RuntimeTest : public ::testing::Test {
 protected:
  // The chain the neighbourhood tests share (runtime_candidates_test.cc).
  ScriptedChain ProduceScriptedChain(std::shared_ptr<policies::EvictionPolicy> policy);

  void Make(std::size_t budget, RuntimeOptions options = {}, bool backed = true,
            bool expandable = false) {
    runtime_.reset();
    alloc_.reset();
    // A runtime for one thread gets a device and an allocator for one thread.
    const bool thread_safe = options.thread_safe;
    device_ = std::move(SimDevice::Create(
                            {.capacity = 4 * kGiB, .backed = backed, .thread_safe = thread_safe}))
                  .value();
    alloc_ = std::move(CachingAllocator::Create(device_.get(),
                                                {.budget = budget,
                                                 .expandable_segments = expandable,
                                                 .thread_safe = thread_safe}))
                 .value();
    auto rt = Runtime::Create(alloc_.get(), std::move(options));
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(rt).value();
  }

  // A tensor computed from `inputs`, with a closure that recomputes it the
  // same way, on the stream, in stream order (as a kernel would).
  TensorId Produce(std::size_t bytes, std::vector<TensorId> inputs, bool drop, bool offload,
                   std::int64_t cost_ns = 1000) {
    const auto tag = static_cast<std::uint32_t>(expected_.size() + 1);
    std::vector<std::size_t> sizes;
    SimDevice* device = device_.get();
    // Expected bytes only where the device keeps real ones.
    std::vector<unsigned char> want(device->backed() ? bytes : 0);
    std::vector<const unsigned char*> in_bytes;
    for (TensorId in : inputs) {
      sizes.push_back(sizes_.at(in));
      in_bytes.push_back(expected_.at(in).data());
    }
    if (device->backed()) WriteDerivedBytes(want.data(), bytes, tag, in_bytes, sizes);
    const bool backed = device->backed();
    // With check_in_closures_, a closure first checks the runtime's
    // invariants as they stand while it runs (the lock let go, mid-regeneration).
    Runtime* checked = check_in_closures_ ? runtime_.get() : nullptr;
    auto kernel = [device, backed, bytes, tag, sizes, cost_ns,
                   checked](const RecomputeArgs& args) -> absl::Status {
      if (checked != nullptr) {
        if (absl::Status st = checked->CheckInvariants(); !st.ok()) return st;
      }
      std::vector<void*> ins(args.inputs.begin(), args.inputs.end());
      return device->LaunchHostFunc(
          args.stream,
          [=] {
            if (!backed || bytes == 0) return;
            std::vector<const unsigned char*> in(ins.size());
            for (std::size_t j = 0; j < ins.size(); ++j) {
              in[j] = static_cast<const unsigned char*>(ins[j]);
            }
            WriteDerivedBytes(static_cast<unsigned char*>(args.output), bytes, tag, in, sizes);
          },
          cost_ns);
    };
    TensorOptions options;
    options.inputs.assign(inputs.begin(), inputs.end());
    options.compute_ns = cost_ns;
    options.allow_drop = drop;
    options.allow_offload = offload;
    options.read_only = read_only_;
    if (drop) options.recompute = kernel;
    // The first computation: acquire the inputs, run the kernel once.
    std::vector<Guard> in_guards;
    std::vector<void*> in_ptrs;
    for (TensorId in : inputs) {
      auto g = runtime_->Acquire(in);
      // Over budget with everything pinned: the caller is told by a 0 id, as
      // when the output itself does not fit.
      if (allow_oom_ && absl::IsResourceExhausted(g.status())) return 0;
      EXPECT_TRUE(g.ok()) << g.status();
      if (!g.ok()) return 0;
      in_ptrs.push_back(g->ptr());
      in_guards.push_back(std::move(*g));
    }
    auto guard = runtime_->Create(bytes, std::move(options));
    if (allow_oom_ && absl::IsResourceExhausted(guard.status())) return 0;
    EXPECT_TRUE(guard.ok()) << guard.status();
    if (!guard.ok()) return 0;
    const absl::Status first = kernel(RecomputeArgs{in_ptrs, guard->ptr(), bytes, kDefaultStream});
    EXPECT_TRUE(first.ok()) << first;
    const TensorId id = guard->id();
    expected_[id] = std::move(want);
    sizes_[id] = bytes;
    return id;
  }

  // Acquires and compares the bytes with what they were when produced.
  // `allow_oom`: a ResourceExhausted acquire is fine (the invariants are
  // checked by the caller).
  void Check(TensorId id, bool allow_oom = false) {
    auto g = runtime_->Acquire(id);
    ++checks_;
    if (allow_oom && absl::IsResourceExhausted(g.status())) {
      ++oom_checks_;
      return;
    }
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    const std::vector<unsigned char>& want = expected_.at(id);
    if (device_->backed() && !want.empty()) {
      ASSERT_EQ(std::memcmp(g->ptr(), want.data(), want.size()), 0) << "tensor " << id;
    }
  }

  TensorState StateOf(TensorId id) { return *runtime_->State(id); }

  // The program's work between uses: a small tensor made (taking `cost_ns`
  // on the clock) and freed. Each is also a look for the runtime's planned
  // prefetches.
  void Work(std::int64_t cost_ns = 1000) {
    const TensorId work = Produce(64 * kKiB, {}, false, false, cost_ns);
    ASSERT_TRUE(runtime_->Free(work).ok());
  }

  void CheckInvariants() {
    const absl::Status st = runtime_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << st;
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<Runtime> runtime_;
  std::map<TensorId, std::vector<unsigned char>> expected_;
  std::map<TensorId, std::size_t> sizes_;
  bool check_in_closures_ = false;
  bool allow_oom_ = false;  // Produce: an input that cannot come back is a 0 id, not a failure
  bool read_only_ = false;  // Produce: TensorOptions::read_only
  int checks_ = 0;      // Check calls
  int oom_checks_ = 0;  // of which ended out of memory (allowed)
};

}  // namespace remat

#endif  // REMAT_RUNTIME_RUNTIME_TEST_FIXTURE_H_
