#include "staging/staging_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <thread>

namespace kvtier {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "slot words must be lock-free across processes");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "slot words must have the size of a uint64_t");

namespace {

// The first page of the mapping. Plain fields are written once by the creator before `magic` is published
// (release) and never change after; attachers read `magic` with acquire before trusting the rest.
struct PoolHeader {
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t num_slots;
  uint64_t slot_bytes;
  uint64_t slot_stride;
  uint64_t alignment;
  uint64_t control_offset;
  uint64_t data_offset;
  uint64_t mapped_bytes;
  int64_t owner_pid;
  uint32_t demand_reserve;
  uint32_t control_line_bytes;
  uint64_t board_offset;
  uint32_t stream_entries;
  uint32_t board_entry_bytes;
};

constexpr uint64_t kCacheLine = 64;
constexpr int kSpinIterations = 2000;
constexpr std::chrono::microseconds kMaxPollSleep{50};

constexpr uint64_t PackState(uint32_t generation, SlotState state) {
  return (uint64_t{generation} << 32) | static_cast<uint8_t>(state);
}
constexpr SlotView UnpackState(uint64_t word) {
  return SlotView{static_cast<uint32_t>(word >> 32), static_cast<SlotState>(word & 0xff)};
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) / align * align; }

uint64_t SystemPageSize() {
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : kMinStagingAlignment;
}

// POSIX shm names: a leading '/', no other '/', at most NAME_MAX characters after it.
Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/') {
    return Status(StatusCode::kInvalidArgument,
                  "staging pool name '" + name + "' must start with '/' and have at least one more character");
  }
  if (name.find('/', 1) != std::string::npos) {
    return Status(StatusCode::kInvalidArgument,
                  "staging pool name '" + name + "' must not contain '/' after the first");
  }
  if (name.size() - 1 > NAME_MAX) {
    return Status(StatusCode::kInvalidArgument, "staging pool name is " + std::to_string(name.size()) +
                                                    " characters; at most " + std::to_string(NAME_MAX + 1) +
                                                    " are allowed");
  }
  return Status::Ok();
}

std::string RandomName() {
  std::random_device rd;
  uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/kvtier-%d-%016llx", static_cast<int>(getpid()), static_cast<unsigned long long>(r));
  return buf;
}

constexpr uint64_t kBellsBytes = 2 * 64;
constexpr uint64_t kBoardEntryBytes = 32;

struct Geometry {
  uint64_t alignment;
  uint64_t slot_stride;
  uint64_t control_offset;
  uint64_t board_offset;
  uint64_t data_offset;
  uint64_t mapped_bytes;
};

Result<Geometry> ComputeGeometry(const StagingPoolOptions& o) {
  if (o.num_slots == 0) return Status(StatusCode::kInvalidArgument, "staging pool num_slots must be > 0");
  if (o.slot_bytes == 0) return Status(StatusCode::kInvalidArgument, "staging pool slot_bytes must be > 0");
  if (!IsPowerOfTwo(o.alignment)) {
    return Status(StatusCode::kInvalidArgument,
                  "staging pool alignment " + std::to_string(o.alignment) + " is not a power of two");
  }
  if (o.demand_reserve > o.num_slots) {
    return Status(StatusCode::kInvalidArgument, "staging pool demand_reserve " + std::to_string(o.demand_reserve) +
                                                    " exceeds num_slots " + std::to_string(o.num_slots));
  }
  Geometry g;
  g.alignment = std::max<uint64_t>({o.alignment, kMinStagingAlignment, SystemPageSize()});
  if (o.slot_bytes > kMaxPoolBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "staging pool slot_bytes " + std::to_string(o.slot_bytes) + " exceeds the 1 TiB limit");
  }
  g.slot_stride = RoundUp(o.slot_bytes, g.alignment);
  g.control_offset = RoundUp(sizeof(PoolHeader), kCacheLine);
  g.board_offset = RoundUp(g.control_offset + kCacheLine * o.num_slots, kCacheLine);
  g.data_offset = RoundUp(g.board_offset + kBellsBytes + kBoardEntryBytes * o.stream_entries, g.alignment);
  // num_slots < 2^32 and slot_stride <= 2^40 + alignment, so the product fits in 64 bits.
  uint64_t data_bytes = uint64_t{o.num_slots} * g.slot_stride;
  if (data_bytes > kMaxPoolBytes) {
    return Status(StatusCode::kInvalidArgument, "staging pool of " + std::to_string(o.num_slots) + " slots x " +
                                                    std::to_string(g.slot_stride) + " bytes (" +
                                                    std::to_string(data_bytes) + " bytes) exceeds the 1 TiB limit");
  }
  g.mapped_bytes = g.data_offset + data_bytes;
  return g;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
