// PosixEngine: IoEngine over blocking syscalls run by a small thread pool (I3), for kernels without io_uring.
//
// Threads: the issuer thread alone touches pending_ and in_flight_; the workers (BlockingWorkers) run the flushed
// ops, Reap waits for their completions, and Wake() interrupts that wait.
#include "io/blocking_workers.h"
#include "io/io_engine.h"
#include "io/op_exec.h"

namespace kvtier {
namespace {

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(uint32_t depth) : depth_(depth) {}
  PosixEngine(const PosixEngine&) = delete;
  PosixEngine& operator=(const PosixEngine&) = delete;

  bool StartWorkers(uint32_t threads) { return workers_.Start(threads); }

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
    workers_.Post(pending_);
    pending_.clear();
    return 0;
  }

  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    workers_.Wait(timeout_ns);
    const uint32_t n = workers_.TakeDone(out);
    in_flight_ -= n;
    return static_cast<int>(n);
  }

  void Wake() override { workers_.Interrupt(); }

 private:
  const uint32_t depth_;
  uint32_t in_flight_ = 0;     // issuer thread only
  std::vector<IoOp> pending_;  // issuer thread only: submitted, not yet flushed
  internal::BlockingWorkers workers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreatePosixEngine(uint32_t depth, uint32_t threads) {
  if (depth == 0) return Status(StatusCode::kInvalidArgument, "posix engine: depth must be > 0");
  if (threads == 0) threads = 1;
  auto engine = std::make_unique<PosixEngine>(depth);
  if (!engine->StartWorkers(threads)) {
    return Status(StatusCode::kResourceExhausted, "posix engine: cannot start its worker threads");
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace kvtier
