// PreloadPlanner (R1-R3) over a real EngineImpl whose I/O is the deterministic FakeEngine: HoldCompletions keeps
// reads in flight so the bounds can be checked exactly; an injected clock ages queued work.
#include "policy/preload_planner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "engine/engine_impl.h"
#include "io/fake_engine.h"
#include "support/engine_options.h"
#include "support/job_engine.h"
#include "support/keys.h"
#include "support/temp_dir.h"
#include "transfer/device_copier.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 2;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint32_t kSlots = 16;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 36, 8, 0x7c); }

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o = test::BaseOptions(dir_.path(), "planner-test", 32, kBlocks, kBlockBytes);
    o.pool_bytes = kSlots * (4096 + kBlocks * kBlockBytes);
    o.io_depth = 4;  // demand reserve: 4 slots
    o.op_timeout_ms = 60000;
    {
      // Chunks 0..39 on disk, stored through the job API (a client of the slot path) by an engine of their own:
      // they stay resident in that engine only (write-through DRAM tier, T1), not in the one under test.
      auto writer = test::OpenWithJobs(o);
      ASSERT_TRUE(writer.ok()) << writer.status().ToString();
      std::vector<std::vector<uint8_t>> data(40, std::vector<uint8_t>(kBlocks * kBlockBytes, 0x11));
      std::vector<ChunkTransfer> t;
      for (uint64_t i = 0; i < data.size(); ++i) {
        std::vector<CopySegment> segs;
        for (uint32_t b = 0; b < kBlocks; ++b) {
          segs.push_back(CopySegment{b * (*writer)->block_stride(),
                                     reinterpret_cast<uint64_t>(data[i].data() + b * kBlockBytes), kBlockBytes});
        }
        t.push_back(ChunkTransfer{Key(i), 0, 0, segs});
      }
      auto r = writer->Run(writer->jobs->SubmitStore(std::move(t)));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_TRUE(r->all_ok());
    }
    auto fake = std::make_unique<FakeEngine>(64);
    fake_ = fake.get();
    auto e = EngineImpl::Create(o, std::move(fake));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e.value());
  }
  PreloadPlanner Planner(uint32_t k, int64_t max_age_ms = 0) {
    return PreloadPlanner(engine_.get(), PlannerOptions{k, max_age_ms}, [this] { return now_ns_; });
  }
  std::vector<ChunkKey> Keys(uint64_t first, uint64_t n) {
    std::vector<ChunkKey> v;
    for (uint64_t i = first; i < first + n; ++i) v.push_back(Key(i));
    return v;
  }
  // Lets held I/O run to completion and waits until key is no longer being read.
  void Settle(const ChunkKey& key) {
    fake_->HoldCompletions(false);
    fake_->ReleaseAll();
    for (int i = 0; i < 2000 && engine_->Residency(key) == PromoteState::kPending; ++i) usleep(1000);
    ASSERT_NE(engine_->Residency(key), PromoteState::kPending);
  }
  // Gives the reactor time to issue what it was asked to (the fake holds the completions).
  void Quiesce() { usleep(20000); }

  test::TempDir dir_;
  FakeEngine* fake_ = nullptr;
  std::unique_ptr<Engine> engine_;
  int64_t now_ns_ = 1'000'000'000;
};

TEST_F(PlannerTest, AtMostKSpeculativeReadsAreInFlight) {
  for (uint32_t k : {1u, 3u}) {
    auto p = Planner(k);
    auto keys = Keys(k * 10, 6);
    p.Enqueue("req", keys);
    fake_->HoldCompletions(true);
    p.Pump();
    p.Pump();
    Quiesce();
    p.Pump();
    EXPECT_EQ(p.inflight(), k);
    EXPECT_EQ(p.stats().started, k);
    Settle(keys[k - 1]);
    EXPECT_EQ(engine_->Residency(keys[0]), PromoteState::kReady);
    p.Pump();  // the finished ones retire; the next k start
    EXPECT_EQ(p.stats().started, std::min<uint64_t>(2 * k, 6));
    Settle(keys[std::min<uint64_t>(2 * k, 6) - 1]);
    for (const ChunkKey& key : keys) {  // used by demand: they no longer count as unused preloads
      if (engine_->PinResident(std::vector<ChunkKey>{key}).ok()) engine_->Unpin(std::vector<ChunkKey>{key});
    }
  }
  EXPECT_EQ(engine_->Stats().preload_started, 1u + 1u + 3u + 3u);
}

TEST_F(PlannerTest, DemandFirstQueuedPreloadsWaitWhileDemandReadsRun) {
  auto p = Planner(2);
  fake_->HoldCompletions(true);
  EXPECT_EQ(p.Demand(Key(30)).state, PromoteState::kPending);
  p.Enqueue("waiting", Keys(0, 4));
  p.Pump();
  EXPECT_EQ(p.stats().started, 0u);
  EXPECT_EQ(p.stats().deferred_for_demand, 1u);
  EXPECT_EQ(p.demand_pending(), 1u);
  Settle(Key(30));
  p.Pump();
  EXPECT_EQ(p.demand_pending(), 0u);
  EXPECT_EQ(p.stats().started, 2u);
  Settle(Key(1));
}

