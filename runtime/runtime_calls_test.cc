// Calls with several outputs, closures that run without the lock (and call
// back into the runtime), and threads sharing one runtime.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

// --- Calls with several outputs, and closures without the lock ----------------

// A call of three 4 MiB outputs whose closure writes each output's index
// into its bytes (on the device's stream), counting its runs.
struct ThreeOutputs {
  absl::InlinedVector<Guard, 4> guards;
  std::shared_ptr<std::atomic<int>> runs = std::make_shared<std::atomic<int>>(0);
};

// The options of such a call over `input`: a closure that writes output i's
// bytes as 0x40 + i and counts its runs in `call`.
TensorOptions FillingCallOptions(const ThreeOutputs& call, SimDevice* device, TensorId input) {
  TensorOptions options;
  options.inputs = {input};
  options.compute_ns = 5000;
  options.allow_drop = true;
  options.recompute = [device, runs = call.runs](const RecomputeArgs& args) {
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
  return options;
}

ThreeOutputs MakeThreeOutputCall(Runtime& runtime, SimDevice* device, TensorId input) {
  ThreeOutputs call;
  TensorOptions options = FillingCallOptions(call, device, input);
  const std::vector<OutputSpec> specs(3, OutputSpec{4 * kMiB});
  auto made = runtime.CreateCall(specs, std::move(options));
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return call;
  for (std::size_t i = 0; i < 3; ++i) std::memset((*made)[i].ptr(), 0x40 + static_cast<int>(i), 4 * kMiB);
  call.guards = std::move(*made);
  return call;
}

TEST_F(RuntimeTest, AReplayBringsBackItsDroppedInputsBeforePinningTheResidentOnes) {
  // c = h(r, d) reads r (resident) before d (dropped, and its replay needs e
  // back first, 6 MiB). Pinned first, r would sit beside e and d while d is
  // rebuilt: 1 + 4 + 6 + 4 = 15 MiB, over the 14 MiB budget with nothing
  // left to evict. Brought back first, d is rebuilt with r unpinned (here
  // the policy drops r to make room), then r is brought back and pinned,
  // and c is made beside x, r and d: 13 MiB.
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 14 * kMiB});
  const TensorId x = Produce(1 * kMiB, {}, /*drop=*/false, /*offload=*/false);
  const TensorId e = Produce(6 * kMiB, {x}, true, false);
  const TensorId d = Produce(4 * kMiB, {e}, true, false);
  const TensorId r = Produce(4 * kMiB, {x}, true, false);
  const TensorId c = Produce(4 * kMiB, {r, d}, true, false);
  for (TensorId id : {c, d, e}) {
    if (StateOf(id) == TensorState::kResident) {
      ASSERT_TRUE(*runtime_->Evict(id, policies::EvictAction::kDrop));
    }
  }
  if (StateOf(r) != TensorState::kResident) Check(r);
  ASSERT_EQ(StateOf(r), TensorState::kResident);
  Check(c);
  EXPECT_EQ(StateOf(r), TensorState::kResident);
  EXPECT_LE(runtime_->stats().peak_resident_bytes, 14 * kMiB);
  CheckInvariants();
}

// Lets go of `call`'s guards and drops all three outputs by filling the
// 64 MiB budget with a 60 MiB tensor, then frees that tensor. Returns the
// outputs' ids, in order.
std::vector<TensorId> DropAllThree(Runtime& runtime, ThreeOutputs& call) {
  std::vector<TensorId> ids;
  for (Guard& g : call.guards) ids.push_back(g.id());
  call.guards.clear();
  auto big = runtime.Create(60 * kMiB, TensorOptions{});
  EXPECT_TRUE(big.ok()) << big.status();
  if (!big.ok()) return ids;
  for (TensorId id : ids) EXPECT_EQ(*runtime.State(id), TensorState::kDropped);
  big->Release();
  EXPECT_TRUE(runtime.Free(big->id()).ok());
  return ids;
}

