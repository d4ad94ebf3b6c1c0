// kvtier bench io: the engine's disk bandwidth against a raw io_uring baseline on the same directory, file sizes
// and queue depth, in the same run, and against the device's ceiling: the best of that baseline and a
// multi-threaded one (RawParallel below; SPEC performance targets: engine >= 0.9 x raw best on a fast device,
// 0.95 on a virtual disk).
//
// Raw baseline (written here with liburing, nothing from kvtier's I/O layer): per file, open(O_CREAT|O_DIRECT)
// on the issuing thread, one write of the whole file through the ring, close on completion; up to `depth` files in
// flight. Reads: open(O_DIRECT), one read of the whole file, close. No copies, no checksums: it is the ceiling.
// Its buffers are by default in 2 MiB transparent huge pages (--raw-buffers huge), as physically contiguous as the
// engine's pool, so that both sides hand the disk the same DMA segments (on virtio-blk, scattered 4 KiB pages cut
// a 2 MiB transfer into several requests and can halve its bandwidth: that would measure allocation luck).
//
// The engine's pool is 2 x depth slots: the most one job ever holds (2 x io_depth), so a larger pool (the 1 GiB
// default) would not change a single job's pipeline.
//
// Engine: one store job of N chunks from host buffers, then one load job of the same chunks into host buffers,
// with io_depth = depth, the way vLLM's go (docs/architecture.md, "One data path"): a JobClient stream over the N
// keys through StreamPump, whose copier lanes (one per reactor) fill or copy out each ready slot and ack it. Besides
// the disk I/O it copies every byte between host memory and its staging slot (the host copier's memcpy), checksums
// every block (XXH3), writes a temporary then link()s it and unlinks the temporary name, and verifies every block on
// load. Those costs are what the ratio measures.
//
// Files are the same size on both sides (a 4 KiB header plus the chunk payload), and both report GB/s of file
// bytes (10^9 B/s) over the wall time of the phase. Runs alternate (raw, engine, engine, raw, ...) over
// --repeat repetitions (even by default: on the virtual disks we test on, the second phase of a pair is often
// 5-10% faster than the first, whichever side it is), and the ratio is the median over repetitions of engine/raw
// within one repetition, because a shared virtual disk is noisy and drifts. The page cache is dropped before each
// read phase only when asked (--drop-caches) or in buffered mode.
#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_commands.h"
#include "cli_util.h"
#include "io/io_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "layout/xxh3_dispatch.h"
#include "policy/job_client.h"
#include "staging/staging_pool.h"
#include "transfer/device_copier.h"
#include "util/tsan.h"

// GCC 12 at -O3 reports -Wrestrict on `"literal" + std::string` concatenations once they are inlined deep enough
// (GCC bug 105329, a false positive in libstdc++'s basic_string::_M_replace); this file builds many labels that way,
// and which call sites trip it changes with unrelated edits. The release build is -Werror (scripts/test.sh step 3).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct AlignedFree {
  uint64_t mapped = 0;  // > 0: an mmap of that many bytes (AllocHugeFilled), else aligned_alloc
  void operator()(uint8_t* p) const {
    if (mapped > 0) {
      munmap(p, mapped);
    } else {
      std::free(p);
    }
  }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;

void Fill(void* p, uint64_t cap, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* words = static_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < cap / 8; ++i) words[i] = rng();  // touches every page, incompressible
}

Buffer AllocFilled(uint64_t bytes, uint64_t seed) {
  const uint64_t cap = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, cap);
  if (p == nullptr) throw CliError("out of memory allocating " + FormatSize(cap));
  Fill(p, cap, seed);
  return Buffer(static_cast<uint8_t*>(p));
}

// Heap memory in 2 MiB transparent huge pages where the kernel allows (madvise mode or always), so a transfer's
// pages are physically contiguous like the engine's pool (StagingPoolOptions::huge_pages): the raw baseline then
// gets the same few large DMA segments per file instead of whatever contiguity 4 KiB pages happen to have.
// A fresh mapping, not malloc: reused heap memory already has 4 KiB pages that MADV_HUGEPAGE would not replace.
Buffer AllocHugeFilled(uint64_t bytes, uint64_t seed) {
  constexpr uint64_t kHuge = 2ull << 20;
  const uint64_t cap = (bytes + kHuge - 1) / kHuge * kHuge;
  void* r = mmap(nullptr, cap + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) throw CliError("out of memory allocating " + FormatSize(cap));
  const auto lo = reinterpret_cast<uintptr_t>(r);
  const uintptr_t start = (lo + kHuge - 1) / kHuge * kHuge;
  if (start > lo) munmap(r, start - lo);
  if (lo + kHuge > start) munmap(reinterpret_cast<void*>(start + cap), lo + kHuge - start);
  auto* p = reinterpret_cast<uint8_t*>(start);
  madvise(p, cap, MADV_HUGEPAGE);  // best effort: without THP the buffer keeps 4 KiB pages
  Fill(p, cap, seed);
  return Buffer(p, AlignedFree{cap});
}

// A buffer in POSIX shared memory with 4 KiB pages (--raw-buffers shm: tells whether the kind of
// memory, not the engine, changes the disk requests).
struct ShmBuffer {
  void* base = nullptr;
  uint64_t bytes = 0;
  ~ShmBuffer() {
    if (base) munmap(base, bytes);
  }
};
std::vector<std::unique_ptr<ShmBuffer>> g_shm;

uint8_t* AllocShmFilled(uint64_t bytes, uint64_t seed) {
  const uint64_t cap = (bytes + 4095) / 4096 * 4096;
  const std::string name = "/kvtier-bench-raw-" + std::to_string(getpid()) + "-" + std::to_string(g_shm.size());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw CliError("shm_open " + name + ": " + std::strerror(errno));
  shm_unlink(name.c_str());
  if (ftruncate(fd, static_cast<off_t>(cap)) != 0) {
    close(fd);
    throw CliError("ftruncate " + name + ": " + std::strerror(errno));
  }
  void* p = mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw CliError("mmap " + name + ": " + std::strerror(errno));
  g_shm.push_back(std::make_unique<ShmBuffer>(ShmBuffer{p, cap}));
  Fill(p, cap, seed);
  return static_cast<uint8_t*>(p);
}

// Physically contiguous pieces of [p, p + bytes): what an O_DIRECT transfer from it costs in DMA segments (a
// virtio disk takes at most max_segments of them per request). 0 when page frame numbers are hidden (not root).
uint64_t PhysicalPieces(const uint8_t* p, uint64_t bytes) {
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / 4096, pages = (bytes + 4095) / 4096;
  std::vector<uint64_t> e(pages);
  const ssize_t n = pread(fd, e.data(), pages * 8, static_cast<off_t>(first * 8));
  close(fd);
  if (n != static_cast<ssize_t>(pages * 8)) return 0;
  uint64_t pieces = 0, prev = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    const uint64_t pfn = e[i] & ((1ull << 55) - 1);
    if (pfn == 0) return 0;
    if (i == 0 || pfn != prev + 1) ++pieces;
    prev = pfn;
  }
  return pieces;
}

// CPU time of every thread of this process, by thread id, with its name (io_uring's kernel workers are
// "iou-wrk-<tid>"), for "is a thread CPU-bound?" (--verbose).
struct ThreadTime {
  std::string comm;
  uint64_t ticks = 0;
};
std::map<int, ThreadTime> ThreadTicks() {
  std::map<int, ThreadTime> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    std::getline(f, line);
    const size_t open_paren = line.find('('), close_paren = line.rfind(')');
    if (open_paren == std::string::npos || close_paren == std::string::npos) continue;
    std::istringstream rest(line.substr(close_paren + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    std::string comm = line.substr(open_paren + 1, close_paren - open_paren - 1);
    // Where an idle thread sleeps tells the engine's threads apart: the reactor in io_uring_enter (426) or
    // epoll/poll, the host copier on a futex (202).
    std::ifstream sc(std::string("/proc/self/task/") + e->d_name + "/syscall");
    long nr = -1;
    if (sc >> nr) {
      if (nr == 426) comm += "/uring-wait";
      if (nr == 202) comm += "/futex-wait";
    }
    out[std::atoi(e->d_name)] = ThreadTime{comm, utime + stime};
  }
  closedir(d);
  return out;
}

// The block device's counters (/sys/dev/block/M:m/stat): time_in_queue over wall time is the average number of
// requests in flight at the disk, the number that decides bandwidth.
struct DiskStat {
  uint64_t ios = 0, sectors = 0, time_in_queue_ms = 0;
  uint64_t writes = 0, write_sectors = 0, discards = 0, flushes = 0;  // also counted apart: what else the disk did
  bool ok = false;
};
DiskStat ReadDiskStat(dev_t dev) {
  std::ifstream f("/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev)) + "/stat");
  uint64_t v[17] = {};
  for (int i = 0; i < 17; ++i) {
    if (!(f >> v[i]) && i < 11) return {};  // discard (4.18) and flush (5.5) fields are absent on older kernels
  }
  return DiskStat{v[0] + v[4], v[2] + v[6], v[10], v[4], v[6], v[11], v[15], true};
}

dev_t g_disk = 0;

// The block device's kernel name (zram0, vda, nvme0n1p1, ...), "" when the filesystem has none (tmpfs, overlay).
std::string BlockDeviceName(dev_t dev) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(
      "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev)), ec);
  return ec ? std::string() : target.filename().string();
}

struct CpuSample {
  std::map<int, ThreadTime> threads;
  DiskStat disk;
  uint64_t minor_faults = 0;  // this process's page faults (getrusage)
  double cpu_seconds = 0;     // this process's CPU time, threads that have ended included (getrusage)
  Clock::time_point at;
  static CpuSample Now() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    return {ThreadTicks(), ReadDiskStat(g_disk), static_cast<uint64_t>(ru.ru_minflt), cpu, Clock::now()};
  }
};

// "cpu 1.23 cores (tid 123 kvtier 45%, iou-wrk 30%); disk qd 3.9, 512KiB/req" between two samples.
std::string CpuSummary(const CpuSample& a, const CpuSample& b) {
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double wall = Seconds(a.at, b.at);
  double total = 0, iou = 0;
  std::vector<std::pair<double, std::string>> per;
  for (auto& [tid, t] : b.threads) {
    auto it = a.threads.find(tid);
    const double d = static_cast<double>(t.ticks - (it == a.threads.end() ? 0 : it->second.ticks)) / hz;
    total += d;
    if (t.comm.rfind("iou-wrk", 0) == 0) {
      iou += d;
    } else if (d > 0) {
      per.emplace_back(d, std::to_string(tid) + (tid == getpid() ? " main" : " " + t.comm));
    }
  }
  std::sort(per.rbegin(), per.rend());
  // Threads that ended within the phase (the multi-threaded raw baseline's) are gone from /proc: the process total.
  total = std::max(total, b.cpu_seconds - a.cpu_seconds);
  std::string s = "cpu " + FormatFixed(total / wall, 2) + " cores:";
  for (size_t i = 0; i < per.size() && i < 3; ++i)
    s += " tid " + per[i].second + " " + FormatFixed(100 * per[i].first / wall, 0) + "%";
  s += " iou-wrk " + FormatFixed(100 * iou / wall, 0) + "%, " + std::to_string(b.minor_faults - a.minor_faults) +
       " page faults";
  if (a.disk.ok && b.disk.ok && b.disk.ios > a.disk.ios) {
    s += "; disk qd " +
         FormatFixed(static_cast<double>(b.disk.time_in_queue_ms - a.disk.time_in_queue_ms) / (wall * 1000), 1) + ", " +
         FormatSize((b.disk.sectors - a.disk.sectors) * 512 / (b.disk.ios - a.disk.ios)) + "/req";
    const uint64_t reads = (b.disk.ios - b.disk.writes) - (a.disk.ios - a.disk.writes);
    const uint64_t writes = b.disk.writes - a.disk.writes;
    s += " (" + std::to_string(reads) + " reads, " + std::to_string(writes) + " writes";
    if (writes > 0) s += " of " + FormatSize((b.disk.write_sectors - a.disk.write_sectors) * 512 / writes);
    if (b.disk.discards > a.disk.discards) s += ", " + std::to_string(b.disk.discards - a.disk.discards) + " discards";
    if (b.disk.flushes > a.disk.flushes) s += ", " + std::to_string(b.disk.flushes - a.disk.flushes) + " flushes";
    s += ")";
  }
  return s;
}

// --trace-marks PATH: one line at the start and the end of every timed phase, written to PATH and flushed at once.
// Pointed at tracefs's trace_marker, the lines land in the kernel trace between the block layer's events, so a
// per-request trace can be cut into phases (bench/io/trace_phases.py); pointed at a file, it is a phase log.
class PhaseMarks {
 public:
  explicit PhaseMarks(const std::string& path) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "w");
    if (f_ == nullptr) throw CliError("--trace-marks " + path + ": " + std::strerror(errno));
  }
  ~PhaseMarks() {
    if (f_ != nullptr) std::fclose(f_);
  }
  PhaseMarks(const PhaseMarks&) = delete;
  PhaseMarks& operator=(const PhaseMarks&) = delete;

  // "kvtier-bench-io PHASE eng_read begin chunk 2097152 depth 4 rep 3"
  void Mark(const char* phase, const char* edge, uint64_t chunk, uint32_t depth, uint64_t rep) {
    if (f_ == nullptr) return;
    std::fprintf(f_, "kvtier-bench-io PHASE %s %s chunk %llu depth %u rep %llu\n", phase, edge,
                 static_cast<unsigned long long>(chunk), depth, static_cast<unsigned long long>(rep));
    if (std::fflush(f_) != 0) throw CliError(std::string("--trace-marks: write failed: ") + std::strerror(errno));
  }
  // Runs fn between a begin and an end mark; returns what fn returns.
  template <typename Fn>
  auto Around(const char* phase, uint64_t chunk, uint32_t depth, uint64_t rep, Fn&& fn) {
    Mark(phase, "begin", chunk, depth, rep);
    auto r = fn();
    Mark(phase, "end", chunk, depth, rep);
    return r;
  }

 private:
  FILE* f_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// Raw io_uring baseline

