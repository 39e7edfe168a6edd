#include "allocator/alloc_conf.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "device/forwarding_device.h"
#include "device/sim_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(AllocConfTest, ReadsEveryKey) {
  AllocatorOptions o;
  ASSERT_TRUE(ApplyAllocConf("expandable_segments:True, max_split_size_mb:64,"
                             "roundup_power2_divisions:4,garbage_collection_threshold:0.75,"
                             "release_lock_on_cudamalloc:True",
                             &o)
                  .ok());
  EXPECT_TRUE(o.expandable_segments);
  EXPECT_EQ(o.max_split_size, 64 * kMiB);
  for (std::uint8_t d : o.roundup_divisions) EXPECT_EQ(d, 4);
  EXPECT_DOUBLE_EQ(o.garbage_collection_threshold, 0.75);
  EXPECT_TRUE(o.release_lock_on_device_reserve);
  ASSERT_TRUE(ApplyAllocConf("expandable_segments:False", &o).ok());
  EXPECT_FALSE(o.expandable_segments);
  EXPECT_TRUE(ApplyAllocConf("", &o).ok());
}

TEST(AllocConfTest, DivisionListsSetEachInterval) {
  AllocatorOptions o;
  ASSERT_TRUE(ApplyAllocConf("roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:True",
                             &o)
                  .ok());
  EXPECT_TRUE(o.expandable_segments);
  EXPECT_EQ(o.roundup_divisions[20], 1);  // 1 MiB
  EXPECT_EQ(o.roundup_divisions[27], 1);  // 128 MiB
  EXPECT_EQ(o.roundup_divisions[28], 2);  // 256 MiB
  EXPECT_EQ(o.roundup_divisions[29], 8);  // 512 MiB
  EXPECT_EQ(o.roundup_divisions[40], 8);
}

TEST(AllocConfTest, SpacesAndPyTorchsOwnKeys) {
  AllocatorOptions o;
  ASSERT_TRUE(ApplyAllocConf(" roundup_power2_divisions : [256:1, >:4] ", &o).ok());
  EXPECT_EQ(o.roundup_divisions[30], 4);
  // PyTorch's host-allocator keys: PyTorch's business when the string is its own...
  const char* pytorch = "pinned_use_cuda_host_register:True,expandable_segments:True";
  AllocatorOptions p;
  ASSERT_TRUE(ApplyAllocConf(pytorch, &p, AllocConfSource::kPyTorch).ok());
  EXPECT_TRUE(p.expandable_segments);
  // ...and unknown to remat's own settings.
  AllocatorOptions r;
  EXPECT_FALSE(ApplyAllocConf(pytorch, &r).ok());
  EXPECT_FALSE(r.expandable_segments);
}

