#include "stats/stats.h"

#include <algorithm>
#include <bit>
#include <cstddef>

namespace kvtier {

namespace {
#define KVTIER_STATS_COUNT(name, kind, help) +1
constexpr size_t kNumFields = 0 KVTIER_STATS_FIELDS(KVTIER_STATS_COUNT);
#undef KVTIER_STATS_COUNT
}  // namespace

// Every uint64 field of StatsSnapshot comes before the histograms; if this fails, a field was added to the public
// struct but not to KVTIER_STATS_FIELDS (or the other way round).
static_assert(offsetof(StatsSnapshot, load_latency_us) == kNumFields * sizeof(uint64_t),
              "KVTIER_STATS_FIELDS and StatsSnapshot disagree");

void Gauge::SetMax(uint64_t v) {
  uint64_t current = value_.load(std::memory_order_relaxed);
  while (current < v && !value_.compare_exchange_weak(current, v, std::memory_order_relaxed)) {
  }
}

LatencyHistogram::LatencyHistogram() {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
}

int LatencyHistogram::BucketIndex(uint64_t us) {
  if (us < kSubBuckets) return static_cast<int>(us);
  const int exponent = std::bit_width(us) - 1;  // us is in [2^exponent, 2^(exponent+1))
  if (exponent > kMaxExponent) return kNumBuckets - 1;
  const int sub = static_cast<int>((us >> (exponent - kSubBucketBits)) & (kSubBuckets - 1));
  return kSubBuckets + (exponent - kSubBucketBits) * kSubBuckets + sub;
}

uint64_t LatencyHistogram::BucketLower(int index) {
  if (index < kSubBuckets) return static_cast<uint64_t>(index);
  if (index == kNumBuckets - 1) return uint64_t{1} << (kMaxExponent + 1);
  const int exponent = (index - kSubBuckets) / kSubBuckets + kSubBucketBits;
  const uint64_t sub = static_cast<uint64_t>((index - kSubBuckets) % kSubBuckets);
  return (kSubBuckets + sub) << (exponent - kSubBucketBits);
}

uint64_t LatencyHistogram::BucketUpper(int index) {
  if (index == kNumBuckets - 1) return UINT64_MAX;
  return BucketLower(index + 1);
}

void LatencyHistogram::Record(uint64_t us) {
  buckets_[BucketIndex(us)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(us, std::memory_order_relaxed);
  uint64_t lo = min_.load(std::memory_order_relaxed);
  while (us < lo && !min_.compare_exchange_weak(lo, us, std::memory_order_relaxed)) {
  }
  uint64_t hi = max_.load(std::memory_order_relaxed);
  while (us > hi && !max_.compare_exchange_weak(hi, us, std::memory_order_relaxed)) {
  }
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot s;
  for (int i = 0; i < kNumBuckets; ++i) {
    uint64_t n = buckets_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    s.buckets.push_back(HistogramBucket{BucketLower(i), BucketUpper(i), n});
    s.count += n;
  }
  if (s.count == 0) return HistogramSnapshot{};
  s.sum_us = sum_.load(std::memory_order_relaxed);
  // A Record() racing with this snapshot may have bumped its bucket but not yet min/max; keep them consistent
  // with the buckets we saw.
  s.min_us = std::max(min_.load(std::memory_order_relaxed), s.buckets.front().lower_us);
  s.max_us = max_.load(std::memory_order_relaxed);
  if (s.buckets.back().upper_us != UINT64_MAX) {
    s.max_us = std::clamp(s.max_us, s.buckets.back().lower_us, s.buckets.back().upper_us - 1);
  } else {
    s.max_us = std::max(s.max_us, s.buckets.back().lower_us);
  }
  s.min_us = std::min({s.min_us, s.max_us, s.buckets.front().upper_us - 1});
  s.p50_us = s.Percentile(0.50);
  s.p95_us = s.Percentile(0.95);
  s.p99_us = s.Percentile(0.99);
  return s;
}

StatsSnapshot Stats::Snapshot() const {
  StatsSnapshot s;
#define KVTIER_STATS_COPY(name, kind, help) s.name = name.Load();
  KVTIER_STATS_FIELDS(KVTIER_STATS_COPY)
#undef KVTIER_STATS_COPY
#define KVTIER_STATS_COPY_HISTOGRAM(name, help) s.name = name.Snapshot();
  KVTIER_STATS_HISTOGRAMS(KVTIER_STATS_COPY_HISTOGRAM)
#undef KVTIER_STATS_COPY_HISTOGRAM
  return s;
}

}  // namespace kvtier
