#include "kvtier/chunk_key.h"

#include <gtest/gtest.h>

#include <unordered_set>
#include <vector>

namespace kvtier {
namespace {

TEST(ChunkKey, HexRoundTripsForEverySupportedLength) {
  for (size_t n = 1; n <= ChunkKey::kMaxBytes; ++n) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 37 + n);
    auto key = ChunkKey::FromBytes(bytes);
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    EXPECT_EQ(key->size(), n);
    std::string hex = key->Hex();
    EXPECT_EQ(hex.size(), 2 * n);
    auto back = ChunkKey::FromHex(hex);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back.value(), key.value());
    EXPECT_TRUE(std::equal(back->bytes().begin(), back->bytes().end(), bytes.begin()));
  }
}

TEST(ChunkKey, HexIsLowercaseAndFromHexAcceptsUppercase) {
  auto key = ChunkKey::FromHex("ABcd0F");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->Hex(), "abcd0f");
}

TEST(ChunkKey, RejectsEmptyAndOversizedBytes) {
  std::vector<uint8_t> big(65, 1);
  EXPECT_EQ(ChunkKey::FromBytes({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkKey::FromBytes(big).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChunkKey, FromHexRejectsOddLengthNonHexEmptyAndTooLong) {
  for (std::string_view bad : std::initializer_list<std::string_view>{"", "a", "abc", "zz", "0g", "../..", "ab cd",
                                                                      std::string_view("a\0", 2)}) {
    EXPECT_EQ(ChunkKey::FromHex(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ChunkKey::FromHex(std::string(130, 'a')).ok());
  EXPECT_TRUE(ChunkKey::FromHex(std::string(128, 'a')).ok());
}

TEST(ChunkKey, EqualityUsesSizeAndBytes) {
  auto a = ChunkKey::FromHex("0000").value();
  auto b = ChunkKey::FromHex("00").value();
  auto c = ChunkKey::FromHex("0000").value();
  EXPECT_NE(a, b);
  EXPECT_EQ(a, c);
  EXPECT_TRUE(ChunkKey().empty());
}

TEST(ChunkKey, HashWorksInUnorderedSet) {
  std::unordered_set<ChunkKey, ChunkKeyHash> set;
  for (int i = 0; i < 1000; ++i) {
    uint8_t bytes[36] = {};
    std::memcpy(bytes, &i, sizeof(i));
    set.insert(ChunkKey::FromBytes(bytes).value());
  }
  EXPECT_EQ(set.size(), 1000u);
  EXPECT_EQ(ChunkKeyHash()(ChunkKey::FromHex("abcd").value()), ChunkKeyHash()(ChunkKey::FromHex("abcd").value()));
}

}  // namespace
}  // namespace kvtier
