// Edges of the engine's limits: closes are never cancelled by a deadline (I4: a cancelled close would leak its fd),
// a tree rescan indexes only files of exactly a chunk's size (M1), never more reactors than io_depth (I1, S1), a
// budget at the top of its range (C1), a large commit of resident slots starts no more chunks than a job's
// allowance (S1), and writes hold no more than their share of the places at the disk (I1).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "policy/job_client.h"
#include "support/engine_options.h"
#include "support/keys.h"
#include "support/temp_dir.h"
#include "util/mutex.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 8192;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 11, 0x3c); }

EngineOptions Options(const std::string& root) {
  EngineOptions o = test::BaseOptions(root, "limits", 64, kBlocks, kBlockBytes);
  o.pool_bytes = 16 * (kHeaderBytes + kBlocks * kBlockBytes);
  o.io_depth = 4;
  return o;
}

JobResult StoreKeys(Engine& e, uint64_t first, uint64_t n) {
  std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(kBlocks * kBlockBytes, 0x6b));
  std::vector<ChunkTransfer> t;
  for (uint64_t i = 0; i < n; ++i) {
    t.push_back(
        ChunkTransfer{Key(first + i), 0, 0, {{0, reinterpret_cast<uint64_t>(data[i].data()), kBlocks * kBlockBytes}}});
  }
  // Through a JobClient, the slot path (docs/architecture.md, "One data path").
  auto client = JobClient::Create(&e);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return JobResult{};
  auto id = (*client)->SubmitStore(std::move(t));
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return JobResult{};
  auto r = (*client)->Wait(id.value(), 30000);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : JobResult{};
}

size_t OpenFds() {
  size_t n = 0;
  for (auto& p : std::filesystem::directory_iterator("/proc/self/fd")) n += p.exists() ? 1 : 0;
  return n;
}

// A close slower than any deadline (a FUSE or NFS flush) is not cancelled: the close of a named temporary before its
// link completes, the store publishes, and no fd is left open. (Cancelled, the close never ran: the fd leaked and
// the store failed with a timeout.)
TEST(Limits, ACloseIsNeverCancelledByItsDeadline) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.anonymous_temporaries = false;  // named temporaries: closed before their link (M1)
  o.op_timeout_ms = 200;
  const size_t fds_before = OpenFds();
  {
    auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
    ASSERT_TRUE(inner.ok());
    auto fault = std::make_unique<FaultInjectingEngine>(std::move(inner.value()));
    fault->AddRule(FaultRule::DelayPastDeadline(OpCode::kClose));
    auto e = EngineImpl::Create(o, std::move(fault));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    JobResult r = StoreKeys(**e, 0, 3);
    EXPECT_TRUE(r.all_ok()) << (r.chunks.empty() ? "" : r.chunks[0].status.ToString());
    for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE((*e)->Stored(Key(i))) << i;  // published (Lookup says kDram)
  }
  EXPECT_EQ(OpenFds(), fds_before) << "an fd was left open";
}

// M1: an engine opening on a tree indexes only files of exactly a chunk's size (another host's entry whose data is
// not visible here yet is shorter); the others are not counted as entries or bytes.
TEST(Limits, ARescanIndexesOnlyFilesOfAChunksSize) {
  test::TempDir dir;
  {
    auto e = Engine::Open(Options(dir.path()));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_TRUE(StoreKeys(**e, 0, 3).all_ok());
  }
  std::string file;
  for (auto& p : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (p.path().filename().string().find(Key(1).Hex()) != std::string::npos) file = p.path();
  }
  ASSERT_FALSE(file.empty());
  ASSERT_EQ(truncate(file.c_str(), kHeaderBytes), 0);
  auto e = Engine::Open(Options(dir.path()));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->Stats().disk_entries, 2u);
  EXPECT_EQ((*e)->Stats().disk_bytes_used, 2 * ChunkFileBytes(kBlocks, kBlockBytes));
}

// I1/S1: each reactor keeps at least one chunk at the disk, so there are never more reactors than io_depth: auto
// (at least 2) and an explicit count alike.
TEST(Limits, NeverMoreReactorsThanIoDepth) {
  EngineOptions o = Options("/unused");
  o.io_depth = 1;
  o.reactors = 0;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 1u);
  o.reactors = 8;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 1u);
  o.io_depth = 4;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 4u);
  o.reactors = 3;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 3u);
}

// C1: a budget at the top of its range with a high watermark of 1 stores and evicts nothing (the watermarks in bytes
// saturate instead of overflowing; UBSan in the asan build checks the conversion).
TEST(Limits, ABudgetAtTheTopOfItsRangeHoldsEverything) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.disk_budget_bytes = UINT64_MAX;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(StoreKeys(**e, 0, 4).all_ok());
  EXPECT_EQ((*e)->Stats().evictions, 0u);
  EXPECT_EQ((*e)->Stats().disk_entries, 4u);
}

