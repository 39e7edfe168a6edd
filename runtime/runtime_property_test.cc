// Random programs under tiny budgets, checked byte for byte and against the
// runtime's invariants after every operation.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {
namespace {

// Random programs under tiny budgets, for each policy and eviction mode:
// every acquire sees exactly the bytes produced; at the end nothing is left.
struct Mode {
  const char* policy;
  bool drop;
  bool offload;
  bool keep_addresses = false;  // on an allocator with expandable segments
  bool one_thread = false;      // device, allocator and runtime take no locks
  bool copy_ahead = false;      // read_only tensors, RuntimeOptions::copy_ahead
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
  std::uint64_t kept = 0;
  std::uint64_t ahead_offloads = 0;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    expected_.clear();
    sizes_.clear();
    // Kept addresses need blocks with whole 2 MiB pages inside: larger tensors.
    const std::size_t scale = mode.keep_addresses ? 16 : 1;
    Make((2 + rng() % 6) * kMiB * scale,
         {.policy = mode.policy,
          .host_pool_bytes = kGiB,
          .keep_addresses = mode.keep_addresses,
          .thread_safe = !mode.one_thread,
          .copy_ahead = mode.copy_ahead},
         /*backed=*/true, /*expandable=*/mode.keep_addresses);
    read_only_ = mode.copy_ahead;
    check_in_closures_ = true;  // and after every operation below
    allow_oom_ = true;
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
        const std::size_t bytes = (rng() % 8 == 0) ? 0 : 256 * scale * (1 + rng() % 1024);
        // With copies ahead, dear enough to recompute that drop-or-offload
        // policies offload too (else they drop all, and nothing is copied).
        const TensorId id =
            Produce(bytes, inputs, mode.drop, mode.offload, mode.copy_ahead ? 100'000 : 1000);
        if (id == 0) continue;  // over budget with everything pinned: allowed
        live.push_back(id);
      } else if (op < 8) {
        // With everything else pinned, a budget this small may have no room
        // for it in one piece: a clear error, and nothing changed.
        ASSERT_NO_FATAL_FAILURE(Check(live[rng() % live.size()], /*allow_oom=*/true));
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
      ASSERT_NO_FATAL_FAILURE(Check(id, /*allow_oom=*/true));
      ASSERT_NO_FATAL_FAILURE(CheckInvariants());
    }
    evictions += runtime_->stats().drops + runtime_->stats().offloads;
    kept += runtime_->stats().kept_addresses;
    ahead_offloads += runtime_->stats().ahead_offloads;
    for (TensorId id : live) {
      ASSERT_TRUE(runtime_->Free(id).ok());
      ASSERT_NO_FATAL_FAILURE(CheckInvariants());
    }
    EXPECT_EQ(alloc_->GetStats().allocated_bytes.all().current, 0);
    EXPECT_EQ(runtime_->stats().resident_bytes, 0u);
  }
  EXPECT_GT(evictions, 0u) << "the budgets never forced an eviction: the test proves nothing";
  // Out of memory on acquire is allowed, and rare: the bytes are checked almost always.
  EXPECT_LE(oom_checks_ * 50, checks_) << oom_checks_ << " of " << checks_ << " checks were oom";
  if (mode.keep_addresses) {
    EXPECT_GT(kept, 0u) << "no offload kept its address";
  }
  if (mode.copy_ahead) {
    EXPECT_GT(ahead_offloads, 0u) << "no offload used a copy made ahead";
  }
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
                      Mode{"belady", true, true}, Mode{"lru", false, true, true},
                      Mode{"dtr", false, true, true}, Mode{"dtr-eq", true, true, false, true},
                      Mode{"hybrid", true, true, false, true},
                      Mode{"lru", false, true, false, false, true},
                      Mode{"dtr", true, true, false, false, true},
                      Mode{"dtr-eq", true, true, false, false, true},
                      Mode{"lru", false, true, true, false, true}),
    [](const testing::TestParamInfo<Mode>& info) {
      std::string name = std::string(info.param.policy) + (info.param.drop ? "_drop" : "") +
                         (info.param.offload ? "_offload" : "") +
                         (info.param.keep_addresses ? "_keep_addresses" : "") +
                         (info.param.one_thread ? "_one_thread" : "") +
                         (info.param.copy_ahead ? "_copy_ahead" : "");
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });


