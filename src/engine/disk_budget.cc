#include "engine/disk_budget.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "io/io_engine.h"
#include "layout/chunk_path.h"
#include "util/thread.h"

namespace kvtier {

namespace {
// fraction x bytes as bytes; a product at or above 2^64 (a budget near the top of its range) is the largest value
// instead of an undefined conversion.
uint64_t FractionOf(uint64_t bytes, double fraction) {
  const double v = static_cast<double>(bytes) * fraction;
  return v >= 18446744073709551615.0 ? UINT64_MAX : static_cast<uint64_t>(v);
}

constexpr int64_t kMergeGapNs = 500'000'000;  // ExcessToTake merges the tree at most this often
constexpr auto kMaintenanceEvery = std::chrono::seconds(1);
constexpr int64_t kMinRescanGapNs = 2'000'000'000;  // the maintenance thread rescans at most this often
}  // namespace

DiskBudget::DiskBudget(const Namespace& ns, DiskIndex& index, const Options& options)
    : ns_(ns), index_(index), options_(options) {
  // C1 across instances: the first engine to hold the namespace's counter sets it from the index's scan (which also
  // repairs drift); later ones join it as it is (usage_counter.h). M2: on a shared root the per-engine records in
  // the namespace directory instead (every host sees them); where they cannot be written, the host's counter.
  if (options_.shared_root) {
    auto ledger = UsageLedger::Open(ns_, index_.bytes());
    if (ledger.ok()) {
      ledger_ = std::move(ledger.value());
    } else {
      ledger_why_ = ledger.status().ToString();
    }
  }
  if (!ledger_) {
    if (auto usage = SharedUsage::Open(ns_, index_.bytes()); usage.ok()) usage_ = std::move(usage.value());
  }
}

DiskBudget::~DiskBudget() { StopMaintenance(); }

void DiskBudget::StopMaintenance() {
  {
    MutexLock lock(maint_mu_);
    maint_stop_ = true;
  }
  maint_cv_.NotifyAll();
  if (maintenance_.joinable()) maintenance_.join();
}

void DiskBudget::StartMaintenance() {
  if (shared() && !maintenance_.joinable()) maintenance_ = StartThread([this] { MaintenanceMain(); });
}

std::optional<uint64_t> DiskBudget::SharedTotal() const {
  if (ledger_) return ledger_->Total();
  if (usage_) return usage_->Load();
  return std::nullopt;
}

uint64_t DiskBudget::Usage() const { return SharedTotal().value_or(index_.bytes()); }

std::string DiskBudget::Describe() const {
  std::string d = ledger_  ? "records in " + ns_.path() + "/" + UsageLedger::kDirName + " (all hosts)"
                  : usage_ ? "this host's counter"
                           : "this engine's index";
  if (!ledger_why_.empty()) d += " (usage records unavailable: " + ledger_why_ + ")";
  return d;
}

void DiskBudget::Reserve(uint64_t bytes) {
  own_delta_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (ledger_) ledger_->Reserve(bytes);
  if (usage_) usage_->Add(static_cast<int64_t>(bytes));
}

void DiskBudget::CommitReserved(uint64_t bytes) {
  if (ledger_) ledger_->Commit(bytes);  // the host counter counted it at the reservation already
}

void DiskBudget::Release(uint64_t bytes) {
  own_delta_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (ledger_) ledger_->Release(bytes);
  if (usage_) usage_->Add(-static_cast<int64_t>(bytes));
}

void DiskBudget::Add(int64_t bytes) {
  own_delta_.fetch_add(bytes, std::memory_order_relaxed);
  if (ledger_) ledger_->Add(bytes);
  if (usage_) usage_->Add(bytes);
}

std::vector<DiskBudget::Victim> DiskBudget::TakeAboveHighWatermark() {
  if (!has_budget()) return {};
  // C1/M2: bytes whose unlinks are still in flight are on disk until the unlink returns (on a FUSE or network
  // filesystem that can take milliseconds each), so they count toward the high watermark: the budget bounds what
  // the filesystem holds. They are not taken again: what to free is what stays after the unlinks in flight
  // (DiskIndex::TakeAboveWatermark).
  const uint64_t high = FractionOf(options_.budget_bytes, options_.high_watermark);
  const uint64_t low = FractionOf(options_.budget_bytes, options_.low_watermark);
  const uint64_t on_disk = Usage();
  if (on_disk <= high) return {};
  const uint64_t staying = on_disk - std::min(on_disk, index_.evicting_bytes());
  if (staying <= low) return {};
  ExcessToTake(staying - low);  // merges the tree into the index first when it knows too little
  const uint32_t sharing = ledger_ ? std::max<uint32_t>(1, ledger_->live_engines()) : 0;
  return index_.TakeAboveWatermark(Usage(), high, low, sharing);
}

std::vector<DiskBudget::Victim> DiskBudget::TakeDownToLowWatermark() {
  if (!has_budget()) return {};
  const uint64_t low = FractionOf(options_.budget_bytes, options_.low_watermark);
  const uint64_t used = Usage();
  if (used <= low) return {};
  return index_.TakeExcess(ExcessToTake(used - low));
}

std::vector<DiskBudget::Victim> DiskBudget::TakeForSpace(uint64_t bytes) {
  return index_.TakeExcess(std::max<uint64_t>(bytes, index_.bytes() / 10));
}

void DiskBudget::Unlinked(const Victim& victim, int res) {
  if (res == 0) Add(-static_cast<int64_t>(victim.bytes));
  // Still on disk (it failed, not ENOENT): back in the index, a later eviction retries it.
  index_.EndEviction(victim, res < 0 && res != -ENOENT);
}

uint64_t DiskBudget::UnlinkVictims(const std::vector<Victim>& victims) {
  // A reader that opened the file before the unlink keeps reading valid bytes; new readers miss.
  uint64_t freed = 0;
  for (const Victim& v : victims) {
    const int res = UnlinkChunk(ns_.dirfd(), v.key);
    if (res == 0 || res == -ENOENT) {
      freed += v.bytes;
      PruneFanoutDir(ns_.dirfd(), FanoutDir(v.key));  // C1: reactors' fan-out caches learn it at their next store
    }
    Unlinked(v, res);
  }
  return freed;
}

uint64_t DiskBudget::ExcessToTake(uint64_t excess) {
  // M2: every host over the watermark evicts its share, so hosts evicting at once free the excess about once.
  if (ledger_) excess = excess / std::max<uint32_t>(1, ledger_->live_engines()) + 1;
  // The index knows too little (entries of other instances): merge the tree into it first, at most every 500 ms.
  int64_t last = last_merge_ns_.load();
  const int64_t now = NowNs();
  if (shared() && excess > index_.bytes() && now - last > kMergeGapNs &&
      last_merge_ns_.compare_exchange_strong(last, now)) {
    static_cast<void>(index_.Rescan(/*drop_absent=*/false));  // best effort: a failed rescan leaves the index as it was
  }
  return excess;
}

int64_t DiskBudget::Others() const {
  return static_cast<int64_t>(SharedTotal().value_or(0)) - own_delta_.load(std::memory_order_relaxed);
}

void DiskBudget::MaintenanceMain() {
  int64_t last_others = Others();
  int64_t last_rescan_ns = 0;
  bool stale = false;
  MutexLock lock(maint_mu_);
  while (!maint_cv_.WaitFor(maint_mu_, kMaintenanceEvery, [this] {
    maint_mu_.AssertHeld();
    return maint_stop_;
  })) {
    lock.Unlock();
    // The namespace's usage counts every engine's and gc's changes; what this engine did not change itself going
    // down means someone removed entries, maybe some this index holds. Usage below the index's own bytes means
    // the index holds entries that are gone.
    const int64_t others = Others();
    stale |= others < last_others || Usage() < index_.bytes();
    last_others = others;
    const int64_t now = NowNs();
    if (stale && now - last_rescan_ns >= kMinRescanGapNs) {
      stale = false;
      last_rescan_ns = now;
      static_cast<void>(index_.Rescan(/*drop_absent=*/true));  // best effort: a failed scan changes nothing
      last_others = Others();
    }
    lock.Lock();
  }
}

}  // namespace kvtier
