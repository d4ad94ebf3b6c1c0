// kvtier bench meta: the metadata side of the engine at several index sizes: publish rate (stores of tiny chunks:
// create temporary, write, close, link, unlink), lookup rate of present keys (index hits) and of absent keys (the
// first lookup stats the filesystem, the second hits the negative cache), the engine's open time (temporary sweep
// plus index rebuild: two walks of the tree) with a cold and a warm dentry cache, and the eviction rate
// (EvictToBudget removing half of the entries).
//
// Chunks use the smallest geometry (1 block of 1 byte: an 8 KiB file, header plus one 4 KiB block), so the numbers
// are per-entry costs, not bandwidth. Stores go through the job API as a client of the engine's slot path
// (JobClient, docs/architecture.md "One data path"), as vLLM's do: each chunk is reserved a slot, copied
// into it and committed.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "cli_util.h"
#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "policy/job_client.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

constexpr uint32_t kBatch = 256;  // chunks per store job
constexpr uint32_t kJobsInFlight = 2;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

ChunkKey MakeKey(uint64_t salt, uint64_t i) {
  uint8_t b[32];
  for (int k = 0; k < 4; ++k) {
    const uint64_t w = SplitMix(salt + i * 4 + static_cast<uint64_t>(k));
    std::memcpy(b + 8 * k, &w, 8);
  }
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

struct Result_ {
  uint64_t entries = 0;
  double publish_s = 0;
  double publish_rate = 0;
  double hit_rate = 0;
  double miss_stat_rate = 0;
  double miss_neg_rate = 0;
  double open_cold_s = 0;
  double open_warm_s = 0;
  bool cold = false;
  double evict_rate = 0;
  uint64_t evicted = 0;
  double evict_s = 0;
};

class MetaBench {
 public:
  MetaBench(std::string root, uint32_t depth, IoMode mode, bool force_progress, uint64_t salt)
      : root_(std::move(root)), depth_(depth), mode_(mode), force_progress_(force_progress), salt_(salt) {}

  EngineOptions Options() const {
    EngineOptions o;
    o.root = root_;
    o.identity.model = "kvtier-bench-meta";
    o.identity.revision = "tiny";
    o.identity.kv_dtype = "uint8";
    o.identity.tokens_per_chunk = 1;
    o.identity.blocks_per_chunk = 1;
    o.identity.block_bytes = 1;
    o.io_depth = depth_;
    o.io_mode = mode_;
    o.pool_bytes = 4ull * depth_ * ChunkFileBytes(1, 1);
    o.negative_cache_ms = 3600 * 1000;  // the second lookup of an absent key must hit the negative cache
    o.op_timeout_ms = 60000;
    return o;
  }

  std::unique_ptr<Engine> Open(const EngineOptions& o) {
    auto e = Engine::Open(o);
    if (!e.ok()) throw CliError("engine: " + e.status().message());
    return std::move(e.value());
  }

  Result_ Run(uint64_t n) {
    Result_ r;
    r.entries = n;
    if (mkdir(root_.c_str(), 0750) != 0) throw CliError("cannot create " + root_ + ": " + std::strerror(errno));
    auto engine = Open(Options());

    // Publish.
    {
      auto client = JobClient::Create(engine.get());
      if (!client.ok()) throw CliError("engine: " + client.status().message());
      JobClient& jobs = **client;
      ProgressBar progress("publish " + std::to_string(n), n, force_progress_);
      std::deque<JobId> in_flight;
      uint64_t next = 0, done = 0;
      auto wait_one = [&] {
        auto res = jobs.Wait(in_flight.front(), 3600 * 1000);
        in_flight.pop_front();
        if (!res.ok()) throw CliError("engine: wait: " + res.status().message());
        if (!res->all_ok()) {
          for (auto& c : res->chunks) {
            if (!c.status.ok()) throw CliError("engine: store failed: " + c.status.ToString());
          }
        }
        done += res->chunks.size();
        progress.Set(done);
      };
      const auto t0 = Clock::now();
      while (next < n) {
        std::vector<ChunkTransfer> batch;
        const uint64_t end = std::min<uint64_t>(n, next + kBatch);
        for (; next < end; ++next) {
          batch.push_back(
              ChunkTransfer{MakeKey(salt_, next), 0, 0, {CopySegment{0, reinterpret_cast<uint64_t>(&byte_), 1}}});
        }
        auto id = jobs.SubmitStore(std::move(batch));
        if (!id.ok()) throw CliError("engine: submit: " + id.status().message());
        in_flight.push_back(*id);
        if (in_flight.size() >= kJobsInFlight) wait_one();
      }
      while (!in_flight.empty()) wait_one();
      r.publish_s = Seconds(t0, Clock::now());
      r.publish_rate = static_cast<double>(n) / r.publish_s;
    }

    // Lookups of present keys: at least 200k, cycling over the keys. A hit is kDisk, or kDram for the stores' last
    // chunks, still resident in the pool (write-through DRAM tier: at most its 4 x depth slots).
    {
      const uint64_t count = std::max<uint64_t>(n, 200000);
      std::vector<ChunkKey> keys;
      keys.reserve(std::min<uint64_t>(n, 1u << 20));
      for (uint64_t i = 0; i < std::min<uint64_t>(n, 1u << 20); ++i) keys.push_back(MakeKey(salt_, i));
      uint64_t hits = 0;
      const auto t0 = Clock::now();
      for (uint64_t i = 0; i < count; ++i) {
        const ChunkLocation where = engine->Lookup(keys[i % keys.size()]);
        hits += where == ChunkLocation::kDisk || where == ChunkLocation::kDram;
      }
      r.hit_rate = static_cast<double>(count) / Seconds(t0, Clock::now());
      if (hits != count) throw CliError("lookup: " + std::to_string(count - hits) + " present keys missed");
    }

    // Lookups of absent keys: first through the filesystem, then from the negative cache.
    {
      const uint64_t count = std::min<uint64_t>(std::max<uint64_t>(n, 10000), 200000);
      std::vector<ChunkKey> keys;
      keys.reserve(count);
      for (uint64_t i = 0; i < count; ++i) keys.push_back(MakeKey(salt_ ^ 0x5555555555555555ull, i));
      uint64_t misses = 0;
      auto t0 = Clock::now();
      for (const ChunkKey& k : keys) misses += engine->Lookup(k) == ChunkLocation::kAbsent;
      r.miss_stat_rate = static_cast<double>(count) / Seconds(t0, Clock::now());
      t0 = Clock::now();
      for (const ChunkKey& k : keys) misses += engine->Lookup(k) == ChunkLocation::kAbsent;
      r.miss_neg_rate = static_cast<double>(count) / Seconds(t0, Clock::now());
      if (misses != 2 * count) throw CliError("lookup: absent keys reported present");
    }

    // Open: sweep + index rebuild from the tree, cold (dentry and inode caches dropped) then warm.
    engine.reset();
    r.cold = DropPageCache();
    auto t0 = Clock::now();
    engine = Open(Options());
    r.open_cold_s = Seconds(t0, Clock::now());
    if (engine->Stats().disk_entries != n) {
      throw CliError("index rebuild found " + std::to_string(engine->Stats().disk_entries) + " entries, expected " +
                     std::to_string(n));
    }
    engine.reset();

    // Eviction of half the entries: low watermark x budget = half of the bytes.
    EngineOptions o = Options();
    const uint64_t bytes = n * ChunkFileBytes(1, 1);
    o.low_watermark = 0.5;
    o.high_watermark = 1.0;
    o.disk_budget_bytes = bytes;
    t0 = Clock::now();
    engine = Open(o);
    r.open_warm_s = Seconds(t0, Clock::now());
    t0 = Clock::now();
    auto evicted = engine->EvictToBudget();
    r.evict_s = Seconds(t0, Clock::now());
    if (!evicted.ok()) throw CliError("EvictToBudget: " + evicted.status().message());
    r.evicted = engine->Stats().evictions;
    r.evict_rate = static_cast<double>(r.evicted) / r.evict_s;
    engine.reset();

    ProgressBar cleanup("removing " + std::to_string(n) + " test entries", 0, force_progress_);
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
    return r;
  }

 private:
  std::string root_;
  uint32_t depth_;
  IoMode mode_;
  bool force_progress_;
  uint64_t salt_;
  uint8_t byte_ = 0x42;
};

}  // namespace

