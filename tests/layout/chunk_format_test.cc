#include "layout/chunk_format.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <vector>

namespace kvtier {
namespace {

constexpr Fingerprint16 kFp = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

struct Chunk {
  ChunkHeader header;
  std::vector<uint8_t> payload;
  std::vector<uint8_t> encoded = std::vector<uint8_t>(kHeaderBytes);
};

Chunk MakeChunk(uint32_t num_blocks, uint64_t block_bytes, std::string_view key_hex = "00112233445566778899") {
  Chunk c;
  c.header.fingerprint = kFp;
  c.header.key = ChunkKey::FromHex(key_hex).value();
  c.header.num_blocks = num_blocks;
  c.header.block_bytes = block_bytes;
  c.header.created_unix_ns = 1700000000123456789ull;
  c.payload.assign(num_blocks * BlockStride(block_bytes), 0);
  for (uint32_t i = 0; i < num_blocks; ++i) {
    for (uint64_t j = 0; j < block_bytes; ++j) c.payload[i * BlockStride(block_bytes) + j] = uint8_t(i * 31 + j);
  }
  EXPECT_TRUE(FillPayloadFields(&c.header, c.payload.data()).ok());
  EXPECT_TRUE(EncodeHeader(c.header, c.encoded).ok());
  return c;
}

TEST(ChunkFormat, GeometryIsAlignedAndContiguous) {
  EXPECT_EQ(BlockStride(1), 4096u);
  EXPECT_EQ(BlockStride(4096), 4096u);
  EXPECT_EQ(BlockStride(4097), 8192u);
  EXPECT_EQ(BlockRangeOffset(8192, 3), 4096u + 3 * 8192);
  EXPECT_EQ(BlockRangeBytes(8192, 2), 16384u);
  EXPECT_EQ(ChunkFileBytes(16, 5000), 4096u + 16 * 8192);
  EXPECT_EQ(kOffReservedBegin, 2192u);
}

TEST(ChunkFormat, HeaderEncodeDecodeRoundTrips) {
  Chunk c = MakeChunk(16, 5000);
  ChunkGeometry geometry{16, 5000};
  auto h = DecodeHeader(c.encoded, kFp, c.header.key, &geometry);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->fingerprint, kFp);
  EXPECT_EQ(h->key, c.header.key);
  EXPECT_EQ(h->num_blocks, 16u);
  EXPECT_EQ(h->block_bytes, 5000u);
  EXPECT_EQ(h->block_stride, 8192u);
  EXPECT_EQ(h->payload_bytes, 16u * 8192);
  EXPECT_EQ(h->created_unix_ns, c.header.created_unix_ns);
  EXPECT_EQ(h->block_checksums, c.header.block_checksums);
  EXPECT_TRUE(CheckFileSize(h.value(), ChunkFileBytes(16, 5000)).ok());
  EXPECT_EQ(CheckFileSize(h.value(), ChunkFileBytes(16, 5000) - 1).code(), StatusCode::kCorrupt);
  EXPECT_TRUE(VerifyBlocks(h.value(), 0, 16, c.payload.data()).ok());
  // A partial read of blocks [5, 9) verifies on its own.
  EXPECT_TRUE(VerifyBlocks(h.value(), 5, 4, c.payload.data() + BlockRangeOffset(8192, 5) - kHeaderBytes).ok());
}

TEST(ChunkFormat, EncodedBytesAreLittleEndianAtDocumentedOffsets) {
  Chunk c = MakeChunk(3, 4096);
  EXPECT_EQ(std::memcmp(c.encoded.data(), "KVTCHUNK", 8), 0);
  EXPECT_EQ(c.encoded[kOffVersion], 1);
  EXPECT_EQ(c.encoded[kOffHeaderBytes + 1], 0x10);  // 4096 = 0x1000
  EXPECT_EQ(c.encoded[kOffKeySize], 10);
  EXPECT_EQ(c.encoded[kOffNumBlocks], 3);
  EXPECT_EQ(c.encoded[kOffBlockBytes + 1], 0x10);
}

TEST(ChunkFormat, EverySingleBitFlipInTheHeaderIsDetected) {
  Chunk c = MakeChunk(4, 1000);
  for (size_t byte = 0; byte < kHeaderBytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> damaged = c.encoded;
      damaged[byte] ^= uint8_t(1u << bit);
      auto h = DecodeHeader(damaged, kFp, c.header.key);
      ASSERT_FALSE(h.ok()) << "flip at byte " << byte << " bit " << bit;
      ASSERT_EQ(h.status().code(), StatusCode::kCorrupt);
    }
  }
}

TEST(ChunkFormat, BadMagicVersionAndShortHeaderHaveSpecificMessages) {
  Chunk c = MakeChunk(2, 100);
  std::vector<uint8_t> bad = c.encoded;
  bad[0] = 'X';
  EXPECT_NE(DecodeHeader(bad, kFp, c.header.key).status().message().find("bad magic"), std::string::npos);
  bad = c.encoded;
  bad[kOffVersion] = 2;
  EXPECT_NE(DecodeHeader(bad, kFp, c.header.key).status().message().find("version 2"), std::string::npos);
  bad = c.encoded;
  bad[kOffCreatedNs] ^= 1;
  EXPECT_NE(DecodeHeader(bad, kFp, c.header.key).status().message().find("header checksum"), std::string::npos);
  auto s = DecodeHeader(std::span<const uint8_t>(c.encoded.data(), 100), kFp, c.header.key).status();
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated"), std::string::npos);
}

