// Security (SPEC K2, K3): refused roots, group-shared modes, keyed checksums against a writer without the key.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

namespace fs = std::filesystem;

TEST(InsecureRoot, AWorldWritableRootWithoutStickyBitIsRefusedUnlessAllowed) {
  test::TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  EngineOptions o = Options(dir.path());
  auto e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("world-writable"), std::string::npos) << e.status().ToString();
  EXPECT_NE(e.status().message().find("allow_insecure_root"), std::string::npos);
  o.allow_insecure_root = true;
  EXPECT_TRUE(Engine::Open(o).ok());
  // With the sticky bit (like /tmp) others cannot remove or rename our files: accepted.
  ASSERT_EQ(chmod(dir.path().c_str(), 01777), 0);
  o.allow_insecure_root = false;
  EXPECT_TRUE(Engine::Open(o).ok());
}

TEST(InsecureRoot, ARootOwnedByAnotherUserIsRefusedUnlessAllowed) {
  test::TempDir dir;
  if (chown(dir.path().c_str(), 4242, 4242) != 0) GTEST_SKIP() << "cannot chown (not root)";
  EngineOptions o = Options(dir.path());
  auto e = test::OpenWithJobs(o);
  if (geteuid() == 4242) GTEST_SKIP();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("owned by uid 4242"), std::string::npos) << e.status().ToString();
  o.allow_insecure_root = true;
  EXPECT_TRUE(Engine::Open(o).ok()) << "root (uid 0) may still write there";
}

// K2: what the root check refuses is refused for the namespace's own directories too (the namespace directory,
// usage/ and the fan-out directories): a directory there that others can write lets them plant entries.
TEST(InsecureNamespace, AWorldWritableNamespaceDirectoryIsRefusedUnlessAllowed) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  ASSERT_TRUE(Engine::Open(o).ok());  // creates the namespace
  ASSERT_EQ(chmod(NsPath(o).c_str(), 0777), 0);
  auto e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok()) << "a world-writable namespace directory was accepted";
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("world-writable"), std::string::npos) << e.status().ToString();
  EXPECT_NE(e.status().message().find(NsPath(o)), std::string::npos) << e.status().ToString();
  EXPECT_NE(e.status().message().find("allow_insecure_root"), std::string::npos);
  o.allow_insecure_root = true;
  EXPECT_TRUE(Engine::Open(o).ok());
  ASSERT_EQ(chmod(NsPath(o).c_str(), 01777), 0);  // sticky: others cannot remove or rename our entries
  o.allow_insecure_root = false;
  EXPECT_TRUE(Engine::Open(o).ok());
}

TEST(InsecureNamespace, ANamespaceDirectoryOfAStrangerIsRefusedButAGroupMembersIsAccepted) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  ASSERT_TRUE(Engine::Open(o).ok());
  if (geteuid() == 4242 || getegid() == 4242) GTEST_SKIP() << "this test needs uid/gid 4242 to be strangers";
  if (chown(NsPath(o).c_str(), 4242, 4242) != 0) GTEST_SKIP() << "cannot chown (not root)";
  auto e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok()) << "a namespace directory of another user and group was accepted";
  EXPECT_NE(e.status().message().find("owned by uid 4242"), std::string::npos) << e.status().ToString();
  o.allow_insecure_root = true;
  EXPECT_TRUE(Engine::Open(o).ok());
  // Group-shared deployments (docs/operations.md): another service user of our group created it; that user can
  // write nothing there that the group cannot.
  ASSERT_EQ(chown(NsPath(o).c_str(), 4242, getegid()), 0);
  o.allow_insecure_root = false;
  auto g = Engine::Open(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
}

