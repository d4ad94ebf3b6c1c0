#include "layout/usage_counter.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
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
constexpr size_t kPathMax = 4096 - kPathOffset;

int LockRetrying(int fd, int op) {
  int r;
  do {
    r = flock(fd, op);
  } while (r != 0 && errno == EINTR);
  return r;
}

// Sweeps on a host take this lock one at a time: a sweep probes each counter with its exclusive lock for a moment,
// and a second sweep finding that lock taken would keep a stale counter as if an engine held it. Not a counter's
// name (the pattern below skips it); anyone may open it (a sweep that cannot goes on without it).
constexpr const char* kSweepLockName = "/kvtier-usage-sweep";

// Removes the counters of namespaces that no longer exist (a test's temporary root, a deleted namespace): their
// recorded path is gone or is now another directory than the name's device and inode. Only a counter nobody holds
// (its exclusive lock is free) is removed, and it is removed while that lock is held (see the header).
void SweepStale(const std::string& keep) {
  int sweep_lock = shm_open(kSweepLockName, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (sweep_lock >= 0 && LockRetrying(sweep_lock, LOCK_EX) != 0) {
    close(sweep_lock);
    sweep_lock = -1;
  }
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) {
    if (sweep_lock >= 0) close(sweep_lock);
    return;
  }
  while (struct dirent* e = readdir(d)) {
    unsigned long long dev = 0, ino = 0;
    int used = 0;
    if (std::sscanf(e->d_name, "kvtier-usage-%llx-%llx%n", &dev, &ino, &used) != 2 || e->d_name[used] != 0) continue;
    const std::string name = std::string("/") + e->d_name;
    if (name == keep) continue;
    const int fd = shm_open(name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {  // held by a live engine
      close(fd);
      continue;
    }
    char path[kPathMax + 1] = {};
    const ssize_t n = pread(fd, path, kPathMax, kPathOffset);
    struct stat mine {
    }, named{};
    // The name must still be this object: an opener may have replaced an object swept a moment ago.
    const bool same = fstat(fd, &mine) == 0 && stat(("/dev/shm" + name).c_str(), &named) == 0 &&
                      mine.st_ino == named.st_ino && mine.st_dev == named.st_dev;
    if (same && n > 0 && path[0] != 0) {  // an empty path: being created, or a path too long to record
      struct stat st {};
      if (stat(path, &st) != 0 ? errno == ENOENT : (st.st_dev != dev || st.st_ino != ino)) shm_unlink(name.c_str());
    }
    close(fd);  // drops the lock
  }
  closedir(d);
  if (sweep_lock >= 0) close(sweep_lock);  // drops the sweep's turn
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

Result<std::unique_ptr<SharedUsage>> SharedUsage::Open(const Namespace& ns, uint64_t bytes_if_first) {
  const std::string name = ShmName(ns);
  if (name.empty()) return Status::FromErrno(errno, "stat " + ns.path());
  // A sweep (another engine's Open) may unlink the object between our shm_open and our lock; then the name no
  // longer refers to what we locked and we start again. Each round either succeeds or loses to a completed sweep,
  // so a few rounds always suffice; the bound only guards against a broken /dev/shm.
  for (int round = 0; round < 64; ++round) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, ns.file_mode());
    if (fd < 0) return Status::FromErrno(errno, "shm_open " + name);
    auto fail = [&](int err, const std::string& what) {
      close(fd);
      return Status::FromErrno(err, what + " /dev/shm" + name);
    };
    struct stat st {};
    if (fstat(fd, &st) != 0) return fail(errno, "stat");
    if (!S_ISREG(st.st_mode)) {
      close(fd);
      return Status(StatusCode::kFailedPrecondition, "/dev/shm" + name + " is not a regular file");
    }
    const bool first = flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (!first && LockRetrying(fd, LOCK_SH) != 0) return fail(errno, "lock");
    struct stat named {};
    if (stat(("/dev/shm" + name).c_str(), &named) != 0 || named.st_ino != st.st_ino || named.st_dev != st.st_dev) {
      close(fd);  // swept under us
      continue;
    }
    if ((st.st_mode & 07777) != ns.file_mode() && st.st_uid == geteuid()) fchmod(fd, ns.file_mode());  // umask
    // Extending a short object is idempotent (zeros): concurrent creators agree.
    if (st.st_size < 4096 && ftruncate(fd, 4096) != 0) return fail(errno, "size");
    void* map = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return fail(errno, "map");
    auto u = std::make_unique<SharedUsage>(Passkey{});
    u->map_ = map;
    u->fd_ = fd;
    u->name_ = name;
    u->counter_ = static_cast<std::atomic<int64_t>*>(map);
    u->first_holder_ = first;
    if (first) {
      // Nobody else counts in this object: rebuild it. The path lets a later sweep tell a counter whose namespace
      // is gone (rewritten: the object may be a deleted namespace's whose directory inode was reused).
      char* path = static_cast<char*>(map) + kPathOffset;
      std::memset(path, 0, kPathMax);
      if (ns.path().size() < kPathMax) std::memcpy(path, ns.path().c_str(), ns.path().size());
      u->counter_->store(static_cast<int64_t>(bytes_if_first), std::memory_order_relaxed);
      // Not atomic (flock drops the exclusive lock, then takes the shared one), but a sweep in between finds a
      // live namespace's path and keeps the object.
      if (LockRetrying(fd, LOCK_SH) != 0) return Status::FromErrno(errno, "lock /dev/shm" + name);
    }
    SweepStale(name);
    return u;
  }
  return Status(StatusCode::kInternal, "/dev/shm" + name + " keeps disappearing while it is opened");
}

SharedUsage::~SharedUsage() {
  if (map_ != nullptr) munmap(map_, 4096);
  if (fd_ < 0) return;
  // The last holder removes the counter, so none outlives its engines (and its root: docs/operations.md, "Disk
  // budget"). An unheld counter is disposable anyway (the next first holder rebuilds it from a scan), and this is
  // the sweep's protocol: the exclusive lock proves nobody else holds it (a conversion that fails because another
  // holder, or an opener, has the shared lock leaves the object alone), and the name is unlinked only while it
  // still refers to the object locked. An opener that shm_open'ed it meanwhile finds the name gone or another
  // object after its lock and starts again. A killed engine skips this; SweepStale removes its counter once the
  // namespace is gone.
  struct stat mine {
  }, named{};
  if (flock(fd_, LOCK_EX | LOCK_NB) == 0 && !name_.empty() && fstat(fd_, &mine) == 0 &&
      stat(("/dev/shm" + name_).c_str(), &named) == 0 && mine.st_ino == named.st_ino && mine.st_dev == named.st_dev) {
    shm_unlink(name_.c_str());
  }
  close(fd_);  // drops the lock
}

uint64_t SharedUsage::Load() const {
  const int64_t v = counter_->load(std::memory_order_relaxed);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}

void SharedUsage::Add(int64_t delta) { counter_->fetch_add(delta, std::memory_order_relaxed); }

}  // namespace kvtier
