#include "layout/usage_ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "util/thread.h"

namespace kvtier {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'T', 'L', 'E', 'D', 'G', '1'};
constexpr size_t kRecordBytes = 64;
constexpr const char* kFoldPrefix = ".fold.";

int64_t MonoNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }  // little-endian hosts only (x86-64, aarch64)
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void Encode(uint8_t* b, uint64_t seq, int64_t committed, int64_t reserved, bool closed) {
  std::memset(b, 0, kRecordBytes);
  std::memcpy(b, kMagic, 8);
  Put64(b + 8, seq);
  Put64(b + 16, static_cast<uint64_t>(committed));
  Put64(b + 24, static_cast<uint64_t>(reserved));
  Put64(b + 32, closed ? 1 : 0);
  Put64(b + 40, static_cast<uint64_t>(WallNs()));
  Put64(b + 56, XXH3_64bits(b, 56));
}

bool Decode(const uint8_t* b, ssize_t n, LedgerRecord* r) {
  if (n != static_cast<ssize_t>(kRecordBytes) || std::memcmp(b, kMagic, 8) != 0) return false;
  if (Get64(b + 56) != XXH3_64bits(b, 56)) return false;  // torn or foreign: keep the last good value
  r->sequence = Get64(b + 8);
  r->committed = static_cast<int64_t>(Get64(b + 16));
  r->reserved = static_cast<int64_t>(Get64(b + 24));
  r->closed = (Get64(b + 32) & 1) != 0;
  r->written_unix_ns = static_cast<int64_t>(Get64(b + 40));
  r->valid = true;
  return true;
}

bool ReadRecord(int dirfd, const std::string& name, LedgerRecord* r) {
  // O_DIRECT where the filesystem takes it: client caches otherwise serve another host's record seconds late
  // (GlusterFS: 3 s through an open fd, 1 s through a new open; O_DIRECT: ~1 ms, docs/operations.md).
  int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_DIRECT);
  if (fd < 0 && errno == EINVAL) fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  alignas(4096) static thread_local uint8_t b[4096];
  ssize_t n = pread(fd, b, sizeof(b), 0);
  if (n < 0 && errno == EINVAL) {  // O_DIRECT accepted at open, refused at read: read through the cache
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0) n = pread(fd, b, sizeof(b), 0);
  }
  close(fd);
  r->name = name;
  return Decode(b, n, r);
}

bool WriteRecord(int fd, uint64_t seq, int64_t committed, int64_t reserved, bool closed) {
  uint8_t b[kRecordBytes];
  Encode(b, seq, committed, reserved, closed);
  if (pwrite(fd, b, sizeof(b), 0) != static_cast<ssize_t>(sizeof(b))) return false;
  return fsync(fd) == 0;  // on MooseFS this, not the write, makes the bytes visible to other clients
}

std::string SafeHost(std::string h) {
  if (h.empty()) {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) == 0) h = buf;
  }
  std::string out;
  for (char c : h) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') out += c;
    if (out.size() >= 64) break;
  }
  return out.empty() ? "host" : out;
}

std::string RandomHex() {
  std::random_device rd;
  const uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

bool IsRecordName(const char* n) { return n[0] != '.' && std::strchr(n, '.') != nullptr; }

Result<int> OpenUsageDir(const Namespace& ns, bool create, bool* created) {
  if (created) *created = false;
  if (create) {
    if (mkdirat(ns.dirfd(), UsageLedger::kDirName, ns.dir_mode()) == 0) {
      if (created) *created = true;
      const int fd = openat(ns.dirfd(), UsageLedger::kDirName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) fchmod(fd, ns.dir_mode());  // the umask applied to mkdir; K2 wants the mode exactly
      if (fd < 0) return Status::FromErrno(errno, "open " + ns.path() + "/usage");
      return fd;
    }
    if (errno != EEXIST) return Status::FromErrno(errno, "mkdir " + ns.path() + "/usage");
  }
  const int fd = openat(ns.dirfd(), UsageLedger::kDirName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + ns.path() + "/usage");
  return fd;
}

std::vector<std::string> ListRecords(int dirfd, bool* claims = nullptr) {
  std::vector<std::string> names;
  if (claims) *claims = false;
  const int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return names;
  }
  while (struct dirent* e = readdir(d)) {
    if (IsRecordName(e->d_name)) names.emplace_back(e->d_name);
    if (claims && std::strncmp(e->d_name, kFoldPrefix, std::strlen(kFoldPrefix)) == 0) *claims = true;
  }
  closedir(d);
  return names;
}

}  // namespace

