// UringEngine: IoEngine over io_uring for a single issuer thread (I1).
//
// Internal tags: the kernel sees our own user_data, never the caller's. An op's SQE carries the index of its slot
// (< depth), which holds the caller's user_data and whether a deadline was attached; link timeouts, the wake read
// and the shutdown cancel carry reserved tags above every slot index. That keeps caller user_data unrestricted and
// lets Reap swallow internal CQEs.
//
// Ops io_uring has no opcode for (kFchmod, kUtimensAt) run on one side thread of the engine with the blocking
// syscall, as the POSIX engine runs every op (a deadline is not enforced there: the real result arrives late). The
// side thread hands its completions to Drain and wakes a waiting Reap through the wake eventfd.
#include <liburing.h>
#include <linux/openat2.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/blocking_workers.h"
#include "io/io_engine.h"
#include "io/op_exec.h"

namespace kvtier {
namespace {

constexpr uint64_t kTimeoutTag = ~uint64_t{0};
constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;
constexpr uint64_t kCancelTag = ~uint64_t{0} - 2;
constexpr unsigned kCqeBatch = 64;
// Side ops (see below) at once: more wait in the caller (-EAGAIN), so a burst of them on a slow mount never holds
// the ring's whole depth.
constexpr uint32_t kMaxSideOps = 8;

// Flags tried in order: SINGLE_ISSUER lets the kernel skip submission locking and COOP_TASKRUN avoids IPIs to the
// reactor; both need 6.0/5.19. R_DISABLED defers the "which task is the issuer" binding to io_uring_enable_rings(),
// which we call from the first Submit/Flush/Reap, so the engine may be created on one thread and driven by another.
constexpr unsigned kFlagSets[] = {
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_R_DISABLED | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
    0,
};

class UringEngine final : public IoEngine {
 public:
  UringEngine() = default;
  UringEngine(const UringEngine&) = delete;
  UringEngine& operator=(const UringEngine&) = delete;

  int Init(uint32_t depth) {
    if (depth == 0) return -EINVAL;
    depth_ = depth;
    // Each op may take two SQEs (op + link timeout); one more for the wake read and one for the shutdown cancel.
    // The CQ defaults to twice the SQ, which covers every op, timeout, wake and cancel CQE at once: no overflow.
    unsigned entries = 2 * depth + 2;
    int r = -EINVAL;
    for (unsigned flags : kFlagSets) {
      io_uring_params p{};
      p.flags = flags;
      r = io_uring_queue_init_params(entries, &ring_, &p);
      if (r == 0) {
        needs_enable_ = (flags & IORING_SETUP_R_DISABLED) != 0;
        break;
      }
      if (r != -EINVAL) return r;  // EINVAL: flag unknown to this kernel, try fewer; anything else is final
    }
    if (r != 0) return r;
    ring_ok_ = true;
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return -errno;
    slots_.resize(depth);
    free_slots_.reserve(depth);
    for (uint32_t i = depth; i > 0; --i) free_slots_.push_back(i - 1);
    return 0;
  }

  ~UringEngine() override {
    StopSide();
    if (!ring_ok_) {
      if (wake_fd_ >= 0) close(wake_fd_);
      return;
    }
    // Borrowed buffers must not be written after we return: cancel what is left and wait (bounded) for it.
    if (started_ && in_flight_ > 0) {
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) {
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        sqe->user_data = kCancelTag;
      }
      // -EEXIST: called off the issuer thread of a SINGLE_ISSUER ring; the kernel cancels at ring exit instead.
      const bool canceling = io_uring_submit(&ring_) >= 0;
      std::vector<IoCompletion> discard;
      int64_t give_up = NowNs() + 1'000'000'000;
      while (canceling && in_flight_ > 0 && NowNs() < give_up) {
        bool woke = false;
        Wait(100'000'000);
        Drain(&discard, &woke);
      }
    }
    io_uring_queue_exit(&ring_);
    close(wake_fd_);
  }