// A real I/O engine that holds every write while its gate is closed and counts the opens it is given.
class WriteGate final : public IoEngine {
 public:
  // permits (optional): writes let through one by one while the gate is closed, each taking one.
  WriteGate(std::unique_ptr<IoEngine> inner, std::atomic<bool>* open, std::atomic<uint64_t>* opens,
            std::atomic<int64_t>* permits = nullptr)
      : inner_(std::move(inner)), open_(open), opens_(opens), permits_(permits) {}
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight() + static_cast<uint32_t>(held_.size()); }
  int Submit(const IoOp& op) override {
    if (op.code == OpCode::kOpenAt) (*opens_)++;
    if (op.code == OpCode::kWrite && !open_->load() && !TakePermit()) {
      held_.push_back(op);
      return 0;
    }
    return inner_->Submit(op);
  }
  int Flush() override {
    Release();
    return inner_->Flush();
  }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    Release();
    inner_->Flush();
    const int64_t wait =
        held_.empty() ? timeout_ns : (timeout_ns < 0 ? 2000000 : std::min<int64_t>(timeout_ns, 2000000));
    return inner_->Reap(out, wait);
  }
  void Wake() override { inner_->Wake(); }

 private:
  bool TakePermit() {
    if (permits_ == nullptr) return false;
    int64_t n = permits_->load();
    while (n > 0) {
      if (permits_->compare_exchange_weak(n, n - 1)) return true;
    }
    return false;
  }
  void Release() {
    while (!held_.empty() && (open_->load() || TakePermit())) {
      if (inner_->Submit(held_.front()) != 0) {
        if (!open_->load() && permits_ != nullptr) (*permits_)++;  // not taken: the permit stays
        return;
      }
      held_.pop_front();
    }
  }
  std::unique_ptr<IoEngine> inner_;
  std::atomic<bool>* open_;
  std::atomic<uint64_t>* opens_;
  std::atomic<int64_t>* permits_;
  std::deque<IoOp> held_;
};

// Records every write (fd, offset, length) and the most writes at the disk at once on one fd.
class WriteRecorder final : public IoEngine {
 public:
  struct Write {
    int fd;
    uint64_t offset;
    uint32_t len;
  };
  explicit WriteRecorder(std::unique_ptr<IoEngine> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight(); }
  int Submit(const IoOp& op) override {
    if (op.code == OpCode::kWrite) {
      MutexLock lock(mu_);
      writes_.push_back({op.fd, op.offset, op.len});
      at_disk_[op.user_data] = op.fd;
      uint32_t n = 0;
      for (const auto& [id, fd] : at_disk_) n += fd == op.fd;
      most_on_one_fd_ = std::max(most_on_one_fd_, n);
    }
    return inner_->Submit(op);
  }
  int Flush() override { return inner_->Flush(); }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    const size_t before = out->size();
    const int n = inner_->Reap(out, timeout_ns);
    MutexLock lock(mu_);
    for (size_t i = before; i < out->size(); ++i) at_disk_.erase((*out)[i].user_data);
    return n;
  }
  void Wake() override { inner_->Wake(); }
  std::vector<Write> writes() {
    MutexLock lock(mu_);
    return writes_;
  }
  uint32_t most_on_one_fd() {
    MutexLock lock(mu_);
    return most_on_one_fd_;
  }

 private:
  std::unique_ptr<IoEngine> inner_;
  Mutex mu_;
  std::vector<Write> writes_ GUARDED_BY(mu_);
  std::map<uint64_t, int> at_disk_ GUARDED_BY(mu_);  // user_data -> fd of the writes submitted and not reaped
  uint32_t most_on_one_fd_ GUARDED_BY(mu_) = 0;
};

