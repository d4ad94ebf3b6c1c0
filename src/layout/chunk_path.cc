#include "layout/chunk_path.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace kvtier {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// The first two key bytes; a 1-byte key uses 0 for the second.
void FanoutBytes(const ChunkKey& key, uint8_t* a, uint8_t* b) {
  *a = key.size() > 0 ? key.data()[0] : 0;
  *b = key.size() > 1 ? key.data()[1] : 0;
}

void AppendFanout(const ChunkKey& key, std::string* out) {
  uint8_t a, b;
  FanoutBytes(key, &a, &b);
  char buf[5] = {kHex[a >> 4], kHex[a & 0xf], '/', kHex[b >> 4], kHex[b & 0xf]};
  out->append(buf, 5);
}

uint64_t ProcessRandom() {
  // Drawn once per process; a forked child differs by pid, so (pid, counter, random) stays unique.
  static const uint64_t value = [] {
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != sizeof(v)) {
      v = static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(time(nullptr));
    }
    return v;
  }();
  return value;
}

std::atomic<uint64_t> g_temp_counter{0};

Status MkdirChecked(int dirfd, const char* path, mode_t mode) {
  if (mkdirat(dirfd, path, mode) == 0) {
    // mkdir applies the umask; group-shared deployments need the configured mode exactly (K2).
    int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, std::string("open new directory ") + path);
    int rc = fchmod(fd, mode);
    int err = errno;
    close(fd);
    if (rc != 0) return Status::FromErrno(err, std::string("chmod ") + path);
    return Status::Ok();
  }
  if (errno != EEXIST) return Status::FromErrno(errno, std::string("mkdir ") + path);
  struct stat st;
  if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::FromErrno(errno, std::string("stat ") + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status(StatusCode::kFailedPrecondition,
                  std::string("fan-out path ") + path + " exists but is not a directory (symlink or file)");
  }
  return Status::Ok();
}

}  // namespace

std::string FanoutDir(const ChunkKey& key) {
  std::string out;
  out.reserve(5);
  AppendFanout(key, &out);
  return out;
}

void AppendChunkRelPath(const ChunkKey& key, std::string* out) {
  out->clear();
  AppendFanout(key, out);
  out->push_back('/');
  key.AppendHex(out);
  out->append(kChunkFileSuffix);
}

std::string ChunkRelPath(const ChunkKey& key) {
  std::string out;
  out.reserve(6 + 2 * key.size() + kChunkFileSuffix.size());
  AppendChunkRelPath(key, &out);
  return out;
}

std::string UniqueTempSuffix() {
  uint64_t counter = g_temp_counter.fetch_add(1, std::memory_order_relaxed);
  uint64_t r = ProcessRandom();
  std::string s = std::to_string(getpid()) + "." + std::to_string(counter) + ".";
  for (int i = 15; i >= 0; --i) s.push_back(kHex[(r >> (4 * i)) & 0xf]);
  return s;
}

std::string TempRelPath(const ChunkKey& key) {
  std::string out = FanoutDir(key);
  out.push_back('/');
  out.append(kTempPrefix);
  out.append(UniqueTempSuffix());
  return out;
}

bool ParseChunkFileName(std::string_view name, ChunkKey* key) {
  if (name.size() <= kChunkFileSuffix.size()) return false;
  if (name.substr(name.size() - kChunkFileSuffix.size()) != kChunkFileSuffix) return false;
  std::string_view hex = name.substr(0, name.size() - kChunkFileSuffix.size());
  if (hex.size() < 2 || hex.size() > 2 * ChunkKey::kMaxBytes || hex.size() % 2 != 0) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  auto parsed = ChunkKey::FromHex(hex);
  if (!parsed.ok()) return false;
  *key = parsed.value();
  return true;
}

bool FanoutDirCache::Has(const ChunkKey& key) const {
  uint8_t a, b;
  FanoutBytes(key, &a, &b);
  return second_.test(size_t{a} << 8 | b);
}

void FanoutDirCache::Add(const ChunkKey& key) {
  uint8_t a, b;
  FanoutBytes(key, &a, &b);
  first_.set(a);
  second_.set(size_t{a} << 8 | b);
}

void FanoutDirCache::Forget(const ChunkKey& key) {
  uint8_t a, b;
  FanoutBytes(key, &a, &b);
  // The first level may have gone too; forgetting it costs one extra mkdir at most.
  first_.reset(a);
  second_.reset(size_t{a} << 8 | b);
}

void FanoutDirCache::Clear() {
  first_.reset();
  second_.reset();
}

Status EnsureFanoutDir(int ns_dirfd, const ChunkKey& key, mode_t mode, FanoutDirCache* cache) {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "EnsureFanoutDir: empty key");
  if (cache != nullptr && cache->Has(key)) return Status::Ok();
  std::string dir = FanoutDir(key);  // "ab/cd"
  uint8_t a = key.data()[0];
  if (cache == nullptr || !cache->HasFirstLevel(a)) {
    KVTIER_RETURN_IF_ERROR(MkdirChecked(ns_dirfd, dir.substr(0, 2).c_str(), mode));
  }
  KVTIER_RETURN_IF_ERROR(MkdirChecked(ns_dirfd, dir.c_str(), mode));
  if (cache != nullptr) cache->Add(key);
  return Status::Ok();
}

int PruneFanoutDir(int ns_dirfd, std::string_view fanout_dir) {
  if (fanout_dir.size() != 5 || fanout_dir[2] != '/') return 0;
  const std::string first(fanout_dir.substr(0, 2));
  const std::string second(fanout_dir.substr(3, 2));
  const int fd = openat(ns_dirfd, first.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  const bool removed = unlinkat(fd, second.c_str(), AT_REMOVEDIR) == 0;
  const bool absent = !removed && errno == ENOENT;  // removed by someone else: its parent may be empty still
  close(fd);
  if (!removed && !absent) return 0;
  return (removed ? 1 : 0) + (unlinkat(ns_dirfd, first.c_str(), AT_REMOVEDIR) == 0 ? 1 : 0);
}

int StatChunk(int ns_dirfd, const ChunkKey& key, struct stat* st) {
  return fstatat(ns_dirfd, ChunkRelPath(key).c_str(), st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

int UnlinkChunk(int ns_dirfd, const ChunkKey& key) {
  return unlinkat(ns_dirfd, ChunkRelPath(key).c_str(), 0) == 0 ? 0 : -errno;
}

Status RemoveChunk(int ns_dirfd, const ChunkKey& key) {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "RemoveChunk: empty key");
  std::string rel = ChunkRelPath(key);
  if (unlinkat(ns_dirfd, rel.c_str(), 0) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + rel);
  return Status::Ok();
}

}  // namespace kvtier
