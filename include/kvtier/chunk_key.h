// ChunkKey: the identity of one stored chunk, as given by the caller (vLLM's block hash of the chunk's last block,
// usually a 32-byte hash plus a 4-byte KV cache group index; other hashers give 8..32 bytes).
//
// A key is 1..64 opaque bytes. kvtier never interprets them beyond hex-encoding them into file names (L2), so a key
// can never produce a path component other than [0-9a-f]. A default-constructed ChunkKey is empty (size() == 0): it
// is a placeholder ("no key", e.g. a foreign file found by a scan) and is never a valid cache key; FromBytes and
// FromHex never return an empty key.
//
// Thread safety: a plain value; copy freely. Implemented in src/layout/chunk_key.cc (library kvtier_layout).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

class ChunkKey {
 public:
  static constexpr size_t kMaxBytes = 64;

  ChunkKey() = default;

  // Copies 1..64 bytes. Empty or longer input -> kInvalidArgument.
  static Result<ChunkKey> FromBytes(std::span<const uint8_t> bytes);
  // Parses 2..128 hex digits (either case, even count). Anything else -> kInvalidArgument.
  static Result<ChunkKey> FromHex(std::string_view hex);

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  const uint8_t* data() const { return bytes_.data(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Lowercase hex, 2 * size() characters.
  std::string Hex() const;
  // Appends the lowercase hex to *out (no allocation when *out has capacity).
  void AppendHex(std::string* out) const;

  friend bool operator==(const ChunkKey& a, const ChunkKey& b) {
    return a.size_ == b.size_ && std::memcmp(a.bytes_.data(), b.bytes_.data(), a.size_) == 0;
  }
  friend bool operator!=(const ChunkKey& a, const ChunkKey& b) { return !(a == b); }

 private:
  std::array<uint8_t, kMaxBytes> bytes_{};  // bytes past size_ are always zero
  uint8_t size_ = 0;
};

// Hash for unordered containers: XXH3-64 of the key bytes.
struct ChunkKeyHash {
  size_t operator()(const ChunkKey& key) const noexcept;
};

}  // namespace kvtier
