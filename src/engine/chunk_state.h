// The state of one chunk of a promotion (load) or a committed store on its reactor (src/engine/load.cc, store.cc),
// and which moves between states are legal. Every change of Chunk::state goes through Reactor::SetState, which
// checks LegalChunkTransition in debug builds (an illegal move aborts naming both states). Both start from a slot
// the DRAM tier gave them (docs/architecture.md, "One data path"): a load's ends verified in it, a store's is
// written from it.
//
// Load:  kQueued -> kOpening -> kWaitingForDisk -> kTransferring -> kVerifying -> kSucceeded
// Store: kQueued -> kMakingDir* -> kCreating -> kWaitingForDisk -> kTransferring -> [kSyncing] -> [kClosing] ->
//        kLinking -> kSucceeded; kQueued -> kSucceeded (already published: deduplicated).
//        kMakingDir: one level at a time, and again when the directory vanished (at open, or at the link of an
//        anonymous temporary: then kMakingDir -> kLinking); an ENOSPC retry goes back to kMakingDir or kCreating.
// Any state before kSucceeded -> kFailed (a miss or a dropped store; operations still in flight keep its
// resources). kSucceeded and kFailed are finished: the job's outcome; -> kReleased once nothing in flight can
// touch the chunk's slot, fd or temporary and they have been returned.
#pragma once

#include <cstdint>

#include "kvtier/transfer_types.h"

namespace kvtier {

enum class ChunkState : uint8_t {
  kQueued,          // in its part, not started (a store waiting for the job's share of the reactor's writes)
  kOpening,         // load: the entry's open, then its statx, in flight
  kMakingDir,       // store: a fan-out mkdir in flight
  kCreating,        // store: the temporary's open in flight
  kWaitingForDisk,  // file open, queued for a place at the disk (io_depth)
  kTransferring,    // reads or writes at the disk
  kVerifying,       // load: reads back, queued for verification
  kSyncing,         // store: fsync in flight
  kClosing,         // store: the named temporary's close in flight (before its link, M1)
  kLinking,         // store: link to the final name in flight
  kSucceeded,       // finished: ok
  kFailed,          // finished: a miss or a dropped store
  kReleased,        // finished, and its resources are returned
};

const char* ChunkStateName(ChunkState s);
bool IsFinished(ChunkState s);  // kSucceeded, kFailed or kReleased
// Whether a chunk of a job of `kind` may move from `from` to `to` (see above).
bool LegalChunkTransition(JobKind kind, ChunkState from, ChunkState to);

}  // namespace kvtier
