// The `kvtier` CLI end to end: runs the built binary (KVTIER_CLI_PATH, set by CMake; or $KVTIER_CLI) on roots
// populated through the Engine API, and checks exit codes and output.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "layout/usage_ledger.h"
#include "policy/job_client.h"
#include "support/engine_options.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 8192;

std::string CliPath() {
  if (const char* p = getenv("KVTIER_CLI")) return p;
#ifdef KVTIER_CLI_PATH
  return KVTIER_CLI_PATH;
#else
  return "";
#endif
}

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

// Runs `kvtier <args>` (the binary at `binary`) through the shell, capturing both streams.
CliRun Kvtier(const std::string& args, const std::string& binary = CliPath()) {
  CliRun r;
  const std::string cmd = "'" + binary + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Spreads the index over the first two key bytes, so entries land in different fan-out directories.
uint64_t SplitKeyByte(uint64_t i, int k) { return k == 0 ? i * 37 : k == 1 ? i * 101 : (i >> (8 * k)); }

ChunkKey Key(uint64_t i) {
  uint8_t b[32] = {};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(SplitKeyByte(i, k));
  b[9] = 0xa5;
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

EngineOptions Options(const std::string& root) {
  EngineOptions o = test::BaseOptions(root, "cli-test-model", 64, kBlocks, kBlockBytes);
  o.pool_bytes = 8 * ChunkFileBytes(kBlocks, kBlockBytes);
  o.io_depth = 4;
  return o;
}

NamespaceIdentity NsIdentity() {
  const EngineOptions o = Options("");
  NamespaceIdentity id;
  id.model = o.identity.model;
  id.revision = o.identity.revision;
  id.kv_dtype = o.identity.kv_dtype;
  id.tokens_per_chunk = o.identity.tokens_per_chunk;
  id.blocks_per_chunk = o.identity.blocks_per_chunk;
  id.block_bytes = o.identity.block_bytes;
  id.layout_tag = o.identity.layout_tag;
  return id;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CliPath().empty() || access(CliPath().c_str(), X_OK) != 0) {
      GTEST_SKIP() << "kvtier binary not found (KVTIER_CLI_PATH / $KVTIER_CLI)";
    }
    ASSERT_FALSE(dir_.path().empty());
    root_ = dir_.path() + "/root";
    ASSERT_EQ(mkdir(root_.c_str(), 0750), 0);
    ns_path_ = root_ + "/" + NamespaceDirName(NsIdentity());
  }

  // `kvtier bench io` on the test directory; again in buffered mode where the filesystem refuses O_DIRECT (tmpfs).
  // The suite run's engine defaults (KVTIER_TEST_REACTORS, KVTIER_TEST_READ_PIECE_BYTES: scripts/test.sh) go to the
  // CLI as its own options: it is a process of its own, and the engine reads no environment.
  CliRun BenchIo(const std::string& given) {
    std::string args = given;
    if (const char* n = getenv("KVTIER_TEST_REACTORS"); n && *n && given.find("--reactors") == std::string::npos) {
      args += std::string(" --reactors ") + n;
    }
    if (const char* n = getenv("KVTIER_TEST_READ_PIECE_BYTES");
        n && *n && given.find("--read-piece") == std::string::npos) {
      args += std::string(" --read-piece ") + n;
    }
    CliRun r = Kvtier("bench io --dir " + dir_.path() + " " + args);
    if (r.rc != 0 && r.out.find("O_DIRECT") != std::string::npos) {
      r = Kvtier("bench io --mode buffered --dir " + dir_.path() + " " + args);
    }
    return r;
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // bench io with a bad `arg` fails and names `option` in its message.
  // Nothing is created for a refused invocation.
  void ExpectBenchIoRefuses(const std::string& arg, const std::string& option) {
    CliRun r = Kvtier("bench io --dir " + dir_.path() + " " + arg);
    EXPECT_NE(r.rc, 0) << arg;
    EXPECT_NE(r.out.find(option), std::string::npos) << r.out;
    ExpectNoBenchLeftovers();
  }
  // A bench removed everything it created under the test directory.
  void ExpectNoBenchLeftovers() {
    for (auto& p : fs::directory_iterator(dir_.path())) {
      EXPECT_EQ(p.path().filename().string().find("kvtier-bench"), std::string::npos) << p.path();
    }
  }

  // Stores chunks first..first+n through the engine (a new one unless given), one job per chunk so modification
  // times follow key order.
  void StoreChunks(uint64_t first, uint64_t n, std::unique_ptr<Engine>* given = nullptr) {
    auto opened =
        given ? Result<std::unique_ptr<Engine>>(Status(StatusCode::kNotFound, "unused")) : Engine::Open(Options(root_));
    ASSERT_TRUE(given || opened.ok()) << opened.status().ToString();
    std::unique_ptr<Engine>* e = given ? given : &opened.value();
    auto client = JobClient::Create(e->get());  // the slot path (docs/architecture.md, "One data path")
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    std::vector<uint8_t> host(kBlocks * kBlockBytes);
    for (uint64_t i = first; i < first + n; ++i) {
      std::mt19937_64 rng(i);
      for (auto& b : host) b = static_cast<uint8_t>(rng());
      std::vector<CopySegment> segs;
      for (uint32_t b = 0; b < kBlocks; ++b) {
        segs.push_back(
            {b * (*e)->block_stride(), reinterpret_cast<uint64_t>(host.data() + b * kBlockBytes), kBlockBytes});
      }
      auto id = (*client)->SubmitStore({ChunkTransfer{Key(i), 0, 0, segs}});
      ASSERT_TRUE(id.ok());
      auto r = (*client)->Wait(*id, 30000);
      ASSERT_TRUE(r.ok() && r->all_ok());
    }
  }

  std::string EntryPath(uint64_t i) const { return ns_path_ + "/" + ChunkRelPath(Key(i)); }

  test::TempDir dir_;
  std::string root_;
  std::string ns_path_;
};

TEST_F(CliTest, UnknownFlagExitsTwoNamingTheFlagAndTheAcceptedOnes) {
  CliRun r = Kvtier("fsck --root " + root_ + " --bogus-flag");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--bogus-flag"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--repair"), std::string::npos) << r.out;  // the accepted flags are listed

  r = Kvtier("bench io --dir " + root_ + " --chunk-sizes 2MiB,banana");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--chunk-sizes"), std::string::npos) << r.out;

  r = Kvtier("gc --root " + root_);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--budget"), std::string::npos) << r.out;

  r = Kvtier("gc --root=" + root_ + " --budget=12parsecs");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--budget"), std::string::npos) << r.out;

  EXPECT_EQ(Kvtier("frobnicate").rc, 2);
  EXPECT_EQ(Kvtier("stats --help").rc, 0);
}

