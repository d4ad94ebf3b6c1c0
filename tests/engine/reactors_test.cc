// Several reactors (I1, docs/architecture.md "Threads and ownership"), driven through the job API as a client of the
// slot path (JobClient, "One data path"): each chunk of a job is a promotion placed on a reactor. A job whose
// chunks live on different reactors completes exactly once, when all of them have; misses are per chunk, in request
// order; identical chunks of two jobs share one read (X4, through the DRAM tier); a job's window of slots (S1) and
// the demand reserve (S2) hold across reactors; the reactor count is the option's, auto's or the test binary's
// default (KVTIER_TEST_REACTORS).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/engine_impl.h"
#include "reliability/reliability_util.h"
#include "support/job_engine.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

using rel::ContentFor;
using rel::kBlockBytes;
using rel::kBlocks;
using rel::kChunkFileBytes;
using rel::Key;

// A real I/O engine whose reads are held back (queued, not submitted) while its gate is closed. Reap counts its
// calls, so a test knows when the reactor has gone round its loop (and taken new commands) since some point.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<uint64_t> reads_held{0};
};
// Opens the gate when it goes out of scope (declared after the engine: a failed assertion never leaves the engine's
// destructor waiting for held reads).
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.open = true; }
};

class GatedEngine final : public IoEngine {
 public:
  GatedEngine(std::unique_ptr<IoEngine> inner, Gate* gate) : inner_(std::move(inner)), gate_(gate) {}
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight() + static_cast<uint32_t>(held_.size()); }
  int Submit(const IoOp& op) override {
    if (op.code == OpCode::kRead && !gate_->open.load()) {
      held_.push_back(op);
      gate_->reads_held++;
      return 0;
    }
    return inner_->Submit(op);
  }
  int Flush() override {
    Release();
    return inner_->Flush();
  }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    reaps++;
    Release();
    inner_->Flush();
    // While reads are held, come back often to notice the gate opening.
    const int64_t wait =
        held_.empty() ? timeout_ns : (timeout_ns < 0 ? 2000000 : std::min<int64_t>(timeout_ns, 2000000));
    return inner_->Reap(out, wait);
  }
  void Wake() override { inner_->Wake(); }

  std::atomic<uint64_t> reaps{0};

 private:
  void Release() {
    if (!gate_->open.load()) return;
    while (!held_.empty()) {
      if (inner_->Submit(held_.front()) != 0) return;  // ring full: the rest on the next call
      held_.pop_front();
    }
  }
  std::unique_ptr<IoEngine> inner_;
  Gate* gate_;
  std::deque<IoOp> held_;  // reactor thread only
};

// The host copy, held: copies are taken (Submit) and counted but end only once the gate opens, so the chunks they
// copy stay in their job's window meanwhile. Submit and Poll run on the JobClient's copy thread.
struct CopyGate {
  std::atomic<bool> open{false};
  std::atomic<uint64_t> copies_taken{0};
  std::mutex mu;
  std::function<void()> wakeup;  // the client's bell, rung when the gate opens
  void Open() {
    open = true;
    std::lock_guard<std::mutex> lock(mu);
    if (wakeup) wakeup();
  }
};
struct OpenCopiesOnExit {
  CopyGate& gate;
  ~OpenCopiesOnExit() { gate.Open(); }
};

class HeldCopier final : public DeviceCopier {
 public:
  explicit HeldCopier(CopyGate* gate) : gate_(gate) {}
  std::string_view name() const override { return "held"; }
  void SetWakeup(std::function<void()> wakeup) override {
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->wakeup = std::move(wakeup);
  }
  void Submit(std::vector<CopyTask> batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    gate_->copies_taken += batch.size();
    for (CopyTask& t : batch) held_.push_back(std::move(t));
  }
  void Poll(std::vector<CopyDone>* done) override {
    if (!gate_->open.load()) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (const CopyTask& t : held_) {
      for (const CopySegment& seg : t.segments) {
        void* host = reinterpret_cast<void*>(seg.address);
        if (t.direction == CopyDirection::kSlotToDevice) {
          std::memcpy(host, t.slot_data + seg.slot_offset, seg.bytes);
        } else {
          std::memcpy(t.slot_data + seg.slot_offset, host, seg.bytes);
        }
      }
      done->push_back(CopyDone{t.id, Status::Ok()});
    }
    held_.clear();
  }
  size_t pending() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

 private:
  CopyGate* gate_;
  mutable std::mutex mu_;
  std::vector<CopyTask> held_;
};

