#include "io/io_engine.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "io/op_exec.h"

namespace kvtier {

std::string_view OpCodeName(OpCode code) {
  switch (code) {
    case OpCode::kOpenAt: return "openat";
    case OpCode::kRead: return "read";
    case OpCode::kWrite: return "write";
    case OpCode::kFsync: return "fsync";
    case OpCode::kClose: return "close";
    case OpCode::kLinkAt: return "linkat";
    case OpCode::kUnlinkAt: return "unlinkat";
    case OpCode::kMkdirAt: return "mkdirat";
    case OpCode::kStatx: return "statx";
    case OpCode::kFchmod: return "fchmod";
    case OpCode::kUtimensAt: return "utimensat";
  }
  return "unknown";
}

bool Openat2Available() {
  static const bool available = [] {
    open_how how{};
    how.flags = O_RDONLY | O_CLOEXEC | O_DIRECTORY;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
    const long fd = ::syscall(SYS_openat2, AT_FDCWD, ".", &how, sizeof(how));
    if (fd >= 0) ::close(static_cast<int>(fd));
    return fd >= 0 || (errno != ENOSYS && errno != EPERM);  // EPERM: a seccomp filter refusing the call
  }();
  return available;
}

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

Result<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineConfig& config, std::string* why) {
  auto say = [why](std::string text) {
    if (why != nullptr) *why = std::move(text);
  };
  switch (config.kind) {
    case IoEngineKind::kUring: {
      say("io_uring requested");
      return CreateUringEngine(config.depth);
    }
    case IoEngineKind::kPosix: {
      say("posix requested");
      return CreatePosixEngine(config.depth, config.posix_threads);
    }
    case IoEngineKind::kAuto: break;
  }
  std::string uring_why;
  if (UringAvailable(&uring_why)) {
    auto engine = CreateUringEngine(config.depth);
    if (engine.ok()) {
      say("io_uring: " + uring_why);
      return engine;
    }
    // The probe ring worked but one sized for depth did not (RLIMIT_MEMLOCK on old kernels): still usable POSIX.
    uring_why = engine.status().ToString();
  }
  say("posix: io_uring unavailable (" + uring_why + ")");
  return CreatePosixEngine(config.depth, config.posix_threads);
}

namespace internal {

int ValidateOp(const IoOp& op) {
  switch (op.code) {
    case OpCode::kOpenAt:
    case OpCode::kUnlinkAt:
    case OpCode::kMkdirAt: return op.path != nullptr ? 0 : -EINVAL;
    case OpCode::kLinkAt: return op.path != nullptr && op.path2 != nullptr ? 0 : -EINVAL;
    case OpCode::kRead:
    case OpCode::kWrite:
      if (op.fd < 0) return -EINVAL;
      return op.buf != nullptr || op.len == 0 ? 0 : -EINVAL;
    case OpCode::kFsync:
    case OpCode::kClose: return op.fd >= 0 ? 0 : -EINVAL;
    case OpCode::kStatx:
      if (op.path == nullptr && op.fd < 0) return -EINVAL;
      return op.buf != nullptr && op.len >= sizeof(struct statx) ? 0 : -EINVAL;
    case OpCode::kFchmod: return op.path != nullptr || op.fd >= 0 ? 0 : -EINVAL;
    case OpCode::kUtimensAt: return op.path != nullptr ? 0 : -EINVAL;
  }
  return -EINVAL;
}

int64_t ExecuteBlocking(const IoOp& op) {
  auto retry = [](auto call) -> int64_t {
    for (;;) {
      int64_t r = call();
      if (r >= 0) return r;
      if (errno != EINTR) return -errno;
    }
  };
  switch (op.code) {
    case OpCode::kOpenAt:
      if (op.resolve != 0) {
        open_how how{};
        how.flags = static_cast<uint64_t>(static_cast<uint32_t>(op.flags));
        how.mode = op.mode;
        how.resolve = op.resolve;
        return retry([&] { return int64_t{::syscall(SYS_openat2, op.dirfd, op.path, &how, sizeof(how))}; });
      }
      return retry([&] { return int64_t{::openat(op.dirfd, op.path, op.flags, op.mode)}; });
    // Pipes and FIFOs refuse pread (ESPIPE); io_uring reads them at the current position, so do the same.
    case OpCode::kRead: {
      int64_t r = retry([&] { return int64_t{::pread(op.fd, op.buf, op.len, static_cast<off_t>(op.offset))}; });
      if (r != -ESPIPE) return r;
      return retry([&] { return int64_t{::read(op.fd, op.buf, op.len)}; });
    }
    case OpCode::kWrite: {
      int64_t r = retry([&] { return int64_t{::pwrite(op.fd, op.buf, op.len, static_cast<off_t>(op.offset))}; });
      if (r != -ESPIPE) return r;
      return retry([&] { return int64_t{::write(op.fd, op.buf, op.len)}; });
    }
    case OpCode::kFsync: return retry([&] { return int64_t{::fsync(op.fd)}; });
    case OpCode::kClose: return ::close(op.fd) == 0 ? 0 : -errno;
    case OpCode::kLinkAt:
      return retry([&] { return int64_t{::linkat(op.dirfd, op.path, op.dirfd, op.path2, op.flags)}; });
    case OpCode::kUnlinkAt: return retry([&] { return int64_t{::unlinkat(op.dirfd, op.path, op.flags)}; });
    case OpCode::kMkdirAt: return retry([&] { return int64_t{::mkdirat(op.dirfd, op.path, op.mode)}; });
    case OpCode::kStatx: {
      auto* out = static_cast<struct statx*>(op.buf);
      if (op.path == nullptr) {
        return retry(
            [&] { return int64_t{::statx(op.fd, "", AT_EMPTY_PATH | AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS, out)}; });
      }
      return retry([&] {
        return int64_t{::statx(op.dirfd, op.path, AT_SYMLINK_NOFOLLOW | AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS, out)};
      });
    }
    case OpCode::kFchmod: {
      if (op.path == nullptr) return retry([&] { return int64_t{::fchmod(op.fd, op.mode)}; });
      const int64_t fd = retry([&] {
        return int64_t{::openat(op.dirfd, op.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | op.flags)};
      });
      if (fd < 0) return fd;
      const int64_t r = retry([&] { return int64_t{::fchmod(static_cast<int>(fd), op.mode)}; });
      ::close(static_cast<int>(fd));
      return r;
    }
    case OpCode::kUtimensAt:
      return retry([&] { return int64_t{::utimensat(op.dirfd, op.path, nullptr, AT_SYMLINK_NOFOLLOW)}; });
  }
  return -EINVAL;
}

}  // namespace internal
}  // namespace kvtier
