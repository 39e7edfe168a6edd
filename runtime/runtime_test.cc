// The runtime's basic behaviours: create, acquire, drop, offload, views, pins,
// recompute, collection, bounded bookkeeping, and what happens
// when the device fails.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

TEST_F(RuntimeTest, KeptAddressesSurviveOffloadAndRestore) {
  Make(16 * kMiB, {.policy = "lru", .keep_addresses = true}, /*backed=*/true, /*expandable=*/true);
  TensorId a = Produce(6 * kMiB + 4096, {}, false, true);  // offload only; whole pages inside
  TensorId small = Produce(256 * 1024, {}, false, true);  // no whole page of its own
  void* a_ptr = runtime_->Acquire(a)->ptr();
  void* small_ptr = runtime_->Acquire(small)->ptr();
  CheckInvariants();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    TensorId b = Produce(12 * kMiB, {}, false, false);  // a and small go to the host
    ASSERT_TRUE(StateOf(a) == TensorState::kOffloading || StateOf(a) == TensorState::kOnHost);
    CheckInvariants();
    ASSERT_TRUE(runtime_->Free(b).ok());
    // Back at the address it had, with its bytes.
    Check(a);
    EXPECT_EQ(runtime_->Acquire(a)->ptr(), a_ptr);
    Check(small);
    CheckInvariants();
  }
  EXPECT_EQ(runtime_->stats().kept_addresses, 3u);
  EXPECT_GE(runtime_->stats().moved_restores, 1u);  // the small one came back elsewhere
  (void)small_ptr;
  // An offloaded tensor freed by its owner gives its block back.
  TensorId b = Produce(12 * kMiB, {}, false, false);
  ASSERT_NE(StateOf(a), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(a).ok());
  CheckInvariants();
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Free(small).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, 0);
}

// An offload that keeps the address gives up only the whole pages inside the
// block (2 MiB each), and the pressure event counts just those: counting the
// whole block would end the event before the memory asked for is there.
TEST_F(RuntimeTest, AKeptAddressCountsOnlyThePagesItGaveUp) {
  struct Freed : RuntimeObserver {
    void OnTensor(const TensorEvent&) override {}
    void OnPressure(const PressureEvent& e) override { bytes += e.freed_bytes; }
    std::size_t bytes = 0;
  } freed;
  Make(16 * kMiB, {.policy = "lru", .observer = &freed, .keep_addresses = true},
       /*backed=*/true, /*expandable=*/true);
  TensorId a = Produce(6 * kMiB + 4096, {}, false, true);  // offload only; whole pages inside
  TensorId b = Produce(12 * kMiB, {}, false, false);      // a goes to the host
  ASSERT_NE(StateOf(a), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().kept_addresses, 1u);
  EXPECT_GT(freed.bytes, 0u);
  EXPECT_EQ(freed.bytes % (2 * kMiB), 0u) << freed.bytes;  // pages, not 6 MiB + 4 KiB
  ASSERT_TRUE(runtime_->Free(b).ok());
  Check(a);
  ASSERT_TRUE(runtime_->Free(a).ok());
}

TEST_F(RuntimeTest, KeepingAddressesNeedsExpandableSegments) {
  device_ = std::move(SimDevice::Create({.capacity = kGiB})).value();
  alloc_ = std::move(CachingAllocator::Create(device_.get(), {.budget = 64 * kMiB})).value();
  auto rt = Runtime::Create(alloc_.get(), {.keep_addresses = true});
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rt.status().message()), ::testing::HasSubstr("expandable"));
}

TEST_F(RuntimeTest, AThreadSafeRuntimeNeedsAThreadSafeAllocator) {
  device_ = std::move(SimDevice::Create({.capacity = kGiB})).value();
  alloc_ = std::move(CachingAllocator::Create(device_.get(),
                                              {.budget = 64 * kMiB, .thread_safe = false}))
               .value();
  auto rt = Runtime::Create(alloc_.get(), {});
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rt.status().message()), ::testing::HasSubstr("thread-safe allocator"));
  EXPECT_TRUE(Runtime::Create(alloc_.get(), {.thread_safe = false}).ok());
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
  // The freed id says so, though its storage lives on in the view.
  EXPECT_EQ(StateOf(base), TensorState::kFreed);
  EXPECT_EQ(StateOf(*view), TensorState::kResident);
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
                    HasSubstr("0 B still evictable"), HasSubstr("device budget 8.00 MiB"),
                    HasSubstr("policy dtr"), HasSubstr("pinned host pool 0 B of")));
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
  EXPECT_EQ(StateOf(x), TensorState::kFreed);  // to its owner
  EXPECT_EQ(*runtime_->StorageState(x), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().released_drops, 1u);
  EXPECT_EQ(runtime_->stats().drops, 0u);
  TensorId big = Produce(7 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(y), TensorState::kDropped);
  // y went under pressure, x for want of a reader (observer_test tells which is which).
  EXPECT_EQ(runtime_->stats().drops, 1u);
  EXPECT_EQ(runtime_->stats().released_drops, 1u);
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

