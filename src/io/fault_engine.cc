#include "io/fault_engine.h"

#include <algorithm>

#include "io/op_exec.h"

namespace kvtier {

FaultInjectingEngine::FaultInjectingEngine(std::unique_ptr<IoEngine> inner)
    : inner_(std::move(inner)), name_("fault(" + std::string(inner_->name()) + ")") {}

uint32_t FaultInjectingEngine::in_flight() const {
  return inner_->in_flight() + static_cast<uint32_t>(failed_.size() + delayed_.size());
}

int FaultInjectingEngine::Submit(const IoOp& op) {
  if (int r = internal::ValidateOp(op); r < 0) return r;
  // The depth bound covers synthesized completions too, so callers see the same back-pressure with or without faults.
  if (in_flight() >= depth()) return -EAGAIN;
  const auto code_index = static_cast<size_t>(op.code);
  const uint64_t nth_all = counters_.ops_seen + 1;
  const uint64_t nth_code = seen_by_code_[code_index] + 1;

  const FaultRule* hit = nullptr;
  for (const FaultRule& rule : rules_) {
    if (rule.code.has_value() && *rule.code != op.code) continue;
    bool matches = false;
    switch (rule.kind) {
      case FaultRule::Kind::kFailNth: matches = rule.nth == (rule.code ? nth_code : nth_all); break;
      case FaultRule::Kind::kFailEvery: matches = true; break;
      case FaultRule::Kind::kShortTransfer:
        matches = (op.code == OpCode::kRead || op.code == OpCode::kWrite) && op.len > rule.max_bytes;
        break;
      case FaultRule::Kind::kDelayPastDeadline: matches = op.deadline_ns > 0; break;
    }
    if (matches) {
      hit = &rule;
      break;
    }
  }

  IoOp forwarded = op;
  if (hit != nullptr) {
    switch (hit->kind) {
      case FaultRule::Kind::kFailNth:
      case FaultRule::Kind::kFailEvery:
        failed_.push_back(IoCompletion{op.user_data, -static_cast<int64_t>(hit->error)});
        ++counters_.failed;
        break;
      case FaultRule::Kind::kDelayPastDeadline:
        delayed_.push_back(Delayed{op.user_data, op.deadline_ns});
        ++counters_.delayed;
        break;
      case FaultRule::Kind::kShortTransfer: forwarded.len = hit->max_bytes; break;
    }
  }
  if (hit == nullptr || hit->kind == FaultRule::Kind::kShortTransfer) {
    if (int r = inner_->Submit(forwarded); r < 0) return r;  // not counted: the caller will retry it
    if (hit != nullptr) ++counters_.shortened;
  }
  ++counters_.ops_seen;
  ++seen_by_code_[code_index];
  return 0;
}

int FaultInjectingEngine::Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) {
  int appended = 0;
  auto collect = [&] {
    for (const IoCompletion& c : failed_) out->push_back(c);
    appended += static_cast<int>(failed_.size());
    failed_.clear();
    const int64_t now = NowNs();
    auto expired = [now](const Delayed& d) { return d.deadline_ns <= now; };
    for (const Delayed& d : delayed_) {
      if (expired(d)) {
        out->push_back(IoCompletion{d.user_data, -ETIMEDOUT});
        ++appended;
      }
    }
    delayed_.erase(std::remove_if(delayed_.begin(), delayed_.end(), expired), delayed_.end());
  };
  collect();
  // Wait in the inner engine, but no longer than the earliest synthesized deadline.
  int64_t wait_ns = appended > 0 ? 0 : timeout_ns;
  if (wait_ns != 0 && !delayed_.empty()) {
    int64_t earliest = INT64_MAX;
    for (const Delayed& d : delayed_) earliest = std::min(earliest, d.deadline_ns);
    int64_t until_deadline = std::max<int64_t>(earliest - NowNs(), 1);
    wait_ns = wait_ns < 0 ? until_deadline : std::min(wait_ns, until_deadline);
  }
  int r = inner_->Reap(out, wait_ns);
  if (r < 0) return appended > 0 ? appended : r;
  appended += r;
  if (r == 0) collect();
  return appended;
}

}  // namespace kvtier
