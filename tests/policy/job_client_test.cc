// JobClient (docs/architecture.md, "One data path"): the job API over the slot path, on a real engine and real
// files. Jobs larger than the pool stream through it byte for byte; a partial load copies only its blocks; missing,
// corrupt and failing chunks are misses that touch no destination; stores already covered write nothing; a store
// whose write fails is reported dropped, one evicted right after its publish written; invalid requests are refused
// before anything is queued; jobs at once share the pool.
#include "policy/job_client.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "support/engine_options.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 8192 + 100;  // not a multiple of 4096: the slot's padded stride
constexpr uint64_t kSlotBytes = 4096 + kBlocks * 12288;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 36, 8, 0x6b); }

EngineOptions Options(const std::string& root, uint32_t slots) {
  EngineOptions o = test::BaseOptions(root, "job-client-test", 64, kBlocks, kBlockBytes);
  o.pool_bytes = slots * kSlotBytes;
  o.io_depth = 2;
  o.demand_reserve_slots = 1;
  o.op_timeout_ms = 60000;
  return o;
}

// Host memory standing in for a model's KV blocks: one buffer per chunk, blocks back to back.
struct HostChunk {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE);
  void Fill(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  }
  bool Untouched() const {
    return std::all_of(bytes.begin(), bytes.end(), [](uint8_t v) { return v == 0xEE; });
  }
  // Segments for blocks [first, first + n), relative to the first block transferred.
  std::vector<CopySegment> Segments(uint64_t stride, uint32_t first = 0, uint32_t n = kBlocks) {
    std::vector<CopySegment> s;
    for (uint32_t b = 0; b < n; ++b) {
      s.push_back(
          CopySegment{b * stride, reinterpret_cast<uint64_t>(bytes.data() + (first + b) * kBlockBytes), kBlockBytes});
    }
    return s;
  }
};

class JobClientTest : public ::testing::Test {
 protected:
  void Open(uint32_t slots, std::unique_ptr<IoEngine> io = nullptr, JobClientOptions co = {}) {
    client_.reset();
    engine_.reset();
    EngineOptions o = Options(dir_.path(), slots);
    if (disk_budget_ > 0) {
      o.disk_budget_bytes = disk_budget_;
      o.high_watermark = 1.0;
      o.low_watermark = 0.5;
    }
    auto e = io ? EngineImpl::Create(o, std::move(io)) : Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e.value());
    auto c = JobClient::Create(engine_.get(), nullptr, co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c.value());
  }
  void TearDown() override {
    client_.reset();
    engine_.reset();
  }
  JobResult Run(Result<JobId> id) {
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return {};
    auto r = client_->Wait(id.value(), 60000);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r.value() : JobResult{};
  }
  JobResult Store(std::vector<HostChunk>& data, uint64_t first_key = 0) {
    std::vector<ChunkTransfer> t;
    for (size_t i = 0; i < data.size(); ++i) {
      t.push_back(ChunkTransfer{Key(first_key + i), 0, 0, data[i].Segments(engine_->block_stride())});
    }
    return Run(client_->SubmitStore(std::move(t)));
  }
  std::vector<ChunkTransfer> WholeLoads(std::vector<HostChunk>& dst, uint64_t first_key = 0) {
    std::vector<ChunkTransfer> t;
    for (size_t i = 0; i < dst.size(); ++i) {
      t.push_back(ChunkTransfer{Key(first_key + i), 0, 0, dst[i].Segments(engine_->block_stride())});
    }
    return t;
  }
  // Empties the DRAM tier (the stores' write-through copies), so that loads read the disk.
  void Restart(uint32_t slots) { Open(slots); }
  uint64_t FileBytes() const { return kHeaderBytes + kBlocks * engine_->block_stride(); }

  test::TempDir dir_;
  uint64_t disk_budget_ = 0;  // Open's disk budget (0: the default), watermarks 1.0 and 0.5
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<JobClient> client_;
};

