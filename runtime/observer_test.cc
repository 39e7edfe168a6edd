// The runtime's events (runtime/observer.h): each storage's story as the
// runtime lives it, and a shadow built from events alone that always agrees
// with Runtime::State.
#include "runtime/observer.h"

#include <map>
#include <ostream>
#include <memory>
#include <random>
#include <vector>

#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"

namespace remat {

void PrintTo(TensorEvent::Kind kind, std::ostream* os) { *os << TensorEventName(kind); }

namespace {

using Kind = TensorEvent::Kind;
using ::testing::ElementsAre;

class Recorder : public RuntimeObserver {
 public:
  void OnTensor(const TensorEvent& e) override { events.push_back(e); }
  void OnPressure(const PressureEvent& p) override { pressures.push_back(p); }

  std::vector<TensorEvent> Of(TensorId id) const {
    std::vector<TensorEvent> out;
    for (const TensorEvent& e : events) {
      if (e.tensor == id) out.push_back(e);
    }
    return out;
  }
  std::vector<Kind> KindsOf(TensorId id) const {
    std::vector<Kind> out;
    for (const TensorEvent& e : Of(id)) out.push_back(e.kind);
    return out;
  }

  std::vector<TensorEvent> events;
  std::vector<PressureEvent> pressures;
};

class ObserverTest : public ::testing::Test {
 protected:
  void Make(RuntimeOptions options) {
    options.observer = &recorder_;
    runtime_.reset();
    alloc_.reset();
    device_ = std::move(SimDevice::Create({.capacity = 4 * kGiB})).value();
    alloc_ = std::move(CachingAllocator::Create(device_.get(), {})).value();
    auto rt = Runtime::Create(alloc_.get(), std::move(options));
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(rt).value();
  }

  TensorOptions Options(std::vector<TensorId> inputs, bool drop, bool offload,
                        std::int64_t cost_ns = 1000) {
    TensorOptions o;
    o.inputs = std::move(inputs);
    o.allow_drop = drop;
    o.allow_offload = offload;
    o.compute_ns = cost_ns;
    SimDevice* device = device_.get();
    if (drop) {
      o.recompute = [device, cost_ns](const RecomputeArgs& args) {
        return device->Occupy(args.stream, cost_ns);
      };
    }
    return o;
  }

  TensorId Make1(std::vector<TensorId> inputs, bool drop, bool offload, std::int64_t cost = 1000) {
    auto g = runtime_->Create(kMiB, Options(std::move(inputs), drop, offload, cost));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? g->id() : 0;
  }

