// ResidentSet alone (src/engine/resident_set.h): promotions, pins, preload bounds, store reservations and the slots
// it hands out, over a real staging pool.
#include "engine/resident_set.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "support/keys.h"

namespace kvtier {
namespace {

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 16, 15, 0x42); }

class ResidentSetTest : public ::testing::Test {
 protected:
  void Make(uint32_t slots, uint32_t max_slots, uint32_t max_preloads, uint32_t reserve = 0) {
    StagingPoolOptions po;
    po.num_slots = slots;
    po.slot_bytes = 4096;
    po.demand_reserve = reserve;
    auto pool = StagingPool::Create(po);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(pool.value());
    ResidentSet::Options o;
    o.max_slots = max_slots;
    o.max_unused_preloads = max_preloads;
    set_ = std::make_unique<ResidentSet>(*pool_, o, stats_, [this](uint32_t slot) {
      pool_->MarkFree(slot);
      pool_->Release(slot);
      freed_++;
    });
  }
  // Promotes key i and completes its read.
  uint32_t Resident(uint64_t i, bool speculative = false, int64_t now = 0) {
    PromoteResult r;
    auto slot = set_->BeginLoad(Key(i), speculative, now, &r);
    EXPECT_TRUE(slot.has_value()) << i;
    if (!slot) return 0;
    EXPECT_EQ(r.state, PromoteState::kPending);
    set_->Loaded(Key(i), *slot, pool_->BeginFill(*slot), true, now);
    return *slot;
  }

  Stats stats_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<ResidentSet> set_;
  int freed_ = 0;
};

TEST_F(ResidentSetTest, APromotionIsPendingUntilItsReadIsLoadedThenReady) {
  Make(4, 4, 2);
  EXPECT_FALSE(set_->PromoteResident(Key(1), false, 0).has_value());
  PromoteResult r;
  auto slot = set_->BeginLoad(Key(1), false, 0, &r);
  ASSERT_TRUE(slot);
  EXPECT_EQ(set_->Residency(Key(1)), PromoteState::kPending);
  EXPECT_EQ(set_->Lookup(Key(1)), ResidentSet::Hit::kNone) << "still being read: the disk index answers";
  // A second promotion of the same key meanwhile gets no slot of its own.
  PromoteResult again;
  EXPECT_FALSE(set_->BeginLoad(Key(1), false, 0, &again));
  EXPECT_EQ(again.state, PromoteState::kPending);
  const uint32_t gen = pool_->BeginFill(*slot);
  set_->Loaded(Key(1), *slot, gen, true, 0);
  EXPECT_EQ(set_->Lookup(Key(1)), ResidentSet::Hit::kReady);
  auto ready = set_->PromoteResident(Key(1), false, 0);
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->state, PromoteState::kReady);
  EXPECT_EQ(ready->ref.slot, *slot);
  EXPECT_EQ(ready->ref.generation, gen);
  // A failed read gives its slot back.
  auto other = set_->BeginLoad(Key(2), false, 0, &r);
  ASSERT_TRUE(other);
  set_->Loaded(Key(2), *other, 0, false, 0);
  EXPECT_EQ(set_->Residency(Key(2)), PromoteState::kMiss);
  EXPECT_EQ(freed_, 1);
}

TEST_F(ResidentSetTest, UnusedPreloadsAreBoundedAndCountedWhenUsedOrWasted) {
  Make(8, 8, 2);
  Resident(1, true);
  Resident(2, true);
  PromoteResult r;
  EXPECT_FALSE(set_->BeginLoad(Key(3), true, 0, &r)) << "R2: two unused preloads is the bound";
  EXPECT_EQ(r.state, PromoteState::kMiss);
  ASSERT_TRUE(set_->PinIfReady(Key(1)));  // a demand load uses preload 1
  EXPECT_EQ(stats_.Snapshot().preload_used, 1u);
  set_->Unpin(std::vector<ChunkKey>{Key(1)});
  EXPECT_TRUE(set_->BeginLoad(Key(3), true, 0, &r));
}