class ReactorsTest : public ::testing::Test {
 protected:
  EngineOptions Options(uint32_t reactors) {
    EngineOptions o = rel::Options(dir_.path());
    o.reactors = reactors;
    o.read_piece_bytes = 0;  // the gated reads below are counted one per chunk (read_pieces_test covers pieces)
    return o;
  }
  // Stores keys [0, n) with a plain engine.
  void StoreKeys(uint64_t n) {
    auto e = test::OpenWithJobs(Options(4));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(rel::StoreOne(e.value(), i).ok()) << i;
  }
  // An engine whose reactor r reads through a gate (every reactor when gated_reactor < 0), with a JobClient over it.
  test::JobEngine OpenGated(EngineOptions o, Gate* gate, int gated_reactor,
                            std::vector<GatedEngine*>* gated = nullptr) {
    auto e = EngineImpl::Create(o, [&](uint32_t r) -> std::unique_ptr<IoEngine> {
      IoEngineConfig cfg;
      cfg.depth = 64;
      auto inner = CreateIoEngine(cfg);
      if (!inner.ok()) return nullptr;
      if (gated_reactor >= 0 && r != static_cast<uint32_t>(gated_reactor)) return std::move(inner.value());
      auto g = std::make_unique<GatedEngine>(std::move(inner.value()), gate);
      if (gated) gated->push_back(g.get());
      return g;
    });
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return {};
    auto with = test::WithJobs(std::move(e).value());
    EXPECT_TRUE(with.ok()) << with.status().ToString();
    return with.ok() ? std::move(with).value() : test::JobEngine{};
  }
  static EngineImpl& Impl(Engine& e) { return static_cast<EngineImpl&>(e); }

  // Waits (bounded) until cond holds.
  template <typename F>
  static bool Eventually(F cond) {
    for (int i = 0; i < 30000; ++i) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return cond();
  }

  test::TempDir dir_;
};

TEST_F(ReactorsTest, TheCountIsTheOptionsOrAutosAndOneBehavesAsOne) {
  for (uint32_t n : {1u, 3u}) {
    auto e = Engine::Open(Options(n));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(Impl(*e.value()).reactors(), n);
    EXPECT_NE(e.value()->Describe().find("reactors " + std::to_string(n) + " (by option"), std::string::npos)
        << e.value()->Describe();
  }
  EngineOptions o = Options(0);
  const uint32_t resolved = EngineImpl::ResolveReactors(o);
  EXPECT_GE(resolved, 1u);
  EXPECT_LE(resolved, 8u);
  if (const char* n = getenv("KVTIER_TEST_REACTORS")) {
    EXPECT_EQ(resolved, std::min<uint32_t>(static_cast<uint32_t>(strtoul(n, nullptr, 10)), o.io_depth))
        << "the environment of the suite run did not reach the engine (tests/support/engine_defaults.cc)";
  } else {
    EXPECT_GE(resolved, 2u);  // auto spreads per-byte work over cores
  }
  // A test binary's default replaces auto, never the option (tests/support/engine_defaults.cc sets it from
  // KVTIER_TEST_REACTORS); the engine reads no environment itself.
  EngineImpl::SetTestDefaults({.reactors = 3, .read_piece_bytes = 0});
  std::string why;
  EXPECT_EQ(EngineImpl::ResolveReactors(o, &why), 3u);
  EXPECT_EQ(why, "the test binary's default");
  o.reactors = 2;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 2u);
  o.reactors = 0;
  const char* env = getenv("KVTIER_TEST_REACTORS");
  const char* pieces = getenv("KVTIER_TEST_READ_PIECE_BYTES");
  EngineImpl::SetTestDefaults({.reactors = env ? static_cast<uint32_t>(strtoul(env, nullptr, 10)) : 0u,
                               .read_piece_bytes = pieces ? strtoull(pieces, nullptr, 10) : 0u});
  o.reactors = kMaxReactors + 1;
  Status bad = o.Validate();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("reactors"), std::string::npos) << bad.ToString();
}

