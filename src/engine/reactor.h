// Reactor: one thread, one IoEngine (one io_uring ring, this thread its single issuer), and the chunks placed on it
// (docs/architecture.md, "Threads and ownership"). It owns its ring, its queues, its table of ops in flight and the
// state machines of its chunks: the loop, ops, completions, deadlines and every chunk's end in reactor.cc, the
// promotion's machine in load.cc, the committed store's in store.cc (states: src/engine/chunk_state.h).
//
// Contract: the engine (EngineImpl) builds its reactors once everything they use is open, then Start()s them. Other
// threads give a reactor work only through the ReactorInbox (a Part of a Job, under the inbox's mutex) and Wake();
// everything else of a reactor, its chunks included, is touched by its own thread only. A Job is shared by its parts
// on several reactors: what they write of it is atomic, and the reactor whose chunk finishes last publishes it.
// Join() returns once the inbox says stop and every part has settled (no op of it in flight).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "engine/chunk_state.h"
#include "engine/disk_budget.h"
#include "engine/disk_index.h"
#include "engine/entry_files.h"
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
#include "trace/trace_recorder.h"
#include "util/mutex.h"

namespace kvtier {

struct ReactorInbox;
struct WritePlaces;

class Reactor {
 public:
  // A job of the engine's own, in one Part per reactor it has chunks on: a promotion (one key read into the slot the
  // DRAM tier gave it) or a committed store (keys written from their slots).
  struct Job;
  struct Part;
  struct Chunk;
  struct LoadState;   // a load's own part of its Chunk
  struct StoreState;  // a store's own part of its Chunk
  struct Quarantine;

  // The engine's parts a reactor uses besides its own state; owned by the engine, which outlives its reactors.
  struct Parts {
    const EngineOptions* options = nullptr;
    const EntryFiles* files = nullptr;
    Namespace* ns = nullptr;
    StagingPool* pool = nullptr;
    TraceRecorder* trace = nullptr;  // null: no trace
    kvtier::Stats* stats = nullptr;
    DiskIndex* disk = nullptr;
    DiskBudget* budget = nullptr;
    ResidentSet* resident = nullptr;
    ChunkPlacement* placement = nullptr;
    StoreOutcomes* outcomes = nullptr;
    ReactorInbox* inbox = nullptr;
    WritePlaces* writes = nullptr;  // null: writes take any place at the disk
    // Every reactor of the engine, this one included (a job's slot returned wakes the reactors waiting for one).
    const std::vector<std::unique_ptr<Reactor>>* peers = nullptr;
  };

  // index: this reactor's place in parts.peers; depth: its chunks with data at the disk at once (I1).
  Reactor(const Parts& parts, uint32_t index, uint32_t depth, std::unique_ptr<IoEngine> io);
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;
  ~Reactor() { Join(); }  // the engine has said stop (ReactorInbox::stop) and woken it first

  void Start();  // the thread (kvtier's signal mask: src/util/thread.h)
  void Wake() { io_->Wake(); }
  void Join();
  uint32_t index() const { return index_; }
  const IoEngine& io() const { return *io_; }

