// The checks a ChunkTransfer passes before a job takes it (the engine's own jobs, and JobClient's over the slot
// path): a key, a block range inside the chunk, whole chunks for stores (X3), segments inside the blocks
// transferred with an address. kInvalidArgument names what is wrong.
#pragma once

#include <cstdint>

#include "kvtier/engine.h"

namespace kvtier {

Status ValidateTransfer(JobKind kind, const ChunkTransfer& t, uint32_t blocks_per_chunk, uint64_t block_stride);

}  // namespace kvtier
