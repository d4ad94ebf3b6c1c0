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
// Lifetime and reuse: every holder keeps the object open with a shared flock(2) for as long as it uses the counter.
// The first holder (an exclusive lock succeeds: nobody else has it) sets the counter to its own scan's total and
// records the namespace's path in the object; later holders take the counter as it is, so a new engine never
// erases the reservations of running ones. A counter nobody holds is disposable (the next first holder rebuilds it
// from a scan): the last holder removes it when it closes (its exclusive lock succeeds), so a counter does not
// outlive its engines or its root, and Open sweeps those a killed engine left whose namespace is gone. Either
// unlinks one only while holding its exclusive lock, and an opener re-checks after locking that the name still
// refers to the object it locked, so no two live engines ever count in different objects. (Directory inodes are reused:
// a new namespace may get the name of a deleted one's counter, which is harmless because the first holder resets it and
// rewrites the path.)
//
// Limits: shared only by processes of one host (and one /dev/shm: containers with private /dev/shm each count
// their own); hosts sharing a network filesystem each see their own writers. A process killed between its write
// and its link, or unlink and subtract, leaves the counter off by one file until no engine holds it any more.
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
 private:
  // Only the class's own factories construct it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  explicit SharedUsage(Passkey) {}
  // Opens (creating with the namespace's file mode) the namespace's counter, maps it and holds it until destroyed;
  // the destructor of the last holder removes the counter.
  // When no other process or engine holds it, it is set to bytes_if_first (the caller's scan of the namespace).
  static Result<std::unique_ptr<SharedUsage>> Open(const Namespace& ns, uint64_t bytes_if_first);
  // "/kvtier-usage-<dev hex>-<ino hex>" of the namespace directory ("" if it cannot be stat'ed).
  static std::string ShmName(const Namespace& ns);
  ~SharedUsage();
  SharedUsage(const SharedUsage&) = delete;
  SharedUsage& operator=(const SharedUsage&) = delete;

  // Bytes of published chunk files (never negative: a drift below 0 reads as 0).
  uint64_t Load() const;
  void Add(int64_t delta);
  // Whether Open found no other holder and set the counter.
  bool first_holder() const { return first_holder_; }

 private:
  int fd_ = -1;       // held open with a shared flock for the counter's lifetime
  std::string name_;  // ShmName() at Open: the destructor of the last holder unlinks it
  bool first_holder_ = false;
  std::atomic<int64_t>* counter_ = nullptr;  // in the shared mapping
  void* map_ = nullptr;
};

}  // namespace kvtier
