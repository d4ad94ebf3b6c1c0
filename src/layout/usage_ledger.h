// UsageLedger: one disk budget per namespace across every host that mounts a shared root, with no central service
// (SPEC M2). docs/architecture.md ("Capacity across hosts") is the design; this is its contract.
//
// Each engine owns one small record file `<ns>/usage/<host>.<pid>.<16 hex>` holding what it changed: `committed`
// (bytes of entries it linked minus bytes of entries it unlinked: one engine's figure alone means nothing, the sum
// over all records is the namespace's usage) and `reserved` (bytes of stores it is writing now). A background thread
// rewrites the record in place (pwrite + fsync: the fsync is what makes it visible to other clients at once on
// MooseFS) at most every write_interval_ms when it changed and at least every heartbeat_ms, and re-reads the
// others' records every read_interval_ms (the directory itself every list_interval_ms, which is how a host that
// joins later is seen). Total() = this engine's exact figures + the others' as last read: stale by at most about
// read_interval_ms + write_interval_ms + the filesystem's own delay.
//
// Dead engines. A record that says it was closed, or whose sequence number has not changed for dead_after_ms (by
// the reader's monotonic clock, so clock skew between hosts does not matter), belongs to an engine that is gone.
// Its `reserved` stops counting at once (its temporaries are swept by age, L5); its `committed` is still on disk
// and is folded into a live engine's record: the live one renames the file to `.fold.<own id>.<name>` (rename is
// atomic, so exactly one folder wins), adds the committed bytes to its own, writes its record, then unlinks the
// claimed file. The record count stays bounded by the live engines (plus the dead ones not folded yet).
//
// Seeding. The engine that creates the usage directory seeds its committed figure with its scan of the tree; every
// later one starts at 0 (the others' records already hold the tree). Drift (a process killed between its link and
// its record's next write, a seed that raced another host's first publication) is corrected by `kvtier gc`, which
// scans the tree and publishes the difference as a closed record that the next live engine folds (Reconcile).
//
// Thread safety: Reserve/Commit/Release/Add/Total/live_engines are lock-free atomics, callable from any thread;
// they never do I/O. The constructor and destructor (a final write with the closed flag) do I/O.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtier/status.h"
#include "layout/namespace.h"

namespace kvtier {

struct LedgerOptions {
  int64_t write_interval_ms = 10;  // own record rewritten at most this often while it changes
  int64_t read_interval_ms = 10;   // the others' records re-read this often
  int64_t list_interval_ms = 100;  // the usage directory re-listed this often (engines that joined)
  int64_t heartbeat_ms = 1000;     // own record rewritten at least this often (liveness)
  int64_t dead_after_ms = 30000;   // a record unchanged this long is a dead engine's: reclaimed
  std::string host;                // host name in the record's file name; empty: gethostname()
};

// One record as read from the usage directory (kvtier stats, tests).
struct LedgerRecord {
  std::string name;  // file name under usage/
  uint64_t sequence = 0;
  int64_t committed = 0;
  int64_t reserved = 0;
  bool closed = false;
  int64_t written_unix_ns = 0;  // the writer's clock
  bool valid = false;           // magic and checksum matched
};

class UsageLedger {
 private:
  // Only the class's own factories construct it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  explicit UsageLedger(Passkey) {}
  static constexpr const char* kDirName = "usage";
  // Opens (creating usage/ when needed, with the namespace's modes) this engine's record. scan_bytes: the caller's
  // scan total, used when this engine creates usage/ (the first engine on the namespace).
  static Result<std::unique_ptr<UsageLedger>> Open(const Namespace& ns, uint64_t scan_bytes,
                                                   const LedgerOptions& options = {});
  ~UsageLedger();  // writes a closed record and stops the thread; the committed bytes are folded by a live engine
  UsageLedger(const UsageLedger&) = delete;
  UsageLedger& operator=(const UsageLedger&) = delete;

  void Reserve(uint64_t bytes);  // a store starts writing
  void Commit(uint64_t bytes);   // a reserved store's link made an entry: reserved -> committed
  void Release(uint64_t bytes);  // a reservation ends without an entry (dropped, or another writer won)
  void Add(int64_t bytes);       // committed +/- without a reservation (an entry linked, one unlinked)

  // The namespace's usage in bytes: committed + reserved over every live record (dead ones: committed only).
  uint64_t Total() const;
  uint32_t live_engines() const { return live_.load(std::memory_order_relaxed); }
  // Times this engine found its record folded by a peer while it lived (ReclaimIfFolded) and started a new one.
  uint64_t reclaims() const { return reclaims_.load(std::memory_order_relaxed); }
  // This engine's record file name. A copy, taken under mu_: the ledger's thread renames the record when a peer folded
  // it (ReclaimIfFolded).
  std::string name() const;
  // Writes this engine's record and re-reads the others now (synchronously; tests and shutdown).
  void SyncNow();

  // Every record under ns's usage/ (kvtier stats). Missing directory: empty. fold_in_progress (optional): set when
  // a dead record is claimed but not yet folded (`.fold.*`: its bytes are in no record for that moment).
  static Result<std::vector<LedgerRecord>> ReadAll(const Namespace& ns, bool* fold_in_progress = nullptr);
  // kvtier gc: publishes a closed record holding `delta` (the scanned total minus the records' sum), so that the
  // next live engine folds the correction in. Returns the record's name.
  static Result<std::string> PublishCorrection(const Namespace& ns, int64_t delta);

 private:
  struct Peer {
    uint64_t sequence = 0;
    int64_t committed = 0;
    int64_t reserved = 0;
    bool closed = false;
    int64_t last_change_ns = 0;  // monotonic, when this reader saw the sequence change
    bool seen = false;
  };
  void Run();
  bool CreateOwn();        // a new record file under a new name (name_, fd_, own_ino_); false: errno says why
  void ReclaimIfFolded();  // the record was renamed away by a peer that judged this engine dead: start anew
  void WriteOwn(bool closed);
  void ReadPeers(bool relist);
  void Fold(const std::string& peer_name);

  int dirfd_ = -1;  // usage/
  int fd_ = -1;     // own record
  ino_t own_ino_ = 0;
  mode_t file_mode_ = 0;
  int64_t written_committed_ = 0;  // committed as last written into the record (what a folder takes)
  std::string name_;
  LedgerOptions options_;
  std::atomic<int64_t> committed_{0};
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> others_{0};  // the others' counted bytes as last read
  std::atomic<uint32_t> live_{1};
  std::atomic<uint64_t> changes_{0};
  std::atomic<uint64_t> reclaims_{0};
  uint64_t sequence_ = 0;
  uint64_t written_changes_ = ~0ull;
  int64_t last_read_ns_ = 0;  // monotonic, the previous ReadPeers (a longer gap: this reader was not watching)
  std::vector<std::string> peer_names_;
  std::unordered_map<std::string, Peer> peers_;

  mutable std::mutex mu_;  // guards the thread's I/O state (name_ included) against SyncNow and name()
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvtier
