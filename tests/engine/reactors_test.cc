// Several reactors (I1, docs/architecture.md "Threads and ownership"): a job whose chunks live on different
// reactors completes exactly once, when all of them have; identical chunks still share one read (X4); the demand
// reserve (S2) and a job's slot bound (S1) hold across reactors; the reactor count is the option's, auto's or
// KVTIER_TEST_REACTORS's.
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "engine/engine_impl.h"
#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

using rel::ContentFor;
using rel::Key;
using rel::kBlockBytes;
using rel::kBlocks;
using rel::kChunkFileBytes;

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

class GatedEngine final : public io::IoEngine {
 public:
  GatedEngine(std::unique_ptr<io::IoEngine> inner, Gate* gate) : inner_(std::move(inner)), gate_(gate) {}
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight() + static_cast<uint32_t>(held_.size()); }
  int Submit(const io::IoOp& op) override {
    if (op.code == io::OpCode::kRead && !gate_->open.load()) {
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
  int Reap(std::vector<io::IoCompletion>* out, int64_t timeout_ns) override {
    reaps++;
    Release();
    inner_->Flush();
    // While reads are held, come back often to notice the gate opening.
    const int64_t wait = held_.empty() ? timeout_ns : (timeout_ns < 0 ? 2000000 : std::min<int64_t>(timeout_ns, 2000000));
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
  std::unique_ptr<io::IoEngine> inner_;
  Gate* gate_;
  std::deque<io::IoOp> held_;  // reactor thread only
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
  // An engine whose reactor r reads through a gate (every reactor when gated_reactor < 0).
  std::unique_ptr<Engine> OpenGated(EngineOptions o, Gate* gate, int gated_reactor,
                                    std::vector<GatedEngine*>* gated = nullptr) {
    auto e = EngineImpl::Create(o, nullptr, [&](uint32_t r) -> std::unique_ptr<io::IoEngine> {
      io::EngineConfig cfg;
      cfg.depth = 64;
      auto inner = io::CreateEngine(cfg);
      if (!inner.ok()) return nullptr;
      if (gated_reactor >= 0 && r != static_cast<uint32_t>(gated_reactor)) return std::move(inner.value());
      auto g = std::make_unique<GatedEngine>(std::move(inner.value()), gate);
      if (gated) gated->push_back(g.get());
      return g;
    });
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e.value()) : nullptr;
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
  if (!getenv("KVTIER_TEST_REACTORS")) {
    EXPECT_GE(resolved, 2u);  // auto spreads per-byte work over cores
  }
  o.reactors = kMaxReactors + 1;
  Status bad = o.Validate();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("reactors"), std::string::npos) << bad.ToString();
}

TEST_F(ReactorsTest, AJobSpanningReactorsCompletesOnceWhenItsLastChunkDoes) {
  constexpr uint64_t kKeys = 16;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 32;  // every chunk of the job starts at once and is read at once (8 at the disk per reactor)
  Gate gate;
  // I1: an idle engine spreads a job's chunks evenly, the first on reactor 0 (PlaceChunk): chunk i on reactor
  // i % 4. Reactor 0's reads wait at the gate, every other reactor reads freely.
  constexpr uint32_t held_reactor = 0;
  auto e = OpenGated(o, &gate, static_cast<int>(held_reactor));
  OpenOnExit opener{gate};
  ASSERT_TRUE(e);
  const uint64_t on_held = kKeys / 4;

  std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  for (uint64_t i = 0; i < kKeys; ++i) req.push_back({Key(i), 0, 0, rel::Segments(dst[i], e->block_stride())});
  const uint64_t read_before = e->Stats().bytes_read;
  auto id = e->SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  // Every chunk on the other reactors is read, verified and copied ...
  const uint64_t others = (kKeys - on_held) * kChunkFileBytes;
  ASSERT_TRUE(Eventually([&] { return e->Stats().bytes_read - read_before >= others; }));
  ASSERT_TRUE(Eventually([&] { return e->Stats().chunks_loaded >= kKeys - on_held; }));
  EXPECT_EQ(gate.reads_held.load(), on_held);
  // Unfinished: exactly the held reactor's share of the job, every fourth chunk. A chunk is counted loaded just
  // before its reactor finishes it (drops its placement), so the others' placements are awaited, not sampled.
  EXPECT_TRUE(Eventually([&] {
    for (uint64_t i = 0; i < kKeys; ++i) {
      if (i % 4 != held_reactor && Impl(*e).PlacedReactor(Key(i)).has_value()) return false;
    }
    return true;
  }));
  for (uint64_t i = 0; i < kKeys; ++i) {
    if (i % 4 == held_reactor) {
      EXPECT_EQ(Impl(*e).PlacedReactor(Key(i)), std::optional<uint32_t>(held_reactor)) << i;
    } else {
      EXPECT_EQ(Impl(*e).PlacedReactor(Key(i)), std::nullopt) << i;
    }
  }
  // ... but the job is not done while the held reactor's chunks are not.
  EXPECT_TRUE(e->PollCompleted().empty());
  auto early = e->Wait(id.value(), 50);
  EXPECT_EQ(early.status().code(), StatusCode::kTimedOut);

  gate.open = true;
  auto r = e->Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->all_ok());
  ASSERT_EQ(r->chunks.size(), kKeys);
  for (uint64_t i = 0; i < kKeys; ++i) {
    EXPECT_EQ(r->chunks[i].key, Key(i)) << "outcomes in request order";
    EXPECT_EQ(dst[i], ContentFor(i)) << "chunk " << i;
  }
  EXPECT_EQ(r->bytes, kKeys * kBlocks * kBlockBytes);
  // Reported exactly once.
  EXPECT_TRUE(e->PollCompleted().empty());
  EXPECT_EQ(e->Stats().loads_completed, 1u);
}

