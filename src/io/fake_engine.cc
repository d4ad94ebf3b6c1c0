#include "io/fake_engine.h"

#include <unistd.h>

#include <algorithm>

#include "io/op_exec.h"

namespace kvtier {

uint32_t FakeEngine::depth() const {
  std::lock_guard lock(mu_);
  return depth_;
}

uint32_t FakeEngine::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

int FakeEngine::Submit(const IoOp& op) {
  if (int r = internal::ValidateOp(op); r < 0) return r;
  std::lock_guard lock(mu_);
  if (in_flight_ >= depth_) return -EAGAIN;
  queued_.push_back(op);
  ++in_flight_;
  return 0;
}

int FakeEngine::Flush() {
  std::vector<IoOp> ops;
  {
    std::lock_guard lock(mu_);
    ops.swap(queued_);
  }
  // Syscalls run outside the lock so a FIFO read that blocks cannot freeze Wake() or the test controls.
  std::vector<Held> done;
  done.reserve(ops.size());
  for (const IoOp& op : ops) {
    done.push_back(Held{IoCompletion{op.user_data, internal::ExecuteBlocking(op)}, op.code, op.deadline_ns});
  }
  {
    // hold_ is read now, not before the syscalls ran: a test that stops holding and releases everything while this
    // Flush is executing must not have these completions parked in held_ after its ReleaseAll() (they would never
    // be reaped).
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < ops.size(); ++i) {
      executed_.push_back(ops[i]);
      if (hold_) {
        held_.push_back(done[i]);
      } else {
        ready_.push_back(done[i].completion);
      }
    }
  }
  cv_.notify_all();
  return 0;
}

void FakeEngine::ExpireHeldLocked(int64_t now) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->deadline_ns > 0 && it->deadline_ns <= now) {
      // The op ran but its result is reported as a timeout: close an fd the caller will never learn about.
      if (it->code == OpCode::kOpenAt && it->completion.result >= 0) {
        ::close(static_cast<int>(it->completion.result));
      }
      ready_.push_back(IoCompletion{it->completion.user_data, -ETIMEDOUT});
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

int FakeEngine::Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) {
  std::unique_lock lock(mu_);
  const int64_t give_up = timeout_ns > 0 ? NowNs() + timeout_ns : 0;
  for (;;) {
    int64_t now = NowNs();
    ExpireHeldLocked(now);
    if (!ready_.empty() || wake_ || timeout_ns == 0) break;
    // Sleep until the caller's limit or the earliest held deadline, whichever comes first.
    int64_t until = timeout_ns > 0 ? give_up : INT64_MAX;
    for (const Held& h : held_) {
      if (h.deadline_ns > 0) until = std::min(until, h.deadline_ns);
    }
    if (timeout_ns > 0 && now >= give_up) break;
    if (until == INT64_MAX) {
      cv_.wait(lock);
    } else {
      cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(until - now, 0)));
    }
  }
  wake_ = false;
  int n = static_cast<int>(ready_.size());
  for (const IoCompletion& c : ready_) out->push_back(c);
  ready_.clear();
  in_flight_ -= static_cast<uint32_t>(n);
  return n;
}

void FakeEngine::Wake() {
  {
    std::lock_guard lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void FakeEngine::HoldCompletions(bool hold) {
  std::lock_guard lock(mu_);
  hold_ = hold;
}

void FakeEngine::ReleaseAll() {
  {
    std::lock_guard lock(mu_);
    for (const Held& h : held_) ready_.push_back(h.completion);
    held_.clear();
  }
  cv_.notify_all();
}

bool FakeEngine::Release(uint64_t user_data) {
  {
    std::lock_guard lock(mu_);
    auto it =
        std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.completion.user_data == user_data; });
    if (it == held_.end()) return false;
    ready_.push_back(it->completion);
    held_.erase(it);
  }
  cv_.notify_all();
  return true;
}

void FakeEngine::set_depth(uint32_t depth) {
  std::lock_guard lock(mu_);
  depth_ = depth;
}

size_t FakeEngine::held() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

std::vector<IoOp> FakeEngine::executed() const {
  std::lock_guard lock(mu_);
  return executed_;
}

}  // namespace kvtier
