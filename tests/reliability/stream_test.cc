// Streams cut mid-way (issue 25; docs/architecture.md "Streamed transfers"): StreamPump over a real engine and real
// files, its consumers on the pool's stream board as vLLM's workers are.
// - A deadline: one chunk's read is held at the disk past op_timeout_ms (and then really runs, late, into its slot).
//   That chunk's entry fails, its bytes never reach the consumer, every other chunk loads byte for byte, no slot
//   stays held, and the same keys stream again once the disk is healthy.
// - A killed worker: a consumer process (it maps the pool by name, like a vLLM worker) is SIGKILLed in the middle of
//   a load stream, or of a store stream after filling half of a slot. The owner closes the stream (as the vLLM
//   manager does when the request finishes or is aborted): every pin is released, nothing half-written is stored
//   (the chunks it acked are), and another consumer process completes a new stream of the same keys.
// The asan and tsan presets run this suite as well (leaks of slots, fds and buffers, races).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <new>
#include <set>

#include "engine/engine_impl.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "policy/stream_pump.h"
#include "reliability/reliability_util.h"
#include "staging/staging_pool.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

constexpr uint32_t kSlots = 4;  // the pool: streams larger than it go through a window of 4 slots

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Whether the slot's payload is exactly ContentFor(key_index) (block b at b * stride from the payload's start).
bool SlotHolds(const StagingPool& pool, uint32_t slot, uint64_t stride, uint64_t key_index) {
  const std::vector<uint8_t> want = ContentFor(key_index);
  const uint8_t* payload = pool.SlotData(slot) + kHeaderBytes;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    if (std::memcmp(payload + b * stride, want.data() + b * kBlockBytes, kBlockBytes) != 0) return false;
  }
  return true;
}

// Fills the slot's payload with ContentFor(key_index); only the first `blocks` blocks (a copy cut short).
void FillSlot(const StagingPool& pool, uint32_t slot, uint64_t stride, uint64_t key_index, uint32_t blocks) {
  const std::vector<uint8_t> want = ContentFor(key_index);
  uint8_t* payload = pool.SlotData(slot) + kHeaderBytes;
  for (uint32_t b = 0; b < blocks; ++b) std::memcpy(payload + b * stride, want.data() + b * kBlockBytes, kBlockBytes);
}

std::vector<ChunkKey> Keys(uint64_t first, uint64_t n) {
  std::vector<ChunkKey> v;
  for (uint64_t i = first; i < first + n; ++i) v.push_back(Key(i));
  return v;
}

bool WaitFinished(StreamPump& pump, uint64_t id, double seconds = 30) {
  const auto start = std::chrono::steady_clock::now();
  while (Since(start) < seconds) {
    auto p = pump.Progress(id);
    if (p.ok() && p->finished) return true;
    usleep(1000);
  }
  return false;
}

// No slot of the pool is pinned or held: every slot can be reserved at once (resident chunks that are not pinned
// give theirs up), then given back. A resident chunk still being written holds its slot a moment: retried for a
// while. False when some slot stays held.
bool EverySlotCanBeHad(Engine& e, uint64_t fresh_first) {
  const std::vector<ChunkKey> fresh = Keys(fresh_first, kSlots);
  const auto start = std::chrono::steady_clock::now();
  while (Since(start) < 10) {
    auto r = e.ReserveForStore(fresh);
    if (r.ok()) {
      e.CommitStore(fresh, false);
      return true;
    }
    usleep(2000);
  }
  return false;
}

// --- A read held at the disk past its deadline -------------------------------------------------------------------

struct SlowReads {
  std::string rel_path;             // the chunk file whose reads are late (ChunkRelPath)
  int64_t late_ns = 0;              // how long past its deadline a read waits before it goes to the disk
  std::atomic<bool> on{true};       // off: the disk is healthy again
  std::atomic<uint32_t> held{0};    // reads held
  std::atomic<uint32_t> landed{0};  // held reads that ran (late) and came back
};

