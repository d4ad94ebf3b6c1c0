#include "layout/namespace.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

#include "layout/chunk_path.h"
#include "layout/manifest_text.h"

namespace kvtier {
namespace {

using internal::Escape;
using internal::Field;
using internal::Fields;
using internal::IsChecksumKeyRecord;
using internal::kMaxManifestBytes;

constexpr char kManifestName[] = "MANIFEST";

// Closes an fd on scope exit unless released.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Status for a failed root check.
Result<int> OpenRoot(const std::string& given) {
  if (given.empty()) return Status(StatusCode::kInvalidArgument, "storage root is empty");
  // "L/" and "L/." would resolve a symlink L before lstat could see it.
  const std::string root = CanonicalRootPath(given);
  struct stat st;
  if (lstat(root.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status(StatusCode::kNotFound, "storage root " + root + " does not exist");
    if (errno == EACCES) {
      return Status(
          StatusCode::kFailedPrecondition,
          "storage root " + root + " is not accessible by this process (uid " + std::to_string(geteuid()) + ")",
          EACCES);
    }
    return Status::FromErrno(errno, "storage root " + root);
  }
  if (S_ISLNK(st.st_mode)) {
    return Status(StatusCode::kFailedPrecondition,
                  "storage root " + root + " is a symbolic link; give its target (kvtier never follows symlinks)");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status(StatusCode::kFailedPrecondition, "storage root " + root + " is not a directory");
  }
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open storage root " + root);
  return fd;
}

bool InOurGroups(gid_t gid) {
  if (gid == getegid()) return true;
  gid_t groups[256];
  const int n = getgroups(256, groups);
  return n > 0 && std::find(groups, groups + n, gid) != groups + n;
}

bool IsFanoutName(std::string_view name) {
  return name.size() == 2 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// K2: the directories directly under dir_fd (path) that kvtier made: fan-out directories ("ab"), and with usage
// also "usage". With deeper (the first level of a namespace), each fan-out directory's own fan-out directories too.
Status CheckSubdirectories(int dir_fd, const std::string& path, bool usage, bool deeper) {
  const int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "read " + path);
  }
  Status verdict;
  errno = 0;
  while (struct dirent* e = readdir(dir)) {
    const std::string_view name = e->d_name;
    const bool fanout = IsFanoutName(name);
    if (!fanout && !(usage && name == "usage")) continue;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) continue;
    const std::string sub = path + "/" + std::string(name);
    verdict = CheckTrustedDirectory(st, (fanout ? "fan-out directory " : "usage directory ") + sub, true);
    if (verdict.ok() && fanout && deeper) {
      const int sub_fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub_fd >= 0) {
        verdict = CheckSubdirectories(sub_fd, sub, /*usage=*/false, /*deeper=*/false);
        close(sub_fd);
      } else if (errno != ENOENT) {  // ENOENT: emptied and removed meanwhile (eviction, gc)
        verdict = Status::FromErrno(errno, "open " + sub);
      }
    }
    if (!verdict.ok()) break;
    errno = 0;
  }
  closedir(dir);
  return verdict;
}

// K2: the namespace directory (fd), its usage/ directory and its first-level fan-out directories; with second_level
// every second-level fan-out directory too.
Status CheckNamespaceDirectories(int ns_fd, const std::string& ns_path, bool second_level = false) {
  struct stat st;
  if (fstat(ns_fd, &st) != 0) return Status::FromErrno(errno, "stat " + ns_path);
  KVTIER_RETURN_IF_ERROR(CheckTrustedDirectory(st, "namespace directory " + ns_path, true));
  return CheckSubdirectories(ns_fd, ns_path, /*usage=*/true, second_level);
}

Status CheckWritable(int dirfd, const std::string& what) {
  if (faccessat(dirfd, ".", W_OK | X_OK, AT_EACCESS) == 0) return Status::Ok();
  int err = errno;
  if (err == EACCES || err == EPERM || err == EROFS) {
    return Status(StatusCode::kFailedPrecondition,
                  what + " is not writable by this process (uid " + std::to_string(geteuid()) + ")", err);
  }
  return Status::FromErrno(err, "access " + what);
}

