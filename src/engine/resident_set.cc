#include "engine/resident_set.h"

#include <string>

#include "io/io_engine.h"

namespace kvtier {

ResidentSet::ResidentSet(StagingPool& pool, const Options& options, Stats& stats,
                         std::function<void(uint32_t slot)> free_slot)
    : pool_(pool),
      options_(options),
      stats_(stats),
      free_slot_(std::move(free_slot)),
      order_(DramTier::Make(options.policy, options.max_slots)) {}

DramPolicy ResidentSet::policy() const { return options_.policy; }

ResidentSet::Hit ResidentSet::Lookup(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r == resident_.end()) return Hit::kNone;
  if (Readable(r->second)) {
    order_->Touch(key);
    return Hit::kReady;
  }
  return r->second.state == State::kFilling ? Hit::kFilling : Hit::kNone;
}

PromoteState ResidentSet::Residency(const ChunkKey& key) const {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r == resident_.end()) return PromoteState::kMiss;
  return Readable(r->second) ? PromoteState::kReady : PromoteState::kPending;
}

std::optional<PromoteResult> ResidentSet::PromoteResident(const ChunkKey& key, bool speculative, int64_t now_ns) {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r == resident_.end()) return std::nullopt;
  order_->Touch(key);
  if (!speculative) {
    UsePreloadLocked(r->second);
    if (r->second.pins == 0) r->second.awaited_until_ns = now_ns + kAwaitedProtectionNs;
  }
  if (Readable(r->second)) return PromoteResult{PromoteState::kReady, SlotRef{r->second.slot, r->second.generation}};
  return PromoteResult{PromoteState::kPending, {}};
}

std::optional<uint32_t> ResidentSet::BeginLoad(const ChunkKey& key, bool speculative, int64_t now_ns,
                                               PromoteResult* result) {
  *result = PromoteResult{PromoteState::kMiss, {}};
  {
    MutexLock lock(mu_);
    if (!resident_.count(key)) {
      // R2: unused preloads hold at most half of the non-reserved slots, so they never crowd out the DRAM tier.
      if (speculative && unused_preloads_ >= options_.max_unused_preloads) return std::nullopt;
      auto slot = AcquireSlotLocked(speculative ? SlotPriority::kSpeculative : SlotPriority::kDemand,
                                    /*for_resident=*/true);
      if (!slot) return std::nullopt;
      order_->Insert(key);
      resident_.emplace(
          key, Resident{*slot, 0, State::kLoading, 0, speculative, speculative ? 0 : now_ns + kAwaitedProtectionNs});
      if (speculative) unused_preloads_++;
      stats_.dram_entries.Set(resident_.size());
      *result = PromoteResult{PromoteState::kPending, {}};
      return slot;
    }
  }
  // Another thread's promotion made it resident since PromoteResident: answer as for a resident key.
  if (auto again = PromoteResident(key, speculative, now_ns)) *result = *again;
  return std::nullopt;
}

void ResidentSet::Loaded(const ChunkKey& key, uint32_t slot, uint32_t generation, bool ok, int64_t now_ns) {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r == resident_.end() || r->second.slot != slot) return;
  if (ok) {
    r->second.state = State::kReady;
    r->second.generation = generation;
    // The protection window of an awaited promotion starts when its bytes are ready.
    if (r->second.awaited_until_ns != 0) r->second.awaited_until_ns = now_ns + kAwaitedProtectionNs;
  } else {
    EraseLocked(r, /*evicted=*/false);
  }
  stats_.dram_entries.Set(resident_.size());
}

std::optional<SlotRef> ResidentSet::PinIfReady(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r == resident_.end() || !Readable(r->second)) return std::nullopt;
  r->second.pins++;
  order_->Touch(key);
  UsePreloadLocked(r->second);
  return SlotRef{r->second.slot, r->second.generation};
}

Result<std::vector<SlotRef>> ResidentSet::Pin(std::span<const ChunkKey> keys) {
  MutexLock lock(mu_);
  std::vector<SlotRef> refs;
  refs.reserve(keys.size());
  for (const ChunkKey& k : keys) {
    auto r = resident_.find(k);
    if (r == resident_.end() || !Readable(r->second)) {
      return Status(StatusCode::kNotFound, "chunk " + k.Hex() + " is not resident");
    }
    refs.push_back(SlotRef{r->second.slot, r->second.generation});
  }
  for (const ChunkKey& k : keys) {
    Resident& r = resident_[k];
    r.pins++;
    r.awaited_until_ns = 0;  // delivered: ordinary LRU/ARC order from now on
    order_->Touch(k);
    UsePreloadLocked(r);
  }
  return refs;
}

void ResidentSet::Unpin(std::span<const ChunkKey> keys) {
  MutexLock lock(mu_);
  for (const ChunkKey& k : keys) {
    auto r = resident_.find(k);
    if (r != resident_.end() && r->second.pins > 0) r->second.pins--;
  }
}

