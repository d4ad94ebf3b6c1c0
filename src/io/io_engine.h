// IoEngine: the seam between kvtier's reactor and the operating system's asynchronous I/O.
//
// One thread (the engine's reactor) owns an IoEngine and is the only caller of Submit/Flush/Reap. Other threads
// may call Wake() to end a Reap early. Implementations: io_uring (UringEngine), a small POSIX thread pool
// (PosixEngine), an inline fake for deterministic tests (FakeEngine) and a fault-injecting wrapper
// (FaultInjectingEngine). All of them pass tests/io/io_engine_contract_test.cc.
//
// Results are always a number: bytes transferred, a new fd, 0, or -errno. Never a bare bool.
//
// Issuer thread: the first thread to call Submit/Flush/Reap becomes the issuer (io_uring binds the ring to it
// when the kernel supports IORING_SETUP_SINGLE_ISSUER), so an engine may be created on one thread and handed to
// the reactor thread before first use. Destroy it on the issuer thread, or anywhere once in_flight() is 0.
// Destruction with ops in flight: io_uring cancels them and waits (at most about 1 s) so no borrowed buffer is
// written after the destructor returns; POSIX drops ops not yet started and waits for running syscalls to return
// (a read that never returns, e.g. from an idle pipe, blocks the destructor: give such ops a writer or avoid them).
// Reads and writes on non-seekable files (pipes, FIFOs) ignore offset on every backend.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class OpCode : uint8_t {
  kOpenAt,     // openat(dirfd, path, flags, mode) -> fd; with resolve != 0: openat2(dirfd, path, {flags, mode,
               // resolve}) -> fd (-ENOSYS where the kernel lacks openat2: see Openat2Available())
  kRead,       // pread(fd, buf, len, offset) -> bytes (may be short)
  kWrite,      // pwrite(fd, buf, len, offset) -> bytes (may be short)
  kFsync,      // fsync(fd) -> 0
  kClose,      // close(fd) -> 0
  kLinkAt,     // linkat(dirfd, path, dirfd, path2, flags) -> 0 (flags: 0 or AT_SYMLINK_FOLLOW)
  kUnlinkAt,   // unlinkat(dirfd, path, flags) -> 0
  kMkdirAt,    // mkdirat(dirfd, path, mode) -> 0 (the umask applies)
  kStatx,      // without path: statx(fd, "", AT_EMPTY_PATH, ...), the open file's; with path: statx(dirfd, path,
               // AT_SYMLINK_NOFOLLOW, ...), never following a final symlink. STATX_BASIC_STATS (type, mode, owner,
               // size, inode, mtime) into buf, a struct statx of len >= sizeof(struct statx) bytes -> 0
  kFchmod,     // without path: fchmod(fd, mode); with path: what is at dirfd/path opened O_NOFOLLOW | O_NONBLOCK |
               // flags (a symlink is refused with ELOOP, a FIFO does not block; flags O_DIRECTORY: anything but a
               // directory is refused with ENOTDIR), fchmod'ed and closed -> 0
  kUtimensAt,  // utimensat(dirfd, path, nullptr, AT_SYMLINK_NOFOLLOW): both times now (write permission suffices)
               // -> 0
};
// How many op codes there are: size per-code tables with it (a new code must extend them).
inline constexpr size_t kNumOpCodes = static_cast<size_t>(OpCode::kUtimensAt) + 1;

std::string_view OpCodeName(OpCode code);

// One operation. Pointers (path, path2, buf) are borrowed: they must stay valid until the op's completion has
// been returned by Reap, even if the op passed its deadline.
struct IoOp {
  OpCode code = OpCode::kRead;
  uint64_t user_data = 0;       // returned unchanged in the completion
  int dirfd = AT_FDCWD;         // kOpenAt, kLinkAt, kUnlinkAt, kMkdirAt, kUtimensAt; kStatx, kFchmod with path
  int fd = -1;                  // kRead, kWrite, kFsync, kClose; kStatx, kFchmod without path
  const char* path = nullptr;   // kOpenAt, kLinkAt (old), kUnlinkAt, kMkdirAt, kUtimensAt; kStatx, kFchmod (optional)
  const char* path2 = nullptr;  // kLinkAt (new)
  int flags = 0;                // kOpenAt open flags, kLinkAt and kUnlinkAt flags, kFchmod\'s extra open flags
  mode_t mode = 0;              // kOpenAt (must be 0 with resolve unless flags has O_CREAT or O_TMPFILE), kMkdirAt,
                                // kFchmod (exactly: no umask)
  uint64_t resolve = 0;         // kOpenAt: RESOLVE_* flags (linux/openat2.h), e.g. RESOLVE_BENEATH |
                                // RESOLVE_NO_SYMLINKS: no path component may be a symlink or leave dirfd (K2)
  void* buf = nullptr;          // kRead, kWrite, kStatx
  uint32_t len = 0;             // kRead, kWrite, kStatx
  uint64_t offset = 0;          // kRead, kWrite
  // Absolute CLOCK_MONOTONIC nanoseconds (see NowNs()); 0 means no deadline. A backend that can cancel an op
  // (io_uring, via a linked timeout) completes it with -ETIMEDOUT once the deadline passes, unless it already
  // finished; an op that cannot be interrupted in the kernel (an openat under way) may still return its real
  // result. POSIX cannot cancel a blocking syscall and delivers the real result late. Callers enforce deadlines on
  // their own side as well (the engine treats a late op as failed but keeps its buffer until the completion
  // arrives, and closes an fd that a late openat returns).
  int64_t deadline_ns = 0;
};