Result<std::unique_ptr<UsageLedger>> UsageLedger::Open(const Namespace& ns, uint64_t scan_bytes,
                                                       const LedgerOptions& options) {
  bool created = false;
  auto dir = OpenUsageDir(ns, /*create=*/true, &created);
  if (!dir.ok()) return dir.status();
  auto l = std::make_unique<UsageLedger>(Passkey{});
  l->dirfd_ = dir.value();
  l->options_ = options;
  l->file_mode_ = ns.file_mode();
  if (!l->CreateOwn()) return Status::FromErrno(errno, "create " + ns.path() + "/usage/" + l->name_);
  // The first engine on the namespace holds the tree; later ones find it in the others' records.
  if (created) l->committed_.store(static_cast<int64_t>(scan_bytes), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(l->mu_);
    l->WriteOwn(false);
    l->ReadPeers(/*relist=*/true);
  }
  l->thread_ = StartThread([p = l.get()] { p->Run(); });
  return l;
}

UsageLedger::~UsageLedger() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_.store(0);
    WriteOwn(/*closed=*/true);  // a live engine folds the committed bytes in (no wait for dead_after_ms)
    close(fd_);
  }
  if (dirfd_ >= 0) close(dirfd_);
}

void UsageLedger::Reserve(uint64_t bytes) {
  reserved_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  changes_.fetch_add(1, std::memory_order_release);
}
void UsageLedger::Commit(uint64_t bytes) {
  committed_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  reserved_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  changes_.fetch_add(1, std::memory_order_release);
}
void UsageLedger::Release(uint64_t bytes) {
  reserved_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  changes_.fetch_add(1, std::memory_order_release);
}
void UsageLedger::Add(int64_t bytes) {
  committed_.fetch_add(bytes, std::memory_order_relaxed);
  changes_.fetch_add(1, std::memory_order_release);
}

uint64_t UsageLedger::Total() const {
  const int64_t t = committed_.load(std::memory_order_relaxed) + reserved_.load(std::memory_order_relaxed) +
                    others_.load(std::memory_order_relaxed);
  return t > 0 ? static_cast<uint64_t>(t) : 0;
}

std::string UsageLedger::name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return name_;
}

void UsageLedger::SyncNow() {
  std::lock_guard<std::mutex> lock(mu_);
  WriteOwn(false);
  ReadPeers(/*relist=*/true);
}

bool UsageLedger::CreateOwn() {
  name_ = SafeHost(options_.host) + "." + std::to_string(getpid()) + "." + RandomHex();
  fd_ = openat(dirfd_, name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode_);
  if (fd_ < 0) return false;
  fchmod(fd_, file_mode_);  // K2: exactly the namespace's mode, whatever the umask
  struct stat st;
  own_ino_ = fstat(fd_, &st) == 0 ? st.st_ino : 0;
  return true;
}

