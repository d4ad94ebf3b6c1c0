#include "layout/usage_counter.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvtier {

static_assert(std::atomic<int64_t>::is_always_lock_free, "the shared counter must be lock-free across processes");

Result<std::unique_ptr<SharedUsage>> SharedUsage::Open(const Namespace& ns) {
  const int fd = openat(ns.dirfd(), kUsageFileName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, ns.file_mode());
  if (fd < 0) return Status::FromErrno(errno, "open " + ns.path() + "/" + kUsageFileName);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status(StatusCode::kFailedPrecondition, ns.path() + "/" + kUsageFileName + " is not a regular file");
  }
  if ((st.st_mode & 07777) != ns.file_mode() && st.st_uid == geteuid()) fchmod(fd, ns.file_mode());  // umask
  // Extending a short file is idempotent (zeros): concurrent creators agree.
  if (st.st_size < 4096 && ftruncate(fd, 4096) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "size " + ns.path() + "/" + kUsageFileName);
  }
  void* map = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) return Status::FromErrno(err, "map " + ns.path() + "/" + kUsageFileName);
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
