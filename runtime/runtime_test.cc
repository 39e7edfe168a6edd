#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Deterministic contents: byte k of a tensor is a function of its tag and of
// its inputs' bytes, so a recompute that read the wrong input, or a restore
// that brought back the wrong bytes, shows as a mismatch.
void Fill(unsigned char* out, std::size_t bytes, std::uint32_t tag,
          const std::vector<const unsigned char*>& ins, const std::vector<std::size_t>& sizes) {
  for (std::size_t k = 0; k < bytes; ++k) {
    std::uint32_t v = tag * 2654435761u + static_cast<std::uint32_t>(k) * 40503u;
    for (std::size_t j = 0; j < ins.size(); ++j) {
      if (sizes[j] > 0) v += ins[j][k % sizes[j]] * (j + 3);
    }
    out[k] = static_cast<unsigned char>(v ^ (v >> 11));
  }
}

struct ScriptedChain;

class RuntimeTest : public ::testing::Test {
 protected:
  // The chain the neighbourhood tests share (defined beside them).
  ScriptedChain ProduceScriptedChain(std::shared_ptr<policies::EvictionPolicy> policy);

  void Make(std::size_t budget, RuntimeOptions options = {}, bool backed = true) {
    runtime_.reset();
    alloc_.reset();
    device_ = std::move(SimDevice::Create({.capacity = 4 * kGiB, .backed = backed})).value();
    alloc_ = std::move(CachingAllocator::Create(device_.get(), {.budget = budget})).value();
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
    if (device->backed()) Fill(want.data(), bytes, tag, in_bytes, sizes);
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
            Fill(static_cast<unsigned char*>(args.output), bytes, tag, in, sizes);
          },
          cost_ns);
    };
    TensorOptions options;
    options.inputs.assign(inputs.begin(), inputs.end());
    options.compute_ns = cost_ns;
    options.allow_drop = drop;
    options.allow_offload = offload;
    if (drop) options.recompute = kernel;
    // The first computation: acquire the inputs, run the kernel once.
    std::vector<Guard> in_guards;
    std::vector<void*> in_ptrs;
    for (TensorId in : inputs) {
      auto g = runtime_->Acquire(in);
      EXPECT_TRUE(g.ok()) << g.status();
      in_ptrs.push_back(g->ptr());
      in_guards.push_back(std::move(*g));
    }
    auto guard = runtime_->Create(bytes, std::move(options));
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
  void Check(TensorId id) {
    auto g = runtime_->Acquire(id);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    const std::vector<unsigned char>& want = expected_.at(id);
    if (device_->backed() && !want.empty()) {
      ASSERT_EQ(std::memcmp(g->ptr(), want.data(), want.size()), 0) << "tensor " << id;
    }
  }

  TensorState StateOf(TensorId id) { return *runtime_->State(id); }

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
};

TEST_F(RuntimeTest, CreateAcquireRelease) {
  Make(64 * kMiB);
  TensorId a = Produce(4096, {}, false, false);
  Check(a);
  EXPECT_EQ(StateOf(a), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().live_tensors, 1u);
}

TEST_F(RuntimeTest, DroppedTensorIsRecomputedFromItsInputs) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId x = Produce(2 * kMiB, {}, false, false);   // an input: never evicted
  TensorId y = Produce(2 * kMiB, {x}, true, false);   // droppable
  TensorId z = Produce(5 * kMiB, {}, false, false);   // no room: y goes
  EXPECT_EQ(StateOf(y), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().drops, 1u);
  ASSERT_TRUE(runtime_->Free(z).ok());
  Check(y);
  EXPECT_EQ(StateOf(y), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().recomputes, 1u);
}

// The owner tags in the allocator's MemoryMap: every block the runtime holds
// carries its storage's tag, one per storage, also once recomputed or restored.
std::vector<std::uint64_t> Owners(const CachingAllocator& alloc) {
  std::vector<std::uint64_t> owners;
  for (const MemoryMapSegment& seg : alloc.GetMemoryMap().segments) {
    for (const MemoryMapBlock& b : seg.blocks) {
      if (!b.free()) owners.push_back(b.owner);
    }
  }
  return owners;
}

TEST_F(RuntimeTest, EveryBlockItHoldsCarriesItsStorageTag) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId x = Produce(2 * kMiB, {}, false, false);
  TensorId y = Produce(2 * kMiB, {x}, true, false);  // dropped below
  TensorId w = Produce(1 * kMiB, {}, false, true);   // offloaded below
  TensorId z = Produce(4 * kMiB, {}, false, false);  // no room: y and w go
  EXPECT_EQ(StateOf(y), TensorState::kDropped);
  EXPECT_TRUE(StateOf(w) == TensorState::kOffloading || StateOf(w) == TensorState::kOnHost);
  ASSERT_TRUE(runtime_->Free(z).ok());
  Check(y);  // recomputed into a new block
  Check(w);  // copied back into a new block
  std::vector<std::uint64_t> owners = Owners(*alloc_);
  ASSERT_EQ(owners.size(), 3u);  // x, y, w
  std::sort(owners.begin(), owners.end());
  EXPECT_NE(owners[0], 0u);
  EXPECT_TRUE(std::adjacent_find(owners.begin(), owners.end()) == owners.end());
}

TEST_F(RuntimeTest, AFailedCreateLeavesTheTagsAsTheyWere) {
  Make(8 * kMiB);
  Produce(1 * kMiB, {}, false, false);
  EXPECT_FALSE(runtime_->Create(64 * kMiB, TensorOptions{}).ok());  // over the budget
  Produce(1 * kMiB, {}, false, false);
  std::vector<std::uint64_t> owners = Owners(*alloc_);
  ASSERT_EQ(owners.size(), 2u);
  std::sort(owners.begin(), owners.end());
  EXPECT_EQ(owners[1], owners[0] + 1);  // consecutive: the failure took none
}