TEST(InsecureNamespace, AWorldWritableUsageOrFanoutDirectoryIsRefusedAtOpen) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  {
    auto e = test::OpenWithJobs(o);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(StoreOne(e.value(), 1).ok());
  }
  const std::string usage = NsPath(o) + "/usage";
  ASSERT_EQ(mkdir(usage.c_str(), 0750), 0);
  ASSERT_EQ(chmod(usage.c_str(), 0777), 0);
  auto e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok()) << "a world-writable usage/ was accepted";
  EXPECT_NE(e.status().message().find(usage), std::string::npos) << e.status().ToString();
  ASSERT_EQ(chmod(usage.c_str(), 0750), 0);
  ASSERT_TRUE(Engine::Open(o).ok());

  const std::string first = NsPath(o) + "/" + FanoutDir(Key(1)).substr(0, 2);
  ASSERT_EQ(chmod(first.c_str(), 0777), 0);
  e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok()) << "a world-writable fan-out directory was accepted";
  EXPECT_NE(e.status().message().find(first), std::string::npos) << e.status().ToString();
  o.allow_insecure_root = true;
  EXPECT_TRUE(Engine::Open(o).ok());
}

// A second-level fan-out directory is checked when a store first meets it (the engine does not list 65536
// directories at open); the store is dropped and nothing is written there.
TEST(InsecureNamespace, AStoreIntoAWorldWritableFanoutDirectoryIsDropped) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  {
    auto e = test::OpenWithJobs(o);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(StoreOne(e.value(), 1).ok());
  }
  const std::string fan = NsPath(o) + "/" + FanoutDir(Key(1));
  ASSERT_TRUE(fs::remove(ChunkFile(o, Key(1))));
  ASSERT_EQ(chmod(fan.c_str(), 0777), 0);
  {
    auto e = test::OpenWithJobs(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const Status s = StoreOne(e.value(), 1);
    EXPECT_FALSE(s.ok());  // a job's store outcome says dropped, not why (docs/architecture.md, "One data path")
    EXPECT_EQ(e.value()->Stats().stores_dropped, 1u);
    EXPECT_TRUE(fs::is_empty(fan)) << "a store wrote into a world-writable directory";
  }
  o.allow_insecure_root = true;
  auto e = test::OpenWithJobs(o);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(StoreOne(e.value(), 1).ok());
}

class GroupShared : public ::testing::TestWithParam<bool> {};

