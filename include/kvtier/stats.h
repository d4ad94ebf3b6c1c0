// StatsSnapshot: a point-in-time copy of kvtier's counters and latency histograms (SPEC O1).
//
// The engine keeps live counters internally and hands out snapshots; a snapshot is a plain value that can be
// copied, compared, and rendered as JSON (the CLI's `kvtier stats --json`), an aligned text table (the CLI), or
// the Prometheus text exposition format (vLLM's metrics endpoint).
//
// Counters only grow; the fields marked "gauge" are current levels and may go down. Fields are read one at a
// time from live counters, so a snapshot taken while the engine runs is not an atomic cut across fields (a hit
// may be counted in `lookup_hits_disk` before `lookups`), but every single field is exact.
//
// Thread safety: plain value; the methods are const and allocate only their result.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// One non-empty histogram bucket: `count` samples in [lower_us, upper_us). The last bucket of a histogram may
// have upper_us == UINT64_MAX (samples beyond the histogram's range).
struct HistogramBucket {
  uint64_t lower_us = 0;
  uint64_t upper_us = 0;
  uint64_t count = 0;
};

// A latency distribution in microseconds. Percentiles are estimated by interpolating inside the bucket that
// holds the rank, so they are within one bucket width (at most 25% of the value) of the exact percentile, and
// always within [min_us, max_us]. All fields are 0 when count is 0.
struct HistogramSnapshot {
  uint64_t count = 0;
  uint64_t sum_us = 0;
  uint64_t min_us = 0;
  uint64_t max_us = 0;
  uint64_t p50_us = 0;
  uint64_t p95_us = 0;
  uint64_t p99_us = 0;
  std::vector<HistogramBucket> buckets;  // non-empty buckets only, in increasing order

  double mean_us() const { return count == 0 ? 0.0 : static_cast<double>(sum_us) / static_cast<double>(count); }
  // Estimated q-quantile (0 <= q <= 1) from the buckets.
  uint64_t Percentile(double q) const;
};

struct StatsSnapshot {
  // Lookups (T2, G1). Every lookup ends as exactly one of hit (per tier), miss or declined load.
  uint64_t lookups = 0;
  uint64_t lookup_hits_dram = 0;
  uint64_t lookup_hits_disk = 0;
  uint64_t lookup_misses = 0;
  uint64_t declined_loads = 0;  // hits reported as misses by the break-even gate

  // Loads (X1, X3).
  uint64_t loads_started = 0;
  uint64_t loads_completed = 0;
  uint64_t loads_failed = 0;
  uint64_t chunks_loaded = 0;

  // Stores (X2).
  uint64_t stores_started = 0;
  uint64_t stores_completed = 0;
  uint64_t stores_dropped = 0;       // not written: pool full, ENOSPC after retry, below the benefit threshold
  uint64_t stores_deduplicated = 0;  // already on disk (EEXIST at publication, or found before writing)

  // Bytes. Read amplification = bytes_read / bytes_needed (see read_amplification()).
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_needed = 0;  // bytes the loads actually handed to the model

  // Preload (R1-R3).
  uint64_t preload_started = 0;
  uint64_t preload_used = 0;    // a demand load joined it
  uint64_t preload_wasted = 0;  // evicted or dropped before any demand load used it

  // Capacity and integrity (C1, C2, K1, L5, I4).
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t corrupt_entries = 0;
  // K3: loads that met an entry keyed for another checksum secret (or for none) in a namespace whose MANIFEST does
  // not record its key (written by an older kvtier): each a miss, the entry left in place (docs/file-format.md).
  uint64_t other_secret_misses = 0;
  uint64_t io_errors = 0;
  uint64_t timeouts = 0;
  uint64_t enospc_events = 0;
  uint64_t temporaries_swept = 0;

  // Gauges: current levels, not totals.
  uint64_t disk_bytes_used = 0;
  uint64_t disk_entries = 0;
  uint64_t pool_slots_in_use = 0;
  uint64_t pool_peak_slots = 0;
  uint64_t dram_entries = 0;

  // Latencies.
  HistogramSnapshot load_latency_us;   // a load request, lookup to last slot copied
  HistogramSnapshot store_latency_us;  // a store request, first slot to publication
  HistogramSnapshot read_latency_us;   // one disk read
  HistogramSnapshot write_latency_us;  // one disk write

  // bytes_read / bytes_needed; 0 when nothing was needed yet.
  double read_amplification() const;

  // One JSON object: every field above by name, "read_amplification", and each histogram as an object with
  // count, sum_us, min_us, max_us, mean_us, p50_us, p95_us, p99_us and "buckets": [[lower_us, upper_us, count]...]
  // (an upper bound beyond the histogram's range is written as null).
  std::string ToJson() const;
  // An aligned two-column table (name, value), then one line per histogram (count, mean, p50, p95, p99, max).
  std::string ToText() const;
  // Prometheus text exposition format (version 0.0.4): counters as <prefix><name>_total, gauges as
  // <prefix><name>, read amplification as a gauge, histograms in seconds as <prefix><name>_seconds with
  // cumulative buckets at powers of two microseconds. Characters of `prefix` outside [a-zA-Z0-9_:] become '_'.
  std::string ToPrometheus(std::string_view prefix = "kvtier_") const;
};

}  // namespace kvtier
