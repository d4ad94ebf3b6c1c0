// Crash suite (SPEC L4, L5, K1, C1): writer processes storing (and evicting under a small budget) while fsck
// --repair and gc run at the same time, all killed with SIGKILL at random points, round after round. Afterwards
// every published entry verifies and holds exactly the bytes written for its key, fsck finds nothing corrupt, and
// a restart sweeps the temporaries. Extends tests/engine/crash_test.cc (one writer at a time, no maintenance).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "layout/scan.h"
#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

constexpr uint64_t kKeySpace = 64;

[[noreturn]] void Writer(const std::string& root, int who, uint32_t seed) {
  EngineOptions o = Options(root);
  o.disk_budget_bytes = 24 * kChunkFileBytes;  // eviction runs during the stores
  o.anonymous_temporaries = who % 2 == 0;      // both publication forms
  o.temp_max_age_s = 3600;
  auto e = Engine::Open(o);
  if (!e.ok()) _exit(3);
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
    auto id = e.value()->SubmitStore(std::move(t));
    if (!id.ok() || !e.value()->Wait(id.value(), 30000).ok()) _exit(4);
    if (n % 7 == 0) {
      std::vector<uint8_t> got;
      const uint64_t i = rng() % kKeySpace;
      if (LoadOne(*e.value(), Key(i), &got).ok() && got != ContentFor(i)) _exit(5);  // wrong bytes served
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
    auto e = Engine::Open(Options(dir.path()));
    ASSERT_TRUE(e.ok());
  }
  const int rounds = 60 * Soak();
  std::mt19937 rng(4242);
  int kills = 0, exited = 0;
  for (int round = 0; round < rounds; ++round) {
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
    usleep(std::uniform_int_distribution<int>(5'000, 400'000)(rng));
    for (pid_t pid : pids) kills += kill(pid, SIGKILL) == 0;
    kills += kill(-maint, SIGKILL) == 0 || kill(maint, SIGKILL) == 0;
    for (pid_t pid : pids) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
          << "writer failed (5: served wrong bytes): " << status;
      exited += WIFEXITED(status);
    }
    int status = 0;
    ASSERT_EQ(waitpid(maint, &status, 0), maint);
  }
  // Restart: temporaries of every age are swept, every entry verifies and holds its key's bytes.
  EngineOptions o = Options(dir.path());
  o.temp_max_age_s = 0;
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok());
  auto ns = Namespace::OpenExisting(dir.path(), NsPath(o).substr(dir.path().size() + 1));
  ASSERT_TRUE(ns.ok());
  std::vector<ChunkKey> keys;
  size_t temps = 0, foreign = 0;
  ASSERT_TRUE(ScanEntries(ns.value(), [&](const EntryInfo& en) {
                if (en.is_temporary) ++temps;
                else if (en.is_foreign) ++foreign;
                else keys.push_back(en.key);
              }).ok());
  EXPECT_EQ(temps, 0u) << "the restart left temporaries";
  EXPECT_EQ(foreign, 0u);
  size_t verified = 0;
  for (const ChunkKey& k : keys) {
    uint64_t i = 0;
    std::memcpy(&i, k.data() + 8, 8);
    ASSERT_EQ(k, Key(i));
    std::vector<uint8_t> got;
    Status s = LoadOne(*e.value(), k, &got);
    ASSERT_TRUE(s.ok()) << "published entry " << i << " fails verification: " << s.ToString();
    ASSERT_EQ(got, ContentFor(i)) << "entry " << i << " holds other bytes";
    ++verified;
  }
  EXPECT_EQ(e.value()->Stats().corrupt_entries, 0u);
  EXPECT_GT(verified, 0u);
  std::printf("crash suite: %d rounds, %d processes killed with SIGKILL (%d writers finished first), %zu entries "
              "verified byte for byte, %zu temporaries left after restart, corrupt: %llu, served wrong: 0\n",
              rounds, kills, exited, verified, temps, (unsigned long long)e.value()->Stats().corrupt_entries);
}

}  // namespace
}  // namespace kvtier::rel
