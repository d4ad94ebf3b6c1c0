#include "kvtier/chunk_key.h"

#include <xxhash.h>

namespace kvtier {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<ChunkKey> ChunkKey::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status(StatusCode::kInvalidArgument, "chunk key is empty");
  if (bytes.size() > kMaxBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "chunk key has " + std::to_string(bytes.size()) + " bytes; at most 64 are allowed");
  }
  ChunkKey key;
  std::memcpy(key.bytes_.data(), bytes.data(), bytes.size());
  key.size_ = static_cast<uint8_t>(bytes.size());
  return key;
}

Result<ChunkKey> ChunkKey::FromHex(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 2 * kMaxBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "chunk key hex must have an even number of digits, 2 to 128; got " + std::to_string(hex.size()));
  }
  ChunkKey key;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = HexValue(hex[i]);
    int lo = HexValue(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return Status(StatusCode::kInvalidArgument,
                    "chunk key hex has a non-hex character at position " + std::to_string(hi < 0 ? i : i + 1));
    }
    key.bytes_[i / 2] = static_cast<uint8_t>(hi << 4 | lo);
  }
  key.size_ = static_cast<uint8_t>(hex.size() / 2);
  return key;
}

std::string ChunkKey::Hex() const {
  std::string out;
  out.reserve(2 * size_);
  AppendHex(&out);
  return out;
}

void ChunkKey::AppendHex(std::string* out) const {
  for (size_t i = 0; i < size_; ++i) {
    out->push_back(kHexDigits[bytes_[i] >> 4]);
    out->push_back(kHexDigits[bytes_[i] & 0xf]);
  }
}

size_t ChunkKeyHash::operator()(const ChunkKey& key) const noexcept {
  return static_cast<size_t>(XXH3_64bits(key.data(), key.size()));
}

}  // namespace kvtier
