#include "io/blocking_workers.h"

#include <chrono>
#include <system_error>

#include "io/op_exec.h"
#include "util/thread.h"

namespace kvtier::internal {

bool BlockingWorkers::Start(uint32_t threads) {
  threads_.reserve(threads);  // a push_back that cannot allocate would drop a running thread
  while (threads_.size() < threads) {
    try {
      threads_.push_back(StartThread([this] { Loop(); }));
    } catch (const std::system_error&) {
      return false;
    }
  }
  return true;
}

void BlockingWorkers::Post(const IoOp& op) {
  {
    std::lock_guard lock(mu_);
    work_.push_back(op);
  }
  work_cv_.notify_one();
}

void BlockingWorkers::Post(const std::vector<IoOp>& ops) {
  if (ops.empty()) return;
  {
    std::lock_guard lock(mu_);
    work_.insert(work_.end(), ops.begin(), ops.end());
  }
  work_cv_.notify_all();
}

void BlockingWorkers::Wait(int64_t timeout_ns) {
  std::unique_lock lock(mu_);
  auto ready = [this] { return !done_.empty() || interrupted_; };
  if (timeout_ns < 0) {
    done_cv_.wait(lock, ready);
  } else if (timeout_ns > 0) {
    done_cv_.wait_for(lock, std::chrono::nanoseconds(timeout_ns), ready);
  }
  interrupted_ = false;
}

void BlockingWorkers::Interrupt() {
  {
    std::lock_guard lock(mu_);
    interrupted_ = true;
  }
  done_cv_.notify_all();
}

uint32_t BlockingWorkers::TakeDone(std::vector<IoCompletion>* out) {
  std::lock_guard lock(mu_);
  const auto n = static_cast<uint32_t>(done_.size());
  out->insert(out->end(), done_.begin(), done_.end());
  done_.clear();
  return n;
}

void BlockingWorkers::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    work_.clear();  // never started: dropping them has no effect on disk (see the header for closes)
  }
  work_cv_.notify_all();
  // Running ops finish first (a blocking system call cannot be interrupted portably).
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void BlockingWorkers::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !work_.empty(); });
    if (stopping_) return;
    const IoOp op = work_.front();
    work_.pop_front();
    lock.unlock();
    const int64_t result = ExecuteBlocking(op);
    lock.lock();
    done_.push_back(IoCompletion{op.user_data, result});
    done_cv_.notify_one();
    if (on_done_) {
      lock.unlock();
      on_done_();
      lock.lock();
    }
  }
}

}  // namespace kvtier::internal
