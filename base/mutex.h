// remat::Mutex: the one lock type of the project, annotated for clang's
// thread-safety analysis (ABSL_GUARDED_BY and friends work with it).
//
// It is a std::mutex, not an absl::Mutex, for two measured reasons. Debian's
// Abseil is built without NDEBUG, so every absl::Mutex::Lock runs deadlock
// cycle detection (GraphCycles::GetId and a pthread_getspecific per lock):
// about a fifth of an allocate/free pair. And that Abseil is not compiled with
// TSan annotations, so ThreadSanitizer cannot see its futex hand-offs and
// reports races on every guarded field; pthread mutexes it understands. We use
// no reader locks or conditions, so nothing of absl::Mutex is missed.
#ifndef REMAT_BASE_MUTEX_H_
#define REMAT_BASE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace remat {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { impl_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { impl_.unlock(); }

 private:
  std::mutex impl_;
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
