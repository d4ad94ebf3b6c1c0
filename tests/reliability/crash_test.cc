// Crash suite (SPEC L4, L5, K1, C1): writer processes storing (and evicting under a small budget) while fsck
// --repair and gc run at the same time, all killed with SIGKILL at random points, round after round. Afterwards
// every published entry verifies and holds exactly the bytes written for its key, fsck finds nothing corrupt, and
// a restart sweeps the temporaries. Extends tests/engine/crash_test.cc (one writer at a time, no maintenance).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "layout/scan.h"
#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

constexpr uint64_t kKeySpace = 64;

// What the writers of all rounds did before they were killed, in memory shared with the test process (a killed
// writer's counts stay). Printed with the summary so that a run that published nothing says why.
struct Progress {
  std::atomic<uint64_t> opened{0};         // engines opened
  std::atomic<uint64_t> open_failed{0};    // Engine::Open failed (the writer exits 3)
  std::atomic<uint64_t> jobs_done{0};      // store jobs finished
  std::atomic<uint64_t> chunks_stored{0};  // chunks whose store succeeded
  std::atomic<uint64_t> chunks_failed{0};  // chunks whose store failed (e.g. its temporary swept by fsck)
  std::atomic<uint64_t> open_us_max{0};    // slowest Engine::Open
  std::atomic<uint64_t> first_us_max{0};   // slowest start (fork to the first finished store job)
  std::atomic<int> writers_running{0};     // writers of this round with at least one finished job
};

Progress* SharedProgress() {
  static Progress* p = [] {
    void* m = mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    return new (m) Progress;
  }();
  return p;
}

uint64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RaiseTo(std::atomic<uint64_t>& max, uint64_t v) {
  uint64_t prev = max.load();
  while (v > prev && !max.compare_exchange_weak(prev, v)) {
  }
}

[[noreturn]] void Writer(const std::string& root, int who, uint32_t seed) {
  Progress* const progress = SharedProgress();
  EngineOptions o = Options(root);
  o.disk_budget_bytes = 24 * kChunkFileBytes;  // eviction runs during the stores
  o.anonymous_temporaries = who % 2 == 0;      // both publication forms
  o.temp_max_age_s = 3600;
  const uint64_t t0 = NowUs();
  auto e = test::OpenWithJobs(o);
  if (!e.ok()) {
    progress->open_failed.fetch_add(1);
    _exit(3);
  }
  RaiseTo(progress->open_us_max, NowUs() - t0);
  progress->opened.fetch_add(1);
  std::mt19937 rng(seed);
  for (int n = 0; n < 400; ++n) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<ChunkTransfer> t;
    for (int k = 0; k < 3; ++k) {
      const uint64_t i = rng() % kKeySpace;
      data.push_back(ContentFor(i));
    }
    for (int k = 0; k < 3; ++k) {
      uint64_t i;
      std::memcpy(&i, data[k].data() + 8, 8);
      t.push_back({Key(i), 0, 0, Segments(data[k], e.value()->block_stride())});
    }
    auto id = e.value().jobs->SubmitStore(std::move(t));
    if (!id.ok()) _exit(4);
    auto r = e.value().jobs->Wait(id.value(), 30000);
    if (!r.ok()) _exit(4);
    for (const auto& c : r->chunks) (c.status.ok() ? progress->chunks_stored : progress->chunks_failed).fetch_add(1);
    progress->jobs_done.fetch_add(1);
    if (n == 0) {
      RaiseTo(progress->first_us_max, NowUs() - t0);
      progress->writers_running.fetch_add(1);
    }
    if (n % 7 == 0) {
      std::vector<uint8_t> got;
      const uint64_t i = rng() % kKeySpace;
      if (LoadOne(e.value(), Key(i), &got).ok() && got != ContentFor(i)) _exit(5);  // wrong bytes served
    }
  }
  _exit(0);
}

// fsck --repair and gc, through the CLI when this build has it, else the same work through the library.
[[noreturn]] void Maintenance(const std::string& root, int round) {
#ifdef KVTIER_CLI_PATH
  const std::string budget = std::to_string(16 * kChunkFileBytes);
  for (int n = 0;; ++n) {
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      if ((n + round) % 2 == 0) {
        execl(KVTIER_CLI_PATH, "kvtier", "fsck", "--root", root.c_str(), "--repair", "--temp-max-age", "0",
              static_cast<char*>(nullptr));
      } else {
        execl(KVTIER_CLI_PATH, "kvtier", "gc", "--root", root.c_str(), "--budget", budget.c_str(),
              static_cast<char*>(nullptr));
      }
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);  // when we are killed, the child finishes on its own (or is killed by the test)
  }
#else
  (void)round;
  for (;;) {
    auto names = ListNamespaces(root);
    if (!names.ok()) continue;
    for (const std::string& name : names.value()) {
      auto ns = Namespace::OpenExisting(root, name);
      if (!ns.ok()) continue;
      (void)SweepTemporaries(ns.value(), std::chrono::seconds(0));
      std::vector<ChunkKey> keys;
      (void)ScanEntries(ns.value(), [&](const EntryInfo& en) {
        if (!en.is_temporary && !en.is_foreign) keys.push_back(en.key);
      });
      for (size_t k = 0; k + 16 < keys.size(); ++k) (void)RemoveChunk(ns.value().dirfd(), keys[k]);  // "gc"
    }
  }