 private:
  // One I/O operation in flight; user_data of the IoOp is its id in ops_. Each op is a typed completion (Seastar's
  // io_completion is the model): what its handler needs when it comes back is a value of the op's own argument type
  // (Transfer, Named, ...), and Submit<handler> checks when it is compiled that the handler takes exactly that type.
  // OnCompletion does the bookkeeping every op shares (error counters, the chunk's ops in flight), then calls the
  // handler, then settles the chunk's place at the disk and its resources.
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
    kUnlinkCorrupt,
    kMkdir,
    kRmdirFanout,
    kChmod,
    kTouch
  };
  // The ops' argument types. Bind puts what the kernel needs of them into the IoOp; the strings live in the op's
  // entry in ops_ (an unordered_map node: it does not move), so the IoOp may point into them.
  struct NoArgs {  // the chunk's fd is all it needs (an fsync, a load's statx, a close)
    void Bind(IoOp&) const {}
  };
  struct Transfer {  // kRead, kWrite: the bytes still to move
    uint8_t* buf = nullptr;
    uint64_t len = 0;
    uint64_t offset = 0;
    // A load's read: the blocks it brings, relative to the chunk's first_block (piece_blocks 0: the header alone),
    // and whether the header is part of it.
    uint32_t piece_first = 0;
    uint32_t piece_blocks = 0;
    bool with_header = false;
    void Bind(IoOp& io) const;
  };
  struct Named {  // one name, under the op's dirfd: an entry or temporary opened, stat'ed or unlinked
    std::string path;
    void Bind(IoOp& io) const { io.path = path.c_str(); }
  };
  struct FanoutDirOp {  // a fan-out directory made, chmod'ed, stat'ed, opened or removed
    std::string path;   // "ab" (level 1) or "ab/cd" (level 2), under the namespace; "cd" under "ab"'s fd
    int level = 0;
    ChunkKey key;  // the entry it is the directory of
    void Bind(IoOp& io) const { io.path = path.c_str(); }
  };
  struct LinkNames {  // kLink: the temporary (or /proc/self/fd/N of an anonymous one) and the entry's name
    std::string from;
    std::string to;
    void Bind(IoOp& io) const {
      io.path = from.c_str();
      io.path2 = to.c_str();
    }
  };
  struct EntryOp {  // an entry of the index: evicted (its bytes leave the budget when it is gone) or touched (M3)
    ChunkKey key;
    std::string path;
    uint64_t bytes = 0;
    void Bind(IoOp& io) const { io.path = path.c_str(); }
  };
  struct ThenUnlink {  // a close after which the named temporary is unlinked (the close itself takes no path)
    std::string tmp;
    void Bind(IoOp&) const {}
  };
  using OpArgs = std::variant<NoArgs, Transfer, Named, FanoutDirOp, LinkNames, EntryOp, ThenUnlink>;
  struct Op;
  // Calls the op's handler with its own arguments (Submit makes one per handler).
  using Completion = void (*)(Reactor& r, const Op& op, int64_t res);
  // What every op has. A handler of a chunk's op returns at once when the chunk has failed meanwhile, unless the
  // op's result still has to be taken (an open's fd, a link that made the entry).
  struct Op {
    OpRole role = OpRole::kOpen;
    Chunk* chunk = nullptr;  // null for ops of no chunk (evictions above the watermark, directory removals,
                             // fire-and-forget closes and unlinks); an ENOSPC retry's removals are its chunk's
    int64_t deadline_ns = 0;
    bool errors_are_answers = false;  // a failure is not an I/O error (an rmdir's ENOTEMPTY)
    bool late = false;                // passed its deadline; the chunk already failed
    int64_t start_ns = 0;
    OpArgs args;
    Completion complete = nullptr;
  };
  // A handler of ops with arguments A: void (Reactor::*)(const Op&, const A&, int64_t res), res >= 0 or -errno.
  template <class H>
  struct HandlerOf;
  template <class A>
  struct HandlerOf<void (Reactor::*)(const Op&, const A&, int64_t)> {
    using Args = A;
  };
  template <auto kHandler>
  using ArgsOf = typename HandlerOf<decltype(kHandler)>::Args;
  // For ops whose result nobody waits for (a close, a temporary's unlink).
  template <class A>
  void Ignore(const Op&, const A&, int64_t) {}
  struct DeferredOp {
    uint64_t id;
    IoOp op;
  };

  // The loop (reactor.cc).
  void Run();
  void StartWaitingChunks();
  // I1/S1 across reactors: a committed store's chunk at the disk counts against its part's allowance (2 x this
  // reactor's depth) and its job's (2 x io_depth over all reactors). False: an allowance is used up (the reactor
  // is woken when the job's frees a place).
  bool TakeJobSlot(Part& part);
  void ReturnJobSlot(Chunk& c);
  void WakeWaiters(std::atomic<uint64_t>& mask);
  // Starts the data phase of queued chunks while this reactor has places at the disk: its loads first, then its
  // writes while a write place is free (WritePlaces), each in admission order.
  void PumpData();
  void StartDataPhase(Chunk& c);
  bool TakeWritePlace();  // false: every write place is held (this reactor is then woken when one is given back)
  // Asks the disk for more pieces of this reactor's loads, oldest chunk first, while fewer than its piece budget of
  // reads are at the disk (docs/architecture.md, "Reads in pieces").
  void FillPieces();
  // A load in its data phase whose later pieces wait for the reactor's piece budget.
  static bool PiecesToAsk(const Chunk& c);
  // Queues the chunk behind every chunk admitted before it (usually at the back: opens mostly come back in order).
  static void InsertByAdmission(std::deque<Chunk*>& q, Chunk* c);
  void EndDataPhase(Chunk& c);  // the chunk's place at the disk goes to the next one (PumpData)
  int64_t Deadline() const;

