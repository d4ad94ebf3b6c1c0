#include "staging/staging_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

StagingPoolOptions SmallOptions(uint32_t slots = 4, uint64_t bytes = 10000) {
  StagingPoolOptions o;
  o.num_slots = slots;
  o.slot_bytes = bytes;
  return o;
}

std::unique_ptr<StagingPool> MustCreate(const StagingPoolOptions& o) {
  auto pool = StagingPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

// Runs `body` in a forked child and returns its exit code (the body's return value), or -1 if it died.
// The child leaves with _exit, so it runs no destructors of the parent's objects (and never unlinks the pool).
int RunInChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int code = body();
    _exit(code);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

uint8_t PatternByte(uint32_t slot, uint32_t generation, uint64_t i) {
  return static_cast<uint8_t>((slot * 131 + generation * 31 + i * 7) ^ (i >> 8));
}

TEST(StagingPool, CreateComputesAlignedGeometry) {
  auto pool = MustCreate(SmallOptions(3, 10000));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_slots(), 3u);
  EXPECT_EQ(pool->slot_bytes(), 10000u);
  EXPECT_EQ(pool->slot_stride(), 12288u);
  EXPECT_EQ(pool->total_bytes(), 3u * 12288u);
  EXPECT_EQ(pool->free_slots(), 3u);
  EXPECT_EQ(pool->in_use(), 0u);
  EXPECT_TRUE(pool->is_owner());
  EXPECT_EQ(pool->name().rfind("/kvtier-", 0), 0u) << pool->name();
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->SlotData(s)) % 4096, 0u);
    EXPECT_EQ(pool->Observe(s).state, SlotState::kFree);
    EXPECT_EQ(pool->Observe(s).generation, 0u);
  }
  auto* base = static_cast<uint8_t*>(pool->base());
  EXPECT_GE(pool->SlotData(0), base);
  EXPECT_EQ(pool->SlotData(2) + pool->slot_stride(), base + pool->mapped_bytes());
}

TEST(StagingPool, APopulatedPoolInHugeFoliosHoldsZerosAndIsSharedWithAnAttacher) {
  // Best effort: where the kernel refuses MADV_COLLAPSE the pool keeps 4 KiB pages; either way it must behave.
  StagingPoolOptions o = SmallOptions(5, (2ull << 20) + 4096);
  o.populate = true;
  auto pool = MustCreate(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->huge_bytes() % (2ull << 20), 0u);
  EXPECT_LE(pool->huge_bytes(), pool->mapped_bytes());
  for (uint32_t s = 0; s < pool->num_slots(); ++s) {
    const uint8_t* d = pool->SlotData(s);
    for (uint64_t i = 0; i < o.slot_bytes; i += 4096) ASSERT_EQ(d[i], 0) << "slot " << s << " byte " << i;
    std::memset(pool->SlotData(s), static_cast<int>(s + 1), o.slot_bytes);
  }
  auto attached = StagingPool::Attach(pool->name());
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  for (uint32_t s = 0; s < pool->num_slots(); ++s) {
    EXPECT_EQ((*attached)->SlotData(s)[0], s + 1);
    EXPECT_EQ((*attached)->SlotData(s)[o.slot_bytes - 1], s + 1);
  }
}

TEST(StagingPool, LargerAlignmentIsHonoured) {
  StagingPoolOptions o = SmallOptions(2, 5000);
  o.alignment = 1 << 16;
  auto pool = MustCreate(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->slot_stride(), 65536u);
  EXPECT_EQ((pool->SlotData(0) - static_cast<uint8_t*>(pool->base())) % 65536, 0);
}

TEST(StagingPool, SmallAlignmentIsRaisedToThePage) {
  StagingPoolOptions o = SmallOptions(2, 100);
  o.alignment = 512;
  auto pool = MustCreate(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->slot_stride() % 4096, 0u);
}

