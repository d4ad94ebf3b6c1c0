// EngineImpl: the engine behind include/kvtier/engine.h. Internal; see that header for the contract.
//
// Threads and ownership (docs/architecture.md, "Threads and ownership"):
// - reactors_: one Reactor per thread (src/engine/reactor.h), which owns its ring, queues, ops in flight and the
//   state machines of the chunks placed on it. Jobs are the engine's own: a promotion (one load chunk read into the
//   DRAM tier's slot) and a committed store (chunks written from theirs). A chunk's reactor is chosen when its job
//   is queued (ChunkPlacement: the reactor of the key's unfinished chunks if any, else the one with the fewest
//   unfinished chunks), so every step of a chunk runs on one thread, and every chunk of one key in flight on the
//   same one. Other threads reach a reactor through inbox_ (ReactorInbox, one mutex) and Reactor::Wake().
// - A Job is shared by its parts (one per reactor it has chunks on); its counters are atomics, and the reactor
//   whose chunk finishes last records its stats and trace.
// - disk_ (DiskIndex, src/engine/disk_index.h) is the disk index (published entries, LRU order, pins, negative cache,
//   pending stores, evictions in flight, byte counts) with a mutex of its own; it never sees the engine.
// - resident_ (ResidentSet, src/engine/resident_set.h) is the DRAM tier (resident map, replacement policy, preload
//   accounting) with a mutex of its own, and hands out every pool slot; it never sees the engine. Neither class is
//   called with the other's lock held.
// - budget_ (DiskBudget, src/engine/disk_budget.h) holds the namespace's usage against the budget, chooses eviction
//   victims from the index and runs the maintenance thread; it never sees the engine.
// - placement_ (ChunkPlacement, src/engine/placement.h) says which reactor runs each chunk in flight; outcomes_
//   (StoreOutcomes, src/engine/store_outcomes.h) keeps the outcomes of watched committed stores (WatchStore), which
//   the reactor that finishes a store chunk records. Each has a leaf mutex of its own.
// - pool_ is shared memory: slot data is touched by the reactors (I/O buffers) and by the consumers that copy out of
//   and into slots (vLLM's worker processes, JobClient's copy thread); the slot state words say who may
//   touch a slot when.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/disk_budget.h"
#include "engine/disk_index.h"
#include "engine/placement.h"
#include "engine/reactor.h"
#include "engine/resident_set.h"
#include "engine/store_outcomes.h"
#include "io/io_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "staging/staging_pool.h"
#include "stats/stats.h"
#include "tier/dram_tier.h"
#include "trace/trace_recorder.h"
#include "util/mutex.h"

namespace kvtier {

// Entries of the staging pool's stream board (streamed loads and stores, policy/stream_pump.h): one per chunk of
// every stream open at once; 512 KiB of shared memory.
inline constexpr uint32_t kStreamBoardEntries = 16384;

class EngineImpl final : public Engine {
 private:
  // Only the class's own factories construct it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  explicit EngineImpl(Passkey) {}
  // io: the I/O engine to use instead of the one options.backend selects (tests: fake, fault-injecting); the
  // engine then runs one reactor whatever options.reactors says.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, std::unique_ptr<IoEngine> io = nullptr);
  // io_factory(r): reactor r's I/O engine (tests with several reactors: one fault-injecting engine each).
  using IoFactory = std::function<std::unique_ptr<IoEngine>(uint32_t reactor)>;
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, IoFactory io_factory);
  // The reactor count an engine with these options runs (options.reactors, else the test default, else auto).
  static uint32_t ResolveReactors(const EngineOptions& options, std::string* why = nullptr);
  // What a test binary sets for every engine it opens (tests/support/engine_defaults.cc, from the environment
  // scripts/test.sh gives a whole suite run: KVTIER_TEST_REACTORS, KVTIER_TEST_READ_PIECE_BYTES); the engine reads
  // no environment itself. 0: unset. reactors replaces the automatic count (options.reactors 0); read_piece_bytes
  // replaces the default read_piece_bytes (an option set to another value keeps it); without_openat2 opens as on a
  // kernel without openat2 (O_NOFOLLOW, the fan-out directories a level at a time: K2). Set before engines open.
  struct TestDefaults {
    uint32_t reactors = 0;
    uint64_t read_piece_bytes = 0;
    bool without_openat2 = false;
  };
  static void SetTestDefaults(const TestDefaults& defaults);
  static TestDefaults GetTestDefaults();  // what SetTestDefaults set last (a test changes one and puts them back)
  // The reactor the unfinished chunks of `key` run on (ChunkPlacement::Placed; tests).
  std::optional<uint32_t> PlacedReactor(const ChunkKey& key);
  ~EngineImpl() override;

