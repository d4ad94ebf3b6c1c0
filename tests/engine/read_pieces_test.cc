// K1, I1: a promotion reads a chunk in pieces of read_piece_bytes (whole blocks; a reactor's reads go to its oldest
// chunk first) and verifies each piece as it lands, the last one after the disk has the next chunk's reads. Loads go
// through the job API as a client of the slot path (JobClient, docs/architecture.md "One data path"): each
// chunk is read whole into a slot and only the blocks asked for are copied out (X3's partial reads are not on the
// slot path). Every piece size serves the same bytes, whole chunks and block ranges alike; a damaged block or header
// anywhere is a miss that writes nothing to the destination; short reads continue inside their piece.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "support/engine_options.h"
#include "support/job_engine.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 8;
constexpr uint64_t kBlockBytes = 8192;  // a multiple of the payload alignment: the stride is the block

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 10, 0x51); }

EngineOptions Options(const std::string& root, uint64_t piece_bytes) {
  EngineOptions o = test::BaseOptions(root, "read-pieces", 128, kBlocks, kBlockBytes);
  o.pool_bytes = 16 * (kHeaderBytes + kBlocks * kBlockBytes);
  o.io_depth = 4;
  o.read_piece_bytes = piece_bytes;
  return o;
}

std::vector<uint8_t> ChunkBytes(uint64_t seed) {
  std::vector<uint8_t> b(kBlocks * kBlockBytes);
  std::mt19937_64 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Segments of blocks [first, first + n) of `host` (a whole chunk's bytes), slot offsets relative to `first`.
std::vector<CopySegment> Segments(std::vector<uint8_t>& host, uint64_t stride, uint32_t first, uint32_t n) {
  std::vector<CopySegment> s;
  for (uint32_t b = 0; b < n; ++b) {
    s.push_back(
        CopySegment{b * stride, reinterpret_cast<uint64_t>(host.data() + (first + b) * kBlockBytes), kBlockBytes});
  }
  return s;
}

JobResult RunJob(test::JobEngine& e, Result<JobId> id) {
  auto r = e.Run(id);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : JobResult{};
}

// An engine over `io` (null: the options' backend) with a JobClient over it.
test::JobEngine Open(const EngineOptions& o, std::unique_ptr<IoEngine> io = nullptr, JobClientOptions client = {}) {
  auto e = io ? EngineImpl::Create(o, std::move(io)) : Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return {};
  auto with = test::WithJobs(std::move(e).value(), nullptr, client);
  EXPECT_TRUE(with.ok()) << with.status().ToString();
  return with.ok() ? std::move(with).value() : test::JobEngine{};
}

// Stores chunks [0, n) with an engine of their own, closed after: they are on disk only (a store through the slot
// path keeps its chunks resident in the engine that wrote them).
void StoreChunks(const std::string& root, uint32_t n) {
  auto e = Open(Options(root, 0));
  ASSERT_TRUE(e.jobs);
  std::vector<std::vector<uint8_t>> data;
  std::vector<ChunkTransfer> t;
  for (uint32_t i = 0; i < n; ++i) data.push_back(ChunkBytes(100 + i));
  for (uint32_t i = 0; i < n; ++i) {
    t.push_back(ChunkTransfer{Key(i), 0, 0, Segments(data[i], e->block_stride(), 0, kBlocks)});
  }
  ASSERT_TRUE(RunJob(e, e.jobs->SubmitStore(std::move(t))).all_ok());
}

std::string ChunkFile(const std::string& root, const ChunkKey& key) {
  for (auto& p : std::filesystem::recursive_directory_iterator(root)) {
    if (p.path().filename().string().find(key.Hex()) != std::string::npos) return p.path();
  }
  return "";
}

class ReadPieces : public ::testing::TestWithParam<uint64_t> {
 protected:
  test::TempDir dir_;
};

TEST_P(ReadPieces, EveryPieceSizeLoadsTheSameBytesForWholeChunksAndBlockRanges) {
  StoreChunks(dir_.path(), 6);
  struct Range {
    uint32_t first, n;
  };
  for (Range range : {Range{0, kBlocks}, Range{3, 4}, Range{1, 7}, Range{0, 1}, Range{7, 1}}) {
    // A fresh engine per range: its loads read the disk (a load leaves its chunks resident in the DRAM tier, T1).
    auto e = Open(Options(dir_.path(), GetParam()));
    ASSERT_TRUE(e.jobs);
    const uint64_t stride = e->block_stride();
    std::vector<std::vector<uint8_t>> got(6, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
    std::vector<ChunkTransfer> t;
    for (uint32_t i = 0; i < 6; ++i) {
      t.push_back(ChunkTransfer{Key(i), range.first, range.n, Segments(got[i], stride, range.first, range.n)});
    }
    JobResult r = RunJob(e, e.jobs->SubmitLoad(std::move(t)));
    ASSERT_TRUE(r.all_ok()) << "blocks [" << range.first << ", " << range.first + range.n << ")";
    // Whole chunks read (in pieces), only the range's blocks copied.
    EXPECT_EQ(e->Stats().bytes_read, 6 * (kHeaderBytes + kBlocks * stride)) << "range from " << range.first;
    EXPECT_EQ(r.bytes, 6 * range.n * stride) << "range from " << range.first;
    for (uint32_t i = 0; i < 6; ++i) {
      const std::vector<uint8_t> want = ChunkBytes(100 + i);
      for (uint32_t b = 0; b < kBlocks; ++b) {
        const bool loaded = b >= range.first && b < range.first + range.n;
        for (uint64_t k = 0; k < kBlockBytes; k += 509) {
          const uint8_t w = loaded ? want[b * kBlockBytes + k] : 0xEE;
          ASSERT_EQ(got[i][b * kBlockBytes + k], w) << "chunk " << i << " block " << b << " byte " << k;
        }
      }
    }
    EXPECT_EQ(e->Stats().corrupt_entries, 0u);
  }
}

// Damage in any one block (first, middle, last) or in the header: the load is a miss, the entry is removed and
// counted, and the destination keeps every byte it had, whichever piece the damage landed in.
TEST_P(ReadPieces, ADamagedBlockInAnyPieceIsAMissThatWritesNothing) {
  for (off_t where : {off_t(100), off_t(kHeaderBytes + 7), off_t(kHeaderBytes + 4 * kBlockBytes + 11),
                      off_t(kHeaderBytes + 8 * kBlockBytes - 1)}) {
    test::TempDir dir;
    StoreChunks(dir.path(), 1);
    const std::string file = ChunkFile(dir.path(), Key(0));
    ASSERT_FALSE(file.empty());
    {
      const int fd = open(file.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      uint8_t b = 0;
      ASSERT_EQ(pread(fd, &b, 1, where), 1);
      b ^= 0x40;
      ASSERT_EQ(pwrite(fd, &b, 1, where), 1);
      close(fd);
    }
    auto e = Open(Options(dir.path(), GetParam()));
    ASSERT_TRUE(e.jobs);
    std::vector<uint8_t> got(kBlocks * kBlockBytes, 0xEE);
    JobResult r =
        RunJob(e, e.jobs->SubmitLoad({ChunkTransfer{Key(0), 0, 0, Segments(got, e->block_stride(), 0, kBlocks)}}));
    ASSERT_EQ(r.chunks.size(), 1u);
    EXPECT_FALSE(r.chunks[0].status.ok()) << "damage at byte " << where << " was served";
    for (uint64_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], 0xEE) << "byte " << k << ", damage at " << where;
    EXPECT_EQ(e->Stats().corrupt_entries, 1u) << "damage at byte " << where;
    e.reset();
    EXPECT_FALSE(std::filesystem::exists(file)) << "the damaged entry stayed, damage at byte " << where;
  }
}

// Reads that return 4 KiB at a time: each piece continues where its read stopped, and its blocks are verified
// once, when the piece is complete.
TEST_P(ReadPieces, ShortReadsContinueInsideTheirPiece) {
  StoreChunks(dir_.path(), 3);
  auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
  ASSERT_TRUE(inner.ok());
  auto fault = std::make_unique<FaultInjectingEngine>(std::move(inner.value()));
  fault->AddRule(FaultRule::ShortTransfer(OpCode::kRead, 4096));
  auto e = Open(Options(dir_.path(), GetParam()), std::move(fault));
  ASSERT_TRUE(e.jobs);
  const uint64_t stride = e->block_stride();
  std::vector<std::vector<uint8_t>> got(3, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> t;
  for (uint32_t i = 0; i < 3; ++i) t.push_back(ChunkTransfer{Key(i), 2, 5, Segments(got[i], stride, 2, 5)});
  JobResult r = RunJob(e, e.jobs->SubmitLoad(std::move(t)));
  ASSERT_TRUE(r.all_ok());
  for (uint32_t i = 0; i < 3; ++i) {
    const std::vector<uint8_t> want = ChunkBytes(100 + i);
    EXPECT_EQ(0, std::memcmp(got[i].data() + 2 * kBlockBytes, want.data() + 2 * kBlockBytes, 5 * kBlockBytes));
    // Blocks 0-1 and 7 were read (the whole chunk is) but not copied.
    EXPECT_TRUE(std::all_of(got[i].begin(), got[i].begin() + 2 * kBlockBytes, [](uint8_t v) { return v == 0xEE; }));
    EXPECT_TRUE(std::all_of(got[i].begin() + 7 * kBlockBytes, got[i].end(), [](uint8_t v) { return v == 0xEE; }));
  }
  // Each short read continued where it stopped: every byte of the three files read once.
  EXPECT_EQ(e->Stats().bytes_read, 3 * (kHeaderBytes + kBlocks * stride));
  EXPECT_EQ(e->Stats().corrupt_entries, 0u);
}

// Forwards to a real I/O engine and logs, in submission order, which chunk each read is for and at what offset.
// The first `hold_opens` opened chunks' statx (the check of the open file that follows each open) to come back are
// held and then handed to the reactor all at once in reverse order, as a filesystem may answer out of order.
class ReadOrderEngine final : public IoEngine {
 public:
  struct Read {
    int chunk;  // index of Key(i) in the chunk file's name; -1: not a chunk file
    uint64_t offset;
  };
  // `reads`: the log, outliving the engine (the test reads it once the engine and its reactor are gone).
  ReadOrderEngine(std::unique_ptr<IoEngine> inner, int chunks, size_t hold_opens,
                  std::shared_ptr<std::vector<Read>> reads)
      : inner_(std::move(inner)), chunks_(chunks), hold_left_(hold_opens), reads_(std::move(reads)) {}

  std::string_view name() const override { return "read-order"; }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight() + static_cast<uint32_t>(held_.size()); }
  int Submit(const IoOp& op) override {
    const int rc = inner_->Submit(op);
    if (rc != 0) return rc;
    if (op.code == OpCode::kOpenAt) opens_[op.user_data] = op.path;
    if (op.code == OpCode::kStatx && op.path == nullptr) checks_.insert(op.user_data);
    if (op.code == OpCode::kRead) {
      auto it = fd_chunk_.find(op.fd);
      reads_->push_back(Read{it == fd_chunk_.end() ? -1 : it->second, op.offset});
    }
    return rc;
  }
  int Flush() override { return inner_->Flush(); }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    std::vector<IoCompletion> got;
    const int rc = inner_->Reap(&got, timeout_ns);
    if (rc < 0) return rc;
    const size_t before = out->size();
    for (const IoCompletion& c : got) {
      auto open = opens_.find(c.user_data);
      if (open != opens_.end()) {
        if (c.result >= 0) fd_chunk_[static_cast<int>(c.result)] = ChunkOf(open->second);
        opens_.erase(open);
      }
      if (checks_.erase(c.user_data) > 0) {
        if (hold_left_ > 0) {
          held_.push_back(c);
          if (--hold_left_ == 0) out->insert(out->end(), held_.rbegin(), held_.rend()), held_.clear();
          continue;
        }
      }
      out->push_back(c);
    }
    return static_cast<int>(out->size() - before);
  }
  void Wake() override { inner_->Wake(); }

 private:
  int ChunkOf(const std::string& path) const {
    for (int i = 0; i < chunks_; ++i) {
      if (path.find(Key(i).Hex()) != std::string::npos) return i;
    }
    return -1;
  }
  std::unique_ptr<IoEngine> inner_;
  int chunks_;
  size_t hold_left_;
  std::vector<IoCompletion> held_;
  std::map<uint64_t, std::string> opens_;
  std::set<uint64_t> checks_;  // the statx of an open chunk file, by user_data
  std::map<int, int> fd_chunk_;
  std::shared_ptr<std::vector<Read>> reads_;
};

// I1: a reactor gives the disk's reads to its loads oldest first, in the order the job named the chunks (the order
// its stream promotes them), whatever order their opens' checks came back in (docs/architecture.md, "Reads in pieces"):
// the first chunks start first, and each chunk has every piece asked for before the next one gets more than its first.
// So chunks finish one after another and the first one asked for is ready first (a promotion window refills at
// once), and a job's last chunks keep the whole budget of reads. With two pieces per chunk as before, the pieces of
// the chunks at the disk interleaved and the chunks finished together.
TEST(ReadPiecesOrder, TheDiskServesTheOldestChunkFirstWhateverOrderItsOpenCheckCameBackIn) {
  constexpr int kChunks = 6;
  test::TempDir dir;
  StoreChunks(dir.path(), kChunks);
  auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
  ASSERT_TRUE(inner.ok());
  EngineOptions o = Options(dir.path(), 1);  // a block per piece: eight pieces per chunk
  o.io_depth = 2;                            // two chunks at the disk, four reads
  // The job's stream holds 4 slots and promotes at most 3 chunks at once (StreamPump: reads at once are 3/4 of the
  // window): the first 3 opens are all the job has out; their checks are held and handed back together.
  const JobClientOptions client{.max_window = 2 * o.io_depth};
  const size_t opens_at_once = client.max_window - client.max_window / 4;
  auto reads = std::make_shared<std::vector<ReadOrderEngine::Read>>();
  auto e = Open(o, std::make_unique<ReadOrderEngine>(std::move(inner.value()), kChunks, opens_at_once, reads), client);
  ASSERT_TRUE(e.jobs);
  const uint64_t stride = e->block_stride();
  std::vector<std::vector<uint8_t>> got(kChunks, std::vector<uint8_t>(kBlocks * kBlockBytes, 0xEE));
  std::vector<ChunkTransfer> t;
  for (int i = 0; i < kChunks; ++i) t.push_back(ChunkTransfer{Key(i), 0, 0, Segments(got[i], stride, 0, kBlocks)});
  ASSERT_TRUE(RunJob(e, e.jobs->SubmitLoad(std::move(t))).all_ok());
  for (int i = 0; i < kChunks; ++i) ASSERT_EQ(got[i], ChunkBytes(100 + i)) << "chunk " << i;
  e.reset();  // the reactor has stopped: the log is complete

  std::vector<int> firsts, pieces;  // the chunks of the header reads, then of the later pieces, in submission order
  std::vector<int> reads_per_chunk(kChunks, 0);
  for (const ReadOrderEngine::Read& r : *reads) {
    ASSERT_GE(r.chunk, 0) << "a read of a file that is no chunk";
    (r.offset == 0 ? firsts : pieces).push_back(r.chunk);
    reads_per_chunk[r.chunk]++;
  }
  EXPECT_EQ(firsts, (std::vector<int>{0, 1, 2, 3, 4, 5})) << "chunks reached the disk out of the job's order";
  EXPECT_TRUE(std::is_sorted(pieces.begin(), pieces.end())) << "a chunk's pieces were asked for while an older "
                                                               "chunk still had pieces to ask for";
  for (int i = 0; i < kChunks; ++i) EXPECT_EQ(reads_per_chunk[i], int(kBlocks)) << "chunk " << i;
}

// 0: one read per chunk; 1 byte: one block a piece (the most pieces); 3 blocks: a short last piece; 1 MiB (the
// default): the whole chunk in one piece here.
INSTANTIATE_TEST_SUITE_P(Sizes, ReadPieces, ::testing::Values(0, 1, 3 * kBlockBytes, 1 << 20),
                         [](const ::testing::TestParamInfo<uint64_t>& i) {
                           return i.param == 0 ? std::string("WholeChunk") : "Piece" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace kvtier