  // Ops (reactor.cc).
  // Submits io as an op (its role, chunk and deadline in op) whose completion calls kHandler with args.
  template <auto kHandler>
  void Submit(Op op, ArgsOf<kHandler> args, IoOp io);
  void SubmitOp(Op op, IoOp io);       // the part of Submit that is the same for every handler
  IoOp UnlinkAt(int flags = 0) const;  // unlinkat of a name under the namespace (the op's args name it)
  void RetryDeferredOps();
  // An op came back: shared bookkeeping, then the op's own handler (Op::complete), then the chunk's settling.
  void OnCompletion(const IoCompletion& cqe);
  void OnOpenDone(const Op& op, const Named& file, int64_t res);  // a load's entry or a store's temporary
  void SubmitRead(Chunk& c, Transfer t);
  void SubmitWrite(Chunk& c, Transfer t);
  // A store's write from `offset` of its slot: one piece (EngineOptions::write_piece_bytes), or the rest of the slot;
  // OnWriteDone submits the next once it ends, so a chunk has one piece at the disk at a time.
  void SubmitWritePiece(Chunk& c, uint64_t offset);
  // Closes fd (none: -1) through the ring, no deadline (I4: a cancelled close would leak the fd); then_unlink: a
  // named temporary unlinked once the close is back. Fire and forget.
  void SubmitClose(int fd, std::string then_unlink = {});
  void OnClosedThenUnlink(const Op& op, const ThenUnlink& then, int64_t res);
  void SubmitUnlinkTemporary(std::string path);  // fire and forget, no deadline
  void TraceTransfer(const Op& op, int64_t res, const char* name);
  void CheckDeadlines();
  static const char* OpRoleName(OpRole r);

  // A chunk's end (reactor.cc). Moves c to state `to`; in debug builds an illegal move (LegalChunkTransition)
  // aborts naming both states.
  void SetState(Chunk& c, ChunkState to);
  // Finishes c as failed (kFailed) with status; a no-op for a finished chunk.
  void FailChunk(Chunk& c, Status status);
  // Finishes c: kSucceeded, or kFailed when its status says so; the job's last chunk publishes the result.
  void FinishChunk(Chunk& c);
  // Every chunk of job has finished: record stats and trace.
  void PublishJob(Job& job);
  // Returns the chunk's resources once nothing in flight can touch them any more.
  void Settle(Chunk& c);

