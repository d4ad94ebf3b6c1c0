// kvtier_mh_engine: one engine driven by a line protocol, the "host" process of the multi-host suite
// (tests/multihost/test_multihost.py, SPEC M4). Each host runs one of these in its network namespace on its mount.
// Its stores and loads go through the job API as a client of the engine's slot path (JobClient,
// docs/architecture.md "One data path"), the way vLLM's workers move bytes.
//
//   kvtier_mh_engine --root DIR [--budget BYTES] [--block-kib N] [--blocks N] [--fsync 0|1] [--neg-ms N]
//   [--shared-neg-ms N] [--touch-s N]
//                    [--pool-chunks N] [--io-depth N] [--io-mode auto|direct|buffered] [--backend auto|uring|posix]
//
// Commands on stdin, one per line; one JSON line per command on stdout:
//   store FIRST COUNT [BATCH]  store keys FIRST..FIRST+COUNT-1 (jobs of BATCH chunks, default all in one job)
//   load FIRST COUNT           load them (one job) and compare every byte with the key's expected content
//   lookup FIRST COUNT         how many are hits (kDisk or kDram)
//   waithit KEY TIMEOUT_MS     look KEY up until it is a hit; the elapsed milliseconds
//   chase FIRST COUNT TIMEOUT_MS  load each key as soon as it can be had (another host is storing them); bad_seen
//                              counts names seen before their data: a chunk file of another size, or a load that
//                              read the entry and failed (short, unreadable or failing its checks)
//   keys FIRST COUNT           the keys' hex (their chunk files are <hex>.kvc)
//   evict                      Engine::EvictToBudget
//   stats                      counters
//   describe                   Engine::Describe
//   quit
// A key's bytes depend only on the key (as KV bytes do on the prefix), so concurrent stores of one key by several
// hosts write identical entries and every load can check every byte.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "policy/job_client.h"

using namespace kvtier;

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

ChunkKey KeyOf(uint64_t i) {
  uint8_t b[32];
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = Mix(i * 4 + w + 0x6b76746965720000ull);
    std::memcpy(b + 8 * w, &v, 8);
  }
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