TEST_P(GroupShared, DirectoriesAndFilesGetTheConfiguredModeWhateverTheUmask) {
  test::TempDir dir;
  const mode_t old_umask = umask(077);
  EngineOptions o = Options(dir.path());
  o.dir_mode = 0770;
  o.anonymous_temporaries = GetParam();
  {
    auto e = test::OpenWithJobs(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_TRUE(StoreOne(e.value(), 1).ok());
  }
  umask(old_umask);
  auto mode = [](const std::string& p) {
    struct stat st;
    EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  const std::string ns = NsPath(o);
  EXPECT_EQ(mode(ns), 0770u);
  const std::string fan = FanoutDir(Key(1));
  EXPECT_EQ(mode(ns + "/" + fan.substr(0, 2)), 0770u);
  EXPECT_EQ(mode(ns + "/" + fan), 0770u);
  EXPECT_EQ(mode(ChunkFile(o, Key(1))), 0660u);
  EXPECT_EQ(mode(ns + "/MANIFEST"), 0660u);
}

INSTANTIATE_TEST_SUITE_P(Temporaries, GroupShared, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Anonymous" : "Named"; });

// A MANIFEST as kvtier wrote it before recording the checksum key (no checksum_key line): every engine opens it.
void DropKeyRecord(const EngineOptions& o) {
  const std::string path = NsPath(o) + "/MANIFEST";
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t line = text.find("checksum_key=");
  ASSERT_NE(line, std::string::npos) << text;
  ASSERT_EQ(unlink(path.c_str()), 0);
  std::ofstream(path) << text.substr(0, line);
}

uint64_t CountEntries(const std::string& root) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) n += e.path().extension() == ".kvc";
  return n;
}

// The root's writer, a process of its own: opens an engine with `o`, stores entries [0, n) and holds the engine
// open until Release() (so other processes meet a live writer on a shared root).
class HeldWriter {
 public:
  HeldWriter(const EngineOptions& o, uint64_t n) {
    if (pipe(ready_) != 0 || pipe(done_) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      auto w = test::OpenWithJobs(o);
      bool ok = w.ok();
      for (uint64_t i = 0; ok && i < n; ++i) ok = StoreOne(w.value(), i).ok();
      char c = ok ? 'y' : 'n';
      (void)!write(ready_[1], &c, 1);
      (void)!read(done_[0], &c, 1);
      _exit(ok ? 0 : 1);
    }
    char c = 0;
    stored_ = pid_ > 0 && read(ready_[0], &c, 1) == 1 && c == 'y';
  }
  ~HeldWriter() { Release(); }
  bool stored() const { return stored_; }
  // Lets the writer close its engine and exit; true when it exited 0. Once.
  bool Release() {
    if (pid_ <= 0) return false;
    char c = 'x';
    (void)!write(done_[1], &c, 1);
    int status = 0;
    const bool ok = waitpid(pid_, &status, 0) == pid_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    pid_ = -1;
    for (int fd : {ready_[0], ready_[1], done_[0], done_[1]}) close(fd);
    return ok;
  }

 private:
  int ready_[2] = {-1, -1};
  int done_[2] = {-1, -1};
  pid_t pid_ = -1;
  bool stored_ = false;
};

// An engine with `o` loads entries 0..n-1 byte for byte, none corrupt, none missed for another secret.
void ExpectEveryEntryLoads(const EngineOptions& o, uint64_t n) {
  auto e = test::OpenWithJobs(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> got;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(LoadOne(e.value(), Key(i), &got).ok()) << i;
    EXPECT_EQ(got, ContentFor(i));
  }
  EXPECT_EQ(e.value()->Stats().corrupt_entries, 0u);
  EXPECT_EQ(e.value()->Stats().other_secret_misses, 0u);
}

// K3: a root written with a secret records it in the MANIFEST (a keyed fingerprint), so an engine given
// another secret, or none, is refused at open with a message that says so, and removes nothing. Before, such an
// engine took every entry for corrupt and removed each one it loaded: on a shared root one misconfigured instance
// emptied the cache of every host.
TEST(KeyedChecksums, AnotherProcessWithAnotherSecretOrNoneIsRefusedAtOpenAndRemovesNoEntry) {
  test::TempDir dir;
  EngineOptions with_a = Options(dir.path());
  with_a.checksum_secret = "0123456789abcdef-secret-A";
  constexpr uint64_t kEntries = 40;
  HeldWriter writer(with_a, kEntries);
  ASSERT_TRUE(writer.stored()) << "the writer could not store its entries";
  ASSERT_EQ(CountEntries(dir.path()), kEntries);

  EngineOptions with_b = with_a;
  with_b.checksum_secret = "another-secret-of-16+bytes";
  auto b = Engine::Open(with_b);
  ASSERT_FALSE(b.ok()) << "an engine with another secret opened the namespace";
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("another checksum secret"), std::string::npos) << b.status().ToString();
  EXPECT_NE(b.status().message().find("nothing was removed"), std::string::npos) << b.status().ToString();
  EngineOptions plain = with_a;
  plain.checksum_secret.clear();
  auto p = test::OpenWithJobs(plain);
  ASSERT_FALSE(p.ok()) << "an engine without the secret opened a keyed namespace";
  EXPECT_NE(p.status().message().find("no checksum secret"), std::string::npos) << p.status().ToString();
  EXPECT_EQ(CountEntries(dir.path()), kEntries) << "entries were removed";

  EXPECT_TRUE(writer.Release()) << "the writer failed";

  // The right secret still loads every entry byte for byte.
  ExpectEveryEntryLoads(with_a, kEntries);
}

// And the other way round: a root written without a secret refuses an engine that has one.
TEST(KeyedChecksums, AnEngineWithASecretIsRefusedByANamespaceWrittenWithoutOne) {
  test::TempDir dir;
  EngineOptions plain = Options(dir.path());
  {
    auto w = test::OpenWithJobs(plain);
    ASSERT_TRUE(w.ok());
    for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(StoreOne(w.value(), i).ok());
  }
  EngineOptions keyed = plain;
  keyed.checksum_secret = "0123456789abcdef-secret-A";
  auto e = test::OpenWithJobs(keyed);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("without a checksum secret"), std::string::npos) << e.status().ToString();
  EXPECT_EQ(CountEntries(dir.path()), 4u);
}