TEST(StagingPool, BadOptionsGiveClearErrors) {
  struct Case {
    StagingPoolOptions options;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({SmallOptions(0, 100), "num_slots must be > 0"});
  cases.push_back({SmallOptions(4, 0), "slot_bytes must be > 0"});
  cases.push_back({SmallOptions(1u << 20, 2u << 20), "exceeds the 1 TiB limit"});
  cases.push_back({SmallOptions(1, (uint64_t{1} << 40) + 1), "exceeds the 1 TiB limit"});
  StagingPoolOptions bad_align = SmallOptions();
  bad_align.alignment = 3000;
  cases.push_back({bad_align, "alignment 3000 is not a power of two"});
  StagingPoolOptions zero_align = SmallOptions();
  zero_align.alignment = 0;
  cases.push_back({zero_align, "not a power of two"});
  StagingPoolOptions big_reserve = SmallOptions(4);
  big_reserve.demand_reserve = 5;
  cases.push_back({big_reserve, "demand_reserve 5 exceeds num_slots 4"});
  for (const Case& c : cases) {
    auto pool = StagingPool::Create(c.options);
    ASSERT_FALSE(pool.ok()) << c.expected;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument) << pool.status().ToString();
    EXPECT_NE(pool.status().message().find(c.expected), std::string::npos) << pool.status().ToString();
  }
}

TEST(StagingPool, BadNamesGiveClearErrors) {
  for (const std::string& name : std::vector<std::string>{"no-slash", "/a/b", "/", "/" + std::string(300, 'x')}) {
    StagingPoolOptions o = SmallOptions();
    o.name = name;
    auto created = StagingPool::Create(o);
    ASSERT_FALSE(created.ok()) << name;
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << created.status().ToString();
    auto attached = StagingPool::Attach(name);
    ASSERT_FALSE(attached.ok()) << name;
    EXPECT_EQ(attached.status().code(), StatusCode::kInvalidArgument) << attached.status().ToString();
  }
}

TEST(StagingPool, ExplicitNameIsUsedAndCannotBeTakenTwice) {
  StagingPoolOptions o = SmallOptions();
  o.name = "/kvtier-test-" + std::to_string(getpid()) + "-explicit";
  auto first = MustCreate(o);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->name(), o.name);
  auto second = StagingPool::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  // The failed Create must not have unlinked the first pool's name.
  auto attached = StagingPool::Attach(o.name);
  EXPECT_TRUE(attached.ok()) << attached.status().ToString();
}

TEST(StagingPool, AttachSeesTheSameGeometryAndBytes) {
  StagingPoolOptions o = SmallOptions(5, 7000);
  o.demand_reserve = 2;
  auto owner = MustCreate(o);
  ASSERT_NE(owner, nullptr);
  auto attached = StagingPool::Attach(owner->name());
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  StagingPool& worker = **attached;
  EXPECT_FALSE(worker.is_owner());
  EXPECT_EQ(worker.num_slots(), 5u);
  EXPECT_EQ(worker.slot_bytes(), 7000u);
  EXPECT_EQ(worker.slot_stride(), owner->slot_stride());
  EXPECT_EQ(worker.mapped_bytes(), owner->mapped_bytes());
  EXPECT_EQ(worker.demand_reserve(), 2u);
  EXPECT_FALSE(worker.Acquire(SlotPriority::kDemand).has_value());  // workers never allocate
  std::memset(owner->SlotData(3), 0xab, 7000);
  EXPECT_EQ(worker.SlotData(3)[0], 0xab);
  EXPECT_EQ(worker.SlotData(3)[6999], 0xab);
  worker.SlotData(1)[17] = 0x5a;
  EXPECT_EQ(owner->SlotData(1)[17], 0x5a);
}

TEST(StagingPool, AttachToMissingPoolIsNotFound) {
  auto attached = StagingPool::Attach("/kvtier-test-no-such-pool-" + std::to_string(getpid()));
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), StatusCode::kNotFound) << attached.status().ToString();
  EXPECT_NE(attached.status().message().find("no shared memory named"), std::string::npos);
}

TEST(StagingPool, OwnerUnlinksOnDestruction) {
  std::string name;
  {
    auto owner = MustCreate(SmallOptions());
    ASSERT_NE(owner, nullptr);
    name = owner->name();
    auto attached = StagingPool::Attach(name);
    ASSERT_TRUE(attached.ok());
    attached->reset();  // an attached pool going away does not unlink
    EXPECT_TRUE(StagingPool::Attach(name).ok());
  }
  auto after = StagingPool::Attach(name);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kNotFound) << after.status().ToString();
}