TEST_F(PlannerTest, ADemandLoadJoinsAnInFlightPreload) {
  auto p = Planner(1);
  p.Enqueue("r", Keys(5, 1));
  fake_->HoldCompletions(true);
  p.Pump();
  ASSERT_EQ(p.inflight(), 1u);
  const uint64_t read_before = engine_->Stats().bytes_read;
  EXPECT_EQ(p.Demand(Key(5)).state, PromoteState::kPending);  // joins: no second read
  EXPECT_EQ(p.stats().joined_in_flight, 1u);
  EXPECT_EQ(p.inflight(), 0u);  // it is demand work now
  Settle(Key(5));
  EXPECT_EQ(p.Demand(Key(5)).state, PromoteState::kReady);
  StatsSnapshot s = engine_->Stats();
  EXPECT_EQ(s.preload_used, 1u);
  EXPECT_EQ(s.preload_wasted, 0u);
  EXPECT_LE(s.bytes_read - read_before, 4096u + engine_->chunk_payload_bytes());  // one read (header + payload)
}

TEST_F(PlannerTest, ADemandLoadUsesAFinishedPreloadWithoutReading) {
  auto p = Planner(1);
  p.Enqueue("r", Keys(6, 1));
  p.Pump();
  Settle(Key(6));
  const uint64_t read_before = engine_->Stats().bytes_read;
  auto pinned = engine_->PinResident(std::vector<ChunkKey>{Key(6)});
  ASSERT_TRUE(pinned.ok());
  engine_->Unpin(std::vector<ChunkKey>{Key(6)});
  EXPECT_EQ(engine_->Stats().bytes_read, read_before);
  EXPECT_EQ(engine_->Stats().preload_used, 1u);
}

TEST_F(PlannerTest, IdenticalChunksOfTwoRequestsShareOneRead) {
  auto p = Planner(4);
  p.Enqueue("a", Keys(0, 3));
  p.Enqueue("b", Keys(0, 3));
  EXPECT_EQ(p.queued(), 3u);
  p.Pump();
  Settle(Key(2));
  p.Pump();
  p.Enqueue("c", Keys(0, 3));  // resident now: nothing to read
  p.Pump();
  EXPECT_EQ(p.stats().started, 3u);
  EXPECT_EQ(p.stats().already_resident, 3u);
  EXPECT_EQ(engine_->Stats().preload_started, 3u);
}

TEST_F(PlannerTest, PreloadsNeverTakeTheDemandReserveOrCrowdOutDemand) {
  auto p = Planner(100);  // K far above the pool
  p.Enqueue("many", Keys(0, 30));
  for (int i = 0; i < 10; ++i) {
    p.Pump();
    Settle(Key(0));
    usleep(5000);
  }
  StatsSnapshot s = engine_->Stats();
  // Unused preloads hold at most half of the 12 non-reserved slots.
  EXPECT_EQ(s.preload_started, (kSlots - 4) / 2);
  EXPECT_GT(p.stats().refused_no_room, 0u);
  EXPECT_GE(kSlots - s.pool_slots_in_use, 4u);
  // Demand still gets every slot it needs: a reservation of all other slots succeeds by evicting the preloads.
  std::vector<ChunkKey> store_keys = Keys(100, kSlots);
  auto res = engine_->ReserveForStore(store_keys);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  engine_->CommitStore(store_keys, false);
  EXPECT_EQ(engine_->Stats().preload_wasted, (kSlots - 4) / 2);
}

TEST_F(PlannerTest, ForgottenStaleAndAbsentWorkIsDropped) {
  auto p = Planner(1, /*max_age_ms=*/10);
  p.Enqueue("gone", Keys(0, 2));
  p.Forget("gone");
  EXPECT_EQ(p.queued(), 0u);
  p.Enqueue("old", Keys(2, 2));
  now_ns_ += 20'000'000;  // 20 ms later
  p.Pump();
  EXPECT_EQ(p.stats().started, 0u);
  std::vector<ChunkKey> broken = {Key(999), Key(3), Key(4)};  // the cached prefix ends at its first chunk
  p.Enqueue("broken", broken);
  p.Pump();
  EXPECT_EQ(p.stats().started, 0u);
  EXPECT_EQ(p.queued(), 0u);
  EXPECT_EQ(p.stats().dropped, 2u + 2u + 3u);
}

TEST_F(PlannerTest, ZeroInflightTurnsPreloadOff) {
  auto p = Planner(0);
  p.Enqueue("r", Keys(0, 3));
  p.Pump();
  EXPECT_EQ(p.queued(), 0u);
  EXPECT_EQ(engine_->Stats().preload_started, 0u);
}

// A scheduler step can be a multi-second prefill: with K=1 and only per-step pumps, preload would read one chunk
// per step. The background pump retires each finished read and starts the next without any Pump() call.
TEST_F(PlannerTest, TheBackgroundPumpKeepsReadingBetweenSchedulerSteps) {
  auto p = Planner(1);
  p.StartBackgroundPump(std::chrono::microseconds(500));
  auto keys = Keys(20, (kSlots - 4) / 2);  // as many as the engine lets stay resident unused (see above)
  p.Enqueue("req", keys);
  for (int i = 0; i < 5000 && engine_->Residency(keys.back()) != PromoteState::kReady; ++i) usleep(1000);
  for (const ChunkKey& k : keys) EXPECT_EQ(engine_->Residency(k), PromoteState::kReady);
  EXPECT_EQ(p.stats().started, keys.size());
  EXPECT_LE(p.inflight(), 1u);
  p.StopBackgroundPump();
  p.StopBackgroundPump();  // idempotent
}

// Without a background pump (and without Pump calls) nothing but the first Enqueue happens: the test above can fail.
TEST_F(PlannerTest, WithoutAnyPumpNoReadStarts) {
  auto p = Planner(1);
  p.Enqueue("req", Keys(20, 3));
  usleep(50000);
  EXPECT_EQ(p.stats().started, 0u);
}

}  // namespace
}  // namespace kvtier
