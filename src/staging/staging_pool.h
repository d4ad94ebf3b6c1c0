// StagingPool: the fixed-size slots, in POSIX shared memory, through which every chunk passes between disk and GPU.
//
// The engine (vLLM's scheduler process) creates the pool; vLLM worker processes attach to it by name, copy slots
// to and from GPU memory, and watch each slot's state word to learn when its bytes are ready. The pool's size is
// the bound on kvtier's host memory (SPEC S1); a reserve of slots is kept for demand work (S2). The DRAM tier
// (slots retained after use) and all eviction logic live in the engine, not here.
//
// Shared memory layout (all offsets from base()):
//   [0, header_bytes)                  header: magic, version, num_slots, slot_stride, slot_bytes, offsets, owner pid
//   [control_offset, +64 * num_slots)  one 64-byte cache line per slot: its state word
//   [board_offset, +128 + 32 * stream_entries)  the stream board: two bells, then stream_entries entries
//   [data_offset, +stride * num_slots) slot data; data_offset and slot_stride are multiples of the alignment
//
// Slot protocol (cross-process, lock-free). Each slot has one 64-bit atomic word in its control line:
//   state    = generation:32 | state:8          (generation in the high 32 bits, state in the low 8)
// The engine is the only writer of `state`.
//
//   Engine (one thread at a time per slot: the thread that holds the slot from Acquire):
//     gen = BeginFill(slot)      state := gen|kFilling (release). Returns the new generation (never 0). Tell the
//                                workers (slot, gen) out of band.
//     ... write the slot's bytes (disk read or device copy into SlotData(slot)) ...
//     PublishReady(slot, gen)    state := gen|kReady (release): every byte written before it is visible to a
//                                consumer whose acquire load sees kReady with the same generation.
//     PublishFailed(slot, gen)   state := gen|kFailed (release): the bytes must not be used; consumers give up
//                                (the request recomputes).
//     MarkFree(slot)             state := gen|kFree (release), generation unchanged. Release() does this too.
//   Consumer (any process, any thread; never allocates, never writes `state`):
//     Observe(slot)              acquire load of state: {generation, state}.
//     WaitReady(slot, gen, t)    polls Observe until generation gen is kReady or kFailed, the slot moves on to
//                                another generation (kSuperseded), or t passes (kTimedOut). On kReady the slot's
//                                bytes are visible to the caller.
//
// The engine must not BeginFill, MarkFree or Release a slot while consumers still read or write it. It learns that
// they are done out of band, not through the pool: in vLLM the slots of a load stay pinned until the manager's
// complete_load and a store's slot stays kFilling until complete_store, both called after every worker reported its
// copy (docs/vllm-integration.md, "The slot protocol"). Generations only make late consumers harmless (a worker
// checks the generation before and after its copy); they do not stop a consumer from reading bytes that are being
// overwritten.
//
// Stream board (docs/architecture.md, "Streamed transfers"). A streamed load or store tells its consumers, chunk by
// chunk, which slot holds (load) or receives (store) chunk i, through one board entry per chunk; the entries of one
// stream are a contiguous range the engine hands out (StreamPump) and names in the transfer spec with a tag:
//   entry  = ref (slot:32 | generation:32), state (tag:32 | StreamEntryState:8), acks (tag:32 | count:32)
//   Engine (the range's owner):  ResetEntry(i, tag)              kWaiting, acks 0, for a new stream
//                                PublishEntry(i, tag, slot, gen)  ref, then kReady (release)
//                                SetEntry(i, tag, kFailed/kSkipped)
//                                EntryAcks(i, tag)                consumers done with the entry so far
//   Consumer:                    ObserveEntry(i)                  acquire: {tag, state, slot, generation}
//                                AckEntry(i, tag)                 acks += 1 if the entry still carries tag; rings
//                                                                 the engine's bell
// Bells are futex words in the shared mapping (one for the engine, one for consumers): Ring* increments and wakes
// every waiter of any process; Wait*(seen, timeout) sleeps while the bell still reads `seen`.
//
// Threads and ownership: allocation (Acquire/Release and the counters) is for the engine process only and is
// thread-safe (an internal mutex). Protocol calls are lock-free and thread-safe. The StagingPool object owns its
// mapping; the creating process also owns the shared memory name and unlinks it in the destructor (only in the
// process that created it, so a forked child never unlinks it). Pointers from SlotData()/base() are valid until
// the StagingPool is destroyed.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

