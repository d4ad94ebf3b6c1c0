// Real writer processes killed with SIGKILL at random points, and real processes racing to publish the same keys.
// After every crash, each published entry must verify and hold exactly the bytes written for its key; the
// temporaries the dead writers left are swept.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "kvtier/engine.h"
#include "layout/chunk_format.h"
#include "layout/namespace.h"
#include "layout/scan.h"
#include "support/engine_options.h"
#include "support/job_engine.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 64 * 1024;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 31, 0xc7); }

// The bytes every writer stores for key i: any published entry must hold exactly these.
std::vector<uint8_t> ContentFor(uint64_t i) {
  std::vector<uint8_t> v(kBlocks * kBlockBytes);
  std::mt19937_64 rng(i * 7919 + 1);
  for (size_t k = 0; k < v.size(); k += 8) {
    uint64_t x = rng();
    std::memcpy(&v[k], &x, 8);
  }
  return v;
}

EngineOptions Options(const std::string& root) {
  EngineOptions o = test::BaseOptions(root, "crash", 64, kBlocks, kBlockBytes);
  o.pool_bytes = 16 * (4096 + kBlocks * kBlockBytes);
  o.io_depth = 4;
  return o;
}

std::vector<CopySegment> Segments(std::vector<uint8_t>& bytes, uint64_t stride) {
  std::vector<CopySegment> s;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    s.push_back({b * stride, reinterpret_cast<uint64_t>(bytes.data() + b * kBlockBytes), kBlockBytes});
  }
  return s;
}

// Child body: store keys [first, first + n) in small jobs until done or killed. Never returns.
[[noreturn]] void WriterProcess(const std::string& root, uint64_t first, uint64_t n, bool budget,
                                bool named_temporaries = false) {
  EngineOptions o = Options(root);
  o.anonymous_temporaries = !named_temporaries;
  if (budget) o.disk_budget_bytes = 24 * (4096 + kBlocks * kBlockBytes);  // eviction runs during the stores
  auto e = test::OpenWithJobs(o);  // the slot path (docs/architecture.md, "One data path")
  if (!e.ok()) _exit(3);
  std::vector<std::vector<uint8_t>> data;
  for (uint64_t i = 0; i < n; ++i) data.push_back(ContentFor(first + i));
  for (uint64_t i = 0; i < n; i += 2) {
    std::vector<ChunkTransfer> t;
    for (uint64_t k = i; k < std::min(n, i + 2); ++k) {
      t.push_back({Key(first + k), 0, 0, Segments(data[k], e.value()->block_stride())});
    }
    if (!e.value().Run(e.value().jobs->SubmitStore(std::move(t))).ok()) _exit(4);
  }
  _exit(0);
}

