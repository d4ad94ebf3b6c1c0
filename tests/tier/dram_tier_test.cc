// The DRAM tier's replacement policies (T1): victim order, in-use entries never chosen, ARC's scan resistance.
#include "tier/dram_tier.h"

#include <gtest/gtest.h>

#include <set>

namespace kvtier {
namespace {

ChunkKey K(uint8_t i) {
  uint8_t b[4] = {i, 1, 2, 3};
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}
const DramTier::Evictable kAll = [](const ChunkKey&) { return true; };

TEST(DramTierTest, ParsesPolicyNamesAndNamesTheAcceptedOnes) {
  EXPECT_EQ(ParseDramPolicy("lru").value(), DramPolicy::kLru);
  EXPECT_EQ(ParseDramPolicy("arc").value(), DramPolicy::kArc);
  auto bad = ParseDramPolicy("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("lru, arc"), std::string::npos);
}

TEST(DramTierTest, LruEvictsTheLeastRecentlyUsed) {
  auto t = DramTier::Make(DramPolicy::kLru, 3);
  t->Insert(K(1));
  t->Insert(K(2));
  t->Insert(K(3));
  t->Touch(K(1));
  EXPECT_EQ(t->Victim(kAll), K(2));
  t->Evict(K(2));
  EXPECT_EQ(t->Victim(kAll), K(3));
  EXPECT_EQ(t->size(), 2u);
  EXPECT_FALSE(t->Contains(K(2)));
}

TEST(DramTierTest, InUseEntriesAreNeverVictims) {
  for (DramPolicy p : {DramPolicy::kLru, DramPolicy::kArc}) {
    auto t = DramTier::Make(p, 4);
    for (uint8_t i = 1; i <= 4; ++i) t->Insert(K(i));
    std::set<ChunkKey, bool (*)(const ChunkKey&, const ChunkKey&)> in_use(
        [](const ChunkKey& a, const ChunkKey& b) { return a.Hex() < b.Hex(); });
    in_use = {K(1), K(2), K(3)};
    auto ok = [&](const ChunkKey& k) { return !in_use.count(k); };
    EXPECT_EQ(t->Victim(ok), K(4)) << DramPolicyName(p);
    in_use.insert(K(4));
    EXPECT_FALSE(t->Victim(ok).has_value()) << DramPolicyName(p);
  }
}

TEST(DramTierTest, ArcKeepsFrequentKeysThroughAScan) {
  auto arc = DramTier::Make(DramPolicy::kArc, 4);
  auto lru = DramTier::Make(DramPolicy::kLru, 4);
  for (DramTier* t : {arc.get(), lru.get()}) {
    t->Insert(K(1));
    t->Touch(K(1));  // reused: T2
    t->Insert(K(2));
    t->Touch(K(2));
  }
  // A scan of one-time chunks, each evicting a victim when the tier is full.
  for (uint8_t i = 10; i < 20; ++i) {
    for (DramTier* t : {arc.get(), lru.get()}) {
      if (t->size() >= 4) t->Evict(*t->Victim(kAll));
      t->Insert(K(i));
    }
  }
  EXPECT_TRUE(arc->Contains(K(1)));
  EXPECT_TRUE(arc->Contains(K(2)));
  EXPECT_FALSE(lru->Contains(K(1)));
  EXPECT_FALSE(lru->Contains(K(2)));
}

TEST(DramTierTest, ArcGhostHitAdaptsTowardsRecency) {
  auto t = DramTier::Make(DramPolicy::kArc, 2);
  t->Insert(K(1));
  t->Touch(K(1));   // T2
  t->Insert(K(2));  // T1
  // T1 is above its target (p = 0): the one-time key goes first.
  EXPECT_EQ(t->Victim(kAll), K(2));
  t->Evict(K(2));   // ghost in B1
  t->Insert(K(2));  // a B1 ghost hit: p grows, the key comes back as frequent
  EXPECT_TRUE(t->Contains(K(2)));
  t->Insert(K(3));  // T1 = {3}, within its target of 1 now: the victim comes from T2
  EXPECT_EQ(t->Victim(kAll), K(1));
}

TEST(DramTierTest, ErasedKeysLeaveNoGhost) {
  auto t = DramTier::Make(DramPolicy::kArc, 2);
  t->Insert(K(1));
  t->Erase(K(1));
  EXPECT_EQ(t->size(), 0u);
  t->Insert(K(1));
  t->Insert(K(2));
  t->Touch(K(2));
  EXPECT_EQ(t->Victim(kAll), K(1));  // back in T1 (no ghost hit promoted it)
}

}  // namespace
}  // namespace kvtier