// Create moves the closure out and only reads the rest, so one options object
// can be refilled for tensor after tensor (as the trace replayer does).
TEST_F(RuntimeTest, OneOptionsObjectServesTensorAfterTensor) {
  Make(8 * kMiB, {.policy = "lru"});
  const TensorId x = Produce(1 * kMiB, {}, false, false);
  TensorOptions options;
  options.inputs = {x};
  options.allow_drop = true;
  std::vector<TensorId> made;
  std::vector<std::size_t> inputs_seen;
  for (int i = 0; i < 2; ++i) {
    options.recompute = [&inputs_seen](const RecomputeArgs& args) {
      inputs_seen.push_back(args.inputs.size());
      return absl::OkStatus();
    };
    auto g = runtime_->Create(2 * kMiB, std::move(options));
    ASSERT_TRUE(g.ok()) << g.status();
    made.push_back(g->id());
    EXPECT_THAT(options.inputs, ElementsAre(x));  // still there for the next one
  }
  const TensorId z = Produce(5 * kMiB, {}, false, false);  // no room: both go
  ASSERT_EQ(StateOf(made[0]), TensorState::kDropped);
  ASSERT_EQ(StateOf(made[1]), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Free(z).ok());
  for (TensorId id : made) ASSERT_TRUE(runtime_->Acquire(id).ok());
  EXPECT_THAT(inputs_seen, ElementsAre(1u, 1u));  // each recomputed from x
}

// A failed Create leaves the options as they were: the same object can go again.
TEST_F(RuntimeTest, AFailedCreateLeavesTheOptionsAsTheyWere) {
  Make(8 * kMiB, {.policy = "lru"});
  const TensorId x = Produce(1 * kMiB, {}, false, false);
  TensorOptions options;
  options.inputs = {x};
  options.allow_drop = true;
  options.recompute = [](const RecomputeArgs&) { return absl::OkStatus(); };
  EXPECT_FALSE(runtime_->Create(64 * kMiB, std::move(options)).ok());  // over the budget
  EXPECT_TRUE(static_cast<bool>(options.recompute));
  EXPECT_THAT(options.inputs, ElementsAre(x));
  options.inputs.push_back(TensorId{999'999});  // never made
  EXPECT_FALSE(runtime_->Create(1 * kMiB, std::move(options)).ok());
  EXPECT_TRUE(static_cast<bool>(options.recompute));
  options.inputs.pop_back();
  EXPECT_TRUE(runtime_->Create(1 * kMiB, std::move(options)).ok());
}

TEST_F(RuntimeTest, OffloadedTensorComesBackFromHost) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, false, true);  // offload only
  TensorId b = Produce(4 * kMiB, {}, false, false);
  TensorId c = Produce(2 * kMiB, {}, false, false);
  (void)b;
  (void)c;
  const TensorState s = StateOf(a);
  EXPECT_TRUE(s == TensorState::kOffloading || s == TensorState::kOnHost) << TensorStateName(s);
  EXPECT_EQ(runtime_->stats().offloaded_bytes, 4 * kMiB);
  ASSERT_TRUE(runtime_->Free(b).ok());  // make room to bring it back
  Check(a);
  EXPECT_EQ(runtime_->stats().restored_bytes, 4 * kMiB);
}

TEST_F(RuntimeTest, PrefetchBringsATensorBackAheadOfUse) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId b = Produce(6 * kMiB, {}, false, false);
  ASSERT_NE(StateOf(a), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Prefetch(a).ok());
  EXPECT_EQ(StateOf(a), TensorState::kPrefetching);
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  Check(a);
  EXPECT_EQ(StateOf(a), TensorState::kResident);
}

TEST_F(RuntimeTest, APrefetchedTensorCanBeEvictedAgainBeforeItsUse) {
  // Otherwise prefetches pile up unevictable and a budget fills with them.
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId b = Produce(6 * kMiB, {}, false, false);
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Prefetch(a).ok());
  ASSERT_EQ(StateOf(a), TensorState::kPrefetching);
  TensorId c = Produce(6 * kMiB, {}, false, false);  // no room unless a goes again
  EXPECT_NE(StateOf(a), TensorState::kPrefetching);
  EXPECT_NE(StateOf(a), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(c).ok());
  Check(a);  // the bytes survived the round trips
}

TEST_F(RuntimeTest, ChooseCheaperWayOutWhenBothAreAllowed) {
  Make(8 * kMiB, {.policy = "lru"});
  // Recompute of 10 ns beats a 4 MiB round trip over 25 GB/s.
  TensorId cheap = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10);
  Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(cheap), TensorState::kDropped);
  // A 10 ms recompute does not.
  Make(8 * kMiB, {.policy = "lru"});
  expected_.clear();
  TensorId costly = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10'000'000);
  Produce(6 * kMiB, {}, false, false);
  EXPECT_NE(StateOf(costly), TensorState::kDropped);
  EXPECT_NE(StateOf(costly), TensorState::kResident);
}

TEST_F(RuntimeTest, ViewsShareTheirStoragesFate) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId base = Produce(4 * kMiB, {}, true, false);
  auto view = runtime_->CreateView(base);
  ASSERT_TRUE(view.ok());
  expected_[*view] = expected_[base];
  sizes_[*view] = sizes_[base];
  TensorId big = Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(base), TensorState::kDropped);
  EXPECT_EQ(StateOf(*view), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(*view);  // restoring the view restores the base too
  EXPECT_EQ(StateOf(base), TensorState::kResident);
  // Freeing the base keeps the storage for the view.
  ASSERT_TRUE(runtime_->Free(base).ok());
  Check(*view);
  EXPECT_EQ(runtime_->Acquire(base).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RuntimeTest, PinnedTensorsAreNeverEvictedAndTheErrorSaysWhy) {
  Make(8 * kMiB, {.policy = "dtr"});
  TensorId a = Produce(4 * kMiB, {}, true, true);
  auto pin = runtime_->Acquire(a);
  ASSERT_TRUE(pin.ok());
  auto fail = runtime_->Create(6 * kMiB, TensorOptions{});
  ASSERT_EQ(fail.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fail.status().message()),
              AllOf(HasSubstr("1 tensors pinned (4.00 MiB"), HasSubstr("#1 (4.00 MiB)"),
                    HasSubstr("0 B still evictable"), HasSubstr("budget 8.00 MiB"),
                    HasSubstr("policy dtr")));
  EXPECT_EQ(StateOf(a), TensorState::kResident);
  pin->Release();
  EXPECT_TRUE(runtime_->Create(6 * kMiB, TensorOptions{}).ok());
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
}

TEST_F(RuntimeTest, RecomputeIsRecursive) {
  Make(6 * kMiB, {.policy = "lru"});
  TensorId x = Produce(kMiB, {}, false, false);
  std::vector<TensorId> chain = {x};
  for (int i = 0; i < 6; ++i) chain.push_back(Produce(kMiB, {chain.back()}, true, false));
  // A 4 MiB tensor needs every link's segment back.
  TensorId big = Produce(4 * kMiB, {}, false, false);
  // (The newest link may share the input's segment and stay.)
  for (std::size_t i = 1; i < 6; ++i) EXPECT_EQ(StateOf(chain[i]), TensorState::kDropped) << i;
  ASSERT_TRUE(runtime_->Free(big).ok());
  // The fifth link needs the four before it regenerated first, in a budget
  // that never holds the whole chain.
  Check(chain[5]);
  EXPECT_EQ(runtime_->stats().recomputes, 5u);
  for (std::size_t i = 1; i < chain.size(); ++i) Check(chain[i]);
}

