// StoreOutcomes: the outcomes of the committed stores a committer watches (Engine::WatchStore and TakeStoreOutcome,
// include/kvtier/engine.h). Watch(key) starts keeping the outcome of key's next store to end; the reactor that ends a
// store chunk calls Record; Take hands the outcome over once (nullopt while the store has not ended).
//
// Thread safety: every method may be called from any thread; mu_ is a leaf. Record takes no lock while nothing is
// watched, so the reactors pay nothing when no committer watches.
#pragma once

#include <atomic>
#include <optional>
#include <unordered_map>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"
#include "util/mutex.h"

namespace kvtier {

class StoreOutcomes {
 public:
  void Watch(const ChunkKey& key) EXCLUDES(mu_);
  void Record(const ChunkKey& key, const Status& status) EXCLUDES(mu_);
  std::optional<Status> Take(const ChunkKey& key) EXCLUDES(mu_);

 private:
  Mutex mu_;
  // nullopt while the store has not ended, then its status.
  std::unordered_map<ChunkKey, std::optional<Status>, ChunkKeyHash> outcomes_ GUARDED_BY(mu_);
  std::atomic<size_t> watched_{0};  // outcomes_.size(), read without the lock
};

}  // namespace kvtier
