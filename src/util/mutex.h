// Mutex, MutexLock and CondVar: std::mutex, a scoped lock and a condition variable, annotated for Clang's
// thread-safety analysis (src/util/thread_annotations.h). Members a Mutex guards are declared GUARDED_BY(mu_);
// functions that expect it held REQUIRES(mu_), those that take it EXCLUDES(mu_).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace kvtier {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // For the analysis only: where a lock is known to be held but the analysis cannot see it.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // BasicLockable, so std::condition_variable_any can wait on it (CondVar).
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction; Unlock/Lock release and retake it in between.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    held_ = false;
    mu_.Unlock();
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over a Mutex. Wait and WaitFor are called with the mutex held (REQUIRES) and return with it
// held; they release it while waiting.
class CondVar {
 public:
  template <typename Pred>
  void Wait(Mutex& mu, Pred pred) REQUIRES(mu) {
    cv_.wait(mu, pred);
  }
  // False when the timeout passed with pred still false.
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout, Pred pred) REQUIRES(mu) {
    return cv_.wait_for(mu, timeout, pred);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace kvtier
