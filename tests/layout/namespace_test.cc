#include "layout/namespace.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "layout/temp_dir.h"

namespace kvtier {
namespace {

using testing::TempDir;
using testing::TestIdentity;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Contains(const Status& s, std::string_view what) { return s.message().find(what) != std::string::npos; }

TEST(Manifest, CanonicalTextParsesBackToTheSameIdentity) {
  NamespaceIdentity id = TestIdentity();
  id.model =
      "weird%name\nwith\ttabs=and\x7f"
      "end";
  std::string text = CanonicalManifest(id);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 10);
  EXPECT_EQ(text.substr(0, 17), "format_version=1\n");
  auto parsed = ParseManifest(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed.value() == id);
  EXPECT_EQ(CanonicalManifest(parsed.value()), text);
}

TEST(Manifest, FingerprintIsStableHexAndNamesTheDirectory) {
  NamespaceIdentity id = TestIdentity();
  std::string fp = Fingerprint(id);
  EXPECT_EQ(fp.size(), 32u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(NamespaceDirName(id), "ns-" + fp.substr(0, 16));
  EXPECT_TRUE(IsNamespaceDirName(NamespaceDirName(id)));
  NamespaceIdentity other = id;
  other.tp_size = 4;
  EXPECT_NE(Fingerprint(other), fp);
}

TEST(Manifest, ParseIsStrict) {
  const std::string good = CanonicalManifest(TestIdentity());
  auto expect_corrupt = [](const std::string& text, std::string_view field) {
    auto r = ParseManifest(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_TRUE(Contains(r.status(), field)) << r.status().message();
  };
  expect_corrupt(good + "color=blue\n", "color");   // unknown
  expect_corrupt(good + "tp_size=2\n", "tp_size");  // duplicate
  std::string missing = good;
  missing.erase(missing.find("pp_size="), std::string("pp_size=1\n").size());
  expect_corrupt(missing, "pp_size");  // missing
  auto replace = [&](std::string from, std::string to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  expect_corrupt(replace("block_bytes=917504", "block_bytes=9x"), "block_bytes");
  expect_corrupt(replace("block_bytes=917504", "block_bytes=-1"), "block_bytes");
  expect_corrupt(replace("block_bytes=917504", "block_bytes="), "block_bytes");
  expect_corrupt(replace("tp_size=2", "tp_size=02"), "tp_size");
  expect_corrupt(replace("tp_size=2", "tp_size=4294967296"), "tp_size");
  expect_corrupt(replace("kv_dtype=bfloat16", "kv_dtype=bf%zz"), "kv_dtype");
  expect_corrupt(replace("kv_dtype=bfloat16", "kv_dtype=bf%2"), "kv_dtype");
  expect_corrupt(replace("kv_dtype=bfloat16", "kv_dtype=bf\r16"), "kv_dtype");
  expect_corrupt(replace("tp_size=2\n", "tp_size 2\n"), "tp_size 2");
  expect_corrupt(good.substr(0, good.size() - 1), "newline");
}

// K3: the MANIFEST's last line names the checksum key of its entries; the fingerprint hashes the identity
// lines only, so the namespace directory does not depend on the key.
TEST(Manifest, TheChecksumKeyRecordIsAnOptionalLastLineOutsideTheFingerprint) {
  const NamespaceIdentity id = TestIdentity();
  auto key = DeriveChecksumKey("0123456789abcdef-secret-A");
  ASSERT_TRUE(key.ok());
  const std::string record = ChecksumKeyRecord(&key.value());
  EXPECT_EQ(record.size(), 35u);
  EXPECT_EQ(record.substr(0, 3), "k3:");
  EXPECT_EQ(ChecksumKeyRecord(nullptr), "none");
  for (const std::string& r : {record, std::string("none"), std::string()}) {
    const std::string text = ManifestText(id, r);
    std::string parsed_record = "unset";
    auto parsed = ParseManifest(text, &parsed_record);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_TRUE(parsed.value() == id);
    EXPECT_EQ(parsed_record, r);
  }
  EXPECT_EQ(ManifestText(id, record), CanonicalManifest(id) + "checksum_key=" + record + "\n");
  const std::string good = CanonicalManifest(id);
  for (const char* bad :
       {"k3:", "k3:0123", "K3:0123456789abcdef0123456789abcdef", "k3:0123456789ABCDEF0123456789abcdef", "yes", ""}) {
    auto r = ParseManifest(good + "checksum_key=" + bad + "\n");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(Contains(r.status(), "checksum_key")) << r.status().message();
  }
  EXPECT_FALSE(ParseManifest(ManifestText(id, "none") + "checksum_key=none\n").ok());  // duplicate
}

TEST(Manifest, ANamespaceRecordsItsOpenersKeyAndRefusesAnotherWithoutWritingAnything) {
  TempDir dir;
  const NamespaceIdentity id = TestIdentity();
  auto a = DeriveChecksumKey("0123456789abcdef-secret-A");
  auto b = DeriveChecksumKey("0123456789abcdef-secret-B");
  ASSERT_TRUE(a.ok() && b.ok());
  NamespaceOpenOptions with_a;
  with_a.checksum_key = ChecksumKeyRecord(&a.value());
  auto ns = Namespace::Open(dir.path(), id, with_a);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_EQ(ns->checksum_key_record(), with_a.checksum_key);
  const std::string manifest = ReadFile(ns->path() + "/MANIFEST");
  EXPECT_EQ(manifest, ManifestText(id, with_a.checksum_key));
  NamespaceOpenOptions with_b;
  with_b.checksum_key = ChecksumKeyRecord(&b.value());
  auto other = Namespace::Open(dir.path(), id, with_b);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(other.status(), "another checksum secret")) << other.status().message();
  auto none = Namespace::Open(dir.path(), id);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status(), "no checksum secret")) << none.status().message();
  EXPECT_EQ(ReadFile(ns->path() + "/MANIFEST"), manifest);
  auto existing = Namespace::OpenExisting(dir.path(), NamespaceDirName(id));
  ASSERT_TRUE(existing.ok()) << existing.status().ToString();
  EXPECT_EQ(existing->checksum_key_record(), with_a.checksum_key);
}

class NamespaceTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(NamespaceTest, OpenCreatesDirectoryAndManifestAndReopenSucceeds) {
  NamespaceIdentity id = TestIdentity();
  NamespaceOpenOptions options;
  options.dir_mode = 0770;
  {
    auto ns = Namespace::Open(dir_.path(), id, options);
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    EXPECT_GE(ns->dirfd(), 0);
    EXPECT_EQ(ns->path(), dir_.path() + "/" + NamespaceDirName(id));
    EXPECT_TRUE(ns->identity() == id);
    EXPECT_EQ(ns->fingerprint(), FingerprintBytes(id));
    EXPECT_EQ(ns->file_mode(), 0660u);
    EXPECT_EQ(ReadFile(ns->path() + "/MANIFEST"), ManifestText(id, "none"));
    struct stat st;
    ASSERT_EQ(stat(ns->path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0770u);
    ASSERT_EQ(stat((ns->path() + "/MANIFEST").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0660u);
  }
  auto again = Namespace::Open(dir_.path(), id, options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto existing = Namespace::OpenExisting(dir_.path(), NamespaceDirName(id));
  ASSERT_TRUE(existing.ok()) << existing.status().ToString();
  EXPECT_TRUE(existing->identity() == id);
  EXPECT_EQ(existing->fingerprint(), again->fingerprint());
  auto list = ListNamespaces(dir_.path());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list.value(), std::vector<std::string>{NamespaceDirName(id)});
  // Moving keeps the fd valid and leaves the source empty.
  Namespace moved = std::move(again).value();
  EXPECT_GE(moved.dirfd(), 0);
}

TEST_F(NamespaceTest, DifferentManifestIsRefusedNamingTheField) {
  NamespaceIdentity id = TestIdentity();
  ASSERT_TRUE(Namespace::Open(dir_.path(), id).ok());
  // Tamper: same directory, another identity in its MANIFEST.
  NamespaceIdentity other = id;
  other.kv_dtype = "fp8_e4m3";
  std::string manifest = dir_.path() + "/" + NamespaceDirName(id) + "/MANIFEST";
  ASSERT_EQ(unlink(manifest.c_str()), 0);
  { std::ofstream(manifest) << CanonicalManifest(other); }
  auto ns = Namespace::Open(dir_.path(), id);
  ASSERT_FALSE(ns.ok());
  EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(ns.status(), "kv_dtype")) << ns.status().message();
  // The tools see the mismatch between the MANIFEST and the directory name.
  auto existing = Namespace::OpenExisting(dir_.path(), NamespaceDirName(id));
  EXPECT_EQ(existing.status().code(), StatusCode::kCorrupt);
  // A garbled MANIFEST is corrupt.
  { std::ofstream(manifest) << "nonsense\n"; }
  EXPECT_EQ(Namespace::Open(dir_.path(), id).status().code(), StatusCode::kCorrupt);
}

TEST_F(NamespaceTest, DifferentIdentitiesGetDifferentDirectories) {
  NamespaceIdentity a = TestIdentity();
  NamespaceIdentity b = a;
  b.revision = "other";
  auto na = Namespace::Open(dir_.path(), a);
  auto nb = Namespace::Open(dir_.path(), b);
  ASSERT_TRUE(na.ok() && nb.ok());
  EXPECT_NE(na->path(), nb->path());
  EXPECT_EQ(ListNamespaces(dir_.path())->size(), 2u);
}

TEST_F(NamespaceTest, InvalidIdentityIsRejected) {
  NamespaceIdentity id = TestIdentity();
  id.blocks_per_chunk = 0;
  auto ns = Namespace::Open(dir_.path(), id);
  EXPECT_EQ(ns.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(ns.status(), "blocks_per_chunk"));
}

TEST_F(NamespaceTest, MissingRootIsNotFoundWithAClearMessage) {
  std::string root = dir_.path() + "/nope";
  auto ns = Namespace::Open(root, TestIdentity());
  EXPECT_EQ(ns.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ns.status().message(), "storage root " + root + " does not exist");
}

TEST_F(NamespaceTest, RootThatIsAFileIsRefused) {
  std::string root = dir_.path() + "/file";
  { std::ofstream(root) << "x"; }
  auto ns = Namespace::Open(root, TestIdentity());
  EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(ns.status(), "not a directory"));
}

TEST_F(NamespaceTest, RootThatIsASymlinkIsRefused) {
  std::string root = dir_.path() + "/link";
  ASSERT_EQ(symlink(dir_.path().c_str(), root.c_str()), 0);
  auto ns = Namespace::Open(root, TestIdentity());
  EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(ns.status(), "symbolic link"));
}