// K3 (docs/file-format.md, "A MANIFEST without checksum_key"): a namespace whose MANIFEST predates the key record
// opens under any key, so there an engine cannot tell a wrong secret from the right one: an entry keyed for another
// secret (or none) is a miss it counts and leaves in place, never a corrupt entry to remove. Two processes share
// the root: the writer holds it open with 40 entries while engines with another secret and with none load every
// one of them; 0 are removed, and the writer's secret then loads all 40 byte for byte.
TEST(KeyedChecksums, WithoutAKeyRecordAnotherSecretOrNoneMissesEveryEntryAndRemovesNone) {
  test::TempDir dir;
  EngineOptions with_a = Options(dir.path());
  with_a.checksum_secret = "0123456789abcdef-secret-A";
  constexpr uint64_t kEntries = 40;
  HeldWriter writer(with_a, kEntries);
  ASSERT_TRUE(writer.stored()) << "the writer could not store its entries";
  DropKeyRecord(with_a);  // as an older kvtier wrote it
  ASSERT_EQ(CountEntries(dir.path()), kEntries);

  EngineOptions with_b = with_a;
  with_b.checksum_secret = "another-secret-of-16+bytes";
  EngineOptions plain = with_a;
  plain.checksum_secret.clear();
  for (const EngineOptions* o : {&with_b, &plain}) {
    auto e = test::OpenWithJobs(*o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    std::vector<uint8_t> got;
    for (uint64_t i = 0; i < kEntries; ++i) {
      Status s = LoadOne(e.value(), Key(i), &got);
      EXPECT_FALSE(s.ok()) << i;
      EXPECT_TRUE(AllSentinel(got)) << i;
    }
    EXPECT_EQ(e.value()->Stats().other_secret_misses, kEntries);  // why each was a miss
    EXPECT_EQ(e.value()->Stats().corrupt_entries, 0u);
    EXPECT_EQ(CountEntries(dir.path()), kEntries) << "entries were removed (secret '" << o->checksum_secret << "')";
  }

  EXPECT_TRUE(writer.Release()) << "the writer failed";

  ExpectEveryEntryLoads(with_a, kEntries);
  std::printf("legacy root, another secret and none: %llu of %llu entries missed and kept each, 0 removed\n",
              (unsigned long long)kEntries, (unsigned long long)kEntries);
}

// A namespace whose MANIFEST predates the key record opens under any key; there the entries' checksum kind and MAC
// still decide: an entry keyed otherwise is a miss that never returns wrong bytes and is kept, while one whose
// header verifies but whose blocks do not is corrupt and removed.
TEST(KeyedChecksums, WithoutAKeyRecordEntriesWrittenWithoutTheKeyOrWithAnotherAreMissesAndWithItLoadByteForByte) {
  test::TempDir dir;
  const std::string key_a = "0123456789abcdef-secret-A";
  EngineOptions plain = Options(dir.path());
  EngineOptions with_a = plain;
  with_a.checksum_secret = key_a;
  EngineOptions with_b = plain;
  with_b.checksum_secret = "another-secret-of-16+bytes";
  // Key file form: a file others cannot read.
  const std::string key_file = dir.path() + "/k3.key";
  { std::ofstream(key_file) << key_a << "\n"; }
  ASSERT_EQ(chmod(key_file.c_str(), 0600), 0);
  EngineOptions with_a_file = plain;
  with_a_file.checksum_secret = "file:" + key_file;

  {
    auto w = test::OpenWithJobs(with_a);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_NE(w.value()->Describe().find("keyed checksums"), std::string::npos);
    for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(StoreOne(w.value(), i).ok());
  }
  DropKeyRecord(with_a);
  {
    auto p = test::OpenWithJobs(plain);
    ASSERT_TRUE(p.ok());
    for (uint64_t i = 100; i < 104; ++i) ASSERT_TRUE(StoreOne(p.value(), i).ok());  // unkeyed entries
  }
  std::vector<uint8_t> got;
  {
    auto r = test::OpenWithJobs(with_a_file);  // the same key, from the file
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(LoadOne(r.value(), Key(0), &got).ok());
    EXPECT_EQ(got, ContentFor(0));
    // An unkeyed entry (a writer without the secret) is not trusted: a counted miss, and kept.
    Status s = LoadOne(r.value(), Key(100), &got);
    // A job's miss says only kNotFound; the engine's stats say why (docs/architecture.md, "One data path").
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_TRUE(AllSentinel(got));
    EXPECT_EQ(r.value()->Stats().other_secret_misses, 1u);
    EXPECT_EQ(r.value()->Stats().corrupt_entries, 0u);
    EXPECT_TRUE(fs::exists(ChunkFile(plain, Key(100))));
  }
  {
    auto r = test::OpenWithJobs(with_b);  // another secret
    ASSERT_TRUE(r.ok());
    Status s = LoadOne(r.value(), Key(1), &got);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_EQ(r.value()->Stats().other_secret_misses, 1u);
    EXPECT_TRUE(AllSentinel(got));
    EXPECT_TRUE(fs::exists(ChunkFile(with_a, Key(1))));
  }
  {
    auto r = test::OpenWithJobs(plain);  // no secret: keyed entries are not verifiable, so not trusted either
    ASSERT_TRUE(r.ok());
    Status s = LoadOne(r.value(), Key(2), &got);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_EQ(r.value()->Stats().other_secret_misses, 1u);
    EXPECT_TRUE(AllSentinel(got));
    EXPECT_TRUE(fs::exists(ChunkFile(with_a, Key(2))));
    // And the unkeyed entry loads for it.
    ASSERT_TRUE(LoadOne(r.value(), Key(100), &got).ok());
    EXPECT_EQ(got, ContentFor(100));
    EXPECT_EQ(r.value()->Stats().corrupt_entries, 0u);
  }
  {
    // A forger without the key who copies a valid keyed header onto other payload bytes is caught by the blocks.
    const std::string victim = ChunkFile(with_a, Key(3));
    const int fd = open(victim.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> other = ContentFor(77);
    ASSERT_EQ(pwrite(fd, other.data(), kBlockBytes, 4096), static_cast<ssize_t>(kBlockBytes));
    close(fd);
    auto r = test::OpenWithJobs(with_a);
    ASSERT_TRUE(r.ok());
    Status s = LoadOne(r.value(), Key(3), &got);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_TRUE(AllSentinel(got));
    EXPECT_EQ(r.value()->Stats().corrupt_entries, 1u);
    EXPECT_FALSE(fs::exists(victim)) << "a keyed entry with damaged blocks was kept";
  }
}

TEST(KeyedChecksums, BadSecretsAreRefusedAtOpenNamingTheOption) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.checksum_secret = "short";
  auto e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("checksum_secret"), std::string::npos);
  const std::string key_file = dir.path() + "/open.key";
  { std::ofstream(key_file) << "0123456789abcdef0123"; }
  ASSERT_EQ(chmod(key_file.c_str(), 0644), 0);
  o.checksum_secret = "file:" + key_file;
  e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("readable by others"), std::string::npos) << e.status().ToString();
  o.checksum_secret = "file:" + dir.path() + "/missing.key";
  e = test::OpenWithJobs(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("checksum_secret"), std::string::npos) << e.status().ToString();
}

TEST(NoSymlinkFollowed, StoresRefuseASymlinkedFanoutDirectoryAndWriteNothingOutsideTheRoot) {
  test::TempDir dir, outside;
  EngineOptions o = Options(dir.path());
  auto e = test::OpenWithJobs(o);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(StoreOne(e.value(), 5).ok());  // creates the namespace
  const std::string fan = NsPath(o) + "/" + FanoutDir(Key(6));
  fs::create_directories(fs::path(fan).parent_path());
  if (fs::exists(fan)) fs::remove_all(fan);
  ASSERT_EQ(symlink(outside.path().c_str(), fan.c_str()), 0);
  // A fresh engine (no cached fan-out directories) must not write through the symlink.
  e.value().reset();
  auto e2 = test::OpenWithJobs(o);
  ASSERT_TRUE(e2.ok());
  EXPECT_FALSE(StoreOne(e2.value(), 6).ok());
  EXPECT_TRUE(fs::is_empty(outside.path())) << "a file was written outside the root";
  EXPECT_EQ(e2.value()->Stats().stores_dropped, 1u);
}

}  // namespace
}  // namespace kvtier::rel
