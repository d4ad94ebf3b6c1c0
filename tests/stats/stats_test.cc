#include "stats/stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "trace/mini_json.h"

namespace kvtier {
namespace {

using testing::JsonValue;
using testing::MiniJsonParser;

// The bucket that holds v, as [lower, upper): percentiles must land in the bucket of the exact answer.
void ExpectSameBucket(uint64_t estimate, uint64_t exact) {
  int b = LatencyHistogram::BucketIndex(exact);
  EXPECT_GE(estimate, LatencyHistogram::BucketLower(b)) << "exact " << exact;
  EXPECT_LT(estimate, LatencyHistogram::BucketUpper(b)) << "exact " << exact;
  // And within 25% of the exact value (the widest bucket relative to its lower bound).
  EXPECT_LE(std::abs(static_cast<double>(estimate) - static_cast<double>(exact)), 0.25 * exact + 1) << exact;
}

uint64_t ExactPercentile(std::vector<uint64_t> values, double q) {
  std::sort(values.begin(), values.end());
  size_t rank = std::max<size_t>(1, static_cast<size_t>(std::ceil(q * values.size())));
  return values[rank - 1];
}

TEST(LatencyHistogram, BucketsAreContiguousAndLogLinear) {
  EXPECT_EQ(LatencyHistogram::BucketLower(0), 0u);
  for (int i = 0; i + 1 < LatencyHistogram::kNumBuckets; ++i) {
    EXPECT_EQ(LatencyHistogram::BucketUpper(i), LatencyHistogram::BucketLower(i + 1)) << i;
    EXPECT_LT(LatencyHistogram::BucketLower(i), LatencyHistogram::BucketUpper(i)) << i;
    if (LatencyHistogram::BucketLower(i) >= 4) {
      // Width is a quarter of the power of two the bucket lies in.
      uint64_t width = LatencyHistogram::BucketUpper(i) - LatencyHistogram::BucketLower(i);
      EXPECT_LE(width * 4, LatencyHistogram::BucketLower(i)) << i;
    }
  }
  EXPECT_EQ(LatencyHistogram::BucketUpper(LatencyHistogram::kNumBuckets - 1), UINT64_MAX);
  for (uint64_t v : {0ull, 1ull, 3ull, 4ull, 5ull, 7ull, 8ull, 1000ull, 123456ull, 100000000ull, (1ull << 28) - 1}) {
    int b = LatencyHistogram::BucketIndex(v);
    EXPECT_LE(LatencyHistogram::BucketLower(b), v);
    EXPECT_LT(v, LatencyHistogram::BucketUpper(b));
  }
  EXPECT_EQ(LatencyHistogram::BucketIndex(1ull << 28), LatencyHistogram::kNumBuckets - 1);
  EXPECT_EQ(LatencyHistogram::BucketIndex(UINT64_MAX), LatencyHistogram::kNumBuckets - 1);
}

TEST(LatencyHistogram, EmptySnapshotIsAllZero) {
  LatencyHistogram h;
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.min_us, 0u);
  EXPECT_EQ(s.max_us, 0u);
  EXPECT_EQ(s.p99_us, 0u);
  EXPECT_TRUE(s.buckets.empty());
  EXPECT_EQ(s.mean_us(), 0.0);
}

TEST(LatencyHistogram, SingleValueIsExact) {
  LatencyHistogram h;
  for (int i = 0; i < 10; ++i) h.Record(1234);
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count, 10u);
  EXPECT_EQ(s.sum_us, 12340u);
  EXPECT_EQ(s.min_us, 1234u);
  EXPECT_EQ(s.max_us, 1234u);
  EXPECT_EQ(s.p50_us, 1234u);  // clamped to [min, max]
  EXPECT_EQ(s.p99_us, 1234u);
  ASSERT_EQ(s.buckets.size(), 1u);
  EXPECT_EQ(s.buckets[0].count, 10u);
}

TEST(LatencyHistogram, PercentilesOfUniformDistributionAreWithinBucketError) {
  LatencyHistogram h;
  std::vector<uint64_t> values;
  for (uint64_t v = 1; v <= 10000; ++v) {
    h.Record(v);
    values.push_back(v);
  }
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count, 10000u);
  EXPECT_EQ(s.min_us, 1u);
  EXPECT_EQ(s.max_us, 10000u);
  EXPECT_EQ(s.sum_us, 10000u * 10001u / 2);
  ExpectSameBucket(s.p50_us, 5000);
  ExpectSameBucket(s.p95_us, 9500);
  ExpectSameBucket(s.p99_us, 9900);
  for (double q : {0.1, 0.25, 0.75, 0.999}) ExpectSameBucket(s.Percentile(q), ExactPercentile(values, q));
}

TEST(LatencyHistogram, PercentilesOfLogNormalDistributionAreWithinBucketError) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(7.0, 1.5);  // median ~1.1 ms, long tail
  LatencyHistogram h;
  std::vector<uint64_t> values;
  for (int i = 0; i < 50000; ++i) {
    uint64_t v = static_cast<uint64_t>(dist(rng));
    h.Record(v);
    values.push_back(v);
  }
  HistogramSnapshot s = h.Snapshot();
  ExpectSameBucket(s.p50_us, ExactPercentile(values, 0.50));
  ExpectSameBucket(s.p95_us, ExactPercentile(values, 0.95));
  ExpectSameBucket(s.p99_us, ExactPercentile(values, 0.99));
  EXPECT_EQ(s.max_us, *std::max_element(values.begin(), values.end()));
  EXPECT_EQ(s.min_us, *std::min_element(values.begin(), values.end()));
}

TEST(LatencyHistogram, BimodalTailIsVisibleInP99) {
  LatencyHistogram h;
  for (int i = 0; i < 980; ++i) h.Record(100);   // fast DRAM hits
  for (int i = 0; i < 20; ++i) h.Record(50000);  // slow disk reads
  HistogramSnapshot s = h.Snapshot();
  ExpectSameBucket(s.p50_us, 100);
  ExpectSameBucket(s.p95_us, 100);
  ExpectSameBucket(s.p99_us, 50000);
  EXPECT_EQ(s.Percentile(1.0), 50000u);
}

TEST(LatencyHistogram, HugeValuesGoToTheOverflowBucket) {
  LatencyHistogram h;
  h.Record(1000);
  h.Record(uint64_t{1} << 40);
  HistogramSnapshot s = h.Snapshot();
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_EQ(s.buckets.back().upper_us, UINT64_MAX);
  EXPECT_EQ(s.max_us, uint64_t{1} << 40);
  EXPECT_EQ(s.Percentile(1.0), uint64_t{1} << 40);
}

TEST(Stats, ConcurrentIncrementsAreExact) {
  Stats stats;
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&stats, t] {
      for (int i = 0; i < kIterations; ++i) {
        stats.lookups.Add();
        stats.bytes_read.Add(4096);
        stats.pool_peak_slots.SetMax(static_cast<uint64_t>(t * kIterations + i));
        stats.read_latency_us.Record(static_cast<uint64_t>(i % 1000));
        if (i % 100 == 0) (void)stats.Snapshot();  // snapshots race with updates
      }
    });
  }
  for (auto& t : threads) t.join();
  StatsSnapshot s = stats.Snapshot();
  EXPECT_EQ(s.lookups, uint64_t{kThreads} * kIterations);
  EXPECT_EQ(s.bytes_read, uint64_t{kThreads} * kIterations * 4096);
  EXPECT_EQ(s.pool_peak_slots, uint64_t{kThreads - 1} * kIterations + kIterations - 1);
  EXPECT_EQ(s.read_latency_us.count, uint64_t{kThreads} * kIterations);
  EXPECT_EQ(s.read_latency_us.sum_us, uint64_t{kThreads} * (kIterations / 1000) * (999 * 1000 / 2));
  EXPECT_EQ(s.read_latency_us.min_us, 0u);
  EXPECT_EQ(s.read_latency_us.max_us, 999u);
}

TEST(Stats, GaugesGoUpAndDown) {
  Stats stats;
  stats.dram_entries.Add(5);
  stats.dram_entries.Sub(2);
  stats.disk_bytes_used.Set(123);
  stats.pool_peak_slots.SetMax(7);
  stats.pool_peak_slots.SetMax(3);
  StatsSnapshot s = stats.Snapshot();
  EXPECT_EQ(s.dram_entries, 3u);
  EXPECT_EQ(s.disk_bytes_used, 123u);
  EXPECT_EQ(s.pool_peak_slots, 7u);
}

StatsSnapshot SampleSnapshot() {
  Stats stats;
  stats.lookups.Add(10);
  stats.lookup_hits_dram.Add(3);
  stats.lookup_hits_disk.Add(5);
  stats.lookup_misses.Add(2);
  stats.bytes_read.Add(3000);
  stats.bytes_needed.Add(2000);
  stats.stores_deduplicated.Add(4);
  stats.dram_entries.Set(9);
  for (uint64_t v : {10, 20, 500, 3000}) stats.load_latency_us.Record(v);
  return stats.Snapshot();
}

TEST(StatsSnapshot, ReadAmplification) {
  StatsSnapshot s;
  EXPECT_EQ(s.read_amplification(), 0.0);
  EXPECT_DOUBLE_EQ(SampleSnapshot().read_amplification(), 1.5);
}

TEST(StatsSnapshot, JsonIsValidAndHasEveryField) {
  StatsSnapshot s = SampleSnapshot();
  std::string json = s.ToJson();
  MiniJsonParser parser(json);
  std::optional<JsonValue> v = parser.Parse();
  ASSERT_TRUE(v.has_value()) << parser.error() << "\n" << json;
  ASSERT_EQ(v->type, JsonValue::Type::kObject);
  EXPECT_EQ((*v)["lookups"].number, 10);
  EXPECT_EQ((*v)["lookup_hits_disk"].number, 5);
  EXPECT_EQ((*v)["stores_deduplicated"].number, 4);
  EXPECT_EQ((*v)["dram_entries"].number, 9);
  EXPECT_DOUBLE_EQ((*v)["read_amplification"].number, 1.5);
  for (const char* name : {"lookups", "declined_loads", "bytes_written", "preload_wasted", "temporaries_swept",
                           "pool_slots_in_use", "pool_peak_slots", "disk_entries", "enospc_events"}) {
    EXPECT_TRUE(v->Has(name)) << name;
  }
  // 32 counters and gauges, read_amplification, 4 histograms.
  EXPECT_EQ(v->object.size(), 32u + 1u + 4u);
  const JsonValue& load = (*v)["load_latency_us"];
  EXPECT_EQ(load["count"].number, 4);
  EXPECT_EQ(load["sum_us"].number, 3530);
  EXPECT_EQ(load["min_us"].number, 10);
  EXPECT_EQ(load["max_us"].number, 3000);
  ASSERT_EQ(load["buckets"].array.size(), 4u);
  EXPECT_EQ(load["buckets"].array[0].array.size(), 3u);
  EXPECT_EQ((*v)["store_latency_us"]["count"].number, 0);
  EXPECT_TRUE((*v)["store_latency_us"]["buckets"].array.empty());
}

TEST(StatsSnapshot, JsonWritesTheOverflowBoundAsNull) {
  Stats stats;
  stats.write_latency_us.Record(uint64_t{1} << 33);
  std::string json = stats.Snapshot().ToJson();
  MiniJsonParser parser(json);
  auto v = parser.Parse();
  ASSERT_TRUE(v.has_value()) << parser.error();
  EXPECT_EQ((*v)["write_latency_us"]["buckets"].array[0].array[1].type, JsonValue::Type::kNull);
}

TEST(StatsSnapshot, TextIsAnAlignedTable) {
  std::string text = SampleSnapshot().ToText();
  std::istringstream in(text);
  std::string line;
  size_t width = 0;
  int value_rows = 0;
  while (std::getline(in, line) && !line.empty()) {
    if (width == 0) width = line.size();
    EXPECT_EQ(line.size(), width) << "misaligned: '" << line << "'";
    ++value_rows;
  }
  EXPECT_EQ(value_rows, 33);
  EXPECT_NE(text.find("lookups"), std::string::npos);
  EXPECT_NE(text.find("read_amplification"), std::string::npos);
  EXPECT_NE(text.find("load_latency_us"), std::string::npos);
  EXPECT_NE(text.find("p99"), std::string::npos);
}

TEST(StatsSnapshot, PrometheusTextFormat) {
  std::string text = SampleSnapshot().ToPrometheus();
  EXPECT_NE(text.find("# TYPE kvtier_lookups_total counter\nkvtier_lookups_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kvtier_dram_entries gauge\nkvtier_dram_entries 9\n"), std::string::npos);
  EXPECT_NE(text.find("# HELP kvtier_lookups_total "), std::string::npos);
  EXPECT_NE(text.find("kvtier_read_amplification 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kvtier_load_latency_seconds histogram\n"), std::string::npos);
  // Cumulative buckets at powers of two microseconds: 10 and 20 are below 32us, 500 below 512us, 3000 below 4096.
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"0.000008\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"0.000016\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"0.000032\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"0.000512\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"0.004096\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"268.435456\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_sum 0.00353\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_load_latency_seconds_count 4\n"), std::string::npos);
  // Every line is a comment or "name[{labels}] value", and names use only the allowed characters.
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    ASSERT_FALSE(line.empty());
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
      continue;
    }
    ++samples;
    size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    std::string name = line.substr(0, std::min(space, line.find('{')));
    for (char c : name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':') << line;
    char* end = nullptr;
    std::string value = line.substr(space + 1);
    std::strtod(value.c_str(), &end);
    EXPECT_EQ(*end, '\0') << line;
  }
  // 32 fields + read amplification + 4 histograms x (30 buckets + sum + count).
  EXPECT_EQ(samples, 32 + 1 + 4 * 32);
}

TEST(StatsSnapshot, PrometheusPrefixIsSanitized) {
  std::string text = SampleSnapshot().ToPrometheus("my-app.kv_");
  EXPECT_NE(text.find("my_app_kv_lookups_total 10\n"), std::string::npos);
  EXPECT_EQ(text.find("kvtier_"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
