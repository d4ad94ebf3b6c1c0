// Edges of the engine's limits: closes are never cancelled by a deadline (I4: a cancelled close would leak its fd),
// a tree rescan indexes only files of exactly a chunk's size (M1), never more reactors than io_depth (I1, S1), and
// a budget at the top of its range (C1).
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 8192;

ChunkKey Key(uint64_t i) {
  uint8_t b[32] = {};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(i >> (8 * k));
  b[11] = 0x3c;
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

EngineOptions Options(const std::string& root) {
  EngineOptions o;
  o.root = root;
  o.identity.model = "limits";
  o.identity.revision = "r1";
  o.identity.kv_dtype = "bfloat16";
  o.identity.tokens_per_chunk = 64;
  o.identity.blocks_per_chunk = kBlocks;
  o.identity.block_bytes = kBlockBytes;
  o.pool_bytes = 16 * (kHeaderBytes + kBlocks * kBlockBytes);
  o.io_depth = 4;
  return o;
}

JobResult StoreKeys(Engine& e, uint64_t first, uint64_t n) {
  std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(kBlocks * kBlockBytes, 0x6b));
  std::vector<ChunkTransfer> t;
  for (uint64_t i = 0; i < n; ++i) {
    t.push_back(ChunkTransfer{Key(first + i), 0, 0,
                              {{0, reinterpret_cast<uint64_t>(data[i].data()), kBlocks * kBlockBytes}}});
  }
  auto id = e.SubmitStore(std::move(t));
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  auto r = e.Wait(id.value(), 30000);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : JobResult{};
}

size_t OpenFds() {
  size_t n = 0;
  for (auto& p : std::filesystem::directory_iterator("/proc/self/fd")) n += p.exists() ? 1 : 0;
  return n;
}

// A close slower than any deadline (a FUSE or NFS flush) is not cancelled: the close of a named temporary before its
// link completes, the store publishes, and no fd is left open. (Cancelled, the close never ran: the fd leaked and
// the store failed with a timeout.)
TEST(Limits, ACloseIsNeverCancelledByItsDeadline) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.anonymous_temporaries = false;  // named temporaries: closed before their link (M1)
  o.op_timeout_ms = 200;
  const size_t fds_before = OpenFds();
  {
    auto inner = io::CreateEngine(io::EngineConfig{io::EngineKind::kAuto, 64, 4});
    ASSERT_TRUE(inner.ok());
    auto fault = std::make_unique<io::FaultInjectingEngine>(std::move(inner.value()));
    fault->AddRule(io::FaultRule::DelayPastDeadline(io::OpCode::kClose));
    auto e = EngineImpl::Create(o, nullptr, std::move(fault));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    JobResult r = StoreKeys(**e, 0, 3);
    EXPECT_TRUE(r.all_ok()) << (r.chunks.empty() ? "" : r.chunks[0].status.ToString());
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ((*e)->Lookup(Key(i)), ChunkLocation::kDisk) << i;
  }
  EXPECT_EQ(OpenFds(), fds_before) << "an fd was left open";
}

// M1: an engine opening on a tree indexes only files of exactly a chunk's size (another host's entry whose data is
// not visible here yet is shorter); the others are not counted as entries or bytes.
TEST(Limits, ARescanIndexesOnlyFilesOfAChunksSize) {
  test::TempDir dir;
  {
    auto e = Engine::Open(Options(dir.path()));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_TRUE(StoreKeys(**e, 0, 3).all_ok());
  }
  std::string file;
  for (auto& p : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (p.path().filename().string().find(Key(1).Hex()) != std::string::npos) file = p.path();
  }
  ASSERT_FALSE(file.empty());
  ASSERT_EQ(truncate(file.c_str(), kHeaderBytes), 0);
  auto e = Engine::Open(Options(dir.path()));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->Stats().disk_entries, 2u);
  EXPECT_EQ((*e)->Stats().disk_bytes_used, 2 * ChunkFileBytes(kBlocks, kBlockBytes));
}

// I1/S1: each reactor keeps at least one chunk at the disk, so there are never more reactors than io_depth: auto
// (at least 2) and an explicit count alike.
TEST(Limits, NeverMoreReactorsThanIoDepth) {
  EngineOptions o = Options("/unused");
  o.io_depth = 1;
  o.reactors = 0;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 1u);
  o.reactors = 8;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 1u);
  o.io_depth = 4;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 4u);
  o.reactors = 3;
  EXPECT_EQ(EngineImpl::ResolveReactors(o), 3u);
}

// C1: a budget at the top of its range with a high watermark of 1 stores and evicts nothing (the watermarks in bytes
// saturate instead of overflowing; UBSan in the asan build checks the conversion).
TEST(Limits, ABudgetAtTheTopOfItsRangeHoldsEverything) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.disk_budget_bytes = UINT64_MAX;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(StoreKeys(**e, 0, 4).all_ok());
  EXPECT_EQ((*e)->Stats().evictions, 0u);
  EXPECT_EQ((*e)->Stats().disk_entries, 4u);
}

}  // namespace
}  // namespace kvtier
