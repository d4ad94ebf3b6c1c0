// Engine: kvtier's per-instance cache engine (scheduler side).
//
// An Engine owns a storage root's namespace, the in-memory index of published chunks, the staging pool in shared
// memory (the DRAM tier, T1), and EngineOptions::reactors reactor threads that drive all disk I/O (io_uring or POSIX,
// one ring each).
//
// Its job ends at the slot (docs/architecture.md, "One data path"): Promote reads and verifies a chunk into a pool
// slot; a worker process (vLLM's, or JobClient's copy thread for every other caller) copies it out of the
// slot and unpins it. ReserveForStore hands out slots a worker fills; CommitStore writes and publishes them.
//
// Threads: every public method is thread-safe. Lookup runs on the caller's thread against the index (and, for
// keys the index does not know, one stat of the chunk's file). Promotions and committed stores are queued to the
// reactors (each chunk to one reactor, which alone does its I/O: where the same key's unfinished chunks are, else the
// least busy).
//
// Data path of a promotion: open the chunk file, read its header and blocks into the slot (in pieces of
// read_piece_bytes), verify the header and each block's checksum, mark the slot ready. A committed store: header and
// checksums over the slot, write a uniquely named (or anonymous) temporary beside the final name, link() it into place
// (first writer wins); the slot stays resident.
//
// Failure model: a missing, corrupt, foreign, late or unreadable chunk is a miss for that chunk, never wrong bytes.
// A store that cannot be written is dropped and counted. Neither stops the engine.
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

enum class ChunkLocation { kAbsent, kDisk, kPending, kDram };

class Engine {
 public:
  // Opens (creating if needed) the namespace for options.identity under options.root. Fails with a message naming
  // the problem: a missing or read-only root, another identity's manifest, a bad option.
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options);

  virtual ~Engine() = default;  // waits for in-flight I/O, then stops the reactor

  // Where a chunk is. kPending: a store of it is in flight. Never blocks on I/O beyond one stat.
  virtual ChunkLocation Lookup(const ChunkKey& key) = 0;
  // The number of leading keys that are present (kDisk), the longest cached prefix.
  virtual size_t LookupPrefix(std::span<const ChunkKey> keys) = 0;

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
  // The outcome of a committed store, for a committer that reports its stores (JobClient). WatchStore(key),
  // called before the CommitStore that writes key (a client: before it acks the slot its stream's pump commits),
  // asks the engine to keep that store's outcome; TakeStoreOutcome then answers nullopt while the store is not
  // committed or still in flight, and then once: Ok (written and published, or an entry already published covered
  // it) or why it was dropped (kFailedPrecondition: the commit gave up, reserved nothing, or the engine was shutting
  // down; else the write's error), which it forgets. The answer is the store's own: an eviction of the entry after
  // its publish does not change it (Stored does). One watch per key at a time (ReserveForStore grants one slot per
  // key); watching a key again forgets what was kept for it; a watch nobody takes stays until the engine closes.
  // Thread-safe.
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

  // The job API's loads (JobClient, a client of the slot path) in the engine's counters, so that Stats()
  // shows them beside the promotions they made: a load job started, and one that ended (all_ok: every chunk
  // loaded; chunks_loaded of them; bytes_needed: the payload bytes its chunks asked for; latency_ns: submit to end).
  virtual void CountClientLoadStarted() = 0;
  virtual void CountClientLoadEnded(bool all_ok, uint32_t chunks_loaded, uint64_t bytes_needed, int64_t latency_ns) = 0;

  // Enforce the disk budget now (down to the low watermark). Returns bytes evicted.
  virtual Result<uint64_t> EvictToBudget() = 0;

  virtual StatsSnapshot Stats() const = 0;
  virtual const EngineOptions& options() const = 0;
  // Facts decided at open: I/O backend and mode, DIO alignment, pool name and geometry, index size.
  virtual std::string Describe() const = 0;
  virtual std::string pool_name() const = 0;
  virtual uint64_t chunk_payload_bytes() const = 0;  // blocks_per_chunk * block stride
  virtual uint64_t block_stride() const = 0;
  // Slots that resident preloads no demand load has used yet may hold at most (R2): half of the pool's slots beyond
  // the demand reserve, at least 1. A request with more chunks than this can never be read ahead completely.
  virtual uint32_t max_unused_preloads() const = 0;
  // Reactor threads this engine runs (EngineOptions::reactors resolved: auto, or the option).
  virtual uint32_t reactors() const = 0;
  // Whether the open found the root on a file system several hosts mount (layout/shared_fs.h, M1): young bad
  // entries are then misses rather than removed, and publication syncs before linking.
  virtual bool shared_root() const = 0;
};

}  // namespace kvtier