// A released tensor a regeneration brought back stays while a dropped
// consumer the program holds would read it again (keep_regenerated), and
// goes once none would: then each replay of a consumer regenerates it anew.
TEST_F(RuntimeTest, ARegeneratedReleasedTensorStaysWhileAHeldConsumerNeedsIt) {
  for (const bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_regenerated" : "released at once");
    Make(64 * kMiB, {.policy = "lru", .keep_regenerated = keep});
    TensorId in = Produce(kMiB, {}, false, false);
    TensorId x = Produce(2 * kMiB, {in}, true, false);
    TensorId c1 = Produce(2 * kMiB, {x}, true, false);
    TensorId c2 = Produce(2 * kMiB, {x}, true, false);
    TensorId c3 = Produce(2 * kMiB, {x}, true, false);
    TensorId d = Produce(kMiB, {c3}, true, false);  // keeps c3's metadata once released
    ASSERT_TRUE(runtime_->Free(x).ok());
    ASSERT_TRUE(runtime_->Free(c3).ok());
    ASSERT_EQ(*runtime_->StorageState(x), TensorState::kDropped);  // released: dropped at once
    ASSERT_EQ(*runtime_->StorageState(c3), TensorState::kDropped);
    for (TensorId c : {c1, c2}) ASSERT_TRUE(*runtime_->Evict(c, policies::EvictAction::kDrop));
    const std::uint64_t before = runtime_->stats().recomputes;
    Check(c1);  // x, then c1
    EXPECT_EQ(runtime_->stats().recomputes - before, 2u);
    // c2 is dropped and held: x stays for it, or goes.
    EXPECT_EQ(*runtime_->StorageState(x), keep ? TensorState::kResident : TensorState::kDropped);
    Check(c2);  // c2 alone where x stayed
    EXPECT_EQ(runtime_->stats().recomputes - before, keep ? 3u : 4u);
    Check(d);  // c3 (x again: gone after c2's regeneration either way)
    CheckInvariants();
  }
  // Where the only dropped consumer left is one the program has released, x
  // goes when the regeneration ends, kept or not.
  Make(64 * kMiB, {.policy = "lru"});
  TensorId in = Produce(kMiB, {}, false, false);
  TensorId x = Produce(2 * kMiB, {in}, true, false);
  TensorId c1 = Produce(2 * kMiB, {x}, true, false);
  TensorId c3 = Produce(2 * kMiB, {x}, true, false);
  TensorId d = Produce(kMiB, {c3}, true, false);
  ASSERT_TRUE(runtime_->Free(x).ok());
  ASSERT_TRUE(runtime_->Free(c3).ok());
  ASSERT_TRUE(*runtime_->Evict(c1, policies::EvictAction::kDrop));
  Check(c1);
  EXPECT_EQ(*runtime_->StorageState(x), TensorState::kDropped);
  Check(d);
  CheckInvariants();
}

// What keeps a regenerated released tensor ends when its held consumer is
// released, though a closure still reads that consumer; and a tensor the
// program releases while it is pinned goes when unpinned, wanted or not (it
// was not brought back by a regeneration).
TEST_F(RuntimeTest, AKeptReleasedTensorGoesWhenNothingHeldWantsIt) {
  Make(64 * kMiB, {.policy = "lru"});
  TensorId in = Produce(kMiB, {}, false, false);
  TensorId x = Produce(2 * kMiB, {in}, true, false);
  TensorId c1 = Produce(2 * kMiB, {x}, true, false);
  TensorId c2 = Produce(2 * kMiB, {x}, true, false);
  TensorId e = Produce(kMiB, {c2}, true, false);  // reads c2: its metadata stays once released
  ASSERT_TRUE(runtime_->Free(x).ok());
  for (TensorId c : {c1, c2}) ASSERT_TRUE(*runtime_->Evict(c, policies::EvictAction::kDrop));
  Check(c1);
  ASSERT_EQ(*runtime_->StorageState(x), TensorState::kResident);  // kept for c2
  ASSERT_TRUE(runtime_->Free(c2).ok());
  EXPECT_EQ(*runtime_->StorageState(c2), TensorState::kDropped);
  EXPECT_EQ(*runtime_->StorageState(x), TensorState::kDropped);  // nothing held wants it now
  Check(e);
  CheckInvariants();

  Make(64 * kMiB, {.policy = "lru"});
  in = Produce(kMiB, {}, false, false);
  x = Produce(2 * kMiB, {in}, true, false);
  TensorId c = Produce(2 * kMiB, {x}, true, false);
  ASSERT_TRUE(*runtime_->Evict(c, policies::EvictAction::kDrop));
  {
    absl::StatusOr<Guard> pinned = runtime_->Acquire(x);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    ASSERT_TRUE(runtime_->Free(x).ok());
    EXPECT_EQ(*runtime_->StorageState(x), TensorState::kResident);  // pinned
  }
  EXPECT_EQ(*runtime_->StorageState(x), TensorState::kDropped);  // released, not regenerated
  Check(c);
  CheckInvariants();
}

