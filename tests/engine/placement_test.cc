// ChunkPlacement alone (src/engine/placement.h): a job's chunks spread evenly over the reactors, every unfinished
// chunk of one key on one reactor, and a finished chunk's place given back.
#include "engine/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "support/keys.h"

namespace kvtier {
namespace {

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 12, 0x9d); }

std::vector<ChunkKey> Keys(uint64_t first, uint64_t n) {
  std::vector<ChunkKey> out;
  for (uint64_t i = first; i < first + n; ++i) out.push_back(Key(i));
  return out;
}

TEST(ChunkPlacement, AJobsChunksGoRoundTheReactorsWhenAllAreIdle) {
  ChunkPlacement p(4);
  EXPECT_EQ(p.Place(Keys(0, 10)), (std::vector<uint32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
}

TEST(ChunkPlacement, ANewChunkGoesWhereItsKeysUnfinishedChunksRunElseToTheLeastBusy) {
  ChunkPlacement p(3);
  const auto first = p.Place(Keys(0, 3));  // one each
  EXPECT_EQ(first, (std::vector<uint32_t>{0, 1, 2}));
  p.Unplace(Key(1));                                            // reactor 1 is now the least busy
  EXPECT_EQ(p.Place(Keys(2, 1)), (std::vector<uint32_t>{2}));   // key 2 still runs on 2: stays there
  EXPECT_EQ(p.Place(Keys(10, 1)), (std::vector<uint32_t>{1}));  // a new key: the least busy
  EXPECT_EQ(p.Placed(Key(2)), std::optional<uint32_t>(2));
  p.Unplace(Key(2));
  EXPECT_EQ(p.Placed(Key(2)), std::optional<uint32_t>(2)) << "one of its two chunks is unfinished";
  p.Unplace(Key(2));
  EXPECT_EQ(p.Placed(Key(2)), std::nullopt);
  p.Unplace(Key(99));  // never placed: nothing happens
}

TEST(ChunkPlacement, WithOneReactorEverythingIsOnReactorZeroAndNothingIsTracked) {
  ChunkPlacement p(1);
  EXPECT_EQ(p.Place(Keys(0, 3)), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(p.Placed(Key(7)), std::optional<uint32_t>(0));
}

TEST(ChunkPlacement, ConcurrentJobsKeepTheCountsBalanced) {
  ChunkPlacement p(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&p, t] {
      for (int n = 0; n < 500; ++n) {
        const auto keys = Keys(static_cast<uint64_t>(t) * 1000 + n % 7, 5);
        p.Place(keys);
        for (const auto& k : keys) p.Unplace(k);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_EQ(p.Placed(Key(i)), std::nullopt) << i;
  // Every count back at zero: four new keys take one reactor each (the rotation decides which first).
  std::vector<uint32_t> fresh = p.Place(Keys(20000, 4));
  std::sort(fresh.begin(), fresh.end());
  EXPECT_EQ(fresh, (std::vector<uint32_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace kvtier
