// EntryFiles: how an engine reads and writes entry files on its root, settled when it opens (EngineImpl::Init) and
// read-only after; the reactors read it from their threads without a lock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "layout/chunk_format.h"

namespace kvtier {

struct EntryFiles {
  uint64_t block_stride = 0;
  uint64_t slot_bytes = 0;                    // kHeaderBytes + payload: an entry file's size
  int open_flags = 0;                         // O_DIRECT when direct I/O is on
  uint64_t open_resolve = 0;                  // RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has openat2 (K2)
  std::unique_ptr<ChecksumKey> checksum_key;  // K3: set when options.checksum_secret is
  mode_t file_mode = 0640;
  bool chmod_files = false;  // the process umask strips bits of file_mode: chmod each new temporary
  bool chmod_dirs = false;   // ... of dir_mode: chmod each new fan-out directory
  // L4 with an anonymous temporary: O_TMPFILE in the fan-out directory, write, linkat() it into place. A crash
  // leaves nothing behind and publication costs one metadata operation fewer. Probed at open; named temporaries
  // (create, write, link, unlink) where the filesystem lacks O_TMPFILE.
  bool tmpfile_publish = false;
  // M1: the root is on a filesystem several hosts mount (network, cluster, FUSE: src/layout/shared_fs.h), probed
  // at open. Anonymous temporaries are fsync'ed before linkat there; young bad entries are misses, not removed.
  bool shared_root = false;
};

}  // namespace kvtier
