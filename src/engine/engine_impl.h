// EngineImpl: the engine behind include/kvtier/engine.h. Internal; see that header for the contract.
//
// Threads and ownership (docs/architecture.md, "Threads and ownership"):
// - reactors_: one Reactor per thread. Reactor r alone touches its io, its parts (jobs), their chunks, its op
//   contexts, in-flight stores and data queue. Jobs are the engine's own: a promotion (one load chunk read into the
//   DRAM tier's slot) and a committed store (chunks written from theirs). A chunk's reactor is chosen when its job
//   is queued (ChunkPlacement: the reactor of the key's unfinished chunks if any, else the one with the fewest
//   unfinished chunks), so every step of a chunk runs on one thread, and every chunk of one key in flight on the
//   same one. Other threads reach a reactor through its command queue (commands_, guarded by cmd_mu_) and
//   io->Wake().
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
//   and into slots (vLLM's worker processes, policy::JobClient's copy thread); the slot state words say who may
//   touch a slot when.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/chunk_state.h"
#include "engine/disk_budget.h"
#include "engine/disk_index.h"
#include "engine/placement.h"
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
using staging::StagingPool;
using staging::StagingPoolOptions;
using trace::TraceRecorder;
}  // namespace kvtier

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
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                std::unique_ptr<io::IoEngine> io = nullptr);
  // io_factory(r): reactor r's I/O engine (tests with several reactors: one fault-injecting engine each).
  using IoFactory = std::function<std::unique_ptr<io::IoEngine>(uint32_t reactor)>;
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, IoFactory io_factory);
  // The reactor count an engine with these options runs (options.reactors, else the test default, else auto).
  static uint32_t ResolveReactors(const EngineOptions& options, std::string* why = nullptr);
  // What a test binary sets for every engine it opens (tests/support/engine_defaults.cc, from the environment
  // scripts/test.sh gives a whole suite run: KVTIER_TEST_REACTORS, KVTIER_TEST_READ_PIECE_BYTES); the engine reads
  // no environment itself. 0: unset. reactors replaces the automatic count (options.reactors 0); read_piece_bytes
  // replaces the default read_piece_bytes (an option set to another value keeps it). Set before engines open.
  struct TestDefaults {
    uint32_t reactors = 0;
    uint64_t read_piece_bytes = 0;
  };
  static void SetTestDefaults(const TestDefaults& defaults);
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
  uint32_t reactors() const override { return static_cast<uint32_t>(reactors_.size()); }
  bool shared_root() const override { return files_.shared_root; }

 private:
  struct Job;
  struct Part;
  struct Chunk;
  struct Reactor;

  // One I/O operation in flight; user_data of the IoOp is its id in the reactor's op_ctx. Each carries its own
  // completion handler (on_done), which OnCompletion calls after the bookkeeping every op shares (error counters,
  // the chunk's ops in flight) and before the chunk's place at the disk and resources are settled.
  enum class OpRole {  // names the op in traces and deadline messages
    kOpen,
    kStatx,
    kRead,
    kWrite,
    kFsync,
    kClose,
    kCloseBeforeLink,
    kLink,
    kUnlinkTmp,
    kUnlinkEvicted,
    kMkdir,
    kRmdirFanout,
    kChmod,
    kTouch
  };
  struct OpCtx;
  // A completion handler: a member function of the engine, called on the op's reactor with the op's context and
  // result (>= 0, or -errno). A handler of a chunk's op returns at once when the chunk has failed meanwhile, unless
  // the op's result still has to be taken (an open's fd).
  using OpHandler = void (EngineImpl::*)(Reactor& r, const OpCtx& ctx, int64_t res);
  struct OpCtx {
    OpRole role;
    Chunk* chunk = nullptr;       // null for ops of no chunk (evictions, directory removals, fire-and-forget)
    OpHandler on_done = nullptr;  // null: nothing to do when it is back (a close, a temporary's unlink)
    uint8_t* buf = nullptr;
    uint64_t len = 0;  // bytes still to transfer; kMkdir, kRmdirFanout, a fan-out kStatx or kChmod: the fan-out
                       // level (1: "ab", 2: "ab/cd")
    uint64_t offset = 0;
    int64_t deadline_ns = 0;
    std::string path;                 // kOpen / kLink (old) / kUnlink*
    std::string path2;                // kLink (new)
    ChunkKey key;                     // kUnlinkEvicted, kRmdirFanout
    bool late = false;                // passed its deadline; the chunk already failed
    bool errors_are_answers = false;  // a failure is not an I/O error (an rmdir's ENOTEMPTY)
    int64_t start_ns = 0;
    // kRead of a load: the blocks this read brings, relative to the chunk's first_block (piece_blocks 0: the
    // header alone), and whether the header is part of it.
    uint32_t piece_first = 0;
    uint32_t piece_blocks = 0;
    bool with_header = false;
  };
  struct DeferredOp {
    uint64_t id;
    io::IoOp op;
  };

  Status Init(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors);
  // Init's steps, in order. Nothing is written under the root before OpenNamespace (V4). OpenReport: what Describe
  // says about the choices made on the way.
  struct OpenReport {
    std::string backend_why, reactors_why, io_mode_why, filesystem;
    uint32_t reactor_depth = 0, demand_reserve = 0, orphan_pools_removed = 0;
  };
  Status InitFileModes(const EngineOptions& options);  // files_' modes and checksum key; the root's owner (K2)
  Status CreateReactors(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors,
                        OpenReport* report);  // I1: reactors, each with its I/O engine; the placement
  Status CreatePool(const EngineOptions& options, OpenReport* report);  // the staging pool and the DRAM tier
  // The namespace (created if new), direct I/O (I2), the filesystem's kind (M1), O_TMPFILE publication (L4).
  Status OpenNamespace(const EngineOptions& options, std::optional<io::DirectIoInfo> dio, OpenReport* report);
  Status BuildIndex(const EngineOptions& options);  // temporaries swept (L5), the disk index, the budget (C1)
  std::string DescribeOpen(const EngineOptions& options, const OpenReport& report) const;
  // Queues a job of the engine's own: a promotion (one key, into the slot the DRAM tier gave it) or a committed
  // store (keys written from their slots). kFailedPrecondition once the engine is shutting down.
  Status Enqueue(JobKind kind, std::vector<ChunkKey> keys, std::vector<uint32_t> slots);

  // Reactor r's thread; the methods below run on a chunk's reactor (Chunk::reactor) or the one named.
  void ReactorMain(Reactor& r);
  void StartWaitingChunks(Reactor& r);
  bool StartLoadChunk(Part& part, Chunk& c);
  bool StartStoreChunk(Part& part, Chunk& c);
  // I1/S1 across reactors: a committed store's chunk at the disk counts against its part's allowance (2 x its
  // reactor's depth) and its job's (2 x io_depth over all reactors). False: an allowance is used up (the reactor
  // is woken when the job's frees a place).
  bool TakeJobSlot(Part& part);
  void ReturnJobSlot(Chunk& c);
  void WakeWaiters(std::atomic<uint64_t>& mask);
  // An op came back: shared bookkeeping, then the op's own handler (OpCtx::on_done), then the chunk's settling.
  void OnCompletion(Reactor& r, const io::IoCompletion& cqe);
  // The ops' completion handlers (OpHandler).
  void OnOpenDone(Reactor& r, const OpCtx& ctx, int64_t res);
  // statx through the I/O engine into c.statx_buf (a synchronous fstat on the reactor stalled every chunk's I/O
  // on a slow mount): of c's open file (path empty: a load's, then OnStatxDone runs CheckOpenedChunk) or of a
  // fan-out directory at `level` (OnFanoutStatxDone).
  void SubmitStatx(Chunk& c, OpHandler on_done, std::string path = {}, uint64_t level = 0);
  void OnStatxDone(Reactor& r, const OpCtx& ctx, int64_t res);
  // K2: a store's temporary chmod'ed to files_.file_mode where the umask strips bits of it, before it is written.
  void OnTemporaryChmodDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnReadDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnWriteDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnFsyncDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnLinkDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnUnlinkEvictedDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnRmdirFanoutDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void TraceTransfer(Reactor& r, const OpCtx& ctx, int64_t res, const char* name);
  void CheckDeadlines(Reactor& r);
  void SubmitOp(Reactor& r, OpCtx ctx, io::IoOp op);
  void RetryDeferredOps(Reactor& r);
  void BeginStoreWrite(Chunk& c);
  void OpenTemporary(Chunk& c);
  // A store's fan-out directory that this engine has not created or seen yet: mkdirat through the I/O engine, one
  // level at a time (a synchronous mkdir on the reactor held every other chunk's I/O for its whole duration);
  // OnMkdirDone continues with the next level, then OpenTemporary.
  void SubmitMkdir(Chunk& c, int level);
  void OnMkdirDone(Reactor& r, const OpCtx& ctx, int64_t res);
  // After mkdir: the new directory chmod'ed to dir_mode where the umask strips bits (K2); or, where it existed,
  // its statx: a real directory others cannot write to (K2), else asked again (M1) or refused.
  void OnFanoutChmodDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void OnFanoutStatxDone(Reactor& r, const OpCtx& ctx, int64_t res);
  // Fan-out level `level` (1: "ab", 2: "ab/cd") exists and is checked: the next level, or the temporary.
  void FanoutLevelReady(Chunk& c, int level);
  static constexpr uint8_t kMkdirRetries = 5;
  // C1, M1: a store whose fan-out directory vanished under it (eviction or gc removed it empty, here or on another
  // host: ENOENT at mkdir, open or link, EPERM for O_TMPFILE in a directory being removed) creates it again and
  // goes on (an anonymous temporary that is written is linked, anything else opened again), up to this many times.
  static constexpr uint8_t kVanishedDirRetries = 16;
  bool RetryAfterVanishedDir(Chunk& c);
  // C1: after an eviction's unlink, removes the entry's fan-out directory and then its first level if empty
  // (unlinkat AT_REMOVEDIR through r's ring; ENOTEMPTY leaves it).
  void SubmitRmdirFanout(Reactor& r, const ChunkKey& key, int level);
  void Settle(Chunk& c);
  void ForgetEntry(const ChunkKey& key);
  static const char* OpRoleName(OpRole r);
  void SubmitRead(Chunk& c, uint8_t* buf, uint64_t len, uint64_t offset, uint32_t piece_first = 0,
                  uint32_t piece_blocks = 0, bool with_header = false);
  // Loads: the next piece of c's blocks to the disk (false: none left); a landed piece is verified at once while
  // more of the chunk is still to come (the last one in LoadReadsDone, after the next chunk's reads are queued).
  void SubmitNextPiece(Chunk& c);  // the chunk's next piece; call only while PiecesToAsk(c)
  void PieceLanded(Chunk& c, const OpCtx& ctx);
  Status VerifyPiece(Chunk& c, uint32_t first, uint32_t n);
  // A load that failed verification: removed as corrupt (K1), or left in place as a miss when young on a shared root
  // (M1) or keyed for another secret in a namespace whose MANIFEST does not record its key (K3, OtherSecret).
  void FailVerification(Chunk& c, const Status& verdict);
  // K3 (docs/file-format.md, "A MANIFEST without checksum_key"): c's header, not decoded, was refused only for its
  // keying (KeyedForAnotherReader) in a namespace whose MANIFEST records no checksum_key: written by an engine with
  // another secret (or none), which this one cannot tell from the right one there.
  bool OtherSecret(const Chunk& c) const;
  void SubmitWrite(Chunk& c, uint8_t* buf, uint64_t len, uint64_t offset);
  void SubmitClose(Reactor& r, int fd);
  void LoadReadsDone(Chunk& c);
  // Verifies the loads whose reads came back in this reactor iteration, after every completion has been handled
  // and the freed places at the disk have been refilled (PumpData + Flush): the disk never waits for checksums.
  void VerifyReadChunks(Reactor& r);
  void StoreWritesDone(Chunk& c);
  // M1: a named temporary is closed, and the close has come back, before its link is submitted: on network and
  // FUSE filesystems the close pushes the data to the servers, and a name linked first is a 0-byte file to other
  // hosts. OnCloseBeforeLinkDone continues with SubmitLink (or fails the chunk: a failed close is a failed write).
  void SubmitCloseBeforeLink(Chunk& c);
  void OnCloseBeforeLinkDone(Reactor& r, const OpCtx& ctx, int64_t res);
  void SubmitLink(Chunk& c);
  // M1: on a shared root an entry that fails verification while young (mtime within temp_max_age_s) may be another
  // host's publication whose data this client cannot see yet: a miss, never removed (fsck and gc remove it by age).
  bool YoungOnSharedRoot(const Chunk& c) const;
  // M3: how long a miss is remembered (shorter on a shared root: other hosts publish there).
  int64_t NegativeTtlNs() const;
  // M3: a verified load of an entry whose mtime is older than touch_interval_s sets it to now (kUtimensAt), and
  // the index learns the new mtime (OnTouchDone).
  void MaybeTouchEntry(const Chunk& c);
  void OnTouchDone(Reactor& r, const OpCtx& ctx, int64_t res);
  // Moves c to state `to`; in debug builds an illegal move (LegalChunkTransition) aborts naming both states.
  void SetState(Chunk& c, ChunkState to);
  // Finishes c as failed (kFailed) with status; a no-op for a finished chunk.
  void FailChunk(Chunk& c, Status status);
  // Finishes c: kSucceeded, or kFailed when its status says so; the job's last chunk publishes the result.
  void FinishChunk(Chunk& c);
  // Every chunk of job has finished: record stats and trace.
  void PublishJob(Job& job);
  // Counts, forgets and removes a bad entry (an empty directory too; a non-empty one stays and misses each time).
  // opened_ino: the inode the load verified (0: unknown); the name is removed only while it still points at it, so
  // a good entry republished under the name meanwhile stays (M1).
  // trace_reactor: the reactor whose trace row gets the corrupt_entry mark.
  void QuarantineCorrupt(uint32_t trace_reactor, const ChunkKey& key, const std::string& rel_path, const Status& why,
                         uint64_t opened_ino = 0);
  // A load's freshly opened chunk (sx: its statx): a regular file of exactly a chunk's size (else kCorrupt);
  // clears the O_NONBLOCK the open used.
  Status CheckOpenedChunk(int fd, const struct statx& sx) const;
  bool RetryStoreAfterEnospc(Chunk& c);
  // linked: this engine's link() created the entry and its bytes were not reserved in the budget's usage yet (see
  // Chunk::usage_reserved); false: EEXIST (another writer's entry) or already reserved.
  void PublishIndexed(Reactor& r, const ChunkKey& key, uint64_t bytes, bool linked = true);
  // C1: usage above the high watermark evicts LRU entries down to the low one (unlinks through r's ring).
  void EvictAboveHighWatermark(Reactor& r);
  void PumpData(Reactor& r);
  // Asks the disk for more pieces of the reactor's loads, oldest chunk first, while fewer than its piece budget of
  // reads are at the disk (docs/architecture.md, "Reads in pieces").
  void FillPieces(Reactor& r);
  // A load in its data phase whose later pieces wait for the reactor's piece budget.
  static bool PiecesToAsk(const Chunk& c);
  // Queues the chunk behind every chunk admitted before it (usually at the back: opens mostly come back in order).
  static void InsertByAdmission(std::deque<Chunk*>& q, Chunk* c);
  void EndDataPhase(Chunk& c);  // starts queued chunks' data reads/writes while fewer than io_depth are at the disk
  int64_t Deadline() const;

  EngineOptions options_;
  std::string describe_;
  std::unique_ptr<Namespace> ns_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<TraceRecorder> trace_;
  mutable kvtier::Stats stats_;
  // How this engine reads and writes entry files on this root: settled at open, read-only after.
  struct EntryFiles {
    uint64_t block_stride = 0;
    uint64_t slot_bytes = 0;    // kHeaderBytes + payload: an entry file's size
    int open_flags = 0;         // O_DIRECT when direct I/O is on
    uint64_t open_resolve = 0;  // RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has openat2 (K2)
    std::unique_ptr<ChecksumKey> checksum_key;  // K3: set when options.checksum_secret is
    mode_t file_mode = 0640;
    bool chmod_files = false;  // the process umask strips bits of file_mode: chmod each new temporary
    bool chmod_dirs = false;   // ... of dir_mode: chmod each new fan-out directory
    // L4 with an anonymous temporary: O_TMPFILE in the fan-out directory, write, linkat() it into place. A crash
    // leaves nothing behind and publication costs one metadata operation fewer. Probed at open; named temporaries
    // (create, write, link, unlink) where the filesystem lacks O_TMPFILE.
    bool tmpfile_publish = false;
    // M1: the root is on a filesystem several hosts mount (network, cluster, FUSE: src/layout/shared_fs.h), probed
    // at open. Anonymous temporaries are fsync'ed before linkat there; young bad entries are misses, not removed.
    bool shared_root = false;
  };
  EntryFiles files_;

  // Commands from other threads: reactor r's queue of new parts, commands_[r], and stop_. One mutex for all the
  // queues, so a job's parts are queued on every reactor in one order (FIFO across jobs).
  Mutex cmd_mu_;
  std::vector<std::deque<std::unique_ptr<Part>>> commands_ GUARDED_BY(cmd_mu_);
  bool stop_ GUARDED_BY(cmd_mu_) = false;
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

