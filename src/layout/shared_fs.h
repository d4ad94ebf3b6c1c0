// ProbeFilesystem: what kind of filesystem a storage root is on, from statfs(2)'s f_type (SPEC M1).
//
// "Shared" means one that several hosts may mount at once (network, cluster and FUSE filesystems): there another
// host's writer may have published a name whose data this client cannot see yet, so a short or unreadable young
// entry is not proof of corruption (docs/operations.md, "Shared filesystems"). FUSE counts as shared because
// MooseFS, GlusterFS, ceph-fuse, 3FS, JuiceFS and most distributed filesystems reach Linux through it.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier {

struct FilesystemKind {
  uint64_t magic = 0;   // statfs f_type
  std::string name;     // "ext4", "fuse", "nfs", ... or "0x<hex>"
  bool shared = false;  // mounted by several hosts (network, cluster, FUSE)
  bool probed = false;  // statfs succeeded
};

FilesystemKind ProbeFilesystem(int dirfd);
// The kind a statfs f_type names (no I/O).
FilesystemKind FilesystemKindOf(uint64_t magic);

}  // namespace kvtier