// a key whose padding is not zero (under a valid header checksum) is named as such, not as a bad size.
TEST(ChunkFormat, NonZeroKeyPaddingIsReportedAsSuch) {
  Chunk c = MakeChunk(2, 100);  // a 10-byte key
  std::vector<uint8_t> bad = c.encoded;
  bad[kOffKey + 40] = 0x5a;
  const uint64_t sum = XXH3_64bits(bad.data(), kOffHeaderChecksum);
  std::memcpy(bad.data() + kOffHeaderChecksum, &sum, 8);  // little-endian host
  auto h = DecodeHeader(bad, kFp, c.header.key);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(h.status().message().find("key padding"), std::string::npos) << h.status().message();
  EXPECT_NE(h.status().message().find("is not zero"), std::string::npos) << h.status().message();
}

TEST(ChunkFormat, ForeignFingerprintIsDetected) {
  Chunk c = MakeChunk(2, 100);
  Fingerprint16 other = kFp;
  other[15] ^= 0xff;
  auto h = DecodeHeader(c.encoded, other, c.header.key);
  EXPECT_EQ(h.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(h.status().message().find("foreign namespace"), std::string::npos) << h.status().message();
}

TEST(ChunkFormat, SwappedKeyIsDetected) {
  Chunk a = MakeChunk(2, 100, "aaaa");
  auto h = DecodeHeader(a.encoded, kFp, ChunkKey::FromHex("bbbb").value());
  EXPECT_EQ(h.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(h.status().message().find("key mismatch"), std::string::npos) << h.status().message();
  // Same leading bytes, different length.
  EXPECT_FALSE(DecodeHeader(a.encoded, kFp, ChunkKey::FromHex("aaaa00").value()).ok());
}

TEST(ChunkFormat, UnexpectedGeometryIsDetected) {
  Chunk c = MakeChunk(2, 100);
  ChunkGeometry geometry{4, 100};
  auto h = DecodeHeader(c.encoded, kFp, c.header.key, &geometry);
  EXPECT_EQ(h.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(h.status().message().find("geometry"), std::string::npos);
}

TEST(ChunkFormat, EncodeRefusesOutOfRangeGeometry) {
  ChunkHeader h;
  h.key = ChunkKey::FromHex("ab").value();
  h.num_blocks = 257;
  h.block_bytes = 10;
  h.block_stride = BlockStride(10);
  h.payload_bytes = 257 * h.block_stride;
  std::vector<uint8_t> out(kHeaderBytes);
  EXPECT_EQ(EncodeHeader(h, out).code(), StatusCode::kInvalidArgument);
  h.num_blocks = 1;
  h.payload_bytes = h.block_stride;
  h.block_stride = 10;  // not rounded
  EXPECT_EQ(EncodeHeader(h, out).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> small(100);
  h.block_stride = BlockStride(10);
  EXPECT_EQ(EncodeHeader(h, small).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeHeader(h, out).ok());
}

TEST(ChunkFormat, BlockChecksumDetectsAFlippedByteAndNamesTheBlock) {
  Chunk c = MakeChunk(8, 5000);
  std::vector<uint8_t> payload = c.payload;
  payload[5 * 8192 + 4999] ^= 0x40;
  Status s = VerifyBlocks(c.header, 0, 8, payload.data());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("block 5"), std::string::npos) << s.message();
  // Blocks before it still verify; padding is not covered (it is not data).
  EXPECT_TRUE(VerifyBlocks(c.header, 0, 5, payload.data()).ok());
  EXPECT_EQ(VerifyBlocks(c.header, 7, 2, payload.data()).code(), StatusCode::kInvalidArgument);
}

TEST(ChunkFormat, BlockMovedToAnotherPositionOrFileFailsVerification) {
  Chunk c = MakeChunk(2, 4096);
  std::vector<uint8_t> swapped(c.payload.size());
  std::memcpy(swapped.data(), c.payload.data() + 4096, 4096);
  std::memcpy(swapped.data() + 4096, c.payload.data(), 4096);
  EXPECT_EQ(VerifyBlocks(c.header, 0, 1, swapped.data()).code(), StatusCode::kCorrupt);
  EXPECT_EQ(VerifyBlocks(c.header, 1, 1, swapped.data() + 4096).code(), StatusCode::kCorrupt);
  // Identical blocks get different checksums at different positions and under different keys.
  ChunkHeader h = c.header;
  std::vector<uint8_t> same(2 * 4096, 0x5a);
  ASSERT_TRUE(FillPayloadFields(&h, same.data()).ok());
  EXPECT_NE(h.block_checksums[0], h.block_checksums[1]);
  ChunkHeader other = h;
  other.key = ChunkKey::FromHex("ffff").value();
  ASSERT_TRUE(FillPayloadFields(&other, same.data()).ok());
  EXPECT_NE(other.block_checksums[0], h.block_checksums[0]);
}

}  // namespace
}  // namespace kvtier
