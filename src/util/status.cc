#include "kvtier/status.h"

#include <cstring>

namespace kvtier {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kCorrupt: return "Corrupt";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kNoSpace: return "NoSpace";
    case StatusCode::kTimedOut: return "TimedOut";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::FromErrno(int error_number, std::string context) {
  StatusCode code = StatusCode::kIoError;
  switch (error_number) {
    case 0: return Status();
    case ENOSPC:
    case EDQUOT: code = StatusCode::kNoSpace; break;
    case ETIMEDOUT:
    case ECANCELED: code = StatusCode::kTimedOut; break;
    case ENOENT: code = StatusCode::kNotFound; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    case EINVAL: code = StatusCode::kInvalidArgument; break;
    case EOPNOTSUPP:
    case ENOSYS: code = StatusCode::kUnsupported; break;
    default: break;
  }
  return Status(code, std::move(context), error_number);
}

std::string Status::ToString() const {
  if (ok()) return "Ok";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  if (errno_ != 0) {
    s += ": ";
    s += std::strerror(errno_);
    s += " (errno " + std::to_string(errno_) + ")";
  }
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_, errno_);
}

}  // namespace kvtier
