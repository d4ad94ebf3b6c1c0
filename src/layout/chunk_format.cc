#include "layout/chunk_format.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <xxhash.h>

#include <cstring>
#include <string>

#include "layout/xxh3_dispatch.h"

namespace kvtier {
namespace {

// Explicit little-endian encoding: the format must not depend on the host's byte order.
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

Status Corrupt(std::string message) { return Status(StatusCode::kCorrupt, std::move(message)); }

std::string HexOf(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0xf]);
  }
  return s;
}

// Geometry rules shared by encode (kInvalidArgument) and decode (kCorrupt).
std::string GeometryProblem(uint32_t num_blocks, uint64_t block_bytes, uint64_t block_stride, uint64_t payload_bytes) {
  if (num_blocks == 0 || num_blocks > kMaxBlocksPerChunk) {
    return "num_blocks " + std::to_string(num_blocks) + " is outside 1.." + std::to_string(kMaxBlocksPerChunk);
  }
  if (block_bytes == 0 || block_bytes > kMaxBlockBytes) {
    return "block_bytes " + std::to_string(block_bytes) + " is outside 1.." + std::to_string(kMaxBlockBytes);
  }
  if (block_stride != BlockStride(block_bytes)) {
    return "block_stride " + std::to_string(block_stride) +
           " is not round_up(block_bytes, 4096) = " + std::to_string(BlockStride(block_bytes));
  }
  if (payload_bytes != uint64_t{num_blocks} * block_stride) {
    return "payload_bytes " + std::to_string(payload_bytes) +
           " is not num_blocks * block_stride = " + std::to_string(uint64_t{num_blocks} * block_stride);
  }
  return {};
}

std::array<uint8_t, 32> HmacSha256(std::span<const uint8_t> key, std::string_view label, const uint8_t* data = nullptr,
                                   size_t len = 0) {
  std::array<uint8_t, 32> out{};
  unsigned int out_len = 0;
  std::string msg(label);
  if (data != nullptr) msg.append(reinterpret_cast<const char*>(data), len);
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const uint8_t*>(msg.data()), msg.size(),
       out.data(), &out_len);
  return out;
}

uint64_t KeyedBlockChecksum(const ChunkHeader& h, uint32_t index, const uint8_t* block, const ChecksumKey& key) {
  return internal::Xxh3Secret(block, h.block_bytes, key.xxh3_secret.data(), key.xxh3_secret.size()) ^
         BlockChecksumSeed(h, index);
}

}  // namespace

Result<ChecksumKey> DeriveChecksumKey(std::string_view secret) {
  if (secret.size() < 16) {
    return Status(StatusCode::kInvalidArgument,
                  "checksum secret has " + std::to_string(secret.size()) + " bytes; at least 16 are needed");
  }
  std::span<const uint8_t> k(reinterpret_cast<const uint8_t*>(secret.data()), secret.size());
  ChecksumKey out;
  out.mac_key = HmacSha256(k, "kvtier-k3-header-mac");
  for (size_t i = 0; i < out.xxh3_secret.size() / 32; ++i) {
    auto part = HmacSha256(k, "kvtier-k3-block-secret-" + std::to_string(i));
    std::memcpy(out.xxh3_secret.data() + 32 * i, part.data(), 32);
  }
  const auto id = HmacSha256(k, "kvtier-k3-key-id");
  std::memcpy(out.key_id.data(), id.data(), out.key_id.size());
  return out;
}

uint64_t BlockChecksum(const void* data, size_t len, uint64_t seed) { return internal::Xxh3Seeded(data, len, seed); }

uint64_t BlockChecksumSeed(const ChunkHeader& header, uint32_t index) {
  // Binding the seed to namespace, key and position makes a block copied from another file, another namespace or
  // another position fail verification even when its bytes are intact.
  uint8_t buf[16 + 1 + ChunkKey::kMaxBytes + 4];
  size_t n = 0;
  std::memcpy(buf, header.fingerprint.data(), 16);
  n += 16;
  buf[n++] = static_cast<uint8_t>(header.key.size());
  std::memcpy(buf + n, header.key.data(), header.key.size());
  n += header.key.size();
  PutU32(buf + n, index);
  n += 4;
  return XXH3_64bits(buf, n);
}

