// Copies out made ahead of the pressure that offloads them
// (RuntimeOptions::copy_ahead): when they start, what an offload then does
// with them, and what lets them go.
#include <cstring>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {
namespace {

// Keeps each storage's events, in order.
class Recorder : public RuntimeObserver {
 public:
  void OnTensor(const TensorEvent& e) override { events[e.tensor].push_back(e); }
  std::map<TensorId, std::vector<TensorEvent>> events;
};

// a and b may only be offloaded, c and d stay. d's allocation is the first
// pressure event (lru offloads a); d's cost then moves the clock past a's
// copy, and the runtime copies b ahead: lru's next offload. Returns {a, b}.
struct TwoOffloadable {
  TensorId a, b;
};

class CopyAheadTest : public RuntimeTest {
 protected:
  TwoOffloadable MakeFirstPressure(bool read_only) {
    read_only_ = read_only;
    const TensorId a = Produce(2 * kMiB, {}, false, true);
    const TensorId b = Produce(2 * kMiB, {}, false, true);
    read_only_ = false;
    Produce(3 * kMiB, {}, false, false);
    EXPECT_EQ(runtime_->stats().copies_ahead, 0u);  // the budget has not bound yet
    Produce(2 * kMiB, {}, false, false, /*cost_ns=*/1'000'000);
    EXPECT_NE(StateOf(a), TensorState::kResident);
    return {a, b};
  }
};

TEST_F(CopyAheadTest, AnOffloadOfATensorCopiedAheadQueuesNoCopy) {
  Recorder recorder;
  Make(8 * kMiB, {.policy = "lru", .observer = &recorder, .copy_ahead = true});
  const TwoOffloadable t = MakeFirstPressure(/*read_only=*/true);
  RuntimeStats s = runtime_->stats();
  EXPECT_EQ(s.copies_ahead, 1u);
  EXPECT_EQ(s.copied_ahead_bytes, 2 * kMiB);
  EXPECT_EQ(StateOf(t.b), TensorState::kResident);  // copied, not evicted
  CheckInvariants();

  const TensorId e = Produce(2 * kMiB, {}, false, false);  // pressure again: b goes
  EXPECT_NE(StateOf(t.b), TensorState::kResident);
  s = runtime_->stats();
  EXPECT_EQ(s.offloads, 2u);
  EXPECT_EQ(s.ahead_offloads, 1u);
  EXPECT_EQ(s.ahead_copies_unused, 0u);
  CheckInvariants();
  // b's story: made, copied ahead, offloaded with no copy enqueued then.
  const std::vector<TensorEvent>& story = recorder.events[t.b];
  ASSERT_EQ(story.size(), 3u);
  EXPECT_EQ(story[0].kind, TensorEvent::Kind::kCreated);
  EXPECT_EQ(story[1].kind, TensorEvent::Kind::kCopiedAhead);
  EXPECT_EQ(story[2].kind, TensorEvent::Kind::kOffloaded);
  EXPECT_TRUE(story[2].ahead);
  EXPECT_FALSE(recorder.events[t.a].back().ahead);  // a's was copied at its eviction

  ASSERT_TRUE(runtime_->Free(e).ok());
  Check(t.b);  // the bytes copied ahead come back
  Check(t.a);
  CheckInvariants();
  runtime_.reset();  // before the recorder goes
}

// Copies ahead wait for the link: while a's copy out (84 us at 25 GB/s) is
// still on it by the runtime's clock, nothing is copied; once the work done
// has moved the clock past it, b is.
TEST_F(CopyAheadTest, NothingIsCopiedAheadWhileTheLinkIsBusy) {
  Make(8 * kMiB, {.policy = "lru", .copy_ahead = true});
  read_only_ = true;
  const TensorId a = Produce(2 * kMiB, {}, false, true);
  const TensorId b = Produce(2 * kMiB, {}, false, true);
  read_only_ = false;
  Produce(3 * kMiB, {}, false, false);
  Produce(2 * kMiB, {}, false, false, /*cost_ns=*/1000);  // pressure: a goes
  ASSERT_NE(StateOf(a), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().copies_ahead, 0u);
  Check(b);  // a use, and no work: the link is still busy
  EXPECT_EQ(runtime_->stats().copies_ahead, 0u);
  Produce(0, {}, false, false, /*cost_ns=*/1'000'000);  // a millisecond of work
  EXPECT_EQ(runtime_->stats().copies_ahead, 1u);
  CheckInvariants();
}

TEST_F(CopyAheadTest, WithoutTheOptionNothingIsCopiedAhead) {
  Make(8 * kMiB, {.policy = "lru"});
  const TwoOffloadable t = MakeFirstPressure(/*read_only=*/true);
  EXPECT_EQ(runtime_->stats().copies_ahead, 0u);
  Produce(2 * kMiB, {}, false, false);
  EXPECT_EQ(runtime_->stats().ahead_offloads, 0u);
  EXPECT_NE(StateOf(t.b), TensorState::kResident);
}

// The program may write a tensor that is not read_only through an acquire's
// pointer: a copy made before the write would come back stale. Such a tensor
// is copied only when pressure offloads it, and comes back as last written.
TEST_F(CopyAheadTest, OnlyReadOnlyTensorsAreCopiedAhead) {
  Make(8 * kMiB, {.policy = "lru", .copy_ahead = true});
  const TwoOffloadable t = MakeFirstPressure(/*read_only=*/false);
  EXPECT_EQ(runtime_->stats().copies_ahead, 0u);
  {
    auto g = runtime_->Acquire(t.b);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(device_->SynchronizeStream(kDefaultStream).ok());
    std::vector<unsigned char>& want = expected_.at(t.b);
    for (unsigned char& byte : want) byte = static_cast<unsigned char>(byte ^ 0x5a);
    std::memcpy(g->ptr(), want.data(), want.size());
  }
  const TensorId e = Produce(2 * kMiB, {}, false, false);  // b goes, copied now
  ASSERT_NE(StateOf(t.b), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(e).ok());
  Check(t.b);
  EXPECT_EQ(runtime_->stats().ahead_offloads, 0u);
}

TEST_F(CopyAheadTest, AReadOnlyTensorKeepsItsCopyWhenRead) {
  Make(8 * kMiB, {.policy = "lru", .copy_ahead = true});
  const TwoOffloadable t = MakeFirstPressure(/*read_only=*/true);
  ASSERT_EQ(runtime_->stats().copies_ahead, 1u);
  Check(t.b);  // a read
  EXPECT_EQ(runtime_->stats().ahead_copies_unused, 0u);
  CheckInvariants();
}

TEST_F(CopyAheadTest, FreeingATensorLetsItsCopyGo) {
  Make(8 * kMiB, {.policy = "lru", .copy_ahead = true});
  const TwoOffloadable t = MakeFirstPressure(/*read_only=*/true);
  ASSERT_EQ(runtime_->stats().copies_ahead, 1u);
  ASSERT_TRUE(runtime_->Free(t.b).ok());
  EXPECT_EQ(runtime_->stats().ahead_copies_unused, 1u);
  CheckInvariants();
}

// The host pool full of copies made ahead must not refuse an offload
// pressure asks for: the copies go first. b's copy fills what g's offload
// needs; g is offloaded, b keeps its place on the device.
TEST_F(CopyAheadTest, AnOffloadThatFindsThePoolFullLetsCopiesMadeAheadGo) {
  // A live budget: bytes, not places, so that each pressure event below
  // evicts exactly one tensor.
  Make(64 * kMiB,
       {.policy = "lru", .host_pool_bytes = 4 * kMiB, .live_budget = 8 * kMiB, .copy_ahead = true});
  read_only_ = true;
  const TensorId a = Produce(kMiB + kMiB / 4, {}, false, true);
  const TensorId b = Produce(kMiB + kMiB / 4, {}, false, true);
  read_only_ = false;
  const TensorId g = Produce(2 * kMiB + kMiB / 2, {}, false, true);
  Produce(2 * kMiB, {}, false, false);
  Produce(kMiB + kMiB / 4, {}, false, false, /*cost_ns=*/1'000'000);  // a goes; b is copied
  ASSERT_NE(StateOf(a), TensorState::kResident);
  ASSERT_EQ(runtime_->stats().copies_ahead, 1u);
  Check(b);  // a read: b is now used after g
  const TensorId e = Produce(2 * kMiB, {}, false, false);  // g goes: it needs b's copy's room
  EXPECT_NE(StateOf(g), TensorState::kResident);
  EXPECT_EQ(StateOf(b), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().ahead_copies_unused, 1u);
  CheckInvariants();
  ASSERT_TRUE(runtime_->Free(e).ok());
  Check(g);
  Check(a);
}

}  // namespace
}  // namespace remat
