// DiskIndex: what one engine knows of its namespace's published entries (C1, M1, M3), and the bookkeeping around
// them: LRU order, pins of loads in flight, the negative cache of lookups that missed, stores in flight (pending),
// evictions whose unlinks are in flight, and the bytes of each.
//
// Ownership: one per engine, shared by the caller threads (lookups, promotions, store reservations), the reactors
// (publish, pin, eviction) and the engine's maintenance thread (rescans). Every member is guarded by mu_, which no
// method holds while calling out, except to fstatat() the namespace directory (a lookup's probe, an eviction's M3
// check of another host's touch) and to update Stats' disk gauges and eviction counters (lock-free atomics).
// It never sees the engine: the engine decides when to look, publish, evict, unlink and rescan; the index answers
// and keeps the books. Lock order: the reactor inbox's mutex may be held when calling in (queued stores); mu_ is a
// leaf, and the resident set's mutex is never held with it.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"
#include "layout/namespace.h"
#include "stats/stats.h"
#include "util/mutex.h"

namespace kvtier {

class DiskIndex {
 public:
  struct Options {
    // Exactly a chunk file's size: a probe counts only a regular file of this size as an entry (M1: a shorter one
    // is another host's entry whose data is not visible here yet, or a broken one).
    uint64_t entry_bytes = 0;
    // M3 on a shared root: an eviction skips a victim whose mtime moved forward since the index learnt it (another
    // host's load touched it) and moves it to the recent end. 0: off.
    uint32_t touch_interval_s = 0;
    bool shared_root = false;
  };
  // ns must outlive the index (its directory fd is used for probes).
  DiskIndex(const Namespace& ns, const Options& options, Stats& stats);
  DiskIndex(const DiskIndex&) = delete;
  DiskIndex& operator=(const DiskIndex&) = delete;

  // What the index knows of a key without asking the filesystem.
  enum class Known {
    kPresent,  // indexed (a hit moves it to the recent end of the LRU)
    kPending,  // not indexed, a store of it is in flight
    kAbsent,   // a miss remembered in the negative cache, or an eviction's unlink in flight
    kUnknown,  // ask the filesystem (Probe), then LearnPresent/LearnAbsent
  };
  Known Lookup(const ChunkKey& key, int64_t now_ns) EXCLUDES(mu_);
  // Whether the entry is a regular file of entry_bytes under the namespace; *mtime_ns its mtime. No lock.
  bool Probe(const ChunkKey& key, uint64_t* bytes, int64_t* mtime_ns) const;
  // A probe found the entry: indexed (at the recent end) unless it is already.
  void LearnPresent(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns) EXCLUDES(mu_);
  // A probe found nothing: lookups answer kAbsent until expires_ns.
  void LearnAbsent(const ChunkKey& key, int64_t expires_ns) EXCLUDES(mu_);
  // Promote's question: indexed, or (unless evicting or remembered absent) found by a probe, which indexes it or
  // remembers the miss until now_ns + negative_ttl_ns. The probe runs under mu_, so a concurrent eviction cannot
  // slip between the answer and the index.
  bool OnDisk(const ChunkKey& key, int64_t now_ns, int64_t negative_ttl_ns) EXCLUDES(mu_);

  bool Contains(const ChunkKey& key) const EXCLUDES(mu_);
  // Indexed, or a store of it in flight (store reservations deduplicate against both).
  bool ContainsOrPending(const ChunkKey& key) const EXCLUDES(mu_);
  // A store of it is in flight (AddPendingStore not yet ended).
  bool Pending(const ChunkKey& key) const EXCLUDES(mu_);

  // A load's pin on its entry against eviction and rescans' drops, held until Release() or its destruction. Empty
  // (held() false) where the entry was not indexed: nothing is pinned then. The index must outlive it.
  class PinnedEntry {
   public:
    PinnedEntry() = default;
    PinnedEntry(PinnedEntry&& other) noexcept { *this = std::move(other); }
    PinnedEntry& operator=(PinnedEntry&& other) noexcept;
    PinnedEntry(const PinnedEntry&) = delete;
    PinnedEntry& operator=(const PinnedEntry&) = delete;
    ~PinnedEntry() { Release(); }
    bool held() const { return index_ != nullptr; }
    void Release();  // unpins (nothing when empty); the handle is empty after it

   private:
    friend class DiskIndex;
    PinnedEntry(DiskIndex* index, const ChunkKey& key) : index_(index), key_(key) {}
    DiskIndex* index_ = nullptr;
    ChunkKey key_;
  };
  PinnedEntry Pin(const ChunkKey& key) EXCLUDES(mu_);

