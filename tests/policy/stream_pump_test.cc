// StreamPump (S1, X1, X2; docs/architecture.md "Streamed transfers") over a real engine and real files: streams
// larger than the pool go through it in a bounded window, every chunk once; a corrupt chunk fails alone; streams
// open at once share the pool; a closed stream's entries refuse a late ack.
#include "policy/stream_pump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "layout/chunk_format.h"
#include "policy/job_client.h"
#include "policy/preload_planner.h"
#include "support/engine_options.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 2;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kSlotBytes = 4096 + kBlocks * kBlockBytes;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 36, 8, 0x5a); }

uint8_t Pattern(uint64_t chunk) { return static_cast<uint8_t>(0x20 + chunk); }

class StreamPumpTest : public ::testing::Test {
 protected:
  void Open(uint32_t slots, bool background = true) {
    slots_ = slots;
    background_ = background;
    EngineOptions o = test::BaseOptions(dir_.path(), "stream-test", 32, kBlocks, kBlockBytes);
    o.pool_bytes = slots * kSlotBytes;
    o.io_depth = 4;
    o.demand_reserve_slots = 1;
    o.op_timeout_ms = 60000;
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e.value());
    auto view = StagingPool::Attach(engine_->pool_name());
    ASSERT_TRUE(view.ok());
    view_ = std::move(view.value());  // what a worker process maps
    auto mine = StagingPool::Attach(engine_->pool_name());
    ASSERT_TRUE(mine.ok());
    pump_ = std::make_unique<StreamPump>(engine_.get(), std::move(mine.value()), StreamOptions{8, 3, background});
  }
  void TearDown() override {
    pump_.reset();
    view_.reset();
    engine_.reset();
  }

  // Stores chunks [0, n) through a JobClient given this test's pump (a pool's stream board has one owner), then opens
  // the engine again: a store's chunks stay resident (write-through DRAM tier, T1), and these tests read them from
  // the disk.
  void StoreOnDisk(uint64_t n) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<ChunkTransfer> t;
    for (uint64_t i = 0; i < n; ++i) data.emplace_back(kBlocks * kBlockBytes, Pattern(i));
    for (uint64_t i = 0; i < n; ++i) {
      std::vector<CopySegment> segs;
      for (uint32_t b = 0; b < kBlocks; ++b) {
        segs.push_back(CopySegment{b * engine_->block_stride(),
                                   reinterpret_cast<uint64_t>(data[i].data() + b * kBlockBytes), kBlockBytes});
      }
      t.push_back(ChunkTransfer{Key(i), 0, 0, segs});
    }
    {
      auto client = JobClient::Create(engine_.get(), nullptr, {}, pump_.get());
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      auto id = (*client)->SubmitStore(std::move(t));
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      Result<JobResult> r = Status(StatusCode::kTimedOut, "not waited for");
      for (int i = 0; i < 30000 && r.status().code() == StatusCode::kTimedOut; ++i) {  // 30 s at most
        if (!background_) pump_->Pump();  // without the pump's thread, the test advances it
        r = (*client)->Wait(id.value(), 1);
      }
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_TRUE(r->all_ok());
    }
    TearDown();
    Open(slots_, background_);
  }

  std::vector<ChunkKey> Keys(uint64_t first, uint64_t n) {
    std::vector<ChunkKey> v;
    for (uint64_t i = first; i < first + n; ++i) v.push_back(Key(i));
    return v;
  }

  struct Consumed {
    uint32_t copied = 0;
    uint32_t failed = 0;
    uint32_t skipped = 0;
    uint32_t wrong_bytes = 0;
    uint32_t max_outstanding = 0;  // entries ready and not yet acked, at most (the window seen from outside)
  };

  // A worker's side: copies (checks) or fills each ready entry of the stream and acks it, in whatever order the
  // entries become ready, until every chunk is settled. first_chunk names the key of entry 0 (for the pattern).
  Consumed Consume(const StreamSpan& span, uint64_t first_chunk, bool load) {
    Consumed c;
    std::vector<bool> settled(span.count, false);
    uint32_t left = span.count;
    for (int spins = 0; left > 0 && spins < 200000; ++spins) {
      const uint32_t bell = view_->WorkerBell();
      uint32_t outstanding = 0;
      for (uint32_t i = 0; i < span.count; ++i) {
        if (settled[i]) continue;
        const StreamEntryView v = view_->ObserveEntry(span.first_entry + i);
        if (v.tag != span.tag || v.state == StreamEntryState::kWaiting) continue;
        settled[i] = true;
        left--;
        if (v.state == StreamEntryState::kFailed) {
          c.failed++;
          continue;
        }
        if (v.state == StreamEntryState::kSkipped) {
          c.skipped++;
          continue;
        }
        outstanding++;
        EXPECT_EQ(view_->Observe(v.slot).generation, v.generation);
        uint8_t* payload = view_->SlotData(v.slot) + kHeaderBytes;
        if (load) {
          for (uint64_t b = 0; b < kBlocks * kBlockBytes; b += 512) {
            if (payload[(b / kBlockBytes) * engine_->block_stride() + b % kBlockBytes] != Pattern(first_chunk + i)) {
              c.wrong_bytes++;
              break;
            }
          }
        } else {
          for (uint32_t b = 0; b < kBlocks; ++b) {
            std::memset(payload + b * engine_->block_stride(), Pattern(first_chunk + i), kBlockBytes);
          }
        }
        c.copied++;
        EXPECT_TRUE(view_->AckEntry(span.first_entry + i, span.tag));
      }
      c.max_outstanding = std::max(c.max_outstanding, outstanding);
      if (left > 0) view_->WaitWorkerBell(bell, std::chrono::milliseconds(5));
    }
    return c;
  }

  // Waits until no read of keys is pending in the engine (each is resident, or was never started).
  void WaitReadsEnded(const std::vector<ChunkKey>& keys) {
    for (int i = 0; i < 10000; ++i) {
      bool pending = false;
      for (const ChunkKey& k : keys) pending |= engine_->Residency(k) == PromoteState::kPending;
      if (!pending) return;
      usleep(1000);
    }
    FAIL() << "reads did not end";
  }

  // Acks every ready entry of span (a consumer that copies at once); returns how many it acked.
  uint32_t AckReady(const StreamSpan& span) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < span.count; ++i) {
      const StreamEntryView v = view_->ObserveEntry(span.first_entry + i);
      if (v.tag == span.tag && v.state == StreamEntryState::kReady && view_->AckEntry(span.first_entry + i, span.tag))
        n++;
    }
    return n;
  }

  void WaitFinished(uint64_t id) {
    for (int i = 0; i < 5000; ++i) {
      auto p = pump_->Progress(id);
      ASSERT_TRUE(p.ok());
      if (p->finished) return;
      usleep(1000);
    }
    FAIL() << "stream " << id << " did not finish";
  }

  test::TempDir dir_;
  uint32_t slots_ = 0;
  bool background_ = true;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<StagingPool> view_;
  std::unique_ptr<StreamPump> pump_;
};

