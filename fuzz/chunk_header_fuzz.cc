// libFuzzer target: the chunk header decoder (src/layout/chunk_format.h), the bytes every reader trusts first.
//
// Input: byte 0 selects what the harness does, the rest is the header (and, after 4096 bytes, payload):
//   bit 0: recompute the header checksum over the mutated bytes first, so mutations reach the field checks behind
//          it instead of stopping at "header checksum mismatch";
//   bit 1: decode with a checksum key (K3 path: MAC check);
//   bit 2: decode without the expected geometry.
// Properties: never crashes or reads out of bounds; a header that decodes re-encodes to the same bytes; block
// verification of whatever payload follows never crashes.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "layout/chunk_format.h"

namespace kvtier {

namespace {
const Fingerprint16 kFp = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const ChecksumKey& Key() {
  static const ChecksumKey k = DeriveChecksumKey("fuzzing-secret-0123456789").value();
  return k;
}
int FuzzOne(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> bytes(data + 1, data + size);
  const size_t header_len = std::min<size_t>(bytes.size(), kHeaderBytes);
  std::vector<uint8_t> header(bytes.begin(), bytes.begin() + header_len);
  if ((mode & 1) && header.size() == kHeaderBytes) {
    const uint64_t sum = XXH3_64bits(header.data(), kOffHeaderChecksum);
    for (int i = 0; i < 8; ++i) header[kOffHeaderChecksum + i] = static_cast<uint8_t>(sum >> (8 * i));
  }
  // The expected key: the one the header claims when it is well formed, so decoding can get past the key check.
  ChunkKey key = ChunkKey::FromHex("00ff").value();
  if (header.size() > kOffKey + 64 && header[kOffKeySize] >= 1 && header[kOffKeySize] <= ChunkKey::kMaxBytes) {
    auto k = ChunkKey::FromBytes(std::span<const uint8_t>(header.data() + kOffKey, header[kOffKeySize]));
    if (k.ok()) key = k.value();
  }
  const ChunkGeometry geometry{4, 8192};
  const ChecksumKey* ck = (mode & 2) ? &Key() : nullptr;
  auto h = DecodeHeader(header, kFp, key, (mode & 4) ? nullptr : &geometry, ck);
  if (!h.ok()) return 0;
  // Round trip: a header that decodes is exactly what encoding it produces.
  std::vector<uint8_t> again(kHeaderBytes);
  if (!EncodeHeader(h.value(), again, ck).ok()) __builtin_trap();
  if (std::memcmp(again.data(), header.data(), kHeaderBytes) != 0) __builtin_trap();
  // Verification of the payload that follows (bounded by what is there).
  const uint64_t have = bytes.size() - header_len;
  const uint64_t stride = h->block_stride;
  const uint32_t n = stride ? static_cast<uint32_t>(std::min<uint64_t>(h->num_blocks, have / stride)) : 0;
  if (n > 0) (void)VerifyBlocks(h.value(), 0, n, bytes.data() + kHeaderBytes, ck);
  return 0;
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kvtier::FuzzOne(data, size); }
