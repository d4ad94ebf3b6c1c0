// FaultInjectingEngine: wraps any IoEngine and injects failures by rule, for tests of the layers above.
//
// Rules are checked in the order added; the first rule that matches an op decides its fate:
//   FailNth(n, err[, code])     the n-th op (1-based; counting every op, or only ops of `code`) fails with -err;
//   FailEvery(code, err)        every op of `code` fails with -err;
//   ShortTransfer(code, k)      a read or write moves at most k bytes (the op really runs, with len capped);
//   DelayPastDeadline([code])   an op with a deadline completes with -ETIMEDOUT once its deadline passes (ops with
//                               no deadline are not matched).
// A failed or delayed op is never forwarded: it has no effect on disk (no write, link or unlink happens) and
// opens no fd, so nothing leaks; its completion is synthesized. Counting (for FailNth) covers only ops accepted by
// Submit (not those refused with -EAGAIN/-EINVAL).
// Thread safety: as for IoEngine: one issuer thread calls everything except Wake(); add rules on that thread (or
// before it starts). Counters are read on that thread too.
#pragma once

#include <deque>
#include <optional>

#include "io/io_engine.h"

namespace kvtier {

struct FaultRule {
  enum class Kind { kFailNth, kFailEvery, kShortTransfer, kDelayPastDeadline };
  Kind kind = Kind::kFailEvery;
  std::optional<OpCode> code;  // nullopt: matches every op code
  uint64_t nth = 0;            // kFailNth
  int error = EIO;             // kFailNth, kFailEvery: a positive errno
  uint32_t max_bytes = 0;      // kShortTransfer

  static FaultRule FailNth(uint64_t n, int error, std::optional<OpCode> code = std::nullopt) {
    return FaultRule{Kind::kFailNth, code, n, error, 0};
  }
  static FaultRule FailEvery(OpCode code, int error) { return FaultRule{Kind::kFailEvery, code, 0, error, 0}; }
  static FaultRule ShortTransfer(OpCode code, uint32_t max_bytes) {
    return FaultRule{Kind::kShortTransfer, code, 0, 0, max_bytes};
  }
  static FaultRule DelayPastDeadline(std::optional<OpCode> code = std::nullopt) {
    return FaultRule{Kind::kDelayPastDeadline, code, 0, 0, 0};
  }
};

struct FaultCounters {
  uint64_t ops_seen = 0;   // ops accepted by Submit
  uint64_t failed = 0;     // FailNth + FailEvery injections
  uint64_t shortened = 0;  // ShortTransfer injections (only when len was actually capped)
  uint64_t delayed = 0;    // DelayPastDeadline injections
};

class FaultInjectingEngine final : public IoEngine {
 public:
  // Owns inner. name() is "fault(<inner name>)".
  explicit FaultInjectingEngine(std::unique_ptr<IoEngine> inner);

  std::string_view name() const override { return name_; }
  uint32_t depth() const override { return inner_->depth(); }
  // Forwarded ops in flight in the inner engine plus synthesized completions not yet reaped.
  uint32_t in_flight() const override;

  int Submit(const IoOp& op) override;
  int Flush() override { return inner_->Flush(); }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override;
  void Wake() override { inner_->Wake(); }

  void AddRule(const FaultRule& rule) { rules_.push_back(rule); }
  void ClearRules() { rules_.clear(); }
  const FaultCounters& counters() const { return counters_; }
  IoEngine& inner() { return *inner_; }

 private:
  struct Delayed {
    uint64_t user_data;
    int64_t deadline_ns;
  };

  std::unique_ptr<IoEngine> inner_;
  std::string name_;
  std::vector<FaultRule> rules_;
  uint64_t seen_by_code_[kNumOpCodes] = {};
  FaultCounters counters_;
  std::deque<IoCompletion> failed_;  // synthesized failures, reaped at the next Reap
  std::vector<Delayed> delayed_;     // synthesized timeouts, reaped once their deadline passes
};

}  // namespace kvtier