// The owner's own eviction (Runtime::Evict): the tensor goes now, with no
// pressure event, and comes back byte for byte on its next use.
TEST_F(RuntimeTest, TheOwnerEvictsATensorAndItComesBackOnItsNextUse) {
  Make(64 * kMiB, {.policy = "lru"});
  TensorId x = Produce(2 * kMiB, {}, false, false);
  TensorId y = Produce(2 * kMiB, {x}, true, false);
  TensorId z = Produce(3 * kMiB, {x}, false, true);
  TensorId v = *runtime_->CreateView(y);
  const std::uint64_t resident = runtime_->stats().resident_bytes;
  absl::StatusOr<bool> dropped = runtime_->Evict(v, policies::EvictAction::kDrop);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_TRUE(*dropped);
  EXPECT_EQ(StateOf(y), TensorState::kDropped);  // a view's eviction is its storage's
  absl::StatusOr<bool> offloaded = runtime_->Evict(z, policies::EvictAction::kOffload);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  EXPECT_TRUE(*offloaded);
  EXPECT_EQ(runtime_->stats().resident_bytes, resident - 5 * kMiB);
  RuntimeStats st = runtime_->stats();
  EXPECT_EQ(st.pressure_events, 0u);
  EXPECT_EQ(st.drops, 1u);
  EXPECT_EQ(st.offloads, 1u);
  EXPECT_EQ(st.directed_evictions, 2u);
  // An empty tensor frees nothing: left be, as pressure leaves it.
  TensorId empty = Produce(0, {x}, true, false);
  absl::StatusOr<bool> nothing = runtime_->Evict(empty, policies::EvictAction::kDrop);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_FALSE(*nothing);
  EXPECT_EQ(StateOf(empty), TensorState::kResident);
  // Already gone: nothing changes, and it says so.
  absl::StatusOr<bool> again = runtime_->Evict(y, policies::EvictAction::kDrop);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  EXPECT_EQ(runtime_->stats().directed_evictions, 2u);
  CheckInvariants();
  Check(y);
  Check(z);
  st = runtime_->stats();
  EXPECT_EQ(st.recomputes, 1u);
  EXPECT_EQ(st.restored_bytes, 3 * kMiB);
  CheckInvariants();
}

// Pressure from outside the runtime (EvictBytes): a framework's allocator
// could not serve a request. The policy evicts until the bytes are freed, or
// says 0 when nothing can go; what it evicted comes back byte for byte.
TEST_F(RuntimeTest, OutsidePressureEvictsByThePolicyUntilTheBytesAreFreed) {
  Make(64 * kMiB, {.policy = "lru"});
  TensorId x = Produce(2 * kMiB, {}, false, false);  // an input: it stays
  TensorId a = Produce(2 * kMiB, {x}, true, false);
  TensorId b = Produce(3 * kMiB, {x}, false, true);
  TensorId c = Produce(2 * kMiB, {x}, true, false);
  EXPECT_EQ(runtime_->EvictBytes(0).status().code(), absl::StatusCode::kInvalidArgument);
  const std::uint64_t resident = runtime_->stats().resident_bytes;
  absl::StatusOr<std::size_t> freed = runtime_->EvictBytes(4 * kMiB);
  ASSERT_TRUE(freed.ok()) << freed.status();
  // lru: a, then b (the least recently used first), 5 MiB for the 4 asked.
  EXPECT_EQ(*freed, 5 * kMiB);
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
  EXPECT_NE(StateOf(b), TensorState::kResident);
  EXPECT_EQ(StateOf(c), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().resident_bytes, resident - 5 * kMiB);
  // More than there is: all that can go goes, and the figure says how much.
  freed = runtime_->EvictBytes(64 * kMiB);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 2 * kMiB);
  EXPECT_EQ(StateOf(x), TensorState::kResident);
  freed = runtime_->EvictBytes(kMiB);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 0u);
  const RuntimeStats st = runtime_->stats();
  EXPECT_GE(st.pressure_events, 2u);
  EXPECT_EQ(st.directed_evictions, 0u);
  CheckInvariants();
  Check(a);
  Check(b);
  Check(c);
  CheckInvariants();
}