// Shared by the job's parts (shared_ptr); what several reactors write is atomic, the rest is set before queueing.
struct EngineImpl::Job {
  uint64_t id = 0;
  JobKind kind = JobKind::kLoad;
  int64_t start_ns = 0;
  std::vector<std::unique_ptr<Chunk>> chunks;  // request order; chunk i is touched only by its reactor
  std::atomic<uint32_t> slots_held{0};         // stores: chunks started, <= 2 x io_depth over all reactors (I1, S1)
  std::atomic<uint64_t> slot_waiters{0};       // reactors (bit r) that found slots_held at its limit
  std::atomic<uint32_t> unfinished{0};         // the reactor that brings it to 0 publishes the result
  std::atomic<uint64_t> bytes{0};
};

// The chunks of one job that one reactor handles, in request order. Reactor-only.
struct EngineImpl::Part {
  std::shared_ptr<Job> job;
  std::vector<Chunk*> chunks;
  size_t next_to_start = 0;
  uint32_t slots_held = 0;  // <= 2 x the reactor's depth
};

struct EngineImpl::Chunk {
  Job* job = nullptr;
  Part* part = nullptr;
  Reactor* reactor = nullptr;
  size_t index = 0;
  ChunkKey key;
  uint32_t first_block = 0;  // loads: the blocks read (a promotion reads the whole chunk)
  uint32_t num_blocks = 0;
  ChunkState state = ChunkState::kQueued;  // changed only by EngineImpl::SetState (src/engine/chunk_state.h)
  Status status;                           // set when the chunk fails (kFailed); Ok otherwise
  // The DRAM tier's slot (T1): a load reads into it, a store writes from it; it stays resident either way.
  uint32_t slot = 0;
  uint32_t slot_gen = 0;          // loads: the fill's generation (StagingPool::BeginFill)
  bool ready = false;             // loads: verified and published ready in the slot
  bool counts_job_slot = false;   // this chunk counts against job->slots_held and part->slots_held
  bool counts_committed = false;  // a committed store counted in its reactor's committed_started
  bool pinned = false;            // loads: index entry pinned against eviction
  int fd = -1;
  uint32_t ops_in_flight = 0;
  std::string rel_path;
  std::string tmp_path;
  bool tmp_exists = false;     // a named temporary to remove
  bool tmp_anonymous = false;  // O_TMPFILE: the fd is the only name until linkat
  bool enospc_retried = false;
  bool usage_reserved = false;  // C1: a store's bytes are counted in the shared usage from its first write on,
                                // so instances evict before the files exist rather than after
  uint8_t dir_retries = 0;      // RetryAfterVanishedDir
  uint8_t mkdir_retries = 0;    // M1: EEXIST from mkdir, then ENOENT from stat (another host's mkdir in flight)
  std::unique_ptr<struct statx> statx_buf;  // SubmitStatx's answer: a load's open file, a store's fan-out dir
  uint64_t opened_ino = 0;                  // loads: the file's inode and mtime at open (M1)
  int64_t opened_mtime_ns = 0;
  bool data_phase = false;  // holds a place at the disk: counted in its reactor's data_in_flight
  int64_t started_ns = 0;
  uint64_t admitted = 0;  // its reactor's admission order: the disk serves older chunks first (FillPieces)
  // Loads read in pieces (read_piece_bytes): blocks are relative to first_block.
  uint32_t piece_blocks = 0;            // blocks per piece
  uint32_t next_piece = 0;              // the first block not yet asked of the disk
  uint32_t pieces_at_disk = 0;          // piece reads in flight (short reads continue in the same piece)
  std::unique_ptr<ChunkHeader> header;  // decoded once it landed and checked (null: not yet, or bad)
  std::vector<bool> verified;           // per block: its checksum was checked as its piece landed
  std::vector<std::pair<uint32_t, uint32_t>> landed_unverified;  // pieces that landed before the header
};