Status FillPayloadFields(ChunkHeader* header, const uint8_t* payload, const ChecksumKey* key) {
  header->checksum_kind = key != nullptr ? kChecksumKeyed : kChecksumXxh3Seeded;
  header->block_stride = BlockStride(header->block_bytes);
  header->payload_bytes = uint64_t{header->num_blocks} * header->block_stride;
  std::string problem =
      GeometryProblem(header->num_blocks, header->block_bytes, header->block_stride, header->payload_bytes);
  if (!problem.empty()) return Status(StatusCode::kInvalidArgument, "chunk header: " + problem);
  header->block_checksums.fill(0);
  for (uint32_t i = 0; i < header->num_blocks; ++i) {
    const uint8_t* block = payload + uint64_t{i} * header->block_stride;
    header->block_checksums[i] = key != nullptr
                                     ? KeyedBlockChecksum(*header, i, block, *key)
                                     : BlockChecksum(block, header->block_bytes, BlockChecksumSeed(*header, i));
  }
  return Status::Ok();
}

Status EncodeHeader(const ChunkHeader& h, std::span<uint8_t> out, const ChecksumKey* key) {
  if (out.size() != kHeaderBytes) {
    return Status(StatusCode::kInvalidArgument, "chunk header buffer has " + std::to_string(out.size()) +
                                                    " bytes, not " + std::to_string(kHeaderBytes));
  }
  if (h.key.empty()) return Status(StatusCode::kInvalidArgument, "chunk header: key is empty");
  std::string problem = GeometryProblem(h.num_blocks, h.block_bytes, h.block_stride, h.payload_bytes);
  if (!problem.empty()) return Status(StatusCode::kInvalidArgument, "chunk header: " + problem);
  if (h.checksum_kind != kChecksumXxh3Seeded && !(h.checksum_kind == kChecksumKeyed && key != nullptr)) {
    return Status(StatusCode::kInvalidArgument,
                  "chunk header: unsupported checksum_kind " + std::to_string(h.checksum_kind) +
                      (h.checksum_kind == kChecksumKeyed ? " without a checksum key" : ""));
  }
  for (uint32_t i = h.num_blocks; i < kMaxBlocksPerChunk; ++i) {
    if (h.block_checksums[i] != 0) {
      return Status(StatusCode::kInvalidArgument,
                    "chunk header: block_checksums[" + std::to_string(i) + "] is set beyond num_blocks");
    }
  }

  uint8_t* p = out.data();
  std::memset(p, 0, kHeaderBytes);
  std::memcpy(p + kOffMagic, kChunkMagic.data(), kChunkMagic.size());
  PutU32(p + kOffVersion, kFormatVersion);
  PutU32(p + kOffHeaderBytes, static_cast<uint32_t>(kHeaderBytes));
  std::memcpy(p + kOffFingerprint, h.fingerprint.data(), 16);
  p[kOffKeySize] = static_cast<uint8_t>(h.key.size());
  std::memcpy(p + kOffKey, h.key.data(), h.key.size());
  PutU32(p + kOffNumBlocks, h.num_blocks);
  PutU32(p + kOffChecksumKind, h.checksum_kind);
  PutU64(p + kOffBlockBytes, h.block_bytes);
  PutU64(p + kOffBlockStride, h.block_stride);
  PutU64(p + kOffPayloadBytes, h.payload_bytes);
  PutU64(p + kOffCreatedNs, h.created_unix_ns);
  for (uint32_t i = 0; i < kMaxBlocksPerChunk; ++i) PutU64(p + kOffBlockChecksums + 8 * i, h.block_checksums[i]);
  if (h.checksum_kind == kChecksumKeyed) {
    auto mac = HmacSha256(key->mac_key, "", p, kOffHeaderMac);
    std::memcpy(p + kOffHeaderMac, mac.data(), kHeaderMacBytes);
  }
  PutU64(p + kOffHeaderChecksum, XXH3_64bits(p, kOffHeaderChecksum));
  return Status::Ok();
}

