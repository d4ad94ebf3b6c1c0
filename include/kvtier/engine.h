// Engine: kvtier's per-instance cache engine (scheduler side).
//
// An Engine owns a storage root's namespace, the in-memory index of published chunks, the staging pool in shared
// memory, and EngineOptions::reactors reactor threads that drive all disk I/O (io_uring or POSIX, one ring each)
// and the device copier.
//
// Threads: every public method is thread-safe. Lookup runs on the caller's thread against the index (and, for
// keys the index does not know, one stat of the chunk's file). Load and store jobs are queued to the reactors (each
// chunk to one reactor, which alone does its I/O: where the same key's unfinished chunks are, else the least busy); a job's result comes back through
// PollCompleted() or Wait() once all its chunks have finished.
//
// Data path of a load, per chunk: acquire a staging slot (never more than 2 x io_depth slots per job at once, so a
// job larger than the pool streams through it), open the chunk file, read its header and only the GPU blocks
// asked for, verify the header and each block's checksum, mark the slot ready, hand it to the device copier, and
// release the slot when the copy completes. Chunks of a job are copied out concurrently (one copier lane per
// reactor): their destinations must not overlap. A store is the reverse: copy into a slot, write a uniquely named
// temporary beside the final name, link() it into place (first writer wins), release the slot.
//
// Failure model: a missing, corrupt, foreign, late or unreadable chunk is a miss for that chunk (ChunkOutcome),
// never wrong bytes. A store that cannot be written is dropped and counted. Neither stops the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/options.h"
#include "kvtier/stats.h"
#include "kvtier/status.h"
#include "kvtier/transfer_types.h"

namespace kvtier {

class DeviceCopier;  // src/transfer/device_copier.h

using JobId = uint64_t;

struct ChunkTransfer {
  ChunkKey key;
  uint32_t first_block = 0;   // loads: first GPU block of the chunk needed (X3); stores: must be 0
  uint32_t num_blocks = 0;    // 0: through the end of the chunk; stores always write whole chunks
  std::vector<CopySegment> segments;
};

struct ChunkOutcome {
  ChunkKey key;
  Status status;  // Ok, or why the chunk was a miss (loads) or dropped (stores)
};

struct JobResult {
  JobId id = 0;
  JobKind kind = JobKind::kLoad;
  uint32_t chunks_ok = 0;
  std::vector<ChunkOutcome> chunks;  // in request order
  uint64_t bytes = 0;                // payload bytes read or written
  int64_t latency_ns = 0;
  bool all_ok() const { return chunks_ok == chunks.size(); }
};

enum class ChunkLocation { kAbsent, kDisk, kPending, kDram };

class Engine {
 public:
  // Opens (creating if needed) the namespace for options.identity under options.root. Fails with a message naming
  // the problem: a missing or read-only root, another identity's manifest, a bad option. The host (memcpy) copier
  // is used unless one is given.
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options, std::unique_ptr<DeviceCopier> copier);

  virtual ~Engine() = default;  // waits for in-flight I/O, then stops the reactor

  // Where a chunk is. kPending: a store of it is in flight. Never blocks on I/O beyond one stat.
  virtual ChunkLocation Lookup(const ChunkKey& key) = 0;
  // The number of leading keys that are present (kDisk), the longest cached prefix.
  virtual size_t LookupPrefix(std::span<const ChunkKey> keys) = 0;

  // Queue a job; returns its id at once. Requests are validated (block ranges, segment bounds) before queueing.
  virtual Result<JobId> SubmitLoad(std::vector<ChunkTransfer> chunks) = 0;
  virtual Result<JobId> SubmitStore(std::vector<ChunkTransfer> chunks) = 0;

  // Completed jobs since the last call (non-blocking). A job is reported exactly once, by this or by Wait.
  virtual std::vector<JobResult> PollCompleted() = 0;
  // Waits up to timeout_ms for job id; kTimedOut if it is still running, kNotFound if unknown or already reported.
  virtual Result<JobResult> Wait(JobId id, int64_t timeout_ms) = 0;