// One reactor: one thread, one IoEngine (one io_uring ring, this thread its single issuer), and the state of the
// chunks assigned to it. Everything is touched by its thread only.
struct EngineImpl::Reactor {
  uint32_t index = 0;
  uint32_t depth = 0;  // chunks with data at the disk: ceil(io_depth / reactors) (I1)
  uint32_t trace_tid = 1;
  std::unique_ptr<io::IoEngine> io;
  std::thread thread;

  std::deque<std::unique_ptr<Part>> jobs;  // FIFO: earlier jobs get slots first
  std::unordered_map<uint64_t, OpCtx> op_ctx;
  uint64_t next_op_id = 1;
  std::unordered_map<ChunkKey, Chunk*, ChunkKeyHash> stores_in_flight;
  std::deque<DeferredOp> deferred_ops;
  // Both in admission order (Chunk::admitted), whatever order the opens came back in.
  std::deque<Chunk*> data_queue;   // chunks whose file is open, waiting for a data slot at the disk
  std::deque<Chunk*> piece_queue;  // loads in their data phase with pieces not yet asked for
  uint64_t next_admission = 1;
  uint32_t reads_at_disk = 0;     // reads submitted and not yet completed (FillPieces keeps <= 2 x depth)
  std::vector<Chunk*> read_done;  // loads whose reads finished this iteration, waiting for VerifyReadChunks
  uint32_t data_in_flight = 0;    // chunks with data reads/writes at the disk: <= depth (I1)
  // Committed stores (CommitStore) started and not yet settled, over all jobs: <= 2 x depth, so that many small
  // commits are checksummed no further ahead of the disk than one large one (StartStoreChunk).
  uint32_t committed_started = 0;
  FanoutDirCache fanout_cache;
};

}  // namespace kvtier
