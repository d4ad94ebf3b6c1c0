// PosixEngine: IoEngine over blocking syscalls run by a small thread pool (I3), for kernels without io_uring.
//
// Threads: the issuer thread alone touches pending_ and in_flight_. Workers and the issuer share work_, done_ and
// wake_ under mu_: workers wait on work_cv_, Reap waits on done_cv_, and Wake() sets wake_ and signals done_cv_.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "io/io_engine.h"
#include "io/op_exec.h"
#include "util/thread.h"

namespace kvtier::io {
namespace {

class PosixEngine final : public IoEngine {
 public:
  PosixEngine(uint32_t depth, uint32_t threads) : depth_(depth) {
    workers_.reserve(threads);
    for (uint32_t i = 0; i < threads; ++i) workers_.push_back(StartThread([this] { WorkerLoop(); }));
  }
  PosixEngine(const PosixEngine&) = delete;
  PosixEngine& operator=(const PosixEngine&) = delete;

  ~PosixEngine() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      work_.clear();  // never started: dropping them has no effect on disk and leaks no fd
    }
    work_cv_.notify_all();
    // Running ops finish first (a blocking syscall cannot be interrupted portably); see the header's contract.
    for (auto& t : workers_) t.join();
  }

  std::string_view name() const override { return "posix"; }
  uint32_t depth() const override { return depth_; }
  uint32_t in_flight() const override { return in_flight_; }

  int Submit(const IoOp& op) override {
    if (int r = internal::ValidateOp(op); r < 0) return r;
    if (in_flight_ >= depth_) return -EAGAIN;
    pending_.push_back(op);
    ++in_flight_;
    return 0;
  }

  int Flush() override {
    if (pending_.empty()) return 0;
    {
      std::lock_guard lock(mu_);
      for (const IoOp& op : pending_) work_.push_back(op);
    }
    pending_.clear();
    work_cv_.notify_all();
    return 0;
  }

  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    std::unique_lock lock(mu_);
    auto ready = [this] { return !done_.empty() || wake_; };
    if (timeout_ns < 0) {
      done_cv_.wait(lock, ready);
    } else if (timeout_ns > 0) {
      done_cv_.wait_for(lock, std::chrono::nanoseconds(timeout_ns), ready);
    }
    wake_ = false;
    int n = static_cast<int>(done_.size());
    for (const IoCompletion& c : done_) out->push_back(c);
    done_.clear();
    lock.unlock();
    in_flight_ -= static_cast<uint32_t>(n);
    return n;
  }

  void Wake() override {
    {
      std::lock_guard lock(mu_);
      wake_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stopping_ || !work_.empty(); });
      if (stopping_) return;
      IoOp op = work_.front();
      work_.pop_front();
      lock.unlock();
      // Deadlines are not enforced here: a blocking syscall cannot be canceled, so the real result arrives late.
      int64_t result = internal::ExecuteBlocking(op);
      lock.lock();
      done_.push_back(IoCompletion{op.user_data, result});
      done_cv_.notify_one();
    }
  }

  const uint32_t depth_;
  uint32_t in_flight_ = 0;     // issuer thread only
  std::vector<IoOp> pending_;  // issuer thread only: submitted, not yet flushed

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<IoOp> work_;          // guarded by mu_
  std::deque<IoCompletion> done_;  // guarded by mu_
  bool wake_ = false;              // guarded by mu_
  bool stopping_ = false;          // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreatePosixEngine(uint32_t depth, uint32_t threads) {
  if (depth == 0) return Status(StatusCode::kInvalidArgument, "posix engine: depth must be > 0");
  if (threads == 0) threads = 1;
  return std::unique_ptr<IoEngine>(std::make_unique<PosixEngine>(depth, threads));
}

}  // namespace kvtier::io