// `kvtier --help` is the one list of every command, the Python package's too, each with the docs that cover it.
TEST_F(CliTest, HelpListsEveryCommandWithItsDocs) {
  CliRun r = Kvtier("--help");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* cmd :
       {"bench io ", "bench meta ", "bench longdoc ", "stats ", "fsck ", "gc ", "calibrate ", "replay "}) {
    const size_t at = r.out.find(std::string("\n  ") + cmd);
    ASSERT_NE(at, std::string::npos) << cmd << " missing from:\n" << r.out;
    const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find("docs/"), std::string::npos) << "no docs named on: " << line;
  }
  // This binary alone does not run the Python package's commands: it says where they are.
  for (const char* cmd : {"calibrate --help", "replay", "bench longdoc --url x"}) {
    r = Kvtier(cmd);
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("command of the Python package"), std::string::npos) << r.out;
  }
}

// The benchmarks are a program of their own (bench/kvtier_bench.cc) that `kvtier bench io|meta` runs from beside
// this binary; a kvtier without it says so, with exit 1, instead of failing obscurely.
TEST_F(CliTest, BenchRunsTheBenchmarkProgramBesideItAndSaysSoWhenItIsMissing) {
  CliRun r = Kvtier("bench meta --help");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.rfind("usage: kvtier bench meta", 0), 0u) << r.out;
  const std::string alone = dir_.path() + "/alone/kvtier";
  fs::create_directories(fs::path(alone).parent_path());
  fs::copy_file(CliPath(), alone);
  fs::permissions(alone, fs::perms::owner_all);
  for (const char* which : {"io", "meta"}) {
    CliRun a = Kvtier(std::string("bench ") + which + " --help", alone);
    EXPECT_EQ(a.rc, 1) << a.out;
    EXPECT_NE(a.out.find("cannot run " + fs::path(alone).parent_path().string() + "/kvtier-bench"), std::string::npos)
        << a.out;
  }
}

