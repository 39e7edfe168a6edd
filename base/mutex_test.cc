#include "base/mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace remat {
namespace {

TEST(MutexTest, ExcludesUnderContention) {
  Mutex mu;
  long counter = 0;  // a plain long: lost updates would show without exclusion
  constexpr int kThreads = 4;
  constexpr int kIncrements = 200000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(counter, static_cast<long>(kThreads) * kIncrements);
}

TEST(MutexTest, SleepersAreWokenWhenTheHolderTakesLong) {
  Mutex mu;
  int value = 0;
  mu.Lock();
  std::thread waiter([&] {
    MutexLock lock(&mu);  // blocks until the main thread unlocks
    value += 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  value = 41;
  mu.Unlock();
  waiter.join();
  EXPECT_EQ(value, 42);
}

TEST(MutexTest, AMutexForOneThreadTakesNoLock) {
  // Held by this thread, a real lock would keep the other thread waiting
  // forever (and this test would never end); one made for a single thread
  // takes no lock, so the other thread runs to its end.
  Mutex mu(/*thread_safe=*/false);
  bool ran = false;
  mu.Lock();
  std::thread other([&] {
    MutexLock lock(&mu);
    ran = true;
  });
  other.join();
  mu.Unlock();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace remat