// Random programs of calls with one to three outputs, views, pins held across
// operations, two streams, prefetches, next-use hints, and closures that
// check the invariants and make temporaries (pressure during a
// regeneration), for the policies with the most bookkeeping, under both
// budgets. The device keeps no bytes: this test is about the bookkeeping,
// which is checked after every operation and inside every closure.
struct CallsMode {
  const char* policy;
  bool live;  // a live budget (DTR's accounting), else the allocator's
  bool copy_ahead = false;  // RuntimeOptions::copy_ahead, half the calls read_only
};

class RuntimeCallsPropertyTest : public ::testing::TestWithParam<CallsMode> {};

TEST_P(RuntimeCallsPropertyTest, RandomCallsKeepEveryInvariant) {
  const CallsMode mode = GetParam();
  const char* env = std::getenv("REMAT_PROPERTY_SEEDS");
  const int seeds = env != nullptr ? std::atoi(env) : 3;
  std::uint64_t drops = 0, group_recomputes = 0, copies_ahead = 0;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
    const std::size_t budget = (4 + rng() % 5) * kMiB;
    auto alloc =
        std::move(CachingAllocator::Create(device.get(), {.budget = mode.live ? 64 * kMiB : budget}))
            .value();
    RuntimeOptions options{.policy = mode.policy, .host_pool_bytes = 2 * kMiB};
    if (mode.live) options.live_budget = budget;
    options.copy_ahead = mode.copy_ahead;
    auto made = Runtime::Create(alloc.get(), std::move(options));
    ASSERT_TRUE(made.ok()) << made.status();
    std::unique_ptr<Runtime> runtime = std::move(made).value();
    Runtime* rt = runtime.get();
    SimDevice* dev = device.get();
    const Stream streams[2] = {kDefaultStream, *device->CreateStream()};
    auto check = [rt] {
      const absl::Status st = rt->CheckInvariants();
      ASSERT_TRUE(st.ok()) << st;
    };
    auto acceptable = [](const absl::Status& st) {
      return st.ok() || absl::IsResourceExhausted(st);  // everything left is pinned
    };
    std::vector<TensorId> live;
    std::vector<Guard> held;
    for (int step = 0; step < 300; ++step) {
      const Stream stream = streams[rng() % 2];
      const int op = static_cast<int>(rng() % 12);
      if (op < 4 || live.size() < 3) {
        TensorOptions call;
        for (int k = 0, n = live.empty() ? 0 : static_cast<int>(rng() % 4); k < n; ++k) {
          call.inputs.push_back(live[rng() % live.size()]);
        }
        call.allow_drop = rng() % 4 != 0;
        call.allow_offload = rng() % 2 == 0;
        call.read_only = mode.copy_ahead && rng() % 2 == 0;  // (other modes draw as before)
        call.compute_ns = static_cast<std::int64_t>(rng() % 5000);
        const bool temporary = rng() % 4 == 0;
        const std::size_t temp_bytes = 64 * kKiB * (1 + rng() % 16);
        call.recompute = [rt, dev, temporary, temp_bytes,
                          cost = call.compute_ns](const RecomputeArgs& args) -> absl::Status {
          if (absl::Status st = rt->CheckInvariants(); !st.ok()) return st;
          if (temporary) {
            absl::StatusOr<Guard> tmp = rt->Create(temp_bytes, TensorOptions{}, args.stream);
            if (tmp.ok()) {
              const TensorId id = tmp->id();
              tmp->Release();
              if (absl::Status st = rt->Free(id); !st.ok()) return st;
            }
          }
          return dev->LaunchHostFunc(args.stream, [] {}, cost);
        };
        std::vector<OutputSpec> outputs(1 + rng() % 3);
        for (OutputSpec& o : outputs) {
          o.bytes = rng() % 8 == 0 ? 0 : 256 * (1 + rng() % 2048);
          o.allow_drop = rng() % 5 != 0;
          o.allow_offload = rng() % 5 != 0;
        }
        auto guards = rt->CreateCall(outputs, std::move(call), stream);
        ASSERT_TRUE(acceptable(guards.status())) << guards.status();
        if (guards.ok()) {
          for (Guard& g : *guards) {
            live.push_back(g.id());
            if (rng() % 8 == 0 && held.size() < 3) held.push_back(std::move(g));
          }
        }
      } else if (op < 7) {
        auto g = rt->Acquire(live[rng() % live.size()], stream);
        ASSERT_TRUE(acceptable(g.status())) << g.status();
        if (g.ok() && rng() % 4 == 0 && held.size() < 3) held.push_back(std::move(*g));
      } else if (op < 8 && live.size() > 1) {
        const std::size_t i = rng() % live.size();
        ASSERT_TRUE(rt->Free(live[i]).ok());
        live.erase(live.begin() + static_cast<long>(i));
      } else if (op < 9 && rng() % 2 == 0) {
        auto view = rt->CreateView(live[rng() % live.size()]);
        ASSERT_TRUE(view.ok()) << view.status();
        live.push_back(*view);
      } else if (op < 9) {
        // A call learns of one more output (whatever state it is in).
        OutputSpec spec{.bytes = 256 * (1 + rng() % 2048), .allow_drop = rng() % 5 != 0};
        auto added = rt->AddCallOutput(live[rng() % live.size()], spec, stream);
        ASSERT_TRUE(acceptable(added.status())) << added.status();
        if (added.ok()) live.push_back(added->id());
      } else if (op < 10) {
        const absl::Status st = rt->Prefetch(live[rng() % live.size()], stream);
        ASSERT_TRUE(acceptable(st)) << st;
      } else if (op < 11) {
        const std::int64_t at = rng() % 3 == 0
                                    ? Runtime::kNeverUsedAgain
                                    : rt->NowNs() + static_cast<std::int64_t>(rng() % 100000);
        ASSERT_TRUE(rt->HintNextUse(live[rng() % live.size()], at).ok());
      } else if (!held.empty()) {
        held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      }
      ASSERT_NO_FATAL_FAILURE(check());
    }
    held.clear();
    ASSERT_NO_FATAL_FAILURE(check());
    drops += rt->stats().drops;
    group_recomputes += rt->stats().recomputes;
    copies_ahead += rt->stats().copies_ahead;
    for (TensorId id : live) {
      ASSERT_TRUE(rt->Free(id).ok());
      ASSERT_NO_FATAL_FAILURE(check());
    }
    EXPECT_EQ(rt->stats().resident_bytes, 0u);
    EXPECT_EQ(rt->stats().live_tensors, 0u);
    EXPECT_EQ(alloc->GetStats().allocated_bytes.all().current, 0);
  }
  EXPECT_GT(drops, 0u) << "the budgets never forced a drop: the test proves little";
  EXPECT_GT(group_recomputes, 0u) << "nothing was regenerated: the test proves little";
  if (mode.copy_ahead) {
    EXPECT_GT(copies_ahead, 0u) << "nothing was copied ahead";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RuntimeCallsPropertyTest,
    ::testing::Values(CallsMode{"dtr-eq", true}, CallsMode{"dtr-eq", false},
                      CallsMode{"dtr", true}, CallsMode{"dtr", false},
                      CallsMode{"lru:sample=sqrt", true}, CallsMode{"belady", false},
                      CallsMode{"hybrid", true}, CallsMode{"msps", false},
                      CallsMode{"dtr-eq", true, true}, CallsMode{"lru", false, true}),
    [](const testing::TestParamInfo<CallsMode>& info) {
      std::string name = std::string(info.param.policy) + (info.param.live ? "_live" : "_reserved") +
                         (info.param.copy_ahead ? "_copy_ahead" : "");
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace remat
