// The chunk state machine's legal moves (src/engine/chunk_state.h): every documented path is legal, and moves
// that would skip a step, go backwards or leave a finished state are not. The engine checks every move in debug
// builds, so the whole suite exercises the engine's side.
#include "engine/chunk_state.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

using S = ChunkState;

void ExpectPath(JobKind kind, const std::vector<S>& path) {
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    EXPECT_TRUE(LegalChunkTransition(kind, path[i], path[i + 1]))
        << ChunkStateName(path[i]) << " -> " << ChunkStateName(path[i + 1]);
  }
}

TEST(ChunkState, EveryDocumentedPathIsLegal) {
  const JobKind L = JobKind::kLoad, W = JobKind::kStore;
  ExpectPath(
      L, {S::kQueued, S::kOpening, S::kWaitingForDisk, S::kTransferring, S::kVerifying, S::kSucceeded, S::kReleased});
  ExpectPath(W, {S::kQueued, S::kMakingDir, S::kMakingDir, S::kCreating, S::kWaitingForDisk, S::kTransferring,
                 S::kSyncing, S::kClosing, S::kLinking, S::kSucceeded, S::kReleased});
  ExpectPath(W, {S::kQueued, S::kCreating, S::kWaitingForDisk, S::kTransferring, S::kLinking, S::kMakingDir,
                 S::kLinking, S::kSucceeded});  // an anonymous temporary whose directory vanished before its link
  ExpectPath(W, {S::kQueued, S::kSucceeded, S::kReleased});  // deduplicated
  ExpectPath(W, {S::kTransferring, S::kCreating});           // ENOSPC: evict and write again
  for (S s : {S::kQueued, S::kOpening, S::kWaitingForDisk, S::kTransferring, S::kVerifying}) {
    EXPECT_TRUE(LegalChunkTransition(L, s, S::kFailed)) << ChunkStateName(s);
  }
  for (S s : {S::kQueued, S::kMakingDir, S::kCreating, S::kWaitingForDisk, S::kTransferring, S::kSyncing, S::kClosing,
              S::kLinking}) {
    EXPECT_TRUE(LegalChunkTransition(W, s, S::kFailed)) << ChunkStateName(s);
  }
  EXPECT_TRUE(LegalChunkTransition(L, S::kFailed, S::kReleased));
}

TEST(ChunkState, SkippedStepsBackwardMovesAndMovesOutOfFinishedStatesAreIllegal) {
  const JobKind L = JobKind::kLoad, W = JobKind::kStore;
  EXPECT_FALSE(LegalChunkTransition(L, S::kQueued, S::kTransferring)) << "no place at the disk without an open";
  EXPECT_FALSE(LegalChunkTransition(L, S::kTransferring, S::kSucceeded)) << "a slot is ready only once verified "
                                                                            "(K1)";
  EXPECT_FALSE(LegalChunkTransition(L, S::kOpening, S::kSucceeded));
  EXPECT_FALSE(LegalChunkTransition(L, S::kTransferring, S::kSyncing)) << "loads do not sync";
  EXPECT_FALSE(LegalChunkTransition(W, S::kTransferring, S::kVerifying)) << "stores do not verify";
  EXPECT_FALSE(LegalChunkTransition(W, S::kCreating, S::kSucceeded)) << "a store succeeds only by its link";
  EXPECT_FALSE(LegalChunkTransition(W, S::kLinking, S::kTransferring));
  EXPECT_FALSE(LegalChunkTransition(L, S::kSucceeded, S::kFailed)) << "an outcome never changes";
  EXPECT_FALSE(LegalChunkTransition(W, S::kFailed, S::kSucceeded));
  EXPECT_FALSE(LegalChunkTransition(L, S::kReleased, S::kFailed));
  EXPECT_FALSE(LegalChunkTransition(W, S::kReleased, S::kReleased));
  EXPECT_FALSE(LegalChunkTransition(L, S::kVerifying, S::kReleased)) << "released only once finished";
  for (S s : {S::kOpening, S::kTransferring, S::kSucceeded, S::kReleased}) {
    EXPECT_FALSE(LegalChunkTransition(L, s, S::kQueued)) << ChunkStateName(s);
  }
}

}  // namespace
}  // namespace kvtier