void UsageLedger::ReclaimIfFolded() {
  // A peer that judged this engine dead (no sequence change seen for dead_after_ms: this process was stopped, its
  // host paused, the filesystem stalled) renamed the record away and took the committed bytes last written into it.
  // Writing on into that inode would reach nobody and count those bytes twice (here and in the folder's record):
  // start a new record holding only what changed since. Off by at most the changes of one write interval when the
  // folder read the record before this engine's last write; kvtier gc corrects such drift.
  struct stat st;
  if (own_ino_ == 0) return;
  if (fstatat(dirfd_, name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (st.st_ino == own_ino_) return;  // still ours
  } else if (errno != ENOENT) {
    return;  // the filesystem did not answer (EIO, ESTALE...): not proof that the record was taken
  }
  const std::string old_name = name_;
  const int saved = fd_;
  if (!CreateOwn()) {
    fd_ = saved;  // keep writing where we were; the next write tries again
    name_ = old_name;
    return;
  }
  close(saved);
  committed_.fetch_sub(written_committed_, std::memory_order_relaxed);
  written_committed_ = 0;
  reclaims_.fetch_add(1, std::memory_order_relaxed);
}

void UsageLedger::WriteOwn(bool closed) {
  ReclaimIfFolded();
  const uint64_t changes = changes_.load(std::memory_order_acquire);
  const int64_t committed = committed_.load(std::memory_order_relaxed);
  if (WriteRecord(fd_, ++sequence_, committed, reserved_.load(std::memory_order_relaxed), closed)) {
    written_changes_ = changes;
    written_committed_ = committed;
  }
}

void UsageLedger::ReadPeers(bool relist) {
  const int64_t now = MonoNs();
  // M2: a record is a dead engine's when its sequence did not change for dead_after_ms *while this reader watched*.
  // A reader that was itself not running (stopped, its host paused, blocked in a stalled filesystem call) saw
  // nothing meanwhile: its clocks on the others start again, so it never folds a live engine for its own gap.
  const int64_t gap_ns = last_read_ns_ == 0 ? 0 : now - last_read_ns_;
  if (gap_ns > std::max<int64_t>(1000, 4 * options_.read_interval_ms) * 1000000) {
    for (auto& [name, peer] : peers_) peer.last_change_ns = now;
  }
  last_read_ns_ = now;
  if (relist) {
    peer_names_ = ListRecords(dirfd_);
    peer_names_.erase(std::remove(peer_names_.begin(), peer_names_.end(), name_), peer_names_.end());
    for (auto it = peers_.begin(); it != peers_.end();) {  // folded or removed meanwhile
      it = std::find(peer_names_.begin(), peer_names_.end(), it->first) == peer_names_.end() ? peers_.erase(it)
                                                                                             : std::next(it);
    }
  }
  int64_t others = 0;
  uint32_t live = 1;
  std::vector<std::string> dead;
  for (const std::string& n : peer_names_) {
    LedgerRecord r;
    const bool got = ReadRecord(dirfd_, n, &r);
    Peer& p = peers_[n];
    if (got) {
      if (!p.seen || r.sequence != p.sequence) p.last_change_ns = now;
      p.sequence = r.sequence;
      p.committed = r.committed;
      p.reserved = r.reserved;
      p.closed = r.closed;
      p.seen = true;
    } else if (!p.seen) {
      continue;  // vanished (folded by someone else) or not written yet
    }
    // A record that could not be read this time (vanished, or the filesystem did not answer) counts with its last
    // good values and is not judged: only a record read unchanged for dead_after_ms is a dead engine's.
    const bool is_dead = p.closed || (got && now - p.last_change_ns > options_.dead_after_ms * 1000000);
    others += p.committed + (is_dead ? 0 : p.reserved);
    if (is_dead) {
      dead.push_back(n);
    } else {
      ++live;
    }
  }
  others_.store(others, std::memory_order_relaxed);
  live_.store(live, std::memory_order_relaxed);
  for (const std::string& n : dead) Fold(n);
}

void UsageLedger::Fold(const std::string& peer) {
  // Exactly one live engine wins the rename; the others see the name vanish at their next listing.
  const std::string claim = std::string(kFoldPrefix) + name_ + "." + peer;
  if (renameat(dirfd_, peer.c_str(), dirfd_, claim.c_str()) != 0) {
    peers_.erase(peer);
    peer_names_.erase(std::remove(peer_names_.begin(), peer_names_.end(), peer), peer_names_.end());
    return;
  }
  LedgerRecord r;
  const Peer last = peers_[peer];
  const int64_t committed = ReadRecord(dirfd_, claim, &r) ? r.committed : last.committed;
  // Counted as ours from now on: move it from the others' sum to our own in one step.
  committed_.fetch_add(committed, std::memory_order_relaxed);
  others_.fetch_sub(committed, std::memory_order_relaxed);
  changes_.fetch_add(1, std::memory_order_release);
  peers_.erase(peer);
  peer_names_.erase(std::remove(peer_names_.begin(), peer_names_.end(), peer), peer_names_.end());
  WriteOwn(false);
  unlinkat(dirfd_, claim.c_str(), 0);
}

void UsageLedger::Run() {
  int64_t last_write = MonoNs(), last_read = last_write, last_list = last_write;
  const int64_t tick_ms = std::max<int64_t>(1, std::min(options_.write_interval_ms, options_.read_interval_ms));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, std::chrono::milliseconds(tick_ms), [this] { return stop_; })) return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = MonoNs();
    const bool changed = changes_.load(std::memory_order_acquire) != written_changes_;
    if ((changed && now - last_write >= options_.write_interval_ms * 1000000) ||
        now - last_write >= options_.heartbeat_ms * 1000000) {
      WriteOwn(false);
      last_write = now;
    }
    if (now - last_read >= options_.read_interval_ms * 1000000) {
      const bool relist = now - last_list >= options_.list_interval_ms * 1000000;
      ReadPeers(relist);
      last_read = now;
      if (relist) last_list = now;
    }
  }
}

Result<std::vector<LedgerRecord>> UsageLedger::ReadAll(const Namespace& ns, bool* fold_in_progress) {
  std::vector<LedgerRecord> out;
  if (fold_in_progress) *fold_in_progress = false;
  auto dir = OpenUsageDir(ns, /*create=*/false, nullptr);
  if (!dir.ok()) {
    if (dir.status().error_number() == ENOENT) return out;
    return dir.status();
  }
  for (const std::string& n : ListRecords(dir.value(), fold_in_progress)) {
    LedgerRecord r;
    r.name = n;
    ReadRecord(dir.value(), n, &r);
    out.push_back(r);
  }
  close(dir.value());
  std::sort(out.begin(), out.end(), [](const LedgerRecord& a, const LedgerRecord& b) { return a.name < b.name; });
  return out;
}

Result<std::string> UsageLedger::PublishCorrection(const Namespace& ns, int64_t delta) {
  auto dir = OpenUsageDir(ns, /*create=*/true, nullptr);
  if (!dir.ok()) return dir.status();
  const std::string name = "gc-" + SafeHost("") + "." + std::to_string(getpid()) + "." + RandomHex();
  const int fd = openat(dir.value(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, ns.file_mode());
  if (fd < 0) {
    const int err = errno;
    close(dir.value());
    return Status::FromErrno(err, "create " + ns.path() + "/usage/" + name);
  }
  const bool ok = WriteRecord(fd, 1, delta, 0, /*closed=*/true);
  const int err = errno;
  close(fd);
  close(dir.value());
  if (!ok) return Status::FromErrno(err, "write " + ns.path() + "/usage/" + name);
  return name;
}

}  // namespace kvtier