// Wraps a reactor's I/O engine: a read of the slow file is held until late_ns past its deadline, then submitted
// without a deadline, so it really runs and writes its (correct) bytes into its buffer long after the engine gave
// the chunk up. Everything else passes through. Reactor thread only, except Wake.
class SlowReadEngine final : public IoEngine {
 public:
  SlowReadEngine(std::unique_ptr<IoEngine> inner, SlowReads* slow) : inner_(std::move(inner)), slow_(slow) {}
  ~SlowReadEngine() override {
    // The engine waits for every op before it lets its I/O engine go; nothing can still be held here.
    if (!held_.empty()) std::fprintf(stderr, "SlowReadEngine: %zu reads still held\n", held_.size());
  }
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight() + static_cast<uint32_t>(held_.size()); }
  int Submit(const IoOp& op) override {
    if (op.code == OpCode::kClose) slow_fds_.erase(op.fd);
    if (op.code == OpCode::kRead && slow_->on.load() && slow_fds_.count(op.fd) && op.deadline_ns > 0) {
      if (in_flight() >= depth()) return -EAGAIN;
      slow_fds_.erase(op.fd);  // one read per open: the engine may close the fd without us, and its number come back
      held_.push_back(Held{op, op.deadline_ns + slow_->late_ns});
      slow_->held++;
      return 0;
    }
    const int rc = inner_->Submit(op);
    if (rc == 0 && op.code == OpCode::kOpenAt) {
      if (op.path != nullptr && slow_->on.load() && slow_->rel_path == op.path) {
        opens_.insert(op.user_data);
      } else {
        other_opens_.insert(op.user_data);
      }
    }
    return rc;
  }
  int Flush() override { return inner_->Flush(); }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    const int64_t now = NowNs();
    bool released = false;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->due_ns > now) {
        ++it;
        continue;
      }
      IoOp late = it->op;
      late.deadline_ns = 0;                  // runs to the end, whatever the engine decided meanwhile
      if (inner_->Submit(late) != 0) break;  // full: next time
      released_.insert(late.user_data);
      released = true;
      it = held_.erase(it);
    }
    if (released) inner_->Flush();
    for (const Held& h : held_) {
      const int64_t wait = std::max<int64_t>(0, h.due_ns - now);
      if (timeout_ns < 0 || timeout_ns > wait) timeout_ns = wait;
    }
    const size_t before = out->size();
    const int n = inner_->Reap(out, timeout_ns);
    for (size_t k = before; k < out->size(); ++k) {
      const IoCompletion& c = (*out)[k];
      if (opens_.erase(c.user_data) && c.result >= 0) {
        slow_fds_.insert(static_cast<int>(c.result));
      } else if (c.result >= 0 && other_opens_.erase(c.user_data)) {
        slow_fds_.erase(static_cast<int>(c.result));  // the number now names another file
      }
      if (released_.erase(c.user_data)) slow_->landed++;
    }
    return n;
  }
  void Wake() override { inner_->Wake(); }

 private:
  struct Held {
    IoOp op;
    int64_t due_ns;
  };
  std::unique_ptr<IoEngine> inner_;
  SlowReads* slow_;
  std::set<uint64_t> opens_;        // opens of the slow file in flight (user_data)
  std::set<uint64_t> other_opens_;  // other opens in flight
  std::set<int> slow_fds_;          // fds of the slow file
  std::vector<Held> held_;
  std::set<uint64_t> released_;  // held reads submitted late, in flight
};

class StreamDeadline : public ::testing::TestWithParam<IoBackend> {};