class RawBench {
 public:
  // memory "pool": `pool_slots` (depth of them, each at least file_bytes) are the buffers. touch_buffers: twice the
  // depth in buffers (same memory kind), for ReadPathsTouching; "pool" has only `depth` and refuses it.
  RawBench(std::string dir, uint64_t file_bytes, uint32_t depth, bool direct, const std::string& memory,
           const std::vector<uint8_t*>& pool_slots = {}, bool touch_buffers = false)
      : dir_(std::move(dir)), file_bytes_(file_bytes), depth_(depth), direct_(direct) {
    if (mkdir(dir_.c_str(), 0750) != 0 && errno != EEXIST) {
      throw CliError("cannot create " + dir_ + ": " + std::strerror(errno));
    }
    const int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) throw CliError(std::string("io_uring_queue_init: ") + std::strerror(-rc));
    // Same io-wq worker allowance as the engine (one per op in flight), so neither side is capped at 4 per CPU.
    unsigned workers[2] = {depth_, 0};
    io_uring_register_iowq_max_workers(&ring_, workers);
    if (touch_buffers && memory == "pool") throw CliError("raw baseline: no second set of pool slots to touch");
    for (uint32_t i = 0; i < (touch_buffers ? 2 * depth_ : depth_); ++i) {
      if (memory == "pool") {
        if (i >= pool_slots.size()) throw CliError("raw baseline: fewer pool slots than the depth");
        buffers_.push_back(pool_slots[i]);
        Fill(pool_slots[i], file_bytes_, 1000 + i);
      } else if (memory == "shm") {
        buffers_.push_back(AllocShmFilled(file_bytes_, 1000 + i));
      } else {
        heap_.push_back(memory == "huge" ? AllocHugeFilled(file_bytes_, 1000 + i) : AllocFilled(file_bytes_, 1000 + i));
        buffers_.push_back(heap_.back().get());
      }
    }
  }
  ~RawBench() {
    io_uring_queue_exit(&ring_);
    g_shm.clear();
  }

  double Write(uint64_t n, const std::string& tag) {
    return Run(
        n, [&](uint64_t i) { return Path(tag, i); }, true);
  }
  double Read(uint64_t n, const std::string& tag) {
    return Run(
        n, [&](uint64_t i) { return Path(tag, i); }, false);
  }
  // --cross: the same raw reads of files that somebody else laid out (the engine's chunk files).
  double ReadPaths(const std::vector<std::string>& paths) {
    return Run(
        paths.size(), [&](uint64_t i) { return paths[i]; }, false);
  }
  // --touch: the same reads, and every byte of each file read once more from memory after its read completes (a
  // plain sum, the least any reader that checks what it loaded must do; the engine verifies with XXH3, K1). Like
  // the engine, it hands the disk its next read before it touches the finished one: depth reads in flight, 2 x
  // depth buffers (the engine's pool holds 2 x depth slots).
  double ReadPathsTouching(const std::vector<std::string>& paths) {
    if (buffers_.size() < 2ull * depth_) throw CliError("raw baseline: built without the buffers --touch needs");
    return Run(
        paths.size(), [&](uint64_t i) { return paths[i]; }, false, true);
  }
  // --touch for writes: every byte of each buffer read once from memory before its write is queued (the least a
  // writer that checksums what it stores must do; the engine checksums with XXH3). Like the engine, which prepares
  // the next chunks in spare slots while the disk writes, it reads the next buffers while depth writes are in
  // flight (2 x depth buffers).
  double WriteTouching(uint64_t n, const std::string& tag) {
    if (buffers_.size() < 2ull * depth_) throw CliError("raw baseline: built without the buffers --touch needs");
    return Run(
        n, [&](uint64_t i) { return Path(tag, i); }, true, true);
  }
  // Mean physically contiguous pieces per file buffer (0: unknown).
  double PiecesPerBuffer() const {
    uint64_t sum = 0;
    for (uint8_t* b : buffers_) {
      const uint64_t p = PhysicalPieces(b, file_bytes_);
      if (p == 0) return 0;
      sum += p;
    }
    return static_cast<double>(sum) / static_cast<double>(buffers_.size());
  }
  void Remove(uint64_t n, const std::string& tag) {
    for (uint64_t i = 0; i < n; ++i) unlink(Path(tag, i).c_str());
  }
  void RemoveDir() { rmdir(dir_.c_str()); }
  // The path of file i of a run tagged `tag` (the multi-threaded baseline reads and writes the same names).
  std::string Path(const std::string& tag, uint64_t i) const { return dir_ + "/" + tag + "." + std::to_string(i); }
  const std::vector<uint8_t*>& buffers() const { return buffers_; }

 private:
  struct Slot {
    int fd = -1;
    uint64_t done = 0;
  };

  void Queue(uint32_t slot, bool write) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) throw CliError("io_uring: submission queue full");
    Slot& s = slots_[slot];
    uint8_t* buf = buffers_[slot] + s.done;
    const auto len = static_cast<unsigned>(file_bytes_ - s.done);
    if (write) {
      io_uring_prep_write(sqe, s.fd, buf, len, s.done);
    } else {
      io_uring_prep_read(sqe, s.fd, buf, len, s.done);
    }
    io_uring_sqe_set_data64(sqe, slot);
  }

  // Sums a buffer 8 bytes at a time (the compiler vectorizes it); the result goes to touch_sum_ so that it stays.
  static uint64_t Touch(const uint8_t* p, uint64_t len) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i + 8 <= len; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      sum += w;
    }
    return sum;
  }

  double Run(uint64_t n, const std::function<std::string(uint64_t)>& path_of, bool write, bool touch = false) {
    const uint32_t buffers = touch ? 2 * depth_ : depth_;
    slots_.assign(buffers, Slot{});
    std::vector<uint32_t> free_slots, to_touch, touched;  // touched: writes' buffers already read, ready to go
    for (uint32_t i = buffers; i > 0; --i) free_slots.push_back(i - 1);
    const int flags = (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
    uint64_t next = 0, completed = 0;
    uint32_t in_flight = 0;
    auto refill = [&] {
      while ((!free_slots.empty() || !touched.empty()) && in_flight < depth_ && next < n) {
        uint32_t slot;
        if (!touched.empty()) {
          slot = touched.back();
          touched.pop_back();
        } else {
          slot = free_slots.back();
          free_slots.pop_back();
          if (touch && write) touch_sum_ += Touch(buffers_[slot], file_bytes_);
        }
        const std::string path = path_of(next++);
        const int fd = open(path.c_str(), flags, 0640);
        if (fd < 0) throw CliError("raw baseline: open " + path + ": " + std::strerror(errno));
        slots_[slot] = Slot{fd, 0};
        ++in_flight;
        Queue(slot, write);
      }
    };
    const auto t0 = Clock::now();
    while (completed < n) {
      refill();
      int rc;
      if (touch && write) {  // the disk gets these writes, then the next buffers are read while it works
        rc = io_uring_submit(&ring_);
        if (rc < 0 && rc != -EINTR) throw CliError(std::string("io_uring_submit: ") + std::strerror(-rc));
        while (!free_slots.empty() && next + touched.size() < n) {
          const uint32_t slot = free_slots.back();
          free_slots.pop_back();
          touch_sum_ += Touch(buffers_[slot], file_bytes_);
          touched.push_back(slot);
        }
      }
      rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR) throw CliError(std::string("io_uring_submit_and_wait: ") + std::strerror(-rc));
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        const auto slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
        Slot& s = slots_[slot];
        if (cqe->res <= 0) {
          throw CliError(std::string("raw baseline: ") + (write ? "write" : "read") + ": " +
                         (cqe->res == 0 ? "no progress" : std::strerror(-cqe->res)));
        }
        s.done += static_cast<uint64_t>(cqe->res);
        if (s.done < file_bytes_) {
          Queue(slot, write);  // short transfer: continue
          continue;
        }
        close(s.fd);
        s.fd = -1;
        ++completed;
        --in_flight;
        (touch && !write ? to_touch : free_slots).push_back(slot);
      }
      io_uring_cq_advance(&ring_, seen);
      if (!to_touch.empty()) {
        refill();  // the disk gets its next reads first (free buffers remain: 2 x depth of them)
        rc = io_uring_submit(&ring_);
        if (rc < 0 && rc != -EINTR) throw CliError(std::string("io_uring_submit: ") + std::strerror(-rc));
        for (uint32_t slot : to_touch) {
          touch_sum_ += Touch(buffers_[slot], file_bytes_);
          free_slots.push_back(slot);
        }
        to_touch.clear();
      }
    }
    return Seconds(t0, Clock::now());
  }

  std::string dir_;
  uint64_t file_bytes_;
  uint32_t depth_;
  bool direct_;
  io_uring ring_{};
  std::vector<Buffer> heap_;
  std::vector<uint8_t*> buffers_;
  std::vector<Slot> slots_;
  uint64_t touch_sum_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Raw multi-threaded baseline: the device's ceiling (--raw-threads, --raw-split, --raw-queue)
//
// The same files and file sizes as the raw baseline above, read and written by T threads, each with a ring of its
// own and its share of the files in flight (--raw-queue total: `depth` files in flight over all threads, as the
// engine has; per-thread: `depth` files on each thread), files handed out from one shared counter so that a slow
// thread holds up nobody. A file is one request (whole), or requests of S bytes (--raw-split), all of a file's
// requests submitted at once. A device whose per-byte work happens in the submitting thread (zram copies in
// submit_bio; a FUSE or network filesystem client; checksums) scales with threads; a virtual disk scales with the
// requests in flight. The best of all variants, the single-thread raw baseline included, is "raw best".

struct RawVariant {
  uint32_t threads = 1;
  uint64_t split = 0;  // bytes per request; 0: one request per file
  // --raw-verify: also the engine's per-byte work, XXH3 over every byte (a read hashes each request as it lands, a
  // write hashes the file before its requests go out): the floor of a reader that verifies what it loads (K1).
  bool verify = false;
  std::vector<double> write_gbps, read_gbps;  // per repetition
  std::string Request() const { return split == 0 ? "whole" : FormatSize(split); }
  // "t4/4MiB", "t1/whole", "t8/whole+xxh3": for tables, phase marks ("par_t4_4MiB_read") and --verbose.
  std::string Short() const { return "t" + std::to_string(threads) + "/" + Request() + (verify ? "+xxh3" : ""); }
  std::string Mark(bool write) const {
    return "par_t" + std::to_string(threads) + "_" + Request() + (verify ? "_xxh3" : "") + (write ? "_write" : "_read");
  }
};

