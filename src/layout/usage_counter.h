// SharedUsage: the disk usage of a namespace, shared by every engine on one host that uses it (SPEC C1).
//
// Each engine indexes only the entries it has seen, so per-instance accounting lets N instances sharing a root grow
// it to N budgets. One 64-bit counter of the bytes of published chunk files lives in POSIX shared memory named
// after the namespace directory's device and inode ("/dev/shm/kvtier-usage-<dev>-<ino>"): an engine adds a file's
// bytes when it starts writing it (a reservation, dropped again if the store fails or another writer wins) and
// subtracts them when its unlink() removes the entry (not on ENOENT), so each file is counted once whoever
// publishes or removes it. Engines compare the counter, not their own index, with the budget. It is not a file
// under the root: a root that turns read-only can still be remounted so (a writable shared mapping of a file there
// would hold the mount busy).
//
// Limits: shared only by processes of one host (and one /dev/shm: containers with private /dev/shm each count
// their own); hosts sharing a network filesystem each see their own writers. A process killed between its write
// and its link, or unlink and subtract, leaves the counter off by one file; `Reset` with a fresh scan's total
// (engine open) repairs the drift.
//
// Thread and process safety: Add and Load are lock-free atomics on the shared page; any thread, any process.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/status.h"
#include "layout/namespace.h"

namespace kvtier {

class SharedUsage {
 public:
  // Opens (creating with the namespace's file mode) the namespace's counter and maps it. A new one starts at 0.
  static Result<std::unique_ptr<SharedUsage>> Open(const Namespace& ns);
  // "/kvtier-usage-<dev hex>-<ino hex>" of the namespace directory ("" if it cannot be stat'ed).
  static std::string ShmName(const Namespace& ns);
  ~SharedUsage();
  SharedUsage(const SharedUsage&) = delete;
  SharedUsage& operator=(const SharedUsage&) = delete;

  // Bytes of published chunk files (never negative: a drift below 0 reads as 0).
  uint64_t Load() const;
  void Add(int64_t delta);
  void Reset(uint64_t bytes);

 private:
  SharedUsage() = default;
  std::atomic<int64_t>* counter_ = nullptr;  // in the shared mapping
  void* map_ = nullptr;
};

}  // namespace kvtier