constexpr uint64_t kHugeBytes = 2ull << 20;

// Maps fd's first `bytes` shared at a 2 MiB-aligned address (so file offset 0 starts a huge page), by reserving
// 2 MiB more address space and trimming it. MAP_FAILED on failure.
void* MapHugeAligned(int fd, uint64_t bytes) {
  const uint64_t reserve = bytes + kHugeBytes;
  void* r = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return MAP_FAILED;
  const auto lo = reinterpret_cast<uintptr_t>(r);
  const uintptr_t start = RoundUp(lo, kHugeBytes);
  void* p = mmap(reinterpret_cast<void*>(start), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    munmap(r, reserve);
    return MAP_FAILED;
  }
  if (start > lo) munmap(r, start - lo);
  const uintptr_t end = start + RoundUp(bytes, SystemPageSize()), hi = lo + reserve;
  if (hi > end) munmap(reinterpret_cast<void*>(end), hi - end);
  return p;
}

// Populates a fresh mapping from MapHugeAligned, turning every whole 2 MiB range into one folio where the kernel
// allows (best effort): touching one page per range and collapsing them in one call allocates each huge folio
// directly (cheaper than faulting 512 small pages and copying them). Then faults in the rest (the tail, and
// everything if the kernel refused the collapse). Returns the bytes collapsed (0 when the collapse failed).
uint64_t PopulateHuge(uint8_t* base, uint64_t bytes) {
  const uint64_t whole = bytes / kHugeBytes * kHugeBytes;
  uint64_t huge = 0;
  if (whole > 0) {
    for (uint64_t o = 0; o < whole; o += kHugeBytes) *reinterpret_cast<volatile uint8_t*>(base + o) = 0;
    if (madvise(base, whole, MADV_COLLAPSE) == 0) huge = whole;
  }
  if (madvise(base, bytes, MADV_POPULATE_WRITE) != 0) {  // kernels before 5.14: fault every page by hand
    const uint64_t page = SystemPageSize();
    for (uint64_t o = 0; o < bytes; o += page) *reinterpret_cast<volatile uint8_t*>(base + o) = 0;
  }
  return huge;
}

[[noreturn]] void Die(const char* what, uint32_t slot) {
  std::fprintf(stderr, "kvtier StagingPool: %s (slot %u)\n", what, slot);
  std::abort();
}

}  // namespace

// One cache line per slot so that workers polling one slot never share a line with the engine writing another.
struct alignas(64) StagingPool::SlotControl {
  std::atomic<uint64_t> state;  // generation:32 | state:8
};

// A futex word per side, each on its own cache line.
struct StagingPool::Bells {
  alignas(64) std::atomic<uint32_t> engine;
  alignas(64) std::atomic<uint32_t> workers;
};

struct alignas(32) StagingPool::BoardEntry {
  std::atomic<uint64_t> ref;    // slot:32 | generation:32
  std::atomic<uint64_t> state;  // tag:32 | StreamEntryState:8
  std::atomic<uint64_t> acks;   // tag:32 | count:32
  uint64_t unused;
};

