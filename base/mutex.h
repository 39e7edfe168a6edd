// remat::Mutex: the one lock type of the project, annotated for clang's
// thread-safety analysis (ABSL_GUARDED_BY and friends work with it).
//
// Why not absl::Mutex: Debian's Abseil is built without NDEBUG, so every
// absl::Mutex::Lock runs deadlock-cycle detection (GraphCycles::GetId and a
// pthread_getspecific per lock), about a fifth of an allocator alloc/free
// pair; and that Abseil has no TSan annotations, so ThreadSanitizer cannot see
// its hand-offs. We use no reader locks or conditions.
//
// Why not std::mutex: an uncontended pthread_mutex_lock/unlock is a call into
// libc of some fifty instructions, a tenth of the allocator's fast path.
// This is the classic three-state futex lock (0 free, 1 held, 2 held with
// waiters) on std::atomic wait/notify: uncontended, a lock is one inlined
// compare-exchange and an unlock one exchange; contended, waiters sleep in
// the kernel rather than spin.
//
// A Mutex made with thread_safe = false takes no lock at all: for an object
// that one thread alone uses (the simulator's device, allocator and runtime),
// where the two atomic operations of an uncontended lock and unlock are about
// a fifth of a replayed record. Its owner must never be shared between threads.
#ifndef REMAT_BASE_MUTEX_H_
#define REMAT_BASE_MUTEX_H_

#include <atomic>

#include "absl/base/thread_annotations.h"

namespace remat {

class ABSL_LOCKABLE Mutex {
 public:
  explicit Mutex(bool thread_safe = true) : thread_safe_(thread_safe) {}
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (!thread_safe_) return;
    int expected = kFree;
    if (!state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      LockSlow();
    }
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (!thread_safe_) return;
    if (state_.exchange(kFree, std::memory_order_release) == kContended) state_.notify_one();
  }

 private:
  static constexpr int kFree = 0;
  static constexpr int kHeld = 1;
  static constexpr int kContended = 2;

  void LockSlow() {
    // Mark the lock contended; whoever then releases it wakes one sleeper.
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
    }
  }

  std::atomic<int> state_{kFree};
  const bool thread_safe_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace remat

#endif  // REMAT_BASE_MUTEX_H_