// Reads MANIFEST (or a temporary of it, `name`); kNotFound when absent.
Result<std::string> ReadManifest(int ns_fd, const std::string& ns_path, const char* name = kManifestName) {
  const std::string path = ns_path + "/" + name;
  int fd = openat(ns_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status(StatusCode::kNotFound, ns_path + " has no " + name, ENOENT);
    if (errno == ELOOP) return Status(StatusCode::kCorrupt, path + " is a symbolic link");
    return Status::FromErrno(errno, "open " + path);
  }
  FdGuard guard(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return Status(StatusCode::kCorrupt, path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    return Status(StatusCode::kCorrupt, path + " is too large");
  }
  std::string text(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

Status WriteAll(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write MANIFEST temporary");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Publishes MANIFEST with the same protocol as chunks: temporary, fsync, link (EEXIST: someone else won).
Status PublishManifest(int ns_fd, const std::string& ns_path, const std::string& text, mode_t file_mode) {
  std::string tmp = std::string(kTempPrefix) + "MANIFEST." + UniqueTempSuffix();
  int fd = openat(ns_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode);
  if (fd < 0) return Status::FromErrno(errno, "create " + ns_path + "/" + tmp);
  Status s = WriteAll(fd, text);
  if (s.ok() && fchmod(fd, file_mode) != 0) s = Status::FromErrno(errno, "chmod MANIFEST temporary");
  if (s.ok() && fsync(fd) != 0) s = Status::FromErrno(errno, "fsync MANIFEST temporary");
  close(fd);
  if (s.ok() && linkat(ns_fd, tmp.c_str(), ns_fd, kManifestName, 0) != 0 && errno != EEXIST) {
    s = Status::FromErrno(errno, "link " + ns_path + "/MANIFEST");
  }
  unlinkat(ns_fd, tmp.c_str(), 0);
  if (s.ok()) fsync(ns_fd);  // best effort: the manifest is re-created if lost
  return s;
}

// K3: the refusal of an opener whose checksum key is not the one the namespace's MANIFEST records.
Status KeyMismatch(const std::string& ns_path, const std::string& have, const std::string& want) {
  std::string why;
  if (have == "none") {
    why =
        "its entries are written without a checksum secret, and this process has one (checksum_secret): open it "
        "without the secret";
  } else if (want == "none") {
    why = "its entries are keyed (checksum_key=" + have +
          " in its MANIFEST), and this process has no checksum secret: "
          "give checksum_secret the secret its writers use";
  } else {
    why = "its entries are keyed with another checksum secret (MANIFEST checksum_key=" + have +
          ", this process's "
          "secret gives " +
          want + "): give checksum_secret the secret its writers use";
  }
  return Status(StatusCode::kFailedPrecondition, "namespace " + ns_path + ": " + why +
                                                     ", or rotate the secret (docs/operations.md, \"Rotating the "
                                                     "checksum secret\"); refusing to open it (nothing was removed)");
}

// Compares a MANIFEST's text with the identity and checksum key record asked for.
Status CompareManifest(const std::string& ns_path, const std::string& text, const NamespaceIdentity& want,
                       const std::string& want_key, std::string* have_key) {
  auto parsed = ParseManifest(text, have_key);
  if (!parsed.ok()) return parsed.status().WithContext(ns_path + "/MANIFEST");
  std::vector<Field> have = Fields(parsed.value());
  std::vector<Field> wanted = Fields(want);
  for (size_t i = 0; i < have.size(); ++i) {
    if (have[i].value != wanted[i].value) {
      return Status(StatusCode::kFailedPrecondition, "namespace " + ns_path + " belongs to another identity: field " +
                                                         have[i].name + " is '" + Escape(have[i].value) +
                                                         "' in its MANIFEST, '" + Escape(wanted[i].value) +
                                                         "' requested (refusing to reuse it)");
    }
  }
  if (text != ManifestText(want, *have_key)) {
    return Status(StatusCode::kCorrupt, ns_path + "/MANIFEST is not in canonical form");
  }
  if (!have_key->empty() && *have_key != want_key) return KeyMismatch(ns_path, *have_key, want_key);
  return Status::Ok();
}

}  // namespace

std::string CanonicalRootPath(std::string_view root) {
  std::string p(root);
  for (;;) {
    if (p.size() > 1 && p.back() == '/') {
      p.pop_back();
    } else if (p.size() >= 2 && p.compare(p.size() - 2, 2, "/.") == 0) {
      p.resize(p.size() - 2);
      if (p.empty()) p.assign(1, '/');  // not p = "/": GCC 12 -Wrestrict false positive (GCC bug 105329)
    } else {
      return p;
    }
  }
}

Status CheckTrustedDirectory(mode_t mode, uid_t uid, gid_t gid, const std::string& what, bool group_shared) {
  if ((mode & S_IWOTH) && !(mode & S_ISVTX)) {
    return Status(StatusCode::kFailedPrecondition,
                  what + " is world-writable without the sticky bit (mode " + std::to_string(mode & 07777) +
                      " decimal): anyone could plant entries; chmod o-w it, or set allow_insecure_root to accept it");
  }
  if (uid != geteuid() && uid != 0 && !(group_shared && InOurGroups(gid))) {
    return Status(StatusCode::kFailedPrecondition,
                  what + " is owned by uid " + std::to_string(uid) +
                      (group_shared ? " and gid " + std::to_string(gid) + ", neither this user (" +
                                          std::to_string(geteuid()) + "), root nor one of its groups"
                                    : ", not by this user (" + std::to_string(geteuid()) + ") or root") +
                      "; chown it, or set allow_insecure_root to accept it");
  }
  return Status::Ok();
}

Namespace::Namespace(Namespace&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      dir_name_(std::move(other.dir_name_)),
      id_(std::move(other.id_)),
      fingerprint_(other.fingerprint_),
      checksum_key_(std::move(other.checksum_key_)),
      dir_mode_(other.dir_mode_) {}

Namespace& Namespace::operator=(Namespace&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    dir_name_ = std::move(other.dir_name_);
    id_ = std::move(other.id_);
    fingerprint_ = other.fingerprint_;
    checksum_key_ = std::move(other.checksum_key_);
    dir_mode_ = other.dir_mode_;
  }
  return *this;
}

Namespace::~Namespace() {
  if (fd_ >= 0) close(fd_);
}

Result<Namespace> Namespace::Open(const std::string& root, const NamespaceIdentity& id,
                                  const NamespaceOpenOptions& options) {
  KVTIER_RETURN_IF_ERROR(ValidateIdentity(id));
  if (!IsChecksumKeyRecord(options.checksum_key)) {
    return Status(StatusCode::kInvalidArgument, "namespace checksum_key '" + options.checksum_key + "' is invalid");
  }
  if ((options.dir_mode & ~mode_t{07777}) != 0 || (options.dir_mode & 0700) != 0700) {
    return Status(StatusCode::kInvalidArgument, "namespace dir_mode must include owner rwx (0700)");
  }
  auto root_fd = OpenRoot(root);
  if (!root_fd.ok()) return root_fd.status();
  FdGuard root_guard(root_fd.value());

  Namespace ns;
  ns.dir_name_ = NamespaceDirName(id);
  ns.path_ = CanonicalRootPath(root) + (CanonicalRootPath(root) == "/" ? "" : "/") + ns.dir_name_;
  ns.id_ = id;
  ns.fingerprint_ = FingerprintBytes(id);
  ns.dir_mode_ = options.dir_mode & 07777;

  const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(root_guard.get(), ns.dir_name_.c_str(), flags);
  if (fd < 0 && errno == ENOENT) {
    if (!options.create) return Status(StatusCode::kNotFound, "namespace " + ns.path_ + " does not exist");
    KVTIER_RETURN_IF_ERROR(CheckWritable(root_guard.get(), "storage root " + root));
    // EEXIST: another process created it first, which is fine.
    if (mkdirat(root_guard.get(), ns.dir_name_.c_str(), ns.dir_mode_) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "create namespace directory " + ns.path_);
    }
    fd = openat(root_guard.get(), ns.dir_name_.c_str(), flags);
  }
  if (fd < 0) {
    if (errno == ENOTDIR || errno == ELOOP) {
      return Status(StatusCode::kFailedPrecondition, ns.path_ + " exists but is not a directory (or is a symlink)",
                    errno);
    }
    return Status::FromErrno(errno, "open namespace directory " + ns.path_);
  }
  ns.fd_ = fd;
  if (!options.allow_insecure) KVTIER_RETURN_IF_ERROR(CheckNamespaceDirectories(ns.fd_, ns.path_));
  if (options.create) KVTIER_RETURN_IF_ERROR(CheckWritable(ns.fd_, "namespace directory " + ns.path_));

  std::string want = ManifestText(id, options.checksum_key);
  auto text = ReadManifest(ns.fd_, ns.path_);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) {
    if (!options.create) {
      return Status(StatusCode::kNotFound,
                    ns.path_ + " has no MANIFEST (being created by another process, or left by a crash)");
    }
    // The directory may be ours (fresh) or a crashed creator's; either way set the configured mode once.
    struct stat st;
    if (fstat(ns.fd_, &st) == 0 && (st.st_mode & 07777) != ns.dir_mode_ && st.st_uid == geteuid()) {
      fchmod(ns.fd_, ns.dir_mode_);
    }
    KVTIER_RETURN_IF_ERROR(PublishManifest(ns.fd_, ns.path_, want, ns.file_mode()));
    text = ReadManifest(ns.fd_, ns.path_);  // first writer wins: compare with whatever is there now
  }
  if (!text.ok()) return text.status();
  KVTIER_RETURN_IF_ERROR(CompareManifest(ns.path_, text.value(), id, options.checksum_key, &ns.checksum_key_));
  return ns;
}

// The directory ns_dir_name of root, opened without following a symlink; *path gets its path. kInvalidArgument: not
// a namespace directory name; kNotFound: absent; kFailedPrecondition: not a directory, or a symlink.
static Result<int> OpenNamespaceDir(const std::string& root, const std::string& ns_dir_name, std::string* path) {
  if (!IsNamespaceDirName(ns_dir_name)) {
    return Status(StatusCode::kInvalidArgument,
                  "'" + ns_dir_name + "' is not a namespace directory name (ns-<16 hex digits>)");
  }
  auto root_fd = OpenRoot(root);
  if (!root_fd.ok()) return root_fd.status();
  FdGuard root_guard(root_fd.value());
  const std::string canonical = CanonicalRootPath(root);
  *path = canonical + (canonical == "/" ? "" : "/") + ns_dir_name;
  const int fd = openat(root_guard.get(), ns_dir_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return fd;
  if (errno == ENOENT) return Status(StatusCode::kNotFound, "namespace " + *path + " does not exist");
  if (errno == ENOTDIR || errno == ELOOP) {
    return Status(StatusCode::kFailedPrecondition, *path + " is not a directory (or is a symlink)", errno);
  }
  return Status::FromErrno(errno, "open namespace directory " + *path);
}

Result<Namespace> Namespace::OpenExisting(const std::string& root, const std::string& ns_dir_name) {
  Namespace ns;
  ns.dir_name_ = ns_dir_name;
  auto fd = OpenNamespaceDir(root, ns_dir_name, &ns.path_);
  if (!fd.ok()) return fd.status();
  ns.fd_ = fd.value();
  auto text = ReadManifest(ns.fd_, ns.path_);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return Status(StatusCode::kCorrupt, text.status().message());
    return text.status();
  }
  auto parsed = ParseManifest(text.value(), &ns.checksum_key_);
  if (!parsed.ok()) return parsed.status().WithContext(ns.path_ + "/MANIFEST");
  if (parsed->format_version != kFormatVersion) {
    return Status(StatusCode::kFailedPrecondition, ns.path_ + " uses format version " +
                                                       std::to_string(parsed->format_version) + "; this build reads " +
                                                       std::to_string(kFormatVersion));
  }
  Status valid = ValidateIdentity(parsed.value());
  if (!valid.ok()) return Status(StatusCode::kCorrupt, ns.path_ + "/MANIFEST: " + valid.message());
  if (text.value() != ManifestText(parsed.value(), ns.checksum_key_)) {
    return Status(StatusCode::kCorrupt, ns.path_ + "/MANIFEST is not in canonical form");
  }
  if (NamespaceDirName(parsed.value()) != ns_dir_name) {
    return Status(StatusCode::kCorrupt, ns.path_ + "/MANIFEST does not hash to the directory's name (it hashes to " +
                                            NamespaceDirName(parsed.value()) + ")");
  }
  ns.id_ = std::move(parsed).value();
  ns.fingerprint_ = FingerprintBytes(ns.id_);
  struct stat st;
  if (fstat(ns.fd_, &st) == 0) ns.dir_mode_ = st.st_mode & 07777;
  return ns;
}

Result<ManifestRecovery> RecoverManifest(const std::string& root, const std::string& ns_dir_name,
                                         std::chrono::seconds min_age, bool apply) {
  std::string ns_path;
  auto opened = OpenNamespaceDir(root, ns_dir_name, &ns_path);
  if (!opened.ok()) return opened.status();
  const int ns_fd = opened.value();
  FdGuard ns_guard(ns_fd);
  ManifestRecovery out;
  struct stat st;
  if (fstatat(ns_fd, kManifestName, &st, AT_SYMLINK_NOFOLLOW) == 0) return out;  // published: nothing to recover
  if (errno != ENOENT) return Status::FromErrno(errno, "stat " + ns_path + "/MANIFEST");
  std::vector<std::string> temps;
  {
    const int fd = openat(ns_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* dir = fd < 0 ? nullptr : fdopendir(fd);
    if (dir == nullptr) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return Status::FromErrno(err, "read " + ns_path);
    }
    while (struct dirent* e = readdir(dir)) {
      if (std::string_view(e->d_name).rfind(".tmp.MANIFEST.", 0) == 0) temps.emplace_back(e->d_name);
    }
    closedir(dir);
  }
  std::sort(temps.begin(), temps.end());
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  for (const std::string& name : temps) {
    if (fstatat(ns_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    out.temporaries++;
    out.temporary_bytes += static_cast<uint64_t>(st.st_size);
    // Whole: the complete text of an identity that hashes to this directory (what its creator was publishing).
    bool whole = false;
    if (auto text = ReadManifest(ns_fd, ns_path, name.c_str()); text.ok()) {
      std::string key;
      auto id = ParseManifest(text.value(), &key);
      whole = id.ok() && ValidateIdentity(id.value()).ok() && text.value() == ManifestText(id.value(), key) &&
              NamespaceDirName(id.value()) == ns_dir_name;
    }
    if (whole && !out.recoverable) {
      out.recoverable = true;
      out.from = name;
      if (apply && (linkat(ns_fd, name.c_str(), ns_fd, kManifestName, 0) == 0 || errno == EEXIST)) {
        out.recovered = true;
        fsync(ns_fd);  // best effort, as at creation
      }
    }
    const auto age = now - std::chrono::nanoseconds(int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
    // A young temporary may be a live creator's, which links it next: never take it from under it.
    if (apply && age >= min_age && (!whole || out.recovered) &&
        (unlinkat(ns_fd, name.c_str(), 0) == 0 || errno == ENOENT)) {
      out.removed++;
      out.removed_bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  return out;
}

Status CheckNamespaceTree(const std::string& root, const std::string& ns_dir_name) {
  std::string ns_path;
  auto opened = OpenNamespaceDir(root, ns_dir_name, &ns_path);
  if (!opened.ok()) return opened.status();
  FdGuard ns_guard(opened.value());
  return CheckNamespaceDirectories(ns_guard.get(), ns_path, /*second_level=*/true);
}

Result<std::vector<std::string>> ListNamespaces(const std::string& root) {
  auto root_fd = OpenRoot(root);
  if (!root_fd.ok()) return root_fd.status();
  DIR* dir = fdopendir(root_fd.value());
  if (dir == nullptr) {
    int err = errno;
    close(root_fd.value());
    return Status::FromErrno(err, "read storage root " + root);
  }
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = readdir(dir)) {
    std::string_view name = e->d_name;
    if (!IsNamespaceDirName(name)) continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir = fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) names.emplace_back(name);
    errno = 0;
  }
  int err = errno;
  closedir(dir);
  if (err != 0) return Status::FromErrno(err, "read storage root " + root);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kvtier