TEST_F(JobClientTest, JobsTenTimesThePoolStreamThroughItByteForByte) {
  ASSERT_NO_FATAL_FAILURE(Open(4));
  const size_t n = 40;
  std::vector<HostChunk> src(n);
  for (size_t i = 0; i < n; ++i) src[i].Fill(100 + i);
  JobResult stored = Store(src);
  ASSERT_TRUE(stored.all_ok()) << stored.chunks[0].status.ToString();
  EXPECT_EQ(stored.bytes, n * engine_->chunk_payload_bytes());
  EXPECT_EQ(engine_->Stats().bytes_written, n * FileBytes());
  EXPECT_LE(engine_->Stats().pool_peak_slots, 4u);

  ASSERT_NO_FATAL_FAILURE(Restart(4));
  std::vector<HostChunk> dst(n);
  JobResult loaded = Run(client_->SubmitLoad(WholeLoads(dst)));
  ASSERT_TRUE(loaded.all_ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(src[i].bytes, dst[i].bytes) << i;
  // Every chunk read once (S1), through a pool of 4 slots.
  EXPECT_EQ(engine_->Stats().bytes_read, n * FileBytes());
  EXPECT_LE(engine_->Stats().pool_peak_slots, 4u);
  EXPECT_EQ(loaded.bytes, n * engine_->chunk_payload_bytes());
}

TEST_F(JobClientTest, APartialLoadCopiesOnlyTheBlocksAskedFor) {
  ASSERT_NO_FATAL_FAILURE(Open(8));
  std::vector<HostChunk> src(1);
  src[0].Fill(7);
  ASSERT_TRUE(Store(src).all_ok());
  HostChunk dst;
  JobResult r = Run(client_->SubmitLoad({{Key(0), 1, 2, dst.Segments(engine_->block_stride(), 1, 2)}}));
  ASSERT_TRUE(r.all_ok());
  EXPECT_EQ(r.bytes, 2 * engine_->block_stride());
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + kBlockBytes, src[0].bytes.data() + kBlockBytes, 2 * kBlockBytes));
  EXPECT_TRUE(std::all_of(dst.bytes.begin(), dst.bytes.begin() + kBlockBytes, [](uint8_t v) { return v == 0xEE; }));
  EXPECT_TRUE(std::all_of(dst.bytes.begin() + 3 * kBlockBytes, dst.bytes.end(), [](uint8_t v) { return v == 0xEE; }));
}

TEST_F(JobClientTest, MissingAndCorruptChunksAreMissesThatTouchNoDestination) {
  ASSERT_NO_FATAL_FAILURE(Open(4));
  std::vector<HostChunk> src(6);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(30 + i);
  ASSERT_TRUE(Store(src).all_ok());
  ASSERT_NO_FATAL_FAILURE(Restart(4));
  // Chunk 2's block 1 flipped on disk; chunk 6 was never stored.
  std::string file;
  const std::string rel = ChunkRelPath(Key(2));
  for (auto& p : std::filesystem::recursive_directory_iterator(dir_.path())) {
    const std::string path = p.path().string();
    if (path.size() > rel.size() && path.compare(path.size() - rel.size(), rel.size(), rel) == 0) file = path;
  }
  ASSERT_FALSE(file.empty());
  const int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = kHeaderBytes + engine_->block_stride() + 17;
  uint8_t b;
  ASSERT_EQ(pread(fd, &b, 1, at), 1);
  b ^= 0x40;
  ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
  close(fd);

  std::vector<HostChunk> dst(7);
  JobResult r = Run(client_->SubmitLoad(WholeLoads(dst)));
  ASSERT_EQ(r.chunks.size(), 7u);
  EXPECT_EQ(r.chunks_ok, 5u);
  for (size_t i = 0; i < 7; ++i) {
    if (i == 2 || i == 6) {
      EXPECT_EQ(r.chunks[i].status.code(), StatusCode::kNotFound) << i << ": " << r.chunks[i].status.ToString();
      EXPECT_TRUE(dst[i].Untouched()) << i;
    } else {
      EXPECT_TRUE(r.chunks[i].status.ok()) << i << ": " << r.chunks[i].status.ToString();
      EXPECT_EQ(dst[i].bytes, src[i].bytes) << i;
    }
  }
  EXPECT_EQ(engine_->Stats().corrupt_entries, 1u);
}

TEST_F(JobClientTest, StoringChunksAlreadyStoredWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(Open(8));
  std::vector<HostChunk> src(3);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(i);
  ASSERT_TRUE(Store(src).all_ok());
  const uint64_t written = engine_->Stats().bytes_written;
  JobResult again = Store(src);
  EXPECT_TRUE(again.all_ok());
  EXPECT_EQ(again.bytes, 0u);
  EXPECT_EQ(engine_->Stats().bytes_written, written);
}

