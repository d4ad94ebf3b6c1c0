// Helpers shared by the tests under tests/io: scratch directories and bounded op runners. Every wait is bounded.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/io_engine.h"

namespace kvtier::testing {

constexpr int64_t kMs = 1'000'000;

// A fresh directory under base, removed with its contents on destruction; dirfd() is an O_PATH-free O_DIRECTORY fd.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& base = ::testing::TempDir()) {
    std::string templ = base;
    if (templ.empty() || templ.back() != '/') templ += '/';
    templ += "kvtier-io-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) {
      path_ = buf.data();
      dirfd_ = open(path_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    }
  }
  ~ScratchDir() {
    if (dirfd_ >= 0) close(dirfd_);
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  bool ok() const { return dirfd_ >= 0; }
  int dirfd() const { return dirfd_; }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  int dirfd_ = -1;
};

// Submits op, flushes, and reaps until its completion arrives (other completions are appended to *others when
// given). Returns the op's result, or INT64_MIN when Submit failed or nothing came back within timeout_ns.
inline int64_t RunOne(IoEngine& engine, const IoOp& op, int64_t timeout_ns = 5'000 * kMs,
                      std::vector<IoCompletion>* others = nullptr) {
  if (engine.Submit(op) != 0) return INT64_MIN;
  if (engine.Flush() != 0) return INT64_MIN;
  const int64_t give_up = NowNs() + timeout_ns;
  std::vector<IoCompletion> got;
  while (NowNs() < give_up) {
    got.clear();
    int n = engine.Reap(&got, give_up - NowNs());
    if (n < 0) return INT64_MIN;
    int64_t result = INT64_MIN;
    bool found = false;
    for (const IoCompletion& c : got) {
      if (c.user_data == op.user_data && !found) {
        result = c.result;
        found = true;
      } else if (others != nullptr) {
        others->push_back(c);
      }
    }
    if (found) return result;
  }
  return INT64_MIN;
}

// Reaps until `count` completions have been collected or timeout_ns passes.
inline std::vector<IoCompletion> ReapAtLeast(IoEngine& engine, size_t count, int64_t timeout_ns = 5'000 * kMs) {
  std::vector<IoCompletion> got;
  const int64_t give_up = NowNs() + timeout_ns;
  while (got.size() < count && NowNs() < give_up) {
    if (engine.Reap(&got, give_up - NowNs()) < 0) break;
  }
  return got;
}

inline IoOp OpenOp(int dirfd, const char* path, int flags, uint64_t user_data, mode_t mode = 0644) {
  IoOp op;
  op.code = OpCode::kOpenAt;
  op.dirfd = dirfd;
  op.path = path;
  op.flags = flags | O_CLOEXEC;
  op.mode = mode;
  op.user_data = user_data;
  return op;
}

inline IoOp ReadOp(int fd, void* buf, uint32_t len, uint64_t offset, uint64_t user_data) {
  IoOp op;
  op.code = OpCode::kRead;
  op.fd = fd;
  op.buf = buf;
  op.len = len;
  op.offset = offset;
  op.user_data = user_data;
  return op;
}

inline IoOp WriteOp(int fd, const void* buf, uint32_t len, uint64_t offset, uint64_t user_data) {
  IoOp op = ReadOp(fd, const_cast<void*>(buf), len, offset, user_data);
  op.code = OpCode::kWrite;
  return op;
}

inline IoOp FdOp(OpCode code, int fd, uint64_t user_data) {
  IoOp op;
  op.code = code;
  op.fd = fd;
  op.user_data = user_data;
  return op;
}

inline IoOp PathOp(OpCode code, int dirfd, const char* path, const char* path2, uint64_t user_data) {
  IoOp op;
  op.code = code;
  op.dirfd = dirfd;
  op.path = path;
  op.path2 = path2;
  op.user_data = user_data;
  return op;
}

inline bool FileExists(int dirfd, const char* name) {
  struct stat st {};
  return fstatat(dirfd, name, &st, 0) == 0;
}

}  // namespace kvtier::testing
