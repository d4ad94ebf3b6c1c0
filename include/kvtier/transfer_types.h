// The value types the engine's parts and its clients share, in a header of their own so that the parts below the
// engine (src/transfer, src/engine/chunk_state.h, src/engine/resident_set.h) need not include kvtier/engine.h:
// where a chunk's bytes go (CopySegment), which way they move (JobKind), the slot a resident chunk is in (SlotRef)
// and a promotion's answer (PromoteResult). Plain values; copy them freely between threads.
#pragma once

#include <cstdint>

namespace kvtier {

// Where a chunk's bytes go to (load) or come from (store). Offsets are relative to the first block transferred;
// `address` is interpreted by the device copier (a host pointer for the host copier, a device pointer for CUDA).
struct CopySegment {
  uint64_t slot_offset = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
};

enum class JobKind { kLoad, kStore };

// A chunk resident in a staging slot. Another process that attached the pool (StagingPool::Attach(pool_name()))
// finds its payload at SlotData(slot) + kHeaderBytes, block b at b * block_stride() from there.
struct SlotRef {
  uint32_t slot = 0;
  uint32_t generation = 0;
};

enum class PromoteState { kReady, kPending, kMiss };
struct PromoteResult {
  PromoteState state = PromoteState::kMiss;
  SlotRef ref;  // valid when kReady
};

}  // namespace kvtier