TEST_F(ReactorsTest, AJobSpanningReactorsCompletesOnceWhenItsLastChunkDoes) {
  constexpr uint64_t kKeys = 16;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 32;  // the job's window (2 x io_depth) and its reads at once (3/4 of it) take every chunk at once
  Gate gate;
  // Reactor 0's reads wait at the gate, every other reactor reads freely.
  constexpr uint32_t held_reactor = 0;
  auto e = OpenGated(o, &gate, static_cast<int>(held_reactor));
  OpenOnExit opener{gate};
  ASSERT_TRUE(e.jobs);

  std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  for (uint64_t i = 0; i < kKeys; ++i) req.push_back({Key(i), 0, 0, rel::Segments(dst[i], e->block_stride())});
  const uint64_t read_before = e->Stats().bytes_read;
  auto id = e.jobs->SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  // Every chunk on the other reactors is read, verified and copied: each chunk is loaded or held at the gate.
  ASSERT_TRUE(Eventually([&] { return e.jobs->stream_stats().chunks_loaded + gate.reads_held.load() == kKeys; }));
  // I1: each chunk's promotion goes to the reactor with the fewest unfinished chunks (ChunkPlacement), the first one of
  // an idle engine to reactor 0. The held reactor's chunks never finish, so it gets the first and at most its even
  // share (the others' chunks may finish, and leave them fewer, while the job's promotions are being placed).
  const uint64_t on_held = gate.reads_held.load();
  EXPECT_GE(on_held, 1u);
  EXPECT_LE(on_held, kKeys / 4);
  EXPECT_EQ(e->Stats().bytes_read - read_before, (kKeys - on_held) * kChunkFileBytes);
  // Unfinished: exactly the held reactor's share of the job. A chunk is counted loaded just before its reactor
  // finishes it (drops its placement), so the others' placements are awaited, not sampled.
  EXPECT_TRUE(Eventually([&] {
    uint64_t placed = 0;
    for (uint64_t i = 0; i < kKeys; ++i) placed += Impl(*e).PlacedReactor(Key(i)).has_value();
    return placed == on_held;
  }));
  EXPECT_EQ(Impl(*e).PlacedReactor(Key(0)), std::optional<uint32_t>(held_reactor));
  for (uint64_t i = 0; i < kKeys; ++i) {
    const std::optional<uint32_t> placed = Impl(*e).PlacedReactor(Key(i));
    if (!placed) continue;  // loaded: its bytes are compared once the job is reported (the report orders the copy)
    EXPECT_EQ(*placed, held_reactor) << i;
    EXPECT_TRUE(rel::AllSentinel(dst[i])) << "chunk " << i << " copied before its read";
  }
  // ... but the job is not done while the held reactor's chunks are not.
  EXPECT_TRUE(e.jobs->PollCompleted().empty());
  auto early = e.jobs->Wait(id.value(), 50);
  EXPECT_EQ(early.status().code(), StatusCode::kTimedOut);

  gate.open = true;
  auto r = e.jobs->Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->all_ok());
  ASSERT_EQ(r->chunks.size(), kKeys);
  for (uint64_t i = 0; i < kKeys; ++i) {
    EXPECT_EQ(r->chunks[i].key, Key(i)) << "outcomes in request order";
    EXPECT_EQ(dst[i], ContentFor(i)) << "chunk " << i;
  }
  EXPECT_EQ(r->bytes, kKeys * kBlocks * e->block_stride());
  EXPECT_EQ(e->Stats().bytes_read - read_before, kKeys * kChunkFileBytes);  // each chunk read once
  // Reported exactly once, as one stream.
  EXPECT_TRUE(e.jobs->PollCompleted().empty());
  EXPECT_EQ(e.jobs->Wait(id.value(), 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e.jobs->stream_stats().loads_opened, 1u);
  EXPECT_EQ(e.jobs->stream_stats().chunks_loaded, kKeys);
}

