// io_uring-specific behaviour beyond the shared contract: the issuer thread binding and shutdown with ops in flight.
#include <fcntl.h>
#include <unistd.h>

#include <thread>

#include "io/io_engine.h"
#include "io_test_util.h"

namespace kvtier::io {
namespace {

using testing::kMs;
using testing::OpenOp;
using testing::ReadOp;
using testing::RunOne;
using testing::ScratchDir;

#define REQUIRE_URING()                                                             \
  do {                                                                              \
    std::string why_;                                                               \
    if (!UringAvailable(&why_)) GTEST_SKIP() << "io_uring unavailable: " << why_;   \
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
}  // namespace kvtier::io