// Data region and slot stride are aligned to at least this many bytes: the page size and the usual O_DIRECT
// alignment. Larger alignments come from the options (the engine passes the root's probed DIO alignment).
inline constexpr uint32_t kMinStagingAlignment = 4096;
// A pool larger than this is refused: it is certainly a configuration error.
inline constexpr uint64_t kMaxPoolBytes = uint64_t{1} << 40;   // 1 TiB
inline constexpr uint64_t kPoolMagic = 0x4c4f4f5052544b56ULL;  // "VKTRPOOL" little-endian
inline constexpr uint32_t kPoolVersion = 2;                    // 2: the stream board

struct StagingPoolOptions {
  uint32_t num_slots = 0;       // > 0
  uint64_t slot_bytes = 0;      // > 0: one chunk's payload
  uint32_t alignment = 4096;    // power of two; effective alignment is max(alignment, kMinStagingAlignment)
  uint32_t demand_reserve = 0;  // <= num_slots: slots that Acquire(kSpeculative) can never take
  std::string name;             // POSIX shm name ("/x", no other '/'); empty -> "/kvtier-<pid>-<random>"
  bool populate = false;        // MAP_POPULATE: fault every page in at Create (slower start, no faults later)
  // With populate: back the pool with 2 MiB folios where the kernel allows (MADV_COLLAPSE, Linux 6.1+, also on a
  // tmpfs mounted huge=never), best effort, else 4 KiB pages as before. A slot then lies in one or two physically
  // contiguous pieces, so an O_DIRECT read or write of a chunk reaches the disk as a few large DMA segments instead
  // of up to one per 4 KiB page; on a virtual disk with a segment limit per request (virtio-blk: 254) scattered
  // pages split a 2 MiB transfer into several requests and halve its bandwidth (bench/io/bench_io.cc, --raw-buffers).
  bool huge_pages = true;
  uint32_t stream_entries = 0;  // entries of the stream board (0: none)
};

enum class SlotState : uint8_t { kFree = 0, kFilling = 1, kReady = 2, kFailed = 3 };
std::string_view SlotStateName(SlotState state);

struct SlotView {
  uint32_t generation = 0;
  SlotState state = SlotState::kFree;
};

enum class SlotWaitOutcome : uint8_t {
  kReady,       // the generation waited for is ready: its bytes are visible
  kFailed,      // the engine published failure for that generation
  kSuperseded,  // the slot now carries another generation (the wait came too late, or the generation was wrong)
  kTimedOut,    // still filling (or free) when the timeout passed
};
std::string_view SlotWaitOutcomeName(SlotWaitOutcome outcome);

// A stream board entry's state (see the header comment).
enum class StreamEntryState : uint8_t {
  kWaiting = 0,  // not yet: the engine has not read (load) or granted (store) the chunk's slot
  kReady = 1,    // ref names the slot: verified bytes to copy out (load), or the slot to fill (store)
  kFailed = 2,   // the chunk will never be ready (load: a miss mid-stream; store: dropped); nothing to copy
  kSkipped = 3,  // nothing to do for this chunk (a store another writer already covers)
};
std::string_view StreamEntryStateName(StreamEntryState state);

struct StreamEntryView {
  uint32_t tag = 0;
  StreamEntryState state = StreamEntryState::kWaiting;
  uint32_t slot = 0;
  uint32_t generation = 0;
};

enum class SlotPriority : uint8_t { kDemand, kSpeculative };

class StagingPool {
 private:
  // Only the class's own factories construct it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  explicit StagingPool(Passkey) {}
  // Creates and maps a new pool (shm_open O_CREAT|O_EXCL, mode 0600). Errors: kInvalidArgument for bad options
  // or a bad name, kAlreadyExists when the name is taken, kNoSpace when /dev/shm cannot hold the pool, kIoError
  // for other OS failures.
  static Result<std::unique_ptr<StagingPool>> Create(const StagingPoolOptions& options);
  // Maps an existing pool read-write (a worker). Errors: kInvalidArgument (bad name), kNotFound (no such pool),
  // kCorrupt (not a kvtier pool, or inconsistent sizes), kFailedPrecondition (another format version, or the
  // owner has not finished creating it). The attached object never unlinks the name.
  static Result<std::unique_ptr<StagingPool>> Attach(const std::string& name);