namespace {
static_assert(std::atomic<uint32_t>::is_always_lock_free, "bells must be lock-free across processes");
constexpr uint64_t PackTagged(uint32_t tag, uint32_t low) { return (uint64_t{tag} << 32) | low; }

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(const std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds timeout) {
  if (word->load(std::memory_order_acquire) != seen) return;
  if (timeout.count() <= 0) return;
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  // Spurious wake-ups, EAGAIN (the bell moved) and EINTR all return: callers re-check what they wait for.
  syscall(SYS_futex, const_cast<uint32_t*>(reinterpret_cast<const uint32_t*>(word)), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// A new shared-memory segment, created exclusively: options.name, or a generated name (which can collide only with a
// leftover of a crashed process with the same pid: retried a few times).
struct Segment {
  std::string name;
  int fd;
};
Result<Segment> CreateSegment(const StagingPoolOptions& options) {
  const bool generated_name = options.name.empty();
  if (!generated_name) KVTIER_RETURN_IF_ERROR(ValidateName(options.name));
  Segment seg{"", -1};
  for (int attempt = 0; attempt < 8; ++attempt) {
    seg.name = generated_name ? RandomName() : options.name;
    seg.fd = shm_open(seg.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (seg.fd >= 0 || errno != EEXIST || !generated_name) break;
  }
  if (seg.fd < 0) return Status::FromErrno(errno, "shm_open(" + seg.name + ", O_CREAT|O_EXCL)");
  return seg;
}

// Sizes seg to g.mapped_bytes and maps it (2 MiB pages where asked and possible). Closes seg.fd either way and
// unlinks the segment on failure.
struct Mapping {
  void* base;
  uint64_t huge_bytes;  // bytes backed by huge pages
};
Result<Mapping> SizeAndMap(const Segment& seg, const Geometry& g, const StagingPoolOptions& options) {
  auto fail = [&](Status s) -> Result<Mapping> {
    close(seg.fd);
    shm_unlink(seg.name.c_str());
    return s;
  };
  // tmpfs accepts an ftruncate larger than its free space and raises SIGBUS on a later page fault; refuse here.
  struct statvfs vfs;
  if (fstatvfs(seg.fd, &vfs) == 0 && vfs.f_blocks != 0) {
    uint64_t available = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (g.mapped_bytes > available) {
      return fail(Status(StatusCode::kNoSpace, "staging pool needs " + std::to_string(g.mapped_bytes) +
                                                   " bytes of shared memory; /dev/shm has " +
                                                   std::to_string(available) + " available"));
    }
  }
  if (ftruncate(seg.fd, static_cast<off_t>(g.mapped_bytes)) != 0) {
    return fail(Status::FromErrno(errno, "ftruncate(" + seg.name + ", " + std::to_string(g.mapped_bytes) + ")"));
  }
  const bool huge = options.populate && options.huge_pages && g.mapped_bytes >= kHugeBytes;
  void* base = huge ? MapHugeAligned(seg.fd, g.mapped_bytes) : MAP_FAILED;
  const bool aligned = base != MAP_FAILED;
  if (base == MAP_FAILED) {
    int flags = MAP_SHARED | (options.populate ? MAP_POPULATE : 0);
    base = mmap(nullptr, g.mapped_bytes, PROT_READ | PROT_WRITE, flags, seg.fd, 0);
  }
  if (base == MAP_FAILED) return fail(Status::FromErrno(errno, "mmap(" + seg.name + ")"));
  close(seg.fd);
  return Mapping{base, aligned ? PopulateHuge(static_cast<uint8_t*>(base), g.mapped_bytes) : 0};
}

// Writes the pool's header at base, the magic last: from then on the pool is attachable. control_line_bytes and
// board_entry_bytes: the sizes of a slot's control line and of a board entry, recorded for attachers to check.
void PublishHeader(void* base, const Geometry& g, const StagingPoolOptions& options, uint32_t control_line_bytes,
                   uint32_t board_entry_bytes) {
  auto* header = new (base) PoolHeader{};
  header->version = kPoolVersion;
  header->num_slots = options.num_slots;
  header->slot_bytes = options.slot_bytes;
  header->slot_stride = g.slot_stride;
  header->alignment = g.alignment;
  header->control_offset = g.control_offset;
  header->data_offset = g.data_offset;
  header->mapped_bytes = g.mapped_bytes;
  header->owner_pid = getpid();
  header->demand_reserve = options.demand_reserve;
  header->control_line_bytes = control_line_bytes;
  header->board_offset = g.board_offset;
  header->stream_entries = options.stream_entries;
  header->board_entry_bytes = board_entry_bytes;
  header->magic.store(kPoolMagic, std::memory_order_release);
}
}  // namespace

std::string_view StreamEntryStateName(StreamEntryState state) {
  switch (state) {
    case StreamEntryState::kWaiting: return "waiting";
    case StreamEntryState::kReady: return "ready";
    case StreamEntryState::kFailed: return "failed";
    case StreamEntryState::kSkipped: return "skipped";
  }
  return "unknown";
}

std::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree: return "Free";
    case SlotState::kFilling: return "Filling";
    case SlotState::kReady: return "Ready";
    case SlotState::kFailed: return "Failed";
  }
  return "Unknown";
}

std::string_view SlotWaitOutcomeName(SlotWaitOutcome outcome) {
  switch (outcome) {
    case SlotWaitOutcome::kReady: return "Ready";
    case SlotWaitOutcome::kFailed: return "Failed";
    case SlotWaitOutcome::kSuperseded: return "Superseded";
    case SlotWaitOutcome::kTimedOut: return "TimedOut";
  }
  return "Unknown";
}

Result<std::unique_ptr<StagingPool>> StagingPool::Create(const StagingPoolOptions& options) {
  static_assert(sizeof(SlotControl) == kCacheLine, "one control line per slot");
  Result<Geometry> geometry = ComputeGeometry(options);
  if (!geometry.ok()) return geometry.status();
  const Geometry& g = *geometry;
  Result<Segment> seg = CreateSegment(options);
  if (!seg.ok()) return seg.status();
  Result<Mapping> mapping = SizeAndMap(*seg, g, options);
  if (!mapping.ok()) return mapping.status();

  auto pool = std::make_unique<StagingPool>(Passkey{});
  pool->name_ = seg->name;
  pool->owner_ = true;
  pool->creator_pid_ = getpid();
  pool->base_ = mapping->base;
  pool->mapped_bytes_ = g.mapped_bytes;
  pool->huge_bytes_ = mapping->huge_bytes;
  pool->num_slots_ = options.num_slots;
  pool->slot_bytes_ = options.slot_bytes;
  pool->slot_stride_ = g.slot_stride;
  pool->demand_reserve_ = options.demand_reserve;
  auto* bytes = static_cast<uint8_t*>(mapping->base);
  pool->controls_ = reinterpret_cast<SlotControl*>(bytes + g.control_offset);
  pool->data_ = bytes + g.data_offset;
  for (uint32_t i = 0; i < options.num_slots; ++i) {
    new (&pool->controls_[i]) SlotControl{{PackState(0, SlotState::kFree)}};
  }
  pool->bells_ = new (bytes + g.board_offset) Bells{};
  pool->board_ = reinterpret_cast<BoardEntry*>(bytes + g.board_offset + kBellsBytes);
  pool->stream_entries_ = options.stream_entries;
  for (uint32_t i = 0; i < options.stream_entries; ++i) new (&pool->board_[i]) BoardEntry{};
  pool->free_list_.reserve(options.num_slots);
  for (uint32_t i = options.num_slots; i > 0; --i) pool->free_list_.push_back(i - 1);  // slot 0 goes out first
  pool->slot_in_use_.assign(options.num_slots, false);
  PublishHeader(mapping->base, g, options, sizeof(SlotControl), sizeof(BoardEntry));  // last: now attachable
  return pool;
}

Result<std::unique_ptr<StagingPool>> StagingPool::Attach(const std::string& name) {
  KVTIER_RETURN_IF_ERROR(ValidateName(name));
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    Status s = Status::FromErrno(errno, "attach staging pool: shm_open(" + name + ")");
    if (s.code() == StatusCode::kNotFound) {
      return Status(StatusCode::kNotFound, "attach staging pool: no shared memory named " + name, errno);
    }
    return s;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return Status::FromErrno(e, "attach staging pool: fstat(" + name + ")");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(PoolHeader)) {
    close(fd);
    // The owner creates the object empty and sizes it before writing the header.
    return Status(StatusCode::kFailedPrecondition, "attach staging pool " + name + ": only " + std::to_string(size) +
                                                       " bytes; not initialized yet, or not a kvtier staging pool");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) return Status::FromErrno(e, "attach staging pool: mmap(" + name + ")");

