// Paths of chunk files inside a namespace directory (SPEC L2).
//
// Every path is built from the key's lowercase hex only, so it contains nothing but [0-9a-f./] and can never leave
// the namespace directory. Keys are hashes already, so the fan-out uses the hex directly:
//
//   FanoutDir(key)    = "ab/cd"                 first and second byte of the key, as hex (a 1-byte key pads "00")
//   ChunkRelPath(key) = "ab/cd/<hex>.kvc"       256 x 256 directories, so none grows without bound
//   TempRelPath(key)  = "ab/cd/.tmp.<pid>.<counter>.<16 random hex>"   unique per call, same directory (L4)
//
// Thread safety: all functions are thread-safe except FanoutDirCache, which belongs to one thread (the reactor).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/chunk_key.h"
#include "kvtier/status.h"

namespace kvtier {

inline constexpr std::string_view kChunkFileSuffix = ".kvc";
inline constexpr std::string_view kTempPrefix = ".tmp.";

std::string FanoutDir(const ChunkKey& key);
std::string ChunkRelPath(const ChunkKey& key);
// Writes ChunkRelPath(key) into *out, reusing its capacity (for scans and hot paths).
void AppendChunkRelPath(const ChunkKey& key, std::string* out);
std::string TempRelPath(const ChunkKey& key);
// "<pid>.<counter>.<16 random hex>": unique per call within a host, and across hosts sharing a filesystem with
// overwhelming probability (64 random bits drawn once per process).
std::string UniqueTempSuffix();

// Parses a file name (no directory) of exactly the form "<2..128 lowercase hex digits, even count>.kvc" into *key.
// Rejects everything else: temporaries, uppercase, odd length, other suffixes, "..", slashes, NUL.
bool ParseChunkFileName(std::string_view name, ChunkKey* key);
// True when name starts with ".tmp." (a publication temporary, ours or a crashed writer's).
inline bool IsTempFileName(std::string_view name) { return name.substr(0, kTempPrefix.size()) == kTempPrefix; }

// Remembers which fan-out directories this process has already created or verified, so EnsureFanoutDir costs no
// syscall for them. 256 + 65536 bits. Not thread-safe. If a directory is removed behind the cache's back (by gc),
// creating a file in it fails with ENOENT: call Forget(key) (or Clear()) and EnsureFanoutDir again. Eviction and gc
// remove fan-out directories they empty (PruneFanoutDir), so this is an ordinary event, not a rare one.
class FanoutDirCache {
 public:
  bool Has(const ChunkKey& key) const;
  bool HasFirstLevel(uint8_t first_key_byte) const { return first_.test(first_key_byte); }
  void Add(const ChunkKey& key);
  void Forget(const ChunkKey& key);
  void Clear();

 private:
  std::bitset<256> first_;
  std::bitset<65536> second_;
};

// Creates FanoutDir(key) under ns_dirfd (both levels; EEXIST is fine) with exactly `mode` (umask does not apply).
// Existing components must be real directories: a symlink or a file there -> kFailedPrecondition. With a cache,
// a hit returns immediately and a success is recorded.
Status EnsureFanoutDir(int ns_dirfd, const ChunkKey& key, mode_t mode, FanoutDirCache* cache = nullptr);

// C1: removes the fan-out directory `fanout_dir` ("ab/cd") under ns_dirfd if it is empty, then its first level "ab"
// if that is empty now; returns how many it removed (0-2). Eviction and gc call it after removing an entry, so
// fan-out directories do not outlive their entries and hold disk space no budget counts. Nothing is followed: "ab"
// is opened with O_NOFOLLOW and each removal names its last component (rmdir refuses a symlink). A directory with
// anything in it (an entry, a named temporary) stays. A store racing with it finds the directory it created gone
// (ENOENT at mkdir, open or link; EPERM for O_TMPFILE in a directory being removed) and creates it again.
int PruneFanoutDir(int ns_dirfd, std::string_view fanout_dir);

// The entry file of key under ns_dirfd: lstat (fstatat, AT_SYMLINK_NOFOLLOW) into *st; 0, or -errno. Synchronous:
// the disk index's lookups of keys it does not know (callers' threads) and its check whether another host touched
// an entry it is about to evict (M3; a reactor's eviction on a shared root too).
int StatChunk(int ns_dirfd, const ChunkKey& key, struct stat* st);
// Unlinks the entry file of key under ns_dirfd; 0, or -errno (-ENOENT where it is gone already). Synchronous: an
// eviction a caller asks for (Engine::EvictToBudget, on its thread).
int UnlinkChunk(int ns_dirfd, const ChunkKey& key);

// Unlinks ChunkRelPath(key) under ns_dirfd (a reader's response to a corrupt entry, K1; gc's eviction). An entry
// that is already gone is success. Note the name, not the inode, is removed: a good copy republished meanwhile is
// lost too, which only costs a miss.
Status RemoveChunk(int ns_dirfd, const ChunkKey& key);

}  // namespace kvtier