TEST_F(RuntimeTest, AHundredThousandDroppedLinksComeBackWithoutDeepRecursion) {
  Make(2 * kMiB, {.policy = "lru"}, /*backed=*/false);  // addresses only: this is about depth
  TensorId prev = Produce(64 * kKiB, {}, false, false);
  std::vector<TensorId> chain;
  for (int i = 0; i < 100000; ++i) {
    prev = Produce(64 * kKiB, {prev}, true, false, 10);
    chain.push_back(prev);
    if (i % 1000 == 0) {
      ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    }
  }
  // Only the newest links fit; the one near the start needs 99,000 ancestors.
  EXPECT_EQ(StateOf(chain[100]), TensorState::kDropped);
  Check(chain[99000]);
  EXPECT_GE(runtime_->stats().recomputes, 99000u);
}

TEST_F(RuntimeTest, AFailingClosureLeavesTheTensorDroppedAndLeaksNothing) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorOptions options;
  options.allow_drop = true;
  int calls = 0;
  options.recompute = [&calls](const RecomputeArgs&) {
    ++calls;
    return absl::InternalError("kernel launch failed");
  };
  auto g = runtime_->Create(4 * kMiB, std::move(options));
  ASSERT_TRUE(g.ok());
  const TensorId id = g->id();
  g->Release();
  TensorId other = Produce(6 * kMiB, {}, false, false);
  ASSERT_EQ(StateOf(id), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Free(other).ok());
  const auto allocated_before = alloc_->GetStats().allocated_bytes.all().current;
  auto again = runtime_->Acquire(id);
  ASSERT_EQ(again.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(again.status().message()),
              AllOf(HasSubstr("recomputing tensor #"), HasSubstr("kernel launch failed")));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(StateOf(id), TensorState::kDropped);
  EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, allocated_before);
}

TEST_F(RuntimeTest, FreedTensorStaysWhileAClosureNeedsIt) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId x = Produce(2 * kMiB, {}, true, false);
  TensorId y = Produce(2 * kMiB, {x}, true, false);
  // Freed while y's closure reads it: its bytes go at once, its metadata stays.
  ASSERT_TRUE(runtime_->Free(x).ok());
  EXPECT_EQ(StateOf(x), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().released_drops, 1u);
  EXPECT_EQ(runtime_->stats().drops, 0u);
  TensorId big = Produce(7 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(y), TensorState::kDropped);
  // y went under pressure, x for want of a reader: the per-tensor count tells.
  EXPECT_EQ(*runtime_->PressureDrops(y), 1u);
  EXPECT_EQ(*runtime_->PressureDrops(x), 0u);
  EXPECT_EQ(runtime_->PressureDrops(999).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(y);  // regenerates x first, then y
  EXPECT_EQ(runtime_->stats().recomputes, 2u);
  // Once y is freed too, both are collected and their memory returned.
  ASSERT_TRUE(runtime_->Free(y).ok());
  EXPECT_EQ(runtime_->stats().resident_bytes, 0u);
  EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, 0);
  EXPECT_EQ(StateOf(x), TensorState::kFreed);
}

TEST_F(RuntimeTest, WithDropsDisabledAReleasedInputGoesAtOnce) {
  // No closure will ever run, so none keeps its inputs: freeing x returns
  // its block though y was computed from it.
  Make(8 * kMiB, {.policy = "lru", .enable_drop = false});
  TensorId x = Produce(2 * kMiB, {}, true, true);
  TensorId y = Produce(2 * kMiB, {x}, true, true);
  ASSERT_TRUE(runtime_->Free(x).ok());
  EXPECT_EQ(StateOf(x), TensorState::kFreed);
  EXPECT_EQ(runtime_->stats().resident_bytes, 2 * kMiB);
  EXPECT_EQ(runtime_->stats().released_drops, 0u);
  Check(y);
}

TEST_F(RuntimeTest, RegeneratingDiamondsCostsEachTensorOnce) {
  // c[i] = h(b[i], a[i]), b[i] = g(a[i]), a[i] = f(c[i-1]): a chain of
  // diamonds, like a ResNet's skip connections. The program releases all of
  // it but keeps d = k(c[last]); d is then evicted and read. Each released
  // tensor is needed twice in the regeneration (a[i] by b[i] and c[i]): were
  // it dropped after its first consumer, the second would regenerate it again,
  // doubling at every level (thousands of recomputes here).
  constexpr int kLevels = 12;
  Make(64 * kMiB, {.policy = "lru"});
  TensorId c = Produce(kMiB, {}, false, false);  // the input: never evicted
  std::vector<TensorId> released;
  for (int i = 0; i < kLevels; ++i) {
    TensorId a = Produce(kMiB, {c}, true, false);
    TensorId b = Produce(kMiB, {a}, true, false);
    TensorId next = Produce(kMiB, {b, a}, true, false);  // b first: a is needed again after
    released.insert(released.end(), {a, b, next});
    c = next;
  }
  TensorId d = Produce(kMiB, {c}, true, false);
  for (TensorId id : released) ASSERT_TRUE(runtime_->Free(id).ok());
  const std::uint64_t before = runtime_->stats().recomputes;
  TensorId big = Produce(62 * kMiB, {}, false, false);  // evicts d: only the input stays
  EXPECT_EQ(StateOf(d), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(d);  // regenerates the whole chain, each tensor once, then d
  EXPECT_EQ(runtime_->stats().recomputes - before, 3u * kLevels + 1);
  // What the regeneration kept for its own use is collected once it is done:
  // the released tensors are dropped again, d alone (and the input) resident.
  EXPECT_EQ(runtime_->stats().resident_bytes, 2 * kMiB);
  ASSERT_TRUE(runtime_->Free(d).ok());
  EXPECT_EQ(runtime_->stats().resident_bytes, kMiB);
}

TEST_F(RuntimeTest, PinnedHostPoolExhaustionFallsBackToDropping) {
  Make(8 * kMiB, {.policy = "lru", .host_pool_bytes = kMiB});
  TensorId a = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10'000'000);  // prefers offload
  Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
}