TEST_F(JobClientTest, AStoreWhoseWriteFailsIsReportedDropped) {
  auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
  ASSERT_TRUE(inner.ok());
  auto fault = std::make_unique<FaultInjectingEngine>(std::move(inner.value()));
  fault->AddRule(FaultRule::FailEvery(OpCode::kWrite, EIO));
  ASSERT_NO_FATAL_FAILURE(Open(8, std::move(fault)));
  std::vector<HostChunk> src(2);
  src[0].Fill(1);
  src[1].Fill(2);
  JobResult r = Store(src);
  ASSERT_EQ(r.chunks.size(), 2u);
  EXPECT_EQ(r.chunks_ok, 0u);
  for (const ChunkOutcome& o : r.chunks) EXPECT_EQ(o.status.code(), StatusCode::kIoError) << o.status.ToString();
  EXPECT_FALSE(engine_->Stored(Key(0)));
  EXPECT_GE(engine_->Stats().stores_dropped, 2u);
}

// A store is reported by its own outcome (Engine::TakeStoreOutcome), not by whether the index still holds the entry
// when the client asks: a budget of two entries evicts nearly every entry soon after its publish (C1), and every
// chunk the job wrote is still Ok.
TEST_F(JobClientTest, StoresEvictedRightAfterTheirPublishAreReportedWritten) {
  constexpr size_t kChunks = 32;
  disk_budget_ = 2 * (kHeaderBytes + kBlocks * 12288);
  ASSERT_NO_FATAL_FAILURE(Open(8));
  std::vector<HostChunk> src(kChunks);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(100 + i);
  JobResult r = Store(src);
  ASSERT_EQ(r.chunks.size(), kChunks);
  for (const ChunkOutcome& o : r.chunks) EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(r.chunks_ok, kChunks);
  EXPECT_EQ(r.bytes, kChunks * engine_->chunk_payload_bytes());
  const StatsSnapshot st = engine_->Stats();
  EXPECT_EQ(st.stores_dropped, 0u);
  EXPECT_GE(st.evictions, kChunks - 2);  // what the budget cannot hold was evicted: the case this test is about
  size_t on_disk = 0;
  for (size_t i = 0; i < kChunks; ++i) on_disk += engine_->Stored(Key(i)) ? 1 : 0;
  EXPECT_LE(on_disk, 2u);
}