TEST(StagingPool, RemoveOrphansUnlinksPoolsOfDeadOwnersOnly) {
  // A child creates a pool and dies without running its destructor: its name is left behind.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto orphan = StagingPool::Create(SmallOptions(1, 4096));
    if (!orphan.ok()) _exit(1);
    std::string name = (*orphan)->name();
    if (write(fds[1], name.data(), name.size()) != static_cast<ssize_t>(name.size())) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  char buf[256] = {};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_GT(n, 0);
  const std::string orphan_name(buf, static_cast<size_t>(n));
  ASSERT_TRUE(StagingPool::Attach(orphan_name).ok());

  auto live = MustCreate(SmallOptions(1, 4096));  // ours, alive
  ASSERT_NE(live, nullptr);
  StagingPoolOptions named = SmallOptions(1, 4096);
  named.name = "/kvtier-test-" + std::to_string(getpid()) + "-named";
  auto explicit_name = MustCreate(named);
  ASSERT_NE(explicit_name, nullptr);

  auto removed = StagingPool::RemoveOrphans();
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  // Not EXPECT_GE(*removed, 1): under ctest -j another test's engine may open (and sweep orphans) first. What
  // matters is below: the orphan is gone, the live pools are not.
  auto gone = StagingPool::Attach(orphan_name);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
  EXPECT_TRUE(StagingPool::Attach(live->name()).ok());
  EXPECT_TRUE(StagingPool::Attach(named.name).ok());
}

