// Runtime::EstimateReplay: what a replay of a call holds resident at once,
// from the runtime's own call graph.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.h"
#include "device/sim_device.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"

namespace remat {
namespace {

class ReplayEstimateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = std::move(SimDevice::Create({.capacity = kGiB, .backed = false})).value();
    alloc_ = std::move(CachingAllocator::Create(device_.get(), {})).value();
    runtime_ = std::move(Runtime::Create(alloc_.get(), {.policy = "lru", .estimate_replays = true}))
                   .value();
  }

  // A tensor of `bytes` over `inputs`, droppable or not, released.
  TensorId Make(std::size_t bytes, bool drop = false, std::vector<TensorId> inputs = {}) {
    TensorOptions o;
    o.inputs = std::move(inputs);
    o.allow_drop = drop;
    if (drop) o.recompute = [](const RecomputeArgs&) { return absl::OkStatus(); };
    absl::StatusOr<Guard> g = runtime_->Create(bytes, std::move(o));
    EXPECT_TRUE(g.ok()) << g.status();
    const TensorId id = g->id();
    g->Release();
    return id;
  }
  // A droppable tensor of `bytes` whose own replay holds `replay` bytes at
  // every depth (made over a resident input of replay - bytes).
  TensorId Dropped(std::size_t bytes, std::size_t replay) {
    return Make(bytes, true, {Make(replay - bytes)});
  }
  ReplayEstimate Estimate(std::vector<TensorId> inputs, std::size_t bytes = 10) {
    absl::StatusOr<ReplayEstimate> e = runtime_->EstimateReplay(inputs, bytes);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.value_or(ReplayEstimate{});
  }
  static ReplayEstimate Levels(std::uint64_t first, std::uint64_t rest) {
    ReplayEstimate e;
    e.fill(rest);
    e[0] = first;
    return e;
  }

  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(ReplayEstimateTest, TheOutputBesideItsInputs) {
  EXPECT_EQ(Estimate({}), Levels(10, 10));
  EXPECT_EQ(Estimate({Make(4), Make(6)}), Levels(20, 20));
  // A kept (not droppable) input needs only its own bytes.
  EXPECT_EQ(Estimate({Make(4), Make(6, false, {Make(24)})}), Levels(20, 20));
}

TEST_F(ReplayEstimateTest, DroppedInputsComeBackFirstOneByOne) {
  // Brought back by its own replay before the resident inputs are pinned
  // (30, not 30 beside the resident 4); with no dropped input followed, it
  // is resident.
  EXPECT_EQ(Estimate({Make(4), Dropped(6, 30)}), Levels(20, 30));
  EXPECT_EQ(Estimate({Dropped(6, 30), Make(4)}).back(), 30u);
  // Each pinned while the next comes back.
  EXPECT_EQ(Estimate({Dropped(6, 30), Dropped(5, 40)}).back(), 46u);
}

TEST_F(ReplayEstimateTest, ADroppedInputsRunRegeneratesItsCallsOtherLiveOutputs) {
  TensorOptions o;
  o.inputs = {Make(24)};
  o.allow_drop = true;
  o.recompute = [](const RecomputeArgs&) { return absl::OkStatus(); };
  const OutputSpec outs[] = {{6}, {7}, {50}, {3}};
  absl::StatusOr<absl::InlinedVector<Guard, 4>> call = runtime_->CreateCall(outs, std::move(o));
  ASSERT_TRUE(call.ok()) << call.status();
  std::vector<TensorId> ids;
  for (Guard& g : *call) {
    ids.push_back(g.id());
    g.Release();
  }
  ASSERT_TRUE(runtime_->Free(ids[2]).ok());  // freed: not regenerated
  // Each output's own replay: the input 24 beside it (x: 30, y: 31).
  // x comes back with its live siblings y and w (7 + 3 more), then the
  // output 10 is made beside x.
  EXPECT_EQ(Estimate({ids[0]}), Levels(6 + 10, 7 + 3 + 30));
  // Two outputs of one call: the others (w) counted once, not the inputs;
  // y comes back beside x.
  EXPECT_EQ(Estimate({ids[0], ids[1]}), Levels(6 + 7 + 10, std::max(3 + 30, 6 + 31)));
}

TEST_F(ReplayEstimateTest, GrowsDownAChainForKReplayDepthLevelsAndNoFurther) {
  // Each call also reads a dropped input of 5 bytes (its replay 5) brought
  // back first.
  TensorId s = Make(1, true);
  std::vector<std::uint64_t> estimates;
  for (std::size_t k = 0; k < kReplayDepth + 3; ++k) {
    const TensorId side = Dropped(5, 5);
    const ReplayEstimate e = Estimate({side, s}, 1);
    estimates.push_back(e.back());
    s = Make(1, true, {side, s});
  }
  for (std::size_t k = 0; k < estimates.size(); ++k) {
    EXPECT_EQ(estimates[k], 7 + 5 * std::min(k, kReplayDepth)) << k;
  }
}

TEST_F(ReplayEstimateTest, AnInputACallReadsTwiceCountsOnce) {
  const TensorId x = Make(4);
  const TensorId y = Make(1, true, {x, x});
  EXPECT_EQ(Estimate({y}), Estimate({Make(1, true, {x})}));
}

TEST_F(ReplayEstimateTest, BadInputsAndRuntimesWithoutEstimatesAreRefused) {
  const TensorId a = Make(4);
  EXPECT_EQ(runtime_->EstimateReplay(std::vector<TensorId>{a, a}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->EstimateReplay(std::vector<TensorId>{999}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto device = std::move(SimDevice::Create({.capacity = kGiB, .backed = false})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {})).value();
  auto plain = std::move(Runtime::Create(alloc.get(), {.policy = "lru"})).value();
  EXPECT_EQ(plain->EstimateReplay({}, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace remat