// Keys never stored miss before any reactor (Promote finds no entry); damaged ones on the reactor their promotion
// was placed on (verification, K1). Either way the miss is that chunk's, in its place in the request.
TEST_F(ReactorsTest, MissesOnSomeReactorsAreReportedPerChunkInRequestOrder) {
  StoreKeys(12);
  for (uint64_t k = 8; k < 12; ++k) {  // a payload byte of keys 8..11
    const std::string file = rel::ChunkFile(Options(4), Key(k));
    const int fd = open(file.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << file;
    uint8_t b = 0;
    ASSERT_EQ(pread(fd, &b, 1, 4096 + 5), 1);
    b ^= 0x10;
    ASSERT_EQ(pwrite(fd, &b, 1, 4096 + 5), 1);
    close(fd);
  }
  auto opened = test::OpenWithJobs(Options(4));
  ASSERT_TRUE(opened.ok());
  test::JobEngine& e = *opened;
  std::vector<std::vector<uint8_t>> dst(16, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  // Even positions: keys 0..7; positions 1, 5, 9, 13: keys never stored (100 + i); 3, 7, 11, 15: damaged 8..11.
  auto key_at = [](uint64_t i) -> uint64_t { return i % 2 == 0 ? i / 2 : i % 4 == 1 ? 100 + i : 8 + i / 4; };
  for (uint64_t i = 0; i < 16; ++i) req.push_back({Key(key_at(i)), 0, 0, rel::Segments(dst[i], e->block_stride())});
  auto r = e.Run(e.jobs->SubmitLoad(std::move(req)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->chunks_ok, 8u);
  ASSERT_EQ(r->chunks.size(), 16u);
  for (uint64_t i = 0; i < 16; ++i) {
    EXPECT_EQ(r->chunks[i].key, Key(key_at(i))) << i;
    if (i % 2) {
      EXPECT_EQ(r->chunks[i].status.code(), StatusCode::kNotFound) << i;
      EXPECT_TRUE(rel::AllSentinel(dst[i])) << i;
    } else {
      EXPECT_TRUE(r->chunks[i].status.ok()) << i << ": " << r->chunks[i].status.ToString();
      EXPECT_EQ(dst[i], ContentFor(i / 2)) << i;
    }
  }
  EXPECT_EQ(e->Stats().corrupt_entries, 4u);
}

// X4 on the slot path: job b's promotion of a key job a is reading finds it pending in the DRAM tier and waits for
// that read instead of starting its own, whichever reactor the read runs on.
TEST_F(ReactorsTest, IdenticalChunksOfTwoJobsShareOneReadOnEveryReactor) {
  constexpr uint64_t kKeys = 8;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 32;  // every read of a job at the disk at once (both jobs' windows hold all their chunks)
  Gate gate;
  std::vector<GatedEngine*> gated;
  auto e = OpenGated(o, &gate, -1, &gated);
  OpenOnExit opener{gate};
  ASSERT_TRUE(e.jobs);
  ASSERT_EQ(gated.size(), 4u);
  std::vector<std::vector<uint8_t>> a(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE)), b = a;
  std::vector<ChunkTransfer> ra, rb;
  for (uint64_t i = 0; i < kKeys; ++i) {
    ra.push_back({Key(i), 0, 0, rel::Segments(a[i], e->block_stride())});
    rb.push_back({Key(i), 0, 0, rel::Segments(b[i], e->block_stride())});
  }
  const uint64_t read_before = e->Stats().bytes_read;
  auto ia = e.jobs->SubmitLoad(std::move(ra));
  ASSERT_TRUE(ia.ok());
  ASSERT_TRUE(Eventually([&] { return gate.reads_held.load() == kKeys; }));  // every read of job a is held
  // Nothing finishes while every read is held: job a's promotions went round the reactors (ChunkPlacement), two each.
  std::vector<uint32_t> per_reactor(gated.size(), 0);
  for (uint64_t i = 0; i < kKeys; ++i) {
    const std::optional<uint32_t> r = Impl(*e).PlacedReactor(Key(i));  // job a's chunk, held: still placed
    ASSERT_TRUE(r.has_value()) << i;
    per_reactor[*r]++;
  }
  EXPECT_EQ(per_reactor, std::vector<uint32_t>(gated.size(), kKeys / gated.size()));
  std::vector<uint64_t> reaps;
  for (GatedEngine* g : gated) reaps.push_back(g->reaps.load());
  auto ib = e.jobs->SubmitLoad(std::move(rb));
  ASSERT_TRUE(ib.ok());
  // Job b's stream is open once the pump counts it, and its opening promoted every chunk (its window and the read
  // budget have room for all). Then every reactor went round its loop twice: a read job b started would be queued.
  ASSERT_TRUE(Eventually([&] { return e.jobs->stream_stats().loads_opened == 2; }));
  ASSERT_TRUE(Eventually([&] {
    for (size_t k = 0; k < gated.size(); ++k) {
      if (gated[k]->reaps.load() < reaps[k] + 2) return false;
    }
    return true;
  }));
  EXPECT_EQ(gate.reads_held.load(), kKeys) << "job b read again instead of waiting for job a's reads";
  gate.open = true;
  auto r1 = e.jobs->Wait(ia.value(), 30000), r2 = e.jobs->Wait(ib.value(), 30000);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_TRUE(r1->all_ok());
  EXPECT_TRUE(r2->all_ok());
  for (uint64_t i = 0; i < kKeys; ++i) {
    EXPECT_EQ(a[i], ContentFor(i));
    EXPECT_EQ(b[i], ContentFor(i));
  }
  EXPECT_EQ(e->Stats().bytes_read - read_before, kKeys * kChunkFileBytes);  // X4: one read per key
}

// S1 across reactors: a job holds at most its window of slots (JobClient's max_window, by default 2 x io_depth: the
// engine's own per-job bound before the job API became a client of the slot path), wherever its promotions run.
// With every copy held, the window fills and stays full: each slot in use is one of the job's chunks, published and
// not yet acked (a fresh engine: nothing else is resident).
TEST_F(ReactorsTest, AJobHoldsAtMostItsWindowOfSlotsOverAllReactors) {
  constexpr uint64_t kKeys = 24;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 6;  // the window: 12 slots
  o.pool_bytes = 32 * kChunkFileBytes;
  const uint32_t window = 2 * o.io_depth;
  CopyGate copies;
  auto opened = test::OpenWithJobs(o, std::make_unique<HeldCopier>(&copies));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  test::JobEngine& e = *opened;
  OpenCopiesOnExit opener{copies};
  std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  for (uint64_t i = 0; i < kKeys; ++i) req.push_back({Key(i), 0, 0, rel::Segments(dst[i], e->block_stride())});
  auto id = e.jobs->SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Eventually([&] { return copies.copies_taken.load() >= window; }));
  // A bound is a thing not happening: give the pump's passes (every StreamPump::kIdlePoll) time to take more.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(copies.copies_taken.load(), window);
  EXPECT_EQ(e->Stats().pool_slots_in_use, window);
  EXPECT_EQ(e.jobs->stream_stats().peak_window, window);
  copies.Open();
  auto r = e.Run(id);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->all_ok());
  for (uint64_t i = 0; i < kKeys; ++i) EXPECT_EQ(dst[i], ContentFor(i));
  EXPECT_EQ(copies.copies_taken.load(), kKeys);
  EXPECT_EQ(e.jobs->stream_stats().peak_window, window);
}