  // --- Slot-resident chunks: the DRAM tier (T1, T2) and the path of vLLM's worker processes ------------------
  // A chunk becomes resident in a staging slot when Promote reads and verifies it, or when a worker process fills a
  // slot reserved by ReserveForStore and CommitStore writes it out. Resident chunks are kept in LRU order and give
  // their slot back when a slot is needed; pinned ones never do (T1).

  // Non-blocking. kReady: verified bytes are in ref's slot. kPending: a read is in flight; ask again later.
  // kMiss: not on disk, failed verification, or no slot could be had (speculative promotions never take the
  // demand reserve, S2).
  virtual PromoteResult Promote(const ChunkKey& key, bool speculative) = 0;
  // Where a chunk stands in the DRAM tier, without touching its recency or any counter (the preload planner polls
  // its reads with it). kReady: resident and readable; kPending: being read or filled; kMiss: not resident.
  virtual PromoteState Residency(const ChunkKey& key) = 0;
  // Whether the disk index holds key as published. No counters, no recency, no file system access (a stream asks
  // it to tell "no slot free now" from "gone" after a promotion found no room).
  virtual bool Stored(const ChunkKey& key) = 0;
  // The outcome of a committed store, for a committer that reports its stores (policy::JobClient). WatchStore(key),
  // called before the CommitStore that writes key (a client: before it acks the slot its stream's pump commits),
  // asks the engine to keep that store's outcome; TakeStoreOutcome then answers nullopt while the store is not
  // committed or still in flight, and then once: Ok (written and published, or an entry already published covered
  // it) or why it was dropped (kFailedPrecondition: the commit gave up, reserved nothing, or the engine was shutting
  // down; else the write's error), which it forgets. The answer is the store's own: an eviction of the entry after
  // its publish does not change it (Stored does). One watch per key at a time (ReserveForStore grants one slot per
  // key); watching a key again forgets what was kept for it; a watch nobody takes stays until the engine closes.
  // Only committed stores (the slot path) answer, not the job API's. Thread-safe.
  virtual void WatchStore(const ChunkKey& key) = 0;
  virtual std::optional<Status> TakeStoreOutcome(const ChunkKey& key) = 0;
  // Pins resident chunks for a transfer (a pinned slot is never evicted or reused). kNotFound names the first key
  // that is not resident and ready; nothing is pinned then.
  virtual Result<std::vector<SlotRef>> PinResident(std::span<const ChunkKey> keys) = 0;
  virtual void Unpin(std::span<const ChunkKey> keys) = 0;
  // Reserves one slot per key for a worker to fill. An entry is nullopt when no write is needed (the key is
  // already stored, resident, or being stored). kResourceExhausted when the pool cannot hold them all now (nothing
  // is reserved then; the caller retries later).
  virtual Result<std::vector<std::optional<SlotRef>>> ReserveForStore(std::span<const ChunkKey> keys) = 0;
  // The worker filled the reserved slots of keys (success) or gave up (!success: the slots are released). On
  // success the chunks are written and published asynchronously and stay resident (write-through DRAM tier).
  virtual void CommitStore(std::span<const ChunkKey> keys, bool success) = 0;

  // Enforce the disk budget now (down to the low watermark). Returns bytes evicted.
  virtual Result<uint64_t> EvictToBudget() = 0;

  virtual StatsSnapshot Stats() const = 0;
  virtual const EngineOptions& options() const = 0;
  // Facts decided at open: I/O backend and mode, DIO alignment, pool name and geometry, index size.
  virtual std::string Describe() const = 0;
  virtual std::string pool_name() const = 0;
  virtual uint64_t chunk_payload_bytes() const = 0;  // blocks_per_chunk * block stride
  virtual uint64_t block_stride() const = 0;
  // Reactor threads this engine runs (EngineOptions::reactors resolved: auto, option or KVTIER_TEST_REACTORS).
  virtual uint32_t reactors() const = 0;
  // Whether the open found the root on a file system several hosts mount (layout/shared_fs.h, M1): young bad
  // entries are then misses rather than removed, and publication syncs before linking.
  virtual bool shared_root() const = 0;
};

}  // namespace kvtier
