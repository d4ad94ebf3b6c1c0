// FaultInjectingEngine: each rule, its counters, and that failed ops have no effect (no write, link, unlink, fd).
// The inner engine is the FakeEngine so that results are deterministic.
#include "io/fault_engine.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "io/fake_engine.h"
#include "io_test_util.h"

namespace kvtier {
namespace {

using testing::FdOp;
using testing::FileExists;
using testing::kMs;
using testing::OpenOp;
using testing::PathOp;
using testing::ReadOp;
using testing::ReapAtLeast;
using testing::RunOne;
using testing::ScratchDir;
using testing::WriteOp;

int CountOpenFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

class FaultEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    auto fake = std::make_unique<FakeEngine>(8);
    fake_ = fake.get();
    engine_ = std::make_unique<FaultInjectingEngine>(std::move(fake));
  }

  int MakeFile(const char* name, const std::string& contents) {
    int fd = openat(dir_.dirfd(), name, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(pwrite(fd, contents.data(), contents.size(), 0), static_cast<ssize_t>(contents.size()));
    return fd;
  }

  ScratchDir dir_;
  FakeEngine* fake_ = nullptr;  // owned by engine_
  std::unique_ptr<FaultInjectingEngine> engine_;
};

TEST_F(FaultEngineTest, WithNoRulesEveryOpIsForwardedUnchanged) {
  EXPECT_EQ(engine_->name(), "fault(fake)");
  int fd = MakeFile("f", "abcdef");
  char buf[6];
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 6, 0, 1)), 6);
  EXPECT_EQ(engine_->counters().ops_seen, 1u);
  EXPECT_EQ(engine_->counters().failed, 0u);
  EXPECT_EQ(fake_->executed().size(), 1u);
  close(fd);
}

TEST_F(FaultEngineTest, FailNthCountingAllOpsFailsOnlyThatOpAndDoesNotRunIt) {
  engine_->AddRule(FaultRule::FailNth(3, EIO));
  int fd = MakeFile("f", "abcdef");
  char buf[6];
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 6, 0, 1)), 6);
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 6, 0, 2)), 6);
  EXPECT_EQ(RunOne(*engine_, WriteOp(fd, "XXXXXX", 6, 0, 3)), -EIO);
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 6, 0, 4)), 6);
  EXPECT_EQ(std::string(buf, 6), "abcdef") << "the failed write must not have run";
  EXPECT_EQ(engine_->counters().failed, 1u);
  EXPECT_EQ(engine_->counters().ops_seen, 4u);
  EXPECT_EQ(fake_->executed().size(), 3u);
  close(fd);
}

TEST_F(FaultEngineTest, FailNthOfAnOpCodeCountsOnlyOpsOfThatCode) {
  engine_->AddRule(FaultRule::FailNth(2, ENOSPC, OpCode::kWrite));
  int fd = MakeFile("f", "");
  char buf[4];
  EXPECT_EQ(RunOne(*engine_, WriteOp(fd, "aaaa", 4, 0, 1)), 4);
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 2)), 4);
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 3)), 4);
  EXPECT_EQ(RunOne(*engine_, WriteOp(fd, "bbbb", 4, 4, 4)), -ENOSPC);
  EXPECT_EQ(RunOne(*engine_, WriteOp(fd, "cccc", 4, 4, 5)), 4);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 8);
  EXPECT_EQ(engine_->counters().failed, 1u);
  close(fd);
}

TEST_F(FaultEngineTest, FailEveryOpOfAKindFailsAllOfThemAndNoLinkHappens) {
  engine_->AddRule(FaultRule::FailEvery(OpCode::kLinkAt, EXDEV));
  int fd = MakeFile("tmp", "x");
  close(fd);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(RunOne(*engine_, PathOp(OpCode::kLinkAt, dir_.dirfd(), "tmp", "final", i)), -EXDEV);
  }
  EXPECT_FALSE(FileExists(dir_.dirfd(), "final"));
  EXPECT_EQ(RunOne(*engine_, PathOp(OpCode::kUnlinkAt, dir_.dirfd(), "tmp", nullptr, 9)), 0) << "other kinds pass";
  EXPECT_EQ(engine_->counters().failed, 3u);
}

TEST_F(FaultEngineTest, AFailedUnlinkLeavesTheFile) {
  engine_->AddRule(FaultRule::FailEvery(OpCode::kUnlinkAt, EACCES));
  close(MakeFile("keep", "x"));
  EXPECT_EQ(RunOne(*engine_, PathOp(OpCode::kUnlinkAt, dir_.dirfd(), "keep", nullptr, 1)), -EACCES);
  EXPECT_TRUE(FileExists(dir_.dirfd(), "keep"));
}

