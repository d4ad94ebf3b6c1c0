// FakeEngine: a deterministic IoEngine for tests.
//
// Flush() runs each queued op with the real blocking syscall, inline, in submission order; completions are then
// returned by Reap() in that same order. No threads are started. Test controls simulate slow I/O:
//   HoldCompletions(true)  completions Flush() produces from now on are held, not reaped (the flag is read when
//                          an op's syscall has run, so a release racing a Flush never strands a completion);
//   ReleaseAll()/Release() make held completions reapable (in order);
//   a held op whose deadline passes is reported with -ETIMEDOUT by the next Reap (the op did run; an fd it
//   opened is closed so nothing leaks);
//   set_depth() changes the in-flight bound (affects later Submits only).
// Ops run inline in Flush(): one that blocks (a read from an idle pipe) blocks Flush, so tests simulate slow
// I/O with HoldCompletions instead.
// Thread safety: one issuer calls Submit/Flush/Reap, as for every IoEngine. Wake(), ReleaseAll(), Release() and
// HoldCompletions() may be called from any thread (they take an internal lock), so a test can release I/O while
// the code under test is blocked in Reap.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>

#include "io/io_engine.h"

namespace kvtier {

class FakeEngine final : public IoEngine {
 public:
  explicit FakeEngine(uint32_t depth = 16) : depth_(depth) {}

  std::string_view name() const override { return "fake"; }
  uint32_t depth() const override;
  uint32_t in_flight() const override;

  int Submit(const IoOp& op) override;
  int Flush() override;
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override;
  void Wake() override;

  void HoldCompletions(bool hold);
  void ReleaseAll();
  // Releases the held completion with this user_data; false when none is held.
  bool Release(uint64_t user_data);
  void set_depth(uint32_t depth);
  size_t held() const;
  // Ops flushed (executed) so far, in order: lets tests assert what ran.
  std::vector<IoOp> executed() const;

 private:
  struct Held {
    IoCompletion completion;
    OpCode code;
    int64_t deadline_ns;
  };
  // Moves held ops whose deadline has passed to ready_ as -ETIMEDOUT. Requires mu_.
  void ExpireHeldLocked(int64_t now);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint32_t depth_;
  uint32_t in_flight_ = 0;
  bool hold_ = false;
  bool wake_ = false;
  std::vector<IoOp> queued_;
  std::deque<Held> held_;
  std::deque<IoCompletion> ready_;
  std::vector<IoOp> executed_;
};

}  // namespace kvtier