  ChunkLocation Lookup(const ChunkKey& key) override;
  size_t LookupPrefix(std::span<const ChunkKey> keys) override;
  Result<uint64_t> EvictToBudget() override;
  PromoteResult Promote(const ChunkKey& key, bool speculative) override;
  PromoteState Residency(const ChunkKey& key) override;
  bool Stored(const ChunkKey& key) override;
  void WatchStore(const ChunkKey& key) override;
  std::optional<Status> TakeStoreOutcome(const ChunkKey& key) override;
  Result<std::vector<SlotRef>> PinResident(std::span<const ChunkKey> keys) override;
  void Unpin(std::span<const ChunkKey> keys) override;
  Result<std::vector<std::optional<SlotRef>>> ReserveForStore(std::span<const ChunkKey> keys) override;
  void CommitStore(std::span<const ChunkKey> keys, bool success) override;
  void CountClientLoadStarted() override;
  void CountClientLoadEnded(bool all_ok, uint32_t chunks_loaded, uint64_t bytes_needed, int64_t latency_ns) override;
  StatsSnapshot Stats() const override;
  const EngineOptions& options() const override { return options_; }
  std::string Describe() const override;
  std::string pool_name() const override;
  uint64_t chunk_payload_bytes() const override { return files_.block_stride * options_.identity.blocks_per_chunk; }
  uint64_t block_stride() const override { return files_.block_stride; }
  uint32_t max_unused_preloads() const override { return resident_->max_unused_preloads(); }
  uint32_t reactors() const override { return static_cast<uint32_t>(reactors_.size()); }
  bool shared_root() const override { return files_.shared_root; }

 private:
  using Job = Reactor::Job;
  using Part = Reactor::Part;
  using Chunk = Reactor::Chunk;

  Status Init(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors);
  // Init's steps, in order. Nothing is written under the root before OpenNamespace (V4). OpenReport: what Describe
  // says about the choices made on the way.
  struct OpenReport {
    std::string backend_why, reactors_why, io_mode_why, filesystem;
    uint32_t reactor_depth = 0, demand_reserve = 0, orphan_pools_removed = 0;
  };
  Status InitFileModes(const EngineOptions& options);  // files_' modes and checksum key; the root's owner (K2)
  // I1: one I/O engine per reactor (into *ios); the placement.
  Status CreateIoEngines(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors,
                         OpenReport* report, std::vector<std::unique_ptr<IoEngine>>* ios);
  Status CreatePool(const EngineOptions& options, OpenReport* report);  // the staging pool and the DRAM tier
  // The namespace (created if new), direct I/O (I2), the filesystem's kind (M1), O_TMPFILE publication (L4).
  Status OpenNamespace(const EngineOptions& options, std::optional<DirectIoInfo> dio, OpenReport* report);
  Status BuildIndex(const EngineOptions& options);  // temporaries swept (L5), the disk index, the budget (C1)
  // The reactors, one per I/O engine, each given the parts above (Init starts them last: nothing fails after).
  void BuildReactors(std::vector<std::unique_ptr<IoEngine>> ios, uint32_t depth);
  std::string DescribeOpen(const EngineOptions& options, const OpenReport& report) const;
  // Queues a job of the engine's own: a promotion (one key, into the slot the DRAM tier gave it) or a committed
  // store (keys written from their slots), one Part per reactor it has chunks on (ChunkPlacement). kFailedPrecondition
  // once the engine is shutting down.
  Status Enqueue(JobKind kind, std::vector<ChunkKey> keys, std::vector<uint32_t> slots);
  // M3: how long a miss is remembered (shorter on a shared root: other hosts publish there).
  int64_t NegativeTtlNs() const;

  EngineOptions options_;
  std::string describe_;
  std::unique_ptr<Namespace> ns_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<TraceRecorder> trace_;
  mutable kvtier::Stats stats_;
  // How this engine reads and writes entry files on this root: settled at open, read-only after.
  EntryFiles files_;

  // How other threads hand the reactors their jobs' parts, and the stop.
  ReactorInbox inbox_;
  WritePlaces write_places_;              // EngineOptions::max_writes_at_disk, shared by the reactors (I1)
  std::atomic<uint64_t> next_job_id_{1};  // names jobs in traces

  std::vector<std::unique_ptr<Reactor>> reactors_;
  // I1: which reactor runs each chunk in flight.
  std::unique_ptr<ChunkPlacement> placement_;

  // The disk index (C1): published entries, LRU, negative cache, pending stores, evictions in flight.
  std::unique_ptr<DiskIndex> disk_;
  // Capacity (C1, M2): the usage against the budget, eviction's arithmetic, the maintenance thread.
  std::unique_ptr<DiskBudget> budget_;

  // The DRAM tier (T1): the resident map, its replacement policy and the preload accounting; every pool slot the
  // engine takes comes through it.
  std::unique_ptr<ResidentSet> resident_;

  // The outcomes of committed stores a committer watches (WatchStore).
  StoreOutcomes outcomes_;
};

}  // namespace kvtier