TEST_P(StreamDeadline, AChunkReadPastItsDeadlineFailsAloneNeverReachesTheConsumerAndLeavesNoSlotHeld) {
  std::string why;
  if (GetParam() == IoBackend::kUring && !UringAvailable(&why)) GTEST_SKIP() << why;
  constexpr uint32_t kChunks = 8, kSlow = 2;  // chunk 2 is in the first window
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.backend = GetParam();
  o.pool_bytes = kSlots * kChunkFileBytes;
  o.demand_reserve_slots = 1;
  {
    EngineOptions clean_o = o;
    clean_o.op_timeout_ms = 60000;
    auto clean = test::OpenWithJobs(clean_o);
    ASSERT_TRUE(clean.ok()) << clean.status().ToString();
    for (uint64_t i = 0; i < kChunks; ++i) ASSERT_TRUE(StoreOne(clean.value(), i).ok()) << i;
  }
  // A deadline every clean read meets easily (also under TSan on two busy cores); the slow read misses it by 0.5 s.
  o.op_timeout_ms = 2000;
  SlowReads slow;
  slow.rel_path = ChunkRelPath(Key(kSlow));
  slow.late_ns = 500'000'000;
  auto opened = OpenWithWrappedIo(o, GetParam(), [&](std::unique_ptr<IoEngine> inner) {
    return std::make_unique<SlowReadEngine>(std::move(inner), &slow);
  });
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Engine& e = *opened.value();
  auto view = StagingPool::Attach(e.pool_name());  // the worker's mapping
  auto mine = StagingPool::Attach(e.pool_name());
  ASSERT_TRUE(view.ok() && mine.ok());
  StreamOptions so;
  so.max_window = 8;
  so.max_retries = 3;
  auto pump = std::make_unique<StreamPump>(&e, std::move(mine.value()), so);
  const uint64_t stride = e.block_stride();

  // A consumer that checks every ready chunk byte for byte, and holds its acks until the slow read has landed: the
  // slots of the published chunks stay busy while the late read writes into its own slot, then are checked again
  // (a slot given to another chunk while its read was still out would be overwritten under a consumer's eyes).
  const auto start = std::chrono::steady_clock::now();
  auto span = pump->OpenLoad(Keys(0, kChunks), 1);
  ASSERT_TRUE(span.ok()) << span.status().ToString();
  uint32_t copied = 0, failed = 0, wrong = 0, rechecked = 0;
  double failed_at_s = 0;
  std::vector<bool> settled(kChunks, false);
  std::vector<uint32_t> waiting_ack;
  while (copied + failed < kChunks && Since(start) < 60) {
    const uint32_t bell = view.value()->WorkerBell();
    const bool landed = slow.landed.load() > 0;
    if (landed && !waiting_ack.empty()) {
      for (uint32_t i : waiting_ack) {
        const StreamEntryView v = view.value()->ObserveEntry(span->first_entry + i);
        if (!SlotHolds(*view.value(), v.slot, stride, i)) wrong++;
        rechecked++;
        EXPECT_TRUE(view.value()->AckEntry(span->first_entry + i, span->tag));
      }
      waiting_ack.clear();
    }
    for (uint32_t i = 0; i < kChunks; ++i) {
      if (settled[i]) continue;
      const StreamEntryView v = view.value()->ObserveEntry(span->first_entry + i);
      if (v.tag != span->tag || v.state == StreamEntryState::kWaiting) continue;
      settled[i] = true;
      if (v.state == StreamEntryState::kFailed) {
        failed++;
        failed_at_s = Since(start);
        EXPECT_EQ(i, kSlow) << "only the late chunk fails";
        continue;
      }
      ASSERT_EQ(v.state, StreamEntryState::kReady);
      EXPECT_NE(i, kSlow) << "the late chunk reached the consumer";
      EXPECT_EQ(view.value()->Observe(v.slot).generation, v.generation);
      if (!SlotHolds(*view.value(), v.slot, stride, i)) wrong++;
      copied++;
      if (landed) {
        EXPECT_TRUE(view.value()->AckEntry(span->first_entry + i, span->tag));
      } else {
        waiting_ack.push_back(i);
      }
    }
    if (copied + failed < kChunks) view.value()->WaitWorkerBell(bell, std::chrono::milliseconds(5));
  }
  for (uint32_t i : waiting_ack) view.value()->AckEntry(span->first_entry + i, span->tag);
  EXPECT_EQ(copied, kChunks - 1);
  EXPECT_EQ(failed, 1u);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(view.value()->ObserveEntry(span->first_entry + kSlow).state, StreamEntryState::kFailed);
  EXPECT_GE(slow.held.load(), 1u) << "the slow chunk's read was never held: the test did not test anything";
  EXPECT_GE(slow.landed.load(), 1u);
  EXPECT_GT(rechecked, 0u);
  ASSERT_TRUE(WaitFinished(*pump, span->id));
  pump->Close(span->id);
  EXPECT_GE(e.Stats().timeouts, 1u);
  EXPECT_EQ(pump->stats().chunks_failed, 1u);
  EXPECT_EQ(pump->stats().chunks_loaded, kChunks - 1);
  // A late read is not damage: the entry stays on disk.
  EXPECT_EQ(e.Lookup(Key(kSlow)), ChunkLocation::kDisk);
  EXPECT_EQ(e.Stats().corrupt_entries, 0u);
  // No slot stays pinned or held by the failed read.
  EXPECT_TRUE(EverySlotCanBeHad(e, 1000)) << "a slot stayed held after the stream closed";
  EXPECT_EQ(e.Stats().pool_slots_in_use, 0u);
  const uint64_t timeouts = e.Stats().timeouts;

  // The disk is healthy again: the same keys stream through, every chunk byte for byte.
  slow.on = false;
  auto again = pump->OpenLoad(Keys(0, kChunks), 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->first_entry, span->first_entry);  // the board range was given back
  uint32_t copied2 = 0, wrong2 = 0, failed2 = 0;
  std::vector<bool> done(kChunks, false);
  const auto start2 = std::chrono::steady_clock::now();
  while (copied2 + failed2 < kChunks && Since(start2) < 60) {
    const uint32_t bell = view.value()->WorkerBell();
    for (uint32_t i = 0; i < kChunks; ++i) {
      const StreamEntryView v = view.value()->ObserveEntry(again->first_entry + i);
      if (done[i] || v.tag != again->tag || v.state == StreamEntryState::kWaiting) continue;
      done[i] = true;
      if (v.state != StreamEntryState::kReady) {
        failed2++;
        continue;
      }
      if (!SlotHolds(*view.value(), v.slot, stride, i)) wrong2++;
      copied2++;
      EXPECT_TRUE(view.value()->AckEntry(again->first_entry + i, again->tag));
    }
    if (copied2 + failed2 < kChunks) view.value()->WaitWorkerBell(bell, std::chrono::milliseconds(5));
  }
  EXPECT_EQ(copied2, kChunks);
  EXPECT_EQ(failed2, 0u);
  EXPECT_EQ(wrong2, 0u);
  ASSERT_TRUE(WaitFinished(*pump, again->id));
  pump->Close(again->id);
  EXPECT_TRUE(EverySlotCanBeHad(e, 2000));
  EXPECT_EQ(e.Stats().pool_slots_in_use, 0u);
  std::printf(
      "stream deadline (%s, %u reactors): %u chunks, op_timeout_ms %u, chunk %u's read held %u time(s) "
      "and let through %.1f s past its deadline (%u landed); failed entry at %.2f s, %u chunks copied and "
      "%u re-checked after the late read landed, wrong %u; timeouts %llu; again with a healthy disk: %u of "
      "%u copied, wrong %u\n",
      GetParam() == IoBackend::kUring ? "io_uring" : "posix", e.reactors(), kChunks, o.op_timeout_ms, kSlow,
      slow.held.load(), slow.late_ns / 1e9, slow.landed.load(), failed_at_s, copied, rechecked, wrong,
      (unsigned long long)timeouts, copied2, kChunks, wrong2);
  pump.reset();
}