class RawParallel {
 public:
  // borrowed: buffers of at least file_bytes each that may be used (the single-thread baseline's); more are
  // allocated (same memory kind) when per-thread queues need more than that.
  RawParallel(uint64_t file_bytes, uint32_t depth, bool direct, bool per_thread_queue, uint32_t max_threads,
              const std::string& memory, const std::vector<uint8_t*>& borrowed)
      : file_bytes_(file_bytes), depth_(depth), direct_(direct), per_thread_(per_thread_queue) {
    const uint64_t need = per_thread_ ? uint64_t{max_threads} * depth_ : depth_;
    for (uint64_t i = 0; i < need; ++i) {
      if (i < borrowed.size()) {
        buffers_.push_back(borrowed[i]);
        continue;
      }
      own_.push_back(memory == "heap" ? AllocFilled(file_bytes_, 3000 + i) : AllocHugeFilled(file_bytes_, 3000 + i));
      buffers_.push_back(own_.back().get());
    }
  }

  // Whether a variant fits this depth: with one queue of `depth` files over all threads, each thread needs one.
  bool Fits(const RawVariant& v) const { return per_thread_ || v.threads <= depth_; }

  // Writes or reads files path_of(0..n-1) with variant v; returns the wall time from the moment every thread is
  // ready (rings set up) to the last completion.
  double Run(const RawVariant& v, uint64_t n, const std::function<std::string(uint64_t)>& path_of, bool write) {
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::string> errors(v.threads);
    std::latch ready(v.threads + 1), go(1);
    std::vector<std::thread> threads;
    uint32_t first = 0;
    for (uint32_t t = 0; t < v.threads; ++t) {
      const uint32_t files = per_thread_ ? depth_ : depth_ / v.threads + (t < depth_ % v.threads ? 1 : 0);
      threads.emplace_back([&, t, first, files] {
        Worker(v.split, v.verify, write, first, files, n, path_of, next, failed, ready, go, &errors[t]);
      });
      first += files;
    }
    ready.arrive_and_wait();
    const auto t0 = Clock::now();
    go.count_down();
    for (std::thread& th : threads) th.join();
    const double secs = Seconds(t0, Clock::now());
    for (const std::string& e : errors) {
      if (!e.empty()) throw CliError("raw baseline (" + v.Short() + "): " + e);
    }
    return secs;
  }

 private:
  struct File {
    int fd = -1;
    uint32_t pieces_left = 0;
  };

