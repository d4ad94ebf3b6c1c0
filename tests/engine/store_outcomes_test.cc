// StoreOutcomes alone (src/engine/store_outcomes.h): only watched stores' outcomes are kept, each handed over once.
#include "engine/store_outcomes.h"

#include <gtest/gtest.h>

#include "support/keys.h"

namespace kvtier {
namespace {

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 13, 0x4e); }

TEST(StoreOutcomes, AWatchedStoresOutcomeIsHandedOverOnceAndAnUnwatchedOneIsNotKept) {
  StoreOutcomes o;
  o.Record(Key(1), Status::Ok());  // nobody watches: dropped
  EXPECT_EQ(o.Take(Key(1)), std::nullopt);
  o.Watch(Key(1));
  EXPECT_EQ(o.Take(Key(1)), std::nullopt) << "not ended yet";
  o.Record(Key(2), Status::Ok());  // another key: not watched
  o.Record(Key(1), Status(StatusCode::kNoSpace, "full"));
  o.Record(Key(1), Status::Ok());  // a later store of the key does not overwrite the first outcome
  auto got = o.Take(Key(1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), StatusCode::kNoSpace);
  EXPECT_EQ(o.Take(Key(1)), std::nullopt) << "handed over once";
  EXPECT_EQ(o.Take(Key(2)), std::nullopt);
}

}  // namespace
}  // namespace kvtier