  std::string_view name() const override { return "io_uring"; }
  uint32_t depth() const override { return depth_; }
  uint32_t in_flight() const override { return in_flight_; }

  int Submit(const IoOp& op) override {
    if (int r = EnsureStarted(); r < 0) return r;
    if (int r = internal::ValidateOp(op); r < 0) return r;
    if (in_flight_ >= depth_) return -EAGAIN;
    unsigned need = op.deadline_ns > 0 ? 2 : 1;
    if (io_uring_sq_space_left(&ring_) < need) {
      io_uring_submit(&ring_);  // cannot happen with our sizing unless the kernel lags; be safe
      if (io_uring_sq_space_left(&ring_) < need) return -EAGAIN;
    }
    const bool side = op.code == OpCode::kFchmod || op.code == OpCode::kUtimensAt;
    if (side && (side_in_flight_ >= kMaxSideOps || !StartSide())) return -EAGAIN;  // the caller submits it later
    uint32_t index = free_slots_.back();
    free_slots_.pop_back();
    Slot& slot = slots_[index];
    slot.user_data = op.user_data;
    if (side) {
      slot.has_deadline = false;  // not cancelled: its real result comes back
      SubmitToSide(index, op);
      ++in_flight_;
      return 0;
    }
    slot.has_deadline = op.deadline_ns > 0;

    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    switch (op.code) {
      case OpCode::kOpenAt:
        if (op.resolve != 0) {
          // The kernel copies open_how when the SQE is consumed (at Flush): it lives in the slot until then.
          slot.how = open_how{};
          slot.how.flags = static_cast<uint64_t>(static_cast<uint32_t>(op.flags));
          slot.how.mode = op.mode;
          slot.how.resolve = op.resolve;
          io_uring_prep_openat2(sqe, op.dirfd, op.path, &slot.how);
        } else {
          io_uring_prep_openat(sqe, op.dirfd, op.path, op.flags, op.mode);
        }
        break;
      case OpCode::kRead: io_uring_prep_read(sqe, op.fd, op.buf, op.len, op.offset); break;
      case OpCode::kWrite: io_uring_prep_write(sqe, op.fd, op.buf, op.len, op.offset); break;
      case OpCode::kFsync: io_uring_prep_fsync(sqe, op.fd, 0); break;
      case OpCode::kClose: io_uring_prep_close(sqe, op.fd); break;
      case OpCode::kLinkAt: io_uring_prep_linkat(sqe, op.dirfd, op.path, op.dirfd, op.path2, op.flags); break;
      case OpCode::kUnlinkAt: io_uring_prep_unlinkat(sqe, op.dirfd, op.path, op.flags); break;
      case OpCode::kMkdirAt: io_uring_prep_mkdirat(sqe, op.dirfd, op.path, op.mode); break;
      case OpCode::kStatx:
        if (op.path == nullptr) {
          io_uring_prep_statx(sqe, op.fd, "", AT_EMPTY_PATH | AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS,
                              static_cast<struct statx*>(op.buf));
        } else {
          io_uring_prep_statx(sqe, op.dirfd, op.path, AT_SYMLINK_NOFOLLOW | AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS,
                              static_cast<struct statx*>(op.buf));
        }
        break;
      case OpCode::kFchmod:
      case OpCode::kUtimensAt: break;  // the side thread's (above)
    }
    sqe->user_data = index;
    if (slot.has_deadline) {
      // An absolute CLOCK_MONOTONIC timeout measures from the caller's deadline, not from when Flush runs.
      sqe->flags |= IOSQE_IO_LINK;
      slot.deadline.tv_sec = op.deadline_ns / 1'000'000'000;
      slot.deadline.tv_nsec = op.deadline_ns % 1'000'000'000;
      io_uring_sqe* timeout = io_uring_get_sqe(&ring_);
      io_uring_prep_link_timeout(timeout, &slot.deadline, IORING_TIMEOUT_ABS);
      timeout->user_data = kTimeoutTag;
    }
    ++in_flight_;
    return 0;
  }

