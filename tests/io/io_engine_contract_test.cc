// The IoEngine contract: every backend (io_uring, POSIX pool, fake, fault-injecting wrapper with no rules) must
// pass this suite. Backend-specific behaviour (how a deadline is honoured) is spelled out per backend below.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "io/fake_engine.h"
#include "io/fault_engine.h"
#include "io/io_engine.h"
#include "io_test_util.h"

namespace kvtier {
namespace {

using testing::FdOp;
using testing::FileExists;
using testing::kMs;
using testing::OpenOp;
using testing::PathOp;
using testing::ReadOp;
using testing::ReapAtLeast;
using testing::RunOne;
using testing::ScratchDir;
using testing::WriteOp;

enum class Backend { kUring, kPosix, kFake, kFaultOverUring, kFaultOverPosix };

// How a backend honours IoOp::deadline_ns (documented in io_engine.h).
enum class DeadlineMode { kCancels, kDeliversLate, kHeldByTest };

std::string BackendName(Backend b) {
  switch (b) {
    case Backend::kUring: return "Uring";
    case Backend::kPosix: return "Posix";
    case Backend::kFake: return "Fake";
    case Backend::kFaultOverUring: return "FaultOverUring";
    case Backend::kFaultOverPosix: return "FaultOverPosix";
  }
  return "Unknown";
}

class IoEngineContract : public ::testing::TestWithParam<Backend> {
 protected:
  bool NeedsUring() const { return GetParam() == Backend::kUring || GetParam() == Backend::kFaultOverUring; }

  DeadlineMode deadline_mode() const {
    switch (GetParam()) {
      case Backend::kUring:
      case Backend::kFaultOverUring: return DeadlineMode::kCancels;
      case Backend::kPosix:
      case Backend::kFaultOverPosix: return DeadlineMode::kDeliversLate;
      case Backend::kFake: return DeadlineMode::kHeldByTest;
    }
    return DeadlineMode::kCancels;
  }

  // Makes the engine under test, or skips the test when the backend's capability is missing.
  std::unique_ptr<IoEngine> Make(uint32_t depth) {
    std::string why;
    if (NeedsUring() && !UringAvailable(&why)) return nullptr;
    switch (GetParam()) {
      case Backend::kUring: return Take(CreateUringEngine(depth));
      case Backend::kPosix: return Take(CreatePosixEngine(depth, 4));
      case Backend::kFake: return std::make_unique<FakeEngine>(depth);
      case Backend::kFaultOverUring: return Wrap(Take(CreateUringEngine(depth)));
      case Backend::kFaultOverPosix: return Wrap(Take(CreatePosixEngine(depth, 4)));
    }
    return nullptr;
  }

  static std::unique_ptr<IoEngine> Take(Result<std::unique_ptr<IoEngine>> r) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  static std::unique_ptr<IoEngine> Wrap(std::unique_ptr<IoEngine> inner) {
    if (inner == nullptr) return nullptr;
    return std::make_unique<FaultInjectingEngine>(std::move(inner));
  }

  ScratchDir dir_;
};

#define MAKE_ENGINE_OR_SKIP(var, depth)                                           \
  if (NeedsUring()) {                                                             \
    std::string why_;                                                             \
    if (!UringAvailable(&why_)) GTEST_SKIP() << "io_uring unavailable: " << why_; \
  }                                                                               \
  std::unique_ptr<IoEngine> var = Make(depth);                                    \
  ASSERT_NE(var, nullptr);                                                        \
  ASSERT_TRUE(dir_.ok())

TEST_P(IoEngineContract, CreateWriteFsyncCloseThenReadBackReturnsTheSameBytes) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  const char* name = "a.bin";
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), name, O_CREAT | O_EXCL | O_RDWR, 1));
  ASSERT_GE(fd, 0) << std::strerror(static_cast<int>(-fd));
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  EXPECT_EQ(RunOne(*engine, WriteOp(static_cast<int>(fd), data.data(), data.size(), 0, 2)), 10000);
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kFsync, static_cast<int>(fd), 3)), 0);
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 4)), 0);

  int64_t rfd = RunOne(*engine, OpenOp(dir_.dirfd(), name, O_RDONLY, 5));
  ASSERT_GE(rfd, 0);
  std::string back(10000, 'x');
  EXPECT_EQ(RunOne(*engine, ReadOp(static_cast<int>(rfd), back.data(), back.size(), 0, 6)), 10000);
  EXPECT_EQ(back, data);
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(rfd), 7)), 0);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, ShortReadAtEndOfFileReturnsBytesRead) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "short", O_CREAT | O_RDWR, 1));
  ASSERT_GE(fd, 0);
  char data[100] = {1};
  ASSERT_EQ(RunOne(*engine, WriteOp(static_cast<int>(fd), data, 100, 0, 2)), 100);
  char back[64];
  EXPECT_EQ(RunOne(*engine, ReadOp(static_cast<int>(fd), back, 64, 60, 3)), 40);
  EXPECT_EQ(RunOne(*engine, ReadOp(static_cast<int>(fd), back, 64, 100, 4)), 0) << "read at EOF returns 0";
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 5)), 0);
}