INSTANTIATE_TEST_SUITE_P(Backends, StreamDeadline, ::testing::Values(IoBackend::kUring, IoBackend::kPosix),
                         [](const auto& info) { return info.param == IoBackend::kUring ? "Uring" : "Posix"; });

// --- A consumer process killed mid-stream -------------------------------------------------------------------------

// What a consumer process is told to do (over a pipe) and what it did (in shared memory the parent reads).
struct Command {
  uint32_t op = 0;  // 0: exit, 1: load (check and ack), 2: store (fill and ack)
  uint32_t first_entry = 0;
  uint32_t count = 0;
  uint32_t tag = 0;
  uint32_t ack_limit = UINT32_MAX;  // acks this many chunks, then copies on without acking until it is killed
  uint32_t first_key = 0;           // key index of entry 0
  uint64_t stride = 0;
  char pool[128] = {};
};

struct Shared {
  std::atomic<uint32_t> acked{0};
  std::atomic<uint32_t> copied{0};  // loads checked, or stores filled whole
  std::atomic<uint32_t> wrong{0};
  std::atomic<uint32_t> failed{0};
  std::atomic<uint32_t> skipped{0};
  std::atomic<uint32_t> partial{0};   // entries the consumer was still copying (not acked) past its ack limit
  std::atomic<uint32_t> finished{0};  // commands done
};