int RunBenchMeta(int argc, char** argv) {
  CliArgs args("bench meta",
               "Measures the engine's per-entry costs at several index sizes: publish (store of a tiny chunk: 8 KiB\n"
               "file), lookup of present keys (index hit), lookup of absent keys (first: one stat; second: negative\n"
               "cache), engine open (temporary sweep + index rebuild from the tree; cold = caches dropped first),\n"
               "and eviction of half the entries (EvictToBudget). Entries are created under DIR and removed after.",
               {{"dir", "DIR", "directory on the disk to measure (a subdirectory is created and removed)", ""},
                {"entries", "LIST", "comma-separated index sizes", "10000,100000"},
                {"depth", "N", "engine io_depth", "16"},
                {"mode", "auto|direct|buffered", "engine I/O mode", "auto"},
                {"json", "OUT", "also write the results as JSON to OUT", ""},
                {"progress", "", "show a progress bar even when stderr is not a terminal", ""}});
  if (!args.ParseOrHelp(argc, argv)) return 0;
  const std::string dir = args.RequiredStr("dir");
  const std::vector<uint64_t> entries = args.UintList("entries", "10000,100000");
  const uint64_t depth = args.Uint("depth", 16);
  if (depth == 0 || depth > 1024) throw UsageError("--depth: must be 1..1024");
  const std::string mode_s = args.Choice("mode", "auto", {"auto", "direct", "buffered"});
  const IoMode mode = mode_s == "direct" ? IoMode::kDirect : mode_s == "buffered" ? IoMode::kBuffered : IoMode::kAuto;
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) throw CliError("--dir " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw CliError("--dir " + dir + " is not a directory");

  const std::string base = dir + "/kvtier-bench-meta." + std::to_string(getpid());
  if (mkdir(base.c_str(), 0750) != 0) throw CliError("cannot create " + base + ": " + std::strerror(errno));
  std::random_device rd;
  const uint64_t salt = (uint64_t{rd()} << 32) ^ rd();
  std::vector<Result_> results;
  try {
    for (uint64_t n : entries) {
      MetaBench b(base + "/" + std::to_string(n), static_cast<uint32_t>(depth), mode, args.Has("progress"), salt + n);
      results.push_back(b.Run(n));
    }
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::remove_all(base, ec);

  TextTable t({"entries", "publish/s", "publish s", "lookup hit/s", "miss stat/s", "miss neg-cache/s", "open cold s",
               "open warm s", "evict/s", "evicted"});
  std::string json;
  for (const Result_& r : results) {
    t.AddRow({std::to_string(r.entries), FormatRate(r.publish_rate), FormatFixed(r.publish_s, 1),
              FormatRate(r.hit_rate), FormatRate(r.miss_stat_rate), FormatRate(r.miss_neg_rate),
              r.cold ? FormatFixed(r.open_cold_s, 2) : "-", FormatFixed(r.open_warm_s, 2), FormatRate(r.evict_rate),
              std::to_string(r.evicted)});
    json += std::string(json.empty() ? "" : ",\n    ") + "{\"entries\": " + std::to_string(r.entries) +
            ", \"publish_per_s\": " + JsonNumber(r.publish_rate) + ", \"publish_s\": " + JsonNumber(r.publish_s) +
            ", \"lookup_hit_per_s\": " + JsonNumber(r.hit_rate) +
            ", \"lookup_miss_stat_per_s\": " + JsonNumber(r.miss_stat_rate) +
            ", \"lookup_miss_negative_cache_per_s\": " + JsonNumber(r.miss_neg_rate) +
            ", \"open_cold_s\": " + (r.cold ? JsonNumber(r.open_cold_s) : "null") +
            ", \"open_warm_s\": " + JsonNumber(r.open_warm_s) + ", \"evict_per_s\": " + JsonNumber(r.evict_rate) +
            ", \"evicted\": " + std::to_string(r.evicted) + "}";
  }
  std::fputs(t.Render().c_str(), stdout);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "8KiB entries (1 block of 1 B), io_depth %llu, %u chunks per store job, %u jobs in flight; open = "
      "temporary sweep + index rebuild (two tree walks)%s; peak RSS %s\n",
      static_cast<unsigned long long>(depth), kBatch, kJobsInFlight,
      results.empty() || results[0].cold ? "" : "; cold open not measured (drop_caches needs root)",
      FormatSize(static_cast<uint64_t>(ru.ru_maxrss) * 1024).c_str());
  if (args.Has("json")) {
    WriteFile(args.Str("json"), "{\n  \"dir\": " + JsonString(dir) + ", \"depth\": " + std::to_string(depth) +
                                    ", \"mode\": " + JsonString(mode_s) + ",\n  \"results\": [\n    " + json +
                                    "\n  ]\n}\n");
  }
  return 0;
}

}  // namespace kvtier
