#include "engine/chunk_state.h"

#include <initializer_list>

namespace kvtier {

const char* ChunkStateName(ChunkState s) {
  switch (s) {
    case ChunkState::kQueued: return "queued";
    case ChunkState::kOpening: return "opening";
    case ChunkState::kMakingDir: return "making-dir";
    case ChunkState::kCreating: return "creating";
    case ChunkState::kWaitingForDisk: return "waiting-for-disk";
    case ChunkState::kTransferring: return "transferring";
    case ChunkState::kVerifying: return "verifying";
    case ChunkState::kSyncing: return "syncing";
    case ChunkState::kClosing: return "closing";
    case ChunkState::kLinking: return "linking";
    case ChunkState::kSucceeded: return "succeeded";
    case ChunkState::kFailed: return "failed";
    case ChunkState::kReleased: return "released";
  }
  return "?";
}

bool IsFinished(ChunkState s) {
  return s == ChunkState::kSucceeded || s == ChunkState::kFailed || s == ChunkState::kReleased;
}

bool LegalChunkTransition(JobKind kind, ChunkState from, ChunkState to) {
  using S = ChunkState;
  const bool load = kind == JobKind::kLoad;
  const bool store = !load;
  auto from_any = [from](std::initializer_list<S> states) {
    for (S s : states) {
      if (s == from) return true;
    }
    return false;
  };
  switch (to) {
    case S::kQueued: return false;
    case S::kOpening: return load && from == S::kQueued;
    case S::kMakingDir:
    case S::kCreating:
      return store && from_any({S::kQueued, S::kMakingDir, S::kCreating, S::kTransferring, S::kLinking});
    case S::kWaitingForDisk: return (load && from == S::kOpening) || (store && from == S::kCreating);
    case S::kTransferring: return from == S::kWaitingForDisk;
    case S::kVerifying: return load && from == S::kTransferring;
    case S::kSyncing: return store && from == S::kTransferring;
    case S::kClosing: return store && from_any({S::kTransferring, S::kSyncing});
    case S::kLinking: return store && from_any({S::kTransferring, S::kSyncing, S::kClosing, S::kMakingDir});
    case S::kSucceeded: return load ? from == S::kVerifying : from_any({S::kQueued, S::kLinking});
    case S::kFailed: return !IsFinished(from);
    case S::kReleased: return from == S::kSucceeded || from == S::kFailed;
  }
  return false;
}

}  // namespace kvtier