  int Flush() override {
    if (int r = EnsureStarted(); r < 0) return r;
    int r = io_uring_submit(&ring_);
    return r < 0 ? r : 0;
  }

  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    if (int r = EnsureStarted(); r < 0) return r;
    const int64_t give_up = timeout_ns > 0 ? NowNs() + timeout_ns : 0;
    int appended = 0;
    bool woke = false;
    for (;;) {
      appended += Drain(out, &woke);
      if (appended > 0 || woke || timeout_ns == 0) break;
      int64_t wait_ns = -1;
      if (timeout_ns > 0) {
        wait_ns = give_up - NowNs();
        if (wait_ns <= 0) break;
      }
      int r = Wait(wait_ns);
      if (r == -ETIME) {
        appended += Drain(out, &woke);
        break;
      }
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        if (appended == 0) return r;
        break;
      }
    }
    if (!wake_armed_) ArmWake();
    return appended;
  }

  void Wake() override {
    uint64_t one = 1;
    // EAGAIN means the counter is already huge: a wake is pending anyway.
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }

 private:
  struct Slot {
    uint64_t user_data = 0;
    bool has_deadline = false;
    __kernel_timespec deadline{};  // read by the kernel at submit: must live in the slot, not on the stack
    open_how how{};                // kOpenAt with resolve: read by the kernel at submit, like deadline
  };

  // Binds the ring to the calling thread (SINGLE_ISSUER) and arms the wake read; idempotent.
  int EnsureStarted() {
    if (started_) return 0;
    if (needs_enable_) {
      // Raw register call: Debian's liburing 2.3 declares io_uring_enable_rings() but does not export it.
      if (syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) < 0) {
        return -errno;
      }
    }
    started_ = true;
    // Ops the kernel cannot complete inline (opens, links, extending O_DIRECT writes) go to io_uring's worker
    // threads, by default at most 4 per CPU: 8 on a 2-core machine, fewer than the ops we keep in flight. Allow
    // one worker per op in flight. The limit belongs to the issuing thread, which is why it is set here.
    unsigned workers[2] = {depth_, 0};                    // bounded (regular file I/O), unbounded (unchanged)
    io_uring_register_iowq_max_workers(&ring_, workers);  // best effort: older kernels keep their default
    ArmWake();
    return 0;
  }

  void ArmWake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;  // retried at the end of the next Reap
    io_uring_prep_read(sqe, wake_fd_, &wake_buf_, sizeof(wake_buf_), 0);
    sqe->user_data = kWakeTag;
    wake_armed_ = true;
    io_uring_submit(&ring_);
  }

  // Waits for one CQE (also submitting anything queued). wait_ns < 0: no limit.
  int Wait(int64_t wait_ns) {
    io_uring_cqe* cqe = nullptr;
    if (wait_ns < 0) return io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, nullptr, nullptr);
    __kernel_timespec ts{};
    ts.tv_sec = wait_ns / 1'000'000'000;
    ts.tv_nsec = wait_ns % 1'000'000'000;
    return io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  }

  // Moves every available CQE into *out (caller ops) or internal state (wake, timeouts). Returns ops appended.
  int Drain(std::vector<IoCompletion>* out, bool* woke) {
    int appended = DrainSide(out);
    io_uring_cqe* cqes[kCqeBatch];
    for (;;) {
      unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kCqeBatch);
      if (n == 0) break;
      for (unsigned i = 0; i < n; ++i) {
        uint64_t tag = cqes[i]->user_data;
        int64_t res = cqes[i]->res;
        if (tag == kWakeTag) {
          wake_armed_ = false;
          *woke = true;
          continue;
        }
        if (tag == kTimeoutTag || tag == kCancelTag || tag >= slots_.size()) continue;
        Slot& slot = slots_[tag];
        // Only our link timeout (or shutdown) cancels an op; a canceled op that had a deadline timed out.
        if (slot.has_deadline && (res == -ECANCELED || res == -EINTR)) res = -ETIMEDOUT;
        out->push_back(IoCompletion{slot.user_data, res});
        free_slots_.push_back(static_cast<uint32_t>(tag));
        --in_flight_;
        ++appended;
      }
      io_uring_cq_advance(&ring_, n);
    }
    return appended;
  }

  // The side thread (see the top of the file): the op's slot index travels as its user_data there.
  void SubmitToSide(uint32_t index, const IoOp& op) {
    IoOp side = op;
    side.user_data = index;
    side_.Post(side);
    ++side_in_flight_;
  }

  // Starts the side thread on its first op; false when the thread cannot be made (the op is not taken).
  bool StartSide() { return side_.Start(1); }

  // Moves the side thread's completions into *out (issuer thread). Returns ops appended.
  int DrainSide(std::vector<IoCompletion>* out) {
    if (side_in_flight_ == 0) return 0;
    std::vector<IoCompletion> done;
    side_.TakeDone(&done);
    for (const IoCompletion& c : done) {
      const auto index = static_cast<uint32_t>(c.user_data);
      out->push_back(IoCompletion{slots_[index].user_data, c.result});
      free_slots_.push_back(index);
      --in_flight_;
      --side_in_flight_;
    }
    return static_cast<int>(done.size());
  }

  // Finishes the side thread's op under way; ops it has not started are dropped (their callers reap no more).
  void StopSide() {
    side_.Stop();
    in_flight_ -= side_in_flight_;
    side_in_flight_ = 0;
  }

  uint32_t side_in_flight_ = 0;                         // issuer thread only
  internal::BlockingWorkers side_{[this] { Wake(); }};  // one thread, started by the first side op

  io_uring ring_{};
  bool ring_ok_ = false;
  bool needs_enable_ = false;
  bool started_ = false;
  uint32_t depth_ = 0;
  uint32_t in_flight_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  int wake_fd_ = -1;  // written by Wake() from any thread; read only through the ring
  bool wake_armed_ = false;
  uint64_t wake_buf_ = 0;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(uint32_t depth) {
  auto engine = std::make_unique<UringEngine>();
  if (int r = engine->Init(depth); r < 0) {
    return Status::FromErrno(-r, "io_uring setup (depth " + std::to_string(depth) + ")");
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

bool UringAvailable(std::string* why) {
  auto say = [why](std::string text) {
    if (why != nullptr) *why = std::move(text);
  };
  io_uring ring{};
  int r = io_uring_queue_init(4, &ring, 0);
  if (r < 0) {
    say(std::string("io_uring_setup failed: ") + std::strerror(-r));
    return false;
  }
  bool ok = true;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    for (int op : {IORING_OP_OPENAT, IORING_OP_READ, IORING_OP_WRITE, IORING_OP_FSYNC, IORING_OP_CLOSE,
                   IORING_OP_LINKAT, IORING_OP_UNLINKAT, IORING_OP_MKDIRAT, IORING_OP_LINK_TIMEOUT, IORING_OP_STATX}) {
      if (!io_uring_opcode_supported(probe, op)) {
        say("io_uring lacks opcode " + std::to_string(op) + " (kernel too old)");
        ok = false;
        break;
      }
    }
    io_uring_free_probe(probe);
  }
  if (ok) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    io_uring_cqe* cqe = nullptr;
    r = io_uring_submit_and_wait(&ring, 1);
    if (r >= 0) r = io_uring_peek_cqe(&ring, &cqe);
    if (r < 0 || cqe == nullptr || cqe->res < 0) {
      say(std::string("io_uring NOP failed: ") + std::strerror(r < 0 ? -r : (cqe ? -cqe->res : EIO)));
      ok = false;
    } else {
      say("io_uring available (ring + NOP ok)");
    }
  }
  io_uring_queue_exit(&ring);
  return ok;
}

}  // namespace kvtier