TEST_F(ReactorsTest, MissesOnSomeReactorsAreReportedPerChunkInRequestOrder) {
  StoreKeys(8);
  auto e = Engine::Open(Options(4));
  ASSERT_TRUE(e.ok());
  std::vector<std::vector<uint8_t>> dst(16, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  // Odd positions ask for keys never stored (100 + i).
  for (uint64_t i = 0; i < 16; ++i) {
    req.push_back({Key(i % 2 ? 100 + i : i / 2), 0, 0, rel::Segments(dst[i], e.value()->block_stride())});
  }
  auto id = e.value()->SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  auto r = e.value()->Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->chunks_ok, 8u);
  for (uint64_t i = 0; i < 16; ++i) {
    if (i % 2) {
      EXPECT_EQ(r->chunks[i].status.code(), StatusCode::kNotFound) << i;
      EXPECT_TRUE(rel::AllSentinel(dst[i])) << i;
    } else {
      EXPECT_TRUE(r->chunks[i].status.ok()) << i << ": " << r->chunks[i].status.ToString();
      EXPECT_EQ(dst[i], ContentFor(i / 2)) << i;
    }
  }
}

TEST_F(ReactorsTest, IdenticalChunksOfTwoJobsShareOneReadOnEveryReactor) {
  constexpr uint64_t kKeys = 8;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 32;  // every read of a job at the disk at once
  Gate gate;
  std::vector<GatedEngine*> gated;
  auto e = OpenGated(o, &gate, -1, &gated);
  OpenOnExit opener{gate};
  ASSERT_TRUE(e);
  ASSERT_EQ(gated.size(), 4u);
  std::vector<std::vector<uint8_t>> a(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE)), b = a;
  std::vector<ChunkTransfer> ra, rb;
  for (uint64_t i = 0; i < kKeys; ++i) {
    ra.push_back({Key(i), 0, 0, rel::Segments(a[i], e->block_stride())});
    rb.push_back({Key(i), 0, 0, rel::Segments(b[i], e->block_stride())});
  }
  const uint64_t read_before = e->Stats().bytes_read;
  auto ia = e->SubmitLoad(std::move(ra));
  ASSERT_TRUE(ia.ok());
  ASSERT_TRUE(Eventually([&] { return gate.reads_held.load() == kKeys; }));  // every read of job a is held
  std::vector<uint64_t> reaps;
  for (GatedEngine* g : gated) reaps.push_back(g->reaps.load());
  auto ib = e->SubmitLoad(std::move(rb));
  ASSERT_TRUE(ib.ok());
  // Every reactor with keys went round its loop twice since: it took job b's part and started (joined) its chunks.
  std::vector<bool> used(gated.size(), false);
  for (uint64_t i = 0; i < kKeys; ++i) {
    const std::optional<uint32_t> r = Impl(*e).PlacedReactor(Key(i));  // job a's chunk, held: still placed
    ASSERT_TRUE(r.has_value()) << i;
    used[*r] = true;
  }
  ASSERT_TRUE(Eventually([&] {
    for (size_t k = 0; k < gated.size(); ++k) {
      if (used[k] && gated[k]->reaps.load() < reaps[k] + 2) return false;
    }
    return true;
  }));
  EXPECT_EQ(gate.reads_held.load(), kKeys) << "job b read again instead of joining job a's reads";
  gate.open = true;
  auto r1 = e->Wait(ia.value(), 30000), r2 = e->Wait(ib.value(), 30000);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_TRUE(r1->all_ok());
  EXPECT_TRUE(r2->all_ok());
  for (uint64_t i = 0; i < kKeys; ++i) {
    EXPECT_EQ(a[i], ContentFor(i));
    EXPECT_EQ(b[i], ContentFor(i));
  }
  EXPECT_EQ(e->Stats().bytes_read - read_before, kKeys * kChunkFileBytes);  // X4: one read per key
}