TEST_F(StreamPumpTest, ALoadLargerThanThePoolStreamsThroughItReadingEveryChunkOnce) {
  Open(/*slots=*/4);
  StoreOnDisk(12);
  const uint64_t read_before = engine_->Stats().bytes_read;
  auto span = pump_->OpenLoad(Keys(0, 12), 1);
  ASSERT_TRUE(span.ok()) << span.status().ToString();
  Consumed c = Consume(*span, 0, /*load=*/true);
  EXPECT_EQ(c.copied, 12u);
  EXPECT_EQ(c.failed, 0u);
  EXPECT_EQ(c.wrong_bytes, 0u);
  WaitFinished(span->id);
  pump_->Close(span->id);
  // Every chunk read once (bytes read = bytes needed), never more slots than the pool.
  EXPECT_EQ(engine_->Stats().bytes_read - read_before, 12 * (kHeaderBytes + kBlocks * engine_->block_stride()));
  EXPECT_LE(engine_->Stats().pool_peak_slots, 4u);
  EXPECT_EQ(pump_->stats().chunks_loaded, 12u);
}

TEST_F(StreamPumpTest, ACorruptChunkFailsAloneAndNeverReachesTheConsumer) {
  Open(4);
  StoreOnDisk(6);
  // Flip a payload byte of chunk 3's file.
  bool flipped = false;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir_.path())) {
    if (!f.is_regular_file() || f.path().extension() != ".kvc") continue;
    int fd = ::open(f.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(pread(fd, &b, 1, kHeaderBytes + 10), 1);
    if (b == Pattern(3)) {
      b ^= 0xff;
      ASSERT_EQ(pwrite(fd, &b, 1, kHeaderBytes + 10), 1);
      flipped = true;
    }
    ::close(fd);
  }
  ASSERT_TRUE(flipped);
  auto span = pump_->OpenLoad(Keys(0, 6), 1);
  ASSERT_TRUE(span.ok());
  Consumed c = Consume(*span, 0, true);
  EXPECT_EQ(c.copied, 5u);
  EXPECT_EQ(c.failed, 1u);
  EXPECT_EQ(c.wrong_bytes, 0u);
  EXPECT_EQ(view_->ObserveEntry(span->first_entry + 3).state, StreamEntryState::kFailed);
  WaitFinished(span->id);
  pump_->Close(span->id);
}