void Fill(uint64_t key, uint8_t* p, uint64_t n) {
  for (uint64_t off = 0; off < n; off += 8) {
    const uint64_t v = Mix(key * 0x100000001b3ull + off);
    std::memcpy(p + off, &v, std::min<uint64_t>(8, n - off));
  }
}

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions o;
  o.identity.model = "kvtier-multihost";
  o.identity.revision = "r1";
  o.identity.kv_dtype = "bfloat16";
  o.identity.blocks_per_chunk = 4;
  o.identity.block_bytes = 256 << 10;
  o.identity.tokens_per_chunk = 64;
  o.backend = IoBackend::kAuto;
  o.pool_populate = false;
  uint32_t pool_chunks = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--root")
      o.root = v;
    else if (a == "--budget")
      o.disk_budget_bytes = std::strtoull(v, nullptr, 0);
    else if (a == "--block-kib")
      o.identity.block_bytes = std::strtoull(v, nullptr, 0) << 10;
    else if (a == "--blocks")
      o.identity.blocks_per_chunk = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--fsync")
      o.fsync_on_publish = std::atoi(v) != 0;
    else if (a == "--neg-ms")
      o.negative_cache_ms = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--shared-neg-ms")
      o.shared_negative_cache_ms = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--touch-s")
      o.touch_interval_s = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--pool-chunks")
      pool_chunks = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--io-depth")
      o.io_depth = static_cast<uint32_t>(std::atoi(v));
    else if (a == "--io-mode")
      o.io_mode = std::string(v) == "buffered" ? IoMode::kBuffered
                  : std::string(v) == "direct" ? IoMode::kDirect
                                               : IoMode::kAuto;
    else if (a == "--backend")
      o.backend = std::string(v) == "posix"   ? IoBackend::kPosix
                  : std::string(v) == "uring" ? IoBackend::kUring
                                              : IoBackend::kAuto;
    else {
      std::fprintf(stderr, "kvtier_mh_engine: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const uint64_t payload = uint64_t(o.identity.blocks_per_chunk) * o.identity.block_bytes;
  o.pool_bytes = uint64_t(pool_chunks) * (payload + 8192);
  auto opened = Engine::Open(o);
  if (!opened.ok()) {
    std::printf("{\"error\":\"%s\"}\n", JsonEscape(opened.status().ToString()).c_str());
    return 1;
  }
  std::unique_ptr<Engine> engine = std::move(opened.value());
  auto client = JobClient::Create(engine.get());
  if (!client.ok()) {
    std::printf("{\"error\":\"%s\"}\n", JsonEscape(client.status().ToString()).c_str());
    return 1;
  }
  std::unique_ptr<JobClient> jobs = std::move(client.value());  // destroyed before the engine
  // The namespace's directory, where chase looks for the chunk files of the keys it waits for.
  NamespaceIdentity nid;
  nid.model = o.identity.model;
  nid.revision = o.identity.revision;
  nid.kv_dtype = o.identity.kv_dtype;
  nid.tokens_per_chunk = o.identity.tokens_per_chunk;
  nid.blocks_per_chunk = o.identity.blocks_per_chunk;
  nid.block_bytes = o.identity.block_bytes;
  nid.tp_size = o.identity.tp_size;
  nid.pp_size = o.identity.pp_size;
  nid.layout_tag = o.identity.layout_tag;
  const std::string ns_dir = o.root + "/" + NamespaceDirName(nid);
  const uint64_t chunk_file_bytes = ChunkFileBytes(o.identity.blocks_per_chunk, o.identity.block_bytes);
  std::printf("{\"ready\":true,\"pid\":%d}\n", getpid());
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    const int64_t t0 = NowUs();
    std::ostringstream out;
    if (cmd == "store") {
      uint64_t first = 0, count = 0, batch = 0;
      in >> first >> count >> batch;
      if (batch == 0) batch = count;
      uint32_t ok = 0, failed = 0;
      std::string first_error;
      for (uint64_t b = first; b < first + count; b += batch) {
        const uint64_t n = std::min(batch, first + count - b);
        std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(payload));
        std::vector<ChunkTransfer> chunks;
        for (uint64_t j = 0; j < n; ++j) {
          Fill(b + j, bufs[j].data(), payload);
          chunks.push_back(
              ChunkTransfer{KeyOf(b + j), 0, 0, {{0, reinterpret_cast<uint64_t>(bufs[j].data()), payload}}});
        }
        auto id = jobs->SubmitStore(std::move(chunks));
        if (!id.ok()) {
          failed += n;
          if (first_error.empty()) first_error = id.status().ToString();
          continue;
        }
        auto r = jobs->Wait(*id, 120000);
        if (!r.ok()) {
          failed += n;
          if (first_error.empty()) first_error = r.status().ToString();
          continue;
        }
        ok += r->chunks_ok;
        for (const auto& c : r->chunks) {
          if (!c.status.ok()) {
            failed++;
            if (first_error.empty()) first_error = c.status.ToString();
          }
        }
      }
      out << "{\"op\":\"store\",\"ok\":" << ok << ",\"failed\":" << failed << ",\"error\":\"" << JsonEscape(first_error)
          << "\"";
    } else if (cmd == "load") {
      uint64_t first = 0, count = 0;
      in >> first >> count;
      std::vector<std::vector<uint8_t>> bufs(count, std::vector<uint8_t>(payload));
      std::vector<ChunkTransfer> chunks;
      for (uint64_t j = 0; j < count; ++j) {
        chunks.push_back(
            ChunkTransfer{KeyOf(first + j), 0, 0, {{0, reinterpret_cast<uint64_t>(bufs[j].data()), payload}}});
      }
      uint32_t ok = 0, miss = 0, wrong = 0;
      std::string first_error;
      auto id = jobs->SubmitLoad(std::move(chunks));
      auto r = id.ok() ? jobs->Wait(*id, 120000) : Result<JobResult>(id.status());
      if (!r.ok()) {
        miss = static_cast<uint32_t>(count);
        first_error = r.status().ToString();
      } else {
        std::vector<uint8_t> want(payload);
        for (uint64_t j = 0; j < count; ++j) {
          if (!r->chunks[j].status.ok()) {
            miss++;
            if (first_error.empty()) first_error = r->chunks[j].status.ToString();
            continue;
          }
          Fill(first + j, want.data(), payload);
          if (std::memcmp(want.data(), bufs[j].data(), payload) != 0) {
            wrong++;
          } else {
            ok++;
          }
        }
      }
      out << "{\"op\":\"load\",\"ok\":" << ok << ",\"miss\":" << miss << ",\"wrong\":" << wrong << ",\"error\":\""
          << JsonEscape(first_error) << "\"";
    } else if (cmd == "lookup") {
      uint64_t first = 0, count = 0;
      in >> first >> count;
      uint32_t hits = 0;
      for (uint64_t j = 0; j < count; ++j) {
        const ChunkLocation l = engine->Lookup(KeyOf(first + j));
        hits += l == ChunkLocation::kDisk || l == ChunkLocation::kDram;
      }
      out << "{\"op\":\"lookup\",\"hits\":" << hits;
    } else if (cmd == "waithit") {
      uint64_t k = 0, timeout_ms = 0;
      in >> k >> timeout_ms;
      bool hit = false;
      uint64_t lookups = 0;
      while (NowUs() - t0 < int64_t(timeout_ms) * 1000) {
        ++lookups;
        const ChunkLocation l = engine->Lookup(KeyOf(k));
        if (l == ChunkLocation::kDisk || l == ChunkLocation::kDram) {
          hit = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      out << "{\"op\":\"waithit\",\"hit\":" << (hit ? "true" : "false") << ",\"lookups\":" << lookups;
    } else if (cmd == "chase") {
      // Loads keys FIRST..FIRST+COUNT-1 over and over, each as soon as it can be had, until all were loaded or
      // TIMEOUT_MS passed: a host that uses entries the moment another host publishes them.
      uint64_t first = 0, count = 0, timeout_ms = 0;
      in >> first >> count >> timeout_ms;
      std::vector<bool> done(count, false);
      uint64_t ok = 0, wrong = 0, rounds = 0, bad_seen = 0;
      std::vector<uint8_t> buf(payload), want(payload);
      while (ok + wrong < count && NowUs() - t0 < int64_t(timeout_ms) * 1000) {
        ++rounds;
        for (uint64_t j = 0; j < count; ++j) {
          if (done[j]) continue;
          // A name whose data this host cannot see yet: its file is there at another size than a chunk's (a load
          // does not read it: the engine takes only files of a chunk's size for entries, M1) ...
          struct stat st;
          const std::string file = ns_dir + "/" + ChunkRelPath(KeyOf(first + j));
          bad_seen += stat(file.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) != chunk_file_bytes;
          const uint64_t reads_before = engine->Stats().read_latency_us.count;
          auto id = jobs->SubmitLoad(
              {ChunkTransfer{KeyOf(first + j), 0, 0, {{0, reinterpret_cast<uint64_t>(buf.data()), payload}}}});
          if (!id.ok()) continue;
          auto r = jobs->Wait(*id, 120000);
          if (!r.ok()) continue;
          if (!r->all_ok()) {
            // ... or the load read the entry (a promotion ended: read_latency_us counts each) and it failed: short,
            // unreadable or failing its checks. A miss without a read found no entry (not published yet).
            bad_seen += engine->Stats().read_latency_us.count > reads_before;
            continue;
          }
          Fill(first + j, want.data(), payload);
          (std::memcmp(want.data(), buf.data(), payload) == 0 ? ok : wrong)++;
          done[j] = true;
        }
      }
      out << "{\"op\":\"chase\",\"ok\":" << ok << ",\"wrong\":" << wrong << ",\"rounds\":" << rounds
          << ",\"bad_seen\":" << bad_seen;
    } else if (cmd == "keys") {
      uint64_t first = 0, count = 0;
      in >> first >> count;
      out << "{\"op\":\"keys\",\"hex\":[";
      for (uint64_t j = 0; j < count; ++j) out << (j ? "," : "") << "\"" << KeyOf(first + j).Hex() << "\"";
      out << "]";
    } else if (cmd == "evict") {
      auto r = engine->EvictToBudget();
      out << "{\"op\":\"evict\",\"bytes\":" << (r.ok() ? *r : 0);
    } else if (cmd == "stats") {
      const StatsSnapshot s = engine->Stats();
      out << "{\"op\":\"stats\",\"corrupt_entries\":" << s.corrupt_entries << ",\"evictions\":" << s.evictions
          << ",\"evicted_bytes\":" << s.evicted_bytes << ",\"stores_dropped\":" << s.stores_dropped
          << ",\"stores_deduplicated\":" << s.stores_deduplicated << ",\"disk_bytes_used\":" << s.disk_bytes_used
          << ",\"disk_entries\":" << s.disk_entries << ",\"io_errors\":" << s.io_errors
          << ",\"lookup_misses\":" << s.lookup_misses << ",\"lookup_hits_disk\":" << s.lookup_hits_disk;
    } else if (cmd == "describe") {
      out << "{\"op\":\"describe\",\"text\":\"" << JsonEscape(engine->Describe()) << "\"";
    } else if (cmd == "quit") {
      break;
    } else {
      out << "{\"op\":\"" << JsonEscape(cmd) << "\",\"error\":\"unknown command\"";
    }
    out << ",\"ms\":" << (NowUs() - t0) / 1000.0 << "}";
    std::printf("%s\n", out.str().c_str());
    std::fflush(stdout);
  }
  return 0;
}