TEST_F(ReactorsTest, AJobHoldsAtMostTwiceIoDepthSlotsOverAllReactors) {
  constexpr uint64_t kKeys = 24;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.io_depth = 6;  // a job: at most 12 slots; a part: at most 2 x ceil(6 / 4) = 4, so 4 parts alone allow 16
  o.pool_bytes = 32 * kChunkFileBytes;
  Gate gate;
  auto e = OpenGated(o, &gate, -1);
  OpenOnExit opener{gate};
  ASSERT_TRUE(e);
  std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  for (uint64_t i = 0; i < kKeys; ++i) req.push_back({Key(i), 0, 0, rel::Segments(dst[i], e->block_stride())});
  auto id = e->SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  // With every read held, the job takes all the slots it may; then its slot count is the bound.
  ASSERT_TRUE(Eventually([&] { return e->Stats().pool_slots_in_use >= 2u * o.io_depth; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let every reactor take what it can
  EXPECT_LE(e->Stats().pool_slots_in_use, 2u * o.io_depth);
  gate.open = true;
  auto r = e->Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->all_ok());
  for (uint64_t i = 0; i < kKeys; ++i) EXPECT_EQ(dst[i], ContentFor(i));
  EXPECT_LE(e->Stats().pool_peak_slots, 2u * o.io_depth);
}

TEST_F(ReactorsTest, TheDemandReserveHoldsAcrossReactors) {
  constexpr uint64_t kKeys = 40;
  StoreKeys(kKeys);
  EngineOptions o = Options(4);
  o.pool_bytes = 24 * kChunkFileBytes;
  o.demand_reserve_slots = 6;
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok());
  Engine& e = *opened.value();
  // Demand promotions, pinned, fill all but 8 of the 18 slots outside the reserve.
  std::vector<ChunkKey> pinned;
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(Eventually([&] { return e.Promote(Key(i), false).state == PromoteState::kReady; })) << i;
    pinned.push_back(Key(i));
  }
  ASSERT_TRUE(e.PinResident(pinned).ok());
  // Speculative promotions of keys on every reactor take what is left outside the reserve, never the reserve.
  uint32_t started = 0;
  for (uint64_t i = 10; i < kKeys; ++i) started += e.Promote(Key(i), true).state != PromoteState::kMiss;
  EXPECT_LE(started, 8u);
  EXPECT_LE(e.Stats().pool_slots_in_use, 24u - 6u);
  ASSERT_TRUE(Eventually([&] {
    for (uint64_t i = 10; i < kKeys; ++i) {
      if (e.Residency(Key(i)) == PromoteState::kPending) return false;
    }
    return true;
  }));
  EXPECT_LE(e.Stats().pool_slots_in_use, 24u - 6u);
  // Demand work on every reactor still gets its slots: a load of six chunks not resident.
  std::vector<std::vector<uint8_t>> dst(6, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> req;
  std::vector<uint64_t> keys;
  for (uint64_t i = kKeys - 1; keys.size() < 6; --i) {
    if (e.Residency(Key(i)) == PromoteState::kMiss) keys.push_back(i);
  }
  for (size_t k = 0; k < keys.size(); ++k) req.push_back({Key(keys[k]), 0, 0, rel::Segments(dst[k], e.block_stride())});
  auto id = e.SubmitLoad(std::move(req));
  ASSERT_TRUE(id.ok());
  auto r = e.Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->all_ok());
  for (size_t k = 0; k < keys.size(); ++k) EXPECT_EQ(dst[k], ContentFor(keys[k]));
  e.Unpin(pinned);
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