TEST_F(CliTest, BadRootsAreOneLineErrorsWithExitOne) {
  CliRun r = Kvtier("stats --root " + root_ + "/missing");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out.rfind("kvtier: error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

  const std::string file = dir_.path() + "/plain-file";
  std::ofstream(file) << "x";
  r = Kvtier("fsck --root " + file);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("not a directory"), std::string::npos) << r.out;

  // A directory that is not a kvtier root at all.
  const std::string other = dir_.path() + "/other";
  fs::create_directories(other + "/something");
  r = Kvtier("gc --root " + other + " --budget 1GiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("holds no kvtier namespace"), std::string::npos) << r.out;

  // A namespace of another format version.
  StoreChunks(0, 1);
  std::string manifest;
  {
    std::ifstream in(ns_path_ + "/MANIFEST");
    manifest.assign(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove(ns_path_ + "/MANIFEST");
  std::ofstream(ns_path_ + "/MANIFEST") << "format_version=99\n" << manifest.substr(manifest.find('\n') + 1);
  r = Kvtier("stats --root " + root_);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("kvtier: error: namespace ns-"), std::string::npos) << r.out;
}

TEST_F(CliTest, FsckFindsCorruptEntriesAndStaleTemporariesAndRepairRemovesThem) {
  StoreChunks(0, 3);
  // Entry 1: one flipped byte in block 2. Entry 2: truncated by one block.
  {
    const std::string p = EntryPath(1);
    int fd = open(p.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    const off_t off = kHeaderBytes + 2 * BlockStride(kBlockBytes) + 5;
    ASSERT_EQ(pread(fd, &b, 1, off), 1);
    b ^= 1;
    ASSERT_EQ(pwrite(fd, &b, 1, off), 1);
    close(fd);
  }
  ASSERT_EQ(truncate(EntryPath(2).c_str(), ChunkFileBytes(kBlocks, kBlockBytes) - BlockStride(kBlockBytes)), 0);
  // A crashed writer's temporary, two hours old.
  const std::string tmp = ns_path_ + "/" + TempRelPath(Key(0));
  std::ofstream(tmp) << "partial";
  const struct timespec old[2] = {{time(nullptr) - 7200, 0}, {time(nullptr) - 7200, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, tmp.c_str(), old, 0), 0);

  CliRun r = Kvtier("fsck --root " + root_);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("fsck: 3 entries, 2 corrupt, 1 temporaries (0 removed), 0 foreign"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(ChunkRelPath(Key(1))), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(ChunkRelPath(Key(2))), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(EntryPath(1)));  // no --repair: nothing removed

  r = Kvtier("fsck --root " + root_ + " --repair");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 3 entries, 2 corrupt, 1 temporaries (1 removed), 0 foreign"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(EntryPath(1)));
  EXPECT_FALSE(fs::exists(EntryPath(2)));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(EntryPath(0)));

  r = Kvtier("fsck --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 1 entries, 0 corrupt, 0 temporaries (0 removed), 0 foreign"), std::string::npos) << r.out;
}

// K3: fsck given another secret than the one a namespace's MANIFEST records, or none, refuses that
// namespace instead of reporting (and with --repair removing) every good entry.
TEST_F(CliTest, FsckWithAnotherSecretOrNoneRefusesAKeyedNamespaceAndRemovesNothing) {
  EngineOptions o = Options(root_);
  o.checksum_secret = "0123456789abcdef-secret-A";
  {
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    StoreChunks(0, 5, &e.value());
  }
  for (const std::string& secret : {std::string(" --checksum-secret another-secret-of-16+bytes"), std::string()}) {
    CliRun r = Kvtier("fsck --repair --temp-max-age 0 --root " + root_ + secret);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(secret.empty() ? "its entries are keyed" : "keyed with another secret"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("nothing removed"), std::string::npos) << r.out;
    for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(fs::exists(EntryPath(i))) << secret;
  }
  CliRun r = Kvtier("fsck --root " + root_ + " --checksum-secret " + o.checksum_secret);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 5 entries, 0 corrupt"), std::string::npos) << r.out;
}

// a creator killed while publishing MANIFEST leaves only .tmp.MANIFEST.*: fsck --repair recovers MANIFEST
// from a whole temporary and then checks every entry; a torn temporary is swept by age, never linked.
TEST_F(CliTest, FsckRepairRecoversACutManifestPublicationFromAWholeTemporaryAndChecksEveryEntry) {
  StoreChunks(0, 6);
  const std::string manifest = Slurp(ns_path_ + "/MANIFEST");
  ASSERT_EQ(rename((ns_path_ + "/MANIFEST").c_str(), (ns_path_ + "/.tmp.MANIFEST.7.0.0123456789abcdef").c_str()), 0);
  std::ofstream(ns_path_ + "/.tmp.MANIFEST.8.0.0123456789abcdef") << manifest.substr(0, 20);  // torn
  CliRun r = Kvtier("fsck --root " + root_);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("is whole, and --repair (fsck) or gc recovers MANIFEST"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(ns_path_ + "/MANIFEST"));

  r = Kvtier("fsck --repair --temp-max-age 0 --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("recovered: " + NamespaceDirName(NsIdentity()) + "/MANIFEST from .tmp.MANIFEST.7."),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("fsck: 6 entries, 0 corrupt, 2 temporaries (2 removed)"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(ns_path_ + "/MANIFEST"), manifest);
  for (const auto& e : fs::directory_iterator(ns_path_)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp.MANIFEST.", 0), 0u) << e.path();
  }
}

// gc recovers the same way, counts the namespace's bytes, and sweeps a torn temporary by age only.
TEST_F(CliTest, GcRecoversACutManifestPublicationCountsItsBytesAndSweepsATornOneByAge) {
  StoreChunks(0, 4);
  const std::string manifest = Slurp(ns_path_ + "/MANIFEST");
  ASSERT_EQ(rename((ns_path_ + "/MANIFEST").c_str(), (ns_path_ + "/.tmp.MANIFEST.7.0.0123456789abcdef").c_str()), 0);
  // Another namespace directory whose creator died mid-write: a torn temporary and nothing else.
  const std::string torn_ns = root_ + "/ns-00000000000000ab";
  ASSERT_EQ(mkdir(torn_ns.c_str(), 0750), 0);
  std::ofstream(torn_ns + "/.tmp.MANIFEST.9.0.0123456789abcdef") << std::string(1 << 20, 'x');
  CliRun r = Kvtier("gc --budget 1GiB --temp-max-age 3600 --root " + root_);
  EXPECT_NE(r.out.find("recovered " + NamespaceDirName(NsIdentity()) + "/MANIFEST"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(ns_path_ + "/MANIFEST"), manifest);
  EXPECT_TRUE(fs::exists(torn_ns + "/.tmp.MANIFEST.9.0.0123456789abcdef")) << "a young temporary was removed";
  // 4 entries (144KiB), the recovered namespace's young temporary and the torn one's 1 MiB are all counted.
  EXPECT_NE(r.out.find("gc: 1.1MiB before"), std::string::npos) << r.out;
  EXPECT_EQ(r.rc, 1) << r.out;  // the torn namespace cannot be opened yet: reported
  r = Kvtier("gc --budget 1GiB --temp-max-age 0 --root " + root_);
  EXPECT_FALSE(fs::exists(torn_ns + "/.tmp.MANIFEST.9.0.0123456789abcdef")) << r.out;
  EXPECT_FALSE(fs::exists(ns_path_ + "/.tmp.MANIFEST.7.0.0123456789abcdef")) << r.out;
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(fs::exists(EntryPath(i)));
}

// "L/" and "L/." name the symlink L itself, which every command refuses, as the engine does.
TEST_F(CliTest, ARootGivenThroughASymlinkWithATrailingSlashOrDotIsRefused) {
  StoreChunks(0, 2);
  const std::string link = dir_.path() + "/L";
  ASSERT_EQ(symlink(root_.c_str(), link.c_str()), 0);
  for (const std::string& given : {link, link + "/", link + "/.", link + "/./"}) {
    for (const std::string cmd : {"stats", "fsck --repair", "gc --budget 1"}) {
      CliRun r = Kvtier(cmd + " --root " + given);
      EXPECT_EQ(r.rc, 1) << cmd << " " << given << ": " << r.out;
      EXPECT_NE(r.out.find("symbolic link"), std::string::npos) << cmd << " " << given << ": " << r.out;
    }
    EngineOptions o = Options(given);
    auto e = Engine::Open(o);
    EXPECT_FALSE(e.ok()) << given;
  }
  for (uint64_t i = 0; i < 2; ++i) EXPECT_TRUE(fs::exists(EntryPath(i)));
  EXPECT_EQ(Kvtier("stats --root " + root_ + "/.").rc, 0);  // the same, named without a symlink
}

// K2: the CLI refuses what the engine refuses, unless --allow-insecure-root.
TEST_F(CliTest, AWorldWritableRootWithoutTheStickyBitIsRefusedUnlessAllowed) {
  StoreChunks(0, 3);
  ASSERT_EQ(chmod(root_.c_str(), 0777), 0);
  for (const std::string cmd : {"stats", "fsck --repair", "gc --budget 1"}) {
    CliRun r = Kvtier(cmd + " --root " + root_);
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("world-writable"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--allow-insecure-root"), std::string::npos) << r.out;
  }
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(fs::exists(EntryPath(i)));
  EXPECT_EQ(Kvtier("fsck --allow-insecure-root --root " + root_).rc, 0);
  EXPECT_EQ(Kvtier("stats --allow-insecure-root --root " + root_).rc, 0);
  ASSERT_EQ(chmod(root_.c_str(), 01777), 0);  // sticky, like /tmp: accepted
  EXPECT_EQ(Kvtier("fsck --root " + root_).rc, 0);
}

// K2: the CLI checks a namespace's directories as the engine does (the namespace directory, usage/, both fan-out
// levels): one the engine would refuse is reported by stats, fsck and gc, exit 1, and nothing in it is recovered,
// removed or counted, unless --allow-insecure-root.
TEST_F(CliTest, ANamespaceDirectoryTheEngineRefusesIsRefusedByEveryCommandUnlessAllowed) {
  StoreChunks(0, 6);
  const std::string rel = ChunkRelPath(Key(0));
  const std::string first = ns_path_ + "/" + rel.substr(0, 2);
  const std::string second = ns_path_ + "/" + rel.substr(0, 5);
  ASSERT_EQ(mkdir((ns_path_ + "/usage").c_str(), 0750), 0);
  // A crashed writer's old temporary beside entry 0: a repair would remove it.
  const std::string tmp = ns_path_ + "/" + TempRelPath(Key(0));
  std::ofstream(tmp) << "partial";
  const struct timespec old[2] = {{time(nullptr) - 7200, 0}, {time(nullptr) - 7200, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, tmp.c_str(), old, 0), 0);
  for (const std::string& dir : {ns_path_, ns_path_ + "/usage", first, second}) {
    ASSERT_EQ(chmod(dir.c_str(), 0777), 0) << dir;
    if (dir != second) {  // the engine refuses these at open (a second-level one when a store meets it)
      auto e = Engine::Open(Options(root_));
      EXPECT_FALSE(e.ok()) << dir;
    }
    for (const std::string cmd : {"stats", "fsck --repair --temp-max-age 0", "gc --budget 1 --temp-max-age 0"}) {
      CliRun r = Kvtier(cmd + " --root " + root_);
      EXPECT_EQ(r.rc, 1) << cmd << " with " << dir << " world-writable: " << r.out;
      EXPECT_NE(r.out.find(dir + " is world-writable"), std::string::npos) << cmd << ": " << r.out;
      EXPECT_NE(r.out.find("--allow-insecure-root"), std::string::npos) << cmd << ": " << r.out;
    }
    for (uint64_t i = 0; i < 6; ++i) EXPECT_TRUE(fs::exists(EntryPath(i))) << dir;
    EXPECT_TRUE(fs::exists(tmp)) << dir;
    ASSERT_EQ(chmod(dir.c_str(), 0750), 0);
  }
  // Owned by a stranger (uid and gid not ours): refused too; possible only as root.
  if (geteuid() == 0 && chown(second.c_str(), 4242, 4242) == 0) {
    CliRun r = Kvtier("fsck --repair --temp-max-age 0 --root " + root_);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(second + " is owned by uid 4242"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(tmp));
    ASSERT_EQ(chown(second.c_str(), 0, 0), 0);
  }
  ASSERT_EQ(chmod(second.c_str(), 0777), 0);
  CliRun r = Kvtier("fsck --repair --temp-max-age 0 --allow-insecure-root --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 6 entries, 0 corrupt, 1 temporaries (1 removed)"), std::string::npos) << r.out;
  EXPECT_EQ(Kvtier("stats --allow-insecure-root --root " + root_).rc, 0);
  ASSERT_EQ(chmod(second.c_str(), 01777), 0);  // sticky, like /tmp: accepted
  EXPECT_EQ(Kvtier("fsck --root " + root_).rc, 0);
}

// K3 (docs/file-format.md, "A MANIFEST without checksum_key"): in a namespace whose MANIFEST does not record its
// key, fsck --repair with another secret, or none, cannot tell good entries from bad: it reports them as keyed for
// another secret and removes none (exit 1: not verified); with the right secret it checks them, and removes one
// whose blocks are damaged.
TEST_F(CliTest, FsckRepairWithAnotherSecretOnANamespaceWithoutAKeyRecordRemovesNothing) {
  EngineOptions o = Options(root_);
  o.checksum_secret = "0123456789abcdef-secret-A";
  {
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    StoreChunks(0, 5, &e.value());
  }
  const std::string manifest = Slurp(ns_path_ + "/MANIFEST");
  const size_t line = manifest.find("checksum_key=");
  ASSERT_NE(line, std::string::npos) << manifest;
  ASSERT_EQ(unlink((ns_path_ + "/MANIFEST").c_str()), 0);
  std::ofstream(ns_path_ + "/MANIFEST") << manifest.substr(0, line);  // as an older kvtier wrote it
  {
    const int fd = open(EntryPath(4).c_str(), O_RDWR);  // a damaged block in entry 4
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "x", 1, kHeaderBytes + 7), 1);
    close(fd);
  }
  for (const std::string& secret : {std::string(" --checksum-secret another-secret-of-16+bytes"), std::string()}) {
    CliRun r = Kvtier("fsck --repair --temp-max-age 0 --root " + root_ + secret);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find("other secret: 5 entries keyed for another checksum secret"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fsck: 5 entries, 0 corrupt"), std::string::npos) << r.out;
    for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(fs::exists(EntryPath(i))) << secret;
  }
  CliRun r = Kvtier("fsck --repair --root " + root_ + " --checksum-secret " + o.checksum_secret);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 5 entries, 1 corrupt"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(EntryPath(4)));
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(fs::exists(EntryPath(i)));
}

// stats prints a namespace's error once.
TEST_F(CliTest, StatsPrintsANamespacesErrorOnce) {
  StoreChunks(0, 1);
  ASSERT_EQ(unlink((ns_path_ + "/MANIFEST").c_str()), 0);
  CliRun r = Kvtier("stats --root " + root_);
  EXPECT_EQ(r.rc, 1) << r.out;
  size_t n = 0;
  for (size_t at = r.out.find("has no MANIFEST"); at != std::string::npos; at = r.out.find("has no MANIFEST", at + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 1u) << r.out;
}

TEST_F(CliTest, FsckReportsForeignFilesAndKeepsThem) {
  StoreChunks(0, 1);
  const std::string foreign = ns_path_ + "/notes.txt";
  std::ofstream(foreign) << "hello";
  CliRun r = Kvtier("fsck --repair --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fsck: 1 entries, 0 corrupt, 0 temporaries (0 removed), 1 foreign"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(foreign));
}

TEST_F(CliTest, GcBringsTheRootUnderBudgetOldestFirst) {
  StoreChunks(0, 10);
  // Make modification times strictly increasing with the key index.
  for (uint64_t i = 0; i < 10; ++i) {
    const struct timespec t[2] = {{1000000 + static_cast<time_t>(i) * 10, 0},
                                  {1000000 + static_cast<time_t>(i) * 10, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, EntryPath(i).c_str(), t, 0), 0);
  }
  const uint64_t file = ChunkFileBytes(kBlocks, kBlockBytes);
  // Budget of 8 files, low watermark 0.5: down to 4 files, the 6 oldest go.
  CliRun r = Kvtier("gc --root " + root_ + " --budget " + std::to_string(8 * file) + " --low-watermark 0.5");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("removed 6 entries"), std::string::npos) << r.out;
  for (uint64_t i = 0; i < 6; ++i) EXPECT_FALSE(fs::exists(EntryPath(i))) << i;
  for (uint64_t i = 6; i < 10; ++i) EXPECT_TRUE(fs::exists(EntryPath(i))) << i;

  // Under budget: nothing to do.
  r = Kvtier("gc --root " + root_ + " --budget " + std::to_string(8 * file));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("removed 0 entries"), std::string::npos) << r.out;

  // The engine's index, rebuilt from the tree, agrees.
  auto e = Engine::Open(Options(root_));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->Stats().disk_entries, 4u);
}

