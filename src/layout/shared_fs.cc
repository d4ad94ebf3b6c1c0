#include "layout/shared_fs.h"

#include <sys/vfs.h>

#include <cstdio>

namespace kvtier {

namespace {
struct Known {
  uint64_t magic;
  const char* name;
  bool shared;
};
// linux/magic.h and the filesystems' own sources (GPFS, Lustre, BeeGFS define theirs outside the kernel tree).
constexpr Known kKnown[] = {
    {0xEF53, "ext4", false},          {0x58465342, "xfs", false},   {0x9123683E, "btrfs", false},
    {0x01021994, "tmpfs", false},     {0x2FC12FC1, "zfs", false},   {0xF2F52010, "f2fs", false},
    {0x794C7630, "overlayfs", false}, {0x65735546, "fuse", true},   {0x6969, "nfs", true},
    {0x00C36400, "cephfs", true},     {0x0BD00BD0, "lustre", true}, {0x47504653, "gpfs", true},
    {0xFF534D42, "cifs", true},       {0xFE534D42, "smb2", true},   {0x01021997, "9p", true},
    {0x01161970, "gfs2", true},       {0x7461636F, "ocfs2", true},  {0x19830326, "beegfs", true},
    {0x5346414F, "afs", true},        {0x6B414653, "afs", true},    {0x73757245, "coda", true},
};
}  // namespace

FilesystemKind FilesystemKindOf(uint64_t magic) {
  FilesystemKind k;
  k.magic = magic;
  k.probed = true;
  for (const Known& e : kKnown) {
    if (e.magic == magic) {
      k.name = e.name;
      k.shared = e.shared;
      return k;
    }
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(magic));
  k.name = hex;
  return k;
}

FilesystemKind ProbeFilesystem(int dirfd) {
  struct statfs sf {};
  if (fstatfs(dirfd, &sf) != 0) return FilesystemKind{};
  return FilesystemKindOf(static_cast<uint64_t>(static_cast<unsigned long>(sf.f_type)));
}

}  // namespace kvtier
