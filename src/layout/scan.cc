#include "layout/scan.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "layout/chunk_path.h"

namespace kvtier {
namespace {

bool IsFanoutName(const char* name) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return hex(name[0]) && hex(name[1]) && name[2] == '\0';
}

bool IsDotOrDotDot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Owns a DIR* opened from (parent_fd, name) without following symlinks.
class DirHandle {
 public:
  ~DirHandle() {
    if (dir_ != nullptr) closedir(dir_);
  }
  // 0, or the errno of the failing call.
  int Open(int parent_fd, const char* name) {
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno;
    dir_ = fdopendir(fd);
    if (dir_ == nullptr) {
      int err = errno;
      close(fd);
      return err;
    }
    return 0;
  }
  DIR* get() const { return dir_; }
  int fd() const { return dirfd(dir_); }

 private:
  DIR* dir_ = nullptr;
};

bool IsRealDirectory(int dirfd, const char* name) {
  struct stat st;
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

class Walker {
 public:
  Walker(const Namespace& ns, const std::function<void(const EntryInfo&)>& visit) : ns_(ns), visit_(visit) {
    info_.rel_path.reserve(256);
  }

  Status Run() {
    DirHandle top;
    if (int err = top.Open(ns_.dirfd(), "."); err != 0) return Status::FromErrno(err, "open " + ns_.path());
    errno = 0;
    while (struct dirent* e = readdir(top.get())) {
      const char* name = e->d_name;
      // MANIFEST and usage/ (the per-engine usage records of M2, layout/usage_ledger.h) are kvtier's own.
      const bool usage_dir = std::strcmp(name, "usage") == 0 && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) &&
                             IsRealDirectory(top.fd(), name);
      if (!IsDotOrDotDot(name) && std::strcmp(name, "MANIFEST") != 0 && !usage_dir) {
        if (IsFanoutName(name) && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)) {
          KVTIER_RETURN_IF_ERROR(WalkFirstLevel(top.fd(), name));
        } else {
          KVTIER_RETURN_IF_ERROR(Leaf(top.fd(), "", name, nullptr));
        }
      }
      errno = 0;
    }
    if (errno != 0) return Status::FromErrno(errno, "read " + ns_.path());
    return Status::Ok();
  }

 private:
  Status WalkFirstLevel(int parent_fd, const char* a) {
    DirHandle dir;
    if (int err = dir.Open(parent_fd, a); err != 0) {
      if (err == ENOENT) return Status::Ok();                                      // removed by gc meanwhile
      if (err == ENOTDIR || err == ELOOP) return Leaf(parent_fd, "", a, nullptr);  // a file or symlink
      return Status::FromErrno(err, "open " + ns_.path() + "/" + a);
    }
    char prefix[4] = {a[0], a[1], '/', '\0'};
    errno = 0;
    while (struct dirent* e = readdir(dir.get())) {
      const char* name = e->d_name;
      if (!IsDotOrDotDot(name)) {
        if (IsFanoutName(name) && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)) {
          KVTIER_RETURN_IF_ERROR(WalkSecondLevel(dir.fd(), a, name));
        } else {
          KVTIER_RETURN_IF_ERROR(Leaf(dir.fd(), prefix, name, nullptr));
        }
      }
      errno = 0;
    }
    if (errno != 0) return Status::FromErrno(errno, "read " + ns_.path() + "/" + a);
    return Status::Ok();
  }

  Status WalkSecondLevel(int parent_fd, const char* a, const char* b) {
    char prefix[7] = {a[0], a[1], '/', b[0], b[1], '/', '\0'};
    DirHandle dir;
    if (int err = dir.Open(parent_fd, b); err != 0) {
      if (err == ENOENT) return Status::Ok();
      if (err == ENOTDIR || err == ELOOP) return Leaf(parent_fd, std::string_view(prefix, 3), b, nullptr);
      return Status::FromErrno(err, "open " + ns_.path() + "/" + std::string(prefix, 5));
    }
    std::string_view fanout(prefix, 5);
    errno = 0;
    while (struct dirent* e = readdir(dir.get())) {
      if (!IsDotOrDotDot(e->d_name)) KVTIER_RETURN_IF_ERROR(Leaf(dir.fd(), prefix, e->d_name, &fanout));
      errno = 0;
    }
    if (errno != 0) return Status::FromErrno(errno, "read " + ns_.path() + "/" + std::string(fanout));
    return Status::Ok();
  }

  // Reports one non-descended entry. `fanout` is set only inside a second-level directory, where chunks live.
  Status Leaf(int dir_fd, std::string_view prefix, const char* name, const std::string_view* fanout) {
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return Status::Ok();
      return Status::FromErrno(errno, "stat " + ns_.path() + "/" + std::string(prefix) + name);
    }
    info_.rel_path.assign(prefix);
    info_.rel_path.append(name);
    info_.key = ChunkKey();
    info_.is_temporary = false;
    info_.is_foreign = true;
    info_.size_bytes = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    info_.mtime_ns = MtimeNs(st);
    if (S_ISREG(st.st_mode)) {
      std::string_view n(name);
      if (IsTempFileName(n)) {
        info_.is_temporary = true;
        info_.is_foreign = false;
      } else if (fanout != nullptr && ParseChunkFileName(n, &info_.key)) {
        // A chunk must sit in its own key's fan-out directory; anything else is misplaced (foreign).
        scratch_.clear();
        AppendChunkRelPath(info_.key, &scratch_);
        if (scratch_ == info_.rel_path) {
          info_.is_foreign = false;
        } else {
          info_.key = ChunkKey();
        }
      }
    }
    visit_(info_);
    return Status::Ok();
  }

  const Namespace& ns_;
  const std::function<void(const EntryInfo&)>& visit_;
  EntryInfo info_;
  std::string scratch_;
};

}  // namespace

Status ScanEntries(const Namespace& ns, const std::function<void(const EntryInfo&)>& visit) {
  if (ns.dirfd() < 0) return Status(StatusCode::kFailedPrecondition, "ScanEntries: namespace is not open");
  Walker walker(ns, visit);
  return walker.Run();
}

Result<SweepReport> SweepTemporaries(const Namespace& ns, std::chrono::seconds min_age) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  const int64_t min_age_ns = static_cast<int64_t>(min_age.count()) * 1'000'000'000;
  SweepReport report;
  Status s = ScanEntries(ns, [&](const EntryInfo& e) {
    if (!e.is_temporary) return;
    ++report.temporaries_seen;
    if (now_ns - e.mtime_ns < min_age_ns) {
      ++report.kept_young;
      return;
    }
    if (unlinkat(ns.dirfd(), e.rel_path.c_str(), 0) == 0) {
      ++report.removed;
      report.removed_bytes += e.size_bytes;
    } else if (errno != ENOENT) {
      ++report.remove_failed;
    }
  });
  if (!s.ok()) return s;
  return report;
}

}  // namespace kvtier
