// Fault injection through every engine path that goes through the I/O engine (open, statx, read, write, fsync, link,
// unlink, close, mkdir, fchmod, utimensat) with EIO, ENOSPC, EACCES, EROFS and EINTR, short transfers and operations
// slower than their deadline. The engine keeps serving: every job finishes (bounded), a load either returns the stored
// bytes or is a miss that left the destination untouched, a store either publishes a verifying entry or is dropped and
// counted, and once the faults stop (FailNth rules) stores and loads succeed again. Leaks and races are the
// sanitizer builds' part (asan, tsan presets run this suite).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "layout/scan.h"
#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

// Counts, per op code, the completions that carried an error: the faults the engine actually saw. Atomics: the test
// thread reads them while the reactor runs.
struct FaultTally {
  std::atomic<uint64_t> errors[kNumOpCodes] = {};
  std::atomic<uint64_t> ops[kNumOpCodes] = {};
};

class CountingEngine final : public IoEngine {
 public:
  CountingEngine(std::unique_ptr<IoEngine> inner, FaultTally* tally) : inner_(std::move(inner)), tally_(tally) {}
  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight(); }
  int Submit(const IoOp& op) override {
    const int rc = inner_->Submit(op);
    if (rc == 0) {
      code_[op.user_data] = op.code;
      tally_->ops[static_cast<int>(op.code)]++;
    }
    return rc;
  }
  int Flush() override { return inner_->Flush(); }
  int Reap(std::vector<IoCompletion>* out, int64_t timeout_ns) override {
    const size_t before = out->size();
    const int n = inner_->Reap(out, timeout_ns);
    for (size_t k = before; k < out->size(); ++k) {
      auto it = code_.find((*out)[k].user_data);
      if (it == code_.end()) continue;
      if ((*out)[k].result < 0 && (*out)[k].result != -EEXIST && (*out)[k].result != -ENOENT) {
        tally_->errors[static_cast<int>(it->second)]++;
      }
      code_.erase(it);
    }
    return n;
  }
  void Wake() override { inner_->Wake(); }

 private:
  std::unique_ptr<IoEngine> inner_;
  FaultTally* tally_;
  std::map<uint64_t, OpCode> code_;  // reactor thread only
};

struct Case {
  std::string name;
  std::vector<FaultRule> rules;
  bool fsync = false;
  bool named_temporaries = false;
  bool budget = false;        // eviction unlinks run during the stores
  bool recovers = false;      // the rules stop matching: a final round trip must succeed
  bool group_shared = false;  // dir_mode 0770: new fan-out directories and temporaries are chmod'ed (K2)
  uint32_t timeout_ms = 3000;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const std::pair<OpCode, const char*> codes[] = {
      {OpCode::kOpenAt, "open"},   {OpCode::kRead, "read"},          {OpCode::kWrite, "write"},
      {OpCode::kFsync, "fsync"},   {OpCode::kLinkAt, "link"},        {OpCode::kUnlinkAt, "unlink"},
      {OpCode::kClose, "close"},   {OpCode::kMkdirAt, "mkdir"},      {OpCode::kStatx, "statx"},
      {OpCode::kFchmod, "fchmod"}, {OpCode::kUtimensAt, "utimensat"}};
  const std::pair<int, const char*> errors[] = {
      {EIO, "EIO"}, {ENOSPC, "ENOSPC"}, {EACCES, "EACCES"}, {EROFS, "EROFS"}, {EINTR, "EINTR"}};
  for (auto [code, cname] : codes) {
    for (auto [err, ename] : errors) {
      Case every{std::string(cname) + " always " + ename, {FaultRule::FailEvery(code, err)}};
      every.fsync = code == OpCode::kFsync;
      every.named_temporaries = code == OpCode::kUnlinkAt;
      every.budget = code == OpCode::kUnlinkAt;
      every.group_shared = code == OpCode::kFchmod;
      cases.push_back(every);
      // Intermittent: every other op of the first 40 fails, then the disk is healthy again.
      Case some{std::string(cname) + " intermittent " + ename, {}};
      for (uint64_t n = 1; n <= 40; n += 2) some.rules.push_back(FaultRule::FailNth(n, err, code));
      some.fsync = every.fsync;
      some.named_temporaries = every.named_temporaries;
      some.budget = every.budget;
      some.group_shared = every.group_shared;
      some.recovers = true;
      cases.push_back(some);
    }
  }
  for (uint32_t k : {1u, 512u, 4096u, 5000u}) {
    cases.push_back({"short reads of " + std::to_string(k) + " B", {FaultRule::ShortTransfer(OpCode::kRead, k)}});
    cases.push_back({"short writes of " + std::to_string(k) + " B", {FaultRule::ShortTransfer(OpCode::kWrite, k)}});
  }
  for (auto [code, cname] : codes) {
    // The engine gives them no deadline.
    if (code == OpCode::kClose || code == OpCode::kUnlinkAt || code == OpCode::kUtimensAt) continue;
    Case slow{std::string(cname) + " slower than its deadline", {FaultRule::DelayPastDeadline(code)}};
    slow.fsync = code == OpCode::kFsync;
    slow.timeout_ms = 150;
    cases.push_back(slow);
  }
  return cases;
}

class FaultSuite : public ::testing::TestWithParam<IoBackend> {};

TEST_P(FaultSuite, EveryPathEveryErrorKeepsTheEngineServingWithNoWrongBytes) {
  std::string why;
  if (GetParam() == IoBackend::kUring && !UringAvailable(&why)) GTEST_SKIP() << why;
  const std::vector<Case> cases = Cases();
  std::map<std::string, uint64_t> faults_by_path;
  uint64_t jobs = 0, load_misses = 0, loads_ok = 0, stores_dropped = 0, stores_ok = 0, served_wrong = 0;
  uint32_t reactors_seen = 0;
  const int rounds = Soak();
  for (int round = 0; round < rounds; ++round) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const auto case_start = std::chrono::steady_clock::now();
      test::TempDir dir;
      EngineOptions o = Options(dir.path());
      o.backend = GetParam();
      o.fsync_on_publish = c.fsync;
      o.anonymous_temporaries = !c.named_temporaries;
      o.op_timeout_ms = c.timeout_ms;
      o.temp_max_age_s = 0;
      if (c.budget) o.disk_budget_bytes = 6 * kChunkFileBytes;
      if (c.group_shared) o.dir_mode = 0770;
      constexpr uint64_t kPreset = 5, kNew = 5;
      {
        // Entries for the loads, written without faults. Not under the case's deadline: a "slower than its
        // deadline" case sets 150 ms, which a clean store under TSan on two busy cores can take (a CI failure).
        EngineOptions clean_o = o;
        clean_o.op_timeout_ms = 60000;
        auto clean = test::OpenWithJobs(clean_o);
        ASSERT_TRUE(clean.ok()) << clean.status().ToString();
        for (uint64_t i = 0; i < kPreset; ++i) {
          Status st = StoreOne(clean.value(), i);
          ASSERT_TRUE(st.ok()) << "clean store " << i << ": " << st.ToString();
          // M3: older than touch_interval_s, so that each load touches it (utimensat).
          const struct timespec hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
          ASSERT_EQ(utimensat(AT_FDCWD, ChunkFile(o, Key(i)).c_str(), hour_ago, AT_SYMLINK_NOFOLLOW), 0);
        }
      }
      o.disk_budget_bytes = c.budget ? 6 * kChunkFileBytes : 0;
      FaultTally tally;
      // Several reactors (auto: at least 2; KVTIER_TEST_REACTORS=1 runs the suite with one), each with its own
      // fault-injecting engine under the same rules (I1: the faults hit chunks on every reactor).
      auto opened = OpenWithWrappedIo(o, GetParam(), [&](std::unique_ptr<IoEngine> inner) {
        auto fault = std::make_unique<FaultInjectingEngine>(std::move(inner));
        for (const FaultRule& r : c.rules) fault->AddRule(r);
        return std::make_unique<CountingEngine>(std::move(fault), &tally);
      });
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      reactors_seen = std::max(reactors_seen, static_cast<EngineImpl&>(*opened.value()).reactors());
      auto with_jobs = test::WithJobs(std::move(opened).value());
      ASSERT_TRUE(with_jobs.ok()) << with_jobs.status().ToString();
      test::JobEngine& e = *with_jobs;
      // Loads of present entries and stores of new ones, interleaved, twice.
      uint64_t case_dropped = 0;
      for (int pass = 0; pass < 2; ++pass) {
        for (uint64_t i = 0; i < kPreset; ++i) {
          std::vector<uint8_t> got;
          Status s = LoadOne(e, Key(i), &got);
          ++jobs;
          ASSERT_NE(s.code(), StatusCode::kInternal) << s.ToString();
          if (s.ok()) {
            ++loads_ok;
            if (got != ContentFor(i)) ++served_wrong;
            EXPECT_EQ(got, ContentFor(i));
          } else {
            ++load_misses;
            if (!AllSentinel(got)) ++served_wrong;
            EXPECT_TRUE(AllSentinel(got)) << s.ToString();
          }
          Status w = StoreOne(e, 100 + pass * kNew + i);
          ++jobs;
          ASSERT_NE(w.code(), StatusCode::kInternal) << w.ToString();
          (w.ok() ? stores_ok : stores_dropped)++;
          case_dropped += !w.ok();
        }
      }
      EXPECT_GE(e->Stats().stores_dropped, case_dropped) << "a dropped store was not counted";
      if (c.recovers) {
        // Past the faulty ops (the rules cover the first 40 of their code): the engine serves normally again.
        uint64_t k = 900;
        while (k < 960 && !StoreOne(e, k).ok()) ++k;
        ASSERT_LT(k, 960u) << "stores never recovered";
        std::vector<uint8_t> got;
        Status s;
        for (int attempt = 0; attempt < 60; ++attempt) {
          s = LoadOne(e, Key(k), &got);
          if (s.ok() || s.code() == StatusCode::kCorrupt || s.code() == StatusCode::kNotFound) break;
        }
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(got, ContentFor(k));
      }
      EXPECT_NE(e->Describe(), "");
      uint64_t injected = 0;
      for (size_t k = 0; k < kNumOpCodes; ++k) injected += tally.errors[k].load();
      faults_by_path[c.name.substr(0, c.name.find(' '))] += injected;
      e.reset();
      // Whatever was published under faults verifies and holds the bytes written for its key.
      o.temp_max_age_s = 0;
      o.disk_budget_bytes = 0;
      o.op_timeout_ms = 60000;  // no faults now: a late load here would read as an entry that fails verification
      auto check = test::OpenWithJobs(o);
      ASSERT_TRUE(check.ok());
      for (uint64_t i = 100; i < 100 + 2 * kNew; ++i) {
        if (check.value()->Lookup(Key(i)) != ChunkLocation::kDisk) continue;
        std::vector<uint8_t> got;
        Status s = LoadOne(check.value(), Key(i), &got);
        if (s.code() == StatusCode::kNotFound) continue;
        ASSERT_TRUE(s.ok()) << "an entry published under faults fails verification: " << s.ToString();
        EXPECT_EQ(got, ContentFor(i));
      }
      EXPECT_EQ(check.value()->Stats().corrupt_entries, 0u);
      // The restart swept every temporary the faults left behind.
      auto ns = Namespace::OpenExisting(o.root, NsPath(o).substr(o.root.size() + 1));
      ASSERT_TRUE(ns.ok());
      size_t temps = 0;
      ASSERT_TRUE(ScanEntries(ns.value(), [&](const EntryInfo& en) { temps += en.is_temporary; }).ok());
      EXPECT_EQ(temps, 0u);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - case_start).count();
      if (getenv("KVTIER_FAULT_TIMES")) std::printf("  %-32s %.2f s\n", c.name.c_str(), secs);
    }
  }
  EXPECT_EQ(served_wrong, 0u);
  for (const char* path : {"open", "statx", "read", "write", "mkdir", "fchmod", "utimensat"}) {
    EXPECT_GT(faults_by_path[path], 0u) << "no fault reached the engine's " << path << " path";
  }
  std::string per_path;
  for (auto& [path, n] : faults_by_path) per_path += " " + path + "=" + std::to_string(n);
  std::printf(
      "fault suite (%s, %u reactors): %zu cases x %d rounds, %llu jobs, faults seen per path:%s; loads ok "
      "%llu, load "
      "misses %llu, stores ok %llu, stores dropped %llu, served wrong: %llu\n",
      GetParam() == IoBackend::kUring ? "io_uring" : "posix", reactors_seen, cases.size(), rounds,
      (unsigned long long)jobs, per_path.c_str(), (unsigned long long)loads_ok, (unsigned long long)load_misses,
      (unsigned long long)stores_ok, (unsigned long long)stores_dropped, (unsigned long long)served_wrong);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultSuite, ::testing::Values(IoBackend::kUring, IoBackend::kPosix),
                         [](const auto& info) { return info.param == IoBackend::kUring ? "Uring" : "Posix"; });

}  // namespace
}  // namespace kvtier::rel
