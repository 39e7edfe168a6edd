// The runtime's parts on their own: what each keeps, and its CheckInvariants
// naming a broken invariant where a part's own interface can break one (a
// misuse its owner, the Runtime, must not make).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/candidate_index.h"
#include "runtime/drop_classes.h"
#include "runtime/event_pool.h"
#include "runtime/host_link.h"
#include "runtime/object_pool.h"
#include "runtime/runtime_internal.h"
#include "runtime/tensor_table.h"

namespace remat::runtime_internal {
namespace {


MATCHER_P(IsBroken, what, "") {
  return arg.code() == absl::StatusCode::kInternal &&
         std::string(arg.message()).find(what) != std::string::npos;
}

TEST(TensorTableTest, IdsComeInOrderAndAPageGoesOnceItsTensorsAreCollected) {
  TensorTable table;
  Storage a, b;
  EXPECT_FALSE(table.Issued(0));
  EXPECT_EQ(table.NewId(&a), 1u);
  EXPECT_EQ(table.Find(1)->storage, &a);
  EXPECT_EQ(table.Find(2), nullptr);  // not handed out yet
  EXPECT_EQ(table.Find(0), nullptr);
  std::vector<TensorId> ids;
  for (std::size_t i = 1; i < TensorTable::kPage; ++i) ids.push_back(table.NewId(&a));
  const TensorId second_page = table.NewId(&b);
  EXPECT_EQ(table.pages_held(), 2u);
  ASSERT_TRUE(table.CheckInvariants().ok()) << table.CheckInvariants();
  ids.push_back(1);
  for (TensorId id : ids) table.Find(id)->freed = true;
  table.Forget(ids);  // the first page's tensors all go
  EXPECT_EQ(table.pages_held(), 1u);
  EXPECT_TRUE(table.Issued(1));
  EXPECT_EQ(table.Find(1), nullptr);  // "freed and collected"
  EXPECT_EQ(table.Find(second_page)->storage, &b);
  EXPECT_TRUE(table.CheckInvariants().ok()) << table.CheckInvariants();
}

TEST(TensorTableTest, AnEntryWithoutItsStorageYetNotFreedIsNamed) {
  TensorTable table;
  Storage a;
  const TensorId id = table.NewId(&a);
  table.Forget({id});  // collected while the owner still holds it
  EXPECT_THAT(table.CheckInvariants(), IsBroken("is not freed but has no storage"));
}

TEST(CandidateIndexTest, RemovalKeepsEverySlotPointingBack) {
  std::vector<std::unique_ptr<Storage>> storages;
  CandidateIndex index;
  for (int i = 0; i < 5; ++i) {
    storages.push_back(std::make_unique<Storage>());
    index.Add(storages.back().get());
  }
  index.Remove(storages[1].get());
  index.Remove(storages[4].get());
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(storages[1]->candidate_slot, Storage::kNoSlot);
  EXPECT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  std::set<const Storage*> held(index.all().begin(), index.all().end());
  EXPECT_EQ(held, (std::set<const Storage*>{storages[0].get(), storages[2].get(),
                                            storages[3].get()}));
}

TEST(CandidateIndexTest, ASampleIsDistinctAndRepeatsFromRunToRun) {
  auto sample_twice = [] {
    std::vector<std::unique_ptr<Storage>> storages;
    CandidateIndex index;
    for (int i = 0; i < 100; ++i) {
      storages.push_back(std::make_unique<Storage>());
      storages.back()->serial = static_cast<std::uint64_t>(i);
      index.Add(storages.back().get());
    }
    std::vector<std::uint64_t> serials;
    std::vector<Storage*> out;
    for (int round = 0; round < 2; ++round) {
      index.Sample(10, out);
      EXPECT_EQ(out.size(), 10u);
      std::set<Storage*> distinct(out.begin(), out.end());
      EXPECT_EQ(distinct.size(), 10u);
      for (Storage* s : out) serials.push_back(s->serial);
    }
    EXPECT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
    index.Sample(100, out);  // all of them, in index order
    EXPECT_TRUE(std::equal(out.begin(), out.end(), index.all().begin()));
    return serials;
  };
  EXPECT_EQ(sample_twice(), sample_twice());
}

TEST(CandidateIndexTest, ASlotChangedBehindItsBackIsNamed) {
  Storage a, b;
  CandidateIndex index;
  index.Add(&a);
  index.Add(&b);
  b.candidate_slot = 0;
  EXPECT_THAT(index.CheckInvariants(), IsBroken("says its slot is 0"));
}

TEST(DropClassesTest, JoinedClassesSumTheirCostsAndMembersTakeTheirsOut) {
  DropClasses classes;
  const std::uint32_t a = classes.Add(100), b = classes.Add(20), c = classes.Add(3);
  classes.Join(a, b);
  EXPECT_EQ(classes.Root(b), classes.Root(a));
  EXPECT_EQ(classes.Cost(classes.Root(a)), 120);
  EXPECT_EQ(classes.Cost(classes.Root(c)), 3);
  classes.Join(c, b);
  EXPECT_EQ(classes.Cost(classes.Root(a)), 123);
  classes.Leave(a, 100);
  EXPECT_EQ(classes.Cost(classes.Root(b)), 23);
  EXPECT_EQ(classes.members(), 2u);
  EXPECT_TRUE(classes.CheckInvariants().ok()) << classes.CheckInvariants();
  classes.Leave(b, 20);
  classes.Leave(c, 3);
  EXPECT_EQ(classes.nodes(), 0u);  // no members: nothing kept
  EXPECT_TRUE(classes.CheckInvariants().ok()) << classes.CheckInvariants();
}

TEST(HostLinkTest, CopiesQueueBehindThoseOfTheirDirection) {
  HostLink link(/*gbps=*/2.0, /*latency_ns=*/100);
  EXPECT_EQ(link.RoundTripNs(1000), 2 * (100 + 500));
  link.Queue(HostLink::kOut, 1000, /*now_ns=*/0);
  link.Queue(HostLink::kOut, 1000, /*now_ns=*/0);
  EXPECT_EQ(link.BacklogNs(HostLink::kOut, 0), 1200);
  EXPECT_EQ(link.BacklogNs(HostLink::kOut, 5000), 0);
  // Copies in run beside the copies out.
  EXPECT_EQ(link.BacklogNs(HostLink::kIn, 0), 0);
  link.Queue(HostLink::kIn, 1000, /*now_ns=*/300);
  EXPECT_EQ(link.BacklogNs(HostLink::kIn, 300), 600);
  EXPECT_EQ(link.BacklogNs(HostLink::kOut, 300), 900);
  EXPECT_TRUE(link.CheckInvariants().ok());
  // The clock saturates at its end (unbounded compute estimates): so does the queue.
  const std::int64_t end = std::numeric_limits<std::int64_t>::max();
  link.Queue(HostLink::kOut, 1000, end - 10);
  EXPECT_EQ(link.BacklogNs(HostLink::kOut, end - 10), 10);
  EXPECT_EQ(link.BacklogNs(HostLink::kOut, end), 0);
  EXPECT_TRUE(link.CheckInvariants().ok());
  EXPECT_THAT(HostLink(0.0, 0).CheckInvariants(), IsBroken("bandwidth"));
  EXPECT_THAT(HostLink(1.0, -1).CheckInvariants(), IsBroken("latency"));
}

TEST(EventPoolTest, EventsAreReusedAndOneGivenBackTwiceIsNamed) {
  auto device = std::move(SimDevice::Create()).value();
  EventPool pool(device.get());
  auto first = pool.Take();
  ASSERT_TRUE(first.ok());
  pool.Give(*first);
  auto again = pool.Take();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->handle, first->handle);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(pool.WaitOn(*stream, kDefaultStream).ok());
  EXPECT_EQ(pool.spare().size(), 1u);  // the wait's event is spare again
  EXPECT_TRUE(pool.CheckInvariants().ok());
  pool.Give(*again);
  pool.Give(*again);
  EXPECT_THAT(pool.CheckInvariants(), IsBroken("is spare twice"));
  pool.Take().IgnoreError();  // one back out, so the pool destroys it once
}

TEST(ObjectPoolTest, ObjectsGivenBackAreReusedLastFirst) {
  ObjectPool<CallGroup> pool;
  CallGroup* a = pool.Take();
  CallGroup* b = pool.Take();
  pool.Give(a);
  pool.Give(b);
  EXPECT_EQ(pool.Take(), b);
  EXPECT_EQ(pool.made(), 2u);
  EXPECT_TRUE(pool.CheckInvariants("call group").ok());
  pool.Give(a);
  EXPECT_THAT(pool.CheckInvariants("call group"), IsBroken("given back twice"));
  CallGroup stranger;
  ObjectPool<CallGroup> other;
  other.Give(&stranger);
  EXPECT_THAT(other.CheckInvariants("call group"), IsBroken("not the pool's"));
}

TEST(ObjectPoolTest, ObjectsMadeInChunksStayPutAndAreEachHandedOutOnce) {
  // Past several chunks: every object distinct, written fields kept while
  // later chunks are made, each one listed once.
  ObjectPool<CallGroup> pool;
  constexpr std::size_t kCount = 3 * ObjectPool<CallGroup>::kMaxChunk + 7;
  std::vector<CallGroup*> taken;
  for (std::size_t i = 0; i < kCount; ++i) {
    taken.push_back(pool.Take());
    taken.back()->uncollected = i;
  }
  EXPECT_EQ(pool.made(), kCount);
  std::set<CallGroup*> distinct(taken.begin(), taken.end());
  EXPECT_EQ(distinct.size(), kCount);
  for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(taken[i]->uncollected, i);
  EXPECT_TRUE(std::equal(taken.begin(), taken.end(), pool.all().begin(), pool.all().end()));
  EXPECT_TRUE(pool.CheckInvariants("call group").ok());
}

// Counts its constructions and destructions.
struct Counted {
  static inline int made = 0;
  static inline int gone = 0;
  Counted() { ++made; }
  ~Counted() { ++gone; }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  int value = 7;
};

TEST(ObjectPoolTest, OnlyObjectsHandedOutAreMadeAndThePoolDestroysEachOnce) {
  // A new chunk is memory, not objects: a run that needs one object more
  // than its chunks held touches one more, not a whole chunk's pages.
  Counted::made = Counted::gone = 0;
  {
    ObjectPool<Counted> pool;
    const std::size_t count = ObjectPool<Counted>::kFirstChunk + 1;  // one into the second chunk
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(pool.Take()->value, 7);
    EXPECT_EQ(Counted::made, static_cast<int>(count));
    Counted* last = pool.all().back();
    pool.Give(last);
    EXPECT_EQ(pool.Take(), last);  // reused, not made again
    EXPECT_EQ(Counted::made, static_cast<int>(count));
    EXPECT_EQ(Counted::gone, 0);
  }
  EXPECT_EQ(Counted::gone, Counted::made);
}

}  // namespace
}  // namespace remat::runtime_internal