  auto fail = [&](StatusCode code, std::string message) -> Result<std::unique_ptr<StagingPool>> {
    munmap(base, size);
    return Status(code, "attach staging pool " + name + ": " + message);
  };
  const auto* header = static_cast<const PoolHeader*>(base);
  uint64_t magic = header->magic.load(std::memory_order_acquire);
  if (magic == 0) return fail(StatusCode::kFailedPrecondition, "its header is not written yet (retry)");
  if (magic != kPoolMagic) return fail(StatusCode::kCorrupt, "bad magic; not a kvtier staging pool");
  if (header->version != kPoolVersion) {
    return fail(StatusCode::kFailedPrecondition, "format version " + std::to_string(header->version) +
                                                     ", this build reads version " + std::to_string(kPoolVersion));
  }
  // Recompute the layout from the recorded options and insist that every recorded offset agrees with it.
  StagingPoolOptions o;
  o.num_slots = header->num_slots;
  o.slot_bytes = header->slot_bytes;
  o.alignment = header->alignment <= UINT32_MAX ? static_cast<uint32_t>(header->alignment) : 0;
  o.demand_reserve = header->demand_reserve;
  o.stream_entries = header->stream_entries;
  Result<Geometry> g = ComputeGeometry(o);
  if (!g.ok()) return fail(StatusCode::kCorrupt, "inconsistent header: " + g.status().message());
  if (g->alignment != header->alignment || g->slot_stride != header->slot_stride ||
      g->control_offset != header->control_offset || g->data_offset != header->data_offset ||
      g->mapped_bytes != header->mapped_bytes || header->control_line_bytes != sizeof(SlotControl) ||
      g->board_offset != header->board_offset || header->board_entry_bytes != sizeof(BoardEntry)) {
    return fail(StatusCode::kCorrupt, "inconsistent header: recorded layout does not match its own options");
  }
  if (header->mapped_bytes != size) {
    return fail(StatusCode::kCorrupt, "header says " + std::to_string(header->mapped_bytes) +
                                          " bytes but the shared memory object has " + std::to_string(size));
  }