TEST_P(IoEngineContract, LinkAtOntoAnExistingNameReturnsEexistAndLeavesItUntouched) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "tmp.1", O_CREAT | O_EXCL | O_WRONLY, 1));
  ASSERT_GE(fd, 0);
  ASSERT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 2)), 0);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kLinkAt, dir_.dirfd(), "tmp.1", "final", 3)), 0);
  EXPECT_TRUE(FileExists(dir_.dirfd(), "final"));
  // A second publisher loses the race (L4): EEXIST, which the layout layer treats as success.
  int64_t fd2 = RunOne(*engine, OpenOp(dir_.dirfd(), "tmp.2", O_CREAT | O_EXCL | O_WRONLY, 4));
  ASSERT_GE(fd2, 0);
  ASSERT_EQ(RunOne(*engine, WriteOp(static_cast<int>(fd2), "zz", 2, 0, 5)), 2);
  ASSERT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd2), 6)), 0);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kLinkAt, dir_.dirfd(), "tmp.2", "final", 7)), -EEXIST);
  struct stat st {};
  ASSERT_EQ(fstatat(dir_.dirfd(), "final", &st, 0), 0);
  EXPECT_EQ(st.st_size, 0) << "the first writer's file wins";
}

TEST_P(IoEngineContract, StatxOfAnOpenFileGivesItsTypeSizeInodeAndMtime) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "sized", O_CREAT | O_RDWR, 1));
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(static_cast<int>(fd), 12345), 0);
  struct statx sx {};
  IoOp op = FdOp(OpCode::kStatx, static_cast<int>(fd), 2);
  op.buf = &sx;
  op.len = sizeof(sx);
  ASSERT_EQ(RunOne(*engine, op), 0);
  struct stat st {};
  ASSERT_EQ(fstat(static_cast<int>(fd), &st), 0);
  EXPECT_TRUE(S_ISREG(sx.stx_mode));
  EXPECT_EQ(sx.stx_size, 12345u);
  EXPECT_EQ(sx.stx_ino, st.st_ino);
  EXPECT_EQ(sx.stx_mtime.tv_sec, st.st_mtim.tv_sec);
  EXPECT_EQ(sx.stx_mtime.tv_nsec, static_cast<uint32_t>(st.st_mtim.tv_nsec));
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 3)), 0);

  int64_t dfd = RunOne(*engine, OpenOp(dir_.dirfd(), ".", O_RDONLY | O_DIRECTORY, 4));
  ASSERT_GE(dfd, 0);
  op = FdOp(OpCode::kStatx, static_cast<int>(dfd), 5);
  op.buf = &sx;
  op.len = sizeof(sx);
  ASSERT_EQ(RunOne(*engine, op), 0);
  EXPECT_TRUE(S_ISDIR(sx.stx_mode));
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(dfd), 6)), 0);

  op.len = sizeof(sx) - 1;
  EXPECT_EQ(engine->Submit(op), -EINVAL) << "a buffer shorter than a struct statx is refused";
  op.len = sizeof(sx);
  op.buf = nullptr;
  EXPECT_EQ(engine->Submit(op), -EINVAL);
}

