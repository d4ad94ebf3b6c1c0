// Concurrency suite (SPEC L4, C1): several processes with several threads each on one root with a small disk
// budget, storing and loading overlapping keys. Each writer stores its own bytes for a key (the writer's id is in
// the first 8 bytes), so a reader can tell a complete entry of one writer from a mix: no reader may ever see a
// partial or mixed entry; publication is first-writer-wins; and the bytes of published entries, sampled every few
// milliseconds from the tree, stay within 5% of the budget.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "layout/scan.h"
#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

struct Shared {  // in a MAP_SHARED page: children count, the parent reads
  std::atomic<uint64_t> stores_ok, stores_other, loads_ok, load_misses, wrong, lookups;
};

constexpr int kProcesses = 3;
constexpr int kThreads = 3;
constexpr uint64_t kBudgetChunks = 48;

[[noreturn]] void Worker(const std::string& root, int proc, double seconds, Shared* sh) {
  EngineOptions o = Options(root);
  o.disk_budget_bytes = kBudgetChunks * kChunkFileBytes;
  o.io_depth = 2;
  o.pool_bytes = 24 * kChunkFileBytes;
  o.negative_cache_ms = 0;
  auto e = Engine::Open(o);
  if (!e.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", proc, e.status().ToString().c_str());
    _exit(3);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(proc * 1000 + t);
      const uint64_t me = proc * 100 + t + 1;
      while (std::chrono::steady_clock::now() < end) {
        const uint64_t k = rng() % (3 * kBudgetChunks);  // the key space is 3x the budget: eviction never stops
        sh->lookups++;
        if (e.value()->Lookup(Key(k)) == ChunkLocation::kDisk) {
          std::vector<uint8_t> got;
          Status s = LoadOne(*e.value(), Key(k), &got);
          if (s.ok()) {
            uint64_t writer = 0;
            std::memcpy(&writer, got.data(), 8);
            if (got != ContentFor(k, writer)) sh->wrong++;  // a partial, mixed or misplaced entry
            sh->loads_ok++;
          } else {
            if (!AllSentinel(got)) sh->wrong++;
            sh->load_misses++;
          }
        } else {
          (StoreOne(*e.value(), k, me).ok() ? sh->stores_ok : sh->stores_other)++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  if (e.value()->Stats().corrupt_entries != 0) sh->wrong++;
  _exit(0);
}

TEST(ConcurrencySuite, ProcessesAndThreadsOnOneRootNeverSeeAPartialEntryAndHoldTheBudget) {
  test::TempDir dir;
  auto* sh = static_cast<Shared*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  new (sh) Shared{};
  {
    auto e = Engine::Open(Options(dir.path()));  // the namespace exists before the race starts
    ASSERT_TRUE(e.ok());
  }
  const double seconds = 3.0 * Soak();
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) Worker(dir.path(), p, seconds, sh);
    pids.push_back(pid);
  }
  auto ns = Namespace::OpenExisting(dir.path(), NsPath(Options(dir.path())).substr(dir.path().size() + 1));
  ASSERT_TRUE(ns.ok());
  const uint64_t budget = kBudgetChunks * kChunkFileBytes;
  uint64_t max_bytes = 0, samples = 0, over = 0;
  int alive = kProcesses;
  while (alive > 0) {
    uint64_t bytes = 0;
    (void)ScanEntries(ns.value(), [&](const EntryInfo& en) {
      if (!en.is_temporary && !en.is_foreign) bytes += en.size_bytes;
    });
    max_bytes = std::max(max_bytes, bytes);
    over += bytes > budget;
    ++samples;
    usleep(5000);
    for (pid_t& pid : pids) {
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker failed: " << status;
        pid = -1;
        --alive;
      }
    }
  }
  EXPECT_EQ(sh->wrong.load(), 0u) << "a reader saw a partial or mixed entry";
  EXPECT_GT(sh->loads_ok.load(), 0u);
  EXPECT_GT(sh->stores_ok.load(), 0u);
  EXPECT_LE(max_bytes, budget + budget / 20) << "budget exceeded by more than 5%: " << max_bytes << " of " << budget;
  std::printf("concurrency suite: %d processes x %d threads, %.0f s: %llu lookups, %llu stores ok, %llu stores "
              "dropped/deduplicated, %llu loads ok (each compared byte for byte), %llu load misses; budget %llu B, "
              "peak %llu B (%.1f%%) over %llu samples (%llu above 100%%); wrong: %llu\n",
              kProcesses, kThreads, seconds, (unsigned long long)sh->lookups.load(),
              (unsigned long long)sh->stores_ok.load(), (unsigned long long)sh->stores_other.load(),
              (unsigned long long)sh->loads_ok.load(), (unsigned long long)sh->load_misses.load(),
              (unsigned long long)budget, (unsigned long long)max_bytes, 100.0 * max_bytes / budget,
              (unsigned long long)samples, (unsigned long long)over, (unsigned long long)sh->wrong.load());
  munmap(sh, 4096);
}

}  // namespace
}  // namespace kvtier::rel
