#include "layout/chunk_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <set>

#include "layout/temp_dir.h"

namespace kvtier {
namespace {

// [0-9a-f./] only, apart from the fixed ".kvc" suffix and ".tmp." prefix, which are constants, never key text.
bool OnlySafeCharacters(std::string path) {
  if (path.size() > 4 && path.substr(path.size() - 4) == ".kvc") path.resize(path.size() - 4);
  if (size_t t = path.find("/.tmp."); t != std::string::npos) path.erase(t + 1, 5);
  for (char c : path) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '.' || c == '/')) return false;
  }
  return path.find("..") == std::string::npos && path[0] != '/';
}

TEST(ChunkPath, PathsContainOnlyHexDotsAndSlashesAndNoDotDot) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    size_t n = 1 + rng() % 64;
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    ChunkKey key = ChunkKey::FromBytes(bytes).value();
    std::string rel = ChunkRelPath(key);
    ASSERT_TRUE(OnlySafeCharacters(rel)) << rel;
    ASSERT_TRUE(OnlySafeCharacters(FanoutDir(key)));
    EXPECT_EQ(rel, FanoutDir(key) + "/" + key.Hex() + ".kvc");
    std::string tmp = TempRelPath(key);
    EXPECT_EQ(tmp.substr(0, 6), FanoutDir(key) + "/");
    EXPECT_TRUE(IsTempFileName(tmp.substr(6)));
    ASSERT_TRUE(OnlySafeCharacters(tmp)) << tmp;
    ChunkKey parsed;
    ASSERT_TRUE(ParseChunkFileName(rel.substr(6), &parsed));
    EXPECT_EQ(parsed, key);
  }
}

TEST(ChunkPath, FanoutUsesTheFirstTwoKeyBytesAndPadsShortKeys) {
  EXPECT_EQ(FanoutDir(ChunkKey::FromHex("abcdef").value()), "ab/cd");
  EXPECT_EQ(FanoutDir(ChunkKey::FromHex("7f").value()), "7f/00");
  EXPECT_EQ(ChunkRelPath(ChunkKey::FromHex("7f").value()), "7f/00/7f.kvc");
}

TEST(ChunkPath, TempPathsAreUniquePerCall) {
  ChunkKey key = ChunkKey::FromHex("0102").value();
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(seen.insert(TempRelPath(key)).second);
}

TEST(ChunkPath, ParseChunkFileNameRejectsTraps) {
  ChunkKey key;
  for (std::string_view bad : std::initializer_list<std::string_view>{"",
                                                                      ".kvc",
                                                                      "a.kvc",
                                                                      "abc.kvc",
                                                                      "AB.kvc",
                                                                      "ab.KVC",
                                                                      "ab.kvc.tmp",
                                                                      "ab",
                                                                      "../ab.kvc",
                                                                      "ab/cd.kvc",
                                                                      "..",
                                                                      ".",
                                                                      ".tmp.1.2.abcd",
                                                                      " ab.kvc",
                                                                      "ab .kvc",
                                                                      "ab.kvc ",
                                                                      "zz.kvc",
                                                                      "-1.kvc",
                                                                      "ab.kvcx",
                                                                      std::string_view("ab\0.kvc", 7)}) {
    EXPECT_FALSE(ParseChunkFileName(bad, &key)) << bad;
  }
  EXPECT_FALSE(ParseChunkFileName(std::string(130, 'a') + ".kvc", &key));
  EXPECT_TRUE(ParseChunkFileName(std::string(128, 'a') + ".kvc", &key));
  EXPECT_TRUE(ParseChunkFileName("00.kvc", &key));
  EXPECT_EQ(key.Hex(), "00");
}

TEST(ChunkPath, EnsureFanoutDirCreatesBothLevelsWithTheGivenModeAndCaches) {
  testing::TempDir dir;
  int fd = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ChunkKey key = ChunkKey::FromHex("abcdef").value();
  FanoutDirCache cache;
  ASSERT_TRUE(EnsureFanoutDir(fd, key, 0770, &cache).ok());
  struct stat st;
  ASSERT_EQ(fstatat(fd, "ab/cd", &st, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0770u);  // exact, whatever the umask
  EXPECT_TRUE(cache.Has(key));
  // Existing directories are fine without a cache; a cache hit costs nothing even after removal.
  EXPECT_TRUE(EnsureFanoutDir(fd, key, 0770).ok());
  ASSERT_EQ(unlinkat(fd, "ab/cd", AT_REMOVEDIR), 0);
  EXPECT_TRUE(EnsureFanoutDir(fd, key, 0770, &cache).ok());
  EXPECT_NE(fstatat(fd, "ab/cd", &st, AT_SYMLINK_NOFOLLOW), 0);
  cache.Forget(key);
  EXPECT_TRUE(EnsureFanoutDir(fd, key, 0770, &cache).ok());
  EXPECT_EQ(fstatat(fd, "ab/cd", &st, AT_SYMLINK_NOFOLLOW), 0);
  // RemoveChunk removes the final name; a missing entry is fine.
  int f = openat(fd, ChunkRelPath(key).c_str(), O_WRONLY | O_CREAT, 0640);
  ASSERT_GE(f, 0);
  close(f);
  EXPECT_TRUE(RemoveChunk(fd, key).ok());
  EXPECT_NE(fstatat(fd, ChunkRelPath(key).c_str(), &st, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_TRUE(RemoveChunk(fd, key).ok());
  close(fd);
}

TEST(ChunkPath, EnsureFanoutDirRefusesSymlinkedFanoutDirectories) {
  testing::TempDir dir;
  testing::TempDir elsewhere;
  int fd = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(symlinkat(elsewhere.path().c_str(), fd, "ab"), 0);
  Status s = EnsureFanoutDir(fd, ChunkKey::FromHex("abcd").value(), 0750);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  close(fd);
}

}  // namespace
}  // namespace kvtier