TEST_P(IoEngineContract, StatxOfAPathNeverFollowsItsLastSymlink) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  ASSERT_EQ(mkdirat(dir_.dirfd(), "d", 0700), 0);
  ASSERT_EQ(symlinkat("d", dir_.dirfd(), "link"), 0);
  struct statx sx {};
  IoOp op = PathOp(OpCode::kStatx, dir_.dirfd(), "d", nullptr, 1);
  op.buf = &sx;
  op.len = sizeof(sx);
  ASSERT_EQ(RunOne(*engine, op), 0);
  EXPECT_TRUE(S_ISDIR(sx.stx_mode));
  EXPECT_EQ(sx.stx_mode & 07777, 0700u);
  op.path = "link";
  ASSERT_EQ(RunOne(*engine, op), 0);
  EXPECT_TRUE(S_ISLNK(sx.stx_mode)) << "the link itself, not its target";
  op.path = "absent";
  EXPECT_EQ(RunOne(*engine, op), -ENOENT);
}

TEST_P(IoEngineContract, FchmodSetsTheModeExactlyByFdOrByPathAndRefusesASymlink) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  const mode_t old_umask = umask(077);  // the mode is set exactly, whatever the umask
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "f", O_CREAT | O_RDWR, 1, 0600));
  ASSERT_GE(fd, 0);
  IoOp op = FdOp(OpCode::kFchmod, static_cast<int>(fd), 2);
  op.mode = 0664;
  EXPECT_EQ(RunOne(*engine, op), 0);
  struct stat st {};
  ASSERT_EQ(fstatat(dir_.dirfd(), "f", &st, 0), 0);
  EXPECT_EQ(st.st_mode & 07777, 0664u);
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 3)), 0);

  ASSERT_EQ(mkdirat(dir_.dirfd(), "d", 0777), 0);
  ASSERT_EQ(symlinkat("d", dir_.dirfd(), "link"), 0);
  op = PathOp(OpCode::kFchmod, dir_.dirfd(), "d", nullptr, 4);
  op.mode = 02770;
  EXPECT_EQ(RunOne(*engine, op), 0);
  ASSERT_EQ(fstatat(dir_.dirfd(), "d", &st, 0), 0);
  EXPECT_EQ(st.st_mode & 07777, 02770u);
  op.path = "f";
  op.flags = O_DIRECTORY;
  op.mode = 0777;
  EXPECT_EQ(RunOne(*engine, op), -ENOTDIR) << "O_DIRECTORY: a file is refused, not chmod'ed";
  ASSERT_EQ(fstatat(dir_.dirfd(), "f", &st, 0), 0);
  EXPECT_EQ(st.st_mode & 07777, 0664u);
  op.flags = 0;
  op.path = "link";
  op.mode = 0700;
  EXPECT_EQ(RunOne(*engine, op), -ELOOP);
  ASSERT_EQ(fstatat(dir_.dirfd(), "d", &st, 0), 0);
  EXPECT_EQ(st.st_mode & 07777, 02770u) << "the symlink's target is untouched";
  umask(old_umask);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, UtimensAtSetsBothTimesToNowAndNeverFollowsASymlink) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "old", O_CREAT | O_RDWR, 1));
  ASSERT_GE(fd, 0);
  const struct timespec long_ago[2] = {{1000000, 0}, {1000000, 0}};
  ASSERT_EQ(futimens(static_cast<int>(fd), long_ago), 0);
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 2)), 0);
  ASSERT_EQ(symlinkat("old", dir_.dirfd(), "link"), 0);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kUtimensAt, dir_.dirfd(), "link", nullptr, 3)), 0);
  struct stat st {};
  ASSERT_EQ(fstatat(dir_.dirfd(), "old", &st, 0), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, 1000000) << "a symlink's target is not touched";
  const time_t before = time(nullptr);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kUtimensAt, dir_.dirfd(), "old", nullptr, 4)), 0);
  ASSERT_EQ(fstatat(dir_.dirfd(), "old", &st, 0), 0);
  EXPECT_GE(st.st_mtim.tv_sec, before - 1);
  EXPECT_GE(st.st_atim.tv_sec, before - 1);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kUtimensAt, dir_.dirfd(), "absent", nullptr, 5)), -ENOENT);
}

