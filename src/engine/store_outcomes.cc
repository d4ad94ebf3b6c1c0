#include "engine/store_outcomes.h"

namespace kvtier {

void StoreOutcomes::Watch(const ChunkKey& key) {
  MutexLock lock(mu_);
  outcomes_[key] = std::nullopt;
  watched_.store(outcomes_.size());
}

void StoreOutcomes::Record(const ChunkKey& key, const Status& status) {
  if (watched_.load() == 0) return;  // nobody watches a store: no lock on the reactor's way
  MutexLock lock(mu_);
  auto it = outcomes_.find(key);
  if (it != outcomes_.end() && !it->second.has_value()) it->second = status;
}

std::optional<Status> StoreOutcomes::Take(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto it = outcomes_.find(key);
  if (it == outcomes_.end() || !it->second.has_value()) return std::nullopt;
  std::optional<Status> outcome = std::move(it->second);
  outcomes_.erase(it);
  watched_.store(outcomes_.size());
  return outcome;
}

}  // namespace kvtier