TEST_F(StreamPumpTest, AnAbsentChunkFailsAndTheRestOfTheStreamGoesOn) {
  Open(4);
  StoreOnDisk(4);
  std::vector<ChunkKey> keys = Keys(0, 4);
  keys.insert(keys.begin() + 2, Key(99));  // never stored
  auto span = pump_->OpenLoad(keys, 1);
  ASSERT_TRUE(span.ok());
  uint32_t copied = 0, failed = 0;
  for (int spins = 0; copied + failed < 5 && spins < 5000; ++spins) {
    copied = failed = 0;
    for (uint32_t i = 0; i < 5; ++i) {
      StreamEntryView v = view_->ObserveEntry(span->first_entry + i);
      if (v.state == StreamEntryState::kFailed) failed++;
      if (v.state == StreamEntryState::kReady) {
        view_->AckEntry(span->first_entry + i, span->tag);
        copied++;
      }
    }
    usleep(1000);
  }
  EXPECT_EQ(copied, 4u);
  EXPECT_EQ(failed, 1u);
  EXPECT_EQ(view_->ObserveEntry(span->first_entry + 2).state, StreamEntryState::kFailed);
  WaitFinished(span->id);
  pump_->Close(span->id);
}

TEST_F(StreamPumpTest, StreamsOpenAtOnceShareThePoolAndAllFinish) {
  Open(6);
  StoreOnDisk(24);
  std::vector<StreamSpan> spans;
  for (int s = 0; s < 3; ++s) {
    auto span = pump_->OpenLoad(Keys(8 * s, 8), 1);
    ASSERT_TRUE(span.ok());
    spans.push_back(*span);
  }
  std::vector<Consumed> got(3);
  std::vector<std::thread> workers;
  for (int s = 0; s < 3; ++s) workers.emplace_back([&, s] { got[s] = Consume(spans[s], 8 * s, true); });
  for (auto& t : workers) t.join();
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(got[s].copied, 8u) << "stream " << s;
    EXPECT_EQ(got[s].wrong_bytes, 0u);
    WaitFinished(spans[s].id);
    pump_->Close(spans[s].id);
  }
  EXPECT_LE(engine_->Stats().pool_peak_slots, 6u);
  EXPECT_LE(pump_->stats().peak_window, 6u);
}

// The disk goes to the oldest stream: a read budget freed in a pass goes to the first stream (in open order) that has
// room, even when the reads that freed it were a younger stream's. Driven pass by pass (no background thread), with
// a window of 8 and a budget of 6 reads.
TEST_F(StreamPumpTest, ReadsFreedByAYoungerStreamGoToTheOldestStreamWithRoom) {
  Open(/*slots=*/64, /*background=*/false);
  StoreOnDisk(32);
  auto a = pump_->OpenLoad(Keys(0, 16), 1);
  auto b = pump_->OpenLoad(Keys(16, 16), 1);
  ASSERT_TRUE(a.ok() && b.ok());
  // A took the whole budget (chunks 0-5); B none.
  WaitReadsEnded(Keys(0, 6));
  pump_->Pump();  // A publishes 0-5, fills its window with 6-7; B gets the rest of the budget: 16-19
  ASSERT_EQ(pump_->Progress(a->id)->published, 6u);
  EXPECT_EQ(engine_->Residency(Key(20)), PromoteState::kMiss) << "B started beyond the budget";
  WaitReadsEnded(Keys(0, 32));
  EXPECT_EQ(AckReady(*a), 6u);  // A's consumer copies 0-5: A has room for 6 more reads
  pump_->Pump();
  // Every read ended before this pass: A (the oldest, with room) takes the whole budget, 8-13; B starts nothing
  // although its own reads (16-19) ended in the same pass.
  for (uint64_t k = 8; k < 14; ++k) EXPECT_NE(engine_->Residency(Key(k)), PromoteState::kMiss) << "chunk " << k;
  for (uint64_t k = 20; k < 24; ++k) EXPECT_EQ(engine_->Residency(Key(k)), PromoteState::kMiss) << "chunk " << k;
  // Both still finish, every chunk once.
  for (int pass = 0; pass < 2000; ++pass) {
    AckReady(*a);
    AckReady(*b);
    pump_->Pump();
    if (pump_->Progress(a->id)->finished && pump_->Progress(b->id)->finished) break;
    usleep(500);
  }
  EXPECT_TRUE(pump_->Progress(a->id)->finished);
  EXPECT_TRUE(pump_->Progress(b->id)->finished);
  EXPECT_EQ(pump_->stats().chunks_loaded, 32u);
  pump_->Close(a->id);
  pump_->Close(b->id);
}