namespace {

// The frame: size, magic, version, the header checksum, header_bytes.
Status CheckFrame(std::span<const uint8_t> bytes) {
  if (bytes.size() != kHeaderBytes) {
    return Corrupt("chunk header has " + std::to_string(bytes.size()) + " bytes, expected " +
                   std::to_string(kHeaderBytes) + " (truncated file?)");
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p + kOffMagic, kChunkMagic.data(), kChunkMagic.size()) != 0) {
    return Corrupt("chunk header: bad magic (not a kvtier chunk file)");
  }
  uint32_t version = GetU32(p + kOffVersion);
  if (version != kFormatVersion) {
    return Corrupt("chunk header: format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFormatVersion));
  }
  if (GetU64(p + kOffHeaderChecksum) != XXH3_64bits(p, kOffHeaderChecksum)) {
    return Corrupt("chunk header: header checksum mismatch (torn or damaged header)");
  }
  // The fields below are covered by the checksum; these checks catch a well-formed header that is still wrong.
  if (GetU32(p + kOffHeaderBytes) != kHeaderBytes) {
    return Corrupt("chunk header: header_bytes " + std::to_string(GetU32(p + kOffHeaderBytes)) + " is not 4096");
  }
  return Status::Ok();
}

// K3: the checksum kind against the reader's key (before anything else a forger controls; with a key, the MAC
// decides), and the reserved bytes, whose extent depends on the kind.
Status CheckKeying(const uint8_t* p, const ChecksumKey* checksum_key, bool check_keying) {
  const uint32_t kind = GetU32(p + kOffChecksumKind);
  if (check_keying && checksum_key != nullptr && kind != kChecksumKeyed) {
    return Corrupt("chunk header: checksum_kind " + std::to_string(kind) +
                   " is not keyed, and this reader requires keyed checksums (written without the secret)");
  }
  if (check_keying && checksum_key == nullptr && kind == kChecksumKeyed) {
    return Corrupt("chunk header: keyed checksums (kind 2) but this reader has no checksum secret");
  }
  const size_t reserved_begin = kind == kChecksumKeyed ? kOffHeaderMac + kHeaderMacBytes : kOffReservedBegin;
  if (!AllZero(p + kOffKeySize + 1, kOffKey - kOffKeySize - 1) ||
      !AllZero(p + reserved_begin, kOffHeaderChecksum - reserved_begin)) {
    return Corrupt("chunk header: reserved bytes are not zero");
  }
  if (check_keying && kind == kChecksumKeyed) {
    auto mac = HmacSha256(checksum_key->mac_key, "", p, kOffHeaderMac);
    if (CRYPTO_memcmp(mac.data(), p + kOffHeaderMac, kHeaderMacBytes) != 0) {
      return Corrupt("chunk header: header MAC mismatch (written with another checksum secret, or forged)");
    }
  }
  return Status::Ok();
}

// Whose entry this is: the namespace's fingerprint, then the key (its size, its zero padding, its bytes).
Result<ChunkKey> CheckIdentity(const uint8_t* p, std::span<const uint8_t, 16> expected_fingerprint,
                               const ChunkKey& expected_key) {
  if (std::memcmp(p + kOffFingerprint, expected_fingerprint.data(), 16) != 0) {
    return Corrupt("chunk header: foreign namespace (fingerprint " + HexOf({p + kOffFingerprint, 16}) + ", expected " +
                   HexOf(expected_fingerprint) + ")");
  }
  size_t key_size = p[kOffKeySize];
  if (key_size == 0 || key_size > ChunkKey::kMaxBytes) {
    return Corrupt("chunk header: key size " + std::to_string(key_size) + " is outside 1..64");
  }
  if (!AllZero(p + kOffKey + key_size, 64 - key_size)) {
    return Corrupt("chunk header: key padding (bytes " + std::to_string(kOffKey + key_size) + ".." +
                   std::to_string(kOffKey + 63) + " after a key of " + std::to_string(key_size) +
                   " bytes) is not zero");
  }
  ChunkKey key = ChunkKey::FromBytes({p + kOffKey, key_size}).value();
  if (key != expected_key) {
    return Corrupt("chunk header: key mismatch (file holds " + key.Hex() + ", expected " + expected_key.Hex() +
                   "; swapped or misplaced file)");
  }
  return key;
}

// The geometry and checksum fields into h, checked against each other and the namespace's (expected, if given).
Status ReadFields(const uint8_t* p, const ChunkGeometry* expected, ChunkHeader& h) {
  std::memcpy(h.fingerprint.data(), p + kOffFingerprint, 16);
  h.num_blocks = GetU32(p + kOffNumBlocks);
  h.checksum_kind = GetU32(p + kOffChecksumKind);
  h.block_bytes = GetU64(p + kOffBlockBytes);
  h.block_stride = GetU64(p + kOffBlockStride);
  h.payload_bytes = GetU64(p + kOffPayloadBytes);
  h.created_unix_ns = GetU64(p + kOffCreatedNs);
  if (h.checksum_kind != kChecksumXxh3Seeded && h.checksum_kind != kChecksumKeyed) {
    return Corrupt("chunk header: unsupported checksum_kind " + std::to_string(h.checksum_kind));
  }
  if (h.checksum_kind == kChecksumKeyed) std::memcpy(h.header_mac.data(), p + kOffHeaderMac, kHeaderMacBytes);
  std::string problem = GeometryProblem(h.num_blocks, h.block_bytes, h.block_stride, h.payload_bytes);
  if (!problem.empty()) return Corrupt("chunk header: geometry out of range: " + problem);
  if (expected != nullptr && (h.num_blocks != expected->num_blocks || h.block_bytes != expected->block_bytes)) {
    return Corrupt("chunk header: geometry " + std::to_string(h.num_blocks) + " blocks x " +
                   std::to_string(h.block_bytes) + " bytes differs from the namespace's " +
                   std::to_string(expected->num_blocks) + " x " + std::to_string(expected->block_bytes));
  }
  for (uint32_t i = 0; i < kMaxBlocksPerChunk; ++i) {
    h.block_checksums[i] = GetU64(p + kOffBlockChecksums + 8 * i);
    if (i >= h.num_blocks && h.block_checksums[i] != 0) {
      return Corrupt("chunk header: block_checksums[" + std::to_string(i) + "] is set beyond num_blocks");
    }
  }
  h.header_checksum = GetU64(p + kOffHeaderChecksum);
  return Status::Ok();
}

// DecodeHeader; without check_keying, the header's keying is not checked against the reader's key (the kind against
// whether there is a key, and the MAC), everything else is.
Result<ChunkHeader> Decode(std::span<const uint8_t> bytes, std::span<const uint8_t, 16> expected_fingerprint,
                           const ChunkKey& expected_key, const ChunkGeometry* expected, const ChecksumKey* checksum_key,
                           bool check_keying) {
  KVTIER_RETURN_IF_ERROR(CheckFrame(bytes));
  const uint8_t* p = bytes.data();
  KVTIER_RETURN_IF_ERROR(CheckKeying(p, checksum_key, check_keying));
  Result<ChunkKey> key = CheckIdentity(p, expected_fingerprint, expected_key);
  if (!key.ok()) return key.status();
  ChunkHeader h;
  h.key = std::move(key.value());
  KVTIER_RETURN_IF_ERROR(ReadFields(p, expected, h));
  return h;
}

}  // namespace