  auto pool = std::make_unique<StagingPool>(Passkey{});
  pool->name_ = name;
  pool->owner_ = false;
  pool->base_ = base;
  pool->mapped_bytes_ = size;
  pool->num_slots_ = header->num_slots;
  pool->slot_bytes_ = header->slot_bytes;
  pool->slot_stride_ = header->slot_stride;
  pool->demand_reserve_ = header->demand_reserve;
  auto* bytes = static_cast<uint8_t*>(base);
  pool->controls_ = reinterpret_cast<SlotControl*>(bytes + header->control_offset);
  pool->data_ = bytes + header->data_offset;
  pool->bells_ = reinterpret_cast<Bells*>(bytes + header->board_offset);
  pool->board_ = reinterpret_cast<BoardEntry*>(bytes + header->board_offset + kBellsBytes);
  pool->stream_entries_ = header->stream_entries;
  // Workers never allocate: free_list_ stays empty, so Acquire() returns nullopt on an attached pool.
  pool->slot_in_use_.assign(pool->num_slots_, false);
  return pool;
}

Result<uint32_t> StagingPool::RemoveOrphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return Status::FromErrno(errno, "list /dev/shm");
  uint32_t removed = 0;
  while (dirent* entry = readdir(dir)) {
    // Exactly the generated form: "kvtier-" <decimal pid> "-" <16 hex digits>.
    int pid = 0;
    char hex[17] = {};
    int consumed = 0;
    if (std::sscanf(entry->d_name, "kvtier-%d-%16[0-9a-f]%n", &pid, hex, &consumed) != 2) continue;
    if (entry->d_name[consumed] != '\0' || std::strlen(hex) != 16 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge (EPERM)
    std::string name = std::string("/") + entry->d_name;
    if (shm_unlink(name.c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

StagingPool::~StagingPool() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  if (owner_ && creator_pid_ == getpid()) shm_unlink(name_.c_str());
}

StagingPool::SlotControl& StagingPool::control(uint32_t slot) const {
  assert(slot < num_slots_);
  return controls_[slot];
}

StagingPool::BoardEntry& StagingPool::board_entry(uint32_t entry) const {
  if (entry >= stream_entries_) Die("stream board entry out of range", entry);
  return board_[entry];
}

// --- Stream board ---

void StagingPool::ResetEntry(uint32_t entry, uint32_t tag) {
  BoardEntry& e = board_entry(entry);
  e.acks.store(PackTagged(tag, 0), std::memory_order_relaxed);
  e.ref.store(0, std::memory_order_relaxed);
  e.state.store(PackTagged(tag, static_cast<uint8_t>(StreamEntryState::kWaiting)), std::memory_order_release);
}

void StagingPool::PublishEntry(uint32_t entry, uint32_t tag, uint32_t slot, uint32_t generation) {
  BoardEntry& e = board_entry(entry);
  e.ref.store(PackTagged(slot, generation), std::memory_order_relaxed);
  e.state.store(PackTagged(tag, static_cast<uint8_t>(StreamEntryState::kReady)), std::memory_order_release);
}

void StagingPool::SetEntry(uint32_t entry, uint32_t tag, StreamEntryState state) {
  board_entry(entry).state.store(PackTagged(tag, static_cast<uint8_t>(state)), std::memory_order_release);
}

uint32_t StagingPool::EntryAcks(uint32_t entry, uint32_t tag) const {
  const uint64_t a = board_entry(entry).acks.load(std::memory_order_acquire);
  return static_cast<uint32_t>(a >> 32) == tag ? static_cast<uint32_t>(a) : 0;
}

StreamEntryView StagingPool::ObserveEntry(uint32_t entry) const {
  const BoardEntry& e = board_entry(entry);
  const uint64_t st = e.state.load(std::memory_order_acquire);
  const uint64_t ref = e.ref.load(std::memory_order_relaxed);
  return StreamEntryView{static_cast<uint32_t>(st >> 32), static_cast<StreamEntryState>(st & 0xff),
                         static_cast<uint32_t>(ref >> 32), static_cast<uint32_t>(ref)};
}

bool StagingPool::AckEntry(uint32_t entry, uint32_t tag) {
  BoardEntry& e = board_entry(entry);
  uint64_t a = e.acks.load(std::memory_order_relaxed);
  do {
    if (static_cast<uint32_t>(a >> 32) != tag) return false;
  } while (!e.acks.compare_exchange_weak(a, a + 1, std::memory_order_acq_rel, std::memory_order_relaxed));
  RingEngine();
  return true;
}

uint32_t StagingPool::EngineBell() const { return bells_->engine.load(std::memory_order_acquire); }
uint32_t StagingPool::WorkerBell() const { return bells_->workers.load(std::memory_order_acquire); }

void StagingPool::RingEngine() {
  bells_->engine.fetch_add(1, std::memory_order_acq_rel);
  FutexWake(&bells_->engine);
}

void StagingPool::RingWorkers() {
  bells_->workers.fetch_add(1, std::memory_order_acq_rel);
  FutexWake(&bells_->workers);
}

void StagingPool::WaitEngineBell(uint32_t seen, std::chrono::nanoseconds timeout) const {
  FutexWait(&bells_->engine, seen, timeout);
}

void StagingPool::WaitWorkerBell(uint32_t seen, std::chrono::nanoseconds timeout) const {
  FutexWait(&bells_->workers, seen, timeout);
}

// --- Allocation ---

std::optional<uint32_t> StagingPool::Acquire(SlotPriority priority) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_list_.empty()) return std::nullopt;
  if (priority == SlotPriority::kSpeculative && free_list_.size() <= demand_reserve_) return std::nullopt;
  uint32_t slot = free_list_.back();
  free_list_.pop_back();
  slot_in_use_[slot] = true;
  peak_in_use_ = std::max(peak_in_use_, num_slots_ - static_cast<uint32_t>(free_list_.size()));
  return slot;
}

void StagingPool::Release(uint32_t slot) {
  if (slot >= num_slots_) Die("Release of a slot out of range", slot);
  std::lock_guard<std::mutex> lock(mu_);
  if (!slot_in_use_[slot]) Die("Release of a slot that is not in use", slot);
  slot_in_use_[slot] = false;
  MarkFree(slot);
  free_list_.push_back(slot);
}

uint32_t StagingPool::free_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(free_list_.size());
}