struct IoCompletion {
  uint64_t user_data = 0;
  int64_t result = 0;  // >= 0: bytes / fd / 0; < 0: -errno
};

int64_t NowNs();  // CLOCK_MONOTONIC in nanoseconds

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  virtual std::string_view name() const = 0;
  // The most ops that may be in flight (submitted and not yet reaped) at once.
  virtual uint32_t depth() const = 0;
  virtual uint32_t in_flight() const = 0;

  // Queues one op. Returns 0, or -EAGAIN when depth() ops are already in flight, or -EINVAL for a malformed op.
  // Never blocks. Queued ops may not start until Flush() (io_uring batches them).
  virtual int Submit(const IoOp& op) = 0;
  // Starts every queued op. Returns 0 or -errno.
  virtual int Flush() = 0;
  // Appends completed ops to *out. Waits until at least one completion is available, Wake() is called, or
  // timeout_ns passes (0: do not wait; < 0: wait without limit). Returns the number appended, or -errno.
  // Each submitted op completes exactly once; internal events (wake-ups, timeout records) are never reported.
  // A Reap ended by Wake() returns 0 unless completions were also ready.
  virtual int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) = 0;
  // Thread-safe: makes a concurrent or the next Reap return promptly. Wakes before a Reap coalesce into one.
  virtual void Wake() = 0;
};

enum class IoEngineKind { kAuto, kUring, kPosix };

struct IoEngineConfig {
  IoEngineKind kind = IoEngineKind::kAuto;
  uint32_t depth = 16;         // ops in flight
  uint32_t posix_threads = 4;  // PosixEngine worker threads
};

// kAuto probes io_uring (creating a ring and running a NOP) and falls back to POSIX when the kernel refuses it
// (ENOSYS, EPERM under seccomp, ...). *why, when given, receives a one-line reason for the choice.
Result<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineConfig& config, std::string* why = nullptr);

Result<std::unique_ptr<IoEngine>> CreateUringEngine(uint32_t depth);
Result<std::unique_ptr<IoEngine>> CreatePosixEngine(uint32_t depth, uint32_t threads);
bool UringAvailable(std::string* why = nullptr);
// True when the kernel has the openat2 system call (Linux 5.6+, which also has IORING_OP_OPENAT2). Probed once.
bool Openat2Available();

// Direct I/O capability of the filesystem holding dirfd (I2): statx STATX_DIOALIGN where the kernel reports it,
// otherwise a probe write of a temporary file with O_DIRECT at decreasing alignments.
struct DirectIoInfo {
  bool supported = false;
  uint32_t mem_align = 0;     // required buffer alignment in bytes
  uint32_t offset_align = 0;  // required file offset and length alignment in bytes
  std::string how;            // "statx", "probe", or why unsupported ("EINVAL on tmpfs", ...)
  bool probed = false;        // a probe file could be made (false: `how` says why not, and nothing was learnt)
};
// The probe file is an O_TMPFILE (or a unique name unlinked at once): nothing is left in dirfd.
DirectIoInfo ProbeDirectIo(int dirfd);
// ProbeDirectIo of dir/subdir where that directory exists, else of dir (where a directory is about to be created);
// none where dir cannot be opened or no probe file could be made there. Neither is followed if it is a symlink.
std::optional<DirectIoInfo> ProbeDirectIoBeneath(const std::string& dir, const std::string& subdir);
// Tests: every probe from now on reports O_DIRECT refused (true), as on a filesystem without it, or probes again
// (false). For a test binary's own use (tests/reliability/bad_input_test.cc).
void RefuseDirectIoForTests(bool refuse);

// L4: an anonymous temporary (O_TMPFILE with `flags` and `mode`) can be made in dirfd; the probe leaves nothing.
bool TmpfileAvailable(int dirfd, int flags, mode_t mode);

}  // namespace kvtier