  Recorder recorder_;
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<Runtime> runtime_;
};

// An observer's event comes in the middle of a runtime operation: asking for
// more evictions from there is refused, and the operation finishes as asked.
TEST_F(ObserverTest, EvictBytesFromAnEventIsRefused) {
  class Asker : public RuntimeObserver {
   public:
    void OnTensor(const TensorEvent& e) override {
      if (e.kind == Kind::kDropped && runtime != nullptr) status = runtime->EvictBytes(kMiB).status();
    }
    Runtime* runtime = nullptr;
    absl::Status status;
  } asker;
  auto device = std::move(SimDevice::Create({.capacity = 4 * kGiB})).value();
  auto alloc = std::move(CachingAllocator::Create(device.get(), {})).value();
  auto rt = Runtime::Create(alloc.get(), {.policy = "lru", .enable_offload = false,
                                          .observer = &asker});
  ASSERT_TRUE(rt.ok()) << rt.status();
  asker.runtime = rt->get();
  SimDevice* d = device.get();
  std::vector<TensorId> ids;
  for (int i = 0; i < 3; ++i) {
    TensorOptions o;
    o.allow_drop = true;
    o.recompute = [d](const RecomputeArgs& args) { return d->Occupy(args.stream, 10); };
    auto g = (*rt)->Create(kMiB, std::move(o));
    ASSERT_TRUE(g.ok()) << g.status();
    ids.push_back(g->id());
  }
  absl::StatusOr<std::size_t> freed = (*rt)->EvictBytes(kMiB);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, kMiB);  // one, as asked: the event's nested request did nothing
  EXPECT_EQ(asker.status.code(), absl::StatusCode::kFailedPrecondition) << asker.status;
  EXPECT_EQ((*rt)->stats().drops, 1u);
  EXPECT_TRUE((*rt)->CheckInvariants().ok());
  asker.runtime = nullptr;
}

TEST_F(ObserverTest, ADroppedTensorIsToldCreatedDroppedRecomputedAndCollected) {
  Make({.policy = "lru", .enable_offload = false, .live_budget = 3 * kMiB});
  const TensorId a = Make1({}, false, false);
  const TensorId b = Make1({a}, true, false, 700);
  const TensorId c = Make1({b}, true, false);
  const TensorId d = Make1({c}, true, false);  // over the budget: lru drops b
  ASSERT_EQ(*runtime_->State(b), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Acquire(b).ok());
  // Freed last to first, so that no closure still reads what goes.
  ASSERT_TRUE(runtime_->Free(d).ok());
  ASSERT_TRUE(runtime_->Free(c).ok());
  ASSERT_TRUE(runtime_->Free(b).ok());

  const std::vector<TensorEvent> ev = recorder_.Of(b);
  ASSERT_THAT(recorder_.KindsOf(b),
              ElementsAre(Kind::kCreated, Kind::kDropped, Kind::kRecomputed, Kind::kCollected));
  EXPECT_EQ(ev[0].bytes, kMiB);
  EXPECT_TRUE(ev[1].pressure);
  EXPECT_EQ(ev[2].cost_ns, 700);
  EXPECT_EQ(ev[2].stream, kDefaultStream);
  EXPECT_EQ(ev[3].from, TensorState::kResident);
  EXPECT_THAT(recorder_.KindsOf(a), ElementsAre(Kind::kCreated));  // still held

  // One pressure event per time the runtime was asked, each saying what it did.
  const RuntimeStats stats = runtime_->stats();
  ASSERT_EQ(recorder_.pressures.size(), stats.pressure_events);
  std::size_t evicted = 0;
  for (const PressureEvent& p : recorder_.pressures) {
    EXPECT_TRUE(p.satisfied);
    EXPECT_EQ(p.bytes, kMiB);
    EXPECT_GE(p.freed_bytes, p.bytes);
    EXPECT_GE(p.candidates, p.evicted);
    evicted += p.evicted;
  }
  EXPECT_EQ(evicted, stats.drops + stats.offloads);
}

TEST_F(ObserverTest, TheOwnersEvictionsAreToldAsDirected) {
  Make({.policy = "lru"});
  const TensorId a = Make1({}, false, false);
  const TensorId b = Make1({a}, true, false);
  const TensorId c = Make1({a}, false, true);
  ASSERT_TRUE(*runtime_->Evict(b, policies::EvictAction::kDrop));
  ASSERT_TRUE(*runtime_->Evict(c, policies::EvictAction::kOffload));
  ASSERT_THAT(recorder_.KindsOf(b), ElementsAre(Kind::kCreated, Kind::kDropped));
  ASSERT_THAT(recorder_.KindsOf(c), ElementsAre(Kind::kCreated, Kind::kOffloaded));
  for (TensorId id : {b, c}) {
    EXPECT_TRUE(recorder_.Of(id)[1].pressure);  // an eviction, not a release
    EXPECT_TRUE(recorder_.Of(id)[1].directed);
  }
  EXPECT_TRUE(recorder_.pressures.empty());
  // A release afterwards is not directed.
  ASSERT_TRUE(runtime_->Acquire(b).ok());
  ASSERT_TRUE(runtime_->Free(b).ok());
  for (const TensorEvent& e : recorder_.events) {
    if (e.kind != Kind::kDropped && e.kind != Kind::kOffloaded) {
      EXPECT_FALSE(e.directed);
    }
  }
}

TEST_F(ObserverTest, AnOffloadedTensorIsToldWhereEachCopyWent) {
  Make({.policy = "lru", .enable_drop = false, .live_budget = 2 * kMiB});
  const TensorId a = Make1({}, false, true);
  const TensorId b = Make1({}, false, true);
  const TensorId c = Make1({}, false, true);  // offloads a
  ASSERT_EQ(*runtime_->State(a), TensorState::kOffloading);
  ASSERT_TRUE(runtime_->Acquire(a).ok());   // copied back on the default stream (offloads b)
  ASSERT_TRUE(runtime_->Prefetch(b).ok());  // offloads c, copies b back on the prefetch stream
  ASSERT_TRUE(runtime_->Free(c).ok());      // on the host: its host bytes go

  const std::vector<TensorEvent> ea = recorder_.Of(a);
  ASSERT_THAT(recorder_.KindsOf(a), ElementsAre(Kind::kCreated, Kind::kOffloaded, Kind::kRestored));
  EXPECT_TRUE(ea[1].pressure);
  EXPECT_EQ(ea[1].stream, runtime_->copy_stream());
  EXPECT_FALSE(ea[2].prefetch);
  EXPECT_EQ(ea[2].stream, kDefaultStream);
  const std::vector<TensorEvent> eb = recorder_.Of(b);
  ASSERT_THAT(recorder_.KindsOf(b), ElementsAre(Kind::kCreated, Kind::kOffloaded, Kind::kRestored));
  EXPECT_TRUE(eb[2].prefetch);
  EXPECT_EQ(eb[2].stream, runtime_->prefetch_stream());
  EXPECT_NE(runtime_->prefetch_stream(), runtime_->copy_stream());
  const std::vector<TensorEvent> ec = recorder_.Of(c);
  ASSERT_THAT(recorder_.KindsOf(c),
              ElementsAre(Kind::kCreated, Kind::kOffloaded, Kind::kCollected));
  EXPECT_TRUE(ec[2].from == TensorState::kOnHost || ec[2].from == TensorState::kOffloading);
}

TEST_F(ObserverTest, AReleasedTensorAClosureStillReadsIsAReleasedDrop) {
  Make({.policy = "lru", .enable_offload = false});
  const TensorId a = Make1({}, false, false);
  const TensorId b = Make1({a}, true, false);
  const TensorId c = Make1({b}, true, false);
  ASSERT_TRUE(runtime_->Free(b).ok());  // c's closure reads it: bytes go, metadata stays
  const std::vector<TensorEvent> eb = recorder_.Of(b);
  ASSERT_THAT(recorder_.KindsOf(b), ElementsAre(Kind::kCreated, Kind::kDropped));
  EXPECT_FALSE(eb[1].pressure);
  EXPECT_TRUE(recorder_.pressures.empty());
  ASSERT_TRUE(runtime_->Free(c).ok());  // nothing can read b now
  EXPECT_THAT(recorder_.KindsOf(b), ElementsAre(Kind::kCreated, Kind::kDropped, Kind::kCollected));
  EXPECT_EQ(recorder_.Of(b).back().from, TensorState::kDropped);
}

TEST_F(ObserverTest, ACallsRunTellsEachRegeneratedOutputAndItsCostOnce) {
  Make({.policy = "lru", .enable_offload = false, .live_budget = 4 * kMiB});
  const TensorId a = Make1({}, false, false);
  SimDevice* device = device_.get();
  TensorOptions o;
  o.inputs = {a};
  o.allow_drop = true;
  o.compute_ns = 5000;
  o.recompute = [device](const RecomputeArgs& args) { return device->Occupy(args.stream, 5000); };
  const OutputSpec specs[] = {{kMiB}, {kMiB}, {kMiB}};
  auto outs = runtime_->CreateCall(specs, std::move(o));
  ASSERT_TRUE(outs.ok()) << outs.status();
  const TensorId x = (*outs)[0].id(), y = (*outs)[1].id(), z = (*outs)[2].id();
  outs->clear();
  // Two more tensors push out the call's outputs (lru: oldest first).
  const TensorId p = Make1({a}, true, false);
  const TensorId q = Make1({a}, true, false);
  std::vector<TensorId> lost;
  for (TensorId t : {x, y, z}) {
    if (*runtime_->State(t) == TensorState::kDropped) lost.push_back(t);
  }
  ASSERT_GE(lost.size(), 2u);
  recorder_.events.clear();
  ASSERT_TRUE(runtime_->Acquire(x).ok());
  std::int64_t cost = 0;
  std::vector<TensorId> told;
  for (const TensorEvent& e : recorder_.events) {
    if (e.kind != Kind::kRecomputed) continue;
    told.push_back(e.tensor);
    cost += e.cost_ns;
  }
  EXPECT_THAT(told, ::testing::UnorderedElementsAreArray(lost));
  EXPECT_EQ(cost, 5000);
  EXPECT_EQ(runtime_->stats().recomputes, 1u);
  (void)p;
  (void)q;
}

// A shadow of every storage's place, kept from events alone, agrees with
// Runtime::State after every operation of a random program.
TEST_F(ObserverTest, AShadowBuiltFromEventsAlwaysAgreesWithTheRuntime) {
  enum class Place { kDevice, kHost, kDropped, kGone };
  std::uint64_t drops = 0, offloads = 0, recomputes = 0, prefetches = 0;
  for (const char* policy : {"lru", "dtr", "hybrid"}) {
    SCOPED_TRACE(policy);
    recorder_.events.clear();
    recorder_.pressures.clear();
    Make({.policy = policy, .live_budget = 6 * kMiB});
    std::mt19937 rng(7);
    std::vector<TensorId> live;
    std::vector<TensorId> made;
    std::map<TensorId, Place> shadow;
    std::size_t seen = 0;
    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4 || live.size() < 2) {
        std::vector<TensorId> inputs;
        if (!live.empty()) inputs.push_back(live[rng() % live.size()]);
        if (live.size() > 1 && rng() % 2 == 0) inputs.push_back(live[rng() % live.size()]);
        const bool constant = made.size() < 2;
        auto g = runtime_->Create(
            kMiB, Options(inputs, !constant && rng() % 4 != 0, !constant && rng() % 2 == 0));
        if (g.ok()) {
          live.push_back(g->id());
          made.push_back(g->id());
        }
      } else if (op < 7) {
        (void)runtime_->Acquire(live[rng() % live.size()]);
      } else if (op < 8) {
        (void)runtime_->Prefetch(live[rng() % live.size()]);
      } else if (live.size() > 4) {
        const std::size_t k = 2 + rng() % (live.size() - 2);  // the two constants stay
        ASSERT_TRUE(runtime_->Free(live[k]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
      ASSERT_TRUE(runtime_->CheckInvariants().ok()) << runtime_->CheckInvariants();
      for (; seen < recorder_.events.size(); ++seen) {
        const TensorEvent& e = recorder_.events[seen];
        switch (e.kind) {
          case Kind::kCreated:
          case Kind::kRecomputed:
          case Kind::kRestored:
            shadow[e.tensor] = Place::kDevice;
            break;
          case Kind::kOffloaded:
            shadow[e.tensor] = Place::kHost;
            break;
          case Kind::kDropped:
            shadow[e.tensor] = Place::kDropped;
            break;
          case Kind::kCollected:
            shadow[e.tensor] = Place::kGone;
            break;
          case Kind::kCopiedAhead:  // still on the device
            break;
        }
      }
      for (TensorId t : made) {
        absl::StatusOr<TensorState> st = runtime_->StorageState(t);
        ASSERT_TRUE(st.ok());
        Place want = Place::kGone;
        switch (*st) {
          case TensorState::kResident:
          case TensorState::kPrefetching:
            want = Place::kDevice;
            break;
          case TensorState::kOffloading:
          case TensorState::kOnHost:
            want = Place::kHost;
            break;
          case TensorState::kDropped:
            want = Place::kDropped;
            break;
          case TensorState::kFreed:
            break;
        }
        ASSERT_EQ(static_cast<int>(shadow.at(t)), static_cast<int>(want))
            << "tensor " << t << " at step " << step;
      }
    }
    const RuntimeStats stats = runtime_->stats();
    EXPECT_GT(stats.pressure_events, 0u);
    drops += stats.drops + stats.released_drops;
    offloads += stats.offloads;
    recomputes += stats.recomputes;
    prefetches += stats.prefetches;
  }
  // The programs went through every kind of transition.
  EXPECT_GT(drops, 0u);
  EXPECT_GT(offloads, 0u);
  EXPECT_GT(recomputes, 0u);
  EXPECT_GT(prefetches, 0u);
}

}  // namespace
}  // namespace remat