// M2: gc reconciles the usage records with the tree only when it read both at one moment: a torn or unreadable
// record (its bytes would count as 0, and the correction would add them a second time once it is readable again)
// means no correction, and gc says so.
TEST_F(CliTest, GcPublishesNoUsageCorrectionWhenARecordIsUnreadable) {
  StoreChunks(0, 4);
  const int64_t file = static_cast<int64_t>(ChunkFileBytes(kBlocks, kBlockBytes));
  auto ns = Namespace::Open(root_, NsIdentity());
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  ASSERT_TRUE(UsageLedger::PublishCorrection(*ns, 2 * file).ok());  // one record holds 2 of the 4 entries ...
  const std::string torn = ns_path_ + "/" + UsageLedger::kDirName + "/otherhost.4242.00112233445566ff";
  std::ofstream(torn) << std::string(64, 'x');  // ... the other one is torn
  const size_t before = UsageLedger::ReadAll(*ns).value().size();
  CliRun r = Kvtier("gc --root " + root_ + " --budget " + std::to_string(100 * file));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("not reconciled"), std::string::npos) << r.out;
  EXPECT_EQ(UsageLedger::ReadAll(*ns).value().size(), before) << "gc published a correction: " << r.out;
}

// C1: gc removes the fan-out directories its removals empty (and no other).
TEST_F(CliTest, GcRemovesTheFanoutDirectoriesItEmpties) {
  StoreChunks(0, 10);
  const uint64_t file = ChunkFileBytes(kBlocks, kBlockBytes);
  CliRun r = Kvtier("gc --root " + root_ + " --budget " + std::to_string(8 * file) + " --low-watermark 0.5");
  ASSERT_EQ(r.rc, 0) << r.out;
  size_t entries = 0;
  for (auto& p : fs::recursive_directory_iterator(ns_path_)) {
    entries += p.path().extension() == ".kvc";
    const std::string name = p.path().filename();
    if (p.is_directory() && name.size() == 2) {
      EXPECT_FALSE(fs::is_empty(p.path())) << p.path() << " left empty";
    }
  }
  EXPECT_EQ(entries, 4u);
  r = Kvtier("gc --root " + root_ + " --budget 1");  // everything goes, and every fan-out directory with it
  ASSERT_EQ(r.rc, 0) << r.out;
  for (auto& p : fs::directory_iterator(ns_path_)) {
    EXPECT_NE(p.path().filename().string().size(), 2u) << p.path() << " left behind";
  }
}