#endif
}

TEST(CrashSuite, WritersFsckAndGcKilledAtRandomPointsLeaveOnlyEntriesWithTheirOwnBytes) {
  test::TempDir dir;
  {
    auto e = test::OpenWithJobs(Options(dir.path()));
    ASSERT_TRUE(e.ok());
  }
  const int rounds = 60 * Soak();
  Progress* const progress = SharedProgress();
  std::mt19937 rng(4242);
  int kills = 0, exited = 0;
  for (int round = 0; round < rounds; ++round) {
    progress->writers_running.store(0);
    std::vector<pid_t> pids;
    for (int w = 0; w < 2; ++w) {
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) Writer(dir.path(), w, static_cast<uint32_t>(round * 10 + w));
      pids.push_back(pid);
    }
    pid_t maint = fork();
    ASSERT_GE(maint, 0);
    if (maint == 0) {
      setpgid(0, 0);  // its CLI children share its group: killed together
      Maintenance(dir.path(), round);
    }
    setpgid(maint, maint);
    // Even rounds kill at a random point from the fork (inside Engine::Open too); odd rounds once both writers
    // have finished a store job (or 20 s passed), so that a slow machine's runs also publish and evict.
    if (round % 2 == 1) {
      const uint64_t deadline = NowUs() + 20'000'000;
      while (progress->writers_running.load() < 2 && NowUs() < deadline) usleep(1000);
    }
    usleep(std::uniform_int_distribution<int>(5'000, 400'000)(rng));
    for (pid_t pid : pids) kills += kill(pid, SIGKILL) == 0;
    kills += kill(-maint, SIGKILL) == 0 || kill(maint, SIGKILL) == 0;
    for (pid_t pid : pids) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      // Killed by our SIGKILL or done: any other end (an exit code, SIGSEGV, SIGBUS, SIGABRT from a check) fails.
      ASSERT_TRUE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                  (WIFEXITED(status) && WEXITSTATUS(status) == 0))
          << "writer failed: "
          << (WIFSIGNALED(status) ? std::string("signal ") + strsignal(WTERMSIG(status))
                                  : "exit " + std::to_string(WEXITSTATUS(status)) +
                                        " (3: open failed, 4: a store job failed, 5: served wrong bytes)");
      exited += WIFEXITED(status);
    }
    int status = 0;
    ASSERT_EQ(waitpid(maint, &status, 0), maint);
  }
  // Restart: temporaries of every age are swept, every entry verifies and holds its key's bytes.
  EngineOptions o = Options(dir.path());
  o.temp_max_age_s = 0;
  auto e = test::OpenWithJobs(o);
  ASSERT_TRUE(e.ok());
  auto ns = Namespace::OpenExisting(dir.path(), NsPath(o).substr(dir.path().size() + 1));
  ASSERT_TRUE(ns.ok());
  std::vector<ChunkKey> keys;
  size_t temps = 0, foreign = 0;
  ASSERT_TRUE(ScanEntries(ns.value(), [&](const EntryInfo& en) {
                if (en.is_temporary)
                  ++temps;
                else if (en.is_foreign)
                  ++foreign;
                else
                  keys.push_back(en.key);
              }).ok());
  EXPECT_EQ(temps, 0u) << "the restart left temporaries";
  EXPECT_EQ(foreign, 0u);
  size_t verified = 0;
  for (const ChunkKey& k : keys) {
    uint64_t i = 0;
    std::memcpy(&i, k.data() + 8, 8);
    ASSERT_EQ(k, Key(i));
    std::vector<uint8_t> got;
    Status s = LoadOne(e.value(), k, &got);
    ASSERT_TRUE(s.ok()) << "published entry " << i << " fails verification: " << s.ToString();
    ASSERT_EQ(got, ContentFor(i)) << "entry " << i << " holds other bytes";
    ++verified;
  }
  EXPECT_EQ(e.value()->Stats().corrupt_entries, 0u);
  char writers[320];
  std::snprintf(writers, sizeof(writers),
                "writers: %llu engines opened (slowest %.0f ms, %llu failed to open; slowest first store job done "
                "%.0f ms after the open began), %llu store jobs finished, %llu chunks stored, %llu chunk stores failed",
                (unsigned long long)progress->opened.load(), progress->open_us_max.load() / 1000.0,
                (unsigned long long)progress->open_failed.load(), progress->first_us_max.load() / 1000.0,
                (unsigned long long)progress->jobs_done.load(), (unsigned long long)progress->chunks_stored.load(),
                (unsigned long long)progress->chunks_failed.load());
  EXPECT_GT(progress->chunks_stored.load(), 0u) << writers;
  EXPECT_GT(verified, 0u) << writers;
  std::printf(
      "crash suite: %d rounds, %d processes killed with SIGKILL (%d writers finished first), %zu entries "
      "verified byte for byte, %zu temporaries left after restart, corrupt: %llu, served wrong: 0\n%s\n",
      rounds, kills, exited, verified, temps, (unsigned long long)e.value()->Stats().corrupt_entries, writers);
}

}  // namespace
}  // namespace kvtier::rel
