// TraceRecorder: an optional Chrome trace (JSON, viewable in Perfetto or chrome://tracing) of every load, store,
// read, write and device copy (SPEC O2).
//
// Off by default and free when off: every recording call is an inline check of one flag, and ScopedTrace does not
// even read the clock when its recorder is null or disabled. Instrumented code holds a `TraceRecorder*` that may be
// null, or a disabled recorder; both record nothing.
//
// File format: {"traceEvents":[ event, event, ... ]}. The recorder keeps the file valid JSON at all times: after
// every flush the file ends with the closing "]}", and the next flush overwrites that trailer with more events
// and a new trailer. A process that dies loses only the events buffered since the last flush (at most
// kFlushBytes of them), and the file still parses.
//
// Timestamps are CLOCK_MONOTONIC nanoseconds (NowNs()), written as microseconds with three decimals, so traces
// of the engine and of the worker processes on one machine share a time base and can be merged.
//
// Thread safety: all methods may be called from any thread. Events are formatted by the calling thread, then
// appended to a shared buffer under a mutex; the thread that pushes the buffer past kFlushBytes writes it out.
// Strings passed in are copied (escaped) before the call returns.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kvtier/status.h"

namespace kvtier {

using TraceArg = std::pair<std::string_view, uint64_t>;
using TraceArgs = std::initializer_list<TraceArg>;

class TraceRecorder {
 private:
  // Only the class's own factories construct it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  explicit TraceRecorder(Passkey) {}
  static constexpr size_t kFlushBytes = size_t{1} << 20;

  // Creates (or truncates) the file at `path`, mode 0644, and writes an empty trace. An empty path returns a
  // disabled recorder. Errors: the open or the first write failed (Status::FromErrno codes).
  static Result<std::unique_ptr<TraceRecorder>> Open(const std::string& path);
  // A recorder that records nothing and owns no file.
  static std::unique_ptr<TraceRecorder> Disabled();

  // Closes the file (see Close()); a failure is reported on stderr.
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // False for a disabled recorder, after Close(), and after a write error.
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // A complete event ("ph":"X"): something that started at start_ns and lasted dur_ns.
  void Complete(std::string_view name, std::string_view category, int64_t start_ns, int64_t dur_ns, uint32_t tid,
                TraceArgs args = {}) {
    if (enabled()) RecordComplete(name, category, start_ns, dur_ns, tid, std::span(args.begin(), args.size()));
  }
  // An instant event ("ph":"i", thread scope).
  void Instant(std::string_view name, std::string_view category, int64_t ts_ns, uint32_t tid, TraceArgs args = {}) {
    if (enabled()) RecordInstant(name, category, ts_ns, tid, std::span(args.begin(), args.size()));
  }
  // A counter event ("ph":"C"): each arg is one series of the counter track `name` (e.g. {"in_use", 12}).
  void Counter(std::string_view name, int64_t ts_ns, TraceArgs args) {
    if (enabled()) RecordCounter(name, ts_ns, std::span(args.begin(), args.size()));
  }
  // Names a thread track ("ph":"M" thread_name metadata), e.g. "reactor".
  void NameThread(uint32_t tid, std::string_view name) {
    if (enabled()) RecordThreadName(tid, name);
  }

  // Writes buffered events now. Returns the first write error seen, if any.
  Status Flush();
  // Flushes, leaves a valid file, closes it, and disables the recorder; later events are dropped. Idempotent:
  // returns the first error seen.
  Status Close();

  // Events accepted so far (including those still buffered).
  uint64_t events_recorded() const { return events_recorded_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

  // CLOCK_MONOTONIC in nanoseconds.
  static int64_t NowNs();
  // The calling thread's kernel thread id (cached per thread), a natural `tid` for events.
  static uint32_t CurrentThreadId();

  // The out-of-line halves of the inline calls above, for callers that hold their args in an array.
  void RecordComplete(std::string_view name, std::string_view category, int64_t start_ns, int64_t dur_ns, uint32_t tid,
                      std::span<const TraceArg> args);
  void RecordInstant(std::string_view name, std::string_view category, int64_t ts_ns, uint32_t tid,
                     std::span<const TraceArg> args);
  void RecordCounter(std::string_view name, int64_t ts_ns, std::span<const TraceArg> args);
  void RecordThreadName(uint32_t tid, std::string_view name);

 private:
  // Appends one formatted event (no separator) to the buffer; writes the buffer out past kFlushBytes.
  void Append(const std::string& event);
  Status FlushLocked();  // requires mu_

  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> events_recorded_{0};
  std::string path_;
  int32_t pid_ = 0;

  std::mutex mu_;
  int fd_ = -1;               // guarded by mu_; -1 once closed
  std::string buffer_;        // guarded by mu_: events not yet written, each preceded by its separator
  uint64_t data_end_ = 0;     // guarded by mu_: file offset where the trailer starts
  bool any_written_ = false;  // guarded by mu_: whether an event precedes the next one (needs a comma)
  Status status_;             // guarded by mu_: the first write error
};

// Records one complete event for the lifetime of a scope:
//   ScopedTrace t(recorder, "read", "io", tid);
//   t.AddArg("bytes", n);
// Does nothing (and reads no clock) when recorder is null or disabled. `name`, `category` and arg keys are
// borrowed: they must outlive the ScopedTrace (string literals, typically).
class ScopedTrace {
 public:
  static constexpr size_t kMaxArgs = 4;

  // tid 0 means the calling thread (looked up only when tracing is on).
  ScopedTrace(TraceRecorder* recorder, std::string_view name, std::string_view category, uint32_t tid = 0)
      : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr), name_(name), category_(category) {
    if (recorder_ != nullptr) {
      tid_ = tid != 0 ? tid : TraceRecorder::CurrentThreadId();
      start_ns_ = TraceRecorder::NowNs();
    }
  }
  ~ScopedTrace() {
    if (recorder_ != nullptr) {
      recorder_->RecordComplete(name_, category_, start_ns_, TraceRecorder::NowNs() - start_ns_, tid_,
                                std::span<const TraceArg>(args_, num_args_));
    }
  }
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;

  // Attaches a value to the event; beyond kMaxArgs, args are dropped.
  void AddArg(std::string_view key, uint64_t value) {
    if (recorder_ != nullptr && num_args_ < kMaxArgs) args_[num_args_++] = {key, value};
  }

 private:
  TraceRecorder* recorder_;
  std::string_view name_;
  std::string_view category_;
  uint32_t tid_ = 0;
  int64_t start_ns_ = 0;
  TraceArg args_[kMaxArgs];
  size_t num_args_ = 0;
};

}  // namespace kvtier
