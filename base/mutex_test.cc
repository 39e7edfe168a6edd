#include "base/mutex.h"

#include <atomic>
#include <chrono>
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
  // Held by this thread, a real lock keeps the other thread waiting; one made
  // for a single thread takes no lock, so the other thread runs to its end
  // while this one still holds it.
  Mutex mu(/*thread_safe=*/false);
  std::atomic<bool> ran{false};
  mu.Lock();
  std::thread other([&] {
    MutexLock lock(&mu);
    ran = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!ran && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool ran_while_held = ran;
  mu.Unlock();  // a real lock lets the other thread go now, so the join ends either way
  other.join();
  EXPECT_TRUE(ran_while_held);
}

}  // namespace
}  // namespace remat
