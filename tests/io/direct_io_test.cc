// ProbeDirectIo (I2) and CreateIoEngine's choice (I3).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "io/io_engine.h"
#include "io_test_util.h"

namespace kvtier {
namespace {

using testing::ScratchDir;

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

size_t CountEntries(const std::string& path) {
  size_t n = 0;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
    }
    closedir(d);
  }
  return n;
}

// Whatever the probe says must agree with what an O_DIRECT open of a file there actually does.
void ExpectProbeAgreesWithTheFilesystem(const std::string& base) {
  ScratchDir dir(base);
  if (!dir.ok()) {
    // Only a machine without the directory (no /dev/shm, say) lacks the capability; failing to create a scratch
    // directory in one that exists is a failure, not a skip.
    struct stat st {};
    if (stat(base.c_str(), &st) != 0 && errno == ENOENT) GTEST_SKIP() << base << " does not exist on this machine";
    FAIL() << "cannot create a scratch directory under " << base << ": " << std::strerror(errno);
  }
  DirectIoInfo info = ProbeDirectIo(dir.dirfd());
  ::testing::Test::RecordProperty("how", info.how);
  std::printf("%s: supported=%d mem_align=%u offset_align=%u how=%s\n", base.c_str(), info.supported, info.mem_align,
              info.offset_align, info.how.c_str());
  int fd = openat(dir.dirfd(), "check", O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0644);
  if (!info.supported) {
    EXPECT_FALSE(info.how.empty()) << "an unsupported result says why";
    if (fd >= 0) close(fd);
    GTEST_SKIP() << "O_DIRECT unsupported on " << base << ": " << info.how;
  }
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_TRUE(info.how == "statx" || info.how == "probe") << info.how;
  EXPECT_TRUE(IsPowerOfTwo(info.mem_align)) << info.mem_align;
  EXPECT_TRUE(IsPowerOfTwo(info.offset_align)) << info.offset_align;
  EXPECT_LE(info.offset_align, 65536u);
  void* buf = std::aligned_alloc(info.mem_align, info.offset_align);
  std::memset(buf, 1, info.offset_align);
  EXPECT_EQ(pwrite(fd, buf, info.offset_align, info.offset_align), static_cast<ssize_t>(info.offset_align))
      << "a write at the reported alignments succeeds";
  std::free(buf);
  close(fd);
}

TEST(DirectIo, ProbeOnDiskAgreesWithAnODirectWrite) { ExpectProbeAgreesWithTheFilesystem("/var/tmp"); }

TEST(DirectIo, ProbeOnTmpfsAgreesWithAnODirectWrite) { ExpectProbeAgreesWithTheFilesystem("/dev/shm"); }

TEST(DirectIo, ProbeLeavesNoFileBehind) {
  ScratchDir dir("/var/tmp");
  ASSERT_TRUE(dir.ok());
  (void)ProbeDirectIo(dir.dirfd());
  (void)ProbeDirectIo(dir.dirfd());
  EXPECT_EQ(CountEntries(dir.path()), 0u);
}

TEST(DirectIo, ProbeOfABadDirectoryIsUnsupportedWithAReason) {
  DirectIoInfo info = ProbeDirectIo(-1);
  EXPECT_FALSE(info.supported);
  EXPECT_NE(info.how.find("probe file"), std::string::npos) << info.how;
}

TEST(CreateIoEngine, AutoPicksIoUringWhenAvailableElsePosixAndSaysWhy) {
  std::string why;
  auto engine = CreateIoEngine(IoEngineConfig{}, &why);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_FALSE(why.empty());
  std::string probe_why;
  if (UringAvailable(&probe_why)) {
    EXPECT_EQ((*engine)->name(), "io_uring") << why;
  } else {
    EXPECT_EQ((*engine)->name(), "posix") << why;
    EXPECT_NE(why.find("io_uring unavailable"), std::string::npos) << why;
  }
  EXPECT_EQ((*engine)->depth(), IoEngineConfig{}.depth);
}

TEST(CreateIoEngine, PosixCanBeChosenExplicitly) {
  IoEngineConfig config;
  config.kind = IoEngineKind::kPosix;
  config.depth = 3;
  auto engine = CreateIoEngine(config);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->name(), "posix");
  EXPECT_EQ((*engine)->depth(), 3u);
}

TEST(CreateIoEngine, ZeroDepthIsRefused) {
  EXPECT_FALSE(CreatePosixEngine(0, 1).ok());
  std::string why;
  if (!UringAvailable(&why)) GTEST_SKIP() << "io_uring unavailable: " << why;
  EXPECT_FALSE(CreateUringEngine(0).ok());
}

TEST(OpCodeName, NamesEveryOpCode) {
  EXPECT_EQ(OpCodeName(OpCode::kOpenAt), "openat");
  EXPECT_EQ(OpCodeName(OpCode::kLinkAt), "linkat");
  EXPECT_EQ(OpCodeName(OpCode::kUnlinkAt), "unlinkat");
  EXPECT_EQ(OpCodeName(OpCode::kStatx), "statx");
  EXPECT_EQ(OpCodeName(OpCode::kFchmod), "fchmod");
  EXPECT_EQ(OpCodeName(OpCode::kUtimensAt), "utimensat");
}

}  // namespace
}  // namespace kvtier
