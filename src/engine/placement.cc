#include "engine/placement.h"

namespace kvtier {

std::vector<uint32_t> ChunkPlacement::Place(std::span<const ChunkKey> keys) {
  std::vector<uint32_t> out(keys.size(), 0);
  if (reactors_ <= 1) return out;
  MutexLock lock(mu_);
  for (size_t k = 0; k < keys.size(); ++k) {
    auto [it, fresh] = placed_.try_emplace(keys[k], 0u, 0u);
    if (fresh) {
      uint32_t best = next_ % reactors_;
      for (uint32_t i = 1; i < reactors_; ++i) {
        const uint32_t r = (next_ + i) % reactors_;
        if (chunks_[r] < chunks_[best]) best = r;
      }
      next_ = best + 1;
      it->second.first = best;
    }
    ++it->second.second;
    ++chunks_[it->second.first];
    out[k] = it->second.first;
  }
  return out;
}

void ChunkPlacement::Unplace(const ChunkKey& key) {
  if (reactors_ <= 1) return;
  MutexLock lock(mu_);
  auto it = placed_.find(key);
  if (it == placed_.end()) return;
  --chunks_[it->second.first];
  if (--it->second.second == 0) placed_.erase(it);
}

std::optional<uint32_t> ChunkPlacement::Placed(const ChunkKey& key) {
  if (reactors_ <= 1) return 0;
  MutexLock lock(mu_);
  auto it = placed_.find(key);
  if (it == placed_.end()) return std::nullopt;
  return it->second.first;
}

}  // namespace kvtier
