#include "layout/usage_counter.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace kvtier {

static_assert(std::atomic<int64_t>::is_always_lock_free, "the shared counter must be lock-free across processes");

namespace {
constexpr size_t kPathOffset = 64;  // the namespace's path, NUL-terminated (informational, and for SweepStale)

// Removes the counters of namespaces that no longer exist (a test's temporary root, a deleted namespace): their
// recorded path is gone or is now another directory than the name's device and inode.
void SweepStale(const std::string& keep) {
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return;
  while (struct dirent* e = readdir(d)) {
    unsigned long long dev = 0, ino = 0;
    int used = 0;
    if (std::sscanf(e->d_name, "kvtier-usage-%llx-%llx%n", &dev, &ino, &used) != 2 || e->d_name[used] != 0) continue;
    const std::string name = std::string("/") + e->d_name;
    if (name == keep) continue;
    const int fd = shm_open(name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) continue;
    char path[4096 - kPathOffset + 1] = {};
    const ssize_t n = pread(fd, path, sizeof(path) - 1, kPathOffset);
    close(fd);
    if (n <= 0 || path[0] == 0) continue;  // being created
    struct stat st {};
    if (stat(path, &st) != 0 ? errno == ENOENT : (st.st_dev != dev || st.st_ino != ino)) shm_unlink(name.c_str());
  }
  closedir(d);
}
}  // namespace

std::string SharedUsage::ShmName(const Namespace& ns) {
  struct stat st {};
  if (fstat(ns.dirfd(), &st) != 0) return {};
  char name[96];
  std::snprintf(name, sizeof(name), "/kvtier-usage-%llx-%llx", static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  return name;
}

Result<std::unique_ptr<SharedUsage>> SharedUsage::Open(const Namespace& ns) {
  const std::string name = ShmName(ns);
  if (name.empty()) return Status::FromErrno(errno, "stat " + ns.path());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, ns.file_mode());
  if (fd < 0) return Status::FromErrno(errno, "shm_open " + name);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status(StatusCode::kFailedPrecondition, "/dev/shm" + name + " is not a regular file");
  }
  if ((st.st_mode & 07777) != ns.file_mode() && st.st_uid == geteuid()) fchmod(fd, ns.file_mode());  // umask
  // Extending a short object is idempotent (zeros): concurrent creators agree.
  if (st.st_size < 4096 && ftruncate(fd, 4096) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "size /dev/shm" + name);
  }
  void* map = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) return Status::FromErrno(err, "map /dev/shm" + name);
  // The namespace's path, so a later sweep can tell a counter whose namespace is gone.
  char* path = static_cast<char*>(map) + kPathOffset;
  if (path[0] == 0 && ns.path().size() < 4096 - kPathOffset) std::memcpy(path, ns.path().c_str(), ns.path().size());
  SweepStale(name);
  std::unique_ptr<SharedUsage> u(new SharedUsage());
  u->map_ = map;
  u->counter_ = static_cast<std::atomic<int64_t>*>(map);
  return u;
}

SharedUsage::~SharedUsage() {
  if (map_ != nullptr) munmap(map_, 4096);
}

uint64_t SharedUsage::Load() const {
  const int64_t v = counter_->load(std::memory_order_relaxed);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}

void SharedUsage::Add(int64_t delta) { counter_->fetch_add(delta, std::memory_order_relaxed); }

void SharedUsage::Reset(uint64_t bytes) { counter_->store(static_cast<int64_t>(bytes), std::memory_order_relaxed); }

}  // namespace kvtier