// I1: a store writes its chunk in pieces of write_piece_bytes, one at the disk at a time, in order from the slot's
// start (the last piece the rest); 0 writes each chunk at once. The entries load back verified either way.
TEST(WritePieces, AChunkIsWrittenInPiecesOneAtTheDiskAtATime) {
  const uint64_t slot = kHeaderBytes + kBlocks * kBlockBytes;  // 4 KiB + 4 x 8 KiB
  for (const uint64_t piece : {uint64_t{8192}, uint64_t{10000}, uint64_t{0}}) {
    SCOPED_TRACE("write_piece_bytes " + std::to_string(piece));
    test::TempDir dir;
    EngineOptions o = Options(dir.path());
    o.write_piece_bytes = piece;
    auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
    ASSERT_TRUE(inner.ok());
    auto rec = std::make_unique<WriteRecorder>(std::move(inner.value()));
    WriteRecorder* r = rec.get();
    {
      auto made = EngineImpl::Create(o, std::move(rec));
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      ASSERT_TRUE(StoreKeys(**made, 0, 3).all_ok());
      const uint64_t want_piece = piece == 0 ? slot : (piece & ~uint64_t{4095});  // 10000 -> 8192
      std::map<int, uint64_t> next;                                               // fd -> where its next write starts
      for (const auto& w : r->writes()) {
        if (w.offset != 0) {  // offset 0: a chunk's first piece (an fd may be reused by the next chunk)
          EXPECT_EQ(w.offset, next[w.fd]) << "a chunk's pieces go in order";
        }
        EXPECT_EQ(w.len, std::min(want_piece, slot - w.offset));
        next[w.fd] = w.offset + w.len;
      }
      EXPECT_EQ(r->writes().size(), 3 * ((slot + want_piece - 1) / want_piece));
      EXPECT_EQ(r->most_on_one_fd(), 1u) << "one piece of a chunk at the disk at a time";
    }
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (uint64_t i = 0; i < 3; ++i) {
      PromoteResult p = (*e)->Promote(Key(i), false);
      for (int k = 0; k < 5000 && p.state == PromoteState::kPending; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        p = (*e)->Promote(Key(i), false);
      }
      EXPECT_EQ(p.state, PromoteState::kReady) << "chunk " << i << " loads back verified";
    }
    EXPECT_EQ((*e)->Stats().corrupt_entries, 0u);
  }
}

// An engine at io_depth 2 (one reactor: the I/O engine is given) whose writes are held until open_ is set.
class GatedCommits : public ::testing::Test {
 protected:
  void SetUp() override {
    o_ = Options(dir_.path());
    o_.io_depth = 2;
    o_.pool_bytes = 24 * (kHeaderBytes + kBlocks * kBlockBytes);
    auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
    ASSERT_TRUE(inner.ok());
    auto e = EngineImpl::Create(o_, std::make_unique<WriteGate>(std::move(inner.value()), &open_, &opens_));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    e_ = std::move(e.value());
  }
  void TearDown() override {
    open_ = true;  // the held writes go out, so the engine can stop
    e_.reset();
  }
  void Commit(const std::vector<ChunkKey>& keys) {
    auto refs = e_->ReserveForStore(keys);
    ASSERT_TRUE(refs.ok()) << refs.status().ToString();
    e_->CommitStore(keys, true);
  }
  // The temporaries opened while the writes are held: once 4 are, a while longer for more to start, were they
  // allowed to.
  uint64_t OpensWhileHeld() {
    for (int i = 0; i < 2000 && opens_.load() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return opens_.load();
  }
  // Lets the writes go and waits until `commits` stores completed and every key is an entry.
  void ReleaseAndExpectStored(uint64_t commits, const std::vector<ChunkKey>& keys) {
    open_ = true;
    for (int i = 0; i < 20000; ++i) {
      bool all = e_->Stats().stores_completed >= commits && e_->Stats().disk_entries == keys.size();
      for (const ChunkKey& k : keys) all = all && e_->Lookup(k) != ChunkLocation::kAbsent;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(e_->Stats().stores_completed, commits);
    EXPECT_EQ(e_->Stats().disk_entries, keys.size());
  }

  test::TempDir dir_;
  EngineOptions o_;
  std::atomic<bool> open_{false};
  std::atomic<uint64_t> opens_{0};
  std::unique_ptr<Engine> e_;  // last: destroyed before what the WriteGate points to
};

// S1, I1: a commit of many resident slots (vLLM's complete_store of a long request) starts at most the job's
// allowance (2 x io_depth) of them: each is checksummed and opened as earlier ones reach the disk, not all before the
// first write goes out. With the writes held, no more than 4 temporaries are opened for 12 chunks at io_depth 2.
TEST_F(GatedCommits, ALargeCommitOfResidentSlotsStartsAtMostTheJobsAllowance) {
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 12; ++i) keys.push_back(Key(100 + i));
  Commit(keys);
  EXPECT_LE(OpensWhileHeld(), 2u * o_.io_depth) << "chunks started beyond the job's allowance";
  ReleaseAndExpectStored(1, keys);
}

// I1, S1: many small commits (vLLM commits each request's chunks every step) are each a job with an allowance of its
// own; the reactor still starts at most 2 x its depth committed chunks over all of them, so they are checksummed as
// the disk takes them rather than all at once ahead of it. With the writes held, six commits of two chunks at
// io_depth 2 open no more than 4 temporaries; each commit's own allowance would have let all 12 start.
TEST_F(GatedCommits, ManySmallCommitsStartNoMoreThanTheReactorsAllowanceBetweenThem) {
  std::vector<ChunkKey> all;
  for (uint64_t c = 0; c < 6; ++c) {
    std::vector<ChunkKey> keys{Key(200 + 2 * c), Key(201 + 2 * c)};
    Commit(keys);
    all.insert(all.end(), keys.begin(), keys.end());
  }
  EXPECT_LE(OpensWhileHeld(), 2u * o_.io_depth) << "committed chunks started beyond the reactor's allowance";
  ReleaseAndExpectStored(6, all);
}

// An engine with one reactor (its I/O engine is given) whose writes are held at the device (WriteGate; permits let
// them through one by one), Key(0) on disk but not in its DRAM tier, and a commit of Key(10) and Key(11) whose
// temporaries are open: their writes are at the disk, or queued behind the one that is.
class LoadBesideHeldWrites : public ::testing::Test {
 protected:
  void Start(uint32_t io_depth, uint32_t max_writes_at_disk) {
    o_ = Options(dir_.path());
    o_.io_depth = io_depth;
    o_.max_writes_at_disk = max_writes_at_disk;
    o_.pool_bytes = 24 * (kHeaderBytes + kBlocks * kBlockBytes);
    {
      auto plain = Engine::Open(o_);
      ASSERT_TRUE(plain.ok()) << plain.status().ToString();
      ASSERT_TRUE(StoreKeys(**plain, 0, 1).all_ok());
    }
    auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
    ASSERT_TRUE(inner.ok());
    auto made =
        EngineImpl::Create(o_, std::make_unique<WriteGate>(std::move(inner.value()), &open_, &opens_, &permits_));
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    e_ = std::move(made.value());
    std::vector<ChunkKey> keys{Key(10), Key(11)};
    ASSERT_TRUE(e_->ReserveForStore(keys).ok());
    e_->CommitStore(keys, true);
    for (int i = 0; i < 2000 && opens_.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(opens_.load(), 2u) << "both temporaries are open";
  }

  // Promotes Key(0) and asks again until it is no longer pending (at most 5 s).
  PromoteState LoadKey0(std::atomic<int64_t>* then_permit = nullptr) {
    PromoteResult p = e_->Promote(Key(0), /*speculative=*/false);
    if (then_permit != nullptr) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the load is queued behind the writes
      (*then_permit)++;
    }
    for (int i = 0; i < 5000 && p.state == PromoteState::kPending; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      p = e_->Promote(Key(0), false);
    }
    return p.state;
  }