// C1: an open engine's disk_bytes_used and disk_entries follow entries that an external `kvtier gc` removed (the
// engine sees removals it did not make in the namespace's shared usage and rescans the tree: within a few seconds).
TEST_F(CliTest, AnOpenEnginesDiskUsageFollowsAnExternalGc) {
  auto e = Engine::Open(Options(root_));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  StoreChunks(0, 10, &e.value());
  const uint64_t file = ChunkFileBytes(kBlocks, kBlockBytes);
  ASSERT_EQ((*e)->Stats().disk_bytes_used, 10 * file);
  CliRun r = Kvtier("gc --root " + root_ + " --budget " + std::to_string(8 * file) + " --low-watermark 0.5");
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_NE(r.out.find("removed 6 entries"), std::string::npos) << r.out;
  StatsSnapshot s = (*e)->Stats();
  for (int i = 0; i < 300 && s.disk_bytes_used != 4 * file; ++i) {
    usleep(100 * 1000);
    s = (*e)->Stats();
  }
  EXPECT_EQ(s.disk_bytes_used, 4 * file) << "the index still counts entries gc removed 30 s ago";
  EXPECT_EQ(s.disk_entries, 4u);
  int hits = 0;
  // Indexed (Stored): Lookup answers kDram for the stores' write-through copies.
  for (uint64_t i = 0; i < 10; ++i) hits += (*e)->Stored(Key(i));
  EXPECT_EQ(hits, 4);
}

