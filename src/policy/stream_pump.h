// StreamPump: the vLLM path's loads and stores, streamed chunk by chunk through a bounded window of staging slots
// (S1, X1, X2), on top of Engine's slot API and the pool's stream board (staging/staging_pool.h).
// docs/architecture.md, "Streamed transfers", has the protocol and the data flow.
//
// A load stream reads its keys in order: each chunk is promoted (read and verified into a slot, or found resident),
// pinned, and published on the board as ready; its consumers (vLLM's workers, one per rank) copy it out and ack it;
// when every consumer acked, the chunk is unpinned (it stays in the DRAM tier as an ordinary resident entry) and
// its place in the window goes to the next chunk. A chunk that cannot be read (absent, corrupt, late, failing I/O)
// is published as failed and never reaches a consumer's destination; the others go on.
// A store stream is the reverse: each chunk is granted a slot (ReserveForStore), published ready for its consumers
// to fill; when every consumer acked, it is committed (CommitStore: written and published by the reactors, kept
// resident while written) and the next chunk is granted.
//
// The window: a stream holds at most min(max_window, pool slots / streams open) slots at once (at least one), so
// memory is bounded by the pool whatever the request's size, and streams open at once share the pool evenly. A
// stream that finds no slot waits (slot_waits) and is served first when one frees: streams advance in open order.
// The disk: at most 3/4 of max_window reads are pending over all streams, taken in open order, so the oldest
// request's chunks go to the disk first and it finishes first (admission order) instead of every request finishing
// together at the end; a later stream's reads fill what the older ones leave of the budget (while an older stream
// waits for its consumers to copy a full window). Each pass settles every stream before starting any, so a read
// that ends in a younger stream frees budget for the oldest one, not for the younger stream again.
//
// Threads: every method is thread-safe (one internal mutex). A background thread advances the streams, woken by the
// pool's engine bell (consumers' acks; the engine rings it when a promotion's read ends) or every kIdlePoll while
// reads are pending. Close() may come from any thread once every consumer is done with the stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kvtier/engine.h"
#include "staging/staging_pool.h"

namespace kvtier {

struct StreamOptions {
  uint32_t max_window = 32;  // slots one stream holds at most (the engine's per-job bound, 2 x io_depth)
  uint32_t max_retries = 3;  // a load chunk evicted between its read and its pin is read again at most this often
  bool background = true;    // a thread advances the streams; false: only the owner's Pump() calls do
};

// A stream's range of board entries: chunk i is entry first_entry + i, carrying tag.
struct StreamSpan {
  uint64_t id = 0;
  uint32_t first_entry = 0;
  uint32_t count = 0;
  uint32_t tag = 0;
};

struct StreamProgress {
  uint32_t published = 0;  // chunks made ready for the consumers so far
  uint32_t failed = 0;     // chunks published as failed (load) or dropped (store)
  uint32_t skipped = 0;    // store chunks another writer covers
  uint32_t done = 0;       // chunks finished: acked by every consumer, failed or skipped
  bool finished = false;   // done == count
};

struct StreamStats {
  uint64_t loads_opened = 0;
  uint64_t stores_opened = 0;
  uint64_t chunks_loaded = 0;  // load chunks acked by every consumer
  uint64_t chunks_failed = 0;  // load chunks that failed mid-stream, store chunks dropped
  uint64_t chunks_stored = 0;  // store chunks committed
  uint64_t chunks_skipped = 0;
  uint64_t slot_waits = 0;   // a stream found no slot for its next chunk (it waits; not a failure)
  uint64_t board_full = 0;   // opens refused: the board had no room
  uint32_t peak_window = 0;  // most slots one stream held at once
  uint32_t open = 0;         // streams open now
};

class StreamPump {
 public:
  // pool maps the engine's staging pool (the engine's pool_name()); it must have a stream board.
  StreamPump(Engine* engine, std::unique_ptr<StagingPool> pool, StreamOptions options);
  ~StreamPump();  // stops the thread and closes every open stream
  StreamPump(const StreamPump&) = delete;
  StreamPump& operator=(const StreamPump&) = delete;

  // Opens a stream over keys (in order) for `consumers` consumers. kResourceExhausted: the board has no room now;
  // kInvalidArgument: no keys or no consumers.
  Result<StreamSpan> OpenLoad(std::span<const ChunkKey> keys, uint32_t consumers);
  Result<StreamSpan> OpenStore(std::span<const ChunkKey> keys, uint32_t consumers);
  // Ends a stream once its consumers are done with it: a load unpins what it still holds; a store commits the
  // chunks every consumer filled and gives back the slots of the others. Unknown ids are ignored.
  void Close(uint64_t id);
  // kNotFound for an unknown (or closed) id.
  Result<StreamProgress> Progress(uint64_t id);
  StreamStats stats();

  // Advances every stream once: settles each (reads that ended, acks), then starts chunks in open order. The
  // background thread does this; without it (StreamOptions::background false) the owner does.
  void Pump();

  static constexpr std::chrono::microseconds kIdlePoll{500};  // re-check pending reads at least this often

 private:
  enum class ChunkStep : uint8_t { kIdle, kPromoting, kPublished, kDone };
  struct Chunk {
    ChunkKey key;
    ChunkStep step = ChunkStep::kIdle;
    uint8_t retries = 0;
  };
  struct Stream {
    StreamSpan span;
    bool load = true;
    uint32_t consumers = 1;
    std::vector<Chunk> chunks;
    uint32_t next = 0;        // first chunk not started yet
    uint32_t first_open = 0;  // chunks before it are done: the settle pass starts here
    uint32_t held = 0;        // chunks holding a slot: promoting, or published and not yet acked by every consumer
    StreamProgress progress;
  };

  Result<StreamSpan> Open(std::span<const ChunkKey> keys, uint32_t consumers, bool load);
  uint32_t WindowLocked() const;
  // A pass over the streams settles every one (reads that ended, acks), then starts chunks in open order, so a read
  // budget freed by any stream goes to the oldest stream that can use it.
  bool SettleLoadLocked(Stream& s);  // true while a read is pending
  void SettleStoreLocked(Stream& s);
  bool StartLoadsLocked(Stream& s);  // true when it left a read pending
  void StartStoresLocked(Stream& s);
  void AdvanceFirstOpen(Stream& s);
  void PublishLoadLocked(Stream& s, uint32_t i, SlotRef ref);
  void FailLocked(Stream& s, uint32_t i, StreamEntryState state);
  void FinishLocked(Stream& s, uint32_t i);
  void ReleaseLocked(Stream& s);
  std::optional<uint32_t> AllocateEntriesLocked(uint32_t count);
  void Run();

  Engine* const engine_;
  const std::unique_ptr<StagingPool> pool_;
  const StreamOptions options_;

  std::mutex mu_;
  std::map<uint64_t, Stream> streams_;       // by id: open order
  std::map<uint32_t, uint32_t> board_used_;  // first entry -> count
  uint64_t next_id_ = 1;
  uint32_t next_tag_ = 1;
  StreamStats stats_;
  bool pending_reads_ = false;
  uint32_t reading_ = 0;  // load chunks promoting over all streams (<= max_window: the disk's order, see above)

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvtier
