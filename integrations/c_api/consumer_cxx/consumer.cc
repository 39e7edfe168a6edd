// The installed C++ API from outside the tree: a runtime over a backed
// simulated device drops a tensor under its live budget and brings it back,
// recomputed, with its bytes.
#include <cstdio>
#include <cstring>
#include <utility>

#include "device/device_spec.h"
#include "runtime/runtime.h"
#include "runtime/stack.h"

int main() {
  remat::DeviceSpec spec;
  spec.kind = remat::DeviceSpec::Kind::kSim;
  spec.sim.capacity = 256 * remat::kMiB;
  spec.sim.backed = true;
  remat::RuntimeOptions runtime_options;
  runtime_options.policy = "lru";
  runtime_options.live_budget = 8 * remat::kMiB;
  absl::StatusOr<remat::Stack> stack = remat::MakeStack(spec, {}, std::move(runtime_options));
  if (!stack.ok()) {
    std::fprintf(stderr, "MakeStack: %s\n", std::string(stack.status().message()).c_str());
    return 1;
  }
  remat::Runtime& rt = *stack->runtime;
  remat::Device& device = *stack->device;
  const std::size_t bytes = 4 * remat::kMiB;

  auto fill = [&device](void* p, std::size_t n, remat::Stream s) {
    return device.LaunchHostFunc(s, [p, n] { std::memset(p, 0x5a, n); });
  };
  remat::TensorOptions options;
  options.allow_drop = true;
  options.compute_ns = 1000;
  options.recompute = [&fill](const remat::RecomputeArgs& a) {
    return fill(a.output, a.bytes, a.stream);
  };
  absl::StatusOr<remat::Guard> made = rt.Create(bytes, std::move(options));
  if (!made.ok() || !fill(made->ptr(), bytes, remat::kDefaultStream).ok()) return 1;
  const remat::TensorId id = made->id();
  made->Release();

  // Two more, larger: the first must be dropped to make room under the live budget.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<remat::Guard> other = rt.Create(bytes + remat::kMiB, remat::TensorOptions{});
    if (!other.ok()) return 1;
    other->Release();
    if (!rt.Free(other->id()).ok()) return 1;
  }
  absl::StatusOr<remat::TensorState> state = rt.State(id);
  if (!state.ok() || *state != remat::TensorState::kDropped) {
    std::fprintf(stderr, "the first tensor was not dropped\n");
    return 1;
  }
  absl::StatusOr<remat::Guard> back = rt.Acquire(id);
  if (!back.ok() || !device.Synchronize().ok()) return 1;
  const auto* p = static_cast<const unsigned char*>(back->ptr());
  for (std::size_t i = 0; i < bytes; i += 4096) {
    if (p[i] != 0x5a) {
      std::fprintf(stderr, "byte %zu is %d after the recompute\n", i, p[i]);
      return 1;
    }
  }
  std::printf("recomputed %zu bytes, all as written\n", bytes);
  return 0;
}
