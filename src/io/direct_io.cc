// ProbeDirectIo (I2). We call statx through the raw syscall with our own copy of the kernel's struct: glibc 2.36's
// headers may predate stx_dio_mem_align, and the kernel layout is a stable ABI.
#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "io/io_engine.h"

namespace kvtier {
namespace {

std::atomic<bool> refuse_for_tests{false};  // RefuseDirectIoForTests

constexpr unsigned kStatxDioAlign = 0x2000;  // STATX_DIOALIGN, Linux 6.1

struct KernelStatxTimestamp {
  int64_t tv_sec;
  uint32_t tv_nsec;
  int32_t reserved;
};

struct KernelStatx {
  uint32_t stx_mask;
  uint32_t stx_blksize;
  uint64_t stx_attributes;
  uint32_t stx_nlink;
  uint32_t stx_uid;
  uint32_t stx_gid;
  uint16_t stx_mode;
  uint16_t spare0;
  uint64_t stx_ino;
  uint64_t stx_size;
  uint64_t stx_blocks;
  uint64_t stx_attributes_mask;
  KernelStatxTimestamp stx_atime, stx_btime, stx_ctime, stx_mtime;
  uint32_t stx_rdev_major, stx_rdev_minor, stx_dev_major, stx_dev_minor;
  uint64_t stx_mnt_id;
  uint32_t stx_dio_mem_align;
  uint32_t stx_dio_offset_align;
  uint64_t spare3[12];
};
static_assert(offsetof(KernelStatx, stx_dio_mem_align) == 152);
static_assert(sizeof(KernelStatx) == 256);

std::string FsName(int fd) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return "unknown filesystem";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0x01021994: return "tmpfs";
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x794C7630: return "overlayfs";
    default: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "fs 0x%lx", static_cast<unsigned long>(fs.f_type));
  return buf;
}

// An empty regular file on dirfd's filesystem that vanishes on close: O_TMPFILE, or a unique name unlinked at once.
int OpenProbeFile(int dirfd) {
  int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  static std::atomic<uint64_t> counter{0};
  char name[96];
  std::snprintf(name, sizeof(name), ".kvtier-dio-probe-%d-%llu-%lld", static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)), static_cast<long long>(NowNs()));
  fd = openat(dirfd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  unlinkat(dirfd, name, 0);
  return fd;
}

// One O_DIRECT write of offset_align bytes at offset offset_align, from a buffer aligned to exactly mem_align
// (not to a larger power of two, so success proves mem_align is enough). Returns 0 or -errno.
int TryDirectWrite(int fd, uint32_t mem_align, uint32_t offset_align) {
  const size_t page = 4096;
  size_t span = 2 * (static_cast<size_t>(mem_align) + offset_align + page);
  size_t base_align = std::max<size_t>(page, 2 * static_cast<size_t>(mem_align));
  span = (span + base_align - 1) / base_align * base_align;
  void* raw = std::aligned_alloc(base_align, span);
  if (raw == nullptr) return -ENOMEM;
  char* buf = static_cast<char*>(raw) + mem_align;  // aligned to mem_align, not to 2 * mem_align
  std::memset(buf, 0x5a, offset_align);
  ssize_t n;
  do {
    n = pwrite(fd, buf, offset_align, static_cast<off_t>(offset_align));
  } while (n < 0 && errno == EINTR);
  int r = n == static_cast<ssize_t>(offset_align) ? 0 : (n < 0 ? -errno : -EIO);
  std::free(raw);
  return r;
}

}  // namespace

DirectIoInfo ProbeDirectIo(int dirfd) {
  DirectIoInfo info;
  int fd = OpenProbeFile(dirfd);
  if (fd < 0) {
    info.how = std::string("cannot create a probe file: ") + std::strerror(-fd);
    return info;
  }
  info.probed = true;
  const std::string fs = FsName(fd);
  if (refuse_for_tests.load(std::memory_order_relaxed)) {
    info.how = "O_DIRECT refused (RefuseDirectIoForTests) on " + fs;
    close(fd);
    return info;
  }

  KernelStatx stx{};
  bool statx_known = false;
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, kStatxDioAlign, &stx) == 0 && (stx.stx_mask & kStatxDioAlign) &&
      stx.stx_dio_mem_align != 0 && stx.stx_dio_offset_align != 0) {
    statx_known = true;
  }

  // Setting O_DIRECT on the open file is how open(O_DIRECT) fails too: EINVAL where the filesystem refuses it.
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) {
    int e = errno;
    info.how = std::string("O_DIRECT refused (") + (e == EINVAL ? "EINVAL" : std::strerror(e)) + ") on " + fs;
    close(fd);
    return info;
  }

  if (statx_known) {
    // Trust but verify: some stacked filesystems report the lower device's alignment.
    int r = TryDirectWrite(fd, stx.stx_dio_mem_align, stx.stx_dio_offset_align);
    if (r == 0) {
      info.supported = true;
      info.mem_align = stx.stx_dio_mem_align;
      info.offset_align = stx.stx_dio_offset_align;
      info.how = "statx";
      close(fd);
      return info;
    }
  }

  int last_error = 0;
  for (uint32_t align : {512u, 1024u, 2048u, 4096u}) {
    int r = TryDirectWrite(fd, align, align);
    if (r == 0) {
      info.supported = true;
      info.mem_align = align;
      info.offset_align = align;
      info.how = "probe";
      close(fd);
      return info;
    }
    last_error = -r;
    if (r != -EINVAL) break;  // not an alignment problem: larger alignments will not help
  }
  info.how = "O_DIRECT write failed on " + fs + " at every alignment up to 4096 (" + std::strerror(last_error) + ")";
  close(fd);
  return info;
}

void RefuseDirectIoForTests(bool refuse) { refuse_for_tests.store(refuse, std::memory_order_relaxed); }

std::optional<DirectIoInfo> ProbeDirectIoBeneath(const std::string& dir, const std::string& subdir) {
  const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  const int dir_fd = open(dir.c_str(), flags);
  if (dir_fd < 0) return std::nullopt;
  const int sub_fd = openat(dir_fd, subdir.c_str(), flags);
  DirectIoInfo dio = ProbeDirectIo(sub_fd >= 0 ? sub_fd : dir_fd);
  if (sub_fd >= 0) close(sub_fd);
  close(dir_fd);
  if (!dio.probed) return std::nullopt;
  return dio;
}

bool TmpfileAvailable(int dirfd, int flags, mode_t mode) {
  const int fd = openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC | flags, mode);
  if (fd < 0) return false;
  close(fd);
  return true;
}

}  // namespace kvtier
