// Stats: the engine's live counters and latency histograms, snapshotted into the public kvtier::StatsSnapshot.
//
// Every member is named after its StatsSnapshot field, so instrumentation reads `stats.bytes_read.Add(n)` and
// `stats.read_latency_us.Record(us)`. All updates are lock-free and relaxed: counters are statistics, not
// synchronization, and no other memory is ordered by them. Any thread may update or snapshot at any time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "kvtier/stats.h"

namespace kvtier {

// The counter and gauge fields of StatsSnapshot, in order: X(name, kind, help). One list drives the Stats members,
// Snapshot(), and every rendering, so a field cannot be added to one and forgotten in another.
#define KVTIER_STATS_FIELDS(X)                                                                            \
  X(lookups, Counter, "Lookups of a chunk key")                                                           \
  X(lookup_hits_dram, Counter, "Lookups served from the DRAM tier")                                       \
  X(lookup_hits_disk, Counter, "Lookups served from disk")                                                \
  X(lookup_misses, Counter, "Lookups that found nothing")                                                 \
  X(declined_loads, Counter, "Hits declined by the break-even gate (recomputed instead)")                 \
  X(loads_started, Counter, "Load jobs started (the job API's)")                                          \
  X(loads_completed, Counter, "Load jobs completed with every chunk loaded")                              \
  X(loads_failed, Counter, "Load jobs with a chunk that could not be loaded")                             \
  X(chunks_loaded, Counter, "Chunks the job API's loads copied out")                                      \
  X(stores_started, Counter, "Committed stores started")                                                  \
  X(stores_completed, Counter, "Committed stores completed")                                              \
  X(stores_dropped, Counter, "Stores dropped (pool full, no space, below the benefit threshold)")         \
  X(stores_deduplicated, Counter, "Stores of chunks that were already stored")                            \
  X(bytes_read, Counter, "Bytes read from disk")                                                          \
  X(bytes_written, Counter, "Bytes written to disk")                                                      \
  X(bytes_needed, Counter, "Bytes the job API's loads asked for")                                         \
  X(preload_started, Counter, "Speculative preloads started")                                             \
  X(preload_used, Counter, "Preloads joined by a demand load")                                            \
  X(preload_wasted, Counter, "Preloads dropped before any demand load used them")                         \
  X(evictions, Counter, "Entries evicted from disk")                                                      \
  X(evicted_bytes, Counter, "Bytes evicted from disk")                                                    \
  X(corrupt_entries, Counter, "Entries that failed verification")                                         \
  X(other_secret_misses, Counter,                                                                         \
    "Loads missed on an entry keyed for another checksum secret, kept (a MANIFEST without checksum_key)") \
  X(io_errors, Counter, "I/O operations that failed")                                                     \
  X(timeouts, Counter, "Operations that passed their deadline")                                           \
  X(enospc_events, Counter, "Writes refused for lack of space")                                           \
  X(temporaries_swept, Counter, "Stale temporary files removed")                                          \
  X(disk_bytes_used, Gauge, "Bytes of entries on disk")                                                   \
  X(disk_entries, Gauge, "Entries on disk")                                                               \
  X(pool_slots_in_use, Gauge, "Staging pool slots in use")                                                \
  X(pool_peak_slots, Gauge, "Most staging pool slots ever in use at once")                                \
  X(dram_entries, Gauge, "Chunks retained in the DRAM tier")

#define KVTIER_STATS_HISTOGRAMS(X)               \
  X(load_latency_us, "Load job latency")         \
  X(store_latency_us, "Committed store latency") \
  X(read_latency_us, "Promotion latency")        \
  X(write_latency_us, "Latency of one disk write")

// A monotonically increasing count.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Load() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A current level.
class Gauge {
 public:
  void Set(uint64_t v) { value_.store(v, std::memory_order_relaxed); }
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  void Sub(uint64_t n = 1) { value_.fetch_sub(n, std::memory_order_relaxed); }
  // Raises the gauge to v if it is lower (for peaks).
  void SetMax(uint64_t v);
  uint64_t Load() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Log-linear latency histogram over microseconds: values 0..3 each have their own bucket, then every power of two
// [2^e, 2^(e+1)) for e = 2..kMaxExponent is split into kSubBuckets equal buckets (width 2^e / 4, so a bucket is
// at most 25% of its lower bound), and one overflow bucket holds everything from 2^(kMaxExponent+1) us (~268 s).
// Record() is lock-free (a few relaxed atomic adds and, rarely, a CAS for min/max).
class LatencyHistogram {
 public:
  static constexpr int kSubBucketBits = 2;
  static constexpr int kSubBuckets = 1 << kSubBucketBits;
  static constexpr int kMaxExponent = 27;
  static constexpr int kNumBuckets = kSubBuckets + (kMaxExponent - kSubBucketBits + 1) * kSubBuckets + 1;

  LatencyHistogram();
  void Record(uint64_t us);
  HistogramSnapshot Snapshot() const;

  static int BucketIndex(uint64_t us);
  static uint64_t BucketLower(int index);
  static uint64_t BucketUpper(int index);  // exclusive; UINT64_MAX for the overflow bucket

 private:
  std::array<std::atomic<uint64_t>, kNumBuckets> buckets_;
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> min_{UINT64_MAX};
  std::atomic<uint64_t> max_{0};
};

class Stats {
 public:
#define KVTIER_STATS_MEMBER(name, kind, help) kind name;
  KVTIER_STATS_FIELDS(KVTIER_STATS_MEMBER)
#undef KVTIER_STATS_MEMBER
#define KVTIER_STATS_HISTOGRAM_MEMBER(name, help) LatencyHistogram name;
  KVTIER_STATS_HISTOGRAMS(KVTIER_STATS_HISTOGRAM_MEMBER)
#undef KVTIER_STATS_HISTOGRAM_MEMBER

  StatsSnapshot Snapshot() const;
};

}  // namespace kvtier
