// SharedUsage: the disk usage of a namespace, shared by every engine on one host that uses it (SPEC C1).
//
// Each engine indexes only the entries it has seen, so per-instance accounting lets N instances sharing a root grow
// it to N budgets. The namespace's USAGE file (4096 bytes, mapped shared) holds one 64-bit counter of the bytes of
// published chunk files: an engine adds a file's bytes when its link() created the entry (not on EEXIST) and
// subtracts them when its unlink() removed it (not on ENOENT), so each file is counted once whoever publishes or
// removes it. Engines compare the counter, not their own index, with the budget.
//
// Limits: the counter is exact only between processes of one host mapping the same file (a network filesystem
// shared by several hosts does not keep mappings coherent: each host then sees its own writers only). A process
// killed between its link and its add (or unlink and subtract) leaves it off by one file; `Reset` with a fresh
// scan's total (engine open, `kvtier gc`) repairs the drift.
//
// Thread and process safety: Add and Load are lock-free atomics on the shared page; any thread, any process.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "kvtier/status.h"
#include "layout/namespace.h"

namespace kvtier {

inline constexpr const char* kUsageFileName = "USAGE";

class SharedUsage {
 public:
  // Opens (creating with the namespace's file mode) ns/USAGE and maps it. A new file starts at 0.
  static Result<std::unique_ptr<SharedUsage>> Open(const Namespace& ns);
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
