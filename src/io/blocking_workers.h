// BlockingWorkers: threads that run IoOps with their blocking system calls (internal::ExecuteBlocking): every op of
// the POSIX engine (I3), and the ops io_uring has no opcode for. Internal to src/io.
//
// Contract: Start, Post, Wait, TakeDone and Stop are called one at a time (the owner's issuer thread, or the thread
// that creates or destroys the owner); any thread may call Interrupt. Nothing is posted after Stop. Post hands
// ops to the threads; an op's user_data comes back in its completion. A finished op joins the done list, and
// on_done, when given, runs on the worker's thread once the list's lock is released (the owner's wake-up: the
// io_uring engine's eventfd). Wait blocks until the done list is not empty or Interrupt was called since the last
// Wait (timeout_ns < 0: no limit; 0: no wait), and clears the interrupt. Deadlines are not enforced: a blocking
// system call cannot be cancelled, so a late op's real result arrives late. Stop (and the destructor) lets the ops
// under way finish; ops not started are dropped (no effect on disk, and no fd is opened; a dropped close leaves its
// fd open) and come back no more, while those finished can still be taken. Threads block the process's signals
// (src/util/thread.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "io/io_engine.h"

namespace kvtier::internal {

class BlockingWorkers {
 public:
  explicit BlockingWorkers(std::function<void()> on_done = nullptr) : on_done_(std::move(on_done)) {}
  BlockingWorkers(const BlockingWorkers&) = delete;
  BlockingWorkers& operator=(const BlockingWorkers&) = delete;
  ~BlockingWorkers() { Stop(); }

  // Starts threads until `threads` run; false when one cannot be made (those already running stay).
  bool Start(uint32_t threads);
  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
  void Post(const IoOp& op);
  void Post(const std::vector<IoOp>& ops);
  void Wait(int64_t timeout_ns);
  void Interrupt();
  // Appends the finished ops to *out; returns how many.
  uint32_t TakeDone(std::vector<IoCompletion>* out);
  void Stop();

 private:
  void Loop();

  const std::function<void()> on_done_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<IoOp> work_;             // guarded by mu_
  std::vector<IoCompletion> done_;    // guarded by mu_
  bool interrupted_ = false;          // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  std::vector<std::thread> threads_;  // issuer thread only
};

}  // namespace kvtier::internal
