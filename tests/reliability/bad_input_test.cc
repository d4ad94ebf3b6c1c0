// Bad input (SPEC V4): every engine option with invalid values, and CLI misuse. Each is refused with a clear
// message naming the option or flag. (The Python option dict and the vLLM kvtier_* keys have the same table in
// tests/vllm/test_bad_config.py.)
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

// Everything under dir, as text: each path with its type, mode, size and bytes (a failed open must change none).
std::string Snapshot(const std::string& dir) {
  std::vector<std::string> lines;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st;
    if (lstat(e.path().c_str(), &st) != 0) continue;
    std::string line = e.path().string().substr(dir.size()) + " mode " + std::to_string(st.st_mode) + " size " +
                       std::to_string(st.st_size);
    if (S_ISREG(st.st_mode)) {
      std::ifstream in(e.path(), std::ios::binary);
      line += " " + std::string(std::istreambuf_iterator<char>(in), {});
    }
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

struct BadOption {
  const char* names;  // what the message must mention
  std::function<void(EngineOptions&)> set;
};

TEST(BadInput, EveryEngineOptionWithAnInvalidValueIsRefusedNamingIt) {
  test::TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  {
    FILE* f = fopen(file.c_str(), "w");
    if (f) fclose(f);
  }
  const std::vector<BadOption> table = {
      {"root", [](EngineOptions& o) { o.root = ""; }},
      {"does not exist", [](EngineOptions& o) { o.root = "/nonexistent/kvtier-root"; }},
      {"not a directory", [&](EngineOptions& o) { o.root = file; }},
      {"identity.model", [](EngineOptions& o) { o.identity.model = ""; }},
      {"revision", [](EngineOptions& o) { o.identity.revision = ""; }},
      {"identity.kv_dtype", [](EngineOptions& o) { o.identity.kv_dtype = ""; }},
      {"identity.blocks_per_chunk", [](EngineOptions& o) { o.identity.blocks_per_chunk = 0; }},
      {"identity.blocks_per_chunk", [](EngineOptions& o) { o.identity.blocks_per_chunk = 257; }},
      {"identity.block_bytes", [](EngineOptions& o) { o.identity.block_bytes = 0; }},
      {"identity.block_bytes", [](EngineOptions& o) { o.identity.block_bytes = 1ull << 33; }},
      {"identity.tokens_per_chunk", [](EngineOptions& o) { o.identity.tokens_per_chunk = 0; }},
      {"tokens_per_chunk", [](EngineOptions& o) { o.identity.tokens_per_chunk = 63; }},
      {"tp_size", [](EngineOptions& o) { o.identity.tp_size = 0; }},
      {"pp_size", [](EngineOptions& o) { o.identity.pp_size = 0; }},
      {"layout_tag", [](EngineOptions& o) { o.identity.layout_tag = ""; }},
      // an identity whose MANIFEST could be written but not read back (over 64 KiB).
      {"model", [](EngineOptions& o) { o.identity.model = std::string(70000, 'm'); }},
      {"layout_tag", [](EngineOptions& o) { o.identity.layout_tag = std::string(4097, '%'); }},
      {"pool_name", [](EngineOptions& o) { o.pool_name = "a/b"; }},
      {"io_depth", [](EngineOptions& o) { o.io_depth = 0; }},
      {"io_depth", [](EngineOptions& o) { o.io_depth = 100000; }},
      {"posix_threads", [](EngineOptions& o) { o.posix_threads = 0; }},
      {"posix_threads", [](EngineOptions& o) { o.posix_threads = 1000; }},
      {"op_timeout_ms", [](EngineOptions& o) { o.op_timeout_ms = 0; }},
      {"watermark",
       [](EngineOptions& o) {
         o.low_watermark = 0.9;
         o.high_watermark = 0.8;
       }},
      {"watermark", [](EngineOptions& o) { o.high_watermark = 1.5; }},
      {"watermark", [](EngineOptions& o) { o.low_watermark = 0; }},
      {"watermark", [](EngineOptions& o) { o.low_watermark = -1; }},
      {"dir_mode", [](EngineOptions& o) { o.dir_mode = 0640; }},
      {"dir_mode", [](EngineOptions& o) { o.dir_mode = 010750; }},
      {"dir_mode", [](EngineOptions& o) { o.dir_mode = 07777; }},  // setuid/setgid/sticky and world-writable
      {"dir_mode", [](EngineOptions& o) { o.dir_mode = 02750; }},  // setgid
      {"dir_mode", [](EngineOptions& o) { o.dir_mode = 0777; }},   // world-writable
      {"pool_bytes", [](EngineOptions& o) { o.pool_bytes = 0; }},
      {"pool_bytes", [](EngineOptions& o) { o.pool_bytes = 4096; }},
      {"shared memory", [](EngineOptions& o) { o.pool_bytes = 1ull << 63; }},  // more than /dev/shm has
      {"checksum_secret", [](EngineOptions& o) { o.checksum_secret = "too-short"; }},
      {"checksum_secret", [](EngineOptions& o) { o.checksum_secret = "file:"; }},
      {"checksum_secret", [](EngineOptions& o) { o.checksum_secret = "file:/nonexistent/key"; }},
      {"trace_path", [](EngineOptions& o) { o.trace_path = "/nonexistent/dir/trace.json"; }},
  };
  // each is refused before anything is written, in an empty root and in one that holds a namespace.
  for (bool populated : {false, true}) {
    if (populated) {
      auto e = test::OpenWithJobs(Options(dir.path()));
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      ASSERT_TRUE(StoreOne(e.value(), 1).ok());
    }
    for (const BadOption& b : table) {
      EngineOptions o = Options(dir.path());
      b.set(o);
      const std::string before = Snapshot(dir.path());
      auto e = test::OpenWithJobs(o);
      ASSERT_FALSE(e.ok()) << "accepted a bad value for " << b.names;
      EXPECT_NE(e.status().message().find(b.names), std::string::npos)
          << "the message does not name " << b.names << ": " << e.status().ToString();
      EXPECT_EQ(Snapshot(dir.path()), before) << "a failed open (" << e.status().ToString() << ") changed the root";
    }
  }
  std::printf("bad input: %zu invalid engine option values, each refused naming the option, the root unchanged\n",
              table.size());
}

// V4, I2: io_mode=direct where the filesystem refuses O_DIRECT fails before anything is written: no namespace
// directory, no MANIFEST, an existing namespace as it was. Run where every probe reports O_DIRECT refused
// (RefuseDirectIoForTests, so the test runs on any filesystem and as any user), and on a real filesystem without
// O_DIRECT below.
void ExpectDirectRefusedLeavesRootUnchanged(const std::string& root) {
  for (bool populated : {false, true}) {
    if (populated) {
      EngineOptions o = Options(root);
      o.io_mode = IoMode::kBuffered;
      auto e = test::OpenWithJobs(o);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      ASSERT_TRUE(StoreOne(e.value(), 1).ok());
    }
    EngineOptions o = Options(root);
    o.io_mode = IoMode::kDirect;
    const std::string before = Snapshot(root);
    auto e = test::OpenWithJobs(o);
    ASSERT_FALSE(e.ok()) << "io_mode=direct opened where O_DIRECT is refused";
    EXPECT_EQ(e.status().code(), StatusCode::kUnsupported) << e.status().ToString();
    EXPECT_NE(e.status().message().find("io_mode=direct"), std::string::npos) << e.status().ToString();
    EXPECT_EQ(Snapshot(root), before) << "a refused io_mode=direct changed the root (populated " << populated << ")";
    if (!populated) {
      EXPECT_FALSE(std::filesystem::exists(NsPath(o))) << "the namespace was created";
    }
  }
  // io_mode=auto falls back to buffered there, and opens.
  EngineOptions o = Options(root);
  auto e = test::OpenWithJobs(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(e.value()->Describe().find("O_DIRECT unavailable"), std::string::npos) << e.value()->Describe();
}

TEST(BadInput, IoModeDirectRefusedLeavesTheRootUnchanged) {
  test::TempDir dir;
  RefuseDirectIoForTests(true);
  ExpectDirectRefusedLeavesRootUnchanged(dir.path());
  RefuseDirectIoForTests(false);
}

// The same on ramfs, which refuses O_DIRECT: needs the right to mount (skipped otherwise).
TEST(BadInput, IoModeDirectRefusedOnRamfsLeavesTheRootUnchanged) {
  test::TempDir dir;
  const std::string root = dir.path() + "/ramfs";
  ASSERT_EQ(mkdir(root.c_str(), 0750), 0);
  if (mount("kvtier-test", root.c_str(), "ramfs", 0, "mode=0750") != 0) {
    GTEST_SKIP() << "cannot mount ramfs here: " << std::strerror(errno);
  }
  ExpectDirectRefusedLeavesRootUnchanged(root);
  EXPECT_EQ(umount2(root.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

#ifdef KVTIER_CLI_PATH
struct CliRun {
  int code;
  std::string out;
};

CliRun Cli(const std::string& args) {
  const std::string cmd = std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1";
  CliRun r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(BadInput, CliMisuseExitsNonZeroNamingTheArgument) {
  test::TempDir dir;
  const std::string root = dir.path();
  struct Case {
    std::string args;
    int code;
    const char* mentions;
  };
  const std::vector<Case> table = {
      {"", 2, "command"},
      {"no-such-command", 2, "no-such-command"},
      {"fsck", 2, "--root"},
      {"fsck --root", 2, "--root"},
      {"fsck --root " + root + " --bogus", 2, "--bogus"},
      {"fsck --root " + root + " --repair=yes", 2, "--repair"},
      {"fsck --root " + root + " --temp-max-age -5", 2, "--temp-max-age"},
      {"fsck --root " + root + " --checksum-secret short", 2, "--checksum-secret"},
      {"fsck --root /nonexistent/kvtier-root", 1, "/nonexistent/kvtier-root"},
      {"gc --root " + root, 2, "--budget"},
      {"gc --root " + root + " --budget lots", 2, "--budget"},
      {"gc --root " + root + " --budget 1GiB --low-watermark 2", 2, "watermark"},
      {"stats --root /nonexistent/kvtier-root", 1, "/nonexistent/kvtier-root"},
      {"stats --root " + root + " extra-positional", 2, "extra-positional"},
      {"bench io --dir " + root + " --total zero", 2, "--total"},
  };
  for (const Case& c : table) {
    CliRun r = Cli(c.args);
    EXPECT_EQ(r.code, c.code) << "kvtier " << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.mentions), std::string::npos)
        << "kvtier " << c.args << " does not name " << c.mentions << ":\n"
        << r.out;
  }
  std::printf("bad input: %zu CLI misuses, each refused naming the argument\n", table.size());
}
#endif

}  // namespace
}  // namespace kvtier::rel