  // Unlinks pools left behind by crashed owners: shared memory objects with a generated name
  // ("/kvtier-<pid>-<hex>", as Create makes them when options.name is empty) whose <pid> no longer exists in this
  // PID namespace. Pools with an explicit name are never touched. Returns how many were removed; errors only if
  // /dev/shm cannot be listed. Call it from the engine at start-up (a crash cannot unlink its own pool).
  static Result<uint32_t> RemoveOrphans();

  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // --- Allocation (engine process only; thread-safe). ---
  // A free slot, or nullopt when none is free; kSpeculative also fails while free_slots() <= demand_reserve.
  std::optional<uint32_t> Acquire(SlotPriority priority);
  // Returns a slot taken by Acquire and marks its state kFree. Releasing a slot that is not in use aborts: it
  // would hand one slot to two users.
  void Release(uint32_t slot);
  uint32_t free_slots() const;
  uint32_t in_use() const;
  uint32_t peak_in_use() const;
  uint32_t demand_reserve() const { return demand_reserve_; }

  // --- Slot protocol, engine side (see the header comment). ---
  uint32_t BeginFill(uint32_t slot);
  void PublishReady(uint32_t slot, uint32_t generation);
  void PublishFailed(uint32_t slot, uint32_t generation);
  void MarkFree(uint32_t slot);

  // --- Slot protocol, consumer side. ---
  SlotView Observe(uint32_t slot) const;
  // Spins briefly, then sleeps with a backoff of up to ~50us between polls.
  SlotWaitOutcome WaitReady(uint32_t slot, uint32_t generation, std::chrono::nanoseconds timeout) const;

  // --- Stream board (see the header comment). Entry indices are < stream_entries(). ---
  uint32_t stream_entries() const { return stream_entries_; }
  void ResetEntry(uint32_t entry, uint32_t tag);
  void PublishEntry(uint32_t entry, uint32_t tag, uint32_t slot, uint32_t generation);
  void SetEntry(uint32_t entry, uint32_t tag, StreamEntryState state);
  uint32_t EntryAcks(uint32_t entry, uint32_t tag) const;  // 0 when the entry carries another tag
  StreamEntryView ObserveEntry(uint32_t entry) const;
  bool AckEntry(uint32_t entry, uint32_t tag);  // false (nothing done) when the entry carries another tag
  uint32_t EngineBell() const;
  void RingEngine();
  void WaitEngineBell(uint32_t seen, std::chrono::nanoseconds timeout) const;
  uint32_t WorkerBell() const;
  void RingWorkers();
  void WaitWorkerBell(uint32_t seen, std::chrono::nanoseconds timeout) const;

  // --- Geometry. ---
  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t slot_stride() const { return slot_stride_; }
  uint64_t total_bytes() const { return uint64_t{num_slots_} * slot_stride_; }  // the data region
  uint8_t* SlotData(uint32_t slot) const { return data_ + uint64_t{slot} * slot_stride_; }
  const std::string& name() const { return name_; }
  bool is_owner() const { return owner_; }
  // The whole mapping (header, control lines and data), e.g. for cudaHostRegister. data region = SlotData(0) on.
  void* base() const { return base_; }
  size_t mapped_bytes() const { return mapped_bytes_; }
  // Bytes of the pool that MADV_COLLAPSE turned into 2 MiB folios at Create (0: 4 KiB pages; see huge_pages).
  uint64_t huge_bytes() const { return huge_bytes_; }

 private:
  struct SlotControl;
  struct BoardEntry;
  struct Bells;
  SlotControl& control(uint32_t slot) const;
  BoardEntry& board_entry(uint32_t entry) const;

  std::string name_;
  bool owner_ = false;
  pid_t creator_pid_ = 0;
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  uint64_t huge_bytes_ = 0;
  SlotControl* controls_ = nullptr;
  Bells* bells_ = nullptr;
  BoardEntry* board_ = nullptr;
  uint32_t stream_entries_ = 0;
  uint8_t* data_ = nullptr;
  uint32_t num_slots_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t slot_stride_ = 0;
  uint32_t demand_reserve_ = 0;

  // Allocation state, engine process only.
  mutable std::mutex mu_;
  std::vector<uint32_t> free_list_;  // guarded by mu_; a stack, so recently released (warm) slots go out first
  std::vector<bool> slot_in_use_;    // guarded by mu_
  uint32_t peak_in_use_ = 0;         // guarded by mu_
};

}  // namespace kvtier
