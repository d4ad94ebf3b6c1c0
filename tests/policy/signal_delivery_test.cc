// A signal sent to the process never goes to one of kvtier's threads (src/util/thread.h): with the engine open and
// busy (reactors on either I/O backend, a stream pump, a job client and its copier, the preload planner's pump), a
// signal the test's own thread blocks stays pending for it instead of being taken by a kvtier thread.
//
// What it guards: CPython runs Python signal handlers only in its main thread. vLLM's EngineCore, idle in
// queue.get() with kvtier's engine open, once let a SIGTERM land on another thread of the process, never ran its
// handler and was killed 30 s later instead of shutting down (tests/vllm/test_shutdown.py). The test's thread plays
// that main thread, momentarily not taking the signal: the kernel then gives it to any other thread that does not
// block it, which before the fix were the engine's.
#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/engine.h"
#include "policy/job_client.h"
#include "policy/preload_planner.h"
#include "policy/stream_pump.h"
#include "support/engine_options.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 2;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kSlotBytes = 4096 + kBlocks * kBlockBytes;

std::atomic<pid_t> handled_by{0};
void RecordHandler(int) { handled_by.store(static_cast<pid_t>(syscall(SYS_gettid))); }

pid_t ThisThread() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The threads of this process other than the caller that leave `sig` unblocked (from /proc/self/task/*/status).
std::vector<std::string> ThreadsTaking(int sig) {
  std::vector<std::string> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || std::stol(e->d_name) == ThisThread()) continue;
    std::ifstream status(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line, name;
    while (std::getline(status, line)) {
      if (line.rfind("Name:", 0) == 0) name = line.substr(6);
      if (line.rfind("SigBlk:", 0) == 0) {
        const uint64_t blocked = std::stoull(line.substr(7), nullptr, 16);
        if ((blocked & (uint64_t{1} << (sig - 1))) == 0) out.push_back(std::string(e->d_name) + " (" + name + ")");
      }
    }
  }
  closedir(d);
  return out;
}

class SignalDeliveryTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    struct sigaction sa {};
    sa.sa_handler = RecordHandler;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &sa, &old_action_), 0);
    handled_by = 0;
  }
  void TearDown() override { sigaction(SIGUSR1, &old_action_, nullptr); }

  struct sigaction old_action_ {};
  test::TempDir dir_;
};

TEST_P(SignalDeliveryTest, ASignalToTheProcessIsNeverTakenByAnEngineThread) {
  EngineOptions o = test::BaseOptions(dir_.path(), "signal-test", 32, kBlocks, kBlockBytes);
  o.pool_bytes = 64 * kSlotBytes;
  o.io_depth = 4;
  o.reactors = 2;
  o.backend = GetParam();
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Engine> engine = std::move(opened.value());
  auto board = StagingPool::Attach(engine->pool_name());
  ASSERT_TRUE(board.ok());
  StreamPump pump(engine.get(), std::move(board.value()), StreamOptions{});
  auto client = JobClient::Create(engine.get(), nullptr, {}, &pump);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  PreloadPlanner planner(engine.get(), PlannerOptions{2, 0});
  planner.StartBackgroundPump(std::chrono::microseconds(1000));

  // Busy threads: a store of 16 chunks through the pump, the copier and the reactors (opens, writes, links).
  std::vector<std::vector<uint8_t>> data(16, std::vector<uint8_t>(kBlocks * kBlockBytes, 0x5a));
  std::vector<ChunkTransfer> chunks;
  for (uint64_t i = 0; i < data.size(); ++i) {
    std::vector<CopySegment> segs;
    for (uint32_t b = 0; b < kBlocks; ++b) {
      segs.push_back(CopySegment{b * engine->block_stride(),
                                 reinterpret_cast<uint64_t>(data[i].data() + b * kBlockBytes), kBlockBytes});
    }
    chunks.push_back(ChunkTransfer{test::NumberedKey(i, 36, 8, 0x3d), 0, 0, segs});
  }
  auto id = (*client)->SubmitStore(std::move(chunks));
  ASSERT_TRUE(id.ok()) << id.status().ToString();

  const std::vector<std::string> taking = ThreadsTaking(SIGUSR1);
  EXPECT_TRUE(taking.empty()) << taking.size() << " threads besides the test's leave SIGUSR1 unblocked, e.g. "
                              << taking.front();

  // This thread stops taking SIGUSR1 a moment (as CPython's main thread does while it creates a thread), and the
  // process is signalled: no other thread may take it.
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &usr1, &old), 0);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  for (int i = 0; i < 50 && handled_by.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(handled_by.load(), 0) << "thread " << handled_by.load() << " of the engine ran the process's handler";
  EXPECT_TRUE(sigismember(&pending, SIGUSR1)) << "the signal did not wait for the thread that takes it";
  // Unblocked, the pending signal is this thread's (at once; a sanitizer's runtime may run the handler a moment later).
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  if (sigismember(&pending, SIGUSR1)) {
    for (int i = 0; i < 500 && handled_by.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(handled_by.load(), ThisThread());
  }

  auto r = (*client)->Wait(id.value(), 30000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->all_ok());
  client->reset();
}

INSTANTIATE_TEST_SUITE_P(Backends, SignalDeliveryTest, ::testing::Values(IoBackend::kAuto, IoBackend::kPosix),
                         [](const ::testing::TestParamInfo<IoBackend>& p) {
                           return p.param == IoBackend::kPosix ? std::string("Posix") : std::string("Auto");
                         });

}  // namespace
}  // namespace kvtier