// Writes raw bytes into a fresh shm object and returns its name; the caller unlinks it.
std::string MakeForeignShm(const std::vector<uint8_t>& bytes, size_t size) {
  std::string name = "/kvtier-test-foreign-" + std::to_string(getpid());
  shm_unlink(name.c_str());
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  if (!bytes.empty()) {
    EXPECT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  close(fd);
  return name;
}

TEST(StagingPool, AttachRejectsForeignOrDamagedObjects) {
  {  // Too small to hold a header.
    std::string name = MakeForeignShm({}, 16);
    auto attached = StagingPool::Attach(name);
    ASSERT_FALSE(attached.ok());
    EXPECT_EQ(attached.status().code(), StatusCode::kFailedPrecondition) << attached.status().ToString();
    shm_unlink(name.c_str());
  }
  {  // Not our magic.
    std::string name = MakeForeignShm(std::vector<uint8_t>(4096, 0x11), 8192);
    auto attached = StagingPool::Attach(name);
    ASSERT_FALSE(attached.ok());
    EXPECT_EQ(attached.status().code(), StatusCode::kCorrupt) << attached.status().ToString();
    EXPECT_NE(attached.status().message().find("not a kvtier staging pool"), std::string::npos);
    shm_unlink(name.c_str());
  }
  // A real pool whose header is then damaged in place.
  auto owner = MustCreate(SmallOptions(2, 4096));
  ASSERT_NE(owner, nullptr);
  auto* words = static_cast<uint32_t*>(owner->base());
  const uint32_t saved_version = words[2];  // after the 8-byte magic
  words[2] = 99;
  auto wrong_version = StagingPool::Attach(owner->name());
  ASSERT_FALSE(wrong_version.ok());
  EXPECT_EQ(wrong_version.status().code(), StatusCode::kFailedPrecondition) << wrong_version.status().ToString();
  EXPECT_NE(wrong_version.status().message().find("version 99"), std::string::npos);
  words[2] = saved_version;
  const uint32_t saved_slots = words[3];
  words[3] = 1000;
  auto wrong_slots = StagingPool::Attach(owner->name());
  ASSERT_FALSE(wrong_slots.ok());
  EXPECT_EQ(wrong_slots.status().code(), StatusCode::kCorrupt) << wrong_slots.status().ToString();
  words[3] = saved_slots;
  EXPECT_TRUE(StagingPool::Attach(owner->name()).ok());
}

TEST(StagingPool, AcquireReleaseAccountingAndPeak) {
  auto pool = MustCreate(SmallOptions(4));
  ASSERT_NE(pool, nullptr);
  std::set<uint32_t> taken;
  for (int i = 0; i < 4; ++i) {
    auto slot = pool->Acquire(SlotPriority::kDemand);
    ASSERT_TRUE(slot.has_value());
    EXPECT_LT(*slot, 4u);
    EXPECT_TRUE(taken.insert(*slot).second) << "slot handed out twice";
  }
  EXPECT_FALSE(pool->Acquire(SlotPriority::kDemand).has_value());
  EXPECT_EQ(pool->in_use(), 4u);
  EXPECT_EQ(pool->free_slots(), 0u);
  EXPECT_EQ(pool->peak_in_use(), 4u);
  for (uint32_t s : taken) pool->Release(s);
  EXPECT_EQ(pool->in_use(), 0u);
  EXPECT_EQ(pool->free_slots(), 4u);
  EXPECT_EQ(pool->peak_in_use(), 4u);
  auto again = pool->Acquire(SlotPriority::kDemand);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(pool->in_use(), 1u);
  pool->Release(*again);
}

TEST(StagingPool, ReleaseMarksTheSlotFree) {
  auto pool = MustCreate(SmallOptions(1));
  ASSERT_NE(pool, nullptr);
  uint32_t slot = *pool->Acquire(SlotPriority::kDemand);
  uint32_t gen = pool->BeginFill(slot);
  pool->PublishReady(slot, gen);
  pool->Release(slot);
  EXPECT_EQ(pool->Observe(slot).state, SlotState::kFree);
  EXPECT_EQ(pool->Observe(slot).generation, gen);
  EXPECT_EQ(pool->WaitReady(slot, gen, milliseconds(1)), SlotWaitOutcome::kSuperseded);
}

TEST(StagingPoolDeathTest, DoubleReleaseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pool = MustCreate(SmallOptions(2));
  ASSERT_NE(pool, nullptr);
  uint32_t slot = *pool->Acquire(SlotPriority::kDemand);
  pool->Release(slot);
  // The dying child re-runs this test and creates its own pool; it unlinks that pool's name before aborting.
  const std::string name = pool->name();
  EXPECT_DEATH((shm_unlink(name.c_str()), pool->Release(slot)), "not in use");
  EXPECT_DEATH((shm_unlink(name.c_str()), pool->Release(7)), "out of range");
}

TEST(StagingPool, DemandReserveIsNeverTakenByPreload) {
  StagingPoolOptions o = SmallOptions(6);
  o.demand_reserve = 2;
  auto pool = MustCreate(o);
  ASSERT_NE(pool, nullptr);
  std::vector<uint32_t> speculative;
  while (auto slot = pool->Acquire(SlotPriority::kSpeculative)) speculative.push_back(*slot);
  EXPECT_EQ(speculative.size(), 4u);
  EXPECT_EQ(pool->free_slots(), 2u);
  // Demand still gets the reserve, and speculation gets nothing while the pool stays this full.
  auto d1 = pool->Acquire(SlotPriority::kDemand);
  ASSERT_TRUE(d1.has_value());
  EXPECT_FALSE(pool->Acquire(SlotPriority::kSpeculative).has_value());
  auto d2 = pool->Acquire(SlotPriority::kDemand);
  ASSERT_TRUE(d2.has_value());
  EXPECT_FALSE(pool->Acquire(SlotPriority::kDemand).has_value());
  // Freeing a demand slot returns it to the reserve, not to speculation.
  pool->Release(*d1);
  EXPECT_FALSE(pool->Acquire(SlotPriority::kSpeculative).has_value());
  // Freeing speculative slots above the reserve makes speculation possible again, down to the reserve.
  pool->Release(speculative.back());
  speculative.pop_back();
  pool->Release(*d2);
  EXPECT_EQ(pool->free_slots(), 3u);
  auto s = pool->Acquire(SlotPriority::kSpeculative);
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(pool->Acquire(SlotPriority::kSpeculative).has_value());
  EXPECT_EQ(pool->free_slots(), 2u);
}

TEST(StagingPool, FullReserveMeansNoSpeculationAtAll) {
  StagingPoolOptions o = SmallOptions(3);
  o.demand_reserve = 3;
  auto pool = MustCreate(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->Acquire(SlotPriority::kSpeculative).has_value());
  EXPECT_TRUE(pool->Acquire(SlotPriority::kDemand).has_value());
}

TEST(StagingPool, GenerationsAdvanceAndStatesArePublished) {
  auto pool = MustCreate(SmallOptions(2));
  ASSERT_NE(pool, nullptr);
  uint32_t g1 = pool->BeginFill(1);
  EXPECT_EQ(g1, 1u);
  EXPECT_EQ(pool->Observe(1).state, SlotState::kFilling);
  EXPECT_EQ(pool->WaitReady(1, g1, milliseconds(2)), SlotWaitOutcome::kTimedOut);
  pool->PublishReady(1, g1);
  EXPECT_EQ(pool->WaitReady(1, g1, seconds(1)), SlotWaitOutcome::kReady);
  uint32_t g2 = pool->BeginFill(1);
  EXPECT_EQ(g2, 2u);
  EXPECT_EQ(pool->WaitReady(1, g1, seconds(1)), SlotWaitOutcome::kSuperseded);
  pool->PublishFailed(1, g2);
  EXPECT_EQ(pool->WaitReady(1, g2, seconds(1)), SlotWaitOutcome::kFailed);
  EXPECT_EQ(pool->Observe(0).generation, 0u);  // other slots are untouched
}

TEST(StagingPool, SlotBytesWrittenInOneProcessAreSeenInAnother) {
  auto pool = MustCreate(SmallOptions(3, 64 * 1024));
  ASSERT_NE(pool, nullptr);
  for (uint64_t i = 0; i < pool->slot_bytes(); ++i) pool->SlotData(2)[i] = PatternByte(2, 0, i);
  const std::string name = pool->name();
  int code = RunInChild([&name] {
    auto attached = StagingPool::Attach(name);
    if (!attached.ok()) return 10;
    StagingPool& p = **attached;
    for (uint64_t i = 0; i < p.slot_bytes(); ++i) {
      if (p.SlotData(2)[i] != PatternByte(2, 0, i)) return 11;
    }
    for (uint64_t i = 0; i < p.slot_bytes(); ++i) p.SlotData(0)[i] = PatternByte(0, 9, i);
    return 0;
  });
  ASSERT_EQ(code, 0);
  for (uint64_t i = 0; i < pool->slot_bytes(); ++i) ASSERT_EQ(pool->SlotData(0)[i], PatternByte(0, 9, i)) << i;
}

// The engine (parent) fills slots round-robin and publishes each generation; a worker (child) waits for each one,
// checks every byte, and says it is done out of band (a byte on a pipe, as vLLM's complete_load is for the real
// worker); the engine refills a slot only after its consumer is done. Every seventh fill fails instead, and the
// child must see kFailed.
TEST(StagingPool, ConsumerSeesBytesWrittenBeforePublishReady) {
  constexpr uint32_t kSlots = 4;
  constexpr uint32_t kRounds = 1500;
  constexpr uint64_t kBytes = 16 * 1024;
  auto pool = MustCreate(SmallOptions(kSlots, kBytes));
  ASSERT_NE(pool, nullptr);
  const std::string name = pool->name();
  auto fails = [](uint32_t round) { return round % 7 == 3; };

  int acks[2];
  ASSERT_EQ(pipe(acks), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(acks[0]);
    auto attached = StagingPool::Attach(name);
    if (!attached.ok()) _exit(10);
    StagingPool& p = **attached;
    for (uint32_t round = 0; round < kRounds; ++round) {
      uint32_t slot = round % kSlots;
      uint32_t gen = round / kSlots + 1;
      SlotWaitOutcome outcome = p.WaitReady(slot, gen, seconds(10));
      if (fails(round)) {
        if (outcome != SlotWaitOutcome::kFailed) _exit(20);
      } else {
        if (outcome != SlotWaitOutcome::kReady) _exit(21);
        const uint8_t* data = p.SlotData(slot);
        for (uint64_t i = 0; i < kBytes; ++i) {
          if (data[i] != PatternByte(slot, gen, i)) _exit(22);
        }
      }
      const char done = 1;
      if (write(acks[1], &done, 1) != 1) _exit(23);
    }
    _exit(0);
  }
  close(acks[1]);

  bool ok = true;
  uint32_t acked = 0;  // rounds the child is done with (it does them in order)
  for (uint32_t round = 0; round < kRounds && ok; ++round) {
    uint32_t slot = round % kSlots;
    while (round >= kSlots && acked < round - kSlots + 1) {  // the previous generation of this slot is done
      pollfd pfd{acks[0], POLLIN, 0};
      char done;
      if (poll(&pfd, 1, 10000) != 1 || read(acks[0], &done, 1) != 1) {
        ok = false;
        break;
      }
      ++acked;
    }
    if (!ok) break;
    uint32_t gen = pool->BeginFill(slot);
    EXPECT_EQ(gen, round / kSlots + 1);
    uint8_t* data = pool->SlotData(slot);
    for (uint64_t i = 0; i < kBytes; ++i) data[i] = PatternByte(slot, gen, i);
    if (fails(round)) {
      pool->PublishFailed(slot, gen);
    } else {
      pool->PublishReady(slot, gen);
    }
  }
  while (ok && acked < kRounds) {  // the child's last acknowledgements (it must not write into a closed pipe)
    pollfd pfd{acks[0], POLLIN, 0};
    char done;
    if (poll(&pfd, 1, 10000) != 1 || read(acks[0], &done, 1) != 1) break;
    ++acked;
  }
  close(acks[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(ok) << "the consumer stopped making progress";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed: 10 attach, 20 expected failure, 21 expected ready, 22 bytes, "
                                       "23 ack";
}

// The same protocol between threads of one process, two consumers per generation (as with TP=2), each saying it is
// done through its own counter: under ThreadSanitizer this checks that PublishReady/WaitReady order the slot bytes.
TEST(StagingPool, TwoConsumerThreadsSeeEveryGenerationAndTheEngineWaitsForBoth) {
  constexpr uint32_t kSlots = 2;
  constexpr uint32_t kRounds = 400;
  constexpr uint64_t kBytes = 4096;
  constexpr uint32_t kConsumers = 2;
  auto pool = MustCreate(SmallOptions(kSlots, kBytes));
  ASSERT_NE(pool, nullptr);
  std::atomic<int> errors{0};
  std::atomic<uint32_t> rounds_done[kConsumers] = {0, 0};
  auto consumer = [&](uint32_t me) {
    for (uint32_t round = 0; round < kRounds; ++round) {
      uint32_t slot = round % kSlots;
      uint32_t gen = round / kSlots + 1;
      if (pool->WaitReady(slot, gen, seconds(10)) != SlotWaitOutcome::kReady) {
        errors.fetch_add(1);
        return;
      }
      for (uint64_t i = 0; i < kBytes; ++i) {
        if (pool->SlotData(slot)[i] != PatternByte(slot, gen, i)) {
          errors.fetch_add(1);
          break;
        }
      }
      rounds_done[me].store(round + 1, std::memory_order_release);
    }
  };
  std::thread c1(consumer, 0u), c2(consumer, 1u);
  for (uint32_t round = 0; round < kRounds && errors.load() == 0; ++round) {
    uint32_t slot = round % kSlots;
    if (round >= kSlots) {  // both consumers are done with the previous generation of this slot
      for (uint32_t c = 0; c < kConsumers; ++c) {
        while (rounds_done[c].load(std::memory_order_acquire) < round - kSlots + 1 && errors.load() == 0) {
          std::this_thread::yield();
        }
      }
    }
    uint32_t gen = pool->BeginFill(slot);
    for (uint64_t i = 0; i < kBytes; ++i) pool->SlotData(slot)[i] = PatternByte(slot, gen, i);
    pool->PublishReady(slot, gen);
  }
  c1.join();
  c2.join();
  EXPECT_EQ(errors.load(), 0);
}

TEST(StagingPool, GenerationSkipsZeroOnWrapAround) {
  auto pool = MustCreate(SmallOptions(1));
  ASSERT_NE(pool, nullptr);
  // Drive the generation to the top by writing the state word directly (first word of slot 0's control line).
  auto* base = static_cast<uint8_t*>(pool->base());
  auto* state = reinterpret_cast<std::atomic<uint64_t>*>(base + 128);  // control lines start at offset 128
  state->store(uint64_t{0xffffffffu} << 32);
  EXPECT_EQ(pool->Observe(0).generation, 0xffffffffu);
  EXPECT_EQ(pool->BeginFill(0), 1u);
  EXPECT_EQ(pool->WaitReady(0, 0xffffffffu, milliseconds(1)), SlotWaitOutcome::kSuperseded);
}

}  // namespace
}  // namespace kvtier
