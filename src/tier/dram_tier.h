// DramTier: the replacement policy of the DRAM tier (T1). The engine's resident map holds the slots; this class
// only orders the keys and picks victims. In-use entries (pinned, loading, being filled or written) are never
// victims: the owner says which keys are evictable right now through a predicate, as leveldb's cache keeps its
// in-use entries off the LRU list.
//
// LRU: one recency list. ARC (Megiddo & Modha, FAST'03): T1 (seen once recently) and T2 (seen at least twice), with
// ghost lists B1/B2 of recently evicted keys that adapt the target size p of T1; a scan of one-time chunks then
// evicts other one-time chunks instead of the frequently reused ones.
//
// Not thread-safe: the engine's ResidentSet (src/engine/resident_set.h) calls it under its mutex.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace kvtier {

enum class DramPolicy { kLru, kArc };

// "lru" | "arc"; anything else: kInvalidArgument naming the accepted values.
Result<DramPolicy> ParseDramPolicy(std::string_view name);
const char* DramPolicyName(DramPolicy p);

class DramTier {
 public:
  using Evictable = std::function<bool(const ChunkKey&)>;

  // capacity: the number of resident entries the tier aims at (ARC sizes its ghost lists from it); >= 1.
  static std::unique_ptr<DramTier> Make(DramPolicy policy, size_t capacity);
  virtual ~DramTier() = default;

  virtual void Insert(const ChunkKey& key) = 0;  // became resident (a miss filled, or a store reserved)
  virtual void Touch(const ChunkKey& key) = 0;   // a hit on a resident key; unknown keys are ignored
  virtual void Evict(const ChunkKey& key) = 0;   // the owner evicted it (ARC remembers it as a ghost)
  virtual void Erase(const ChunkKey& key) = 0;   // gone for another reason (failed read, abandoned store)
  // The next victim in policy order among keys for which evictable(key) is true; nullopt when none. The key stays
  // in the tier until the owner calls Evict.
  virtual std::optional<ChunkKey> Victim(const Evictable& evictable) const = 0;
  virtual bool Contains(const ChunkKey& key) const = 0;
  virtual size_t size() const = 0;  // resident keys
  virtual size_t capacity() const = 0;
  virtual DramPolicy policy() const = 0;
};

}  // namespace kvtier
