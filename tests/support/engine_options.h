// BaseOptions: the engine options a test starts from, so that test files do not each spell out the same identity:
// the root, a bfloat16 identity named `model` (revision `revision`) of `tokens_per_chunk` tokens in
// `blocks_per_chunk` blocks of `block_bytes`; everything else at its default. A test sets what it is about (the
// pool, io_depth, timeouts) on the result.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/engine.h"

namespace kvtier::test {

inline EngineOptions BaseOptions(const std::string& root, const std::string& model, uint32_t tokens_per_chunk,
                                 uint32_t blocks_per_chunk, uint64_t block_bytes, const std::string& revision = "r1") {
  EngineOptions o;
  o.root = root;
  o.identity.model = model;
  o.identity.revision = revision;
  o.identity.kv_dtype = "bfloat16";
  o.identity.tokens_per_chunk = tokens_per_chunk;
  o.identity.blocks_per_chunk = blocks_per_chunk;
  o.identity.block_bytes = block_bytes;
  return o;
}

}  // namespace kvtier::test