TEST_F(FaultEngineTest, AFailedOpenLeaksNoFileDescriptorAndCreatesNoFile) {
  engine_->AddRule(FaultRule::FailEvery(OpCode::kOpenAt, EMFILE));
  int before = CountOpenFds();
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(RunOne(*engine_, OpenOp(dir_.dirfd(), "new", O_CREAT | O_WRONLY, i)), -EMFILE);
  }
  EXPECT_EQ(CountOpenFds(), before);
  EXPECT_FALSE(FileExists(dir_.dirfd(), "new"));
}

TEST_F(FaultEngineTest, ShortReadReturnsAtMostKBytes) {
  engine_->AddRule(FaultRule::ShortTransfer(OpCode::kRead, 3));
  int fd = MakeFile("f", "abcdefgh");
  char buf[8] = {};
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 8, 0, 1)), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 2, 0, 2)), 2) << "a read already within the cap is untouched";
  EXPECT_EQ(engine_->counters().shortened, 1u);
  close(fd);
}

TEST_F(FaultEngineTest, ShortWriteWritesOnlyKBytes) {
  engine_->AddRule(FaultRule::ShortTransfer(OpCode::kWrite, 5));
  int fd = MakeFile("f", "");
  EXPECT_EQ(RunOne(*engine_, WriteOp(fd, "0123456789", 10, 0, 1)), 5);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 5);
  EXPECT_EQ(engine_->counters().shortened, 1u);
  close(fd);
}

TEST_F(FaultEngineTest, DelayedOpCompletesWithEtimedoutAtItsDeadlineAndNotBefore) {
  engine_->AddRule(FaultRule::DelayPastDeadline(OpCode::kRead));
  int fd = MakeFile("f", "abcd");
  char buf[4];
  IoOp op = ReadOp(fd, buf, 4, 0, 42);
  op.deadline_ns = NowNs() + 60 * kMs;
  ASSERT_EQ(engine_->Submit(op), 0);
  ASSERT_EQ(engine_->Flush(), 0);
  EXPECT_EQ(engine_->in_flight(), 1u);
  std::vector<IoCompletion> got;
  EXPECT_EQ(engine_->Reap(&got, 0), 0) << "not before the deadline";
  int64_t start = NowNs();
  got = ReapAtLeast(*engine_, 1, 3'000 * kMs);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].user_data, 42u);
  EXPECT_EQ(got[0].result, -ETIMEDOUT);
  EXPECT_GE(NowNs() - start, 40 * kMs);
  EXPECT_LT(NowNs() - start, 2'000 * kMs);
  EXPECT_EQ(engine_->counters().delayed, 1u);
  EXPECT_EQ(engine_->in_flight(), 0u);
  EXPECT_TRUE(fake_->executed().empty()) << "a delayed op is not forwarded";
  close(fd);
}

TEST_F(FaultEngineTest, DelayRuleIgnoresOpsWithoutADeadline) {
  engine_->AddRule(FaultRule::DelayPastDeadline());
  int fd = MakeFile("f", "abcd");
  char buf[4];
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 1), 1'000 * kMs), 4);
  EXPECT_EQ(engine_->counters().delayed, 0u);
  close(fd);
}

TEST_F(FaultEngineTest, SynthesizedCompletionsCountTowardTheDepthBound) {
  fake_->set_depth(2);
  engine_->AddRule(FaultRule::FailEvery(OpCode::kFsync, EIO));
  EXPECT_EQ(engine_->Submit(FdOp(OpCode::kFsync, 0, 1)), 0);
  EXPECT_EQ(engine_->Submit(FdOp(OpCode::kFsync, 0, 2)), 0);
  EXPECT_EQ(engine_->Submit(FdOp(OpCode::kFsync, 0, 3)), -EAGAIN);
  auto got = ReapAtLeast(*engine_, 2, 1'000 * kMs);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].user_data, 1u);
  EXPECT_EQ(got[1].user_data, 2u);
  EXPECT_EQ(engine_->counters().ops_seen, 2u) << "a refused Submit is not counted";
}

TEST_F(FaultEngineTest, TheFirstMatchingRuleWins) {
  engine_->AddRule(FaultRule::FailNth(1, EIO, OpCode::kRead));
  engine_->AddRule(FaultRule::ShortTransfer(OpCode::kRead, 1));
  int fd = MakeFile("f", "abcd");
  char buf[4];
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 1)), -EIO);
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 2)), 1);
  engine_->ClearRules();
  EXPECT_EQ(RunOne(*engine_, ReadOp(fd, buf, 4, 0, 3)), 4);
  close(fd);
}

TEST_F(FaultEngineTest, WakeIsForwardedToTheInnerEngine) {
  engine_->Wake();
  std::vector<IoCompletion> got;
  int64_t start = NowNs();
  EXPECT_EQ(engine_->Reap(&got, 3'000 * kMs), 0);
  EXPECT_LT(NowNs() - start, 1'000 * kMs);
}

}  // namespace
}  // namespace kvtier
