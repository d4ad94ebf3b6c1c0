// The checksums' XXH3 variants must agree bit for bit with the libxxhash package's: a file written by a kvtier on
// one CPU is verified by a kvtier on another (or by an older build that used the package's XXH3 only).
#include "layout/xxh3_dispatch.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "layout/chunk_format.h"

namespace kvtier {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n + 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 2654435761u >> 13) + salt);
  return v;
}

// XXH3 changes code path at 16, 128 and 240 bytes and at every 1 KiB stripe block; lengths around each.
const std::vector<size_t> kLengths = {0,   1,   3,   4,    8,    9,    16,   17,    128,    129,           240,
                                      241, 255, 256, 1023, 1024, 1025, 4096, 65537, 131072, (1 << 20) + 13};

TEST(Xxh3Dispatch, SeededMatchesTheLibraryAtEveryLengthAndAlignment) {
  for (size_t len : kLengths) {
    auto data = Bytes(len, 7);
    for (size_t misalign : {0, 1, 31}) {
      for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b97f4a7c15ull}}) {
        const uint8_t* p = data.data() + misalign;
        ASSERT_EQ(internal::Xxh3Seeded(p, len, seed), XXH3_64bits_withSeed(p, len, seed))
            << "len " << len << " misalign " << misalign << " seed " << seed << " variant " << internal::Xxh3Variant();
#if defined(KVTIER_XXH3_AVX2)
        if (__builtin_cpu_supports("avx2")) {
          ASSERT_EQ(internal::Xxh3SeededAvx2(p, len, seed), XXH3_64bits_withSeed(p, len, seed)) << "len " << len;
        }
#endif
      }
    }
  }
}

TEST(Xxh3Dispatch, WithSecretMatchesTheLibrary) {
  std::vector<uint8_t> secret(192);
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t len : kLengths) {
    auto data = Bytes(len, 3);
    ASSERT_EQ(internal::Xxh3Secret(data.data() + 5, len, secret.data(), secret.size()),
              XXH3_64bits_withSecret(data.data() + 5, len, secret.data(), secret.size()))
        << "len " << len;
  }
}

TEST(Xxh3Dispatch, BlockChecksumIsTheLibrarysSeededXxh3) {
  auto data = Bytes(1 << 16, 9);
  EXPECT_EQ(BlockChecksum(data.data(), 1 << 16, 42), XXH3_64bits_withSeed(data.data(), 1 << 16, 42));
  // A flipped byte changes it (the variant really hashes the bytes it is given).
  const uint64_t before = BlockChecksum(data.data(), 1 << 16, 42);
  data[12345] ^= 1;
  EXPECT_NE(BlockChecksum(data.data(), 1 << 16, 42), before);
}

TEST(Xxh3Dispatch, NamesTheVariantInUse) {
  const std::string_view v = internal::Xxh3Variant();
  EXPECT_TRUE(v == "avx2" || v == "libxxhash") << v;
#if defined(KVTIER_XXH3_AVX2)
  if (__builtin_cpu_supports("avx2") && std::getenv("KVTIER_XXH3") == nullptr) {
    EXPECT_EQ(v, "avx2");
  }
#endif
}

}  // namespace
}  // namespace kvtier