// The consumer process: maps the pool by name, serves commands until told to exit. Forked before the engine
// exists (a single-threaded parent), so it may allocate freely.
[[noreturn]] void ConsumerMain(int cmd_fd, Shared* sh) {
  std::unique_ptr<StagingPool> pool;
  Command cmd;
  while (read(cmd_fd, &cmd, sizeof(cmd)) == static_cast<ssize_t>(sizeof(cmd)) && cmd.op != 0) {
    if (!pool) {
      auto p = StagingPool::Attach(cmd.pool);
      if (!p.ok()) _exit(3);
      pool = std::move(p.value());
    }
    sh->acked = sh->copied = sh->wrong = sh->failed = sh->skipped = sh->partial = 0;
    std::vector<uint8_t> settled(cmd.count, 0);  // 1: done, 2: being copied past the ack limit
    uint32_t left = cmd.count;
    const auto start = std::chrono::steady_clock::now();
    while (left > 0 && Since(start) < 120) {
      const uint32_t bell = pool->WorkerBell();
      for (uint32_t i = 0; i < cmd.count; ++i) {
        if (settled[i] != 0) continue;
        const StreamEntryView v = pool->ObserveEntry(cmd.first_entry + i);
        if (v.tag != cmd.tag || v.state == StreamEntryState::kWaiting) continue;
        if (v.state == StreamEntryState::kFailed || v.state == StreamEntryState::kSkipped) {
          (v.state == StreamEntryState::kFailed ? sh->failed : sh->skipped)++;
          settled[i] = 1;
          left--;
          continue;
        }
        const uint64_t key = cmd.first_key + i;
        if (sh->acked.load() >= cmd.ack_limit) {
          // Past the limit: start the copy (a load reads the slot, a store writes half of the chunk's blocks)
          // and never finish it; the parent kills the process in the middle.
          if (cmd.op == 1) {
            (void)SlotHolds(*pool, v.slot, cmd.stride, key);
          } else {
            FillSlot(*pool, v.slot, cmd.stride, key, kBlocks / 2);
          }
          settled[i] = 2;
          sh->partial++;
          continue;
        }
        if (cmd.op == 1) {
          if (!SlotHolds(*pool, v.slot, cmd.stride, key)) sh->wrong++;
        } else {
          FillSlot(*pool, v.slot, cmd.stride, key, kBlocks);
        }
        sh->copied++;
        if (pool->AckEntry(cmd.first_entry + i, cmd.tag)) sh->acked++;
        settled[i] = 1;
        left--;
      }
      if (left > 0) pool->WaitWorkerBell(bell, std::chrono::milliseconds(5));
    }
    sh->finished++;
  }
  _exit(0);
}