  // The promotion's machine (load.cc).
  bool StartLoadChunk(Part& part, Chunk& c);
  // statx through the I/O engine into c.statx_buf (a synchronous fstat on the reactor stalled every chunk's I/O
  // on a slow mount): of a load's open file (OnStatxDone runs CheckOpenedChunk) or of a store's fan-out directory
  // (OnFanoutStatxDone).
  template <auto kHandler>
  void SubmitStatx(Chunk& c, ArgsOf<kHandler> args);
  void OnStatxDone(const Op& op, const NoArgs&, int64_t res);
  // A load's freshly opened chunk (sx: its statx): a regular file of exactly a chunk's size (else kCorrupt);
  // clears the O_NONBLOCK the open used.
  Status CheckOpenedChunk(int fd, const struct statx& sx) const;
  void OnReadDone(const Op& op, const Transfer& t, int64_t res);
  // Loads: the next piece of c's blocks to the disk; a landed piece is verified at once while more of the chunk is
  // still to come (the last one in LoadReadsDone, after the next chunk's reads are queued).
  void SubmitNextPiece(Chunk& c);  // the chunk's next piece; call only while PiecesToAsk(c)
  void PieceLanded(Chunk& c, const Transfer& piece);
  Status VerifyPiece(Chunk& c, uint32_t first, uint32_t n);
  // Verifies the loads whose reads came back in this iteration, after every completion has been handled and the
  // freed places at the disk have been refilled (PumpData + Flush): the disk never waits for checksums.
  void VerifyReadChunks();
  void LoadReadsDone(Chunk& c);
  // A load that failed verification: removed as corrupt (K1), or left in place as a miss when young on a shared root
  // (M1) or keyed for another secret in a namespace whose MANIFEST does not record its key (K3, OtherSecret).
  void FailVerification(Chunk& c, const Status& verdict);
  // K3 (docs/file-format.md, "A MANIFEST without checksum_key"): c's header, not decoded, was refused only for its
  // keying (KeyedForAnotherReader) in a namespace whose MANIFEST records no checksum_key: written by an engine with
  // another secret (or none), which this one cannot tell from the right one there.
  bool OtherSecret(const Chunk& c) const;
  // M1: on a shared root an entry that fails verification while young (mtime within temp_max_age_s) may be another
  // host's publication whose data this client cannot see yet: a miss, never removed (fsck and gc remove it by age).
  bool YoungOnSharedRoot(const Chunk& c) const;
  // M3: a verified load of an entry whose mtime is older than touch_interval_s sets it to now (kUtimensAt), and
  // the index learns the new mtime (OnTouchDone).
  void MaybeTouchEntry(const Chunk& c);
  void OnTouchDone(const Op& op, const EntryOp& entry, int64_t res);
  // K1: counts, forgets and removes c's bad entry (an empty directory too; a non-empty one stays and misses each
  // time), then the fan-out directories it leaves empty (C1). The removal is a chain of c's own ops through the ring
  // (the fan-out directory opened without following symlinks (K2), the name's statx, its unlink, the rmdirs), so c
  // settles, and its miss reaches the resident set, only once the entry is gone. The name is removed only while it
  // points at the inode the load opened (LoadState::opened_ino; 0: unknown), so a good entry republished under it
  // meanwhile stays (M1); a failed step leaves the entry for the next load to find (and quarantine) again.
  void QuarantineCorrupt(Chunk& c);
  void SubmitQuarantineOpen(Chunk& c, int level);  // level 1: "ab" (without openat2), 2: "ab/cd"
  void OnQuarantineDirOpen(const Op& op, const FanoutDirOp& dir, int64_t res);
  void OnQuarantineStatx(const Op& op, const Named& entry, int64_t res);
  void OnQuarantineUnlink(const Op& op, const Named& entry, int64_t res);
  void EndQuarantine(Chunk& c, bool prune);  // closes what the chain opened; prune: the fan-out directories' rmdirs
  void ForgetEntry(const ChunkKey& key);