Result<std::vector<std::optional<SlotRef>>> ResidentSet::ReserveForStore(std::span<const ChunkKey> keys,
                                                                         const std::vector<bool>& on_disk) {
  MutexLock lock(mu_);
  std::vector<std::optional<SlotRef>> out(keys.size());
  std::vector<size_t> taken;
  for (size_t i = 0; i < keys.size(); ++i) {
    const ChunkKey& k = keys[i];
    if (resident_.count(k) || (i < on_disk.size() && on_disk[i])) {
      stats_.stores_deduplicated.Add(1);
      continue;
    }
    bool dup = false;
    for (size_t j : taken) dup |= keys[j] == k;
    if (dup) continue;
    auto slot = AcquireSlotLocked(SlotPriority::kDemand, /*for_resident=*/true);
    if (!slot) {
      for (size_t j : taken) EraseLocked(resident_.find(keys[j]), /*evicted=*/false);
      stats_.dram_entries.Set(resident_.size());
      return Status(StatusCode::kResourceExhausted,
                    "staging pool has no free slot for " + std::to_string(keys.size()) + " chunks; retry later");
    }
    const uint32_t gen = pool_.BeginFill(*slot);
    order_->Insert(k);
    resident_.emplace(k, Resident{*slot, gen, State::kFilling, 0});
    out[i] = SlotRef{*slot, gen};
    taken.push_back(i);
  }
  stats_.dram_entries.Set(resident_.size());
  return out;
}

void ResidentSet::Commit(std::span<const ChunkKey> keys, bool success, std::vector<ChunkKey>* written,
                         std::vector<uint32_t>* slots) {
  MutexLock lock(mu_);
  for (const ChunkKey& k : keys) {
    auto r = resident_.find(k);
    if (r == resident_.end() || r->second.state != State::kFilling) continue;
    if (!success) {
      EraseLocked(r, /*evicted=*/false);
      stats_.stores_dropped.Add(1);
      continue;
    }
    pool_.PublishReady(r->second.slot, r->second.generation);
    r->second.state = State::kWriting;
    written->push_back(k);
    slots->push_back(r->second.slot);
  }
  stats_.dram_entries.Set(resident_.size());
}

void ResidentSet::Written(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto r = resident_.find(key);
  if (r != resident_.end() && r->second.state == State::kWriting) r->second.state = State::kReady;
  while (RetainedLocked() > options_.max_slots && EvictOneLocked(/*spare_preloads=*/true)) {
  }
  stats_.dram_entries.Set(resident_.size());
}

std::optional<uint32_t> ResidentSet::AcquireSlot(SlotPriority priority, bool for_resident) {
  MutexLock lock(mu_);
  return AcquireSlotLocked(priority, for_resident);
}

std::optional<uint32_t> ResidentSet::AcquireSlotLocked(SlotPriority priority, bool for_resident) {
  const bool speculative = priority == SlotPriority::kSpeculative;
  // T1: the tier's bound on what it retains. Several entries may be over it (write-through stores join it while they
  // are written, when nothing is evictable yet), so evict until there is room or nothing more can go. Unused preloads
  // neither count nor go for it: R2 bounds them, and a preload evicted to keep T1's bound would be read again on
  // demand (with dram_max_slots=1, every preload would be).
  while (for_resident && !speculative && RetainedLocked() >= options_.max_slots &&
         EvictOneLocked(/*spare_preloads=*/true)) {
  }
  if (auto slot = pool_.Acquire(priority)) return slot;
  if (!EvictOneLocked(speculative)) return std::nullopt;
  return pool_.Acquire(priority);
}

bool ResidentSet::EvictOneLocked(bool spare_preloads) {
  const int64_t now = NowNs();
  auto evictable = [this, now](bool preloads_too) {
    return [this, preloads_too, now](const ChunkKey& k) {
      mu_.AssertHeld();  // the tier calls back from Victim, under mu_
      auto r = resident_.find(k);
      return r != resident_.end() && r->second.pins == 0 && r->second.state == State::kReady &&
             r->second.awaited_until_ns <= now && (preloads_too || !r->second.speculative);
    };
  };
  std::optional<ChunkKey> victim = order_->Victim(evictable(false));
  if (!victim && !spare_preloads) victim = order_->Victim(evictable(true));
  if (!victim) return false;
  auto r = resident_.find(*victim);
  if (r->second.speculative) stats_.preload_wasted.Add(1);
  EraseLocked(r, /*evicted=*/true);
  stats_.dram_entries.Set(resident_.size());
  return true;
}

void ResidentSet::UsePreloadLocked(Resident& r) {
  if (!r.speculative) return;
  r.speculative = false;
  unused_preloads_--;
  stats_.preload_used.Add(1);
}

void ResidentSet::EraseLocked(std::unordered_map<ChunkKey, Resident, ChunkKeyHash>::iterator it, bool evicted) {
  if (it->second.speculative) unused_preloads_--;
  const uint32_t slot = it->second.slot;
  if (evicted) {
    order_->Evict(it->first);  // ARC remembers it as a ghost
  } else {
    order_->Erase(it->first);
  }
  resident_.erase(it);
  free_slot_(slot);
}

}  // namespace kvtier
