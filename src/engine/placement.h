// ChunkPlacement: which reactor runs each chunk in flight (I1). A new chunk goes to the reactor where its key's
// unfinished chunks run (first-writer-wins stores and shared reads are per reactor, so every chunk of one key in flight
// stays on one thread), else to the one with the fewest unfinished chunks, ties rotating, so that a job's chunks
// spread evenly (by key hash, the busiest of 16 reactors got about twice the mean of a 73-chunk job and held the job
// up: docs/architecture.md, "Threads and ownership").
//
// Thread safety: every method may be called from any thread; mu_ is a leaf. With one reactor nothing is tracked.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/chunk_key.h"
#include "util/mutex.h"

namespace kvtier {

class ChunkPlacement {
 public:
  explicit ChunkPlacement(uint32_t reactors) : reactors_(reactors), chunks_(reactors, 0) {}
  ChunkPlacement(const ChunkPlacement&) = delete;
  ChunkPlacement& operator=(const ChunkPlacement&) = delete;

  // The reactors of new chunks of these keys, in order, all placed at once (one job's chunks spread over the
  // reactors as they stand). Each placed chunk is Unplace'd when it finishes.
  std::vector<uint32_t> Place(std::span<const ChunkKey> keys) EXCLUDES(mu_);
  void Unplace(const ChunkKey& key) EXCLUDES(mu_);
  // The reactor the unfinished chunks of `key` run on; none when it has none (tests). With one reactor: always 0.
  std::optional<uint32_t> Placed(const ChunkKey& key) EXCLUDES(mu_);

 private:
  const uint32_t reactors_;
  Mutex mu_;
  // Per key with unfinished chunks: its reactor and their count.
  std::unordered_map<ChunkKey, std::pair<uint32_t, uint32_t>, ChunkKeyHash> placed_ GUARDED_BY(mu_);
  std::vector<uint32_t> chunks_ GUARDED_BY(mu_);  // per reactor: its unfinished chunks
  uint32_t next_ GUARDED_BY(mu_) = 0;             // where the search for the fewest starts: ties rotate
};

}  // namespace kvtier