  void OpenAndExpectStored() {
    open_ = true;
    for (int i = 0; i < 20000 && e_->Stats().stores_completed < 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(e_->Stats().stores_completed, 1u);
    EXPECT_TRUE(e_->Stored(Key(10)) && e_->Stored(Key(11)));
  }

  test::TempDir dir_;
  EngineOptions o_;
  std::atomic<bool> open_{false};
  std::atomic<uint64_t> opens_{0};
  std::atomic<int64_t> permits_{0};
  std::unique_ptr<Engine> e_;  // last: destroyed before what the WriteGate points to
};

// I1: the write-back of new entries holds at most max_writes_at_disk places at the disk, and the reads keep the
// others. At io_depth 2 (one reactor) and max_writes_at_disk 1, with the writes held at the device, one holds the
// write place, the other waits, and a load takes the second place and completes while the writes are still held
// (the default at io_depth 2 is the same bound). With max_writes_at_disk 2, the load waits for the writes.
TEST_F(LoadBesideHeldWrites, ALoadGoesAheadOfWritesWaitingForAPlace) {
  ASSERT_NO_FATAL_FAILURE(Start(/*io_depth=*/2, /*max_writes_at_disk=*/1));
  EXPECT_EQ(LoadKey0(), PromoteState::kReady) << "the load waited behind the held writes";
  EXPECT_EQ(e_->Stats().stores_completed, 0u) << "the writes were still held";
  OpenAndExpectStored();
}

// I1: a reactor's loads go ahead of the writes queued before them. At io_depth 1 (one reactor with one place at the
// disk, as each of the GPU box's 16 reactors has; no write bound), with one write at the disk and a second queued
// behind it, a load queued after both starts when the first write ends, before the second: it completes while the
// second write is held. Loads in admission order would wait for both writes.
TEST_F(LoadBesideHeldWrites, ALoadGoesAheadOfTheWritesQueuedBeforeIt) {
  ASSERT_NO_FATAL_FAILURE(Start(/*io_depth=*/1, /*max_writes_at_disk=*/0));
  EXPECT_EQ(LoadKey0(/*then_permit=*/&permits_), PromoteState::kReady) << "the load waited behind the second write";
  EXPECT_EQ(e_->Stats().stores_completed, 0u) << "the second write was still held";
  OpenAndExpectStored();
}

}  // namespace
}  // namespace kvtier
