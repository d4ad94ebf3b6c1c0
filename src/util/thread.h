// StartThread: how kvtier starts every thread of its own (reactors, the stream pump, the maintenance and ledger
// threads, I/O workers, copiers): with the process's asynchronous signals blocked in it from its first instruction.
//
// Why: a signal sent to a process (kill(pid, SIGTERM), Ctrl-C) goes to one thread of it that does not block it, and
// the kernel may pick any such thread, not only the one the program expects. kvtier runs inside programs that handle
// their signals on one thread: CPython runs a Python signal handler only in its main thread, and when the signal
// lands on another thread it only marks it pending; a main thread asleep in a lock (vLLM's EngineCore idling in
// queue.get) is not woken and never runs the handler. vLLM's EngineCore then ignored a SIGTERM taken by a kvtier
// thread, and was killed 30 s later instead of shutting down (tests/vllm/test_shutdown.py). A library's threads must
// leave process-directed signals to the program's own threads: kvtier's threads block them all.
//
// Left unblocked: the signals the kernel sends to the thread that caused them (a fault, a failed instruction, a
// bad system call, abort()). Blocking those would not keep them away, but would make the kernel reset their
// handlers (a crash reporter such as Python's faulthandler would not run).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace kvtier {

// The signals every kvtier thread blocks: all but the synchronous ones named above.
inline sigset_t KvtierThreadSignalMask() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&set, sig);
  return set;
}

// Blocks KvtierThreadSignalMask() in the calling thread (for a thread kvtier did not start through StartThread,
// e.g. a Python thread of the adapter's).
inline void BlockSignalsInThisThread() {
  const sigset_t set = KvtierThreadSignalMask();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// std::thread(fn, args...) whose thread has KvtierThreadSignalMask() blocked from its start: the caller blocks the
// set around the creation (a new thread inherits its creator's mask; glibc's pthread_create blocks every signal in
// the creator for that moment anyway) and gets its own mask back before this returns. Throws what std::thread does.
template <typename Fn, typename... Args>
std::thread StartThread(Fn&& fn, Args&&... args) {
  const sigset_t set = KvtierThreadSignalMask();
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &set, &old);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};
  return std::thread(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

}  // namespace kvtier