TEST_F(ResidentSetTest, APoolSlotComesFromEvictingTheLeastRecentUnpinnedReadyEntryPreloadsLast) {
  Make(3, 3, 2);
  Resident(1);
  Resident(2, /*speculative=*/true);
  Resident(3);
  // (Promoted at time 0: their awaited protection has long passed on the monotonic clock.)
  ASSERT_TRUE(set_->Pin(std::vector<ChunkKey>{Key(1)}).ok());
  // Pool full: 1 is pinned, 2 is an unused preload (goes last), so 3 gives way.
  auto slot = set_->AcquireSlot(SlotPriority::kDemand);
  ASSERT_TRUE(slot);
  EXPECT_EQ(set_->Residency(Key(3)), PromoteState::kMiss);
  EXPECT_EQ(set_->Residency(Key(2)), PromoteState::kReady);
  // A speculative acquire never evicts a preload; a demand one does, and counts it wasted.
  EXPECT_FALSE(set_->AcquireSlot(SlotPriority::kSpeculative));
  auto second = set_->AcquireSlot(SlotPriority::kDemand);
  ASSERT_TRUE(second);
  EXPECT_EQ(stats_.Snapshot().preload_wasted, 1u);
  EXPECT_FALSE(set_->AcquireSlot(SlotPriority::kDemand)) << "only the pinned entry is left";
  pool_->Release(*slot);
  pool_->Release(*second);
}

TEST_F(ResidentSetTest, UnusedPreloadsNeitherCountTowardTheTiersBoundNorGoToKeepIt) {
  // dram_max_slots=1 (every hit from disk) with room in the pool: preloads wait there for their requests.
  Make(8, 1, 4);
  Resident(1, /*speculative=*/true);
  Resident(2, /*speculative=*/true);
  Resident(3);  // a demand load: T1 counts only it
  Resident(4);  // the next demand load evicts 3 (the tier keeps one), not a preload
  EXPECT_EQ(set_->Residency(Key(3)), PromoteState::kMiss);
  EXPECT_EQ(set_->Residency(Key(4)), PromoteState::kReady);
  EXPECT_EQ(set_->Residency(Key(1)), PromoteState::kReady);
  EXPECT_EQ(set_->Residency(Key(2)), PromoteState::kReady);
  // The preloads' requests come: their demand promotions use them, and nothing was read twice.
  EXPECT_EQ(set_->PromoteResident(Key(1), false, 0)->state, PromoteState::kReady);
  EXPECT_EQ(set_->PromoteResident(Key(2), false, 0)->state, PromoteState::kReady);
  const StatsSnapshot used = stats_.Snapshot();
  EXPECT_EQ(used.preload_used, 2u);
  EXPECT_EQ(used.preload_wasted, 0u);
  // Used, they count: the next demand load trims the tier back to one entry (awaited protection aside: time 0).
  Resident(5);
  int kept = 0;
  for (uint64_t i : {1, 2, 4, 5}) kept += set_->Residency(Key(i)) == PromoteState::kReady;
  EXPECT_EQ(kept, 1);
  EXPECT_EQ(set_->Residency(Key(5)), PromoteState::kReady);
}

TEST_F(ResidentSetTest, StoreReservationsDeduplicateAndRollBackWhenThePoolRunsOut) {
  Make(2, 2, 1);
  Resident(9);
  std::vector<ChunkKey> keys{Key(9), Key(5), Key(5), Key(6)};
  auto got = set_->ReserveForStore(keys, {false, false, false, true});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE((*got)[0]) << "resident already";
  EXPECT_TRUE((*got)[1]);
  EXPECT_FALSE((*got)[2]) << "twice in one call";
  EXPECT_FALSE((*got)[3]) << "on disk already";
  EXPECT_EQ(stats_.Snapshot().stores_deduplicated, 3u);  // the second Key(5) finds the first one resident
  EXPECT_EQ(set_->Lookup(Key(5)), ResidentSet::Hit::kFilling);
  // Both slots are taken (9 ready, 5 filling): 9 is evicted for 7, then nothing is left for 8.
  auto full = set_->ReserveForStore(std::vector<ChunkKey>{Key(7), Key(8)}, {false, false});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(set_->Residency(Key(7)), PromoteState::kMiss) << "rolled back";

  std::vector<ChunkKey> written;
  std::vector<uint32_t> slots;
  set_->Commit(std::vector<ChunkKey>{Key(5)}, true, &written, &slots);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(set_->Residency(Key(5)), PromoteState::kReady) << "write-through: readable while written";
  set_->Written(Key(5));
  EXPECT_EQ(set_->Lookup(Key(5)), ResidentSet::Hit::kReady);
}

TEST_F(ResidentSetTest, ConcurrentPromotionsOfOneKeyGetOneSlot) {
  Make(16, 16, 8);
  std::atomic<int> slots{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (uint64_t i = 0; i < 200; ++i) {
        PromoteResult r;
        if (!set_->PromoteResident(Key(i % 8), false, 0)) {
          if (auto s = set_->BeginLoad(Key(i % 8), false, 0, &r)) {
            slots++;
            set_->Loaded(Key(i % 8), *s, 1, true, 0);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(slots.load(), 8);
  EXPECT_EQ(stats_.Snapshot().dram_entries, 8u);
}

}  // namespace
}  // namespace kvtier