TEST_F(ReactorsTest, TheDemandReserveHoldsAcrossReactors) {
  constexpr uint64_t kKeys = 40;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.pool_bytes = 24 * kChunkFileBytes;
  o.demand_reserve_slots = 6;
  auto opened = test::OpenWithJobs(o);
  ASSERT_TRUE(opened.ok());
  test::JobEngine& e = *opened;
  // Demand promotions, pinned, fill all but 8 of the 18 slots outside the reserve.
  std::vector<ChunkKey> pinned;
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(Eventually([&] { return e->Promote(Key(i), false).state == PromoteState::kReady; })) << i;
    pinned.push_back(Key(i));
  }
  ASSERT_TRUE(e->PinResident(pinned).ok());
  // Speculative promotions of keys on every reactor take what is left outside the reserve, never the reserve.
  uint32_t started = 0;
  for (uint64_t i = 10; i < kKeys; ++i) started += e->Promote(Key(i), true).state != PromoteState::kMiss;
  EXPECT_LE(started, 8u);
  EXPECT_LE(e->Stats().pool_slots_in_use, 24u - 6u);
  ASSERT_TRUE(Eventually([&] {
    for (uint64_t i = 10; i < kKeys; ++i) {
      if (e->Residency(Key(i)) == PromoteState::kPending) return false;
    }
    return true;
  }));
  EXPECT_LE(e->Stats().pool_slots_in_use, 24u - 6u);
  // Demand work on every reactor still gets its slots: a load of six chunks not resident (demand promotions).
  std::vector<std::vector<uint8_t>> dst(6, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  std::vector<uint64_t> keys;
  for (uint64_t i = kKeys - 1; keys.size() < 6; --i) {
    if (e->Residency(Key(i)) == PromoteState::kMiss) keys.push_back(i);
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    req.push_back({Key(keys[k]), 0, 0, rel::Segments(dst[k], e->block_stride())});
  }
  auto r = e.Run(e.jobs->SubmitLoad(std::move(req)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->all_ok());
  for (size_t k = 0; k < keys.size(); ++k) EXPECT_EQ(dst[k], ContentFor(keys[k]));
  e->Unpin(pinned);
}

TEST_F(ReactorsTest, ConcurrentJobsOnEveryReactorRoundTrip) {
  auto opened = test::OpenWithJobs(Options(4));
  ASSERT_TRUE(opened.ok());
  test::JobEngine& e = *opened;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 12; ++i) {
        const uint64_t k = 1000 + t * 100 + i;
        if (!rel::StoreOne(e, k).ok()) bad++;
        std::vector<uint8_t> got;
        if (!rel::LoadOne(e, Key(k), &got).ok() || got != ContentFor(k)) bad++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace kvtier