// Evicts the candidates of the sizes it is told, event by event, and keeps
// what it was shown: candidates are known by their sizes.
class ScriptedPolicy : public policies::EvictionPolicy {
 public:
  explicit ScriptedPolicy(std::vector<std::vector<std::size_t>> script)
      : script_(std::move(script)) {}
  policies::Plan Choose(const policies::PressureContext& ctx) override {
    shown.emplace_back(ctx.candidates.begin(), ctx.candidates.end());
    const std::size_t event = shown.size() - 1;
    policies::Plan plan;
    if (event >= script_.size()) return plan;
    for (std::size_t bytes : script_[event]) {
      for (const policies::Candidate& c : ctx.candidates) {
        if (c.bytes == bytes) plan.push_back({c.id, policies::EvictAction::kDrop});
      }
    }
    return plan;
  }
  std::vector<std::vector<policies::Candidate>> shown;
  const std::vector<std::vector<std::size_t>>& script() const { return script_; }

 protected:
  std::string OwnSpec() const override { return "scripted"; }

 private:
  std::vector<std::vector<std::size_t>> script_;
};

const policies::Candidate* BySize(const std::vector<policies::Candidate>& cs, std::size_t bytes) {
  for (const policies::Candidate& c : cs) {
    if (c.bytes == bytes) return &c;
  }
  return nullptr;
}

// x -> a -> b -> c -> d (1-5 MiB, costs 10, 20, 30, 40 us) under 22 MiB; then
// e (8 MiB, kept) forces two pressure events in which `policy` (scripted to
// drop b and c, then d) sees the candidates.
struct ScriptedChain {
  TensorId x, a, b, c, d, e;
};
std::vector<std::vector<std::size_t>> ChainScript() { return {{3 * kMiB, 4 * kMiB}, {5 * kMiB}}; }