uint32_t StagingPool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owner_ ? num_slots_ - static_cast<uint32_t>(free_list_.size()) : 0;
}

uint32_t StagingPool::peak_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_in_use_;
}

// --- Slot protocol, engine side ---

uint32_t StagingPool::BeginFill(uint32_t slot) {
  SlotControl& c = control(slot);
  uint32_t generation = UnpackState(c.state.load(std::memory_order_relaxed)).generation + 1;
  if (generation == 0) generation = 1;  // 0 means "never filled"; skip it on wrap-around
  c.state.store(PackState(generation, SlotState::kFilling), std::memory_order_release);
  return generation;
}

void StagingPool::PublishReady(uint32_t slot, uint32_t generation) {
  control(slot).state.store(PackState(generation, SlotState::kReady), std::memory_order_release);
}

void StagingPool::PublishFailed(uint32_t slot, uint32_t generation) {
  control(slot).state.store(PackState(generation, SlotState::kFailed), std::memory_order_release);
}

void StagingPool::MarkFree(uint32_t slot) {
  SlotControl& c = control(slot);
  uint32_t generation = UnpackState(c.state.load(std::memory_order_relaxed)).generation;
  c.state.store(PackState(generation, SlotState::kFree), std::memory_order_release);
}

// --- Slot protocol, consumer side ---

