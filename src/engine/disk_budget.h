// DiskBudget: the namespace's disk usage held against the budget (C1, M2), beside DiskIndex (what is on disk) and
// ResidentSet (what is in DRAM).
//
// What it owns:
// - The usage the budget is compared with: on a shared root the namespace's per-engine usage records, which every
//   host sees (M2, UsageLedger); else this host's shared counter (C1, SharedUsage); else, where neither can be
//   had, the index's own bytes. Every engine on the namespace changes the same figure, so one engine's stores make
//   another evict.
// - The eviction arithmetic: what is above the high watermark after the unlinks in flight, each host's share of it
//   on a shared root, and when the index knows too little of the tree to find it (a merge, at most every 500 ms).
// - The maintenance thread (only where the usage is shared): every second it compares the shared usage with what
//   this engine changed in it; when the others' part went down (gc, another engine's evictions) or the usage is
//   below the index's own bytes, it rescans the tree and drops the index's entries that are gone, at most every
//   2 s. disk_bytes_used and disk_entries follow within about 3 s.
//
// The caller unlinks the victims it is handed: a reactor through its ring (asynchronous), a caller thread with
// UnlinkVictims (synchronous); either way it reports each unlink back (Unlinked / DiskIndex::EndEviction).
//
// Thread safety: every method may be called from any thread (the usage figures are lock-free atomics, the index
// has its own mutex); maint_mu_ guards only the maintenance thread's stop flag. It calls the index with no lock of
// its own held and never sees the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/disk_index.h"
#include "layout/namespace.h"
#include "layout/usage_counter.h"
#include "layout/usage_ledger.h"
#include "util/mutex.h"

namespace kvtier {

class DiskBudget {
 public:
  struct Options {
    uint64_t budget_bytes = 0;  // 0: no budget; usage is still kept for other engines and gc
    double high_watermark = 0.95;
    double low_watermark = 0.85;
    bool shared_root = false;  // M1: use the namespace's usage records (M2) when they can be written
  };
  // ns and index must outlive the budget. Never fails: where no shared usage can be had, the index's bytes are
  // the usage (Describe says which, and why the records could not be used).
  DiskBudget(const Namespace& ns, DiskIndex& index, const Options& options);
  ~DiskBudget();  // stops the maintenance thread
  DiskBudget(const DiskBudget&) = delete;
  DiskBudget& operator=(const DiskBudget&) = delete;

  // Starts the maintenance thread where the usage is shared (no-op otherwise). Once, after the index is built.
  void StartMaintenance();
  // Stops and joins it (the engine, before its reactors stop; the destructor too). The books stay usable.
  void StopMaintenance();

  // The usage compared with the budget.
  uint64_t Usage() const;
  // Which usage this is, for Describe: "records in <ns>/usage (all hosts)", "this host's counter", or "this
  // engine's index", with why the records were unavailable where they were tried.
  std::string Describe() const;
  bool has_budget() const { return options_.budget_bytes != 0; }
  // Whether other engines see this engine's usage (a counter or records): stores then reserve their bytes when they
  // start writing, so that instances evict before the files exist rather than after.
  bool shared() const { return usage_ || ledger_; }

  // The usage's books (no-ops where it is the index's own): Reserve when a store starts writing; CommitReserved
  // when its link made the entry; Release when it ends without one; Add for entries linked without a reservation
  // (+) and for every unlink that removed an entry (-).
  void Reserve(uint64_t bytes);
  void CommitReserved(uint64_t bytes);
  void Release(uint64_t bytes);
  void Add(int64_t bytes);

  using Victim = DiskIndex::Victim;
  // After a publish or a reservation: the victims to unlink when the usage is above the high watermark (bytes whose
  // unlinks are in flight count as on disk and are not taken again), down to the low one; on a shared root this
  // host's share of it (M2). Empty without a budget. The caller unlinks each and reports it (Unlinked).
  std::vector<Victim> TakeAboveHighWatermark();
  // Engine::EvictToBudget: the victims that bring the usage down to the low watermark. Empty without a budget.
  std::vector<Victim> TakeDownToLowWatermark();
  // An ENOSPC retry: at least `bytes`, or a tenth of what the index holds, whichever is more.
  std::vector<Victim> TakeForSpace(uint64_t bytes);
  // A victim's unlink came back with res (0, or -errno): its bytes leave the usage when it removed the file; a
  // failure other than ENOENT puts it back in the index (a later eviction retries it).
  void Unlinked(const Victim& victim, int res);
  // Unlinks victims synchronously (a caller's thread: EvictToBudget) and reports each; the bytes freed. Reactors
  // unlink theirs through their ring and report each with Unlinked.
  uint64_t UnlinkVictims(const std::vector<Victim>& victims);

 private:
  // What to evict of `excess` bytes over the low watermark: this engine's share of it on a shared root (M2); when
  // the index knows less than that (entries of other instances), the tree is merged into it first.
  uint64_t ExcessToTake(uint64_t excess);
  // The namespace's usage as every engine shares it: M2's records on a shared root, else C1's host counter; nullopt
  // where neither exists (then the index is the only source).
  std::optional<uint64_t> SharedTotal() const;
  // The shared usage less what this engine changed in it (own_delta_): the others' part.
  int64_t Others() const;
  void MaintenanceMain();

  const Namespace& ns_;
  DiskIndex& index_;
  const Options options_;
  std::unique_ptr<SharedUsage> usage_;     // C1: the namespace's usage shared by every engine on this host
  std::unique_ptr<UsageLedger> ledger_;    // M2: instead of usage_ on a shared root: shared by every host
  std::string ledger_why_;                 // why the records could not be used, where they were tried
  std::atomic<int64_t> own_delta_{0};      // what this engine's Reserve/Release/Add changed in the shared usage
  std::atomic<int64_t> last_merge_ns_{0};  // ExcessToTake's last merge of the tree into the index

  Mutex maint_mu_;
  CondVar maint_cv_;
  bool maint_stop_ GUARDED_BY(maint_mu_) = false;
  std::thread maintenance_;
};

}  // namespace kvtier