ScriptedChain RuntimeTest::ProduceScriptedChain(std::shared_ptr<policies::EvictionPolicy> policy) {
  Make(22 * kMiB, {.custom_policy = std::move(policy)});
  ScriptedChain t;
  t.x = Produce(kMiB, {}, false, false);
  t.a = Produce(2 * kMiB, {t.x}, true, false, 10'000);
  t.b = Produce(3 * kMiB, {t.a}, true, false, 20'000);
  t.c = Produce(4 * kMiB, {t.b}, true, false, 30'000);
  t.d = Produce(5 * kMiB, {t.c}, true, false, 40'000);
  t.e = Produce(8 * kMiB, {}, false, false);
  return t;
}

TEST_F(RuntimeTest, CandidatesCarryTheirEvictedNeighbourhood) {
  // b and c get dropped, then a's dropped consumer (b) and d's dropped
  // ancestors (c, b) show in their costs.
  auto policy = std::make_shared<ScriptedPolicy>(ChainScript());
  const auto [x, a, b, c, d, e] = ProduceScriptedChain(policy);
  ASSERT_GE(policy->shown.size(), 2u);
  EXPECT_EQ(StateOf(b), TensorState::kDropped);
  EXPECT_EQ(StateOf(c), TensorState::kDropped);
  EXPECT_EQ(StateOf(d), TensorState::kDropped);
  const std::vector<policies::Candidate>& second = policy->shown[1];
  ASSERT_EQ(second.size(), 2u);  // a and d: x may not go, b and c are gone
  ASSERT_NE(BySize(second, 2 * kMiB), nullptr);
  ASSERT_NE(BySize(second, 5 * kMiB), nullptr);
  EXPECT_EQ(BySize(second, 2 * kMiB)->neighbourhood_ns, 20'000);  // b waits on a
  EXPECT_EQ(BySize(second, 5 * kMiB)->neighbourhood_ns, 50'000);  // d needs c and b first
  EXPECT_EQ(BySize(second, 5 * kMiB)->compute_ns, 40'000);
  // Recomputing d brings c and b back, in the room e leaves.
  ASSERT_TRUE(runtime_->Free(e).ok());
  Check(d);
  EXPECT_EQ(StateOf(c), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().recomputes, 3u);
  Check(a);
}

TEST_F(RuntimeTest, ANeighbourhoodLeftOutIsFilledInOnRequest) {
  // As above, for a policy that does not score by the neighbourhood: the
  // candidates leave their ancestors out, and Complete fills them in.
  struct Lazy : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.neighbourhood = false}; }
    policies::Plan Choose(const policies::PressureContext& ctx) override {
      completed.clear();
      for (policies::Candidate c : ctx.candidates) {
        ctx.Complete(c);
        completed.push_back(c);
      }
      return ScriptedPolicy::Choose(ctx);
    }
    std::vector<policies::Candidate> completed;
  };
  auto policy = std::make_shared<Lazy>(ChainScript());
  ProduceScriptedChain(policy);
  ASSERT_GE(policy->shown.size(), 2u);
  const policies::Candidate* shown = BySize(policy->shown[1], 5 * kMiB);
  const policies::Candidate* full = BySize(policy->completed, 5 * kMiB);
  ASSERT_NE(shown, nullptr);
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(shown->ancestors_ns, 0);  // left out
  EXPECT_EQ(full->ancestors_ns, 50'000);  // c and b, filled in
  EXPECT_EQ(full->neighbourhood_ns, 50'000);
  const policies::Candidate* a_full = BySize(policy->completed, 2 * kMiB);
  ASSERT_NE(a_full, nullptr);
  EXPECT_EQ(a_full->consumers_ns, 20'000);  // always there
}

TEST_F(RuntimeTest, CandidatesCarryClassesFreeNeighboursHintsAndHistory) {
  // x -> a -> b -> c; b and c dropped (one class, 50 us). Then a's classes,
  // its free neighbours, its next-use hint and its recompute count show.
  auto policy = std::make_shared<ScriptedPolicy>(
      std::vector<std::vector<std::size_t>>{{3 * kMiB, 4 * kMiB}, {}});
  struct Needing : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.classes = true, .adjacent_free = true}; }
  };
  auto needing = std::make_shared<Needing>(policy->script());
  Make(22 * kMiB, {.custom_policy = needing});
  TensorId x = Produce(kMiB, {}, false, false);
  TensorId a = Produce(2 * kMiB, {x}, true, false, 10'000);
  TensorId b = Produce(3 * kMiB, {a}, true, false, 20'000);
  Produce(4 * kMiB, {b}, true, false, 30'000);
  ASSERT_TRUE(runtime_->HintNextUse(a, device_->NowNs() + 5'000'000).ok());
  EXPECT_FALSE(runtime_->HintNextUse(a, -1).ok());
  EXPECT_FALSE(runtime_->HintNextUse(999, 0).ok());
  // 19 MiB cannot fit even once b and c are gone: a second event shows a
  // among its freed neighbours; then nothing more goes, and it fails.
  EXPECT_TRUE(absl::IsResourceExhausted(runtime_->Create(19 * kMiB, TensorOptions{}).status()));
  ASSERT_GE(needing->shown.size(), 2u);
  const policies::Candidate* ca = BySize(needing->shown[1], 2 * kMiB);
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(ca->classes_ns, 50'000);              // b and c: one class
  EXPECT_EQ(ca->consumers_ns, 20'000);            // b reads a
  EXPECT_EQ(ca->adjacent_free_bytes, 18 * kMiB);  // b's, c's and the rest, coalesced
  EXPECT_GT(ca->next_use_ns, 4'000'000);
  EXPECT_LE(ca->next_use_ns, 5'000'000);
  EXPECT_EQ(ca->accesses, 2u);  // created, then read to produce b
  EXPECT_EQ(ca->recomputes, 0u);
}

TEST_F(RuntimeTest, PoliciesSeeTheRestoresOwedForWhatIsOffloaded) {
  // Offloads every candidate it may; records what the link owes at each event.
  struct Offloading : policies::EvictionPolicy {
    policies::Plan Choose(const policies::PressureContext& ctx) override {
      restore_backlog.push_back(ctx.restore_backlog_ns);
      policies::Plan plan;
      for (const policies::Candidate& c : ctx.candidates) {
        if (c.can_offload) plan.push_back({c.id, policies::EvictAction::kOffload});
      }
      return plan;
    }
    std::string OwnSpec() const override { return "offloading"; }
    std::vector<std::int64_t> restore_backlog;
  };
  auto policy = std::make_shared<Offloading>();
  Make(8 * kMiB, {.custom_policy = policy, .link_gbps = 25.0});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId big = Produce(6 * kMiB, {}, false, false);  // a goes to the host
  EXPECT_NE(StateOf(a), TensorState::kResident);
  // At the next event the policy sees a's restore owed.
  TensorId c = Produce(kMiB, {}, false, true);
  Produce(2 * kMiB, {}, false, false);
  EXPECT_NE(StateOf(c), TensorState::kResident);
  ASSERT_EQ(policy->restore_backlog.size(), 2u);
  EXPECT_EQ(policy->restore_backlog[0], 0);
  EXPECT_EQ(policy->restore_backlog[1], static_cast<std::int64_t>(4 * kMiB / 25.0));
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(a);  // both come back byte for byte
  Check(c);
}

TEST_F(RuntimeTest, APolicyThatSamplesSeesOnlyItsSample) {
  // Ten droppable 1 MiB tensors fill the budget; each new one needs one out.
  for (const char* spec : {"lru", "lru:sample=1"}) {
    SCOPED_TRACE(spec);
    Make(12 * kMiB, {.policy = spec});
    TensorId x = Produce(kMiB, {}, false, false);
    for (int i = 0; i < 40; ++i) Produce(kMiB, {x}, true, false);
    const RuntimeStats st = runtime_->stats();
    ASSERT_GT(st.pressure_events, 0u);
    if (std::string(spec) == "lru") {
      // Every unpinned droppable tensor is a candidate of every event.
      EXPECT_GE(st.candidates_shown, st.pressure_events * 5);
    } else {
      EXPECT_EQ(st.candidates_shown, st.pressure_events);
    }
    EXPECT_GT(st.choose_wall_ns, 0);
  }
}

TEST_F(RuntimeTest, BadInputIsAClearError) {
  Make(8 * kMiB);
  EXPECT_EQ(runtime_->Acquire(12345).status().code(), absl::StatusCode::kNotFound);
  TensorOptions no_closure;
  no_closure.allow_drop = true;
  EXPECT_EQ(runtime_->Create(1024, std::move(no_closure)).status().code(),
            absl::StatusCode::kInvalidArgument);
  TensorOptions bad_input;
  bad_input.inputs = {999};
  EXPECT_EQ(runtime_->Create(1024, std::move(bad_input)).status().code(),
            absl::StatusCode::kInvalidArgument);
  TensorId a = Produce(1024, {}, false, false);
  ASSERT_TRUE(runtime_->Free(a).ok());
  EXPECT_EQ(runtime_->Free(a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Runtime::Create(alloc_.get(), {.policy = "nope"}).ok());
}

TEST_F(RuntimeTest, BookkeepingStaysBoundedWhileTensorsComeAndGo) {
  // A long run: each step makes a tensor (and a view of it) from the last one
  // and frees the last. One tensor is kept from the start (a parameter). What
  // the runtime holds is bounded by what is alive, not by how many tensors
  // ever were. (Not droppable: a closure would keep its inputs' metadata.)
  Make(64 * kMiB, {.policy = "lru"});
  auto first = runtime_->Create(1024, {});
  ASSERT_TRUE(first.ok());
  const TensorId kept = first->id();
  first->Release();
  TensorId prev = 0;
  std::vector<TensorId> seen;
  for (int i = 0; i < 5 * 4096; ++i) {
    TensorOptions o;
    o.allow_offload = true;
    o.inputs = {kept};
    if (prev != 0) o.inputs.push_back(prev);
    auto g = runtime_->Create(256, std::move(o));
    ASSERT_TRUE(g.ok()) << g.status();
    const TensorId id = g->id();
    g->Release();
    auto view = runtime_->CreateView(id);
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(runtime_->Free(*view).ok());
    if (prev != 0) {
      ASSERT_TRUE(runtime_->Free(prev).ok());
    }
    prev = id;
    if (i % 997 == 0) seen.push_back(id);
  }
  const RuntimeStats stats = runtime_->stats();
  EXPECT_EQ(stats.tensors_created, 1u + 2u * 5 * 4096);
  EXPECT_EQ(stats.live_tensors, 2u);
  // The page of `kept` and the last one or two; the rest given back.
  EXPECT_LE(stats.tensor_pages, 3u);
  // The chain's tensors are collected as it goes: objects are reused.
  EXPECT_LE(stats.storage_objects, 4u);
  // Old ids still answer as freed; ids never handed out do not exist.
  for (TensorId id : seen) {
    if (id == prev) continue;
    EXPECT_EQ(StateOf(id), TensorState::kFreed) << id;
    EXPECT_EQ(runtime_->Acquire(id).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(runtime_->Free(id).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(runtime_->PressureDrops(id).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(runtime_->State(prev + 100).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime_->Acquire(0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StateOf(kept), TensorState::kResident);
  EXPECT_EQ(StateOf(prev), TensorState::kResident);
  EXPECT_TRUE(runtime_->Acquire(prev).ok());

  // One at a time: each page empties before its last id is handed out, and
  // must stay until then (the next id lands in it).
  for (int i = 0; i < 3 * 4096 + 5; ++i) {
    auto g = runtime_->Create(64, {});
    ASSERT_TRUE(g.ok()) << g.status();
    const TensorId id = g->id();
    g->Release();
    ASSERT_TRUE(runtime_->Free(id).ok());
    EXPECT_EQ(StateOf(id), TensorState::kFreed);
  }
  EXPECT_LE(runtime_->stats().tensor_pages, 4u);
  EXPECT_EQ(runtime_->stats().live_tensors, 2u);
}

// Random programs under tiny budgets, for each policy and eviction mode:
// every acquire sees exactly the bytes produced; at the end nothing is left.
struct Mode {
  const char* policy;
  bool drop;
  bool offload;
};

class RuntimePropertyTest : public RuntimeTest, public ::testing::WithParamInterface<Mode> {};

TEST_P(RuntimePropertyTest, EveryAcquireSeesTheBytesProduced) {
  const Mode mode = GetParam();
  // REMAT_RUNTIME_SEEDS for this test alone (CI's sanitizer builds), else
  // REMAT_PROPERTY_SEEDS as the other property tests.
  const char* env = std::getenv("REMAT_RUNTIME_SEEDS");
  if (env == nullptr) env = std::getenv("REMAT_PROPERTY_SEEDS");
  const int seeds = env != nullptr ? std::atoi(env) : 3;
  std::uint64_t evictions = 0;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    expected_.clear();
    sizes_.clear();
    Make((2 + rng() % 6) * kMiB, {.policy = mode.policy, .host_pool_bytes = kGiB});
    check_in_closures_ = true;  // and after every operation below
    std::vector<TensorId> live;
    live.push_back(Produce(256 * kKiB, {}, false, false));  // an input
    for (int step = 0; step < 300; ++step) {
      ASSERT_NO_FATAL_FAILURE(CheckInvariants());
      const int op = static_cast<int>(rng() % 10);
      if (op < 5 || live.size() < 3) {
        std::vector<TensorId> inputs;
        for (int k = 0, n = static_cast<int>(rng() % 3); k < n; ++k) {
          inputs.push_back(live[rng() % live.size()]);
        }
        const std::size_t bytes = (rng() % 8 == 0) ? 0 : 256 * (1 + rng() % 1024);
        const TensorId id = Produce(bytes, inputs, mode.drop, mode.offload);
        if (id == 0) continue;  // over budget with everything pinned: allowed
        live.push_back(id);
      } else if (op < 8) {
        ASSERT_NO_FATAL_FAILURE(Check(live[rng() % live.size()]));
      } else if (op < 9 && live.size() > 1) {
        const std::size_t i = 1 + rng() % (live.size() - 1);
        ASSERT_TRUE(runtime_->Free(live[i]).ok());
        live.erase(live.begin() + static_cast<long>(i));
      } else {
        const TensorId id = live[rng() % live.size()];
        if (sizes_.count(id)) {
          auto view = runtime_->CreateView(id);
          ASSERT_TRUE(view.ok());
          expected_[*view] = expected_[id];
          sizes_[*view] = sizes_[id];
          live.push_back(*view);
        }
      }
    }
    ASSERT_NO_FATAL_FAILURE(CheckInvariants());
    for (TensorId id : live) {
      ASSERT_NO_FATAL_FAILURE(Check(id));
      ASSERT_NO_FATAL_FAILURE(CheckInvariants());
    }
    evictions += runtime_->stats().drops + runtime_->stats().offloads;
    for (TensorId id : live) {
      ASSERT_TRUE(runtime_->Free(id).ok());
      ASSERT_NO_FATAL_FAILURE(CheckInvariants());
    }
    EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, 0);
    EXPECT_EQ(runtime_->stats().resident_bytes, 0u);
  }
  EXPECT_GT(evictions, 0u) << "the budgets never forced an eviction: the test proves nothing";
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RuntimePropertyTest,
    ::testing::Values(Mode{"lru", true, false}, Mode{"lru", false, true}, Mode{"lru", true, true},
                      Mode{"largest", true, false}, Mode{"largest", false, true},
                      Mode{"largest", true, true}, Mode{"dtr", true, false},
                      Mode{"dtr", false, true}, Mode{"dtr", true, true},
                      Mode{"lru:sample=sqrt", true, true}, Mode{"dtr:sample=2", true, true},
                      Mode{"dtr-eq", true, true}, Mode{"dtr-local", true, false},
                      Mode{"msps", true, true}, Mode{"megengine", true, true},
                      Mode{"window", true, true}, Mode{"hybrid", true, true},
                      Mode{"belady", true, true}),
    [](const testing::TestParamInfo<Mode>& info) {
      std::string name = std::string(info.param.policy) + (info.param.drop ? "_drop" : "") +
                         (info.param.offload ? "_offload" : "");
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST_F(RuntimeTest, AFailingOffloadCopyFallsBackAndAFailingRestoreLeavesTheTensorOnHost) {
  Make(8 * kMiB, {.policy = "lru"});
  // Offload preferred (costly recompute); the copy out fails: it is dropped instead.
  TensorId a = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10'000'000);
  device_->FailNextCopies(1);
  TensorId big = Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(a);

  // Offload only: the copy back fails; the caller hears why, the tensor stays
  // on the host, no device memory leaks, and the next acquire succeeds.
  Make(8 * kMiB, {.policy = "lru"});
  expected_.clear();
  TensorId b = Produce(4 * kMiB, {}, false, true);
  big = Produce(6 * kMiB, {}, false, false);
  ASSERT_NE(StateOf(b), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(big).ok());
  const auto allocated = alloc_->GetStats().allocated_bytes.all().current;
  device_->FailNextCopies(1);
  auto failed = runtime_->Acquire(b);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("injected fault"));
  EXPECT_NE(StateOf(b), TensorState::kResident);
  EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, allocated);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  Check(b);
}

TEST_F(RuntimeTest, AFailedStreamWaitGivesUpTheOffloadOrMakesTheHostWait) {
  // The copy out cannot be ordered after the tensor's producer: the offload
  // is given up and the tensor dropped instead.
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10'000'000);
  device_->FailNextWaits(1);
  TensorId big = Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().offloads, 0u);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(a);

  // A dropped block used on another stream cannot be handed back behind that
  // stream's work by a wait: the host waits for the stream instead.
  Make(8 * kMiB, {.policy = "lru", .enable_offload = false});
  expected_.clear();
  TensorId b = Produce(4 * kMiB, {}, true, false);
  auto side = device_->CreateStream();
  ASSERT_TRUE(side.ok());
  {
    auto g = runtime_->Acquire(b, *side);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->LaunchHostFunc(*side, [] {}, /*cost_ns=*/1'000'000'000).ok());
  }
  const std::int64_t side_done = *device_->StreamTimeNs(*side);
  ASSERT_LT(device_->NowNs(), side_done);
  device_->FailNextWaits(1);
  big = Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(b), TensorState::kDropped);
  EXPECT_GE(device_->NowNs(), side_done);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(b);
}

// Several host threads, each with its own stream and tensors, creating,
// acquiring and freeing under one tight budget; also run under TSan.
// --- Calls with several outputs, and closures without the lock ----------------

// A call of three 4 MiB outputs whose closure writes each output's index
// into its bytes (on the device's stream), counting its runs.
struct ThreeOutputs {
  absl::InlinedVector<Guard, 4> guards;
  std::shared_ptr<std::atomic<int>> runs = std::make_shared<std::atomic<int>>(0);
};

ThreeOutputs MakeThreeOutputCall(Runtime& runtime, SimDevice* device, TensorId input) {
  ThreeOutputs call;
  TensorOptions options;
  options.inputs = {input};
  options.compute_ns = 5000;
  options.allow_drop = true;
  auto runs = call.runs;
  options.recompute = [device, runs](const RecomputeArgs& args) {
    ++*runs;
    for (std::size_t i = 0; i < args.outputs.size(); ++i) {
      if (!args.regenerate[i]) continue;
      void* out = args.outputs[i];
      const std::size_t bytes = args.output_bytes[i];
      absl::Status s = device->LaunchHostFunc(args.stream, [out, bytes, i] {
        std::memset(out, static_cast<int>(0x40 + i), bytes);
      });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  const std::vector<OutputSpec> specs(3, OutputSpec{4 * kMiB});
  auto made = runtime.CreateCall(specs, std::move(options));
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return call;
  for (std::size_t i = 0; i < 3; ++i) std::memset((*made)[i].ptr(), 0x40 + static_cast<int>(i), 4 * kMiB);
  call.guards = std::move(*made);
  return call;
}

TEST_F(RuntimeTest, ACallOfThreeOutputsIsRecomputedOnceAndChargedOnce) {
  Make(64 * kMiB, {.policy = "lru", .enable_offload = false});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  ThreeOutputs call = MakeThreeOutputCall(*runtime_, device_.get(), x);
  std::vector<TensorId> ids;
  for (Guard& g : call.guards) ids.push_back(g.id());
  call.guards.clear();
  // Fill the budget so that all three go.
  auto big = runtime_->Create(60 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok()) << big.status();
  for (TensorId id : ids) EXPECT_EQ(StateOf(id), TensorState::kDropped);
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto g = runtime_->Acquire(ids[i]);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    const auto* p = static_cast<const unsigned char*>(g->ptr());
    EXPECT_EQ(p[0], 0x40 + i);
    EXPECT_EQ(p[4 * kMiB - 1], 0x40 + i);
  }
  EXPECT_EQ(call.runs->load(), 1);
  EXPECT_EQ(runtime_->stats().recomputes, 1u);
  EXPECT_EQ(runtime_->stats().recompute_ns, 5000);
  for (TensorId id : ids) EXPECT_EQ(StateOf(id), TensorState::kResident);
}

TEST_F(RuntimeTest, ACallRegeneratesOnlyTheOutputsItLost) {
  Make(0, {.policy = "lru", .live_budget = 64 * kMiB});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  ThreeOutputs call = MakeThreeOutputCall(*runtime_, device_.get(), x);
  std::vector<TensorId> ids;
  for (Guard& g : call.guards) ids.push_back(g.id());
  // Output 0 stays pinned; 1 and 2 go.
  call.guards.erase(call.guards.begin() + 1, call.guards.end());
  auto big = runtime_->Create(56 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(StateOf(ids[0]), TensorState::kResident);
  EXPECT_EQ(StateOf(ids[1]), TensorState::kDropped);
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  auto g = runtime_->Acquire(ids[2]);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(call.runs->load(), 1);
  EXPECT_EQ(StateOf(ids[1]), TensorState::kResident);  // regenerated in the same run
  ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
  EXPECT_EQ(static_cast<const unsigned char*>(call.guards[0].ptr())[0], 0x40);
}

TEST_F(RuntimeTest, ACallNeedsAnOutputAndAFailedOneLeavesNothingBehind) {
  Make(8 * kMiB);
  EXPECT_EQ(runtime_->CreateCall({}, TensorOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<OutputSpec> specs = {{4 * kMiB}, {8 * kMiB}};  // 12 MiB: over the budget
  auto made = runtime_->CreateCall(specs, TensorOptions{});
  EXPECT_EQ(made.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(runtime_->stats().resident_bytes, 0u);
  EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, 0);
  EXPECT_EQ(runtime_->stats().tensors_created, 0u);
}

TEST_F(RuntimeTest, AClosureMayAllocateAcquireAndCausePressure) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 16 * kMiB});
  TensorId a = Produce(2 * kMiB, {}, true, false);
  TensorId side = Produce(2 * kMiB, {}, false, false);
  Runtime* rt = runtime_.get();
  bool ran = false;
  TensorOptions options;
  options.inputs = {a};
  options.allow_drop = true;
  options.recompute = [rt, side, &ran](const RecomputeArgs&) -> absl::Status {
    // Back into the runtime: another tensor, and a temporary large enough to
    // need an eviction.
    absl::StatusOr<Guard> g = rt->Acquire(side);
    if (!g.ok()) return g.status();
    absl::StatusOr<Guard> tmp = rt->Create(8 * kMiB, TensorOptions{});
    if (!tmp.ok()) return tmp.status();
    const TensorId id = tmp->id();
    tmp->Release();
    ran = true;
    return rt->Free(id);
  };
  auto b = runtime_->Create(4 * kMiB, std::move(options));
  ASSERT_TRUE(b.ok());
  const TensorId b_id = b->id();
  b->Release();
  TensorId c = Produce(2 * kMiB, {}, true, false);
  auto big = runtime_->Create(12 * kMiB, TensorOptions{});  // a and b go
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(StateOf(b_id), TensorState::kDropped);
  EXPECT_EQ(StateOf(c), TensorState::kResident);
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  // b's closure runs with a (regenerated first), side and b's own block
  // pinned: its 8 MiB temporary can only come from evicting c.
  auto g = runtime_->Acquire(b_id);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(ran);
  EXPECT_EQ(StateOf(c), TensorState::kDropped);
  EXPECT_EQ(StateOf(a), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().recomputes, 2u);
}

TEST_F(RuntimeTest, AClosureAcquiringItsOwnOutputIsAnErrorNotAHang) {
  Make(16 * kMiB, {.policy = "lru", .enable_offload = false});
  Runtime* rt = runtime_.get();
  auto self = std::make_shared<TensorId>(0);
  TensorOptions options;
  options.allow_drop = true;
  options.recompute = [rt, self](const RecomputeArgs&) -> absl::Status {
    return rt->Acquire(*self).status();
  };
  auto t = runtime_->Create(8 * kMiB, std::move(options));
  ASSERT_TRUE(t.ok());
  *self = t->id();
  t->Release();
  auto big = runtime_->Create(12 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok());
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  auto g = runtime_->Acquire(*self);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(g.status().message(), HasSubstr("being regenerated by this thread"));
  EXPECT_EQ(StateOf(*self), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().resident_bytes, 0u);
}

TEST_F(RuntimeTest, TheStepLimitEndsARunWithAClearError) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 8 * kMiB, .max_steps = 2});
  TensorId a = Produce(4 * kMiB, {}, true, false);
  TensorId b = Produce(4 * kMiB, {}, true, false);
  Produce(4 * kMiB, {}, true, false);  // step 1: a pressure event (a goes)
  auto ga = runtime_->Acquire(a);      // step 2: a pressure event (b goes), then a recompute
  ASSERT_TRUE(ga.ok()) << ga.status();
  ga->Release();
  auto gb = runtime_->Acquire(b);      // past the limit
  EXPECT_EQ(gb.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(gb.status().message(), HasSubstr("step limit"));
  EXPECT_EQ(StateOf(b), TensorState::kDropped);
}

TEST_F(RuntimeTest, TheClockCountsTheWorkOfCallsAndRecomputes) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 8 * kMiB});
  const std::int64_t start = runtime_->NowNs();
  TensorId a = Produce(4 * kMiB, {}, true, false, /*cost_ns=*/700);
  Produce(4 * kMiB, {}, false, false, /*cost_ns=*/300);
  EXPECT_EQ(runtime_->NowNs(), start + 1000);
  TensorId c = Produce(4 * kMiB, {}, true, false, /*cost_ns=*/50);  // a goes
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
  const std::int64_t before = runtime_->NowNs();
  EXPECT_GE(before, start + 1050);
  auto g = runtime_->Acquire(a);  // c goes, a is recomputed: 700 more
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(StateOf(c), TensorState::kDropped);
  EXPECT_EQ(runtime_->NowNs(), before + 700);
}

TEST(RuntimeThreadsTest, TwoThreadsAcquiringOneDroppedTensorRunItsClosureOnce) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB, .backed = true})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {.budget = 16 * kMiB})).value();
  auto runtime =
      std::move(Runtime::Create(alloc.get(), {.policy = "lru", .enable_offload = false})).value();
  std::atomic<int> runs{0};
  SimDevice* dev = device.get();
  TensorOptions options;
  options.allow_drop = true;
  options.recompute = [&runs, dev](const RecomputeArgs& args) {
    ++runs;
    // Long enough for the other thread to arrive meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    void* out = args.output;
    const std::size_t bytes = args.bytes;
    return dev->LaunchHostFunc(args.stream, [out, bytes] { std::memset(out, 7, bytes); });
  };
  auto t = runtime->Create(8 * kMiB, std::move(options));
  ASSERT_TRUE(t.ok());
  std::memset(t->ptr(), 7, 8 * kMiB);
  const TensorId id = t->id();
  t->Release();
  auto big = runtime->Create(12 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok());
  big->Release();
  ASSERT_TRUE(runtime->Free(big->id()).ok());
  ASSERT_EQ(*runtime->State(id), TensorState::kDropped);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<Guard> g = runtime->Acquire(id);
      if (!g.ok()) return;
      if (device->SynchronizeStream(kDefaultStream).ok() &&
          static_cast<const unsigned char*>(g->ptr())[8 * kMiB - 1] == 7) {
        ++ok;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok.load(), 2);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(runtime->stats().recomputes, 1u);
}

TEST(RuntimeThreadsTest, ThreadsShareOneRuntimeSafely) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB, .backed = true})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {.budget = 16 * kMiB})).value();
  auto runtime = std::move(Runtime::Create(alloc.get(), {.policy = "dtr"})).value();
  std::atomic<int> mismatches{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const Stream stream = *device->CreateStream();
      std::mt19937_64 rng(77 + t);
      std::vector<std::pair<TensorId, unsigned char>> mine;
      for (int step = 0; step < 400; ++step) {
        if (mine.size() < 8 || rng() % 3 == 0) {
          const auto value = static_cast<unsigned char>(rng());
          TensorOptions options;
          options.allow_drop = true;
          options.allow_offload = rng() % 2 == 0;
          options.compute_ns = 1000;
          const std::size_t bytes = 64 * kKiB * (1 + rng() % 8);
          options.recompute = [device = device.get(), bytes, value](const RecomputeArgs& a) {
            return device->LaunchHostFunc(a.stream,
                                          [out = a.output, bytes, value] {
                                            std::memset(out, value, bytes);
                                          },
                                          1000);
          };
          absl::StatusOr<Guard> g = runtime->Create(bytes, std::move(options), stream);
          if (!g.ok()) {
            ++errors;
            continue;
          }
          std::memset(g->ptr(), value, bytes);
          mine.emplace_back(g->id(), value);
        } else if (rng() % 4 != 0) {
          const auto& [id, value] = mine[rng() % mine.size()];
          absl::StatusOr<Guard> g = runtime->Acquire(id, stream);
          if (!g.ok()) {
            ++errors;
            continue;
          }
          (void)device->SynchronizeStream(stream);
          if (static_cast<const unsigned char*>(g->ptr())[0] != value) ++mismatches;
        } else {
          const std::size_t i = rng() % mine.size();
          if (!runtime->Free(mine[i].first).ok()) ++errors;
          mine.erase(mine.begin() + static_cast<long>(i));
        }
      }
      for (const auto& [id, value] : mine) (void)runtime->Free(id);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(runtime->stats().drops + runtime->stats().offloads, 0u);
  EXPECT_EQ(runtime->stats().resident_bytes, 0u);
}

}  // namespace
}  // namespace remat
