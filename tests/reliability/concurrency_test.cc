// Concurrency suite (SPEC L4, C1): several processes with several threads each on one root with a small disk
// budget, storing and loading overlapping keys. Each writer stores its own bytes for a key (the writer's id is in
// the first 8 bytes), so a reader can tell a complete entry of one writer from a mix: no reader may ever see a
// partial or mixed entry; publication is first-writer-wins; and the bytes of published entries, sampled every few
// milliseconds from the tree, stay within 5% of the budget.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
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
  auto e = test::OpenWithJobs(o);
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
          Status s = LoadOne(e.value(), Key(k), &got);
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
          (StoreOne(e.value(), k, me).ok() ? sh->stores_ok : sh->stores_other)++;
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
    auto e = test::OpenWithJobs(Options(dir.path()));  // the namespace exists before the race starts
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
  std::printf(
      "concurrency suite: %d processes x %d threads, %.0f s: %llu lookups, %llu stores ok, %llu stores "
      "dropped/deduplicated, %llu loads ok (each compared byte for byte), %llu load misses; budget %llu B, "
      "peak %llu B (%.1f%%) over %llu samples (%llu above 100%%); wrong: %llu\n",
      kProcesses, kThreads, seconds, (unsigned long long)sh->lookups.load(), (unsigned long long)sh->stores_ok.load(),
      (unsigned long long)sh->stores_other.load(), (unsigned long long)sh->loads_ok.load(),
      (unsigned long long)sh->load_misses.load(), (unsigned long long)budget, (unsigned long long)max_bytes,
      100.0 * max_bytes / budget, (unsigned long long)samples, (unsigned long long)over,
      (unsigned long long)sh->wrong.load());
  munmap(sh, 4096);
}

// C1, M1: empty fan-out directories are removed (by eviction and gc), so a store can find the directory it created
// gone before its temporary is opened or linked. Two engines store keys of two fan-out directories, one of them
// with a budget of two chunks (its reactor evicts both engines' entries and removes the directories it empties),
// while another process removes every entry there and then each directory it emptied, as `kvtier gc` does, round
// after round without pause. Every store must still succeed: the store path creates a vanished directory again.
ChunkKey DirKey(uint64_t i) {
  uint8_t b[36] = {};
  b[0] = static_cast<uint8_t>(i % 2);  // fan-out directories 00/77 and 01/77 only
  b[1] = 0x77;
  for (int k = 0; k < 8; ++k) b[2 + k] = static_cast<uint8_t>(i >> (8 * k));
  b[35] = 0xd1;
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

[[noreturn]] void RemoveEntriesAndDirectoriesForever(const std::string& ns_path) {
  for (;;) {
    for (const char* first : {"00", "01"}) {
      const std::string dir = ns_path + "/" + first + "/77";
      bool removed = false;
      if (DIR* d = opendir(dir.c_str())) {
        while (struct dirent* e = readdir(d)) {
          const std::string name = e->d_name;
          if (name.size() > 4 && name.substr(name.size() - 4) == ".kvc") {
            removed |= unlink((dir + "/" + name).c_str()) == 0;
          }
        }
        closedir(d);
      }
      if (removed && rmdir(dir.c_str()) == 0) rmdir((ns_path + "/" + first).c_str());
    }
  }
}

class FanoutRemoval : public ::testing::TestWithParam<bool> {};

TEST_P(FanoutRemoval, StoresSucceedWhileEvictionAndGcRemoveTheirFanoutDirectories) {
  test::TempDir dir;
  EngineOptions a_opts = Options(dir.path());
  a_opts.anonymous_temporaries = GetParam();
  EngineOptions b_opts = a_opts;
  b_opts.disk_budget_bytes = 2 * kChunkFileBytes;
  b_opts.high_watermark = 1.0;
  b_opts.low_watermark = 0.5;
  // b's budget of two entries evicts nearly every entry right after its publish: a store is still written
  // (Engine::TakeStoreOutcome, the store's own outcome).
  auto a = test::OpenWithJobs(a_opts);
  auto b = test::OpenWithJobs(b_opts);
  ASSERT_TRUE(a.ok() && b.ok());
  const pid_t remover = fork();
  ASSERT_GE(remover, 0);
  if (remover == 0) RemoveEntriesAndDirectoriesForever(NsPath(a_opts));

  const uint64_t per_thread = 150 * Soak();
  std::atomic<uint64_t> ok{0}, failed{0};
  std::string first_failure;
  std::mutex mu;
  auto store = [&](test::JobEngine& e, uint64_t first) {
    for (uint64_t i = first; i < first + per_thread; ++i) {
      std::vector<uint8_t> data = ContentFor(i);
      auto r = e.Run(e.jobs->SubmitStore({{DirKey(i), 0, 0, Segments(data, e->block_stride())}}));
      const Status s = r.ok() ? r->chunks[0].status : r.status();
      if (s.ok()) {
        ok++;
      } else {
        failed++;
        std::lock_guard<std::mutex> lock(mu);
        if (first_failure.empty()) first_failure = s.ToString();
      }
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(store, std::ref(a.value()), 0);
  threads.emplace_back(store, std::ref(a.value()), 1000000);
  threads.emplace_back(store, std::ref(b.value()), 2000000);
  for (auto& t : threads) t.join();
  kill(remover, SIGKILL);
  waitpid(remover, nullptr, 0);
  EXPECT_EQ(failed.load(), 0u) << "first failure: " << first_failure;
  EXPECT_EQ(ok.load(), 3 * per_thread);
  EXPECT_EQ(a.value()->Stats().stores_dropped + b.value()->Stats().stores_dropped, 0u);
  EXPECT_GT(b.value()->Stats().evictions, 0u);
}

INSTANTIATE_TEST_SUITE_P(Temporaries, FanoutRemoval, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Anonymous" : "Named"; });

}  // namespace
}  // namespace kvtier::rel