// Loads every published entry through a fresh engine and compares it with ContentFor(key).
void VerifyEveryEntry(const std::string& root, uint64_t max_key, size_t* entries_out) {
  auto e = test::OpenWithJobs(Options(root));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  size_t entries = 0;
  for (uint64_t i = 0; i < max_key; ++i) {
    if (e.value()->Lookup(Key(i)) != ChunkLocation::kDisk) continue;
    std::vector<uint8_t> got(kBlocks * kBlockBytes, 0);
    auto r = e.value().Run(e.value().jobs->SubmitLoad({{Key(i), 0, 0, Segments(got, e.value()->block_stride())}}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // A miss: evicted meanwhile (a corrupt entry is a miss too, which corrupt_entries below counts).
    if (r->chunks[0].status.code() == StatusCode::kNotFound) continue;
    ASSERT_TRUE(r->all_ok()) << "published entry " << i << " fails verification: " << r->chunks[0].status.ToString();
    ASSERT_EQ(got, ContentFor(i)) << "entry " << i << " holds other bytes";
    ++entries;
  }
  EXPECT_EQ(e.value()->Stats().corrupt_entries, 0u);
  *entries_out = entries;
}

TEST(CrashConsistency, WritersKilledAtRandomPointsNeverLeaveABadEntry) {
  test::TempDir dir;
  const int rounds = getenv("KVTIER_CRASH_ROUNDS") ? atoi(getenv("KVTIER_CRASH_ROUNDS")) : 120;
  std::mt19937 rng(12345);
  // Time one writer left to finish, so kill points spread over a whole run on this machine and build (sanitizers
  // and a loaded machine make a run several times slower).
  const auto t0 = std::chrono::steady_clock::now();
  pid_t first_pid = fork();
  ASSERT_GE(first_pid, 0);
  if (first_pid == 0) WriterProcess(dir.path(), 1000, 12, false);
  int first_status = 0;
  ASSERT_EQ(waitpid(first_pid, &first_status, 0), first_pid);
  ASSERT_TRUE(WIFEXITED(first_status) && WEXITSTATUS(first_status) == 0);
  const int full_run_us = static_cast<int>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  int killed = 0;
  std::set<pid_t> writers;  // only their pools are checked below (other tests may run beside this one)
  for (int round = 0; round < rounds; ++round) {
    const uint64_t first = (round % 10) * 4;  // overlapping key ranges across rounds: re-stores and dedup
    const bool budget = round % 3 == 0;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) WriterProcess(dir.path(), first, 12, budget, /*named_temporaries=*/round % 2 == 1);
    usleep(std::uniform_int_distribution<int>(0, full_run_us)(rng));
    if (kill(pid, SIGKILL) == 0) ++killed;
    writers.insert(pid);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    // Killed by our SIGKILL or done: any other end (an exit code, SIGSEGV, SIGABRT from a check) is a failure.
    ASSERT_TRUE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
        << "writer failed: " << (WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit code") << " (status "
        << status << ")";
  }
  size_t entries = 0;
  VerifyEveryEntry(dir.path(), 1100, &entries);  // its engine also reclaims the pools the killed writers left
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = f.path().filename();
    if (name.rfind("kvtier-", 0) != 0) continue;
    const pid_t owner = static_cast<pid_t>(atoi(name.c_str() + 7));
    EXPECT_EQ(writers.count(owner), 0u) << "orphaned pool left in /dev/shm: " << name;
  }
  EXPECT_GT(entries, 0u) << "no writer published anything: the kill points were all too early";

  // The temporaries of killed writers are swept (age 0: all of them, as fsck --repair does).
  auto names = ListNamespaces(dir.path());
  ASSERT_TRUE(names.ok());
  ASSERT_EQ(names->size(), 1u);
  auto ns = Namespace::OpenExisting(dir.path(), names->front());
  ASSERT_TRUE(ns.ok());
  auto swept = SweepTemporaries(ns.value(), std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok());
  size_t temps = 0;
  ASSERT_TRUE(ScanEntries(ns.value(), [&](const EntryInfo& e) { temps += e.is_temporary; }).ok());
  EXPECT_EQ(temps, 0u);
  RecordProperty("kills", killed);
  RecordProperty("entries", static_cast<int>(entries));
  std::printf(
      "crash test: a full writer run takes %d us; %d rounds, %d killed mid-run, %zu entries verified, %llu temporaries "
      "swept\n",
      full_run_us, rounds, killed, entries, static_cast<unsigned long long>(swept->removed));
}

TEST(PublicationRace, TwoProcessesPublishingTheSameKeysBothSucceedWithOneValidEntryEach) {
  test::TempDir dir;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const uint64_t first = attempt * 100;
    pid_t a = fork();
    if (a == 0) WriterProcess(dir.path(), first, 16, false);
    pid_t b = fork();
    if (b == 0) WriterProcess(dir.path(), first, 16, false, /*named_temporaries=*/true);
    int sa = 0, sb = 0;
    ASSERT_EQ(waitpid(a, &sa, 0), a);
    ASSERT_EQ(waitpid(b, &sb, 0), b);
    ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << sa;
    ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << sb;
  }
  size_t entries = 0;
  VerifyEveryEntry(dir.path(), 500, &entries);
  EXPECT_EQ(entries, 5u * 16u);
}

}  // namespace
}  // namespace kvtier
