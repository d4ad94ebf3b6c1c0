#include "layout/shared_fs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace kvtier {
namespace {

TEST(SharedFs, KnownKinds) {
  EXPECT_FALSE(FilesystemKindOf(0xEF53).shared);
  EXPECT_EQ(FilesystemKindOf(0xEF53).name, "ext4");
  EXPECT_FALSE(FilesystemKindOf(0x01021994).shared);  // tmpfs
  EXPECT_TRUE(FilesystemKindOf(0x65735546).shared);   // FUSE: MooseFS, GlusterFS, ceph-fuse, 3FS
  EXPECT_TRUE(FilesystemKindOf(0x6969).shared);       // NFS
  EXPECT_TRUE(FilesystemKindOf(0x00C36400).shared);   // CephFS
  EXPECT_TRUE(FilesystemKindOf(0x0BD00BD0).shared);   // Lustre
  EXPECT_TRUE(FilesystemKindOf(0x47504653).shared);   // GPFS
}

TEST(SharedFs, UnknownIsLocalAndNamedByHex) {
  const FilesystemKind k = FilesystemKindOf(0x1234abcd);
  EXPECT_FALSE(k.shared);
  EXPECT_EQ(k.name, "0x1234abcd");
}

TEST(SharedFs, ProbesARealDirectory) {
  const int fd = open("/dev/shm", O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  const FilesystemKind k = ProbeFilesystem(fd);
  close(fd);
  EXPECT_TRUE(k.probed);
  EXPECT_EQ(k.name, "tmpfs");
  EXPECT_FALSE(k.shared);
  EXPECT_FALSE(ProbeFilesystem(-1).probed);
}

}  // namespace
}  // namespace kvtier