  // Stores in flight: one count per chunk of a queued store job, ended when the chunk finishes.
  void AddPendingStore(const ChunkKey& key) EXCLUDES(mu_);
  void EndPendingStore(const ChunkKey& key) EXCLUDES(mu_);

  // A store published key (its link, or EEXIST: another writer's entry). Indexed at the recent end unless it is
  // already; the negative cache forgets it.
  void Publish(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns) EXCLUDES(mu_);
  // M3: a load set the entry's mtime to mtime_ns.
  void SetMtime(const ChunkKey& key, int64_t mtime_ns) EXCLUDES(mu_);
  // The entry is gone (a load found it absent or removed it as corrupt).
  void Forget(const ChunkKey& key) EXCLUDES(mu_);

  struct Victim {
    ChunkKey key;
    uint64_t bytes;
  };
  // C1: removes least recently used unpinned entries worth `excess` bytes (or until nothing more can go) and marks
  // them evicting: lookups answer kAbsent and rescans do not re-add them until EndEviction. Counts evictions and
  // evicted bytes. The caller unlinks each victim and then calls EndEviction.
  std::vector<Victim> TakeExcess(uint64_t excess) EXCLUDES(mu_);
  // C1/M2, after each publish, with `usage` on disk (the shared usage, or bytes()): bytes of unlinks in flight
  // count toward the high watermark but are not taken again. When usage > high_bytes and what stays after the
  // unlinks in flight is above low_bytes, takes (TakeExcess) what stays minus low_bytes; engines_sharing > 0 (M2:
  // that many engines evict at once) takes that share of it, plus one byte. Reading the unlinks in flight and
  // marking the new victims is one step, so publishes on several reactors do not evict the same bytes twice.
  std::vector<Victim> TakeAboveWatermark(uint64_t usage, uint64_t high_bytes, uint64_t low_bytes,
                                         uint32_t engines_sharing) EXCLUDES(mu_);
  // An eviction's unlink came back. still_on_disk (it failed, not ENOENT): indexed again at the LRU front, first in
  // line for the next eviction.
  void EndEviction(const Victim& victim, bool still_on_disk) EXCLUDES(mu_);

  // A scan of the tree (layout/scan.h) merged into the index: entries it lacks are added, oldest at the LRU front
  // (at open this is the whole LRU order, by mtime). drop_absent: unpinned entries indexed before the scan began
  // that it did not find are dropped (removed by gc or another engine). The scan runs without mu_.
  Status Rescan(bool drop_absent) EXCLUDES(mu_);

  uint64_t bytes() const EXCLUDES(mu_);
  size_t entries() const EXCLUDES(mu_);
  uint64_t evicting_bytes() const EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t bytes = 0;
    uint32_t pins = 0;  // loads in flight: never evicted while pinned
    std::list<ChunkKey>::iterator lru;
    int64_t mtime_ns = 0;  // M3: the file's mtime as this engine last knew it (0: unknown)
    uint64_t seq = 0;      // seq_ when it was inserted: a rescan drops only entries older than itself
  };
  void AddLocked(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns, bool lru_front) REQUIRES(mu_);
  void EraseLocked(std::unordered_map<ChunkKey, Entry, ChunkKeyHash>::iterator it) REQUIRES(mu_);
  std::vector<Victim> TakeExcessLocked(uint64_t excess) REQUIRES(mu_);
  // M3: see Options::touch_interval_s.
  bool UsedElsewhereLocked(const ChunkKey& key, Entry& e) REQUIRES(mu_);
  void PublishGaugesLocked() REQUIRES(mu_);

  const Namespace& ns_;
  const Options options_;
  Stats& stats_;

  mutable Mutex mu_;
  std::unordered_map<ChunkKey, Entry, ChunkKeyHash> index_ GUARDED_BY(mu_);
  std::list<ChunkKey> lru_ GUARDED_BY(mu_);                                       // most recently used at the back
  std::unordered_map<ChunkKey, int64_t, ChunkKeyHash> negative_ GUARDED_BY(mu_);  // key -> expiry (ns)
  std::unordered_map<ChunkKey, int, ChunkKeyHash> pending_stores_ GUARDED_BY(mu_);
  // Taken as victims, unlink not yet back: lookups must not re-index them from the filesystem.
  std::unordered_map<ChunkKey, int, ChunkKeyHash> evicting_ GUARDED_BY(mu_);
  uint64_t evicting_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  uint64_t seq_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier
