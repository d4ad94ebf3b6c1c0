// Renderings of the public StatsSnapshot: JSON, an aligned text table, and Prometheus text format.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kvtier/stats.h"
#include "stats/stats.h"

namespace kvtier {

namespace {

enum class Kind { kCounter, kGauge };

struct Field {
  const char* name;
  uint64_t StatsSnapshot::*member;
  Kind kind;
  const char* help;
};

#define KVTIER_STATS_KIND_Counter Kind::kCounter
#define KVTIER_STATS_KIND_Gauge Kind::kGauge
#define KVTIER_STATS_FIELD_ENTRY(name, kind, help) {#name, &StatsSnapshot::name, KVTIER_STATS_KIND_##kind, help},
constexpr Field kFields[] = {KVTIER_STATS_FIELDS(KVTIER_STATS_FIELD_ENTRY)};
#undef KVTIER_STATS_FIELD_ENTRY

struct HistogramField {
  const char* name;  // ends in "_us"
  HistogramSnapshot StatsSnapshot::*member;
  const char* help;
};
#define KVTIER_STATS_HISTOGRAM_ENTRY(name, help) {#name, &StatsSnapshot::name, help},
constexpr HistogramField kHistograms[] = {KVTIER_STATS_HISTOGRAMS(KVTIER_STATS_HISTOGRAM_ENTRY)};
#undef KVTIER_STATS_HISTOGRAM_ENTRY

// Largest power of two (in microseconds) used as a Prometheus bucket bound: the histogram's last regular bound.
constexpr int kPrometheusMaxExponent = LatencyHistogram::kMaxExponent + 1;

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// Seconds as a plain decimal without trailing zeros: 0.000001, 0.5, 268.435456.
std::string SecondsFromMicros(uint64_t us) {
  std::string s = std::to_string(us / 1000000);
  uint64_t frac = us % 1000000;
  if (frac == 0) return s;
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%06llu", static_cast<unsigned long long>(frac));
  std::string f(buf);
  while (!f.empty() && f.back() == '0') f.pop_back();
  return s + "." + f;
}

void AppendHistogramJson(std::string& out, const HistogramSnapshot& h) {
  out += "{\"count\": " + std::to_string(h.count) + ", \"sum_us\": " + std::to_string(h.sum_us) +
         ", \"min_us\": " + std::to_string(h.min_us) + ", \"max_us\": " + std::to_string(h.max_us) +
         ", \"mean_us\": " + Format("%.3f", h.mean_us()) + ", \"p50_us\": " + std::to_string(h.p50_us) +
         ", \"p95_us\": " + std::to_string(h.p95_us) + ", \"p99_us\": " + std::to_string(h.p99_us) + ", \"buckets\": [";
  for (size_t i = 0; i < h.buckets.size(); ++i) {
    const HistogramBucket& b = h.buckets[i];
    if (i > 0) out += ", ";
    // Appended piece by piece: GCC 12 warns -Wrestrict (a false positive, GCC bug 105329) on `"[" + rvalue string`
    // in optimized builds.
    out += '[';
    out += std::to_string(b.lower_us);
    out += ", ";
    out += b.upper_us == UINT64_MAX ? std::string("null") : std::to_string(b.upper_us);
    out += ", ";
    out += std::to_string(b.count);
    out += ']';
  }
  out += "]}";
}

std::string SanitizePrefix(std::string_view prefix) {
  std::string out(prefix);
  for (size_t i = 0; i < out.size(); ++i) {
    char c = out[i];
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) out[i] = '_';
  }
  return out;
}

}  // namespace

uint64_t HistogramSnapshot::Percentile(double q) const {
  if (count == 0 || buckets.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // The rank (1-based) of the sample we want, then interpolate to the middle of its share of the bucket.
  const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count))));
  if (rank >= count) return max_us;  // the largest sample is known exactly
  uint64_t before = 0;
  for (const HistogramBucket& b : buckets) {
    if (before + b.count >= rank) {
      // The samples lie in [lower, upper) and in [min_us, max_us]: interpolate over the intersection (which also
      // bounds the open-ended overflow bucket).
      const uint64_t lower = std::max(b.lower_us, min_us);
      const uint64_t upper = std::max(lower + 1, std::min(b.upper_us, max_us == UINT64_MAX ? max_us : max_us + 1));
      const double fraction = (static_cast<double>(rank - before) - 0.5) / static_cast<double>(b.count);
      const double value = static_cast<double>(lower) + fraction * static_cast<double>(upper - lower);
      return std::clamp(static_cast<uint64_t>(value), min_us, std::max(min_us, max_us));
    }
    before += b.count;
  }
  return max_us;
}

double StatsSnapshot::read_amplification() const {
  return bytes_needed == 0 ? 0.0 : static_cast<double>(bytes_read) / static_cast<double>(bytes_needed);
}

std::string StatsSnapshot::ToJson() const {
  std::string out = "{";
  for (const Field& f : kFields) {
    out += "\"";
    out += f.name;
    out += "\": " + std::to_string(this->*f.member) + ", ";
  }
  out += "\"read_amplification\": " + Format("%.6g", read_amplification());
  for (const HistogramField& h : kHistograms) {
    out += ", \"";
    out += h.name;
    out += "\": ";
    AppendHistogramJson(out, this->*h.member);
  }
  out += "}";
  return out;
}

std::string StatsSnapshot::ToText() const {
  size_t width = std::string_view("read_amplification").size();
  for (const Field& f : kFields) width = std::max(width, std::string_view(f.name).size());
  for (const HistogramField& h : kHistograms) width = std::max(width, std::string_view(h.name).size());
  auto row = [width](std::string_view name, const std::string& value) {
    std::string line(name);
    line.append(width - name.size() + 2, ' ');
    if (value.size() < 20) line.append(20 - value.size(), ' ');
    return line + value + "\n";
  };
  std::string out;
  for (const Field& f : kFields) out += row(f.name, std::to_string(this->*f.member));
  out += row("read_amplification", Format("%.3f", read_amplification()));
  out += "\n";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-*s  %12s %12s %12s %12s %12s %12s\n", static_cast<int>(width), "latency (us)",
                "count", "mean", "p50", "p95", "p99", "max");
  out += buf;
  for (const HistogramField& hf : kHistograms) {
    const HistogramSnapshot& h = this->*hf.member;
    std::snprintf(buf, sizeof(buf), "%-*s  %12llu %12.1f %12llu %12llu %12llu %12llu\n", static_cast<int>(width),
                  hf.name, static_cast<unsigned long long>(h.count), h.mean_us(),
                  static_cast<unsigned long long>(h.p50_us), static_cast<unsigned long long>(h.p95_us),
                  static_cast<unsigned long long>(h.p99_us), static_cast<unsigned long long>(h.max_us));
    out += buf;
  }
  return out;
}

std::string StatsSnapshot::ToPrometheus(std::string_view prefix) const {
  const std::string p = SanitizePrefix(prefix);
  std::string out;
  for (const Field& f : kFields) {
    std::string metric = p + f.name + (f.kind == Kind::kCounter ? "_total" : "");
    out += "# HELP " + metric + " " + f.help + "\n";
    out += "# TYPE " + metric + (f.kind == Kind::kCounter ? " counter\n" : " gauge\n");
    out += metric + " " + std::to_string(this->*f.member) + "\n";
  }
  {
    std::string metric = p + "read_amplification";
    out += "# HELP " + metric + " Bytes read from disk per byte needed by loads\n";
    out += "# TYPE " + metric + " gauge\n";
    out += metric + " " + Format("%.6g", read_amplification()) + "\n";
  }
  for (const HistogramField& hf : kHistograms) {
    const HistogramSnapshot& h = this->*hf.member;
    std::string base(hf.name);
    base = p + base.substr(0, base.size() - 3) + "_seconds";  // load_latency_us -> load_latency_seconds
    out += "# HELP " + base + " " + hf.help + "\n";
    out += "# TYPE " + base + " histogram\n";
    // Fine buckets never straddle a power of two, so each cumulative count is exact (at microsecond resolution).
    size_t next = 0;
    uint64_t cumulative = 0;
    for (int e = 0; e <= kPrometheusMaxExponent; ++e) {
      const uint64_t bound = uint64_t{1} << e;
      while (next < h.buckets.size() && h.buckets[next].upper_us <= bound) cumulative += h.buckets[next++].count;
      out += base + "_bucket{le=\"" + SecondsFromMicros(bound) + "\"} " + std::to_string(cumulative) + "\n";
    }
    out += base + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += base + "_sum " + SecondsFromMicros(h.sum_us) + "\n";
    out += base + "_count " + std::to_string(h.count) + "\n";
  }
  return out;
}

}  // namespace kvtier