TEST(AllocConfTest, BadInputIsAClearErrorAndChangesNothing) {
  const AllocatorOptions before;
  struct Case {
    const char* conf;
    const char* says;
  } cases[] = {
      {"expandable_segments", "not KEY:VALUE"},
      {"expandable_segments:yes", "want True or False"},
      {"max_split_size_mb:1", "above 1"},
      {"max_split_size_mb:-5", "whole number"},
      {"roundup_power2_divisions:3", "power of two"},
      {"roundup_power2_divisions:[300:2]", "powers of two"},
      {"roundup_power2_divisions:[256:2,256:4]", "given twice"},
      {"roundup_power2_divisions:[256:2", "list"},
      {"garbage_collection_threshold:1.5", "between 0 and 1"},
      {"garbage_collection_threshold:0", "between 0 and 1"},
      {"backend:cudaMallocAsync", "unknown key 'backend'; known keys: expandable_segments"},
      {"expandable_segments:True,expandable_segments:False", "given twice"},
      {"expandable_segments:True,,", "not KEY:VALUE"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.conf);
    AllocatorOptions o;
    absl::Status s = ApplyAllocConf(c.conf, &o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
    EXPECT_EQ(o.expandable_segments, before.expandable_segments);
    EXPECT_EQ(o.max_split_size, before.max_split_size);
    EXPECT_EQ(o.roundup_divisions, before.roundup_divisions);
    EXPECT_EQ(o.garbage_collection_threshold, before.garbage_collection_threshold);
  }
}

std::unique_ptr<CachingAllocator> Make(SimDevice* device, const char* conf) {
  AllocatorOptions o;
  EXPECT_TRUE(ApplyAllocConf(conf, &o).ok());
  auto a = CachingAllocator::Create(device, o);
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(a).value();
}

TEST(AllocConfTest, DivisionsRoundRequestsUp) {
  auto device = std::move(SimDevice::Create()).value();
  auto plain = Make(device.get(), "");
  auto four = Make(device.get(), "roundup_power2_divisions:4");
  // 1100 MiB lies in [1024, 2048): steps of 256 MiB.
  EXPECT_EQ(plain->RoundRequest(1100 * kMiB), 1100 * kMiB);
  EXPECT_EQ(four->RoundRequest(1100 * kMiB), 1280 * kMiB);
  EXPECT_EQ(four->RoundRequest(1024 * kMiB), 1024 * kMiB);  // a power of two stays
  EXPECT_EQ(four->RoundRequest(1500), 1536u);                 // small: 512 B steps
  EXPECT_EQ(four->RoundRequest(5000), 5120u);                 // [4096, 8192): 1024 B steps
  auto p = four->Allocate(1100 * kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*four->BlockSize(*p), 1280 * kMiB);
  ASSERT_TRUE(four->Free(*p).ok());
}

TEST(AllocConfTest, GarbageCollectionReleasesTheCacheBeforeGrowing) {
  for (bool gc : {false, true}) {
    SCOPED_TRACE(gc);
    auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
    AllocatorOptions o;
    o.budget = 100 * kMiB;
    if (gc) {
      ASSERT_TRUE(ApplyAllocConf("garbage_collection_threshold:0.5", &o).ok());
    }
    auto a = std::move(CachingAllocator::Create(device.get(), o)).value();
    void* x = *a->Allocate(60 * kMiB);  // its own 60 MiB segment
    ASSERT_TRUE(a->Free(x).ok());       // cached
    void* y = *a->Allocate(30 * kMiB);  // takes part of x's cached segment
    ASSERT_TRUE(a->Free(y).ok());
    void* z = *a->Allocate(70 * kMiB);  // needs a new segment
    // Past half the budget, the 60 MiB cached segment goes before the new one
    // comes; without it the allocator finds out only at the budget.
    EXPECT_EQ(a->GetStats().num_alloc_retries, gc ? 0u : 1u);
    ASSERT_TRUE(a->Free(z).ok());
  }
}

// A simulated device whose ReserveSegment waits (up to a second) until
// another thread has been served from the cache meanwhile (with the
// allocator's lock held across the call it times out, as it should).
class WaitingDevice final : public ForwardingDevice {
 public:
  explicit WaitingDevice(std::unique_ptr<SimDevice> sim)
      : ForwardingDevice(sim.get()), sim_(std::move(sim)) {}
  absl::StatusOr<void*> ReserveSegment(std::size_t bytes) override {
    if (wait) {
      inside = true;
      std::unique_lock<std::mutex> lock(mu);
      saw_other = cv.wait_for(lock, std::chrono::seconds(1), [this] { return served; });
    }
    return ForwardingDevice::ReserveSegment(bytes);
  }
  void Served() {
    std::lock_guard<std::mutex> lock(mu);
    served = true;
    cv.notify_all();
  }

  std::atomic<bool> wait{false};
  std::atomic<bool> inside{false};  // a ReserveSegment call is waiting
  std::mutex mu;
  std::condition_variable cv;
  bool served = false;
  bool saw_other = false;

 private:
  std::unique_ptr<SimDevice> sim_;
};

TEST(AllocConfTest, ReleasingTheLockServesOthersWhileTheDeviceReserves) {
  for (bool release : {false, true}) {
    SCOPED_TRACE(release);
    WaitingDevice device(std::move(SimDevice::Create({.capacity = kGiB})).value());
    AllocatorOptions o;
    if (release) {
      ASSERT_TRUE(ApplyAllocConf("release_lock_on_cudamalloc:True", &o).ok());
    }
    auto a = std::move(CachingAllocator::Create(&device, o)).value();
    void* cached = *a->Allocate(4096);  // a small segment, then cached
    ASSERT_TRUE(a->Free(cached).ok());
    device.wait = true;
    std::thread grower([&] {
      auto big = a->Allocate(30 * kMiB);  // reserves a segment: the device waits
      ASSERT_TRUE(big.ok());
      ASSERT_TRUE(a->Free(*big).ok());
    });
    // Once the grower is inside the device call, take from the cache.
    while (!device.inside) std::this_thread::yield();
    auto small = a->Allocate(4096);
    ASSERT_TRUE(small.ok());
    device.Served();
    grower.join();
    // Served while the device reserved only when the lock was let go.
    EXPECT_EQ(device.saw_other, release);
    ASSERT_TRUE(a->Free(*small).ok());
  }
}

TEST(AllocConfTest, ReleasingTheLockKeepsTheBudget) {
  auto device = std::move(SimDevice::Create({.capacity = kGiB})).value();
  AllocatorOptions o;
  o.budget = 200 * kMiB;
  ASSERT_TRUE(ApplyAllocConf("release_lock_on_cudamalloc:True", &o).ok());
  auto a = std::move(CachingAllocator::Create(device.get(), o)).value();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto p = a->Allocate((10 + i % 40) * kMiB);
        if (p.ok()) {
          ASSERT_TRUE(a->Free(*p).ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(a->GetStats().reserved_bytes.all().peak, static_cast<std::int64_t>(200 * kMiB));
  EXPECT_LE(device->ReservedBytes(), 200 * kMiB);
}

}  // namespace
}  // namespace remat