TEST_F(NamespaceTest, ReadOnlyRootIsRefusedForCreation) {
  // As root the check runs as an unprivileged user, who needs a traversable parent: /tmp may be 0700.
  TempDir parent(geteuid() == 0 && access("/var/tmp", F_OK) == 0 ? "/var/tmp" : "/tmp");
  std::string root = parent.path() + "/ro";
  ASSERT_EQ(mkdir(root.c_str(), 0555), 0);
  ASSERT_EQ(chmod(root.c_str(), 0555), 0);
  if (geteuid() != 0) {
    auto ns = Namespace::Open(root, TestIdentity());
    EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(ns.status(), "not writable")) << ns.status().message();
    return;
  }
  // root ignores directory permissions: check as an unprivileged user in a child process.
  ASSERT_EQ(chmod(parent.path().c_str(), 0755), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    auto ns = Namespace::Open(root, TestIdentity());
    // A parent of the temp dir closed to others is the machine's doing, not a failure; only if that is really so.
    if (Contains(ns.status(), "not accessible")) _exit(access(parent.path().c_str(), X_OK) != 0 ? 3 : 1);
    bool good = ns.status().code() == StatusCode::kFailedPrecondition && Contains(ns.status(), "not writable");
    _exit(good ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "cannot drop privileges here";
  if (WEXITSTATUS(status) == 3) {
    GTEST_SKIP() << parent.path() << " (or a directory above it) is not traversable by an unprivileged user here";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(NamespaceTest, SymlinkedNamespaceDirectoryIsRefused) {
  TempDir elsewhere;
  NamespaceIdentity id = TestIdentity();
  ASSERT_EQ(symlink(elsewhere.path().c_str(), (dir_.path() + "/" + NamespaceDirName(id)).c_str()), 0);
  auto ns = Namespace::Open(dir_.path(), id);
  EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition) << ns.status().ToString();
}

TEST_F(NamespaceTest, OpenWithoutCreateDoesNotCreate) {
  NamespaceOpenOptions options;
  options.create = false;
  EXPECT_EQ(Namespace::Open(dir_.path(), TestIdentity(), options).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(ListNamespaces(dir_.path())->empty());
  EXPECT_EQ(Namespace::OpenExisting(dir_.path(), "ns-0123456789abcdef").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Namespace::OpenExisting(dir_.path(), "../etc").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(NamespaceTest, ConcurrentProcessesOpeningANewNamespaceAllSucceedWithOneManifest) {
  constexpr int kProcesses = 8;
  NamespaceIdentity id = TestIdentity();
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(gate[1]);
      char c;
      (void)!read(gate[0], &c, 1);  // returns 0 when the parent closes the write end: all start together
      auto ns = Namespace::Open(dir_.path(), id);
      _exit(ns.ok() ? 0 : 1);
    }
    children.push_back(pid);
  }
  close(gate[0]);
  close(gate[1]);
  int failures = 0;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  EXPECT_EQ(failures, 0);
  std::string ns_path = dir_.path() + "/" + NamespaceDirName(id);
  EXPECT_EQ(ReadFile(ns_path + "/MANIFEST"), ManifestText(id, "none"));
  // No temporaries are left behind.
  auto ns = Namespace::OpenExisting(dir_.path(), NamespaceDirName(id));
  ASSERT_TRUE(ns.ok());
  int entries = 0;
  DIR* d = opendir(ns_path.c_str());
  while (struct dirent* e = readdir(d)) entries += e->d_name[0] != '.' || e->d_name[1] == 't';
  closedir(d);
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace kvtier
