// Status and Result<T>: kvtier's error values.
//
// Every fallible call returns a Status (or a Result<T> carrying a value or a Status). A cache miss is not an
// error: calls that can miss say so in their return type. Exceptions are used only at the Python and CLI edges, and
// for one programming error: reading the value of a Result that holds an error (below).
//
// Status
//   - ok() exactly when code() is kOk. An OK status carries no message and no errno; Status::Ok() and Status()
//     are the same value.
//   - code() says what the caller can do about it (the comments on StatusCode); message() is for people: it names
//     the object and the operation ("open ab/cd/...") and is not a stable interface; error_number() is the errno
//     the failure came from, 0 when it did not come from one.
//   - FromErrno(0, ...) is OK; any other errno maps to the closest code (the table in status.cc), kIoError by
//     default, and keeps the errno.
//   - WithContext prefixes the message and keeps code and errno; on an OK status it is a no-op.
//   - ToString() is "Ok", or "Code: message", plus ": strerror (errno N)" when there is an errno.
// Result<T>
//   - Holds either a T or a non-OK Status, never both. Built from a Status that is OK (a caller bug: there is no
//     value to hold), it holds kInternal "Result built from an OK status" instead, so ok() and status() agree.
//   - ok() is true exactly when it holds a value; status() is then Status::Ok(), else the error.
//   - value(), *, -> REQUIRE ok(). On an error they throw std::logic_error whose what() is "Result::value() on an
//     error: " + status().ToString(): a caller that did not check, named by the error it ignored.
//
// Thread safety: Status and Result are plain values; copy them freely between threads. A Result is not
// synchronized: one thread at a time may move its value out.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad option, key or request: the caller must change something
  kNotFound,         // the thing asked for does not exist (used by admin calls, never for cache misses)
  kAlreadyExists,
  kCorrupt,             // bytes on disk fail verification (header, checksum, namespace)
  kIoError,             // the OS refused or failed an operation; errno() says why
  kNoSpace,             // ENOSPC / EDQUOT, or the disk budget cannot be met
  kTimedOut,            // an operation passed its deadline
  kResourceExhausted,   // staging pool or queue full; retry later
  kFailedPrecondition,  // state does not allow the call (namespace mismatch, engine shut down, ...)
  kUnsupported,         // capability missing on this kernel or filesystem
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  // An OK code makes the OK status: message and errno are dropped.
  Status(StatusCode code, std::string message, int error_number = 0)
      : code_(code),
        errno_(code == StatusCode::kOk ? 0 : error_number),
        message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

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
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status)                      // NOLINT(google-explicit-constructor)
      : v_(status.ok() ? Status(StatusCode::kInternal, "Result built from an OK status") : std::move(status)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return CheckedValue(v_); }
  const T& value() const& { return CheckedValue(v_); }
  T&& value() && { return std::move(CheckedValue(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  template <typename V>
  static auto& CheckedValue(V& v) {
    if (!std::holds_alternative<T>(v)) {
      throw std::logic_error("Result::value() on an error: " + std::get<Status>(v).ToString());
    }
    return std::get<T>(v);
  }

  std::variant<T, Status> v_;
};

#define KVTIER_RETURN_IF_ERROR(expr)       \
  do {                                     \
    ::kvtier::Status _kvtier_s = (expr);   \
    if (!_kvtier_s.ok()) return _kvtier_s; \
  } while (0)

}  // namespace kvtier
