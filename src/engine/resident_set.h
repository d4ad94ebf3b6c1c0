// ResidentSet: the DRAM tier (T1, T2, R2, R3). Which chunks are held in which staging-pool slot, in which state,
// pinned by how many users, ordered by the tier's replacement policy (DramTier), and the preload accounting.
// It also hands out every pool slot the engine takes (AcquireSlot): a slot for anyone may have to come from evicting
// a resident chunk, and only the set knows which may go.
//
// Ownership: one per engine, shared by the caller threads (lookups, promotions, pins, store reservations and
// commits) and the reactors (DRAM hits, promotions' reads, written stores, demand slots). Every member is guarded
// by mu_. It never sees the engine: it is given the pool, the Stats to count in, and a function that gives a slot
// back (the engine's, which wakes reactors waiting for one); the engine decides what to load and write. Lock order:
// mu_ → the pool's allocation mutex (and whatever free_slot takes); the engine calls in holding none of its own
// locks, and the disk index is never called with mu_ held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"
#include "kvtier/transfer_types.h"
#include "staging/staging_pool.h"
#include "stats/stats.h"
#include "tier/dram_tier.h"
#include "util/mutex.h"

namespace kvtier {

class ResidentSet {
 public:
  struct Options {
    DramPolicy policy = DramPolicy::kLru;
    uint32_t max_slots = 1;            // T1: resident entries the tier retains, unused preloads not counted
                                       // (dram_max_slots)
    uint32_t max_unused_preloads = 1;  // R2: resident preloads no demand load used yet
  };
  // free_slot(slot) returns a slot to the pool; called with mu_ held.
  ResidentSet(StagingPool& pool, const Options& options, Stats& stats, std::function<void(uint32_t slot)> free_slot);
  ResidentSet(const ResidentSet&) = delete;
  ResidentSet& operator=(const ResidentSet&) = delete;

  // A demand promotion someone waits for is not evicted until it is pinned (the scheduler's next lookup) or this
  // passes, so another request's promotion cannot take the slot between the read and the load (no re-reads).
  static constexpr int64_t kAwaitedProtectionNs = 2'000'000'000;

  // Lookup's answer from the DRAM tier: kReady (ready or being written: a hit, touched), kFilling (a store's slot a
  // worker is filling), kNone (absent, or still being read: ask the disk index).
  enum class Hit { kReady, kFilling, kNone };
  Hit Lookup(const ChunkKey& key) EXCLUDES(mu_);
  PromoteState Residency(const ChunkKey& key) const EXCLUDES(mu_);

  // Promote, first half: a resident key is touched (a demand promotion also uses a preload and, when unpinned, is
  // protected for kAwaitedProtectionNs) and answered kReady (with its slot) or kPending; nullopt when absent.
  std::optional<PromoteResult> PromoteResident(const ChunkKey& key, bool speculative, int64_t now_ns) EXCLUDES(mu_);
  // Promote, second half (the disk index found the entry): a slot for it, the key resident in state kLoading. The
  // slot's number, or nullopt (*result says why: kMiss when no slot is free or, for a preload, R2's bound on unused
  // preloads is reached; another thread's promotion of the key in between answers as PromoteResident). The caller
  // reads the entry into the slot and calls Loaded.
  std::optional<uint32_t> BeginLoad(const ChunkKey& key, bool speculative, int64_t now_ns, PromoteResult* result)
      EXCLUDES(mu_);
  // A promotion's read finished: ok makes the entry ready at generation; a failure frees its slot. Ignored unless
  // key is resident in `slot`.
  void Loaded(const ChunkKey& key, uint32_t slot, uint32_t generation, bool ok, int64_t now_ns) EXCLUDES(mu_);

  // A load's DRAM hit (T2): pins the ready (or being written) entry, touches it, uses its preload. nullopt: not a hit.
  std::optional<SlotRef> PinIfReady(const ChunkKey& key) EXCLUDES(mu_);
  // PinResident: every key ready (or being written), else kNotFound and nothing pinned.
  Result<std::vector<SlotRef>> Pin(std::span<const ChunkKey> keys) EXCLUDES(mu_);
  void Unpin(std::span<const ChunkKey> keys) EXCLUDES(mu_);

  // ReserveForStore: a slot in state kFilling for each key neither resident, nor on_disk[i] (indexed or being
  // stored), nor earlier in keys (those count stores_deduplicated and get nullopt). kResourceExhausted, with
  // nothing reserved, when the pool runs out.
  Result<std::vector<std::optional<SlotRef>>> ReserveForStore(std::span<const ChunkKey> keys,
                                                              const std::vector<bool>& on_disk) EXCLUDES(mu_);
  // CommitStore: success publishes each filled slot and makes it kWriting (resident, not evictable while written);
  // its key and slot are appended to *keys and *slots for the engine to write. A failure frees the slot (counted in
  // stores_dropped). Keys not being filled are skipped.
  void Commit(std::span<const ChunkKey> keys, bool success, std::vector<ChunkKey>* written,
              std::vector<uint32_t>* slots) EXCLUDES(mu_);
  // A write-through store ended (written or not): the entry is ready again, and the tier is trimmed back to its
  // bound (stores cannot be evicted while written and may have taken it over).
  void Written(const ChunkKey& key) EXCLUDES(mu_);

  // A free pool slot (T1): for a resident entry (for_resident) the tier's own bound applies first; when the pool has
  // none, the least valuable unpinned ready entry gives way (unused preloads last, never for another preload).
  std::optional<uint32_t> AcquireSlot(SlotPriority priority, bool for_resident = false) EXCLUDES(mu_);

  DramPolicy policy() const;
  uint32_t max_slots() const { return options_.max_slots; }
  uint32_t max_unused_preloads() const { return options_.max_unused_preloads; }

 private:
  enum class State { kLoading, kReady, kFilling, kWriting };
  struct Resident {
    uint32_t slot = 0;
    uint32_t generation = 0;
    State state = State::kLoading;
    uint32_t pins = 0;
    bool speculative = false;      // a preload no demand load has used yet (R3: preload_used/wasted)
    int64_t awaited_until_ns = 0;  // kAwaitedProtectionNs
  };
  static bool Readable(const Resident& r) { return r.state == State::kReady || r.state == State::kWriting; }
  std::optional<uint32_t> AcquireSlotLocked(SlotPriority priority, bool for_resident) REQUIRES(mu_);
  // Evicts one unpinned ready entry in the policy's order; unused preloads go last, and never with spare_preloads
  // (a speculative acquisition, R2, or T1's bound, which does not count them). False when nothing can go.
  bool EvictOneLocked(bool spare_preloads) REQUIRES(mu_);
  // What T1's bound counts: resident entries less the unused preloads.
  size_t RetainedLocked() const REQUIRES(mu_) { return resident_.size() - unused_preloads_; }
  // The first demand use of a preloaded entry (R3).
  void UsePreloadLocked(Resident& r) REQUIRES(mu_);
  void EraseLocked(std::unordered_map<ChunkKey, Resident, ChunkKeyHash>::iterator it, bool evicted) REQUIRES(mu_);

  StagingPool& pool_;
  const Options options_;
  Stats& stats_;
  const std::function<void(uint32_t)> free_slot_;

  mutable Mutex mu_;
  std::unordered_map<ChunkKey, Resident, ChunkKeyHash> resident_ GUARDED_BY(mu_);
  std::unique_ptr<DramTier> order_ PT_GUARDED_BY(mu_);  // replacement order of resident_ (T1)
  uint32_t unused_preloads_ GUARDED_BY(mu_) = 0;        // resident entries with speculative set
};

}  // namespace kvtier