TEST_P(IoEngineContract, UnlinkAtRemovesTheNameAndAMissingNameReturnsEnoent) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "gone", O_CREAT | O_WRONLY, 1));
  ASSERT_GE(fd, 0);
  ASSERT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 2)), 0);
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kUnlinkAt, dir_.dirfd(), "gone", nullptr, 3)), 0);
  EXPECT_FALSE(FileExists(dir_.dirfd(), "gone"));
  EXPECT_EQ(RunOne(*engine, PathOp(OpCode::kUnlinkAt, dir_.dirfd(), "gone", nullptr, 4)), -ENOENT);
}

TEST_P(IoEngineContract, MkdirAtCreatesADirectoryAndAnExistingNameReturnsEexist) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  IoOp op = PathOp(OpCode::kMkdirAt, dir_.dirfd(), "ab", nullptr, 1);
  op.mode = 0750;
  EXPECT_EQ(RunOne(*engine, op), 0);
  struct stat st {};
  ASSERT_EQ(fstatat(dir_.dirfd(), "ab", &st, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  op.user_data = 2;
  EXPECT_EQ(RunOne(*engine, op), -EEXIST);
  IoOp nested = PathOp(OpCode::kMkdirAt, dir_.dirfd(), "missing/cd", nullptr, 3);
  nested.mode = 0750;
  EXPECT_EQ(RunOne(*engine, nested), -ENOENT) << "one level at a time";
}

TEST_P(IoEngineContract, OpenOfAMissingFileReturnsEnoent) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  EXPECT_EQ(RunOne(*engine, OpenOp(dir_.dirfd(), "no/such/file", O_RDONLY, 1)), -ENOENT);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, OpenWithResolveRefusesSymlinksAndEscapesAndOpensPlainFiles) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  if (!Openat2Available()) GTEST_SKIP() << "openat2 unavailable (kernel without it, or a seccomp filter refusing it)";
  ASSERT_EQ(mkdirat(dir_.dirfd(), "sub", 0700), 0);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "sub/plain", O_CREAT | O_WRONLY, 1));
  ASSERT_GE(fd, 0);
  ASSERT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 2)), 0);
  ASSERT_EQ(symlinkat("plain", dir_.dirfd(), "sub/link"), 0);
  ASSERT_EQ(symlinkat("sub", dir_.dirfd(), "dirlink"), 0);
  const uint64_t resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
  auto open2 = [&](const char* path, int flags, mode_t mode, uint64_t ud) {
    IoOp op = OpenOp(dir_.dirfd(), path, flags, ud, mode);
    op.resolve = resolve;
    return RunOne(*engine, op);
  };
  int64_t ok = open2("sub/plain", O_RDONLY | O_CLOEXEC, 0, 3);
  ASSERT_GE(ok, 0) << std::strerror(static_cast<int>(-ok));
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(ok), 4)), 0);
  EXPECT_EQ(open2("sub/link", O_RDONLY, 0, 5), -ELOOP) << "a symlink as the last component";
  EXPECT_EQ(open2("dirlink/plain", O_RDONLY, 0, 6), -ELOOP) << "a symlink as a directory component";
  EXPECT_EQ(open2("../x", O_RDONLY, 0, 7), -EXDEV) << "a path leaving dirfd";
  int64_t created = open2("sub/new", O_CREAT | O_EXCL | O_WRONLY, 0600, 8);
  ASSERT_GE(created, 0) << std::strerror(static_cast<int>(-created));
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(created), 9)), 0);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, NonBlockingOpenOfAFifoWithoutWriterReturnsAndReadsEof) {
  // The engine opens chunk files O_NONBLOCK so a FIFO planted in the cache cannot hang an open forever.
  MAKE_ENGINE_OR_SKIP(engine, 8);
  ASSERT_EQ(mkfifoat(dir_.dirfd(), "fifo", 0600), 0);
  int64_t fd = RunOne(*engine, OpenOp(dir_.dirfd(), "fifo", O_RDONLY | O_NONBLOCK | O_CLOEXEC, 1), 2'000 * kMs);
  ASSERT_GE(fd, 0) << std::strerror(static_cast<int>(-fd));
  char buf[16];
  const int64_t r = RunOne(*engine, ReadOp(static_cast<int>(fd), buf, sizeof(buf), 0, 2), 2'000 * kMs);
  EXPECT_TRUE(r == 0 || r == -EAGAIN) << r;
  EXPECT_EQ(RunOne(*engine, FdOp(OpCode::kClose, static_cast<int>(fd), 3)), 0);
}

TEST_P(IoEngineContract, MalformedOpsAreRefusedWithEinvalWithoutTakingASlot) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  EXPECT_EQ(engine->Submit(OpenOp(dir_.dirfd(), nullptr, O_RDONLY, 1)), -EINVAL);
  EXPECT_EQ(engine->Submit(ReadOp(-1, nullptr, 0, 0, 2)), -EINVAL);
  char buf[8];
  EXPECT_EQ(engine->Submit(ReadOp(3, nullptr, sizeof(buf), 0, 3)), -EINVAL);
  EXPECT_EQ(engine->Submit(PathOp(OpCode::kLinkAt, dir_.dirfd(), "a", nullptr, 4)), -EINVAL);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, SubmitBeyondDepthReturnsEagainUntilCompletionsAreReaped) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  EXPECT_EQ(engine->depth(), 4u);
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) names.push_back("missing" + std::to_string(i));
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(engine->Submit(OpenOp(dir_.dirfd(), names[i].c_str(), O_RDONLY, i)), 0);
  }
  EXPECT_EQ(engine->in_flight(), 4u);
  EXPECT_EQ(engine->Submit(OpenOp(dir_.dirfd(), "extra", O_RDONLY, 9)), -EAGAIN);
  ASSERT_EQ(engine->Flush(), 0);
  EXPECT_EQ(engine->Submit(OpenOp(dir_.dirfd(), "extra", O_RDONLY, 9)), -EAGAIN)
      << "completed but unreaped ops still count as in flight";
  auto got = ReapAtLeast(*engine, 4);
  ASSERT_EQ(got.size(), 4u);
  for (const IoCompletion& c : got) EXPECT_EQ(c.result, -ENOENT);
  EXPECT_EQ(engine->in_flight(), 0u);
  EXPECT_EQ(RunOne(*engine, OpenOp(dir_.dirfd(), "extra", O_RDONLY, 9)), -ENOENT);
}