// Preload rides on the stream (docs/architecture.md "Streamed transfers", S2/R2): a waiting request's first chunks,
// read ahead by the planner within its bound, are what its stream publishes first once it is admitted; none is read
// twice, and the stream reads only the rest.
TEST_F(StreamPumpTest, AnAdmittedRequestsStreamTakesItsPreloadedChunksWithoutReadingThemAgain) {
  Open(/*slots=*/16);
  StoreOnDisk(8);
  const uint64_t read_before = engine_->Stats().bytes_read;
  PreloadPlanner planner(engine_.get(), PlannerOptions{2, 0});
  planner.Enqueue("waiting", Keys(0, 8));
  // Until every read it started ended and it either read everything or found no more room for preloads.
  for (int i = 0; i < 5000; ++i) {
    planner.Pump();
    if (planner.inflight() == 0 && (planner.queued() == 0 || planner.stats().refused_no_room > 0)) break;
    usleep(1000);
  }
  uint32_t preloaded = 0;
  while (preloaded < 8 && engine_->Residency(Key(preloaded)) == PromoteState::kReady) preloaded++;
  ASSERT_GE(preloaded, 1u) << "the planner read nothing ahead";
  ASSERT_LE(engine_->Stats().preload_started, 7u) << "unused preloads stay within half the non-reserved slots";
  const uint64_t chunk_file_bytes = (engine_->Stats().bytes_read - read_before) / engine_->Stats().preload_started;
  planner.Forget("waiting");  // admitted: its stream takes over
  auto span = pump_->OpenLoad(Keys(0, 8), 1);
  ASSERT_TRUE(span.ok());
  const Consumed got = Consume(*span, 0, true);
  EXPECT_EQ(got.copied, 8u);
  EXPECT_EQ(got.wrong_bytes, 0u);
  WaitFinished(span->id);
  pump_->Close(span->id);
  const auto st = engine_->Stats();
  EXPECT_EQ(st.bytes_read - read_before, 8 * chunk_file_bytes) << "a chunk was read twice";
  EXPECT_GE(st.preload_used, preloaded);
  EXPECT_EQ(st.preload_wasted, 0u);
}

TEST_F(StreamPumpTest, AStoreLargerThanThePoolWritesThroughItAndEveryChunkLoadsBack) {
  Open(4);
  auto span = pump_->OpenStore(Keys(100, 12), 2);  // two consumers (TP=2): a chunk commits once both filled it
  ASSERT_TRUE(span.ok());
  std::atomic<int> second_acks{0};
  // The second consumer acks whatever the first one filled (its share of each block is not checked here).
  std::thread second([&] {
    std::vector<bool> done(12, false);
    for (int spins = 0; second_acks < 12 && spins < 200000; ++spins) {
      for (uint32_t i = 0; i < 12; ++i) {
        StreamEntryView v = view_->ObserveEntry(span->first_entry + i);
        if (!done[i] && v.tag == span->tag && v.state == StreamEntryState::kReady) {
          done[i] = true;
          view_->AckEntry(span->first_entry + i, span->tag);
          second_acks++;
        }
      }
      usleep(100);
    }
  });
  Consumed c = Consume(*span, 100, /*load=*/false);
  second.join();
  EXPECT_EQ(c.copied, 12u);
  WaitFinished(span->id);
  pump_->Close(span->id);
  EXPECT_LE(engine_->Stats().pool_peak_slots, 4u);
  EXPECT_EQ(pump_->stats().chunks_stored, 12u);
  // Every chunk is on disk (or still resident while written) and loads back with its bytes.
  for (int i = 0; i < 2000 && engine_->Stats().stores_completed < 12; ++i) usleep(1000);
  auto back = pump_->OpenLoad(Keys(100, 12), 1);
  ASSERT_TRUE(back.ok());
  Consumed l = Consume(*back, 100, true);
  EXPECT_EQ(l.copied, 12u);
  EXPECT_EQ(l.wrong_bytes, 0u);
  WaitFinished(back->id);
  pump_->Close(back->id);
}

TEST_F(StreamPumpTest, AClosedStreamsEntriesRefuseALateAckAndTheBoardIsReused) {
  Open(4);
  StoreOnDisk(2);
  auto a = pump_->OpenLoad(Keys(0, 2), 1);
  ASSERT_TRUE(a.ok());
  Consume(*a, 0, true);
  WaitFinished(a->id);
  pump_->Close(a->id);
  auto b = pump_->OpenLoad(Keys(0, 2), 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first_entry, a->first_entry);  // the range was given back
  EXPECT_NE(b->tag, a->tag);
  EXPECT_FALSE(view_->AckEntry(a->first_entry, a->tag));  // a late consumer of the old stream changes nothing
  Consume(*b, 0, true);
  WaitFinished(b->id);
  pump_->Close(b->id);
  EXPECT_FALSE(pump_->Progress(b->id).ok());
}

TEST_F(StreamPumpTest, OpensAreValidated) {
  Open(4);
  EXPECT_EQ(pump_->OpenLoad({}, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pump_->OpenLoad(Keys(0, 1), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pump_->OpenLoad(Keys(0, 20000), 1).status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvtier
