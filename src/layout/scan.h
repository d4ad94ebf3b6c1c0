// Walking a namespace's entries (for the index rebuild at start, fsck, gc and stats) and sweeping stale
// publication temporaries (SPEC C1, L5).
//
// Synchronous, one thread; safe to run while other processes publish and remove entries (an entry that vanishes
// mid-walk is skipped, one that appears may or may not be reported). Never follows symlinks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"
#include "layout/namespace.h"

namespace kvtier {

// One thing found under a namespace directory. Exactly one of three kinds:
//   chunk:     a regular file "ab/cd/<hex>.kvc" in the fan-out directory of its own key; `key` is set.
//   temporary: a regular file whose name starts with ".tmp." (in a fan-out directory or the namespace directory).
//   foreign:   anything else (symlinks, devices, misplaced or misnamed files, unexpected directories). Foreign
//              entries are reported, never descended into, and never removed by this module.
// MANIFEST and the fan-out directories themselves are not reported.
struct EntryInfo {
  ChunkKey key;             // chunks only; empty otherwise
  std::string rel_path;     // relative to the namespace directory
  uint64_t size_bytes = 0;  // st_size (0 for foreign non-regular entries)
  int64_t mtime_ns = 0;     // st_mtim as Unix nanoseconds
  bool is_temporary = false;
  bool is_foreign = false;
};

// Calls visit once per entry. The EntryInfo is reused between calls (no per-entry allocation once its string has
// grown): copy what you keep. visit may unlink the entry it is given. Returns the first error that is not a
// concurrent removal (ENOENT), having stopped the walk.
Status ScanEntries(const Namespace& ns, const std::function<void(const EntryInfo&)>& visit);

struct SweepReport {
  uint64_t temporaries_seen = 0;
  uint64_t removed = 0;
  uint64_t removed_bytes = 0;
  uint64_t kept_young = 0;     // younger than min_age: possibly a live writer's
  uint64_t remove_failed = 0;  // unlink failed for a reason other than ENOENT
};

// Removes temporaries whose mtime is at least min_age old (a writer's temporary is younger than its write
// deadline; pick min_age well above it, e.g. one hour). Counts a temporary already removed by someone else as
// neither removed nor failed.
Result<SweepReport> SweepTemporaries(const Namespace& ns, std::chrono::seconds min_age);

}  // namespace kvtier
