// io_uring-specific behaviour beyond the shared contract: the issuer thread binding, shutdown with ops in flight and
// the side thread for ops without a ring opcode.
#include <fcntl.h>
#include <unistd.h>

#include <thread>

#include "io/io_engine.h"
#include "io_test_util.h"

namespace kvtier {
namespace {

using testing::kMs;
using testing::OpenOp;
using testing::ReadOp;
using testing::RunOne;
using testing::ScratchDir;

#define REQUIRE_URING()                                                           \
  do {                                                                            \
    std::string why_;                                                             \
    if (!UringAvailable(&why_)) GTEST_SKIP() << "io_uring unavailable: " << why_; \
  } while (0)

TEST(UringEngine, MayBeCreatedOnOneThreadAndDrivenByAnother) {
  REQUIRE_URING();
  auto created = CreateUringEngine(4);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<IoEngine> engine = std::move(created).value();
  ScratchDir dir;
  int64_t result = 0;
  std::thread reactor([&] { result = RunOne(*engine, OpenOp(dir.dirfd(), "missing", O_RDONLY, 1)); });
  reactor.join();
  EXPECT_EQ(result, -ENOENT);
}

TEST(UringEngine, DestroyingItWithAStuckOpInFlightCancelsTheOpAndReturns) {
  REQUIRE_URING();
  auto created = CreateUringEngine(4);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<IoEngine> engine = std::move(created).value();
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  char buf[8];
  ASSERT_EQ(engine->Submit(ReadOp(pipefd[0], buf, sizeof(buf), 0, 1)), 0);  // no deadline: would block forever
  ASSERT_EQ(engine->Flush(), 0);
  std::vector<IoCompletion> got;
  EXPECT_EQ(engine->Reap(&got, 10 * kMs), 0);
  int64_t start = NowNs();
  engine.reset();
  EXPECT_LT(NowNs() - start, 2'000 * kMs);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(UringEngine, DestroyingItOffTheIssuerThreadReturnsPromptly) {
  REQUIRE_URING();
  auto created = CreateUringEngine(4);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<IoEngine> engine = std::move(created).value();
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  char buf[8];
  std::thread issuer([&] {
    ASSERT_EQ(engine->Submit(ReadOp(pipefd[0], buf, sizeof(buf), 0, 1)), 0);
    ASSERT_EQ(engine->Flush(), 0);
  });
  issuer.join();
  int64_t start = NowNs();
  engine.reset();
  EXPECT_LT(NowNs() - start, 2'000 * kMs);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(UringEngine, AnOpWithoutARingOpcodeCompletesOnTheSideThreadAndWakesAWaitingReap) {
  REQUIRE_URING();
  auto created = CreateUringEngine(4);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<IoEngine> engine = std::move(created).value();
  ScratchDir dir;
  const int fd = openat(dir.dirfd(), "f", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  char buf[8];
  ASSERT_EQ(engine->Submit(ReadOp(pipefd[0], buf, sizeof(buf), 0, 1)), 0);  // on the ring, never completes
  IoOp touch;
  touch.code = OpCode::kUtimensAt;
  touch.dirfd = dir.dirfd();
  touch.path = "f";
  touch.user_data = 2;
  ASSERT_EQ(engine->Submit(touch), 0);
  ASSERT_EQ(engine->Flush(), 0);
  EXPECT_EQ(engine->in_flight(), 2u);
  std::vector<IoCompletion> got;
  const int64_t start = NowNs();
  while (got.empty() && NowNs() - start < 5'000 * kMs) ASSERT_GE(engine->Reap(&got, 5'000 * kMs), 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].user_data, 2u);
  EXPECT_EQ(got[0].result, 0);
  EXPECT_LT(NowNs() - start, 2'000 * kMs) << "the side thread's completion woke the Reap";
  EXPECT_EQ(engine->in_flight(), 1u);
  // At most 8 side ops at once (until reaped): a ninth waits in the caller, whatever depth the ring has left.
  auto wide = CreateUringEngine(64);
  ASSERT_TRUE(wide.ok());
  for (uint64_t i = 0; i < 8; ++i) {
    touch.user_data = 100 + i;
    ASSERT_EQ(wide.value()->Submit(touch), 0) << i;
  }
  touch.user_data = 108;
  EXPECT_EQ(wide.value()->Submit(touch), -EAGAIN);
  std::vector<IoCompletion> eight;
  while (eight.size() < 8) ASSERT_GE(wide.value()->Reap(&eight, 5'000 * kMs), 0);
  EXPECT_EQ(wide.value()->Submit(touch), 0) << "reaped: room again";
  // Destroyed with side ops queued and the ring's read stuck: returns promptly.
  for (uint64_t i = 3; i < 5; ++i) {
    touch.user_data = i;
    ASSERT_EQ(engine->Submit(touch), 0);
  }
  const int64_t destroy = NowNs();
  engine.reset();
  EXPECT_LT(NowNs() - destroy, 2'000 * kMs);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(UringEngine, AnOpWhoseDeadlineHasAlreadyPassedStillCompletesExactlyOnce) {
  REQUIRE_URING();
  auto created = CreateUringEngine(4);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<IoEngine> engine = std::move(created).value();
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  char buf[8];
  IoOp op = ReadOp(pipefd[0], buf, sizeof(buf), 0, 9);
  op.deadline_ns = NowNs() - 1;
  std::vector<IoCompletion> others;
  EXPECT_EQ(RunOne(*engine, op, 2'000 * kMs, &others), -ETIMEDOUT);
  EXPECT_TRUE(others.empty());
  EXPECT_EQ(engine->in_flight(), 0u);
  close(pipefd[0]);
  close(pipefd[1]);
}

}  // namespace
}  // namespace kvtier