  // The committed store's machine (store.cc).
  bool StartStoreChunk(Part& part, Chunk& c);
  void BeginStoreWrite(Chunk& c);
  void OpenTemporary(Chunk& c);
  // A store's fan-out directory that this engine has not created or seen yet: mkdirat through the I/O engine, one
  // level at a time (a synchronous mkdir on the reactor held every other chunk's I/O for its whole duration);
  // OnMkdirDone continues with the next level, then OpenTemporary.
  void SubmitMkdir(Chunk& c, int level);
  void OnMkdirDone(const Op& op, const FanoutDirOp& dir, int64_t res);
  // After mkdir: the new directory chmod'ed to dir_mode where the umask strips bits (K2); or, where it existed,
  // its statx: a real directory others cannot write to (K2), else asked again (M1) or refused.
  void OnFanoutChmodDone(const Op& op, const FanoutDirOp& dir, int64_t res);
  void OnFanoutStatxDone(const Op& op, const FanoutDirOp& dir, int64_t res);
  // Fan-out level `level` (1: "ab", 2: "ab/cd") exists and is checked: the next level, or the temporary.
  void FanoutLevelReady(Chunk& c, int level);
  static constexpr uint8_t kMkdirRetries = 5;
  // C1, M1: a store whose fan-out directory vanished under it (eviction or gc removed it empty, here or on another
  // host: ENOENT at mkdir, open or link, EPERM for O_TMPFILE in a directory being removed) creates it again and
  // goes on (an anonymous temporary that is written is linked, anything else opened again), up to this many times.
  static constexpr uint8_t kVanishedDirRetries = 16;
  bool RetryAfterVanishedDir(Chunk& c);
  // K2: a store's temporary chmod'ed to files_.file_mode where the umask strips bits of it, before it is written.
  void OnTemporaryChmodDone(const Op& op, const NoArgs&, int64_t res);
  void OnWriteDone(const Op& op, const Transfer& t, int64_t res);
  void StoreWritesDone(Chunk& c);
  void OnFsyncDone(const Op& op, const NoArgs&, int64_t res);
  // M1: a named temporary is closed, and the close has come back, before its link is submitted: on network and
  // FUSE filesystems the close pushes the data to the servers, and a name linked first is a 0-byte file to other
  // hosts. OnCloseBeforeLinkDone continues with SubmitLink (or fails the chunk: a failed close is a failed write).
  void SubmitCloseBeforeLink(Chunk& c);
  void OnCloseBeforeLinkDone(const Op& op, const NoArgs&, int64_t res);
  void SubmitLink(Chunk& c);
  void OnLinkDone(const Op& op, const LinkNames& names, int64_t res);
  // C2: on ENOSPC evict and retry once; the caller drops the store when this returns false.
  bool RetryStoreAfterEnospc(Chunk& c);
  // The retry's removals, each the chunk's own op: the temporary closed and then unlinked, the victims unlinked.
  // The last of them back opens the next temporary (EnospcRemovalBack).
  void OnEnospcCloseDone(const Op& op, const ThenUnlink& then, int64_t res);
  void SubmitEnospcTmpUnlink(Chunk& c, std::string path);
  void OnEnospcTmpUnlinkDone(const Op& op, const Named& tmp, int64_t res);
  void OnEnospcVictimUnlinkDone(const Op& op, const EntryOp& victim, int64_t res);
  void EnospcRemovalBack(Chunk& c);
  // linked: this engine's link() created the entry and its bytes were not reserved in the budget's usage yet (see
  // StoreState::usage_reserved); false: EEXIST (another writer's entry) or already reserved.
  void PublishIndexed(const ChunkKey& key, uint64_t bytes, bool linked = true);
  // C1: usage above the high watermark evicts LRU entries down to the low one (unlinks through this ring).
  void EvictAboveHighWatermark();
  void OnUnlinkEvictedDone(const Op& op, const EntryOp& victim, int64_t res);
  // C1: after an eviction's unlink, removes the entry's fan-out directory and then its first level if empty
  // (unlinkat AT_REMOVEDIR through this ring; ENOTEMPTY leaves it).
  // owner: a quarantining chunk whose miss waits for them (QuarantineCorrupt); null: on their own.
  void SubmitRmdirFanout(const ChunkKey& key, int level, Chunk* owner = nullptr);
  void OnRmdirFanoutDone(const Op& op, const FanoutDirOp& dir, int64_t res);

  // The engine's parts (Parts).
  const EngineOptions& options_;
  const EntryFiles& files_;
  Namespace* const ns_;
  StagingPool* const pool_;
  TraceRecorder* const trace_;
  kvtier::Stats& stats_;
  DiskIndex* const disk_;
  DiskBudget* const budget_;
  ResidentSet* const resident_;
  ChunkPlacement* const placement_;
  StoreOutcomes& outcomes_;
  ReactorInbox& inbox_;
  WritePlaces* const writes_;
  const std::vector<std::unique_ptr<Reactor>>& peers_;

