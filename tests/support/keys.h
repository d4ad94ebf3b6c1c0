// Distinct chunk keys for tests: key i of a family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/chunk_key.h"

namespace kvtier::test {

// A key of `size` bytes whose first 8 bytes are i (little-endian), zero elsewhere but byte `mark_at`, which is
// `mark`: each test file takes its own mark, so keys of different files never collide in a shared root. mark_at
// must be 8 or later and below size, and size a valid key size.
inline ChunkKey NumberedKey(uint64_t i, size_t size, size_t mark_at, uint8_t mark) {
  std::vector<uint8_t> b(size);
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(i >> (8 * k));
  b[mark_at] = mark;
  return ChunkKey::FromBytes(std::span<const uint8_t>(b.data(), b.size())).value();
}

}  // namespace kvtier::test
