// StartThread (src/util/thread.h): a kvtier thread blocks every asynchronous signal from its start, leaves the fault
// signals to their handlers, and its creator's mask is what it was.
#include "util/thread.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <cstring>

namespace kvtier {
namespace {

sigset_t CurrentMask() {
  sigset_t m;
  pthread_sigmask(SIG_BLOCK, nullptr, &m);
  return m;
}

TEST(StartThread, TheThreadBlocksAsynchronousSignalsAndLeavesFaultsToTheirHandlers) {
  sigset_t seen;
  sigemptyset(&seen);
  StartThread([&seen] { seen = CurrentMask(); }).join();
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE, SIGALRM, SIGPROF}) {
    EXPECT_TRUE(sigismember(&seen, sig)) << strsignal(sig) << " is not blocked in a kvtier thread";
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) {
    EXPECT_FALSE(sigismember(&seen, sig)) << strsignal(sig) << " is blocked in a kvtier thread";
  }
}

TEST(StartThread, TheCreatorKeepsItsOwnMaskAndTheArgumentsArePassed) {
  const sigset_t before = CurrentMask();
  int got = 0;
  StartThread([&got](int a, int b) { got = a + b; }, 40, 2).join();
  EXPECT_EQ(got, 42);
  const sigset_t after = CurrentMask();
  for (int sig = 1; sig < NSIG; ++sig) {
    EXPECT_EQ(sigismember(&before, sig), sigismember(&after, sig)) << "signal " << sig;
  }
}

}  // namespace
}  // namespace kvtier
