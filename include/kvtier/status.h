// Status and Result<T>: kvtier's error values.
//
// Every fallible call returns a Status (or a Result<T> carrying a value or a Status). A cache miss is not an
// error: calls that can miss say so in their return type. Exceptions are used only at the Python and CLI edges.
//
// Thread safety: Status and Result are plain values; copy them freely between threads.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,   // bad option, key or request: the caller must change something
  kNotFound,          // the thing asked for does not exist (used by admin calls, never for cache misses)
  kAlreadyExists,
  kCorrupt,           // bytes on disk fail verification (header, checksum, namespace)
  kIoError,           // the OS refused or failed an operation; errno() says why
  kNoSpace,           // ENOSPC / EDQUOT, or the disk budget cannot be met
  kTimedOut,          // an operation passed its deadline
  kResourceExhausted, // staging pool or queue full; retry later
  kFailedPrecondition,// state does not allow the call (namespace mismatch, engine shut down, ...)
  kUnsupported,       // capability missing on this kernel or filesystem
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int error_number = 0)
      : code_(code), errno_(error_number), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // Maps an errno value to the closest code (ENOSPC -> kNoSpace, ETIMEDOUT -> kTimedOut, ENOENT -> kNotFound...).
  static Status FromErrno(int error_number, std::string context);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  int error_number() const { return errno_; }
  const std::string& message() const { return message_; }
  // "IoError: open ab/cd/...: No such file or directory (errno 2)"
  std::string ToString() const;
  // Returns a copy with "context: " prepended to the message.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  int errno_ = 0;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                       // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}                // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

#define KVTIER_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::kvtier::Status _kvtier_s = (expr);    \
    if (!_kvtier_s.ok()) return _kvtier_s;  \
  } while (0)

}  // namespace kvtier