TEST_F(JobClientTest, InvalidRequestsAreRefusedBeforeQueueing) {
  ASSERT_NO_FATAL_FAILURE(Open(8));
  HostChunk h;
  const uint64_t stride = engine_->block_stride();
  EXPECT_EQ(client_->SubmitLoad({{Key(0), kBlocks, 0, {}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->SubmitLoad({{Key(0), 2, 3, {}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->SubmitStore({{Key(0), 1, 0, {}}}).status().code(), StatusCode::kInvalidArgument);
  std::vector<CopySegment> outside{{stride * kBlocks, reinterpret_cast<uint64_t>(h.bytes.data()), 1}};
  EXPECT_EQ(client_->SubmitLoad({{Key(0), 0, 0, outside}}).status().code(), StatusCode::kInvalidArgument);
  std::vector<CopySegment> null_address{{0, 0, 16}};
  EXPECT_EQ(client_->SubmitStore({{Key(0), 0, 0, null_address}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->PollCompleted().empty());
  EXPECT_EQ(engine_->Stats().bytes_read + engine_->Stats().bytes_written, 0u);
}

TEST_F(JobClientTest, EachJobIsReportedOnceByPollOrWait) {
  ASSERT_NO_FATAL_FAILURE(Open(8));
  auto empty = client_->SubmitLoad({});
  ASSERT_TRUE(empty.ok());
  auto r = client_->Wait(*empty, 10000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->chunks.size(), 0u);
  EXPECT_EQ(client_->Wait(*empty, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->Wait(12345, 0).status().code(), StatusCode::kNotFound);

  std::vector<HostChunk> src(2);
  src[0].Fill(5);
  src[1].Fill(6);
  std::vector<ChunkTransfer> t;
  for (size_t i = 0; i < 2; ++i) t.push_back(ChunkTransfer{Key(i), 0, 0, src[i].Segments(engine_->block_stride())});
  auto a = client_->SubmitStore(std::move(t));
  ASSERT_TRUE(a.ok());
  std::vector<JobResult> seen;
  for (int i = 0; i < 6000 && seen.empty(); ++i) {
    seen = client_->PollCompleted();
    if (seen.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id, *a);
  EXPECT_TRUE(seen[0].all_ok());
  EXPECT_TRUE(client_->PollCompleted().empty());
  EXPECT_EQ(client_->Wait(*a, 0).status().code(), StatusCode::kNotFound);
}

TEST_F(JobClientTest, JobsAtOnceShareThePoolAndAllFinish) {
  ASSERT_NO_FATAL_FAILURE(Open(6));
  const size_t per_job = 12;
  std::vector<HostChunk> src(3 * per_job);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(500 + i);
  ASSERT_TRUE(Store(src).all_ok());
  ASSERT_NO_FATAL_FAILURE(Restart(6));
  std::vector<std::vector<HostChunk>> dst(3, std::vector<HostChunk>(per_job));
  std::vector<JobId> ids;
  for (size_t j = 0; j < 3; ++j) {
    auto id = client_->SubmitLoad(WholeLoads(dst[j], j * per_job));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (size_t j = 0; j < 3; ++j) {
    auto r = client_->Wait(ids[j], 60000);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->all_ok()) << j;
    for (size_t i = 0; i < per_job; ++i) EXPECT_EQ(dst[j][i].bytes, src[j * per_job + i].bytes) << j << "/" << i;
  }
  EXPECT_EQ(engine_->Stats().bytes_read, 3 * per_job * FileBytes());
  EXPECT_LE(engine_->Stats().pool_peak_slots, 6u);
}

TEST_F(JobClientTest, SeveralCopyLanesCopyTheSameBytes) {
  ASSERT_NO_FATAL_FAILURE(Open(8, nullptr, JobClientOptions{0, 3}));
  std::vector<HostChunk> src(16);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(900 + i);
  ASSERT_TRUE(Store(src).all_ok());
  ASSERT_NO_FATAL_FAILURE(Open(8, nullptr, JobClientOptions{0, 3}));
  std::vector<HostChunk> dst(16);
  ASSERT_TRUE(Run(client_->SubmitLoad(WholeLoads(dst))).all_ok());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(dst[i].bytes, src[i].bytes) << i;
}

TEST_F(JobClientTest, AClientGivenTheProcesssPumpStreamsBesideItsOtherStreams) {
  ASSERT_NO_FATAL_FAILURE(Open(8));
  std::vector<HostChunk> src(6);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(70 + i);
  ASSERT_TRUE(Store(src).all_ok());
  client_.reset();
  // The process's pump (as the vLLM manager's): one board, one owner. A stream of its own stays open meanwhile.
  auto mine = StagingPool::Attach(engine_->pool_name());
  ASSERT_TRUE(mine.ok());
  StreamPump pump(engine_.get(), std::move(mine).value(), StreamOptions{4, 3, true});
  const std::vector<ChunkKey> other{Key(100), Key(101)};
  auto held = pump.OpenLoad(other, 1);
  ASSERT_TRUE(held.ok());
  auto c = JobClient::Create(engine_.get(), nullptr, {}, &pump);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  client_ = std::move(c.value());
  std::vector<HostChunk> dst(6);
  JobResult r = Run(client_->SubmitLoad(WholeLoads(dst)));
  ASSERT_TRUE(r.all_ok());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(dst[i].bytes, src[i].bytes) << i;
  const StreamStats stats = pump.stats();
  EXPECT_EQ(stats.loads_opened, 2u);  // the held stream and the client's job
  pump.Close(held->id);
  client_.reset();  // before the pump it was given
}

TEST_F(JobClientTest, AClientClosedWithJobsInFlightFinishesThemFirst) {
  ASSERT_NO_FATAL_FAILURE(Open(4));
  std::vector<HostChunk> src(20);
  for (size_t i = 0; i < src.size(); ++i) src[i].Fill(300 + i);
  std::vector<ChunkTransfer> t;
  for (size_t i = 0; i < src.size(); ++i) {
    t.push_back(ChunkTransfer{Key(i), 0, 0, src[i].Segments(engine_->block_stride())});
  }
  ASSERT_TRUE(client_->SubmitStore(std::move(t)).ok());
  client_.reset();
  for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(engine_->Stored(Key(i))) << i;
}

}  // namespace
}  // namespace kvtier