TEST_F(CliTest, StatsPrintsCountsPerNamespace) {
  StoreChunks(0, 5);
  std::ofstream(ns_path_ + "/" + TempRelPath(Key(0))) << "t";
  CliRun r = Kvtier("stats --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("cli-test-model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("entries      5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("temporaries  1"), std::string::npos) << r.out;
  r = Kvtier("stats --json --root " + root_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"entries\": 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"total_entries\": 5"), std::string::npos) << r.out;
}

TEST_F(CliTest, BenchIoRunsAndPrintsRatios) {
  const std::string json = dir_.path() + "/io.json";
  CliRun r = BenchIo("--total 64MiB --chunk-sizes 2MiB --depths 4 --json " + json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("ratio"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak RSS"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(json));
  ExpectNoBenchLeftovers();
}

TEST_F(CliTest, BenchIoWithoutACopierMeasuresTheDiskPathAndNamesIt) {
  const std::string json = dir_.path() + "/io-none.json";
  CliRun r = BenchIo("--total 32MiB --chunk-sizes 2MiB --depths 4 --repeat 1 --copier none --json " + json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("copier none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("disk path alone"), std::string::npos) << r.out;
  const std::string doc = Slurp(json);
  EXPECT_NE(doc.find("\"copier\": \"none\""), std::string::npos) << doc;
  ExpectBenchIoRefuses("--copier gpu", "--copier");
}

// The engine's side goes through StreamPump (vLLM's path: streams, consumer threads copying slots and acking),
// named in the footer and the JSON; the job API is no longer a path of its own, so --path is an unknown flag.
TEST_F(CliTest, BenchIoMeasuresTheStreamPathAndNamesIt) {
  const std::string json = dir_.path() + "/io-stream.json";
  CliRun r = BenchIo(
      "--total 16MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 1 --raw-split none "
      "--json " +
      json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("engine GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ratio to best"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" write "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" read "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the engine's transfers went through JobClient over StreamPump"), std::string::npos) << r.out;
  std::string doc = Slurp(json);
  EXPECT_NE(doc.find("\"path\": \"stream\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"median_engine_read_gbps\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"write_ratio\""), std::string::npos) << doc;
  ExpectNoBenchLeftovers();
  // Without a copier the lanes only ack.
  r = BenchIo("--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 1 --raw-split none --copier none");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("only acking"), std::string::npos) << r.out;
  CliRun bad = Kvtier("bench io --dir " + dir_.path() + " --path job");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("unknown flag --path"), std::string::npos) << bad.out;
  ExpectNoBenchLeftovers();
}

// --raw-verify: every raw variant once more hashing what it moves (the floor of a program doing the engine's per-byte
// work), reported as "raw+xxh3 best" with the engine's ratio to it, and kept out of "raw best" (the device's ceiling).
TEST_F(CliTest, BenchIoRawVerifyAddsHashingVariantsAndTheirBestApartFromRawBest) {
  const std::string json = dir_.path() + "/io-verify.json";
  CliRun r = BenchIo(
      "--total 16MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 1,2 --raw-split none "
      "--raw-verify --copier none --json " +
      json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("raw+xxh3 best"), std::string::npos) << r.out;
  for (const char* v : {"t1/whole+xxh3", "t2/whole+xxh3", "t2/whole"}) {
    EXPECT_NE(r.out.find(v), std::string::npos) << v << "\n" << r.out;
  }
  const std::string doc = Slurp(json);
  for (const char* key : {"\"raw_verify_best_read\"", "\"raw_verify_best_write\"", "\"read_ratio_to_verify_best\"",
                          "\"write_ratio_to_verify_best\"", "\"verify\": true"}) {
    EXPECT_NE(doc.find(key), std::string::npos) << key << "\n" << doc;
  }
  // raw best never names a hashing variant.
  const size_t best = doc.find("\"raw_best_read\"");
  ASSERT_NE(best, std::string::npos) << doc;
  EXPECT_EQ(doc.substr(best, doc.find('}', best) - best).find("xxh3"), std::string::npos) << doc;
  // Without the flag: no hashing variants.
  r = BenchIo("--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 1,2 --raw-split none --json " +
              json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("xxh3 best"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(json).find("\"verify\": true"), std::string::npos);
  ExpectNoBenchLeftovers();
}

// The paired per-repetition ratio, the raw side on the engine's own slots, and the raw reader on the engine's files.
TEST_F(CliTest, BenchIoPairsRepetitionsAndOffersThePoolAsRawMemoryAndCrossReads) {
  const std::string json = dir_.path() + "/io-pool.json";
  CliRun r = BenchIo(
      "--total 16MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-buffers pool --cross --verbose "
      "--json " +
      json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("raw reads the engine's files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("median over repetitions of engine/raw in the same repetition"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("raw buffers pool"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("XXH3-64 ("), std::string::npos) << r.out;  // the checksum build is named
  EXPECT_NE(r.out.find("host copier copy-out"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("odd --repeat"), std::string::npos) << r.out;  // 2 is even: no note
  const std::string doc = Slurp(json);
  EXPECT_NE(doc.find("\"raw_buffers\": \"pool\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"raw_reads_engine_files_gbps\": ["), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"read_ratio_of_medians\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"xxh3\": \""), std::string::npos) << doc;
  ExpectNoBenchLeftovers();
  // An odd count says that the order is not balanced.
  r = BenchIo("--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("odd --repeat"), std::string::npos) << r.out;
  ExpectBenchIoRefuses("--raw-buffers gpu", "--raw-buffers");
}

// --reread N reads the last repetition's files again with the three readers rotating, and reports them apart.
TEST_F(CliTest, BenchIoRereadsTheFilesAtRestWithTheReadersRotating) {
  const std::string json = dir_.path() + "/io-reread.json";
  CliRun r = BenchIo("--total 16MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --reread 3 --verbose --json " + json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("reads at rest (--reread 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engine/raw same files"), std::string::npos) << r.out;
  for (int a = 0; a < 3; ++a) {
    EXPECT_NE(r.out.find("qd 4 reread " + std::to_string(a) + ": raw on its files"), std::string::npos) << r.out;
  }
  const std::string doc = Slurp(json);
  EXPECT_NE(doc.find("\"at_rest\": {\"raw_own_files_gbps\": ["), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"engine_over_raw_same_files_ratio\": "), std::string::npos) << doc;
  ExpectNoBenchLeftovers();
  ExpectBenchIoRefuses("--reread 101", "--reread");
  ExpectBenchIoRefuses("--keep-cache --drop-caches", "--drop-caches");
}

// --touch adds a fourth reader to the rotation at rest (the raw reader on the engine's files that also reads every
// byte it loaded), then rotations of three writers at rest (raw, raw reading every byte before writing it, engine);
// each rotation starts with the next one; the repetitions are left as they are; tables and JSON report them apart.
TEST_F(CliTest, BenchIoTouchingReaderAndWritersJoinTheRotationsAtRest) {
  const std::string json = dir_.path() + "/io-touch.json";
  const std::string marks = dir_.path() + "/marks-touch.txt";
  CliRun r = BenchIo(
      "--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --reread 2 --touch --verbose "
      "--raw-threads 1 --raw-split none --json " +
      json + " --trace-marks " + marks);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("engine/(raw+touch)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qd 4 reread 1: raw on its files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("raw+touch on the engine's files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qd 4 rewrite 1: raw "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("writes at rest (--touch: 2 rotations"), std::string::npos) << r.out;
  std::vector<std::string> phases;  // begin lines, phase names only
  std::istringstream in(Slurp(marks));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("PHASE "), end = line.find(" begin ");
    if (at != std::string::npos && end != std::string::npos) phases.push_back(line.substr(at + 6, end - at - 6));
  }
  const std::vector<std::string> want = {
      "raw_write",        "eng_write",        "raw_read",        "eng_read",         // rep 0
      "eng_write",        "raw_write",        "eng_read",        "raw_read",         // rep 1
      "rest_raw_read",    "rest_cross_read",  "rest_eng_read",   "rest_touch_read",  // reads, rotation 0
      "rest_cross_read",  "rest_eng_read",    "rest_touch_read", "rest_raw_read",    // reads, rotation 1
      "rest_raw_write",   "rest_touch_write", "rest_eng_write",                      // writes, rotation 0
      "rest_touch_write", "rest_eng_write",   "rest_raw_write"};                     // writes, rotation 1
  EXPECT_EQ(phases, want) << Slurp(marks);
  const std::string doc = Slurp(json);
  EXPECT_NE(doc.find("\"writes_at_rest\": {\"raw_gbps\": ["), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"engine_over_raw_touch_ratio\": "), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"raw_touch_engine_files_gbps\": ["), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"engine_over_raw_touch_same_files_ratio\": "), std::string::npos) << doc;
  ExpectNoBenchLeftovers();
  ExpectBenchIoRefuses("--touch", "--touch: needs --reread");
  ExpectBenchIoRefuses("--touch --reread 1 --raw-buffers pool", "--touch: needs buffers of its own");
}

// --trace-marks PATH: a begin and an end line per timed phase, in order, with the configuration and repetition, so
// a kernel trace can be cut into phases; an unwritable PATH is refused before anything runs.
TEST_F(CliTest, BenchIoMarksEveryTimedPhase) {
  const std::string marks = dir_.path() + "/marks.txt";
  CliRun r = BenchIo(
      "--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --cross --reread 1 --raw-threads 1 "
      "--raw-split none --trace-marks " +
      marks);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<std::string> lines;
  std::istringstream in(Slurp(marks));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  auto mark = [](const std::string& phase, const std::string& edge, int rep) {
    return "kvtier-bench-io PHASE " + phase + " " + edge + " chunk 2097152 depth 4 rep " + std::to_string(rep);
  };
  // Repetition 0 runs the raw side first, repetition 1 the engine; --cross follows both reads; the one rotation of
  // --reread (numbered after the repetitions) runs raw on its files, raw on the engine's, then the engine.
  std::vector<std::string> want;
  const std::vector<std::vector<std::string>> order = {{"raw_write", "eng_write", "raw_read", "eng_read", "cross_read"},
                                                       {"eng_write", "raw_write", "eng_read", "raw_read", "cross_read",
                                                        "rest_raw_read", "rest_cross_read", "rest_eng_read"}};
  for (int rep = 0; rep < 2; ++rep) {
    for (const std::string& phase : order[rep]) {
      const int n = phase.rfind("rest_", 0) == 0 ? 2 : rep;
      want.push_back(mark(phase, "begin", n));
      want.push_back(mark(phase, "end", n));
    }
  }
  EXPECT_EQ(lines, want) << Slurp(marks);
  ExpectNoBenchLeftovers();
  ExpectBenchIoRefuses("--trace-marks " + dir_.path() + "/no/such/dir/marks", "--trace-marks " + dir_.path());
}

// The device's ceiling: beside the single-thread raw baseline, T threads (each its own ring) read and write the same
// files, whole or split into requests; the variants run after the pair in raw-first repetitions and before it in
// the others, the best of all is "raw best", and the engine's ratio to it is printed and written beside the
// ratio to the single-thread baseline. With one queue of `depth` files, thread counts above the depth are skipped.
TEST_F(CliTest, BenchIoMeasuresTheDevicesCeilingWithThreadsAndSplitRequests) {
  const std::string json = dir_.path() + "/io-ceiling.json";
  const std::string marks = dir_.path() + "/marks-ceiling.txt";
  CliRun r = BenchIo(
      "--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 1,2,8 "
      "--raw-split 1MiB,4MiB --reactors 2 --verbose --json " +
      json + " --trace-marks " + marks);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("ratio to best"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("raw baseline variants, GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qd 4 rep 1 raw t2/1MiB    read "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2MiB depth 4: t8/whole t8/1MiB\n"), std::string::npos) << r.out;
  std::vector<std::string> phases;
  std::istringstream in(Slurp(marks));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("PHASE "), end = line.find(" begin ");
    if (at != std::string::npos && end != std::string::npos) phases.push_back(line.substr(at + 6, end - at - 6));
  }
  // 4MiB is not below a 2MiB file: no such split. t1/whole is the single-thread baseline itself.
  const std::vector<std::string> w = {"par_t1_1MiB_write", "par_t2_whole_write", "par_t2_1MiB_write"};
  const std::vector<std::string> rd = {"par_t1_1MiB_read", "par_t2_whole_read", "par_t2_1MiB_read"};
  std::vector<std::string> want = {"raw_write", "eng_write"};
  want.insert(want.end(), w.begin(), w.end());
  want.insert(want.end(), {"raw_read", "eng_read"});
  want.insert(want.end(), rd.begin(), rd.end());
  want.insert(want.end(), w.begin(), w.end());
  want.insert(want.end(), {"eng_write", "raw_write"});
  want.insert(want.end(), rd.begin(), rd.end());
  want.insert(want.end(), {"eng_read", "raw_read"});
  EXPECT_EQ(phases, want) << Slurp(marks);
  const std::string doc = Slurp(json);
  for (const char* field :
       {"\"raw_threads\": [1, 2, 8]", "\"raw_split_bytes\": [1048576, 4194304]", "\"raw_queue\": \"total\"",
        "\"engine_reactors\": 2", "\"raw_best_write\": {\"variant\": \"t", "\"raw_best_read\": {\"variant\": \"t",
        "\"write_ratio_to_best\": ", "\"read_ratio_to_best\": ",
        "\"raw_variants\": [{\"variant\": \"t1/whole\", \"threads\": 1, \"request_bytes\": null, \"write_gbps\": [",
        "{\"variant\": \"t2/1MiB\", \"threads\": 2, \"request_bytes\": 1048576, \"write_gbps\": [",
        "\"raw_variants_skipped\": [\"t8/whole\", \"t8/1MiB\"]"}) {
    EXPECT_NE(doc.find(field), std::string::npos) << field << "\n" << doc;
  }
  ExpectNoBenchLeftovers();
  // One queue per thread: eight threads with four files each, nothing skipped.
  r = BenchIo(
      "--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2 --raw-threads 8 --raw-split none "
      "--raw-queue per-thread --json " +
      json);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("raw variants skipped"), std::string::npos) << r.out;
  EXPECT_NE(Slurp(json).find("{\"variant\": \"t8/whole\", \"threads\": 8, \"request_bytes\": null"), std::string::npos)
      << Slurp(json);
  EXPECT_NE(Slurp(json).find("\"raw_queue\": \"per-thread\""), std::string::npos) << Slurp(json);
  ExpectNoBenchLeftovers();
  ExpectBenchIoRefuses("--raw-threads 0", "--raw-threads");
  ExpectBenchIoRefuses("--raw-threads 2,x", "--raw-threads");
  ExpectBenchIoRefuses("--raw-threads 257", "--raw-threads: 257 is above 256");
  ExpectBenchIoRefuses("--raw-split 1000", "--raw-split: 1000B is not a multiple of 4KiB");
  ExpectBenchIoRefuses("--raw-split 2GiB", "--raw-split: 2GiB is above 1GiB");
  ExpectBenchIoRefuses("--raw-split 1MiB,banana", "--raw-split");
  ExpectBenchIoRefuses("--raw-queue both", "--raw-queue");
}

// A run killed with SIGKILL leaves its DIR/kvtier-bench-io.<pid>; the next run removes such a directory when no
// live run holds it locked and it has not changed for a minute, and leaves alone one that is held, one that is
// recent and anything not of that exact name.
TEST_F(CliTest, BenchIoRemovesWhatKilledRunsLeftAndNothingElse) {
  auto make = [&](const std::string& name, bool old) {
    const std::string p = dir_.path() + "/" + name;
    fs::create_directories(p + "/engine/ns-x");
    std::ofstream(p + "/engine/ns-x/chunk") << "bytes";
    if (old) {
      const timespec times[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
      EXPECT_EQ(utimensat(AT_FDCWD, p.c_str(), times, 0), 0);
    }
    return p;
  };
  const std::string dead = make("kvtier-bench-io.999999991", true);
  const std::string held = make("kvtier-bench-io.999999992", true);
  const std::string recent = make("kvtier-bench-io.999999993", false);
  const std::string other = make("kvtier-bench-io.99x", true);
  const int lock = open(held.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);  // as a live run holds its directory
  CliRun r = BenchIo("--total 8MiB --chunk-sizes 2MiB --depths 4 --repeat 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_FALSE(fs::exists(dead)) << r.out;
  EXPECT_NE(r.out.find("removed " + dead + ", left by a run that was killed"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(held + "/engine/ns-x/chunk"));
  EXPECT_TRUE(fs::exists(recent + "/engine/ns-x/chunk"));
  EXPECT_TRUE(fs::exists(other + "/engine/ns-x/chunk"));
  close(lock);
  for (const std::string& p : {held, recent, other}) fs::remove_all(p);
  ExpectNoBenchLeftovers();
}

TEST_F(CliTest, BenchMetaRuns) {
  CliRun r = Kvtier("bench meta --dir " + dir_.path() + " --entries 1000");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("publish/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1000"), std::string::npos) << r.out;
  ExpectNoBenchLeftovers();
}

}  // namespace
}  // namespace kvtier