struct Consumer {
  pid_t pid = -1;
  int cmd_fd = -1;
  Shared* sh = nullptr;

  void Start() {
    sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(sh, MAP_FAILED);
    new (sh) Shared();
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[1]);
      ConsumerMain(fds[0], sh);
    }
    close(fds[0]);
    cmd_fd = fds[1];
  }
  void Send(uint32_t op, const StreamSpan& span, uint32_t ack_limit, uint32_t first_key, uint64_t stride,
            const std::string& pool) {
    Command c;
    c.op = op;
    c.first_entry = span.first_entry;
    c.count = span.count;
    c.tag = span.tag;
    c.ack_limit = ack_limit;
    c.first_key = first_key;
    c.stride = stride;
    std::snprintf(c.pool, sizeof(c.pool), "%s", pool.c_str());
    ASSERT_EQ(write(cmd_fd, &c, sizeof(c)), static_cast<ssize_t>(sizeof(c)));
  }
  // Kills the process with SIGKILL; true when it died of it (it had not exited).
  bool Kill() {
    if (pid <= 0) return false;
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  // Tells the process to exit; true when it exited with 0.
  bool Exit() {
    if (pid <= 0) return false;
    Command c;  // op 0
    (void)!write(cmd_fd, &c, sizeof(c));
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  ~Consumer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (cmd_fd >= 0) close(cmd_fd);
    if (sh != nullptr) munmap(sh, sizeof(Shared));
  }
};

template <typename F>
bool WaitFor(F done, double seconds = 30) {
  const auto start = std::chrono::steady_clock::now();
  while (Since(start) < seconds) {
    if (done()) return true;
    usleep(1000);
  }
  return done();
}