  // This reactor's own; its thread alone touches them.
  const uint32_t index_;
  const uint32_t depth_;  // chunks with data at the disk: ceil(io_depth / reactors) (I1)
  const uint32_t trace_tid_;
  std::unique_ptr<IoEngine> io_;
  std::thread thread_;
  std::deque<std::unique_ptr<Part>> parts_;  // FIFO: earlier jobs get slots first
  std::unordered_map<uint64_t, Op> ops_;     // the ops in flight, by id (IoOp::user_data)
  uint64_t next_op_id_ = 1;
  std::deque<DeferredOp> deferred_ops_;  // ring full at submission: submitted again next iteration
  std::unordered_map<ChunkKey, Chunk*, ChunkKeyHash> stores_in_flight_;
  // Both in admission order (Chunk::admitted), whatever order the opens came back in.
  std::deque<Chunk*> data_queue_;   // chunks whose file is open, waiting for a data slot at the disk
  std::deque<Chunk*> piece_queue_;  // loads in their data phase with pieces not yet asked for
  uint64_t next_admission_ = 1;
  uint32_t reads_at_disk_ = 0;     // reads submitted and not yet completed (FillPieces keeps <= 2 x depth)
  std::vector<Chunk*> read_done_;  // loads whose reads finished this iteration, waiting for VerifyReadChunks
  uint32_t data_in_flight_ = 0;    // chunks with data reads/writes at the disk: <= depth (I1)
  // Committed stores (CommitStore) started and not yet settled, over all jobs: <= 2 x depth, so that many small
  // commits are checksummed no further ahead of the disk than one large one (StartStoreChunk).
  uint32_t committed_started_ = 0;
  FanoutDirCache fanout_cache_;
};

// The places at the disk writes may hold, over all reactors (EngineOptions::max_writes_at_disk, I1). A reactor
// whose next write finds none marks itself in `waiters`; the reactor that ends a write wakes them.
struct WritePlaces {
  uint32_t max = 1;
  std::atomic<uint32_t> held{0};
  std::atomic<uint64_t> waiters{0};  // reactors (bit r) with a write waiting for a place
};

// How other threads hand the reactors their work: reactor r's queue of new parts, parts[r], and the stop flag. One
// mutex for all the queues, so a job's parts are queued on every reactor in one order (FIFO across jobs).
struct ReactorInbox {
  Mutex mu;
  std::vector<std::deque<std::unique_ptr<Reactor::Part>>> parts GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
};

// Shared by the job's parts (shared_ptr); what several reactors write is atomic, the rest is set before queueing.
struct Reactor::Job {
  uint64_t id = 0;
  JobKind kind = JobKind::kLoad;
  int64_t start_ns = 0;
  std::vector<std::unique_ptr<Chunk>> chunks;  // request order; chunk i is touched only by its reactor
  std::atomic<uint32_t> slots_held{0};         // stores: chunks started, <= 2 x io_depth over all reactors (I1, S1)
  std::atomic<uint64_t> slot_waiters{0};       // reactors (bit r) that found slots_held at its limit
  std::atomic<uint32_t> unfinished{0};         // the reactor that brings it to 0 publishes the result
  std::atomic<uint64_t> bytes{0};
};

// The chunks of one job that one reactor handles, in request order. Reactor-only once queued.
struct Reactor::Part {
  std::shared_ptr<Job> job;
  std::vector<Chunk*> chunks;
  size_t next_to_start = 0;
  uint32_t slots_held = 0;  // <= 2 x the reactor's depth
};

// A corrupt entry's removal in progress (QuarantineCorrupt): what its chain of ops needs from one step to the next.
struct Reactor::Quarantine {
  std::string name;    // the entry's name in its fan-out directory
  int first_fd = -1;   // without openat2: the fan-out directory's first level, open while the second is opened
  int dirfd = -1;      // the fan-out directory
  struct statx sx {};  // the name's statx
};

// The promotion's part of a chunk (a load): its machine is driven by load.cc, and by reactor.cc where the loop asks
// the disk for its pieces (PumpData, FillPieces) and where its end returns the slot and the pin (FinishChunk, Settle).
struct Reactor::LoadState {
  uint32_t first_block = 0;  // the blocks read (a promotion reads the whole chunk)
  uint32_t num_blocks = 0;
  uint32_t slot_gen = 0;                   // the fill's generation (StagingPool::BeginFill)
  DiskIndex::PinnedEntry pin;              // the index entry, kept from eviction until the chunk finishes
  std::unique_ptr<Quarantine> quarantine;  // the removal of a corrupt entry under way (QuarantineCorrupt)
  uint64_t opened_ino = 0;                 // the file's inode and mtime at open (M1)
  int64_t opened_mtime_ns = 0;
  // Read in pieces (read_piece_bytes): blocks are relative to first_block.
  uint32_t piece_blocks = 0;            // blocks per piece
  uint32_t next_piece = 0;              // the first block not yet asked of the disk
  uint32_t pieces_at_disk = 0;          // piece reads in flight (short reads continue in the same piece)
  std::unique_ptr<ChunkHeader> header;  // decoded once it landed and checked (null: not yet, or bad)
  std::vector<bool> verified;           // per block: its checksum was checked as its piece landed
  std::vector<std::pair<uint32_t, uint32_t>> landed_unverified;  // pieces that landed before the header
};