TEST_F(RuntimeTest, ACallOfThreeOutputsIsRecomputedOnceAndChargedOnce) {
  Make(64 * kMiB, {.policy = "lru", .enable_offload = false});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  ThreeOutputs call = MakeThreeOutputCall(*runtime_, device_.get(), x);
  const std::vector<TensorId> ids = DropAllThree(*runtime_, call);
  ASSERT_FALSE(HasFailure());
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
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
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
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

// One output of a dropped call refilled from its owner's copy: the call's
// other outputs stay dropped, and the call's next run regenerates only them,
// leaving the refilled one's bytes as the owner wrote them.
TEST_F(RuntimeTest, ARefilledOutputIsLeftAloneByItsCallsNextRun) {
  Make(64 * kMiB, {.policy = "lru", .enable_offload = false});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  ThreeOutputs call = MakeThreeOutputCall(*runtime_, device_.get(), x);
  const std::vector<TensorId> ids = DropAllThree(*runtime_, call);
  ASSERT_FALSE(HasFailure());
  auto refilled = runtime_->Refill(ids[1]);
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
  std::memset(refilled->ptr(), 0x77, 4 * kMiB);  // the owner's copy (unlike the call's 0x41)
  EXPECT_EQ(StateOf(ids[0]), TensorState::kDropped);
  EXPECT_EQ(StateOf(ids[2]), TensorState::kDropped);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  auto g = runtime_->Acquire(ids[2]);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(call.runs->load(), 1);
  EXPECT_EQ(StateOf(ids[0]), TensorState::kResident);  // regenerated in the same run
  ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
  EXPECT_EQ(static_cast<const unsigned char*>(refilled->ptr())[0], 0x77);
  EXPECT_EQ(static_cast<const unsigned char*>(g->ptr())[0], 0x42);
  EXPECT_EQ(runtime_->stats().refills, 1u);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
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

// A call made with one output, given a second later (as a framework learns
// of a call's outputs one by one).
ThreeOutputs MakeCallAndAddAnOutput(Runtime& runtime, SimDevice* device, TensorId input) {
  ThreeOutputs call;
  TensorOptions options = FillingCallOptions(call, device, input);
  const std::vector<OutputSpec> one = {OutputSpec{4 * kMiB}};
  auto made = runtime.CreateCall(one, std::move(options));
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return call;
  std::memset((*made)[0].ptr(), 0x40, 4 * kMiB);
  call.guards = std::move(*made);
  auto added = runtime.AddCallOutput(call.guards[0].id(), OutputSpec{2 * kMiB});
  EXPECT_TRUE(added.ok()) << added.status();
  if (!added.ok()) return call;
  std::memset(added->ptr(), 0x41, 2 * kMiB);
  call.guards.push_back(std::move(*added));
  return call;
}

TEST_F(RuntimeTest, AnOutputAddedLaterComesBackInTheCallsOneRun) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 32 * kMiB});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  ThreeOutputs call = MakeCallAndAddAnOutput(*runtime_, device_.get(), x);
  ASSERT_EQ(call.guards.size(), 2u);
  const TensorId first = call.guards[0].id(), added = call.guards[1].id();
  call.guards.clear();
  auto big = runtime_->Create(30 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(StateOf(first), TensorState::kDropped);
  EXPECT_EQ(StateOf(added), TensorState::kDropped);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  auto g = runtime_->Acquire(added);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(StateOf(first), TensorState::kResident);  // the same run
  auto g0 = runtime_->Acquire(first);
  ASSERT_TRUE(g0.ok()) << g0.status();
  ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
  EXPECT_EQ(static_cast<const unsigned char*>(g0->ptr())[4 * kMiB - 1], 0x40);
  EXPECT_EQ(static_cast<const unsigned char*>(g->ptr())[2 * kMiB - 1], 0x41);
  EXPECT_EQ(call.runs->load(), 1);
  EXPECT_EQ(runtime_->stats().recomputes, 1u);
  EXPECT_EQ(runtime_->stats().recompute_ns, 5000);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(RuntimeTest, AnOutputAddedToADroppedCallLeavesItsChargeWithTheCall) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 32 * kMiB});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  TensorOptions options;
  options.inputs = {x};
  options.compute_ns = 7000;
  options.allow_drop = true;
  auto runs = std::make_shared<int>(0);
  std::vector<std::vector<bool>> asked;
  options.recompute = [runs, &asked](const RecomputeArgs& args) {
    ++*runs;
    asked.emplace_back(args.regenerate.begin(), args.regenerate.end());
    return absl::OkStatus();
  };
  const std::vector<OutputSpec> one = {OutputSpec{8 * kMiB}};
  auto made = runtime_->CreateCall(one, std::move(options));
  ASSERT_TRUE(made.ok()) << made.status();
  const TensorId first = (*made)[0].id();
  made->clear();
  auto big = runtime_->Create(24 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(StateOf(first), TensorState::kDropped);
  // Added while the call's first output is dropped: it is resident, and the
  // dropped one still carries the call's cost.
  auto added = runtime_->AddCallOutput(first, OutputSpec{2 * kMiB});
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  auto g = runtime_->Acquire(first);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(*runs, 1);
  EXPECT_EQ(asked[0], (std::vector<bool>{true, false}));  // the resident one is left alone
  EXPECT_EQ(runtime_->stats().recompute_ns, 7000);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(RuntimeTest, AddingAnOutputNeedsALiveCallMadeByCreateCall) {
  Make(0, {.policy = "lru", .live_budget = 32 * kMiB});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  const std::uint64_t made = runtime_->stats().tensors_created;
  auto by_create = runtime_->AddCallOutput(x, OutputSpec{1 * kMiB});
  EXPECT_EQ(by_create.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(by_create.status().message(), HasSubstr("CreateCall"));
  EXPECT_EQ(runtime_->AddCallOutput(999999, OutputSpec{1 * kMiB}).status().code(),
            absl::StatusCode::kNotFound);
  ThreeOutputs call = MakeCallAndAddAnOutput(*runtime_, device_.get(), x);
  const TensorId first = call.guards[0].id();
  call.guards.clear();
  ASSERT_TRUE(runtime_->Free(first).ok());
  EXPECT_EQ(runtime_->AddCallOutput(first, OutputSpec{1 * kMiB}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Over the budget: refused, and nothing made.
  const std::uint64_t before = runtime_->stats().tensors_created;
  EXPECT_EQ(before, made + 2);
  ThreeOutputs again = MakeCallAndAddAnOutput(*runtime_, device_.get(), x);
  auto huge = runtime_->AddCallOutput(again.guards[0].id(), OutputSpec{64 * kMiB});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(runtime_->stats().tensors_created, before + 2);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(RuntimeTest, AClosureCannotAddAnOutputToTheCallItIsRegenerating) {
  Make(0, {.policy = "lru", .enable_offload = false, .live_budget = 16 * kMiB});
  TensorId x = Produce(1 * kMiB, {}, false, false);
  Runtime* rt = runtime_.get();
  TensorId self = 0;
  absl::Status inside;
  TensorOptions options;
  options.inputs = {x};
  options.allow_drop = true;
  options.recompute = [rt, &self, &inside](const RecomputeArgs&) {
    inside = rt->AddCallOutput(self, OutputSpec{1 * kMiB}).status();
    return absl::OkStatus();
  };
  const std::vector<OutputSpec> one = {OutputSpec{4 * kMiB}};
  auto made = runtime_->CreateCall(one, std::move(options));
  ASSERT_TRUE(made.ok()) << made.status();
  self = (*made)[0].id();
  made->clear();
  auto big = runtime_->Create(12 * kMiB, TensorOptions{});
  ASSERT_TRUE(big.ok()) << big.status();
  big->Release();
  ASSERT_TRUE(runtime_->Free(big->id()).ok());
  ASSERT_EQ(StateOf(self), TensorState::kDropped);
  ASSERT_TRUE(runtime_->Acquire(self).ok());
  EXPECT_EQ(inside.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inside.message(), HasSubstr("being regenerated"));
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
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
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
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
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
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
  const absl::Status invariants = runtime->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
}

// Several host threads, each with its own stream and tensors, creating,
// acquiring and freeing under one tight budget, with and without copies made
// ahead; also run under TSan.
TEST(RuntimeThreadsTest, ThreadsShareOneRuntimeSafely) {
  for (bool copy_ahead : {false, true}) {
    SCOPED_TRACE(copy_ahead ? "copy_ahead" : "copies at eviction");
    auto device = std::move(SimDevice::Create({.capacity = kGiB, .backed = true})).value();
    auto alloc = std::move(CachingAllocator::Create(device.get(), {.budget = 16 * kMiB})).value();
    auto runtime =
        std::move(Runtime::Create(alloc.get(), {.policy = "dtr", .copy_ahead = copy_ahead}))
            .value();
    std::atomic<int> mismatches{0};
    std::atomic<int> errors{0};
    std::atomic<int> broken{0};  // invariants checked while the other threads work
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        const Stream stream = *device->CreateStream();
        std::mt19937_64 rng(77 + t);
        std::vector<std::pair<TensorId, unsigned char>> mine;
        for (int step = 0; step < 400; ++step) {
          if (step % 20 == 0 && !runtime->CheckInvariants().ok()) ++broken;
          if (mine.size() < 8 || rng() % 3 == 0) {
            const auto value = static_cast<unsigned char>(rng());
            TensorOptions options;
            options.allow_drop = true;
            options.allow_offload = rng() % 2 == 0;
            options.read_only = copy_ahead;  // written once, below, before the guard goes
            // Dear to recompute with copies ahead: dtr offloads some.
            options.compute_ns = 200'000;
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
            // In stream order, as a kernel writes: the block may still be
            // read by work queued for its last owner (a copy out).
            if (!device
                     ->LaunchHostFunc(stream,
                                      [out = g->ptr(), bytes, value] {
                                        std::memset(out, value, bytes);
                                      },
                                      1000)
                     .ok()) {
              ++errors;
            }
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
    EXPECT_EQ(broken.load(), 0);
    const absl::Status invariants = runtime->CheckInvariants();
    EXPECT_TRUE(invariants.ok()) << invariants;
    EXPECT_GT(runtime->stats().drops + runtime->stats().offloads, 0u);
    EXPECT_EQ(runtime->stats().resident_bytes, 0u);
    if (copy_ahead) {
      EXPECT_GT(runtime->stats().copies_ahead, 0u);
    }
  }
}

}  // namespace
}  // namespace remat