class KilledConsumer : public ::testing::Test {
 protected:
  void SetUp() override {
    // Both consumer processes first, while this process has no other thread.
    killed_.Start();
    survivor_.Start();
    o_ = Options(dir_.path());
    o_.pool_bytes = kSlots * kChunkFileBytes;
    o_.demand_reserve_slots = 1;
    o_.op_timeout_ms = 60000;
    auto e = Engine::Open(o_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_.engine = std::move(e.value());
    auto mine = StagingPool::Attach(engine_->pool_name());
    ASSERT_TRUE(mine.ok());
    StreamOptions so;
    so.max_window = 8;
    so.max_retries = 3;
    pump_ = std::make_unique<StreamPump>(engine_.engine.get(), std::move(mine.value()), so);
    // The tests' own stores and loads go through the same pump (a pool's stream board has one owner).
    auto jobs = JobClient::Create(engine_.engine.get(), nullptr, {}, pump_.get());
    ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
    engine_.jobs = std::move(jobs).value();
  }
  void TearDown() override {
    engine_.jobs.reset();
    pump_.reset();
    engine_.reset();
  }

  test::TempDir dir_;
  EngineOptions o_;
  Consumer killed_, survivor_;
  test::JobEngine engine_;  // its jobs go through pump_
  std::unique_ptr<StreamPump> pump_;
};

TEST_F(KilledConsumer, OfALoadStreamTheOwnersCloseReleasesEveryPinAndTheKeysStreamAgainToAnotherProcess) {
  constexpr uint32_t kChunks = 12, kAcked = 5;
  test::JobEngine& e = engine_;
  for (uint64_t i = 0; i < kChunks; ++i) ASSERT_TRUE(StoreOne(e, i).ok()) << i;
  auto span = pump_->OpenLoad(Keys(0, kChunks), 1);
  ASSERT_TRUE(span.ok()) << span.status().ToString();
  killed_.Send(1, *span, kAcked, 0, e->block_stride(), e->pool_name());
  // The consumer acked 5 chunks; the stream refilled its window (4 slots) with chunks 5-8, pinned and published,
  // and the consumer is copying them when it is killed.
  ASSERT_TRUE(WaitFor([&] { return killed_.sh->acked.load() == kAcked; })) << killed_.sh->acked.load();
  ASSERT_TRUE(WaitFor([&] {
    auto p = pump_->Progress(span->id);
    return p.ok() && p->published == kAcked + kSlots && p->done == kAcked;
  }));
  ASSERT_TRUE(WaitFor([&] { return killed_.sh->partial.load() == kSlots; }));
  EXPECT_EQ(killed_.sh->wrong.load(), 0u);
  // The pins hold while the stream is open: the pool has no slot to give (what the check after Close relies on).
  EXPECT_EQ(e->ReserveForStore(Keys(1000, kSlots)).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(killed_.Kill()) << "the consumer was not killed by SIGKILL";
  usleep(50 * 1000);
  auto p = pump_->Progress(span->id);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->done, kAcked) << "a chunk finished without its consumer";
  EXPECT_FALSE(p->finished);
  const uint32_t published_at_kill = p->published;

  // The request ends (finished or aborted): the owner closes its stream.
  pump_->Close(span->id);
  EXPECT_EQ(pump_->stats().open, 0u);
  EXPECT_TRUE(EverySlotCanBeHad(*e, 1000)) << "a pin of the killed consumer's stream outlived the stream";
  EXPECT_EQ(e->Stats().pool_slots_in_use, 0u);

  // Another consumer process streams the same keys: the board range and the pool are reused, every byte right.
  auto again = pump_->OpenLoad(Keys(0, kChunks), 1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->first_entry, span->first_entry);
  EXPECT_NE(again->tag, span->tag);
  survivor_.Send(1, *again, UINT32_MAX, 0, e->block_stride(), e->pool_name());
  ASSERT_TRUE(WaitFor([&] { return survivor_.sh->finished.load() == 1; }, 60));
  EXPECT_EQ(survivor_.sh->copied.load(), kChunks);
  EXPECT_EQ(survivor_.sh->acked.load(), kChunks);
  EXPECT_EQ(survivor_.sh->failed.load(), 0u);
  EXPECT_EQ(survivor_.sh->wrong.load(), 0u);
  ASSERT_TRUE(WaitFinished(*pump_, again->id));
  pump_->Close(again->id);
  EXPECT_TRUE(EverySlotCanBeHad(*e, 2000));
  EXPECT_EQ(e->Stats().pool_slots_in_use, 0u);
  EXPECT_TRUE(survivor_.Exit());
  std::printf(
      "killed consumer, load stream: %u chunks through %u slots; consumer SIGKILLed after %u acks with %u "
      "chunks published (%u pinned, being copied); after close every slot free; a second consumer process "
      "copied %u of %u chunks, wrong %u\n",
      kChunks, kSlots, kAcked, published_at_kill, published_at_kill - kAcked, survivor_.sh->copied.load(), kChunks,
      survivor_.sh->wrong.load());
}

TEST_F(KilledConsumer, OfAStoreStreamTheOwnersCloseStoresWhatWasAckedAndNothingHalfWritten) {
  constexpr uint32_t kChunks = 8, kAcked = 3, kFirst = 200;
  test::JobEngine& e = engine_;
  auto span = pump_->OpenStore(Keys(kFirst, kChunks), 1);
  ASSERT_TRUE(span.ok()) << span.status().ToString();
  killed_.Send(2, *span, kAcked, kFirst, e->block_stride(), e->pool_name());
  // The consumer filled and acked 3 chunks (committed: written and published); the stream granted the next 4 slots
  // and the consumer wrote half of each when it is killed.
  ASSERT_TRUE(WaitFor([&] { return killed_.sh->acked.load() == kAcked; }));
  ASSERT_TRUE(WaitFor([&] {
    auto p = pump_->Progress(span->id);
    return p.ok() && p->published == kAcked + kSlots;
  }));
  ASSERT_TRUE(WaitFor([&] { return killed_.sh->partial.load() == kSlots; }));
  ASSERT_TRUE(killed_.Kill());
  const uint32_t published_at_kill = pump_->Progress(span->id)->published;
  pump_->Close(span->id);
  EXPECT_EQ(pump_->stats().open, 0u);
  // The acked chunks are stored (their writes may still be under way when the stream closes), byte for byte.
  auto published = [&](uint64_t first, uint64_t n) {
    for (uint64_t i = first; i < first + n; ++i) {
      if (!Exists(ChunkFile(o_, Key(i)))) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor([&] { return published(kFirst, kAcked); })) << "an acked chunk was not stored";
  for (uint64_t i = kFirst; i < kFirst + kAcked; ++i) {
    std::vector<uint8_t> got;
    Status s = LoadOne(e, Key(i), &got);
    ASSERT_TRUE(s.ok()) << "acked chunk " << i << ": " << s.ToString();
    EXPECT_EQ(got, ContentFor(i)) << "acked chunk " << i;
  }
  // Nothing of the others: not on disk, not resident, not being written; a load misses and leaves its destination.
  uint32_t half_written_stored = 0;
  for (uint64_t i = kFirst + kAcked; i < kFirst + kChunks; ++i) {
    EXPECT_EQ(e->Lookup(Key(i)), ChunkLocation::kAbsent) << "chunk " << i;
    std::vector<uint8_t> got;
    Status s = LoadOne(e, Key(i), &got);
    EXPECT_FALSE(s.ok()) << "an unacked chunk was stored: " << i;
    EXPECT_TRUE(AllSentinel(got));
    half_written_stored += Exists(ChunkFile(o_, Key(i)));
  }
  EXPECT_EQ(half_written_stored, 0u);
  EXPECT_TRUE(EverySlotCanBeHad(*e, 1000)) << "a slot of the killed consumer's store stream stayed held";
  EXPECT_EQ(e->Stats().pool_slots_in_use, 0u);

  // Another consumer process stores the same keys: the acked ones are skipped, the rest written whole.
  auto again = pump_->OpenStore(Keys(kFirst, kChunks), 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->first_entry, span->first_entry);
  survivor_.Send(2, *again, UINT32_MAX, kFirst, e->block_stride(), e->pool_name());
  ASSERT_TRUE(WaitFor([&] { return survivor_.sh->finished.load() == 1; }, 60));
  EXPECT_EQ(survivor_.sh->skipped.load(), kAcked);
  EXPECT_EQ(survivor_.sh->acked.load(), kChunks - kAcked);
  ASSERT_TRUE(WaitFinished(*pump_, again->id));
  pump_->Close(again->id);
  ASSERT_TRUE(WaitFor([&] { return published(kFirst, kChunks); }));
  uint32_t loaded = 0;
  for (uint64_t i = kFirst; i < kFirst + kChunks; ++i) {
    std::vector<uint8_t> got;
    Status s = LoadOne(e, Key(i), &got);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    EXPECT_EQ(got, ContentFor(i)) << i;
    loaded += got == ContentFor(i);
  }
  EXPECT_TRUE(EverySlotCanBeHad(*e, 2000));
  EXPECT_EQ(e->Stats().pool_slots_in_use, 0u);
  EXPECT_EQ(e->Stats().corrupt_entries, 0u);
  EXPECT_TRUE(survivor_.Exit());
  std::printf(
      "killed consumer, store stream: %u chunks through %u slots; consumer SIGKILLed after %u acks with "
      "%u slots granted (%u half filled); after close: %u stored byte for byte, %u half-written stored (0 "
      "expected), every slot free; a second consumer process skipped %u and stored %u; %u of %u load back "
      "byte for byte\n",
      kChunks, kSlots, kAcked, published_at_kill, published_at_kill - kAcked, kAcked, half_written_stored,
      survivor_.sh->skipped.load(), survivor_.sh->acked.load(), loaded, kChunks);
}

}  // namespace
}  // namespace kvtier::rel