// A recompute that runs out of the framework's memory asks from inside its
// closure: the runtime's lock is not held there, and what the closure reads
// is pinned, so only the others go.
TEST_F(RuntimeTest, OutsidePressureMayComeFromInsideAClosure) {
  Make(64 * kMiB, {.policy = "lru", .enable_offload = false});
  TensorId a = Produce(2 * kMiB, {}, true, false);
  TensorId other = Produce(2 * kMiB, {}, true, false);
  Runtime* rt = runtime_.get();
  std::size_t freed_inside = 0;
  TensorOptions options;
  options.inputs = {a};
  options.allow_drop = true;
  options.recompute = [rt, &freed_inside](const RecomputeArgs&) -> absl::Status {
    absl::StatusOr<std::size_t> freed = rt->EvictBytes(8 * kMiB);
    if (!freed.ok()) return freed.status();
    freed_inside = *freed;
    return absl::OkStatus();
  };
  auto b = runtime_->Create(4 * kMiB, std::move(options));
  ASSERT_TRUE(b.ok());
  const TensorId b_id = b->id();
  b->Release();
  ASSERT_TRUE(runtime_->Evict(b_id, policies::EvictAction::kDrop).ok());
  auto g = runtime_->Acquire(b_id);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(freed_inside, 2 * kMiB);  // `other` alone: a and b are in use
  EXPECT_EQ(StateOf(other), TensorState::kDropped);
  EXPECT_EQ(StateOf(a), TensorState::kResident);
  g->Release();
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(RuntimeTest, AnEvictionTheTensorDoesNotAllowIsRefusedAndChangesNothing) {
  Make(64 * kMiB, {.policy = "lru", .host_pool_bytes = kMiB});
  TensorId x = Produce(2 * kMiB, {}, false, false);      // an input: neither
  TensorId y = Produce(2 * kMiB, {x}, true, false);      // drop only
  TensorId z = Produce(2 * kMiB, {x}, false, true);      // offload only, over the host pool
  EXPECT_EQ(runtime_->Evict(x, policies::EvictAction::kDrop).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Evict(x, policies::EvictAction::kOffload).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Evict(y, policies::EvictAction::kOffload).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Evict(z, policies::EvictAction::kOffload).status().code(),
            absl::StatusCode::kResourceExhausted);
  {
    absl::StatusOr<Guard> pinned = runtime_->Acquire(y);
    ASSERT_TRUE(pinned.ok());
    absl::StatusOr<bool> refused = runtime_->Evict(y, policies::EvictAction::kDrop);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("pinned"), std::string::npos)
        << refused.status();
  }
  EXPECT_EQ(runtime_->Evict(12345, policies::EvictAction::kDrop).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(runtime_->Free(y).ok());
  EXPECT_EQ(runtime_->Evict(y, policies::EvictAction::kDrop).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (TensorId id : {x, z}) EXPECT_EQ(StateOf(id), TensorState::kResident);
  const RuntimeStats st = runtime_->stats();
  EXPECT_EQ(st.drops + st.offloads + st.directed_evictions, 0u);
  CheckInvariants();
}

TEST_F(RuntimeTest, PinnedHostPoolExhaustionFallsBackToDropping) {
  Make(8 * kMiB, {.policy = "lru", .host_pool_bytes = kMiB});
  TensorId a = Produce(4 * kMiB, {}, true, true, /*cost_ns=*/10'000'000);  // prefers offload
  Produce(6 * kMiB, {}, false, false);
  EXPECT_EQ(StateOf(a), TensorState::kDropped);
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

// Which budget an out-of-room error names, with a live budget and a device's.
class OutOfRoomMessageTest : public RuntimeTest {
 protected:
  // The message of a 6 MiB request that fails beside a pinned 4 MiB tensor.
  std::string OutOfRoomBesidePinned() {
    const TensorId a = Produce(4 * kMiB, {}, true, true);
    auto pin = runtime_->Acquire(a);
    EXPECT_TRUE(pin.ok());
    auto fail = runtime_->Create(6 * kMiB, TensorOptions{});
    EXPECT_EQ(fail.status().code(), absl::StatusCode::kResourceExhausted);
    return std::string(fail.status().message());
  }
};

TEST_F(OutOfRoomMessageTest, UnderALiveBudgetTheErrorNamesItAndNotTheDevices) {
  // Make(0): the device is only an address space; the live budget binds.
  Make(0, {.policy = "dtr", .enable_offload = false, .live_budget = 8 * kMiB});
  EXPECT_THAT(OutOfRoomBesidePinned(),
              AllOf(HasSubstr("live budget 8.00 MiB with 4.00 MiB resident"),
                    Not(HasSubstr("device budget")),
                    Not(HasSubstr("host pool"))));  // offload is off: no pool to speak of
}

TEST_F(OutOfRoomMessageTest, WhereTheDeviceBindsUnderALiveBudgetTheErrorNamesTheDevice) {
  Make(8 * kMiB, {.policy = "dtr", .enable_offload = false, .live_budget = 64 * kMiB});
  EXPECT_THAT(OutOfRoomBesidePinned(),
              AllOf(HasSubstr("device budget 8.00 MiB"), Not(HasSubstr("live budget"))));
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

// A dropped tensor whose replay cannot fit (its call's input must come back
// beside it) comes back from its owner's copy: Refill finds room for the
// tensor alone, runs nothing, and the owner's bytes are what is read.
TEST_F(RuntimeTest, ADroppedTensorWhoseReplayCannotFitIsRefilledFromItsOwnersCopy) {
  struct Refills : RuntimeObserver {
    void OnTensor(const TensorEvent& e) override {
      if (e.kind == TensorEvent::Kind::kRestored && e.refill) tensors.push_back(e.tensor);
    }
    void OnPressure(const PressureEvent&) override {}
    std::vector<TensorId> tensors;
  } told;
  // x (kept) -> e -> d under 11 MiB; then k (5 MiB, kept). d's replay needs
  // e back beside x and k: 1 + 5 + 6 = 12 MiB; d alone, 1 + 5 + 4 = 10.
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 11 * kMiB,
           .observer = &told});
  const TensorId x = Produce(1 * kMiB, {}, false, false);
  const TensorId e = Produce(6 * kMiB, {x}, true, false);
  const TensorId d = Produce(4 * kMiB, {e}, true, false);
  ASSERT_TRUE(*runtime_->Evict(d, policies::EvictAction::kDrop));
  ASSERT_TRUE(*runtime_->Evict(e, policies::EvictAction::kDrop));
  Produce(5 * kMiB, {}, false, false);  // k
  EXPECT_TRUE(absl::IsResourceExhausted(runtime_->Acquire(d).status()));
  EXPECT_EQ(StateOf(d), TensorState::kDropped);  // the failed replay changed nothing
  EXPECT_EQ(StateOf(e), TensorState::kDropped);
  CheckInvariants();

  const std::uint64_t recomputes = runtime_->stats().recomputes;
  {
    auto g = runtime_->Refill(d);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(StateOf(d), TensorState::kResident);
    EXPECT_EQ(StateOf(e), TensorState::kDropped);  // not brought back: nothing ran
    ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    std::memcpy(g->ptr(), expected_.at(d).data(), 4 * kMiB);  // the owner's copy
    // Refilled, it is an ordinary resident tensor: refilled again, refused.
    EXPECT_TRUE(absl::IsFailedPrecondition(runtime_->Refill(d).status()));
  }
  EXPECT_EQ(runtime_->stats().recomputes, recomputes);
  EXPECT_EQ(runtime_->stats().refills, 1u);
  EXPECT_THAT(told.tensors, ::testing::ElementsAre(d));
  Check(d);  // the owner's bytes, read as any acquire reads
  EXPECT_LE(runtime_->stats().peak_resident_bytes, 11 * kMiB);
  CheckInvariants();

  // Refilled only where dropped, and only where the tensor itself fits.
  EXPECT_TRUE(absl::IsFailedPrecondition(runtime_->Refill(x).status()));  // resident
  EXPECT_TRUE(absl::IsNotFound(runtime_->Refill(987654).status()));
  ASSERT_TRUE(*runtime_->Evict(d, policies::EvictAction::kDrop));
  Produce(4 * kMiB, {}, false, false);  // 10 MiB kept: no room for d's 4
  EXPECT_TRUE(absl::IsResourceExhausted(runtime_->Refill(d).status()));
  EXPECT_EQ(StateOf(d), TensorState::kDropped);
  EXPECT_EQ(runtime_->stats().refills, 1u);
  CheckInvariants();
}

}  // namespace
}  // namespace remat
