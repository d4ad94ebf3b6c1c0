#include "engine/disk_index.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "layout/chunk_path.h"
#include "layout/scan.h"

namespace kvtier {

namespace {
int64_t MtimeNs(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }
}  // namespace

DiskIndex::DiskIndex(const Namespace& ns, const Options& options, Stats& stats)
    : ns_(ns), options_(options), stats_(stats) {}

DiskIndex::Known DiskIndex::Lookup(const ChunkKey& key, int64_t now_ns) {
  MutexLock lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return Known::kPresent;
  }
  if (pending_stores_.count(key)) return Known::kPending;
  auto neg = negative_.find(key);
  if (neg != negative_.end()) {
    if (neg->second > now_ns) return Known::kAbsent;
    negative_.erase(neg);
  }
  if (evicting_.count(key)) return Known::kAbsent;
  return Known::kUnknown;
}

bool DiskIndex::Probe(const ChunkKey& key, uint64_t* bytes, int64_t* mtime_ns) const {
  struct stat st;
  if (StatChunk(ns_.dirfd(), key, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != options_.entry_bytes) {
    return false;
  }
  *bytes = static_cast<uint64_t>(st.st_size);
  *mtime_ns = MtimeNs(st);
  return true;
}

void DiskIndex::LearnPresent(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns) {
  MutexLock lock(mu_);
  if (index_.count(key)) return;
  AddLocked(key, bytes, mtime_ns, /*lru_front=*/false);
  PublishGaugesLocked();
}

void DiskIndex::LearnAbsent(const ChunkKey& key, int64_t expires_ns) {
  MutexLock lock(mu_);
  if (negative_.size() > 1000000) negative_.clear();  // bounded: a burst of unique misses cannot grow it forever
  negative_[key] = expires_ns;
}

bool DiskIndex::OnDisk(const ChunkKey& key, int64_t now_ns, int64_t negative_ttl_ns) {
  MutexLock lock(mu_);
  if (index_.count(key)) return true;
  if (evicting_.count(key)) return false;
  auto neg = negative_.find(key);
  if (neg != negative_.end() && neg->second > now_ns) return false;
  uint64_t bytes;
  int64_t mtime;
  if (Probe(key, &bytes, &mtime)) {
    AddLocked(key, bytes, mtime, /*lru_front=*/false);
    PublishGaugesLocked();
    return true;
  }
  negative_[key] = now_ns + negative_ttl_ns;
  return false;
}

bool DiskIndex::Contains(const ChunkKey& key) const {
  MutexLock lock(mu_);
  return index_.count(key) > 0;
}

bool DiskIndex::ContainsOrPending(const ChunkKey& key) const {
  MutexLock lock(mu_);
  return index_.count(key) > 0 || pending_stores_.count(key) > 0;
}

bool DiskIndex::Pending(const ChunkKey& key) const {
  MutexLock lock(mu_);
  return pending_stores_.count(key) > 0;
}

DiskIndex::PinnedEntry DiskIndex::Pin(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto e = index_.find(key);
  if (e == index_.end()) return PinnedEntry();
  e->second.pins++;
  return PinnedEntry(this, key);
}

DiskIndex::PinnedEntry& DiskIndex::PinnedEntry::operator=(PinnedEntry&& other) noexcept {
  if (this != &other) {
    Release();
    index_ = std::exchange(other.index_, nullptr);
    key_ = other.key_;
  }
  return *this;
}

void DiskIndex::PinnedEntry::Release() {
  if (index_ == nullptr) return;
  DiskIndex* index = std::exchange(index_, nullptr);
  MutexLock lock(index->mu_);
  // Forgotten meanwhile (a corrupt entry) and published again: the new entry was never pinned by this handle.
  auto e = index->index_.find(key_);
  if (e != index->index_.end() && e->second.pins > 0) e->second.pins--;
}

void DiskIndex::AddPendingStore(const ChunkKey& key) {
  MutexLock lock(mu_);
  pending_stores_[key]++;
}

void DiskIndex::EndPendingStore(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto p = pending_stores_.find(key);
  if (p != pending_stores_.end() && --p->second <= 0) pending_stores_.erase(p);
}

void DiskIndex::Publish(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns) {
  MutexLock lock(mu_);
  negative_.erase(key);
  if (!index_.count(key)) AddLocked(key, bytes, mtime_ns, /*lru_front=*/false);
  PublishGaugesLocked();
}

void DiskIndex::SetMtime(const ChunkKey& key, int64_t mtime_ns) {
  MutexLock lock(mu_);
  auto e = index_.find(key);
  if (e != index_.end()) e->second.mtime_ns = mtime_ns;
}

void DiskIndex::Forget(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto e = index_.find(key);
  if (e == index_.end()) return;
  EraseLocked(e);
  PublishGaugesLocked();
}

std::vector<DiskIndex::Victim> DiskIndex::TakeExcess(uint64_t excess) {
  MutexLock lock(mu_);
  return TakeExcessLocked(excess);
}

std::vector<DiskIndex::Victim> DiskIndex::TakeAboveWatermark(uint64_t usage, uint64_t high_bytes, uint64_t low_bytes,
                                                             uint32_t engines_sharing) {
  MutexLock lock(mu_);
  const uint64_t staying = usage - std::min(usage, evicting_bytes_);
  if (usage <= high_bytes || staying <= low_bytes) return {};
  uint64_t excess = staying - low_bytes;
  if (engines_sharing > 0) excess = excess / engines_sharing + 1;
  return TakeExcessLocked(excess);
}

std::vector<DiskIndex::Victim> DiskIndex::TakeExcessLocked(uint64_t excess) {
  const uint64_t target = bytes_ > excess ? bytes_ - excess : 0;
  std::vector<Victim> victims;
  auto it = lru_.begin();
  size_t looked_at = 0;
  const size_t listed = lru_.size();  // entries moved to the back by UsedElsewhereLocked are not looked at again
  while (bytes_ > target && it != lru_.end() && looked_at++ < listed) {
    auto e = index_.find(*it);
    if (e != index_.end() && e->second.pins == 0 && options_.shared_root && UsedElsewhereLocked(*it, e->second)) {
      auto moved = it++;
      lru_.splice(lru_.end(), lru_, moved);
      continue;
    }
    if (e != index_.end() && e->second.pins == 0) {
      victims.push_back(Victim{*it, e->second.bytes});
      ++it;
      EraseLocked(e);
    } else {
      ++it;
    }
  }
  for (const Victim& v : victims) {
    evicting_[v.key]++;
    evicting_bytes_ += v.bytes;
    stats_.evicted_bytes.Add(v.bytes);
  }
  stats_.evictions.Add(victims.size());
  PublishGaugesLocked();
  return victims;
}

void DiskIndex::EndEviction(const Victim& victim, bool still_on_disk) {
  MutexLock lock(mu_);
  evicting_bytes_ -= std::min(evicting_bytes_, victim.bytes);
  auto it = evicting_.find(victim.key);
  if (it != evicting_.end() && --it->second <= 0) evicting_.erase(it);
  if (still_on_disk && !index_.count(victim.key)) {
    AddLocked(victim.key, victim.bytes, 0, /*lru_front=*/true);  // still takes space: a later eviction retries
    PublishGaugesLocked();
  }
}

bool DiskIndex::UsedElsewhereLocked(const ChunkKey& key, Entry& e) {
  if (options_.touch_interval_s == 0 || e.mtime_ns == 0) return false;
  struct stat st;
  if (StatChunk(ns_.dirfd(), key, &st) != 0) return false;
  const int64_t mtime = MtimeNs(st);
  // A touch moves the mtime forward by at least touch_interval_s; a second of slack covers coarse timestamps.
  if (mtime <= e.mtime_ns + 1000000000) return false;
  e.mtime_ns = mtime;
  return true;
}

Status DiskIndex::Rescan(bool drop_absent) {
  struct Found {
    ChunkKey key;
    uint64_t bytes;
    int64_t mtime;
  };
  uint64_t scan_start_seq;
  {
    MutexLock lock(mu_);
    scan_start_seq = seq_;
  }
  std::vector<Found> found;
  // M1: only files of exactly a chunk's size are entries (as for a lookup): another host's young entry whose data is
  // not visible here yet is shorter, and indexed at that size it would leave the usage wrong when evicted.
  Status s = ScanEntries(ns_, [&](const EntryInfo& e) {
    if (!e.is_temporary && !e.is_foreign && e.size_bytes == options_.entry_bytes) {
      found.push_back(Found{e.key, e.size_bytes, e.mtime_ns});
    }
  });
  if (!s.ok()) return s.WithContext("scanning " + ns_.path());
  // Newest first, each pushed to the LRU front: entries this instance never used are evicted first, oldest first
  // (C1: modification time, not atime).
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime > b.mtime; });
  MutexLock lock(mu_);
  if (drop_absent) {
    // An entry indexed before the scan began was on disk then (the index learns an entry after its link); one the
    // scan did not find was removed by someone else. Pinned ones are being loaded: a load that finds the file gone
    // forgets it itself.
    std::unordered_set<ChunkKey, ChunkKeyHash> present;
    present.reserve(found.size());
    for (const Found& f : found) present.insert(f.key);
    for (auto it = index_.begin(); it != index_.end();) {
      auto next = std::next(it);
      if (it->second.seq <= scan_start_seq && it->second.pins == 0 && !present.count(it->first)) EraseLocked(it);
      it = next;
    }
  }
  for (const Found& f : found) {
    if (index_.count(f.key) || evicting_.count(f.key)) continue;
    AddLocked(f.key, f.bytes, f.mtime, /*lru_front=*/true);
  }
  PublishGaugesLocked();
  return Status::Ok();
}

uint64_t DiskIndex::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

size_t DiskIndex::entries() const {
  MutexLock lock(mu_);
  return index_.size();
}

uint64_t DiskIndex::evicting_bytes() const {
  MutexLock lock(mu_);
  return evicting_bytes_;
}

void DiskIndex::AddLocked(const ChunkKey& key, uint64_t bytes, int64_t mtime_ns, bool lru_front) {
  if (lru_front) {
    lru_.push_front(key);
  } else {
    lru_.push_back(key);
  }
  index_.emplace(key, Entry{bytes, 0, lru_front ? lru_.begin() : std::prev(lru_.end()), mtime_ns, ++seq_});
  bytes_ += bytes;
}

void DiskIndex::EraseLocked(std::unordered_map<ChunkKey, Entry, ChunkKeyHash>::iterator it) {
  bytes_ -= std::min(bytes_, it->second.bytes);
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void DiskIndex::PublishGaugesLocked() {
  stats_.disk_entries.Set(index_.size());
  stats_.disk_bytes_used.Set(bytes_);
}

}  // namespace kvtier