SlotView StagingPool::Observe(uint32_t slot) const {
  return UnpackState(control(slot).state.load(std::memory_order_acquire));
}

SlotWaitOutcome StagingPool::WaitReady(uint32_t slot, uint32_t generation, std::chrono::nanoseconds timeout) const {
  auto classify = [generation](SlotView v) -> std::optional<SlotWaitOutcome> {
    if (v.generation != generation) {
      // An older generation means the fill has not begun yet (the engine told us before BeginFill's store
      // became visible); a newer one means we are too late. Generations wrap, so compare by signed distance.
      if (static_cast<int32_t>(v.generation - generation) < 0) return std::nullopt;
      return SlotWaitOutcome::kSuperseded;
    }
    if (v.state == SlotState::kReady) return SlotWaitOutcome::kReady;
    if (v.state == SlotState::kFailed) return SlotWaitOutcome::kFailed;
    if (v.state == SlotState::kFree) return SlotWaitOutcome::kSuperseded;  // released: the fill will never finish
    return std::nullopt;
  };
  for (int i = 0; i < kSpinIterations; ++i) {
    if (auto outcome = classify(Observe(slot))) return *outcome;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::microseconds(1);
  while (true) {
    if (auto outcome = classify(Observe(slot))) return *outcome;
    if (std::chrono::steady_clock::now() >= deadline) return SlotWaitOutcome::kTimedOut;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxPollSleep);
  }
}

}  // namespace kvtier
