// The chunk file format (SPEC L3, K1; docs/file-format.md has the byte-by-byte table).
//
// One file per chunk: a fixed header of kHeaderBytes, then the payload. The payload holds num_blocks GPU blocks;
// block i starts at kHeaderBytes + i * block_stride, with block_stride = round_up(block_bytes, kPayloadAlignment)
// and zero padding after each block. Any run of blocks [first, first + n) is therefore one contiguous read starting
// and ending on a 4096-byte boundary (usable with O_DIRECT on any filesystem whose alignment is <= 4096), and a
// prefix [0, n) together with the header is the single read [0, kHeaderBytes + n * block_stride).
//
// Integrity: the header carries the namespace fingerprint, the full key, the geometry and one XXH3-64 checksum per
// block (seeded by key and block index, so a block moved to another position or another file fails), and ends with
// an XXH3-64 checksum of everything before it. Any mismatch is kCorrupt: the caller treats it as a miss (K1).
//
// All functions are pure (no I/O) and thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace kvtier {

inline constexpr std::array<uint8_t, 8> kChunkMagic = {'K', 'V', 'T', 'C', 'H', 'U', 'N', 'K'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr uint64_t kPayloadAlignment = 4096;
inline constexpr uint32_t kMaxBlocksPerChunk = 256;
// Upper bound on one block's bytes accepted from a header (guards size arithmetic against hostile headers).
inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 32;
// ChunkHeader::checksum_kind values. 1: unkeyed XXH3-64 seeded by (fingerprint, key, block index).
// 2: keyed (SPEC K3): an HMAC-SHA256 of the header at kOffHeaderMac, and per block XXH3-64 under a 192-byte secret
// derived from the key, XORed with kind 1's seed (which binds namespace, key and position).
inline constexpr uint32_t kChecksumXxh3Seeded = 1;
inline constexpr uint32_t kChecksumKeyed = 2;

// Byte offsets inside the header (see docs/file-format.md). All integers little-endian.
inline constexpr size_t kOffMagic = 0;             // 8 bytes
inline constexpr size_t kOffVersion = 8;           // u32
inline constexpr size_t kOffHeaderBytes = 12;      // u32, == kHeaderBytes
inline constexpr size_t kOffFingerprint = 16;      // 16 bytes
inline constexpr size_t kOffKeySize = 32;          // u8, then 7 zero bytes
inline constexpr size_t kOffKey = 40;              // 64 bytes, zero padded
inline constexpr size_t kOffNumBlocks = 104;       // u32
inline constexpr size_t kOffChecksumKind = 108;    // u32
inline constexpr size_t kOffBlockBytes = 112;      // u64
inline constexpr size_t kOffBlockStride = 120;     // u64
inline constexpr size_t kOffPayloadBytes = 128;    // u64
inline constexpr size_t kOffCreatedNs = 136;       // u64
inline constexpr size_t kOffBlockChecksums = 144;  // kMaxBlocksPerChunk x u64 (unused slots zero)
inline constexpr size_t kOffReservedBegin = kOffBlockChecksums + 8 * kMaxBlocksPerChunk;  // 2192: zeros up to...
inline constexpr size_t kOffHeaderMac = kOffReservedBegin;  // kind 2 only: 32 bytes HMAC-SHA256 of [0, 2192)
inline constexpr size_t kHeaderMacBytes = 32;
inline constexpr size_t kOffHeaderChecksum = kHeaderBytes - 8;  // 4088: u64

using Fingerprint16 = std::array<uint8_t, 16>;

// The keys of checksum_kind 2, derived once from the operator's secret (EngineOptions::checksum_secret).
struct ChecksumKey {
  std::array<uint8_t, 32> mac_key{};       // HMAC-SHA256(secret, "kvtier-k3-header-mac")
  std::array<uint8_t, 192> xxh3_secret{};  // HMAC-SHA256(secret, "kvtier-k3-block-secret-<i>"), i = 0..5
  // The first 16 bytes of HMAC-SHA256(secret, "kvtier-k3-key-id"): names the secret in a namespace's MANIFEST
  // (checksum_key=k3:<hex>, docs/file-format.md) without revealing it, so an engine given another secret is refused
  // at open instead of taking every entry for corrupt (K3).
  std::array<uint8_t, 16> key_id{};
};
// kInvalidArgument for a secret shorter than 16 bytes.
Result<ChecksumKey> DeriveChecksumKey(std::string_view secret);
// The key of an option value (EngineOptions::checksum_secret, fsck --checksum-secret): "file:<path>" reads the key
// file (a regular file <= 64 KiB, not readable by others; trailing newlines dropped), anything else is the secret.
// Unlike the rest of this header this reads a file (checksum_secret.cc).
Result<ChecksumKey> ChecksumKeyFromOption(const std::string& spec);

struct ChunkHeader {
  Fingerprint16 fingerprint{};  // the namespace's 128-bit fingerprint (Namespace::fingerprint())
  ChunkKey key;
  uint32_t num_blocks = 0;
  uint64_t block_bytes = 0;      // meaningful bytes of one GPU block
  uint64_t block_stride = 0;     // BlockStride(block_bytes)
  uint64_t payload_bytes = 0;    // num_blocks * block_stride
  uint64_t created_unix_ns = 0;  // informational only (eviction uses the index, not this)
  uint32_t checksum_kind = kChecksumXxh3Seeded;
  std::array<uint64_t, kMaxBlocksPerChunk> block_checksums{};  // [i] for i < num_blocks; zero beyond
  std::array<uint8_t, kHeaderMacBytes> header_mac{};           // kind 2: filled by EncodeHeader
  uint64_t header_checksum = 0;                                // filled by EncodeHeader, verified by DecodeHeader
};

// Expected geometry of the chunks of a namespace (blocks_per_chunk and block_bytes of its identity).
struct ChunkGeometry {
  uint32_t num_blocks = 0;
  uint64_t block_bytes = 0;
};

inline constexpr uint64_t BlockStride(uint64_t block_bytes) {
  return (block_bytes + kPayloadAlignment - 1) / kPayloadAlignment * kPayloadAlignment;
}
// File offset of block `first` (the start of the aligned read of blocks [first, first + n)).
inline constexpr uint64_t BlockRangeOffset(uint64_t block_stride, uint32_t first) {
  return kHeaderBytes + uint64_t{first} * block_stride;
}
// Length of the aligned read of n consecutive blocks.
inline constexpr uint64_t BlockRangeBytes(uint64_t block_stride, uint32_t n) { return uint64_t{n} * block_stride; }
// Size of a complete chunk file.
inline constexpr uint64_t ChunkFileBytes(uint32_t num_blocks, uint64_t block_bytes) {
  return kHeaderBytes + uint64_t{num_blocks} * BlockStride(block_bytes);
}

// XXH3-64 of len bytes with the given seed.
uint64_t BlockChecksum(const void* data, size_t len, uint64_t seed = 0);
// The seed of block `index`'s checksum for kChecksumXxh3Seeded: derived from the fingerprint, the key and the index.
uint64_t BlockChecksumSeed(const ChunkHeader& header, uint32_t index);

// Fills header->block_stride, payload_bytes, checksum_kind (2 with a key, else 1) and block_checksums[0,
// num_blocks) from a payload laid out as above (num_blocks * block_stride bytes; only block_bytes of each block
// are summed). fingerprint, key, num_blocks and block_bytes must be set. Returns kInvalidArgument for out-of-range
// geometry.
Status FillPayloadFields(ChunkHeader* header, const uint8_t* payload, const ChecksumKey* key = nullptr);

// Encodes the header into out (exactly kHeaderBytes, else kInvalidArgument), computing the header MAC (kind 2,
// which needs `key`) and the header checksum last. Validates geometry first (kInvalidArgument).
// header.header_checksum and header_mac are ignored.
Status EncodeHeader(const ChunkHeader& header, std::span<uint8_t> out, const ChecksumKey* key = nullptr);

// Decodes and verifies a header read from a chunk file. Returns kCorrupt with a precise message on: size other
// than kHeaderBytes, bad magic, unsupported version, bad header checksum, non-zero reserved bytes, foreign
// namespace (fingerprint differs), key mismatch (e.g. a file swapped with another entry's), geometry out of range
// or, when `expected` is given, different from it. With `checksum_key` (K3) only kind 2 with a valid MAC is
// accepted; without it kind 2 is refused (the reader cannot verify it). Either way a mismatch is kCorrupt.
Result<ChunkHeader> DecodeHeader(std::span<const uint8_t> bytes, std::span<const uint8_t, 16> expected_fingerprint,
                                 const ChunkKey& expected_key, const ChunkGeometry* expected = nullptr,
                                 const ChecksumKey* checksum_key = nullptr);

// K3 (docs/file-format.md, "A MANIFEST without checksum_key"): true when DecodeHeader refuses `bytes` only because
// of the reader's key: the header is whole and every other check passes, but it is keyed (kind 2) and the reader has
// no key or one under which its MAC does not verify, or it is unkeyed (kind 1) and the reader has a key. In a
// namespace whose MANIFEST does not record its key, such an entry was written under another secret (or none): a
// reader takes it for a miss and leaves it in place, never for a corrupt entry to remove.
bool KeyedForAnotherReader(std::span<const uint8_t> bytes, std::span<const uint8_t, 16> expected_fingerprint,
                           const ChunkKey& expected_key, const ChunkGeometry* expected = nullptr,
                           const ChecksumKey* checksum_key = nullptr);

// Verifies blocks [first_block, first_block + n) against the header's checksums. `data` holds n * block_stride
// bytes as read from BlockRangeOffset(first_block). kCorrupt names the first failing block; kInvalidArgument if the
// range is outside [0, num_blocks).
// A kind-2 header needs the key (kInvalidArgument without it).
Status VerifyBlocks(const ChunkHeader& header, uint32_t first_block, uint32_t n, const uint8_t* data,
                    const ChecksumKey* key = nullptr);

// kCorrupt unless file_bytes == ChunkFileBytes(header.num_blocks, header.block_bytes) (truncated or extended file).
Status CheckFileSize(const ChunkHeader& header, uint64_t file_bytes);

}  // namespace kvtier