TEST_P(IoEngineContract, ManyOpsInFlightCompleteExactlyOnceEachWithTheirUserData) {
  constexpr uint32_t kDepth = 32;
  constexpr int kOps = 500;
  constexpr uint32_t kBlock = 512;
  MAKE_ENGINE_OR_SKIP(engine, kDepth);
  int fd = openat(dir_.dirfd(), "many", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  std::vector<char> file(kOps * kBlock);
  for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<char>(i / kBlock);
  ASSERT_EQ(pwrite(fd, file.data(), file.size(), 0), static_cast<ssize_t>(file.size()));

  std::vector<std::vector<char>> bufs(kOps, std::vector<char>(kBlock));
  std::map<uint64_t, int> seen;
  int next = 0;
  const int64_t give_up = NowNs() + 10'000 * kMs;
  std::vector<IoCompletion> got;
  while (seen.size() < kOps && NowNs() < give_up) {
    // Unique user_data far from small integers, so an engine that leaked its internal tags would be caught.
    while (next < kOps) {
      uint64_t ud = 0xABCD'0000'0000'0000ull + static_cast<uint64_t>(next);
      int r = engine->Submit(ReadOp(fd, bufs[next].data(), kBlock, uint64_t{kBlock} * next, ud));
      if (r == -EAGAIN) break;
      ASSERT_EQ(r, 0);
      ++next;
    }
    EXPECT_LE(engine->in_flight(), kDepth);
    ASSERT_EQ(engine->Flush(), 0);
    got.clear();
    ASSERT_GE(engine->Reap(&got, 1'000 * kMs), 0);
    for (const IoCompletion& c : got) {
      ++seen[c.user_data];
      EXPECT_EQ(c.result, kBlock);
    }
  }
  close(fd);
  ASSERT_EQ(seen.size(), static_cast<size_t>(kOps));
  for (const auto& [ud, count] : seen) {
    ASSERT_EQ(ud >> 48, 0xABCDu);
    int i = static_cast<int>(ud & 0xFFFF);
    EXPECT_EQ(count, 1) << "op " << i << " completed more than once";
    EXPECT_EQ(bufs[i][0], static_cast<char>(i));
  }
  got.clear();
  EXPECT_EQ(engine->Reap(&got, 0), 0) << "no stray completions";
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, ReapWithZeroTimeoutReturnsAtOnceAndAPositiveTimeoutElapses) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  std::vector<IoCompletion> got;
  int64_t start = NowNs();
  EXPECT_EQ(engine->Reap(&got, 0), 0);
  EXPECT_EQ(engine->Reap(&got, 30 * kMs), 0);
  int64_t elapsed = NowNs() - start;
  EXPECT_GE(elapsed, 25 * kMs);
  EXPECT_LT(elapsed, 2'000 * kMs);
}

TEST_P(IoEngineContract, WakeFromAnotherThreadInterruptsABlockedReapPromptly) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  for (int round = 0; round < 3; ++round) {  // the wake mechanism must re-arm itself
    std::atomic<bool> reaping{false};
    std::thread waker([&] {
      while (!reaping.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      engine->Wake();
    });
    std::vector<IoCompletion> got;
    reaping = true;
    int64_t start = NowNs();
    int n = engine->Reap(&got, 5'000 * kMs);
    int64_t elapsed = NowNs() - start;
    waker.join();
    EXPECT_EQ(n, 0) << "a wake is not a completion";
    EXPECT_TRUE(got.empty());
    EXPECT_LT(elapsed, 2'000 * kMs) << "round " << round;
  }
}

TEST_P(IoEngineContract, WakeBeforeReapMakesTheNextReapReturnPromptlyAndOnlyOnce) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  engine->Wake();
  engine->Wake();  // wakes coalesce
  std::vector<IoCompletion> got;
  int64_t start = NowNs();
  EXPECT_EQ(engine->Reap(&got, 5'000 * kMs), 0);
  EXPECT_LT(NowNs() - start, 2'000 * kMs);
  start = NowNs();
  EXPECT_EQ(engine->Reap(&got, 50 * kMs), 0);
  EXPECT_GE(NowNs() - start, 40 * kMs) << "the wake was consumed by the first Reap";
}

// Direct I/O read/write round trip where the filesystem supports it (I2), else a skip naming the reason.
void DirectIoRoundTrip(IoEngine& engine, const std::string& base) {
  ScratchDir dir(base);
  if (!dir.ok()) {
    // Only a machine without the directory (no /dev/shm, say) lacks the capability; failing to create a scratch
    // directory in one that exists is a failure, not a skip.
    struct stat st {};
    if (stat(base.c_str(), &st) != 0 && errno == ENOENT) GTEST_SKIP() << base << " does not exist on this machine";
    FAIL() << "cannot create a scratch directory under " << base << ": " << std::strerror(errno);
  }
  DirectIoInfo info = ProbeDirectIo(dir.dirfd());
  if (!info.supported) {
    GTEST_SKIP() << "O_DIRECT unsupported on this filesystem (tmpfs?): " << base << ": " << info.how;
  }
  const uint32_t align = std::max(info.mem_align, info.offset_align);
  const uint32_t len = 4 * align;
  void* wbuf = std::aligned_alloc(info.mem_align, len);
  void* rbuf = std::aligned_alloc(info.mem_align, len);
  ASSERT_NE(wbuf, nullptr);
  ASSERT_NE(rbuf, nullptr);
  std::memset(wbuf, 0x3c, len);
  std::memset(rbuf, 0, len);
  int64_t fd = RunOne(engine, OpenOp(dir.dirfd(), "direct", O_CREAT | O_RDWR | O_DIRECT, 1));
  ASSERT_GE(fd, 0) << std::strerror(static_cast<int>(-fd));
  EXPECT_EQ(RunOne(engine, WriteOp(static_cast<int>(fd), wbuf, len, align, 2)), len);
  EXPECT_EQ(RunOne(engine, ReadOp(static_cast<int>(fd), rbuf, len, align, 3)), len);
  EXPECT_EQ(std::memcmp(wbuf, rbuf, len), 0);
  EXPECT_EQ(RunOne(engine, FdOp(OpCode::kClose, static_cast<int>(fd), 4)), 0);
  std::free(wbuf);
  std::free(rbuf);
}

TEST_P(IoEngineContract, DirectIoRoundTripsAlignedBuffersOnTmpfs) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  DirectIoRoundTrip(*engine, "/dev/shm");
}

TEST_P(IoEngineContract, DirectIoRoundTripsAlignedBuffersOnDisk) {
  MAKE_ENGINE_OR_SKIP(engine, 8);
  DirectIoRoundTrip(*engine, "/var/tmp");
}

// I4. io_uring cancels a stuck op at its deadline (-ETIMEDOUT); POSIX cannot cancel a blocking syscall and
// delivers the real result late; the fake simulates a stuck op by holding its completion.
TEST_P(IoEngineContract, AStuckReadPastItsDeadlineTimesOutOrIsDeliveredLatePerBackend) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);  // no data and the write end open: a read blocks
  char buf[16] = {};
  std::vector<IoCompletion> got;
  switch (deadline_mode()) {
    case DeadlineMode::kCancels: {
      IoOp op = ReadOp(pipefd[0], buf, sizeof(buf), 0, 77);
      op.deadline_ns = NowNs() + 50 * kMs;
      int64_t start = NowNs();
      EXPECT_EQ(RunOne(*engine, op, 3'000 * kMs, &got), -ETIMEDOUT);
      int64_t elapsed = NowNs() - start;
      EXPECT_GE(elapsed, 40 * kMs);
      EXPECT_LT(elapsed, 2'000 * kMs);
      EXPECT_TRUE(got.empty()) << "the internal timeout CQE must not reach the caller";
      break;
    }
    case DeadlineMode::kDeliversLate: {
      IoOp op = ReadOp(pipefd[0], buf, sizeof(buf), 0, 77);
      op.deadline_ns = NowNs() + 20 * kMs;
      ASSERT_EQ(engine->Submit(op), 0);
      ASSERT_EQ(engine->Flush(), 0);
      EXPECT_EQ(engine->Reap(&got, 100 * kMs), 0) << "posix cannot cancel: nothing arrives at the deadline";
      ASSERT_EQ(write(pipefd[1], "late", 4), 4);
      got = ReapAtLeast(*engine, 1);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].user_data, 77u);
      EXPECT_EQ(got[0].result, 4) << "the real result, delivered after the deadline";
      break;
    }
    case DeadlineMode::kHeldByTest: {
      auto& fake = static_cast<FakeEngine&>(*engine);
      ASSERT_EQ(write(pipefd[1], "data", 4), 4);  // the fake runs ops inline: give the read something
      fake.HoldCompletions(true);
      IoOp op = ReadOp(pipefd[0], buf, sizeof(buf), 0, 77);
      op.deadline_ns = NowNs() + 30 * kMs;
      int64_t start = NowNs();
      EXPECT_EQ(RunOne(*engine, op, 3'000 * kMs), -ETIMEDOUT);
      EXPECT_GE(NowNs() - start, 25 * kMs);
      break;
    }
  }
  close(pipefd[0]);
  close(pipefd[1]);
  EXPECT_EQ(engine->in_flight(), 0u);
}

TEST_P(IoEngineContract, AnOpThatFinishesBeforeItsDeadlineReturnsItsRealResult) {
  MAKE_ENGINE_OR_SKIP(engine, 4);
  int fd = openat(dir_.dirfd(), "quick", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "hello", 5, 0), 5);
  char buf[5];
  IoOp op = ReadOp(fd, buf, 5, 0, 5);
  op.deadline_ns = NowNs() + 2'000 * kMs;
  std::vector<IoCompletion> others;
  EXPECT_EQ(RunOne(*engine, op, 3'000 * kMs, &others), 5);
  EXPECT_TRUE(others.empty());
  // The swallowed link-timeout CQE must not show up later either.
  std::vector<IoCompletion> got;
  EXPECT_EQ(engine->Reap(&got, 20 * kMs), 0);
  close(fd);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, IoEngineContract,
                         ::testing::Values(Backend::kUring, Backend::kPosix, Backend::kFake, Backend::kFaultOverUring,
                                           Backend::kFaultOverPosix),
                         [](const ::testing::TestParamInfo<Backend>& info) { return BackendName(info.param); });

}  // namespace
}  // namespace kvtier
