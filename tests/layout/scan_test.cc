#include "layout/scan.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "layout/chunk_path.h"
#include "layout/temp_dir.h"

namespace kvtier {
namespace {

using testing::TempDir;
using testing::TestIdentity;

void WriteAt(int dirfd, const std::string& rel, size_t bytes) {
  int fd = openat(dirfd, rel.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0640);
  ASSERT_GE(fd, 0) << rel;
  std::string data(bytes, 'x');
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(bytes));
  close(fd);
}

void SetAge(int dirfd, const std::string& rel, int seconds_ago) {
  struct timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(utimensat(dirfd, rel.c_str(), times, AT_SYMLINK_NOFOLLOW), 0);
}

class ScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ns = Namespace::Open(dir_.path(), TestIdentity());
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_.emplace(std::move(ns).value());
  }
  int fd() const { return ns_->dirfd(); }
  ChunkKey Key(std::string_view hex) { return ChunkKey::FromHex(hex).value(); }
  void AddChunk(std::string_view hex, size_t bytes) {
    ASSERT_TRUE(EnsureFanoutDir(fd(), Key(hex), 0750).ok());
    WriteAt(fd(), ChunkRelPath(Key(hex)), bytes);
  }
  std::map<std::string, EntryInfo> Scan() {
    std::map<std::string, EntryInfo> out;
    Status s = ScanEntries(*ns_, [&](const EntryInfo& e) { out[e.rel_path] = e; });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  TempDir dir_;
  std::optional<Namespace> ns_;
};

TEST_F(ScanTest, ScanFindsChunksTemporariesAndForeignFiles) {
  AddChunk("aabbccdd", 100);
  AddChunk("aabb0011", 200);
  AddChunk("01", 300);
  std::string tmp = TempRelPath(Key("aabbccdd"));
  WriteAt(fd(), tmp, 50);
  WriteAt(fd(), ".tmp.MANIFEST.1.2.abc", 10);
  // Foreign things: a stray file, a misplaced chunk, a symlink, an unexpected directory, a non-hex fan-out.
  WriteAt(fd(), "aa/bb/notes.txt", 5);
  WriteAt(fd(), "aa/bb/ffff.kvc", 7);  // belongs in ff/ff
  ASSERT_EQ(symlinkat("/etc/passwd", fd(), "aa/bb/1234.kvc"), 0);
  ASSERT_EQ(mkdirat(fd(), "zz", 0750), 0);
  WriteAt(fd(), "zz/aabb.kvc", 1);  // never descended into
  ASSERT_EQ(symlinkat("/tmp", fd(), "cc"), 0);
  WriteAt(fd(), "stray", 3);

  auto entries = Scan();
  ASSERT_EQ(entries.count("aa/bb/aabbccdd.kvc"), 1u);
  const EntryInfo& chunk = entries["aa/bb/aabbccdd.kvc"];
  EXPECT_EQ(chunk.key, Key("aabbccdd"));
  EXPECT_EQ(chunk.size_bytes, 100u);
  EXPECT_GT(chunk.mtime_ns, 0);
  EXPECT_FALSE(chunk.is_temporary || chunk.is_foreign);
  EXPECT_EQ(entries["aa/bb/aabb0011.kvc"].size_bytes, 200u);
  EXPECT_EQ(entries["01/00/01.kvc"].key, Key("01"));
  EXPECT_TRUE(entries[tmp].is_temporary);
  EXPECT_EQ(entries[tmp].size_bytes, 50u);
  EXPECT_TRUE(entries[".tmp.MANIFEST.1.2.abc"].is_temporary);
  for (const char* foreign : {"aa/bb/notes.txt", "aa/bb/ffff.kvc", "aa/bb/1234.kvc", "zz", "cc", "stray"}) {
    ASSERT_EQ(entries.count(foreign), 1u) << foreign;
    EXPECT_TRUE(entries[foreign].is_foreign) << foreign;
    EXPECT_TRUE(entries[foreign].key.empty()) << foreign;
  }
  EXPECT_EQ(entries.count("MANIFEST"), 0u);
  EXPECT_EQ(entries.count("zz/aabb.kvc"), 0u);
  EXPECT_EQ(entries.size(), 5u + 6u);
}

TEST_F(ScanTest, VisitorMayRemoveTheEntryItIsGiven) {
  for (int i = 0; i < 300; ++i) {
    char hex[9];
    snprintf(hex, sizeof(hex), "%08x", i * 2654435761u);
    AddChunk(hex, 1);
  }
  int seen = 0;
  Status s = ScanEntries(*ns_, [&](const EntryInfo& e) {
    ++seen;
    EXPECT_EQ(unlinkat(fd(), e.rel_path.c_str(), 0), 0);
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(seen, 300);
  EXPECT_TRUE(Scan().empty());
}

TEST_F(ScanTest, SweepRemovesOnlyOldTemporaries) {
  AddChunk("abcd", 10);
  SetAge(fd(), ChunkRelPath(Key("abcd")), 7200);  // old chunks are not temporaries
  std::string old_tmp = TempRelPath(Key("abcd"));
  std::string young_tmp = TempRelPath(Key("abcd"));
  WriteAt(fd(), old_tmp, 123);
  WriteAt(fd(), young_tmp, 45);
  SetAge(fd(), old_tmp, 7200);
  WriteAt(fd(), "ab/cd/old-foreign", 1);
  SetAge(fd(), "ab/cd/old-foreign", 7200);

  auto report = SweepTemporaries(*ns_, std::chrono::hours(1));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->temporaries_seen, 2u);
  EXPECT_EQ(report->removed, 1u);
  EXPECT_EQ(report->removed_bytes, 123u);
  EXPECT_EQ(report->kept_young, 1u);
  EXPECT_EQ(report->remove_failed, 0u);
  auto entries = Scan();
  EXPECT_EQ(entries.count(old_tmp), 0u);
  EXPECT_EQ(entries.count(young_tmp), 1u);
  EXPECT_EQ(entries.count(ChunkRelPath(Key("abcd"))), 1u);
  EXPECT_EQ(entries.count("ab/cd/old-foreign"), 1u);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Manual scale check (run with --gtest_also_run_disabled_tests): 100k entries.
TEST_F(ScanTest, DISABLED_ScanOfOneHundredThousandEntries) {
  FanoutDirCache cache;
  std::string rel;
  for (uint32_t i = 0; i < 100000; ++i) {
    uint8_t bytes[36] = {};
    uint64_t h = i * 0x9e3779b97f4a7c15ull;
    std::memcpy(bytes, &h, 8);
    ChunkKey key = ChunkKey::FromBytes(bytes).value();
    ASSERT_TRUE(EnsureFanoutDir(fd(), key, 0750, &cache).ok());
    AppendChunkRelPath(key, &rel);
    int f = openat(fd(), rel.c_str(), O_WRONLY | O_CREAT, 0640);
    ASSERT_GE(f, 0);
    close(f);
  }
  auto start = std::chrono::steady_clock::now();
  uint64_t chunks = 0;
  ASSERT_TRUE(ScanEntries(*ns_, [&](const EntryInfo& e) { chunks += !e.key.empty(); }).ok());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(chunks, 100000u);
  std::printf("scanned 100000 entries in %lld ms\n", static_cast<long long>(ms));
}

}  // namespace
}  // namespace kvtier
