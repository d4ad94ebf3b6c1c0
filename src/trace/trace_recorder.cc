#include "trace/trace_recorder.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace kvtier {

namespace {

constexpr std::string_view kHeader = "{\"traceEvents\":[\n";
constexpr std::string_view kTrailer = "\n]}\n";

void AppendEscaped(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Nanoseconds as microseconds with three decimals ("ts" and "dur" are in microseconds in Chrome traces).
void AppendMicros(std::string& out, int64_t ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
  out += buf;
}

void AppendArgs(std::string& out, std::span<const TraceArg> args) {
  out += "\"args\":{";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ',';
    AppendEscaped(out, args[i].first);
    out += ':';
    out += std::to_string(args[i].second);
  }
  out += '}';
}

// Writes all of data at offset, retrying short writes and EINTR.
Status WriteAllAt(int fd, std::string_view data, uint64_t offset) {
  while (!data.empty()) {
    ssize_t n = pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write trace file");
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Each thread formats its events into its own string, so only the final append happens under the mutex.
std::string& ScratchBuffer() {
  thread_local std::string scratch;
  scratch.clear();
  return scratch;
}

}  // namespace

Result<std::unique_ptr<TraceRecorder>> TraceRecorder::Open(const std::string& path) {
  if (path.empty()) return Disabled();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "open trace file " + path);
  auto recorder = std::make_unique<TraceRecorder>(Passkey{});
  recorder->path_ = path;
  recorder->pid_ = static_cast<int32_t>(getpid());
  recorder->fd_ = fd;
  std::string initial = std::string(kHeader) + std::string(kTrailer.substr(1));  // "{"traceEvents":[\n]}\n"
  Status s = WriteAllAt(fd, initial, 0);
  if (!s.ok()) return s.WithContext(path);
  recorder->data_end_ = kHeader.size();
  recorder->buffer_.reserve(kFlushBytes + 4096);
  recorder->enabled_.store(true, std::memory_order_relaxed);
  return recorder;
}

std::unique_ptr<TraceRecorder> TraceRecorder::Disabled() { return std::make_unique<TraceRecorder>(Passkey{}); }

TraceRecorder::~TraceRecorder() {
  Status s = Close();
  if (!s.ok()) std::fprintf(stderr, "kvtier: trace %s: %s\n", path_.c_str(), s.ToString().c_str());
}

int64_t TraceRecorder::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

uint32_t TraceRecorder::CurrentThreadId() {
  thread_local const uint32_t tid = static_cast<uint32_t>(syscall(SYS_gettid));
  return tid;
}

void TraceRecorder::RecordComplete(std::string_view name, std::string_view category, int64_t start_ns, int64_t dur_ns,
                                   uint32_t tid, std::span<const TraceArg> args) {
  std::string& e = ScratchBuffer();
  e += "{\"name\":";
  AppendEscaped(e, name);
  e += ",\"cat\":";
  AppendEscaped(e, category);
  e += ",\"ph\":\"X\",\"ts\":";
  AppendMicros(e, start_ns);
  e += ",\"dur\":";
  AppendMicros(e, dur_ns < 0 ? 0 : dur_ns);
  e += ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid) + ",";
  AppendArgs(e, args);
  e += '}';
  Append(e);
}

void TraceRecorder::RecordInstant(std::string_view name, std::string_view category, int64_t ts_ns, uint32_t tid,
                                  std::span<const TraceArg> args) {
  std::string& e = ScratchBuffer();
  e += "{\"name\":";
  AppendEscaped(e, name);
  e += ",\"cat\":";
  AppendEscaped(e, category);
  e += ",\"ph\":\"i\",\"s\":\"t\",\"ts\":";
  AppendMicros(e, ts_ns);
  e += ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid) + ",";
  AppendArgs(e, args);
  e += '}';
  Append(e);
}

void TraceRecorder::RecordCounter(std::string_view name, int64_t ts_ns, std::span<const TraceArg> args) {
  std::string& e = ScratchBuffer();
  e += "{\"name\":";
  AppendEscaped(e, name);
  e += ",\"ph\":\"C\",\"ts\":";
  AppendMicros(e, ts_ns);
  e += ",\"pid\":" + std::to_string(pid_) + ",";
  AppendArgs(e, args);
  e += '}';
  Append(e);
}

void TraceRecorder::RecordThreadName(uint32_t tid, std::string_view name) {
  std::string& e = ScratchBuffer();
  e += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid) +
       ",\"args\":{\"name\":";
  AppendEscaped(e, name);
  e += "}}";
  Append(e);
}

void TraceRecorder::Append(const std::string& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0 || !status_.ok()) return;  // closed (or failed) between the caller's enabled() check and here
  if (any_written_) buffer_ += ",\n";
  any_written_ = true;
  buffer_ += event;
  events_recorded_.fetch_add(1, std::memory_order_relaxed);
  if (buffer_.size() >= kFlushBytes) (void)FlushLocked();
}

Status TraceRecorder::FlushLocked() {
  if (fd_ < 0 || !status_.ok() || buffer_.empty()) return status_;
  // Events and a fresh trailer go where the old trailer began: the file is valid JSON before and after.
  buffer_ += kTrailer;
  Status s = WriteAllAt(fd_, buffer_, data_end_);
  if (!s.ok()) {
    status_ = s.WithContext(path_);
    enabled_.store(false, std::memory_order_relaxed);
  } else {
    data_end_ += buffer_.size() - kTrailer.size();
  }
  buffer_.clear();
  return status_;
}

Status TraceRecorder::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  return FlushLocked();
}

Status TraceRecorder::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_.store(false, std::memory_order_relaxed);
  if (fd_ < 0) return status_;
  (void)FlushLocked();
  if (close(fd_) != 0 && status_.ok()) status_ = Status::FromErrno(errno, "close trace file " + path_);
  fd_ = -1;
  return status_;
}

}  // namespace kvtier
