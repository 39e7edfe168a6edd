// remat::Mutex: the one lock type of the project, annotated for clang's
// thread-safety analysis (ABSL_GUARDED_BY and friends work with it).
//
// Normally it is an absl::Mutex. Under ThreadSanitizer it is a std::mutex:
// the distribution's Abseil is compiled without TSan annotations, so TSan
// cannot see absl::Mutex's futex-based hand-offs and would report races on
// every guarded field. std::mutex goes through pthread, which TSan intercepts.
#ifndef REMAT_BASE_MUTEX_H_
#define REMAT_BASE_MUTEX_H_

#include "absl/base/thread_annotations.h"

#if defined(__SANITIZE_THREAD__)
#define REMAT_MUTEX_IS_STD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REMAT_MUTEX_IS_STD 1
#endif
#endif

#ifdef REMAT_MUTEX_IS_STD
#include <mutex>
#else
#include "absl/synchronization/mutex.h"
#endif

namespace remat {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { impl_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { impl_.unlock(); }

 private:
#ifdef REMAT_MUTEX_IS_STD
  std::mutex impl_;
#else
  struct Adapter {
    void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu.Lock(); }
    void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu.Unlock(); }
    absl::Mutex mu;
  } impl_;
#endif
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
