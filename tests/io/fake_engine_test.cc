// FakeEngine's test controls: deterministic order, holding and releasing completions, deadlines of held ops.
#include "io/fake_engine.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <thread>

#include "io_test_util.h"

namespace kvtier {
namespace {

using testing::kMs;
using testing::OpenOp;
using testing::ReadOp;
using testing::ReapAtLeast;
using testing::ScratchDir;

int CountOpenFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

TEST(FakeEngine, CompletionsArriveInSubmissionOrder) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  FakeEngine engine(16);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "missing", O_RDONLY, 100 - i)), 0);
  EXPECT_TRUE(engine.executed().empty()) << "nothing runs before Flush";
  ASSERT_EQ(engine.Flush(), 0);
  std::vector<IoCompletion> got;
  ASSERT_EQ(engine.Reap(&got, 0), 10);
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(got[i].user_data, 100 - i);
    EXPECT_EQ(got[i].result, -ENOENT);
  }
}

TEST(FakeEngine, HeldCompletionsAreNotReapedUntilReleased) {
  ScratchDir dir;
  FakeEngine engine;
  engine.HoldCompletions(true);
  ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 1)), 0);
  ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "b", O_RDONLY, 2)), 0);
  ASSERT_EQ(engine.Flush(), 0);
  EXPECT_EQ(engine.held(), 2u);
  std::vector<IoCompletion> got;
  EXPECT_EQ(engine.Reap(&got, 20 * kMs), 0);
  EXPECT_TRUE(engine.Release(2));
  EXPECT_FALSE(engine.Release(2));
  ASSERT_EQ(engine.Reap(&got, 0), 1);
  EXPECT_EQ(got[0].user_data, 2u);
  engine.ReleaseAll();
  ASSERT_EQ(engine.Reap(&got, 0), 1);
  EXPECT_EQ(got[1].user_data, 1u);
  EXPECT_EQ(engine.in_flight(), 0u);
}

TEST(FakeEngine, ReleaseFromAnotherThreadEndsABlockedReap) {
  ScratchDir dir;
  FakeEngine engine;
  engine.HoldCompletions(true);
  ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 1)), 0);
  ASSERT_EQ(engine.Flush(), 0);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    engine.ReleaseAll();
  });
  std::vector<IoCompletion> got;
  int64_t start = NowNs();
  EXPECT_EQ(engine.Reap(&got, 3'000 * kMs), 1);
  EXPECT_LT(NowNs() - start, 2'000 * kMs);
  releaser.join();
}

TEST(FakeEngine, AHeldOpenPastItsDeadlineTimesOutAndClosesItsFd) {
  ScratchDir dir;
  FakeEngine engine;
  engine.HoldCompletions(true);
  int before = CountOpenFds();
  IoOp op = OpenOp(dir.dirfd(), "new", O_CREAT | O_RDWR, 5);
  op.deadline_ns = NowNs() + 20 * kMs;
  ASSERT_EQ(engine.Submit(op), 0);
  ASSERT_EQ(engine.Flush(), 0);
  auto got = ReapAtLeast(engine, 1, 3'000 * kMs);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].result, -ETIMEDOUT);
  EXPECT_EQ(CountOpenFds(), before);
}

TEST(FakeEngine, AHeldOpWithoutADeadlineStaysHeld) {
  ScratchDir dir;
  FakeEngine engine;
  engine.HoldCompletions(true);
  ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 1)), 0);
  ASSERT_EQ(engine.Flush(), 0);
  std::vector<IoCompletion> got;
  EXPECT_EQ(engine.Reap(&got, 30 * kMs), 0);
  EXPECT_EQ(engine.held(), 1u);
  engine.HoldCompletions(false);
  EXPECT_EQ(engine.held(), 1u) << "turning holding off does not release what is already held";
  engine.ReleaseAll();
}

TEST(FakeEngine, SetDepthChangesTheBoundForLaterSubmits) {
  ScratchDir dir;
  FakeEngine engine(1);
  ASSERT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 1)), 0);
  EXPECT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 2)), -EAGAIN);
  engine.set_depth(2);
  EXPECT_EQ(engine.depth(), 2u);
  EXPECT_EQ(engine.Submit(OpenOp(dir.dirfd(), "a", O_RDONLY, 2)), 0);
  ASSERT_EQ(engine.Flush(), 0);
  EXPECT_EQ(ReapAtLeast(engine, 2, 1'000 * kMs).size(), 2u);
}

}  // namespace
}  // namespace kvtier
