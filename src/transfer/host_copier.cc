// HostCopier: copies between staging slots and host memory on one helper thread, so the reactor never stalls on
// a large copy while disk reads are waiting to be issued (memcpy; streaming stores out of large chunks and out of
// the chunks of large load jobs, below).
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "transfer/device_copier.h"
#include "util/cpu.h"
#include "util/thread.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier {
namespace {

// Sanitizer builds keep memcpy, which they instrument; wide intrinsic stores may be invisible to them (clang's
// TSan skips accesses over 16 bytes). GCC says so with __SANITIZE_*__, clang (before 2025) only with __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define KVTIER_SANITIZED_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVTIER_SANITIZED_BUILD 1
#endif

#if defined(__x86_64__) && !defined(KVTIER_SANITIZED_BUILD)
#define KVTIER_STREAM_COPY 1

// Copies out of a slot (loads) of chunks larger than a quarter of the last-level cache, or of any chunk of a load
// job that copies out that much in all, use non-temporal stores: such destinations cannot stay in the cache anyway,
// and streaming skips the read-for-ownership of every destination line, so the copy moves 2 bytes of memory traffic
// per byte instead of 3 (one thread, 64 MiB, on the 2-vCPU EPYC VM we test on, as `kvtier bench io --verbose`
// prints it: memcpy 12-13 GB/s, streaming 13-20 GB/s; on that VM the disk itself slows while the guest moves
// memory, docs/performance.md, "Floors"). A small load (a few chunks, smaller than the cache in all) keeps memcpy:
// its caller finds the bytes in the cache. glibc's memcpy makes a similar switch, but only above a fraction of the
// cache size the VM reports (hundreds of MiB here), i.e. never. Copies into a slot (stores) keep memcpy: the
// reactor checksums the slot right after, and should find it in the cache.
uint64_t LastLevelCacheBytes() {
  uint64_t best = 0;
  int best_level = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::FILE* level_file = std::fopen((dir + "level").c_str(), "r");
    if (level_file == nullptr) break;
    int level = 0;
    const bool have_level = std::fscanf(level_file, "%d", &level) == 1;
    std::fclose(level_file);
    std::FILE* size_file = std::fopen((dir + "size").c_str(), "r");
    if (size_file == nullptr) continue;
    unsigned long long size = 0;
    char unit = 0;
    const int got = std::fscanf(size_file, "%llu%c", &size, &unit);
    std::fclose(size_file);
    if (!have_level || got < 1) continue;
    if (got == 2 && (unit == 'K' || unit == 'k')) size <<= 10;
    if (got == 2 && (unit == 'M' || unit == 'm')) size <<= 20;
    if (level > best_level) {
      best_level = level;
      best = size;
    }
  }
  return best > 0 ? best : uint64_t{32} << 20;  // unknown: assume a 32 MiB L3
}

__attribute__((target("avx2"))) void StreamCopyAvx2(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  std::memcpy(dst, src, n);
  // Non-temporal stores are weakly ordered: fence before the completion (a mutex-protected flag) can be seen.
  _mm_sfence();
}

// KVTIER_HOST_COPY=memcpy keeps plain memcpy for every chunk, =stream streams every chunk (to compare them);
// unset: the size rule above.
enum class CopyOutMode { kBySize, kMemcpy, kStream };
CopyOutMode ModeFromEnvironment() {
  static const CopyOutMode mode = [] {
    const char* forced = std::getenv("KVTIER_HOST_COPY");
    if (forced != nullptr && std::strcmp(forced, "memcpy") == 0) return CopyOutMode::kMemcpy;
    if (forced != nullptr && std::strcmp(forced, "stream") == 0) return CopyOutMode::kStream;
    return CopyOutMode::kBySize;
  }();
  return mode;
}

bool StreamCopyAvailable() { return ModeFromEnvironment() != CopyOutMode::kMemcpy && CpuHasAvx2(); }

// The smallest chunk copied out of its slot with streaming stores.
uint64_t StreamThreshold() {
  static const uint64_t threshold = ModeFromEnvironment() == CopyOutMode::kStream ? 0 : LastLevelCacheBytes() / 4;
  return threshold;
}
#endif

// Whether a chunk copied out of its slot, `bytes` in all, goes around the cache (see above).
bool StreamChunk(uint64_t bytes) {
#if defined(KVTIER_STREAM_COPY)
  return bytes >= StreamThreshold() && StreamCopyAvailable();
#else
  (void)bytes;
  return false;
#endif
}

void CopyOutOfSlot(void* dst, const void* src, size_t n, bool stream) {
#if defined(KVTIER_STREAM_COPY)
  if (stream && n >= 4096) {
    StreamCopyAvx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, n);
}

class HostCopier final : public DeviceCopier {
 public:
  HostCopier() : thread_(StartThread([this] { Run(); })) {}
  ~HostCopier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::string_view name() const override {
#if defined(KVTIER_STREAM_COPY)
    if (StreamCopyAvailable()) {
      return StreamThreshold() == 0 ? "host (AVX2 streaming stores out of every chunk)"
                                    : "host (memcpy; AVX2 streaming stores out of chunks or load jobs >= LLC/4)";
    }
#endif
    return "host (memcpy)";
  }
  void SetWakeup(std::function<void()> wakeup) override {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = std::move(wakeup);
  }

  void Submit(std::vector<CopyTask> batch) override {
    if (batch.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ += batch.size();
      for (auto& t : batch) queue_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

  void Poll(std::vector<CopyDone>* done) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= finished_.size();
    for (auto& d : finished_) done->push_back(std::move(d));
    finished_.clear();
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_;
  }

  std::unique_ptr<DeviceCopier> CreateLane() const override { return CreateHostCopier(); }

 private:
  static Status Copy(const CopyTask& t) {
    uint64_t total = 0;
    for (const CopySegment& s : t.segments) total += s.bytes;
    const bool stream = t.direction == CopyDirection::kSlotToDevice && HostCopierStreams(total, t.job_bytes);
    for (const CopySegment& s : t.segments) {
      if (s.slot_offset + s.bytes > t.slot_bytes || s.address == 0) {
        return Status(StatusCode::kInvalidArgument, "copy segment outside the slot or to a null address");
      }
      void* host = reinterpret_cast<void*>(s.address);
      if (t.direction == CopyDirection::kSlotToDevice) {
        HostCopy(t.direction, host, t.slot_data + s.slot_offset, s.bytes, stream);
      } else {
        HostCopy(t.direction, t.slot_data + s.slot_offset, host, s.bytes, false);
      }
    }
    return Status::Ok();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      CopyTask task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status status = Copy(task);
      lock.lock();
      finished_.push_back(CopyDone{task.id, std::move(status)});
      if (wakeup_) wakeup_();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CopyTask> queue_;
  std::vector<CopyDone> finished_;
  size_t pending_ = 0;
  bool stop_ = false;
  std::function<void()> wakeup_;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace

std::unique_ptr<DeviceCopier> CreateHostCopier() { return std::make_unique<HostCopier>(); }

void HostCopy(CopyDirection direction, void* dst, const void* src, size_t n, bool stream) {
  if (direction == CopyDirection::kSlotToDevice) {
    CopyOutOfSlot(dst, src, n, stream);
  } else {
    std::memcpy(dst, src, n);  // into a slot: the reactor checksums it next and should find it in the cache
  }
}

bool HostCopierStreams(uint64_t chunk_bytes, uint64_t job_bytes) {
  return StreamChunk(std::max(chunk_bytes, job_bytes));
}

}  // namespace kvtier