  // One thread: `files` files in flight at most, in buffers [first, first + files), the next file from `next`.
  void Worker(uint64_t split, bool verify, bool write, uint32_t first, uint32_t files, uint64_t n,
              const std::function<std::string(uint64_t)>& path_of, std::atomic<uint64_t>& next,
              std::atomic<bool>& failed, std::latch& ready, std::latch& go, std::string* error) {
    const uint64_t piece = split == 0 || split >= file_bytes_ ? file_bytes_ : split;
    const uint64_t pieces = (file_bytes_ + piece - 1) / piece;
    // Every piece of every file in flight has its entry, up to the kernel's ring limit; the rest wait in `queued`.
    const auto entries = static_cast<unsigned>(std::min<uint64_t>(4096, std::max<uint64_t>(1, files * pieces)));
    io_uring ring{};
    const int rc = io_uring_queue_init(entries, &ring, 0);
    if (rc < 0) {
      *error = std::string("io_uring_queue_init: ") + std::strerror(-rc);
      failed = true;
      ready.count_down();
      return;
    }
    unsigned workers[2] = {entries, 0};
    io_uring_register_iowq_max_workers(&ring, workers);
    ready.count_down();
    go.wait();
    std::vector<File> slots(files);
    std::vector<uint64_t> done(files * pieces);  // bytes done per piece, by id = slot * pieces + piece
    std::deque<uint64_t> queued;                 // pieces not yet handed to the ring, oldest first
    std::vector<uint32_t> free_slots;
    for (uint32_t i = files; i > 0; --i) free_slots.push_back(i - 1);
    const int flags = (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
    unsigned in_ring = 0;
    uint32_t open_files = 0;
    auto piece_len = [&](uint64_t id) { return std::min(piece, file_bytes_ - (id % pieces) * piece); };
    uint64_t hashes = 0;  // --raw-verify: folded into sink_ so that no hash is optimized away
    try {
      while (!failed) {
        while (!free_slots.empty()) {
          const uint64_t i = next.fetch_add(1);
          if (i >= n) break;
          const uint32_t slot = free_slots.back();
          free_slots.pop_back();
          const std::string path = path_of(i);
          const int fd = open(path.c_str(), flags, 0640);
          if (fd < 0) throw CliError("open " + path + ": " + std::strerror(errno));
          slots[slot] = File{fd, static_cast<uint32_t>(pieces)};
          ++open_files;
          if (verify && write) hashes ^= BlockChecksum(buffers_[first + slot], file_bytes_, i);
          for (uint64_t p = 0; p < pieces; ++p) {
            done[slot * pieces + p] = 0;
            queued.push_back(slot * pieces + p);
          }
        }
        if (open_files == 0) break;
        while (!queued.empty() && in_ring < entries) {
          const uint64_t id = queued.front();
          queued.pop_front();
          const uint64_t slot = id / pieces, at = (id % pieces) * piece + done[id];
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          if (sqe == nullptr) throw CliError("io_uring: submission queue full");
          uint8_t* buf = buffers_[first + slot] + at;
          const auto len = static_cast<unsigned>(piece_len(id) - done[id]);
          if (write) {
            io_uring_prep_write(sqe, slots[slot].fd, buf, len, at);
          } else {
            io_uring_prep_read(sqe, slots[slot].fd, buf, len, at);
          }
          io_uring_sqe_set_data64(sqe, id);
          ++in_ring;
        }
        const int r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR) throw CliError(std::string("io_uring_submit_and_wait: ") + std::strerror(-r));
        io_uring_cqe* cqe;
        unsigned head, seen = 0;
        std::string failure;
        io_uring_for_each_cqe(&ring, head, cqe) {
          ++seen;
          --in_ring;
          const uint64_t id = io_uring_cqe_get_data64(cqe);
          if (cqe->res <= 0) {
            failure = std::string(write ? "write" : "read") + ": " +
                      (cqe->res == 0 ? "no progress" : std::strerror(-cqe->res));
            continue;
          }
          done[id] += static_cast<uint64_t>(cqe->res);
          if (done[id] < piece_len(id)) {
            queued.push_back(id);  // short transfer: the rest of this piece goes again
            continue;
          }
          if (verify && !write) {
            hashes ^= BlockChecksum(buffers_[first + id / pieces] + (id % pieces) * piece, piece_len(id), id);
          }
          File& f = slots[id / pieces];
          if (--f.pieces_left == 0) {
            close(f.fd);
            f.fd = -1;
            --open_files;
            free_slots.push_back(static_cast<uint32_t>(id / pieces));
          }
        }
        io_uring_cq_advance(&ring, seen);
        if (!failure.empty()) throw CliError(failure);
      }
    } catch (const std::exception& e) {
      *error = e.what();
      failed = true;
    }
    // Stopped early (an error here or on another thread): the ring finishes what it holds before the buffers and
    // descriptors go.
    while (in_ring > 0) {
      io_uring_cqe* cqe;
      if (io_uring_wait_cqe(&ring, &cqe) != 0) break;
      io_uring_cqe_seen(&ring, cqe);
      --in_ring;
    }
    for (File& f : slots) {
      if (f.fd >= 0) close(f.fd);
    }
    io_uring_queue_exit(&ring);
    sink_.fetch_xor(hashes, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> sink_{0};
  uint64_t file_bytes_;
  uint32_t depth_;
  bool direct_;
  bool per_thread_;
  std::vector<Buffer> own_;
  std::vector<uint8_t*> buffers_;
};

// ---------------------------------------------------------------------------------------------------------------
// Engine side

// --copier none: the engine's disk path alone (reads verified into staging slots, stores checksummed from the slots,
// tmp + link publication), as when the bytes between slot and model memory are moved by someone else: the CUDA
// copier's DMA, or vLLM's workers copying from the shared pool (the path kvtier's vLLM adapter uses). Every copy
// completes at once and touches no bytes.
class NullCopier final : public DeviceCopier {
 public:
  std::string_view name() const override { return "none (bench io --copier none)"; }
  void SetWakeup(std::function<void()> wakeup) override { wakeup_ = std::move(wakeup); }
  void Submit(std::vector<CopyTask> batch) override {
    for (const CopyTask& t : batch) done_.push_back(CopyDone{t.id, Status()});
    if (!batch.empty() && wakeup_) wakeup_();
  }
  void Poll(std::vector<CopyDone>* done) override {
    done->insert(done->end(), done_.begin(), done_.end());
    done_.clear();
  }
  size_t pending() const override { return done_.size(); }
  std::unique_ptr<DeviceCopier> CreateLane() const override { return std::make_unique<NullCopier>(); }

 private:
  std::vector<CopyDone> done_;
  std::function<void()> wakeup_;
};

class EngineBench {
 public:
  EngineBench(const std::string& root, uint64_t chunk_bytes, uint32_t depth, IoBackend backend, IoMode mode,
              uint64_t salt, bool host_copier, uint32_t reactors = 0,
              uint64_t read_piece_bytes = EngineOptions{}.read_piece_bytes)
      : root_(root), depth_(depth), salt_(salt) {
    if (mkdir(root_.c_str(), 0750) != 0 && errno != EEXIST) {
      throw CliError("cannot create " + root_ + ": " + std::strerror(errno));
    }
    // Identity geometry whose payload is exactly the chunk size: 16 blocks when they stay 4 KiB-aligned.
    bpc_ = chunk_bytes % (16 * kPayloadAlignment) == 0 ? 16 : 1;
    block_bytes_ = chunk_bytes / bpc_;
    EngineOptions o;
    o.root = root_;
    o.identity.model = "kvtier-bench-io";
    o.identity.revision = "chunk-" + std::to_string(chunk_bytes);
    o.identity.kv_dtype = "uint8";
    o.identity.tokens_per_chunk = bpc_;
    o.identity.blocks_per_chunk = bpc_;
    o.identity.block_bytes = block_bytes_;
    o.io_depth = depth;
    o.reactors = reactors;
    o.read_piece_bytes = read_piece_bytes;
    o.backend = backend;
    o.io_mode = mode;
    o.op_timeout_ms = 120000;
    slot_bytes_ = kHeaderBytes + chunk_bytes;
    o.pool_bytes = 2ull * depth * slot_bytes_;
    pool_bytes_ = o.pool_bytes;
    auto e = Engine::Open(o);
    if (!e.ok()) throw CliError("engine: " + e.status().message());
    engine_ = std::move(e.value());
    NamespaceIdentity id;
    id.model = o.identity.model;
    id.revision = o.identity.revision;
    id.kv_dtype = o.identity.kv_dtype;
    id.tokens_per_chunk = bpc_;
    id.blocks_per_chunk = bpc_;
    id.block_bytes = block_bytes_;
    id.layout_tag = o.identity.layout_tag;
    ns_path_ = root_ + "/" + NamespaceDirName(id);
    for (uint32_t i = 0; i < depth; ++i) {
      host_.push_back(AllocFilled(chunk_bytes, 2000 + i));
      // Chunk i loads into host buffer i % depth: chunks in flight together may share one (their bytes are not read).
      KVTIER_BENIGN_RACE(host_.back().get(), chunk_bytes, "bench io: load destinations shared by chunks in flight");
    }
    if (!host_copier) FillPoolIncompressible();
    // vLLM's path, through JobClient: each job one stream of a StreamPump over the engine's slot API, its copies
    // on one copier lane per reactor (the host copier's lanes are threads: memcpys spread over cores).
    JobClientOptions co;
    co.max_window = 2 * depth;  // a stream's window, as the vLLM manager sets it
    co.copy_lanes = host_copier ? std::max<uint32_t>(1, engine_->reactors()) : 1;
    auto client = JobClient::Create(engine_.get(), host_copier ? nullptr : std::make_unique<NullCopier>(), co);
    if (!client.ok()) throw CliError("job client: " + client.status().ToString());
    client_ = std::move(client).value();
    lanes_ = co.copy_lanes;
  }

  double Write(uint64_t n, uint32_t rep) { return Run(n, rep, JobKind::kStore); }
  double Read(uint64_t n, uint32_t rep) { return Run(n, rep, JobKind::kLoad); }
  std::string FilePath(uint32_t rep, uint64_t i) const { return ns_path_ + "/" + ChunkRelPath(Key(rep, i)); }
  // The paths of chunks 0..n-1 of repetition rep, for the raw reader on the engine's files (--cross, --reread).
  std::vector<std::string> FilePaths(uint32_t rep, uint64_t n) const {
    std::vector<std::string> paths;
    paths.reserve(n);
    for (uint64_t i = 0; i < n; ++i) paths.push_back(FilePath(rep, i));
    return paths;
  }
  void Remove(uint64_t n, uint32_t rep) {
    for (uint64_t i = 0; i < n; ++i) unlink(FilePath(rep, i).c_str());
  }
  void RemoveAll() {
    client_.reset();
    engine_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  uint64_t pool_bytes() const { return pool_bytes_; }
  // The engine's reactor threads (I1), printed beside its figures: --reactors 0 (auto) resolved as the engine did.
  std::string reactors() const { return std::to_string(engine_->reactors()); }
  std::string Describe() const { return engine_->Describe(); }
  // Mean physically contiguous pieces per slot-sized stretch of the engine's pool, seen through a second mapping
  // of its shared memory (0: unknown).
  double PoolPiecesPerSlot() const {
    const int fd = shm_open(engine_->pool_name().c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct stat st;
    void* p = fstat(fd, &st) == 0 ? mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return 0;
    const uint64_t pieces = PhysicalPieces(static_cast<const uint8_t*>(p), static_cast<uint64_t>(st.st_size));
    munmap(p, st.st_size);
    return static_cast<double>(pieces) * static_cast<double>(slot_bytes_) / static_cast<double>(st.st_size);
  }
  StatsSnapshot Stats() const { return engine_->Stats(); }
  // The pump's counters over the last store or load stream.
  const std::string& StreamNote(bool store) const { return store ? store_note_ : load_note_; }
  // --copier none stores whatever the slots hold: fill every slot once, before any timed phase, with random words,
  // so that the data written is incompressible there too (a zram device compresses zero pages to nothing, which
  // would let the engine's writes skip work the raw writer pays). Only the slots' bytes: the pool's header, control
  // lines and stream board stay as the engine wrote them (the job client attaches to them).
  void FillPoolIncompressible() {
    auto pool = StagingPool::Attach(engine_->pool_name());
    if (!pool.ok()) throw CliError("cannot attach to the engine's pool: " + pool.status().ToString());
    std::mt19937_64 rng(salt_ ^ 0x706f6f6cull);
    for (uint32_t slot = 0; slot < (*pool)->num_slots(); ++slot) {
      auto* words = reinterpret_cast<uint64_t*>((*pool)->SlotData(slot));
      for (uint64_t i = 0; i < (*pool)->slot_bytes() / 8; ++i) words[i] = rng();
    }
  }
  // --raw-buffers pool: the first `n` slots of the engine's pool through a second mapping (StagingPool::Attach),
  // i.e. the very memory the engine's own transfers use. Valid while this object lives. The raw side overwrites
  // slots the engine may still keep as DRAM-resident; harmless here because the bench never loads a key twice.
  std::vector<uint8_t*> PoolSlots(uint32_t n) {
    if (!attached_) {
      auto pool = StagingPool::Attach(engine_->pool_name());
      if (!pool.ok()) throw CliError("cannot attach to the engine's pool: " + pool.status().ToString());
      attached_ = std::move(pool).value();
    }
    if (attached_->slot_bytes() < kHeaderBytes + uint64_t(bpc_) * engine_->block_stride()) {
      throw CliError("the engine's pool slots are smaller than a chunk file");
    }
    std::vector<uint8_t*> out;
    for (uint32_t i = 0; i < n && i < attached_->num_slots(); ++i) out.push_back(attached_->SlotData(i));
    return out;
  }

 private:
  ChunkKey Key(uint32_t rep, uint64_t i) const {
    uint8_t b[32];
    std::mt19937_64 rng(salt_ ^ (uint64_t{rep} << 40) ^ i);
    for (int k = 0; k < 32; k += 8) {
      const uint64_t w = rng();
      std::memcpy(b + k, &w, 8);
    }
    return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
  }

  double Run(uint64_t n, uint32_t rep, JobKind kind) {
    const bool store = kind == JobKind::kStore;
    std::vector<ChunkTransfer> chunks;
    chunks.reserve(n);
    const uint64_t stride = engine_->block_stride();
    for (uint64_t i = 0; i < n; ++i) {
      ChunkTransfer t;
      t.key = Key(rep, i);
      uint8_t* host = host_[i % host_.size()].get();
      for (uint32_t b = 0; b < bpc_; ++b) {
        t.segments.push_back(
            CopySegment{b * stride, reinterpret_cast<uint64_t>(host + b * block_bytes_), block_bytes_});
      }
      chunks.push_back(std::move(t));
    }
    std::vector<ChunkKey> keys;
    for (const ChunkTransfer& t : chunks) keys.push_back(t.key);
    if (!store) EmptyDramTier(keys);
    const StatsSnapshot before = engine_->Stats();
    const StreamStats pump_before = client_->stream_stats();
    const auto t0 = Clock::now();
    Result<JobId> id = store ? client_->SubmitStore(std::move(chunks)) : client_->SubmitLoad(std::move(chunks));
    if (!id.ok()) throw CliError("engine: submit: " + id.status().message());
    auto r = client_->Wait(*id, 3600 * 1000);
    const double secs = Seconds(t0, Clock::now());
    if (!r.ok()) throw CliError("engine: wait: " + r.status().message());
    if (!r->all_ok()) {
      for (const ChunkOutcome& c : r->chunks) {
        if (!c.status.ok()) {
          throw CliError(std::string("engine: ") + (store ? "store" : "load") + " of " +
                         std::to_string(r->chunks.size() - r->chunks_ok) +
                         " chunks failed, first: " + c.status.ToString());
        }
      }
    }
    const StreamStats pump_after = client_->stream_stats();
    (store ? store_note_ : load_note_) = "stream: " + std::to_string(pump_after.slot_waits - pump_before.slot_waits) +
                                         " slot waits, peak window " + std::to_string(pump_after.peak_window) + ", " +
                                         std::to_string(lanes_) + " copier lanes";
    // Every chunk must have crossed the disk: a load served from chunks still resident after their store
    // (write-through) would measure memory, not the disk.
    const StatsSnapshot after = engine_->Stats();
    const uint64_t moved = store ? after.bytes_written - before.bytes_written : after.bytes_read - before.bytes_read;
    if (moved < n * slot_bytes_) {
      throw CliError(std::string("engine: stream ") + (store ? "store wrote " : "load read ") + FormatSize(moved) +
                     " of " + FormatSize(n * slot_bytes_) + " (chunks served from the DRAM tier)");
    }
    return secs;
  }

  // Untimed, before a stream load: chunks a stream store leaves resident (write-through DRAM tier) would be loaded
  // from memory, not from the disk this bench measures. Reserving every slot for keys never stored
  // evicts them (the tier's victims give way); giving the reservations back leaves the pool empty.
  // A slot whose write just ended may not give way yet: again until none of keys is resident (at most 10 s).
  void EmptyDramTier(const std::vector<ChunkKey>& keys) {
    for (int attempt = 0; attempt < 10000; ++attempt) {
      std::vector<ChunkKey> held;
      for (uint64_t i = 0; i < pool_bytes_ / slot_bytes_; ++i) {
        const ChunkKey k = Key(0xffffffffu, i);
        auto r = engine_->ReserveForStore(std::span<const ChunkKey>(&k, 1));
        if (!r.ok() || !(*r)[0]) break;
        held.push_back(k);
      }
      engine_->CommitStore(held, false);
      bool resident = false;
      for (const ChunkKey& k : keys) resident |= engine_->Residency(k) != PromoteState::kMiss;
      if (!resident) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::string root_;
  uint32_t depth_;
  uint64_t salt_;
  uint32_t bpc_ = 16;
  uint64_t block_bytes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t pool_bytes_ = 0;
  std::string ns_path_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<StagingPool> attached_;  // --raw-buffers pool
  std::vector<Buffer> host_;
  uint32_t lanes_ = 1;
  std::string store_note_, load_note_;  // the last stream of each kind (--verbose)
  std::unique_ptr<JobClient> client_;   // declared last: stopped before the engine goes
};

struct Row {
  uint64_t chunk = 0;
  uint32_t depth = 0;
  uint64_t files = 0;
  uint64_t pool = 0;
  std::vector<double> raw_w, eng_w, raw_r, eng_r;  // GB/s per repetition
  std::vector<double> cross_r;                     // --cross: raw reads of the engine's files
  // --reread: the last repetition's files read again, readers in rotating order (GB/s per rotation).
  std::vector<double> at_rest_own, at_rest_cross, at_rest_eng;
  std::vector<double> at_rest_touch;  // --touch: raw reads of the engine's files that also sum every byte
  // --touch: writes at rest, the three writers rotating (raw, raw reading every byte first, engine).
  std::vector<double> rest_w_raw, rest_w_touch, rest_w_eng;
  std::string reactors;              // the engine's reactor threads, as EngineBench::reactors() says
  std::vector<RawVariant> variants;  // the multi-threaded raw baseline's variants that fit this depth
  std::vector<std::string> skipped;  // and those that did not (--raw-queue total, more threads than the depth)
};

// --raw-threads, --raw-split, --raw-queue.
struct RawCeilingOptions {
  std::vector<uint32_t> threads;  // thread counts
  std::vector<uint64_t> splits;   // request sizes besides whole files
  bool per_thread_queue = false;
  bool verify = false;  // --raw-verify: every variant also with XXH3 over every byte
};

RawCeilingOptions ParseRawCeiling(const CliArgs& args) {
  RawCeilingOptions o;
  const std::string threads = args.Str("raw-threads", "auto");
  if (threads == "auto") {
    const auto cores = static_cast<uint32_t>(std::max(1u, std::thread::hardware_concurrency()));
    for (uint32_t t = 1; t <= 8 && t <= cores; t *= 2) o.threads.push_back(t);
  } else {
    for (uint64_t t : args.UintList("raw-threads", "1")) {
      if (t > 256) throw UsageError("--raw-threads: " + std::to_string(t) + " is above 256");
      if (std::find(o.threads.begin(), o.threads.end(), t) == o.threads.end()) {
        o.threads.push_back(static_cast<uint32_t>(t));
      }
    }
  }
  if (args.Str("raw-split", "4MiB,1MiB") != "none") {
    for (uint64_t s : args.SizeList("raw-split", "4MiB,1MiB")) {
      if (s % kPayloadAlignment != 0) {
        throw UsageError("--raw-split: " + FormatSize(s) +
                         " is not a multiple of 4KiB (O_DIRECT needs aligned requests)");
      }
      if (s > (1ull << 30)) throw UsageError("--raw-split: " + FormatSize(s) + " is above 1GiB");
      if (std::find(o.splits.begin(), o.splits.end(), s) == o.splits.end()) o.splits.push_back(s);
    }
  }
  o.per_thread_queue = args.Choice("raw-queue", "total", {"total", "per-thread"}) == "per-thread";
  o.verify = args.Has("raw-verify");
  return o;
}

// The variants for one chunk size and depth: every thread count with whole files and with each split smaller
// than a file, less the single-thread whole-file one (that is the raw baseline itself); with --raw-verify each of
// them (the single-thread whole-file one included) once more with XXH3 over every byte.
void PlanVariants(const RawCeilingOptions& o, uint64_t file_bytes, uint32_t depth, Row* row) {
  for (const bool verify : {false, true}) {
    if (verify && !o.verify) continue;
    for (uint32_t t : o.threads) {
      std::vector<uint64_t> splits = {0};
      for (uint64_t s : o.splits) {
        if (s < file_bytes) splits.push_back(s);
      }
      for (uint64_t s : splits) {
        if (t == 1 && s == 0 && !verify) continue;
        RawVariant v;
        v.threads = t;
        v.split = s;
        v.verify = verify;
        if (!o.per_thread_queue && t > depth) {
          row->skipped.push_back(v.Short());
        } else {
          row->variants.push_back(v);
        }
      }
    }
  }
}

// The best raw figure of one direction: the single-thread baseline or a variant, by median GB/s.
struct RawBest {
  std::string label = "t1/whole";
  uint32_t threads = 1;
  uint64_t split = 0;
  const std::vector<double>* gbps = nullptr;
};
RawBest BestOf(const Row& r, bool write) {
  RawBest b;
  b.gbps = write ? &r.raw_w : &r.raw_r;
  for (const RawVariant& v : r.variants) {
    if (v.verify) continue;
    const std::vector<double>& g = write ? v.write_gbps : v.read_gbps;
    if (!g.empty() && Median(g) > Median(*b.gbps)) b = RawBest{v.Short(), v.threads, v.split, &g};
  }
  return b;
}

// The best of the --raw-verify variants (the raw readers and writers that also hash every byte); gbps is null
// without them.
RawBest BestVerifyOf(const Row& r, bool write) {
  RawBest b;
  b.label.clear();
  for (const RawVariant& v : r.variants) {
    const std::vector<double>& g = write ? v.write_gbps : v.read_gbps;
    if (!v.verify || g.empty()) continue;
    if (b.gbps == nullptr || Median(g) > Median(*b.gbps)) b = RawBest{v.Short(), v.threads, v.split, &g};
  }
  return b;
}

// Pairs engine and raw figures measured together (one repetition, seconds apart, so a drift of the disk between
// repetitions cancels) and takes the median of engine/raw over the pairs.
double PairedRatio(const std::vector<double>& eng, const std::vector<double>& raw) {
  std::vector<double> v;
  for (size_t i = 0; i < eng.size() && i < raw.size(); ++i) v.push_back(eng[i] / raw[i]);
  return Median(v);
}

// Single-thread memcpy and XXH3 speeds: the engine's two per-byte CPU costs, for reading the ratio.
void PrintCpuContext() {
  const uint64_t bytes = 64ull << 20;
  Buffer a = AllocFilled(bytes, 1), b = AllocFilled(bytes, 2);
  auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) std::memcpy(b.get(), a.get(), bytes);
  const double copy = 4.0 * bytes / Seconds(t0, Clock::now()) / 1e9;
  t0 = Clock::now();
  uint64_t sink = 0;
  for (int i = 0; i < 4; ++i) sink += BlockChecksum(a.get(), bytes, i);
  const double xxh = 4.0 * bytes / Seconds(t0, Clock::now()) / 1e9;
  // The host copier's copy out of a slot, through its own thread, for the same bytes (as 16 segments).
  auto copier = CreateHostCopier();
  copier->SetWakeup([] {});
  t0 = Clock::now();
  for (int i = 0; i < 4; ++i) {
    CopyTask task;
    task.id = static_cast<uint64_t>(i);
    task.slot_data = a.get();
    task.slot_bytes = bytes;
    for (uint64_t off = 0; off < bytes; off += bytes / 16) {
      task.segments.push_back(CopySegment{off, reinterpret_cast<uint64_t>(b.get() + off), bytes / 16});
    }
    std::vector<CopyTask> batch;
    batch.push_back(std::move(task));
    copier->Submit(std::move(batch));
    std::vector<CopyDone> done;
    while (done.empty()) {
      copier->Poll(&done);
      if (done.empty()) std::this_thread::yield();
    }
  }
  const double copy_out = 4.0 * bytes / Seconds(t0, Clock::now()) / 1e9;
  std::printf(
      "cpu context: one thread memcpy %.2f GB/s, XXH3-64 (%s build) %.2f GB/s (sink %llx); host copier "
      "copy-out of 64 MiB, %s: %.2f GB/s\n",
      copy, std::string(internal::Xxh3Variant()).c_str(), xxh, static_cast<unsigned long long>(sink & 0xf),
      HostCopierStreams(bytes) ? "streaming stores" : "memcpy", copy_out);
}

// Each run works in DIR/kvtier-bench-io.<pid>, which it holds locked (flock) while it lives. A run killed with
// SIGKILL cannot remove its directory; the next run does: a directory of exactly that name form that nobody holds
// locked and that has not changed for a minute (so a run that has just created its directory and not yet locked it
// is never taken). Returns how many it removed.
int RemoveLeftoversOfKilledRuns(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  const std::string prefix = "kvtier-bench-io.";
  int removed = 0;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) continue;
    names.push_back(name);
  }
  closedir(d);
  const time_t now = time(nullptr);
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    if (now - st.st_mtime < 60) continue;
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {  // nobody holds it: its run is gone
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
      if (ec) {
        std::fprintf(stderr, "bench io: warning: could not remove %s, left by a killed run: %s\n", path.c_str(),
                     ec.message().c_str());
      } else {
        std::printf("bench io: removed %s, left by a run that was killed\n", path.c_str());
        ++removed;
      }
    }
    close(fd);
  }
  return removed;
}

}  // namespace

namespace {

// The flags of `kvtier bench io`: what it measures, then diagnostics (--help lists them in this order).
std::vector<FlagSpec> BenchIoMeasureFlags() {
  return {{"dir", "DIR", "directory on the disk to measure (a subdirectory is created and removed)", ""},
          {"chunk-sizes", "SIZES", "comma-separated chunk payload sizes", "28MiB,2MiB"},
          {"depths", "LIST", "comma-separated queue depths", "4,16"},
          {"total", "SIZE", "bytes written (and read) per run", "2GiB"},
          {"repeat", "N", "repetitions per configuration; even, so that each side goes first equally often", "4"},
          {"backend", "auto|uring|posix", "engine I/O backend", "auto"},
          {"mode", "direct|buffered", "O_DIRECT or buffered I/O, for both raw and engine", "direct"},
          {"raw-buffers", "huge|heap|shm|pool",
           "memory of the raw baseline's buffers: huge = heap in 2 MiB "
           "transparent huge pages (physically contiguous like the engine's pool, the strongest baseline), heap = "
           "4 KiB pages, shm = POSIX shared memory with 4 KiB pages, pool = the engine's own staging slots (a "
           "second mapping of its pool, with 4 KiB page-table entries: both sides transfer into the same "
           "physical memory; peak RSS then counts the pool twice)",
           "huge"},
          {"raw-threads", "LIST|auto",
           "thread counts of the multi-threaded raw baseline (the device's ceiling: "
           "same files and request sizes, each thread with its own ring; 'raw best' is the best of it and the "
           "single-thread baseline); auto = 1,2,4,8 up to the number of cores",
           "auto"},
          {"raw-split", "SIZES|none",
           "request sizes the multi-threaded raw baseline also splits each file into "
           "(all of a file's requests at once; multiples of 4KiB), besides one request per file",
           "4MiB,1MiB"},
          {"raw-queue", "total|per-thread",
           "files in flight in the multi-threaded raw baseline: total = the depth "
           "over all threads, as in the engine (thread counts above the depth are skipped), per-thread = the "
           "depth on each thread",
           "total"},
          {"raw-verify", "",
           "also run every raw variant (the single-thread whole-file one included) hashing every "
           "byte with XXH3 as the engine does (a read hashes each request as it lands, a write hashes the file "
           "before writing it): 'raw+xxh3 best', the floor of a program doing the engine's work, printed beside "
           "'raw best' with the engine's ratio to it",
           ""},
          {"keep-cache", "",
           "do not drop the page cache (and dentry/inode caches) before reads (default with "
           "--mode direct: O_DIRECT data never sits in the page cache, and dropping only evicts directory "
           "entries, which penalizes the engine's two-level fan-out against the raw side's single directory)",
           ""},
          {"drop-caches", "", "drop the page cache before reads also with --mode direct (default with buffered)", ""},
          {"copier", "host|none",
           "what moves the bytes between host buffers and staging slots: host = the "
           "host copier (memcpy, as vLLM's CPU workers and the Python package's jobs copy), none = nobody "
           "(the engine's disk path alone: verified reads into slots, checksummed stores from slots, as when the "
           "CUDA copier or vLLM's workers move the bytes)",
           "host"},
          {"reactors", "N",
           "engine reactor threads (EngineOptions::reactors; 0 = auto, sized from the cores); the "
           "count used is printed with the engine's description",
           "0"},
          {"read-piece", "SIZE",
           "EngineOptions::read_piece_bytes: a load reads its chunk in pieces of about this "
           "size, each verified as it lands (0: one read per chunk)",
           "1MiB"}};
}

std::vector<FlagSpec> BenchIoDiagnosticFlags() {
  return {{"json", "OUT", "also write the results as JSON to OUT", ""},
          {"verbose", "", "print every run, CPU use per phase and this machine's memcpy/XXH3 speed", ""},
          {"cross", "",
           "also time the raw reader on the engine's chunk files after each read phase (diagnostic: "
           "separates where the engine's files lie on the disk from the engine's own costs; in "
           "the JSON as raw_reads_engine_files_gbps)",
           ""},
          {"reread", "N",
           "after the last repetition of each configuration, read its files N more times, the "
           "three readers (raw on its own files, raw on the engine's files, engine) in rotating order, and "
           "print their medians and ratios as a second table (diagnostic: reads of data at rest, away from the "
           "write phases, and the engine against the raw reader on the very same files)",
           "0"},
          {"touch", "",
           "with --reread: also time a raw reader and a raw writer that read every byte once from "
           "memory (a plain sum; the least a load that verifies and a store that checksums, K1, must do): a "
           "fourth reader in the rotation at rest (the raw reader on the engine's files, summing what it loaded), "
           "then N rotations of three writers at rest (raw, raw reading each buffer before writing it, engine; "
           "each writer's files removed before the next one writes); printed as raw+touch with engine/(raw+touch) "
           "(diagnostic: what touching the data costs the disk, apart from the engine's own costs)",
           ""},
          {"trace-marks", "PATH",
           "write a line at the start and end of every timed phase to PATH, e.g. "
           "/sys/kernel/tracing/trace_marker, to cut a kernel trace of the block layer into phases "
           "(bench/io/trace_bench_io.sh does it all)",
           ""},
          {"progress", "", "show a progress bar even when stderr is not a terminal", ""}};
}

// What `kvtier bench io` was asked, checked before anything is created.
struct BenchIoConfig {
  std::string dir;
  std::vector<uint64_t> sizes, depths;
  uint64_t total = 0, repeat = 0, reread = 0, reactors = 0, read_piece = 0;
  std::string backend_s, mode_s, marks_path, raw_memory;
  bool verbose = false, cross = false, touch = false, host_copier = true, direct = true;
  IoBackend backend = IoBackend::kAuto;
  RawCeilingOptions ceiling;
  bool keep_cache = false;        // the page cache is not dropped before reads
  bool keep_cache_given = false;  // --keep-cache
  bool show_progress = false;     // --progress
  std::optional<std::string> json_path;
};

BenchIoConfig ParseBenchIo(const CliArgs& args) {
  BenchIoConfig c;
  c.dir = args.RequiredStr("dir");
  c.sizes = args.SizeList("chunk-sizes", "28MiB,2MiB");
  c.depths = args.UintList("depths", "4,16");
  c.total = args.Size("total", 2ull << 30);
  c.repeat = args.Uint("repeat", 4);
  c.backend_s = args.Choice("backend", "auto", {"auto", "uring", "posix"});
  c.mode_s = args.Choice("mode", "direct", {"direct", "buffered"});
  c.verbose = args.Has("verbose");
  c.cross = args.Has("cross");
  c.reread = args.Uint("reread", 0);
  c.touch = args.Has("touch");
  c.marks_path = args.Str("trace-marks");
  if (args.Has("trace-marks") && c.marks_path.empty()) throw UsageError("--trace-marks: needs a path");
  c.raw_memory = args.Choice("raw-buffers", "huge", {"huge", "heap", "shm", "pool"});
  c.host_copier = args.Choice("copier", "host", {"host", "none"}) == "host";
  c.ceiling = ParseRawCeiling(args);
  c.reactors = args.Uint("reactors", 0);
  c.read_piece = args.Size("read-piece", EngineOptions{}.read_piece_bytes);
  if (c.read_piece > (1ull << 30)) throw UsageError("--read-piece: " + FormatSize(c.read_piece) + " is above 1GiB");
  if (c.reactors > kMaxReactors) {
    throw UsageError("--reactors: must be 0 (auto) or 1.." + std::to_string(kMaxReactors));
  }
  for (uint64_t s : c.sizes) {
    if (s % kPayloadAlignment != 0) {
      throw UsageError("--chunk-sizes: " + FormatSize(s) + " is not a multiple of 4KiB (the payload alignment)");
    }
    if (s > (1ull << 30)) throw UsageError("--chunk-sizes: " + FormatSize(s) + " is above 1GiB");
  }
  for (uint64_t d : c.depths) {
    if (d > 1024) throw UsageError("--depths: " + std::to_string(d) + " is above 1024");
  }
  if (c.repeat == 0 || c.repeat > 100) throw UsageError("--repeat: must be 1..100");
  if (c.reread > 100) throw UsageError("--reread: must be 0..100");
  if (c.touch && c.reread == 0) throw UsageError("--touch: needs --reread N (it adds readers and writers at rest)");
  if (c.touch && c.raw_memory == "pool") {
    throw UsageError("--touch: needs buffers of its own, not --raw-buffers pool");
  }
  if (c.total == 0) throw UsageError("--total: must be > 0");
  if (args.Has("keep-cache") && args.Has("drop-caches")) {
    throw UsageError("--keep-cache and --drop-caches exclude each other");
  }
  c.direct = c.mode_s == "direct";
  c.backend = c.backend_s == "uring"   ? IoBackend::kUring
              : c.backend_s == "posix" ? IoBackend::kPosix
                                       : IoBackend::kAuto;
  c.keep_cache_given = args.Has("keep-cache");
  c.keep_cache = c.keep_cache_given || (c.direct && !args.Has("drop-caches"));
  c.show_progress = args.Has("progress");
  if (args.Has("json")) c.json_path = args.Str("json");
  return c;
}

// --dir is a writable directory whose filesystem takes O_DIRECT (with --mode direct), on a kernel with io_uring;
// g_disk is its device.
void CheckBenchDir(const BenchIoConfig& c) {
  struct stat st;
  if (stat(c.dir.c_str(), &st) != 0) throw CliError("--dir " + c.dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw CliError("--dir " + c.dir + " is not a directory");
  g_disk = st.st_dev;
  if (access(c.dir.c_str(), W_OK) != 0) {
    throw CliError("--dir " + c.dir + " is not writable: " + std::strerror(errno));
  }
  if (c.direct) {
    const int fd = open(c.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const DirectIoInfo dio = ProbeDirectIo(fd);
    close(fd);
    if (!dio.supported || dio.mem_align > 4096 || dio.offset_align > 4096) {
      throw CliError("the filesystem of " + c.dir + " refuses O_DIRECT (" + dio.how + "); use --mode buffered");
    }
  }
  std::string why;
  if (!UringAvailable(&why)) throw CliError("io_uring is unavailable on this kernel: " + why);
}

// The run's own directory under --dir, created and locked for as long as it lives (RemoveLeftoversOfKilledRuns
// removes one whose lock nobody holds); Remove() takes it and everything in it away.
class BenchDir {
 public:
  explicit BenchDir(const std::string& dir) : path_(dir + "/kvtier-bench-io." + std::to_string(getpid())) {
    if (mkdir(path_.c_str(), 0750) != 0) throw CliError("cannot create " + path_ + ": " + std::strerror(errno));
    lock_ = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock_ < 0 || flock(lock_, LOCK_EX) != 0) {
      const std::string why = std::strerror(errno);
      if (lock_ >= 0) close(lock_);
      rmdir(path_.c_str());
      throw CliError("cannot lock " + path_ + ": " + why);
    }
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  ~BenchDir() {
    Remove();
    close(lock_);
  }
  const std::string& path() const { return path_; }
  void Remove() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

 private:
  std::string path_;
  int lock_ = -1;
};

// A run while it measures: its options, where its files go, its phase marks and progress, and what the engine said.
struct BenchRun {
  const BenchIoConfig& c;
  std::string base;
  PhaseMarks& marks;
  ProgressBar& progress;
  bool drop_ok = false;
  uint64_t salt = 0;
  uint64_t steps = 0;
  std::string engine_described;
};

// The sides of one cell (chunk size and depth) and the bytes each run moves.
struct BenchCell {
  EngineBench& eng;
  RawBench& raw;
  RawParallel& par;
  uint64_t chunk;
  uint32_t depth;
  double gb;
};

double TimedWithCpu(const std::function<double()>& fn, std::string* cpu) {
  CpuSample c0 = CpuSample::Now();
  const double secs = fn();
  *cpu = CpuSummary(c0, CpuSample::Now());
  return secs;
}

// The multi-threaded raw variants of a repetition: each writes files of its own (removed at once) and reads the raw
// baseline's files.
void RunVariants(BenchRun& run, BenchCell& cell, Row& row, uint32_t rep, const std::string& tag, bool write) {
  for (RawVariant& v : row.variants) {
    const std::string files_tag = write ? "p" + tag : tag;
    const std::string phase = v.Mark(write);
    if (!write && run.drop_ok) DropPageCache();
    std::string cpu;
    const double secs = TimedWithCpu(
        [&] {
          return run.marks.Around(phase.c_str(), cell.chunk, cell.depth, rep, [&] {
            return cell.par.Run(
                v, row.files, [&](uint64_t i) { return cell.raw.Path(files_tag, i); }, write);
          });
        },
        &cpu);
    if (write) cell.raw.Remove(row.files, files_tag);
    (write ? v.write_gbps : v.read_gbps).push_back(cell.gb / secs);
    if (run.c.verbose) {
      std::printf("  %s qd %u rep %u raw %-10s %s %.3f GB/s (%s)\n", FormatSize(cell.chunk).c_str(), cell.depth, rep,
                  v.Short().c_str(), write ? "write" : "read ", cell.gb / secs, cpu.c_str());
    }
  }
}

// Reads at rest after a cell's last repetition: each rotation runs the three readers (four with --touch), each one
// first in turn, so neither a drift of the disk nor the slow first read after the writes favours one of them.
void ReadAtRest(BenchRun& run, BenchCell& cell, Row& row, uint32_t rep, const std::string& tag) {
  const BenchIoConfig& c = run.c;
  const std::vector<std::string> paths = cell.eng.FilePaths(rep, row.files);
  const uint64_t readers = c.touch ? 4 : 3;
  for (uint64_t a = 0; a < c.reread; ++a) {
    double own = 0, crossed = 0, engine = 0, touched = 0;
    for (uint64_t j = 0; j < readers; ++j) {
      if (run.drop_ok) DropPageCache();
      const uint64_t at = c.repeat + a;  // rotations are numbered after the repetitions in the marks
      auto around = [&](const char* phase, auto fn) { return run.marks.Around(phase, cell.chunk, cell.depth, at, fn); };
      switch ((a + j) % readers) {
        case 0: own = around("rest_raw_read", [&] { return cell.raw.Read(row.files, tag); }); break;
        case 1: crossed = around("rest_cross_read", [&] { return cell.raw.ReadPaths(paths); }); break;
        case 2: engine = around("rest_eng_read", [&] { return cell.eng.Read(row.files, rep); }); break;
        default: touched = around("rest_touch_read", [&] { return cell.raw.ReadPathsTouching(paths); }); break;
      }
    }
    const double gb = cell.gb;
    row.at_rest_own.push_back(gb / own);
    row.at_rest_cross.push_back(gb / crossed);
    row.at_rest_eng.push_back(gb / engine);
    if (c.touch) row.at_rest_touch.push_back(gb / touched);
    if (c.verbose) {
      std::printf(
          "  %s qd %u reread %llu: raw on its files %.3f, raw on the engine's files %.3f, engine "
          "%.3f GB/s%s\n",
          FormatSize(cell.chunk).c_str(), cell.depth, static_cast<unsigned long long>(a), gb / own, gb / crossed,
          gb / engine, c.touch ? (", raw+touch on the engine's files " + FormatFixed(gb / touched, 3)).c_str() : "");
    }
    std::fflush(stdout);
    run.progress.Set(++run.steps);
  }
}

// --touch: writes at rest, rotating like the reads; each writer's files go before the next one writes, so every
// writer finds the disk in the same state (the engine writes new keys each time).
void WriteAtRest(BenchRun& run, BenchCell& cell, Row& row) {
  const BenchIoConfig& c = run.c;
  for (uint64_t a = 0; a < c.reread; ++a) {
    double w_raw = 0, w_touch = 0, w_eng = 0;
    const uint64_t at = c.repeat + a;
    const auto eng_rep = static_cast<uint32_t>(2000 + a);
    auto around = [&](const char* phase, auto fn) { return run.marks.Around(phase, cell.chunk, cell.depth, at, fn); };
    for (uint64_t j = 0; j < 3; ++j) {
      switch ((a + j) % 3) {
        case 0:
          w_raw = around("rest_raw_write", [&] { return cell.raw.Write(row.files, "w"); });
          cell.raw.Remove(row.files, "w");
          break;
        case 1:
          w_touch = around("rest_touch_write", [&] { return cell.raw.WriteTouching(row.files, "w"); });
          cell.raw.Remove(row.files, "w");
          break;
        default:
          w_eng = around("rest_eng_write", [&] { return cell.eng.Write(row.files, eng_rep); });
          cell.eng.Remove(row.files, eng_rep);
          break;
      }
    }
    const double gb = cell.gb;
    row.rest_w_raw.push_back(gb / w_raw);
    row.rest_w_touch.push_back(gb / w_touch);
    row.rest_w_eng.push_back(gb / w_eng);
    if (c.verbose) {
      std::printf("  %s qd %u rewrite %llu: raw %.3f, raw+touch %.3f, engine %.3f GB/s\n",
                  FormatSize(cell.chunk).c_str(), cell.depth, static_cast<unsigned long long>(a), gb / w_raw,
                  gb / w_touch, gb / w_eng);
    }
    std::fflush(stdout);
    run.progress.Set(++run.steps);
  }
}

// One repetition of a cell: both sides write, then both read, then both remove; the side that goes first alternates.
// Neither side reads right after its own writes, so a host-side cache of recent writes (virtual disks) and a drift
// of the disk during the run favour neither. The multi-threaded raw variants run after the pair in raw-first
// repetitions, before it in the others.
void RunRepetition(BenchRun& run, BenchCell& cell, Row& row, uint32_t rep) {
  const BenchIoConfig& c = run.c;
  const std::string tag = "r" + std::to_string(rep);
  double raw_w = 0, raw_r = 0, eng_w = 0, eng_r = 0;
  std::string raw_wc, raw_rc, eng_wc, eng_rc;
  // A phase run between its --trace-marks lines (outside the time it measures itself).
  auto phase = [&](const char* name, double* secs, std::string* cpu, auto fn) {
    *secs = TimedWithCpu([&] { return run.marks.Around(name, cell.chunk, cell.depth, rep, fn); }, cpu);
  };
  auto write_raw = [&] { phase("raw_write", &raw_w, &raw_wc, [&] { return cell.raw.Write(row.files, tag); }); };
  auto write_eng = [&] { phase("eng_write", &eng_w, &eng_wc, [&] { return cell.eng.Write(row.files, rep); }); };
  auto read_raw = [&] { phase("raw_read", &raw_r, &raw_rc, [&] { return cell.raw.Read(row.files, tag); }); };
  auto read_eng = [&] { phase("eng_read", &eng_r, &eng_rc, [&] { return cell.eng.Read(row.files, rep); }); };
  const bool raw_first = rep % 2 == 0;
  if (raw_first) {
    write_raw();
    write_eng();
    RunVariants(run, cell, row, rep, tag, true);
  } else {
    RunVariants(run, cell, row, rep, tag, true);
    write_eng();
    write_raw();
  }
  if (run.drop_ok) DropPageCache();
  if (raw_first) {
    read_raw();
    read_eng();
    RunVariants(run, cell, row, rep, tag, false);
  } else {
    RunVariants(run, cell, row, rep, tag, false);
    read_eng();
    read_raw();
  }
  const double gb = cell.gb;
  if (c.cross) {
    if (run.drop_ok) DropPageCache();
    const std::vector<std::string> paths = cell.eng.FilePaths(rep, row.files);
    double secs = 0;
    std::string cross_c;
    phase("cross_read", &secs, &cross_c, [&] { return cell.raw.ReadPaths(paths); });
    row.cross_r.push_back(gb / secs);
    if (c.verbose) {
      std::printf("  %s qd %u rep %u raw reads the engine's files %.3f GB/s (%s)\n", FormatSize(cell.chunk).c_str(),
                  cell.depth, rep, gb / secs, cross_c.c_str());
    }
  }
  if (rep + 1 == c.repeat && c.reread > 0) {
    ReadAtRest(run, cell, row, rep, tag);
    if (c.touch) WriteAtRest(run, cell, row);
  }
  cell.raw.Remove(row.files, tag);
  cell.eng.Remove(row.files, rep);
  row.raw_w.push_back(gb / raw_w);
  row.raw_r.push_back(gb / raw_r);
  row.eng_w.push_back(gb / eng_w);
  row.eng_r.push_back(gb / eng_r);
  if (c.verbose) {
    const std::string sz = FormatSize(cell.chunk);
    const char* size = sz.c_str();
    const uint32_t depth = cell.depth;
    std::printf(
        "  %s qd %u rep %u raw    write %.3f GB/s (%s)\n  %s qd %u rep %u raw    read  %.3f GB/s (%s)\n"
        "  %s qd %u rep %u engine write %.3f GB/s (%s)\n  %s qd %u rep %u engine read  %.3f GB/s (%s)\n",
        size, depth, rep, gb / raw_w, raw_wc.c_str(), size, depth, rep, gb / raw_r, raw_rc.c_str(), size, depth, rep,
        gb / eng_w, eng_wc.c_str(), size, depth, rep, gb / eng_r, eng_rc.c_str());
    std::printf("  %s qd %u rep %u engine write %s\n  %s qd %u rep %u engine read  %s\n", size, depth, rep,
                cell.eng.StreamNote(true).c_str(), size, depth, rep, cell.eng.StreamNote(false).c_str());
  }
  std::fflush(stdout);
  run.progress.Set(++run.steps);
}

// One cell (chunk size, depth): the engine, the raw baseline and its multi-threaded variants on the same files, an
// untimed warm-up, then --repeat repetitions.
Row MeasureCell(BenchRun& run, uint64_t chunk, uint32_t depth) {
  const BenchIoConfig& c = run.c;
  Row row;
  row.chunk = chunk;
  row.depth = depth;
  row.files = std::max<uint64_t>(1, c.total / chunk);
  const uint64_t file_bytes = kHeaderBytes + chunk;
  EngineBench eng(run.base + "/engine", chunk, depth, c.backend, c.direct ? IoMode::kDirect : IoMode::kBuffered,
                  run.salt ^ (chunk * 1315423911u) ^ depth, c.host_copier, static_cast<uint32_t>(c.reactors),
                  c.read_piece);
  RawBench raw(run.base + "/raw", file_bytes, depth, c.direct, c.raw_memory,
               c.raw_memory == "pool" ? eng.PoolSlots(depth) : std::vector<uint8_t*>{}, c.touch);
  row.pool = eng.pool_bytes();
  PlanVariants(c.ceiling, file_bytes, depth, &row);
  uint32_t max_threads = 1;
  for (const RawVariant& v : row.variants) max_threads = std::max(max_threads, v.threads);
  RawParallel par(file_bytes, depth, c.direct, c.ceiling.per_thread_queue, max_threads, c.raw_memory, raw.buffers());
  row.reactors = eng.reactors();
  if (run.engine_described.empty()) run.engine_described = eng.Describe();
  if (c.verbose) {
    const double rp = raw.PiecesPerBuffer(), ep = eng.PoolPiecesPerSlot();
    std::printf("  %s qd %u: physically contiguous pieces per %s transfer buffer: raw %s, engine %s\n",
                FormatSize(chunk).c_str(), depth, FormatSize(file_bytes).c_str(),
                rp > 0 ? FormatFixed(rp, 1).c_str() : "unknown", ep > 0 ? FormatFixed(ep, 1).c_str() : "unknown");
  }
  // Warm-up, untimed: faults in buffers and pool slots, creates the first fan-out directories.
  const uint64_t warm = std::min<uint64_t>(row.files, 2ull * depth);
  raw.Write(warm, "warm");
  raw.Read(warm, "warm");
  raw.Remove(warm, "warm");
  eng.Write(warm, 1000);
  eng.Read(warm, 1000);
  eng.Remove(warm, 1000);
  BenchCell cell{eng, raw, par, chunk, depth, static_cast<double>(row.files * file_bytes) / 1e9};
  for (uint32_t rep = 0; rep < c.repeat; ++rep) RunRepetition(run, cell, row, rep);
  raw.RemoveDir();
  eng.RemoveAll();
  return row;
}

std::string JsonArray(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + JsonNumber(v[i]);
  return s + "]";
}

std::string BestJson(const RawBest& b) {
  return "{\"variant\": " + JsonString(b.label) + ", \"threads\": " + std::to_string(b.threads) +
         ", \"request_bytes\": " + (b.split == 0 ? std::string("null") : std::to_string(b.split)) +
         ", \"median_gbps\": " + JsonNumber(Median(*b.gbps)) + "}";
}

// The report's tables: one line per cell and direction (the single-thread raw baseline, the best raw variant, the
// device's ceiling, and the engine, with the engine's ratio to each), the raw variants, and --raw-verify's floor.
struct BenchTables {
  TextTable t{{"chunk", "depth", "files", "pool", "op", "raw GB/s", "raw best GB/s", "best", "engine GB/s", "reactors",
               "ratio", "ratio to best"}};
  TextTable tv{{"chunk", "depth", "raw", "write GB/s", "read GB/s"}};
  TextTable tverify{{"chunk", "depth", "op", "raw+xxh3 best GB/s", "best", "engine GB/s", "ratio to raw+xxh3 best"}};
  bool any_variants = false, any_verify = false;
  std::string skipped_notes;
};

void AddRowToTables(const Row& r, BenchTables* tables) {
  const double rw = Median(r.raw_w), ew = Median(r.eng_w), rr = Median(r.raw_r), er = Median(r.eng_r);
  const RawBest bw = BestOf(r, true), br = BestOf(r, false);
  const RawBest vw = BestVerifyOf(r, true), vr = BestVerifyOf(r, false);
  if (vw.gbps != nullptr && vr.gbps != nullptr) {
    tables->any_verify = true;
    for (const bool write : {true, false}) {
      const RawBest& b = write ? vw : vr;
      tables->tverify.AddRow({FormatSize(r.chunk), std::to_string(r.depth), write ? "write" : "read",
                              FormatFixed(Median(*b.gbps), 3), b.label,
                              FormatFixed(Median(write ? r.eng_w : r.eng_r), 3),
                              FormatFixed(PairedRatio(write ? r.eng_w : r.eng_r, *b.gbps), 3)});
    }
  }
  for (const bool write : {true, false}) {
    const RawBest& b = write ? bw : br;
    tables->t.AddRow({FormatSize(r.chunk), std::to_string(r.depth), std::to_string(r.files), FormatSize(r.pool),
                      write ? "write" : "read", FormatFixed(write ? rw : rr, 3), FormatFixed(Median(*b.gbps), 3),
                      b.label, FormatFixed(write ? ew : er, 3), r.reactors,
                      FormatFixed(write ? PairedRatio(r.eng_w, r.raw_w) : PairedRatio(r.eng_r, r.raw_r), 3),
                      FormatFixed(PairedRatio(write ? r.eng_w : r.eng_r, *b.gbps), 3)});
  }
  const std::string mark_w = bw.label == "t1/whole" ? "*" : "", mark_r = br.label == "t1/whole" ? "*" : "";
  tables->tv.AddRow({FormatSize(r.chunk), std::to_string(r.depth), "t1/whole", FormatFixed(rw, 3) + mark_w,
                     FormatFixed(rr, 3) + mark_r});
  for (const RawVariant& v : r.variants) {
    tables->any_variants = true;
    tables->tv.AddRow({FormatSize(r.chunk), std::to_string(r.depth), v.Short(),
                       FormatFixed(Median(v.write_gbps), 3) + (bw.label == v.Short() ? "*" : ""),
                       FormatFixed(Median(v.read_gbps), 3) + (br.label == v.Short() ? "*" : "")});
  }
  if (!r.skipped.empty()) {
    tables->skipped_notes += "  " + FormatSize(r.chunk) + " depth " + std::to_string(r.depth) + ":";
    for (const std::string& k : r.skipped) tables->skipped_notes += " " + k;
    tables->skipped_notes += "\n";
  }
}

// The raw baseline's variants of a row, and --raw-verify's best with the engine's ratio to it, as JSON members.
std::string RowRawJson(const Row& r) {
  std::string json =
      ", \"raw_variants\": [{\"variant\": \"t1/whole\", \"threads\": 1, \"request_bytes\": null, "
      "\"write_gbps\": " +
      JsonArray(r.raw_w) + ", \"read_gbps\": " + JsonArray(r.raw_r) +
      ", \"median_write_gbps\": " + JsonNumber(Median(r.raw_w)) +
      ", \"median_read_gbps\": " + JsonNumber(Median(r.raw_r)) + "}";
  for (const RawVariant& v : r.variants) {
    json += ", {\"variant\": " + JsonString(v.Short()) + ", \"threads\": " + std::to_string(v.threads) +
            ", \"request_bytes\": " + (v.split == 0 ? std::string("null") : std::to_string(v.split)) +
            ", \"write_gbps\": " + JsonArray(v.write_gbps) + ", \"read_gbps\": " + JsonArray(v.read_gbps) +
            ", \"median_write_gbps\": " + JsonNumber(Median(v.write_gbps)) +
            ", \"median_read_gbps\": " + JsonNumber(Median(v.read_gbps)) +
            ", \"verify\": " + (v.verify ? "true" : "false") + "}";
  }
  std::string skipped;
  for (const std::string& k : r.skipped) skipped += (skipped.empty() ? "" : ", ") + JsonString(k);
  json += "], \"raw_variants_skipped\": [" + skipped + "]";
  const RawBest vw = BestVerifyOf(r, true), vr = BestVerifyOf(r, false);
  if (vw.gbps == nullptr || vr.gbps == nullptr) return json;
  for (const bool write : {true, false}) {
    const RawBest& b = write ? vw : vr;
    const char* op = write ? "write" : "read";
    json += std::string(", \"raw_verify_best_") + op + "\": " + BestJson(b) + ", \"" + op +
            "_ratio_to_verify_best\": " + JsonNumber(PairedRatio(write ? r.eng_w : r.eng_r, *b.gbps));
  }
  return json;
}

// --reread and --touch's measurements of a row as JSON members (none without them).
std::string RowAtRestJson(const Row& r) {
  std::string json;
  if (!r.rest_w_eng.empty()) {
    json += ", \"writes_at_rest\": {\"raw_gbps\": " + JsonArray(r.rest_w_raw) +
            ", \"raw_touch_gbps\": " + JsonArray(r.rest_w_touch) + ", \"engine_gbps\": " + JsonArray(r.rest_w_eng) +
            ", \"engine_over_raw_ratio\": " + JsonNumber(PairedRatio(r.rest_w_eng, r.rest_w_raw)) +
            ", \"raw_touch_over_raw_ratio\": " + JsonNumber(PairedRatio(r.rest_w_touch, r.rest_w_raw)) +
            ", \"engine_over_raw_touch_ratio\": " + JsonNumber(PairedRatio(r.rest_w_eng, r.rest_w_touch)) + "}";
  }
  if (!r.cross_r.empty()) json += ", \"raw_reads_engine_files_gbps\": " + JsonArray(r.cross_r);
  if (r.at_rest_eng.empty()) return json;
  json += ", \"at_rest\": {\"raw_own_files_gbps\": " + JsonArray(r.at_rest_own) +
          ", \"raw_engine_files_gbps\": " + JsonArray(r.at_rest_cross) +
          ", \"engine_gbps\": " + JsonArray(r.at_rest_eng) +
          ", \"engine_over_raw_ratio\": " + JsonNumber(PairedRatio(r.at_rest_eng, r.at_rest_own)) +
          ", \"engine_over_raw_same_files_ratio\": " + JsonNumber(PairedRatio(r.at_rest_eng, r.at_rest_cross));
  if (!r.at_rest_touch.empty()) {
    json += ", \"raw_touch_engine_files_gbps\": " + JsonArray(r.at_rest_touch) +
            ", \"raw_touch_over_raw_same_files_ratio\": " + JsonNumber(PairedRatio(r.at_rest_touch, r.at_rest_cross)) +
            ", \"engine_over_raw_touch_same_files_ratio\": " + JsonNumber(PairedRatio(r.at_rest_eng, r.at_rest_touch));
  }
  return json + "}";
}

// One row of the JSON's "results".
std::string RowJson(const Row& r) {
  const double rw = Median(r.raw_w), ew = Median(r.eng_w), rr = Median(r.raw_r), er = Median(r.eng_r);
  const RawBest bw = BestOf(r, true), br = BestOf(r, false);
  const bool numeric = !r.reactors.empty() && r.reactors.find_first_not_of("0123456789") == std::string::npos;
  return "{\"chunk_bytes\": " + std::to_string(r.chunk) + ", \"depth\": " + std::to_string(r.depth) +
         ", \"engine_reactors\": " + (numeric ? r.reactors : JsonString(r.reactors)) +
         ", \"raw_best_write\": " + BestJson(bw) +
         ", \"write_ratio_to_best\": " + JsonNumber(PairedRatio(r.eng_w, *bw.gbps)) +
         ", \"raw_best_read\": " + BestJson(br) +
         ", \"read_ratio_to_best\": " + JsonNumber(PairedRatio(r.eng_r, *br.gbps)) + RowRawJson(r) +
         ", \"files\": " + std::to_string(r.files) + ", \"file_bytes\": " + std::to_string(kHeaderBytes + r.chunk) +
         ", \"pool_bytes\": " + std::to_string(r.pool) + ", \"raw_write_gbps\": " + JsonArray(r.raw_w) +
         ", \"engine_write_gbps\": " + JsonArray(r.eng_w) + ", \"raw_read_gbps\": " + JsonArray(r.raw_r) +
         ", \"engine_read_gbps\": " + JsonArray(r.eng_r) + ", \"median_raw_write_gbps\": " + JsonNumber(rw) +
         ", \"median_engine_write_gbps\": " + JsonNumber(ew) +
         ", \"write_ratio\": " + JsonNumber(PairedRatio(r.eng_w, r.raw_w)) +
         ", \"write_ratio_of_medians\": " + JsonNumber(ew / rw) + ", \"median_raw_read_gbps\": " + JsonNumber(rr) +
         ", \"median_engine_read_gbps\": " + JsonNumber(er) +
         ", \"read_ratio\": " + JsonNumber(PairedRatio(r.eng_r, r.raw_r)) +
         ", \"read_ratio_of_medians\": " + JsonNumber(er / rr) + RowAtRestJson(r) + "}";
}

// The main table and what its columns mean; the raw variants, --raw-verify's floor and the skipped variants.
void PrintTables(const BenchIoConfig& c, const BenchTables& tables) {
  std::fputs(tables.t.Render().c_str(), stdout);
  std::printf(
      "GB/s: medians of %llu repetitions, 10^9 file bytes (4KiB header + chunk, same files on both sides) "
      "per s; ratio: median over repetitions of engine/raw in the same repetition\n",
      static_cast<unsigned long long>(c.repeat));
  std::printf(
      "raw best: the best median of the single-thread raw baseline (t1/whole) and the multi-threaded one "
      "(tT/REQUEST: T threads, requests of REQUEST or whole files; --raw-queue %s); ratio to best: median "
      "over repetitions of engine/(that variant) in the same repetition\n",
      c.ceiling.per_thread_queue ? "per-thread: the depth on each thread" : "total: the depth over all threads");
  if (tables.any_variants) {
    std::printf("raw baseline variants, GB/s (medians; * the best of the cell):\n");
    std::fputs(tables.tv.Render().c_str(), stdout);
  }
  if (tables.any_verify) {
    std::printf(
        "raw+xxh3 best (--raw-verify): the best raw variant that also hashes every byte with XXH3, the "
        "engine's per-byte work (K1); ratio: median over repetitions of engine/(that variant):\n");
    std::fputs(tables.tverify.Render().c_str(), stdout);
  }
  if (!tables.skipped_notes.empty()) {
    std::printf("raw variants skipped (--raw-queue total: more threads than files in flight):\n%s",
                tables.skipped_notes.c_str());
  }
  if (c.repeat % 2 != 0) {
    std::printf(
        "note: an odd --repeat lets the raw side go first once more than the engine; the phase that goes "
        "second is often faster on a virtual disk (see docs/performance.md), so use an even count\n");
  }
}

// --reread's table of reads at rest.
void PrintReadsAtRest(const BenchIoConfig& c, const std::vector<Row>& rows) {
  std::vector<std::string> cols = {"chunk",  "depth",      "raw on its files",     "raw on engine's files",
                                   "engine", "engine/raw", "engine/raw same files"};
  if (c.touch)
    cols.insert(cols.end(), {"raw+touch on engine's files", "raw+touch/raw same files", "engine/(raw+touch)"});
  TextTable at_rest(cols);
  for (const Row& r : rows) {
    std::vector<std::string> cells = {FormatSize(r.chunk),
                                      std::to_string(r.depth),
                                      FormatFixed(Median(r.at_rest_own), 3),
                                      FormatFixed(Median(r.at_rest_cross), 3),
                                      FormatFixed(Median(r.at_rest_eng), 3),
                                      FormatFixed(PairedRatio(r.at_rest_eng, r.at_rest_own), 3),
                                      FormatFixed(PairedRatio(r.at_rest_eng, r.at_rest_cross), 3)};
    if (c.touch) {
      cells.insert(cells.end(), {FormatFixed(Median(r.at_rest_touch), 3),
                                 FormatFixed(PairedRatio(r.at_rest_touch, r.at_rest_cross), 3),
                                 FormatFixed(PairedRatio(r.at_rest_eng, r.at_rest_touch), 3)});
    }
    at_rest.AddRow(cells);
  }
  std::printf("reads at rest (--reread %llu: the last repetition's files read again, readers rotating):\n",
              static_cast<unsigned long long>(c.reread));
  std::fputs(at_rest.Render().c_str(), stdout);
  std::printf("GB/s: medians over rotations; ratios: medians over rotations of engine/raw in the same rotation\n");
}

// --touch's table of writes at rest.
void PrintWritesAtRest(const BenchIoConfig& c, const std::vector<Row>& rows) {
  TextTable tw({"chunk", "depth", "raw", "raw+touch", "engine", "engine/raw", "raw+touch/raw", "engine/(raw+touch)"});
  for (const Row& r : rows) {
    tw.AddRow({FormatSize(r.chunk), std::to_string(r.depth), FormatFixed(Median(r.rest_w_raw), 3),
               FormatFixed(Median(r.rest_w_touch), 3), FormatFixed(Median(r.rest_w_eng), 3),
               FormatFixed(PairedRatio(r.rest_w_eng, r.rest_w_raw), 3),
               FormatFixed(PairedRatio(r.rest_w_touch, r.rest_w_raw), 3),
               FormatFixed(PairedRatio(r.rest_w_eng, r.rest_w_touch), 3)});
  }
  std::printf(
      "writes at rest (--touch: %llu rotations of three writers, each writer's files removed before the "
      "next writes; raw+touch reads every byte before writing it), GB/s:\n",
      static_cast<unsigned long long>(c.reread));
  std::fputs(tw.Render().c_str(), stdout);
  std::printf("GB/s: medians over rotations; ratios: medians over rotations, within one rotation\n");
}

// What the engine was and did, and the run's peak memory.
void PrintEngineNotes(const BenchIoConfig& c, const std::string& engine_described, uint64_t peak_rss) {
  std::printf("engine: %s\n", engine_described.c_str());
  std::printf(
      "the engine's transfers went through JobClient over StreamPump (vLLM's path: OpenStore/OpenLoad, "
      "copier lanes %s each ready slot and ack it)\n",
      c.host_copier ? "filling or copying out (the host copier, one thread per lane)" : "only acking");
  const std::string xxh3(internal::Xxh3Variant());
  if (c.host_copier) {
    std::printf(
        "the engine also copies every chunk between host memory and its staging slot and checksums it "
        "(XXH3, %s build); the raw baseline does neither. SPEC target: ratio to best >= 0.9 on a fast "
        "device, 0.95 on a virtual disk\n",
        xxh3.c_str());
  } else {
    std::printf(
        "--copier none: the engine's disk path alone (no host copy; it still checksums stores and verifies "
        "loads with XXH3, %s build); the raw baseline does neither. SPEC target: ratio to best >= 0.9 on a "
        "fast device, 0.95 on a virtual disk\n",
        xxh3.c_str());
  }
  std::printf("peak RSS %s (raw buffers %sdepth x file, engine pool 2 x depth slots + depth host buffers)\n",
              FormatSize(peak_rss).c_str(), c.touch ? "2 x " : "");
}

// --json: the run's settings and every row.
void WriteBenchJson(const BenchRun& run, const std::vector<Row>& rows, uint64_t peak_rss) {
  const BenchIoConfig& c = run.c;
  std::string raw_threads_json, raw_split_json, json_rows;
  for (uint32_t th : c.ceiling.threads) raw_threads_json += (raw_threads_json.empty() ? "" : ", ") + std::to_string(th);
  for (uint64_t sp : c.ceiling.splits) raw_split_json += (raw_split_json.empty() ? "" : ", ") + std::to_string(sp);
  for (const Row& r : rows) json_rows += (json_rows.empty() ? "" : ",\n    ") + RowJson(r);
  WriteFile(*c.json_path,
            "{\n  \"dir\": " + JsonString(c.dir) + ", \"block_device\": " + JsonString(BlockDeviceName(g_disk)) +
                ", \"cores\": " + std::to_string(std::thread::hardware_concurrency()) +
                ", \"mode\": " + JsonString(c.mode_s) + ", \"backend\": " + JsonString(c.backend_s) +
                ", \"raw_buffers\": " + JsonString(c.raw_memory) +
                ", \"copier\": " + JsonString(c.host_copier ? "host" : "none") + ", \"path\": \"stream\"" +
                ", \"raw_threads\": [" + raw_threads_json + "], \"raw_split_bytes\": [" + raw_split_json +
                "], \"raw_queue\": " + JsonString(c.ceiling.per_thread_queue ? "per-thread" : "total") +
                ", \"reactors_option\": " + std::to_string(c.reactors) + ", \"read_piece_bytes\": " +
                std::to_string(c.read_piece) + ", \"xxh3\": " + JsonString(internal::Xxh3Variant()) +
                ", \"total_bytes\": " + std::to_string(c.total) + ", \"repeat\": " + std::to_string(c.repeat) +
                ", \"page_cache_dropped\": " + (run.drop_ok ? "true" : "false") + ", \"peak_rss_bytes\": " +
                std::to_string(peak_rss) + ",\n  \"engine\": " + JsonString(run.engine_described) +
                ",\n  \"results\": [\n    " + json_rows + "\n  ]\n}\n");
}

}  // namespace

int RunBenchIo(int argc, char** argv) {
  std::vector<FlagSpec> flags = BenchIoMeasureFlags();
  for (FlagSpec& f : BenchIoDiagnosticFlags()) flags.push_back(std::move(f));
  CliArgs args("bench io",
               "Measures the kvtier engine's write (store) and read (load) bandwidth against a raw io_uring baseline\n"
               "written with liburing, on the same directory, file sizes and queue depth, in the same run. For each\n"
               "chunk size and depth: alternating raw and engine runs, --repeat times; GB/s are medians, the ratio\n"
               "is the median over repetitions of engine/raw in the same repetition.\n"
               "The engine also copies each chunk between host memory and its staging slot and checksums it\n"
               "(XXH3); the raw baseline does neither. Beside the single-thread raw baseline, a multi-threaded one\n"
               "(--raw-threads, --raw-split) measures the device's ceiling, 'raw best', on the same files.\n"
               "Data written is incompressible. Files created are removed at the end.",
               std::move(flags));
  if (!args.ParseOrHelp(argc, argv)) return 0;
  const BenchIoConfig c = ParseBenchIo(args);
  CheckBenchDir(c);
  PhaseMarks marks(c.marks_path);
  RemoveLeftoversOfKilledRuns(c.dir);
  BenchDir base(c.dir);  // held (and its lock released by the kernel however this process ends) for the whole run
  const bool drop_ok = !c.keep_cache && DropPageCache();
  if (c.verbose) PrintCpuContext();
  std::printf(
      "bench io: dir %s, mode %s, %s per run, %llu repetitions (alternating raw/engine), raw buffers %s, "
      "page cache %s\n",
      c.dir.c_str(), c.mode_s.c_str(), FormatSize(c.total).c_str(), static_cast<unsigned long long>(c.repeat),
      c.raw_memory.c_str(),
      drop_ok ? "dropped before each read"
      : c.keep_cache
          ? (c.keep_cache_given ? "kept (--keep-cache)" : "kept (O_DIRECT reads bypass it; --drop-caches to drop)")
          : "NOT dropped (needs root)");
  std::fflush(stdout);

  std::vector<Row> rows;
  ProgressBar progress("bench io", c.sizes.size() * c.depths.size() * (c.repeat + c.reread * (c.touch ? 2 : 1)),
                       c.show_progress);
  std::random_device rd;
  BenchRun run{c, base.path(), marks, progress, drop_ok, (uint64_t{rd()} << 32) ^ rd()};
  try {
    for (uint64_t chunk : c.sizes) {
      for (uint64_t depth : c.depths) rows.push_back(MeasureCell(run, chunk, static_cast<uint32_t>(depth)));
    }
  } catch (...) {
    progress.Finish();
    throw;  // base removes the run's files
  }
  progress.Finish();
  base.Remove();

  BenchTables tables;
  for (const Row& r : rows) AddRowToTables(r, &tables);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const uint64_t peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  PrintTables(c, tables);
  if (c.reread > 0) PrintReadsAtRest(c, rows);
  if (c.touch) PrintWritesAtRest(c, rows);
  PrintEngineNotes(c, run.engine_described, peak_rss);
  if (c.json_path) WriteBenchJson(run, rows, peak_rss);
  return 0;
}

}  // namespace kvtier
