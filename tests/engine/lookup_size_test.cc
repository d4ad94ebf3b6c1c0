// M1: a lookup is a hit only for a regular file of exactly a chunk's size. Another host's entry whose data is not
// visible here yet is shorter (often 0 bytes, on FUSE filesystems a header page or so); a longer one is foreign.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "support/engine_options.h"
#include "support/job_engine.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 8192;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 9, 0x77); }

EngineOptions Options(const std::string& root) {
  EngineOptions o = test::BaseOptions(root, "lookup-size", 64, kBlocks, kBlockBytes);
  o.pool_bytes = 8 * (4096 + kBlocks * kBlockBytes);
  o.io_depth = 2;
  o.negative_cache_ms = 1;
  return o;
}

std::string OnlyChunkFile(const std::string& root) {
  std::string file;
  for (auto& p : std::filesystem::recursive_directory_iterator(root)) {
    if (p.path().extension() == ".kvc") file = p.path();
  }
  return file;
}

TEST(LookupSize, OnlyAFileOfExactlyAChunksSizeIsAHit) {
  test::TempDir dir;
  // b opens first: its index knows nothing, so its lookups ask the filesystem (another instance's entries).
  auto b = Engine::Open(Options(dir.path()));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto a = test::OpenWithJobs(Options(dir.path()));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<uint8_t> bytes(kBlocks * kBlockBytes, 0x5c);
  const CopySegment whole{0, reinterpret_cast<uint64_t>(bytes.data()), bytes.size()};
  auto r = a->Run(a->jobs->SubmitStore({ChunkTransfer{Key(1), 0, 0, {whole}}}));
  ASSERT_TRUE(r.ok() && r->all_ok());
  const std::string file = OnlyChunkFile(dir.path());
  ASSERT_FALSE(file.empty());
  const off_t full = static_cast<off_t>(kHeaderBytes + kBlocks * kBlockBytes);
  ASSERT_EQ(std::filesystem::file_size(file), static_cast<uintmax_t>(full));

  for (off_t size : {off_t(0), off_t(kHeaderBytes), off_t(kHeaderBytes + kBlockBytes), full - 1, full + 4096}) {
    ASSERT_EQ(truncate(file.c_str(), size), 0) << strerror(errno);
    usleep(3000);  // past b's negative cache
    EXPECT_EQ((*b)->Lookup(Key(1)), ChunkLocation::kAbsent) << "a file of " << size << " bytes";
    usleep(3000);
    EXPECT_EQ((*b)->Promote(Key(1), false).state, PromoteState::kMiss) << "a file of " << size << " bytes";
  }
  ASSERT_EQ(truncate(file.c_str(), full), 0);
  usleep(3000);
  EXPECT_EQ((*b)->Lookup(Key(1)), ChunkLocation::kDisk);
}

}  // namespace
}  // namespace kvtier