Result<ChunkHeader> DecodeHeader(std::span<const uint8_t> bytes, std::span<const uint8_t, 16> expected_fingerprint,
                                 const ChunkKey& expected_key, const ChunkGeometry* expected,
                                 const ChecksumKey* checksum_key) {
  return Decode(bytes, expected_fingerprint, expected_key, expected, checksum_key, /*check_keying=*/true);
}

bool KeyedForAnotherReader(std::span<const uint8_t> bytes, std::span<const uint8_t, 16> expected_fingerprint,
                           const ChunkKey& expected_key, const ChunkGeometry* expected,
                           const ChecksumKey* checksum_key) {
  return !Decode(bytes, expected_fingerprint, expected_key, expected, checksum_key, true).ok() &&
         Decode(bytes, expected_fingerprint, expected_key, expected, checksum_key, false).ok();
}

Status VerifyBlocks(const ChunkHeader& header, uint32_t first_block, uint32_t n, const uint8_t* data,
                    const ChecksumKey* key) {
  if (header.checksum_kind == kChecksumKeyed && key == nullptr) {
    return Status(StatusCode::kInvalidArgument, "keyed chunk (kind 2) verified without a checksum key");
  }
  if (uint64_t{first_block} + n > header.num_blocks) {
    return Status(StatusCode::kInvalidArgument,
                  "blocks [" + std::to_string(first_block) + ", " + std::to_string(uint64_t{first_block} + n) +
                      ") are outside the chunk's " + std::to_string(header.num_blocks) + " blocks");
  }
  for (uint32_t j = 0; j < n; ++j) {
    uint32_t i = first_block + j;
    const uint8_t* block = data + uint64_t{j} * header.block_stride;
    uint64_t sum = header.checksum_kind == kChecksumKeyed
                       ? KeyedBlockChecksum(header, i, block, *key)
                       : BlockChecksum(block, header.block_bytes, BlockChecksumSeed(header, i));
    if (sum != header.block_checksums[i]) {
      return Corrupt("chunk " + header.key.Hex() + ": checksum mismatch in block " + std::to_string(i));
    }
  }
  return Status::Ok();
}

Status CheckFileSize(const ChunkHeader& header, uint64_t file_bytes) {
  uint64_t want = ChunkFileBytes(header.num_blocks, header.block_bytes);
  if (file_bytes != want) {
    return Corrupt("chunk " + header.key.Hex() + ": file has " + std::to_string(file_bytes) + " bytes, expected " +
                   std::to_string(want) + (file_bytes < want ? " (truncated)" : ""));
  }
  return Status::Ok();
}

}  // namespace kvtier