// The committed store's part of a chunk: its machine is driven by store.cc, and by reactor.cc where a store's open
// comes back (OnOpenDone) and where its end removes the temporary, settles its reserved bytes and returns its places
// among the job's and the reactor's started stores (Settle, ReturnJobSlot).
struct Reactor::StoreState {
  bool counts_job_slot = false;   // this chunk counts against job->slots_held and part->slots_held
  bool counts_committed = false;  // counted in its reactor's committed_started_
  std::string tmp_path;
  bool tmp_exists = false;     // a named temporary to remove
  bool tmp_anonymous = false;  // O_TMPFILE: the fd is the only name until linkat
  bool enospc_retried = false;
  bool usage_reserved = false;  // C1: the bytes are counted in the shared usage from the first write on, so
                                // instances evict before the files exist rather than after
  uint8_t dir_retries = 0;      // RetryAfterVanishedDir
  uint8_t mkdir_retries = 0;    // M1: EEXIST from mkdir, then ENOENT from stat (another host's mkdir in flight)
};

// What both machines use; the rest is its machine's (LoadState or StoreState, chosen by the job's kind at creation).
struct Reactor::Chunk {
  explicit Chunk(JobKind kind) {
    if (kind == JobKind::kStore) machine.emplace<StoreState>();
  }
  // The state of its machine; the wrong one (a load's StoreState, a store's LoadState) throws in every build.
  LoadState& load() { return std::get<LoadState>(machine); }
  const LoadState& load() const { return std::get<LoadState>(machine); }
  StoreState& store() { return std::get<StoreState>(machine); }
  const StoreState& store() const { return std::get<StoreState>(machine); }

  Job* job = nullptr;
  Part* part = nullptr;
  size_t index = 0;
  ChunkKey key;
  ChunkState state = ChunkState::kQueued;  // changed only by Reactor::SetState (src/engine/chunk_state.h)
  Status status;                           // set when the chunk fails (kFailed); Ok otherwise
  // The DRAM tier's slot (T1): a load reads into it, a store writes from it; it stays resident either way.
  uint32_t slot = 0;
  int fd = -1;
  uint32_t ops_in_flight = 0;
  std::string rel_path;
  std::unique_ptr<struct statx> statx_buf;  // SubmitStatx's answer: a load's open file, a store's fan-out dir
  bool data_phase = false;                  // holds a place at the disk: counted in its reactor's data_in_flight_
  int64_t started_ns = 0;
  uint64_t admitted = 0;  // its reactor's admission order: the disk serves older chunks first (FillPieces)
  std::variant<LoadState, StoreState> machine;
};

template <auto kHandler>
void Reactor::Submit(Op op, ArgsOf<kHandler> args, IoOp io) {
  using Args = ArgsOf<kHandler>;
  op.args.template emplace<Args>(std::move(args));
  op.complete = [](Reactor& r, const Op& o, int64_t res) { (r.*kHandler)(o, std::get<Args>(o.args), res); };
  SubmitOp(std::move(op), io);
}

template <auto kHandler>
void Reactor::SubmitStatx(Chunk& c, ArgsOf<kHandler> args) {
  if (!c.statx_buf) c.statx_buf = std::make_unique<struct statx>();
  IoOp io;
  io.code = OpCode::kStatx;
  io.fd = c.fd;  // without a path (NoArgs): the open file's
  io.dirfd = ns_->dirfd();
  io.buf = c.statx_buf.get();  // the chunk outlives its ops (Settle waits for them)
  io.len = sizeof(struct statx);
  Submit<kHandler>(Op{.role = OpRole::kStatx, .chunk = &c, .deadline_ns = Deadline()}, std::move(args), io);
}

}  // namespace kvtier
