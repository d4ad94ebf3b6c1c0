// kvtier fsck: verifies every entry of a storage root exactly as a load would (K1), and with --repair removes
// corrupt entries and stale publication temporaries (L5).
//
// Per entry: open without following symlinks, read and decode the header against the namespace fingerprint and the
// key in the file name, check the file size, read every block and verify its checksum. Reads use O_DIRECT where the
// filesystem allows it, so a check of a large cache does not flush the page cache.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "layout/chunk_format.h"
#include "layout/scan.h"
#include "layout/shared_fs.h"
#include "root.h"

namespace kvtier {
namespace {

constexpr uint64_t kReadGroupBytes = 16ull << 20;  // bytes verified per read

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

// Reads exactly len bytes at offset (retrying short reads). Returns bytes read (< len only at end of file), or
// -errno.
int64_t ReadFully(int fd, uint8_t* buf, uint64_t len, uint64_t offset) {
  uint64_t done = 0;
  while (done < len) {
    const ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  return static_cast<int64_t>(done);
}

// kOtherSecret (K3): a whole entry keyed for another checksum secret (or none), in a namespace whose MANIFEST does
// not record its key: not verifiable with this key, never reported corrupt or removed.
enum class Verdict { kOk, kCorrupt, kVanished, kOtherSecret };

struct EntryCheck {
  Verdict verdict = Verdict::kOk;
  std::string reason;
  dev_t dev = 0;
  ino_t ino = 0;
};

class Verifier {
 public:
  explicit Verifier(const ChecksumKey* key) : key_(key) {}
  EntryCheck Check(const Namespace& ns, const std::string& rel, const ChunkKey& key) {
    EntryCheck out;
    int fd = openat(ns.dirfd(), rel.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) fd = openat(ns.dirfd(), rel.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return {Verdict::kVanished, ""};
      return {Verdict::kCorrupt, std::string("cannot open: ") + std::strerror(errno)};
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return {Verdict::kCorrupt, std::string("cannot stat: ") + std::strerror(err)};
    }
    out.dev = st.st_dev;
    out.ino = st.st_ino;
    bool other_secret = false;
    Status s = CheckOpen(ns, fd, key, static_cast<uint64_t>(st.st_size), &other_secret);
    close(fd);
    if (!s.ok()) {
      out.verdict = other_secret ? Verdict::kOtherSecret : Verdict::kCorrupt;
      out.reason = s.message();
    }
    return out;
  }

 private:
  Status CheckOpen(const Namespace& ns, int fd, const ChunkKey& key, uint64_t file_bytes, bool* other_secret) {
    Grow(kHeaderBytes);
    int64_t n = ReadFully(fd, buf_.get(), kHeaderBytes, 0);
    if (n < 0) return Status::FromErrno(static_cast<int>(-n), "read header");
    if (static_cast<uint64_t>(n) < kHeaderBytes) {
      return Status(StatusCode::kCorrupt, "file of " + std::to_string(file_bytes) + " B is shorter than a header");
    }
    const ChunkGeometry geometry = ns.geometry();
    const std::span<const uint8_t> bytes(buf_.get(), kHeaderBytes);
    auto header = DecodeHeader(bytes, ns.fingerprint(), key, &geometry, key_);
    if (!header.ok()) {
      // K3: where the MANIFEST does not record the key, a header refused only for its keying is another secret's.
      *other_secret =
          ns.checksum_key_record().empty() && KeyedForAnotherReader(bytes, ns.fingerprint(), key, &geometry, key_);
      return header.status();
    }
    KVTIER_RETURN_IF_ERROR(CheckFileSize(*header, file_bytes));
    const uint64_t stride = header->block_stride;
    const uint32_t per_group = static_cast<uint32_t>(std::max<uint64_t>(1, kReadGroupBytes / stride));
    for (uint32_t first = 0; first < header->num_blocks; first += per_group) {
      const uint32_t count = std::min(per_group, header->num_blocks - first);
      const uint64_t len = BlockRangeBytes(stride, count);
      Grow(len);
      n = ReadFully(fd, buf_.get(), len, BlockRangeOffset(stride, first));
      if (n < 0) return Status::FromErrno(static_cast<int>(-n), "read block " + std::to_string(first));
      if (static_cast<uint64_t>(n) < len) {
        return Status(StatusCode::kCorrupt, "truncated at block " + std::to_string(first));
      }
      KVTIER_RETURN_IF_ERROR(VerifyBlocks(*header, first, count, buf_.get(), key_));
    }
    return Status::Ok();
  }

  void Grow(uint64_t bytes) {
    if (bytes <= cap_) return;
    const uint64_t cap = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, cap);
    if (p == nullptr) throw CliError("out of memory for a " + FormatSize(cap) + " read buffer");
    buf_.reset(static_cast<uint8_t*>(p));
    cap_ = cap;
  }

  AlignedBuffer buf_;
  uint64_t cap_ = 0;
  const ChecksumKey* key_ = nullptr;  // K3: entries must then be keyed with it
};

struct Found {
  ChunkKey key;
  std::string rel;
  int64_t mtime_ns = 0;
};

struct FsckOptions {
  bool repair = false;
  uint64_t temp_max_age_s = 600;
  bool progress = false;  // a progress bar even when stderr is not a terminal
};

// What fsck found over every namespace.
struct Tally {
  uint64_t entries = 0, corrupt = 0, corrupt_left = 0, temporaries = 0, removed = 0, foreign = 0, young = 0;
  uint64_t other_secret = 0;
};

// K3: verifying a namespace's entries with a key other than the one its MANIFEST records would report (and with
// --repair remove) every good entry. Why this namespace is refused, or empty when its key is the one given.
std::string OtherKeyRefusal(const Namespace& ns, const ChecksumKey* checksum_key) {
  const std::string& have = ns.checksum_key_record();
  if (have.empty() || have == ChecksumKeyRecord(checksum_key)) return "";
  if (have == "none") return "its entries are written without a checksum secret: run fsck without --checksum-secret";
  if (checksum_key != nullptr) {
    return "its entries are keyed with another secret (MANIFEST checksum_key=" + have + ", --checksum-secret gives " +
           ChecksumKeyRecord(checksum_key) + "): give the secret its writers use";
  }
  return "its entries are keyed (MANIFEST checksum_key=" + have +
         "): give --checksum-secret the secret its writers use";
}

// The namespace's entries and temporaries (foreign files are counted and printed); false when the scan failed.
bool ScanNamespace(const RootNamespace& r, const FsckOptions& o, Tally& t, std::vector<Found>& chunks,
                   std::vector<Found>& temps) {
  ProgressBar scan("scanning " + r.dir_name, 0, o.progress);
  Status st = ScanEntries(*r.ns, [&](const EntryInfo& e) {
    scan.Add(1);
    if (e.is_foreign) {
      t.foreign++;
      std::printf("foreign: %s/%s\n", r.dir_name.c_str(), e.rel_path.c_str());
    } else if (e.is_temporary) {
      temps.push_back(Found{ChunkKey(), e.rel_path, e.mtime_ns});
    } else {
      chunks.push_back(Found{e.key, e.rel_path, e.mtime_ns});
    }
  });
  if (st.ok()) return true;
  std::fprintf(stderr, "kvtier: error: scanning %s: %s\n", r.dir_name.c_str(), st.message().c_str());
  return false;
}

// --repair: removes the corrupt entry f, only the file that was verified (a writer may have re-published a good
// entry under the name since). True when it is gone.
bool RemoveCorrupt(const Namespace& ns, const Found& f, const EntryCheck& c) {
  struct stat st;
  if (fstatat(ns.dirfd(), f.rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
  if (st.st_dev != c.dev || st.st_ino != c.ino) return true;  // replaced by a new entry: the corrupt one is gone
  return unlinkat(ns.dirfd(), f.rel.c_str(), 0) == 0 || errno == ENOENT;
}

// Verifies each entry, reporting (and with --repair removing) corrupt ones.
void VerifyEntries(const RootNamespace& r, const FsckOptions& o, Verifier& verifier, bool shared, int64_t now_ns,
                   const std::vector<Found>& chunks, Tally& t) {
  const Namespace& ns = *r.ns;
  ProgressBar progress("verifying " + r.dir_name, chunks.size(), o.progress);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Found& f = chunks[i];
    EntryCheck c = verifier.Check(ns, f.rel, f.key);
    progress.Set(i + 1);
    if (c.verdict == Verdict::kVanished) continue;  // removed concurrently (eviction, gc): not an entry any more
    t.entries++;
    if (c.verdict == Verdict::kOk) continue;
    if (c.verdict == Verdict::kOtherSecret) {
      t.other_secret++;
      std::printf("other secret: %s/%s: %s (kept: the MANIFEST does not record its checksum key)\n", r.dir_name.c_str(),
                  f.rel.c_str(), c.reason.c_str());
      continue;
    }
    if (shared && now_ns - f.mtime_ns < static_cast<int64_t>(o.temp_max_age_s) * 1000000000) {
      // M1: on a filesystem several hosts mount, a young bad entry may be another host's whose data this client
      // cannot see yet: reported and kept, removed once older than --temp-max-age.
      t.young++;
      std::printf("young: %s/%s: %s (kept: on a shared filesystem it may still be arriving)\n", r.dir_name.c_str(),
                  f.rel.c_str(), c.reason.c_str());
      continue;
    }
    t.corrupt++;
    const bool gone = o.repair && RemoveCorrupt(ns, f, c);
    if (!gone) t.corrupt_left++;
    std::printf("corrupt: %s/%s: %s%s\n", r.dir_name.c_str(), f.rel.c_str(), c.reason.c_str(),
                o.repair ? (gone ? " (removed)" : " (NOT removed)") : "");
  }
  progress.Finish();
}

// Reports the temporaries and with --repair sweeps the stale ones; false when the sweep failed.
bool SweepNamespaceTemporaries(const RootNamespace& r, const FsckOptions& o, int64_t now_ns,
                               const std::vector<Found>& temps, Tally& t) {
  for (const Found& tmp : temps) {
    t.temporaries++;
    const int64_t age_s = (now_ns - tmp.mtime_ns) / 1000000000;
    const bool stale = age_s >= static_cast<int64_t>(o.temp_max_age_s);
    std::printf("temporary: %s/%s (%s, %lld s old)\n", r.dir_name.c_str(), tmp.rel.c_str(),
                stale ? "stale" : "young, maybe a live writer's", static_cast<long long>(age_s));
  }
  if (!o.repair || temps.empty()) return true;
  auto sw = SweepTemporaries(*r.ns, std::chrono::seconds(o.temp_max_age_s));
  if (sw.ok()) {
    t.removed += sw->removed;
    return true;
  }
  std::fprintf(stderr, "kvtier: error: sweeping temporaries of %s: %s\n", r.dir_name.c_str(),
               sw.status().message().c_str());
  return false;
}

// Checks one namespace: refuses it when its MANIFEST records another checksum key (K3), else verifies every entry
// (removing corrupt ones with --repair) and reports its temporaries (sweeping stale ones with --repair). Adds to t;
// returns 1 on an error that makes fsck fail, else 0.
int CheckNamespace(const RootNamespace& r, const FsckOptions& o, const ChecksumKey* checksum_key, Verifier& verifier,
                   int64_t now_ns, Tally& t) {
  if (const std::string why = OtherKeyRefusal(*r.ns, checksum_key); !why.empty()) {
    std::printf("error: %s: %s; not checked, nothing removed\n", r.dir_name.c_str(), why.c_str());
    std::fprintf(stderr, "kvtier: error: namespace %s: %s; not checked, nothing removed\n", r.dir_name.c_str(),
                 why.c_str());
    return 1;
  }
  const bool shared = ProbeFilesystem(r.ns->dirfd()).shared;
  std::vector<Found> chunks, temps;
  int rc = ScanNamespace(r, o, t, chunks, temps) ? 0 : 1;
  VerifyEntries(r, o, verifier, shared, now_ns, chunks, t);
  if (!SweepNamespaceTemporaries(r, o, now_ns, temps, t)) rc = 1;
  return rc;
}

// The closing report; returns fsck's exit status from what stays unverified or corrupt.
int PrintSummary(const Tally& t, bool repair) {
  int rc = 0;
  if (repair) {
    std::printf("repair: removed %llu corrupt entr%s and %llu stale temporar%s\n",
                static_cast<unsigned long long>(t.corrupt - t.corrupt_left),
                t.corrupt - t.corrupt_left == 1 ? "y" : "ies", static_cast<unsigned long long>(t.removed),
                t.removed == 1 ? "y" : "ies");
  }
  if (t.other_secret > 0) {
    // K3: not verified, so not certified either: exit 1 (docs/cli.md).
    std::printf(
        "other secret: %llu entr%s keyed for another checksum secret (or none) than --checksum-secret gives, "
        "kept: their namespace's MANIFEST does not record its key\n",
        static_cast<unsigned long long>(t.other_secret), t.other_secret == 1 ? "y" : "ies");
    rc = 1;
  }
  if (t.young > 0) {
    std::printf("young: %llu bad entr%s kept (shared filesystem; removed once older than --temp-max-age)\n",
                static_cast<unsigned long long>(t.young), t.young == 1 ? "y" : "ies");
  }
  std::printf("fsck: %llu entries, %llu corrupt, %llu temporaries (%llu removed), %llu foreign\n",
              static_cast<unsigned long long>(t.entries), static_cast<unsigned long long>(t.corrupt),
              static_cast<unsigned long long>(t.temporaries), static_cast<unsigned long long>(t.removed),
              static_cast<unsigned long long>(t.foreign));
  if (t.corrupt_left > 0) rc = 1;
  return rc;
}

}  // namespace

int RunFsck(int argc, char** argv) {
  CliArgs args("fsck",
               "Verifies every entry under a storage root as a load would: header, namespace fingerprint, key, file\n"
               "size and every block checksum. Reports corrupt entries with the reason, publication temporaries and\n"
               "foreign files. With --repair, removes corrupt entries and temporaries older than --temp-max-age\n"
               "(foreign files are never removed). Exit code 0 when no corrupt entry remains, 1 otherwise.",
               {{"root", "DIR", "storage root", ""},
                {"namespace", "NS", "check only this namespace directory (ns-<16 hex>)", "all"},
                {"repair", "", "remove corrupt entries and stale temporaries", ""},
                {"temp-max-age", "SECONDS", "a temporary older than this is stale (a crashed writer's)", "600"},
                {"checksum-secret", "SECRET",
                 "the engines' checksum_secret (file:<path> or the secret): entries must "
                 "be keyed with it; a namespace whose MANIFEST records another key (or none) is refused, not checked",
                 ""},
                {"allow-insecure-root", "", kAllowInsecureRootHelp, ""},
                {"progress", "", "show a progress bar even when stderr is not a terminal", ""}});
  if (!args.ParseOrHelp(argc, argv)) return 0;
  const std::string root = args.RequiredStr("root");
  FsckOptions o;
  o.repair = args.Has("repair");
  o.temp_max_age_s = args.Uint("temp-max-age", 600);
  o.progress = args.Has("progress");
  // L5 (docs/file-format.md, "Creation"): with --repair, a namespace whose MANIFEST publication was cut is recovered
  // first.
  auto spaces =
      OpenRootNamespaces(root, args.Str("namespace"),
                         RootOpen{args.Has("allow-insecure-root"), o.repair, std::chrono::seconds(o.temp_max_age_s)});

  Tally t;
  int rc = 0;
  std::unique_ptr<ChecksumKey> checksum_key;
  if (args.Has("checksum-secret")) {
    auto k = ChecksumKeyFromOption(args.Str("checksum-secret"));
    if (!k.ok()) throw UsageError("--checksum-secret: " + k.status().message());
    checksum_key = std::make_unique<ChecksumKey>(k.value());
  }
  Verifier verifier(checksum_key.get());
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& r : spaces) {
    // The MANIFEST temporaries a recovery removed; those left are scanned below (or, namespace unopened, here).
    t.temporaries += r.ns ? r.recovery.removed : r.recovery.temporaries;
    t.removed += r.recovery.removed;
    if (r.recovery.recovered) {
      std::printf("recovered: %s/MANIFEST from %s (its publication was cut)\n", r.dir_name.c_str(),
                  r.recovery.from.c_str());
    }
    if (!r.ns) {
      std::printf("error: %s: %s\n", r.dir_name.c_str(), r.error.c_str());
      std::fprintf(stderr, "kvtier: error: namespace %s: %s\n", r.dir_name.c_str(), r.error.c_str());
      rc = 1;
      continue;
    }
    rc |= CheckNamespace(r, o, checksum_key.get(), verifier, now_ns, t);
  }
  rc |= PrintSummary(t, o.repair);
  return rc;
}

}  // namespace kvtier
