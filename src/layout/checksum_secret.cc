// Reading the operator's checksum secret (SPEC K3): the one place that touches the filesystem for it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "layout/chunk_format.h"

namespace kvtier {

Result<ChecksumKey> ChecksumKeyFromOption(const std::string& spec) {
  std::string secret = spec;
  if (spec.rfind("file:", 0) == 0) {
    const std::string path = spec.substr(5);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return Status::FromErrno(errno, "checksum secret: key file " + path);
    struct stat st {};
    const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= 65536;
    secret.clear();
    if (regular) {
      secret.resize(static_cast<size_t>(st.st_size));
      const ssize_t n = read(fd, secret.data(), secret.size());
      secret.resize(n > 0 ? static_cast<size_t>(n) : 0);
    }
    close(fd);
    if (!regular) {
      return Status(StatusCode::kInvalidArgument,
                    "checksum secret: key file " + path + " must be a regular file of at most 64 KiB");
    }
    if (st.st_mode & S_IROTH) {
      return Status(StatusCode::kFailedPrecondition,
                    "checksum secret: key file " + path + " is readable by others; chmod o-r it");
    }
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  }
  return DeriveChecksumKey(secret);
}

}  // namespace kvtier
