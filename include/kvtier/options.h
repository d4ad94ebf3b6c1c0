// EngineOptions: everything an Engine is configured with. Validate() checks every field and names the bad one.
// OptionSchema() describes every field that can be set by name (type, range, default, documentation): the
// extension's options dict, the vLLM adapter's kvtier_* keys and their table in docs/vllm-integration.md are built
// from it (src/engine/options.cc holds the rows).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

// What the cached KV bytes mean (L1). Two engines share entries only when every field is equal; a storage root
// whose namespace manifest differs is refused, never reused.
struct CacheIdentity {
  std::string model;     // model name
  std::string revision;  // weights revision, or a hash given by the user
  std::string kv_dtype;  // "bfloat16", "float16", "fp8_e4m3", ...
  uint32_t tokens_per_chunk = 0;
  uint32_t blocks_per_chunk = 0;  // GPU blocks per chunk (tokens_per_chunk / tokens per GPU block)
  uint64_t block_bytes = 0;       // bytes of one GPU block as stored: all layers and all TP ranks
  uint32_t tp_size = 1;
  uint32_t pp_size = 1;
  std::string layout_tag = "kvtier-block-major-v1";  // per-block byte order inside the payload
};

enum class IoMode { kAuto, kDirect, kBuffered };  // kAuto: O_DIRECT where the filesystem allows it (I2)
enum class IoBackend { kAuto, kUring, kPosix };   // kAuto: io_uring where the kernel allows it (I3)

inline constexpr uint32_t kMaxReactors = 64;

struct EngineOptions {
  std::string root;  // storage root: an existing, writable directory (L1)
  CacheIdentity identity;

  // Staging pool (S1, S2): pool_bytes / slot size slots, one chunk payload each.
  uint64_t pool_bytes = 1ull << 30;
  uint32_t demand_reserve_slots = 0;  // slots speculative work can never take; 0 picks io_depth
  // DRAM tier (T1): completed slots kept as a cache, at most dram_max_slots of them (0: the whole pool), replaced
  // by dram_policy ("lru" or "arc"). In-use slots (pinned, loading, filling, writing) are never evicted.
  std::string dram_policy = "lru";
  uint32_t dram_max_slots = 0;
  std::string pool_name;      // POSIX shm name; empty: a unique one
  bool pool_populate = true;  // fault the whole pool in at open: memory is committed up front (the pool
                              // is the bound anyway), no page faults on the I/O path, larger DMA segments

  // I/O (I1-I4).
  IoBackend backend = IoBackend::kAuto;
  IoMode io_mode = IoMode::kAuto;
  uint32_t io_depth = 16;  // chunks whose reads/writes are at the disk at once (bounds bytes in
                           // flight); a job holds at most 2 x io_depth slots: io_depth at the disk
                           // while as many more are opened, verified or copied
  // Reactor threads (I1): each drives its own io_uring ring (or POSIX engine) and handles the chunks placed on it
  // (a new chunk goes where its key's unfinished chunks are, else to the reactor with the fewest unfinished chunks),
  // from open through verification and publication, so the per-byte work (verification, checksums,
  // and on devices such as zram or a FUSE client the kernel's copy, which runs in the submitting thread) spreads
  // over cores. io_depth is shared among them (ceil(io_depth / reactors) chunks at the disk each); a job's slot
  // bound (2 x io_depth) holds across all of them. 0: auto, one per core this process may use, at least 2 and at
  // most 16 (the device is not probed). 1: the single-reactor engine. Never more than io_depth, whatever is asked
  // (each reactor keeps at least one chunk at the disk).
  uint32_t reactors = 0;
  // I1: chunks being written at once over all reactors; a write then waits for a place, and the reads behind it in
  // its reactor's queue go first, so that the write-back of new entries cannot hold every place at the disk while a
  // load waits (bench/io/load_under_writeback.py; docs/performance.md, "Loads during the write-back"). 0: half of
  // io_depth, at least 1; io_depth or more: no bound.
  uint32_t max_writes_at_disk = 0;
  // K1/I1: a load reads a chunk's blocks in pieces of about this many bytes (whole blocks, at least one), each
  // reactor keeping 2 x its share of io_depth piece reads at the disk, oldest chunk first (docs/architecture.md,
  // "Reads in pieces"), and verifies each piece as it lands while its bytes are still in the CPU's cache (the last
  // piece once the disk has the next chunk's reads), instead of reading the whole chunk and then checksumming it
  // from memory. 0: one read per chunk.
  uint64_t read_piece_bytes = 1 << 20;
  // I1: a store writes its chunk in pieces of this many bytes (rounded down to 4 KiB, at least 4 KiB), one piece of
  // each chunk at the disk at a time, so writes hold at most max_writes_at_disk pieces' bytes there, whatever the chunk
  // size: a device serves what is queued at it in about the order it came, and a read queued behind whole 64 MiB
  // writes waits for all their bytes (docs/performance.md, "Loads during the write-back"). 0: one write per chunk.
  uint64_t write_piece_bytes = 1 << 20;
  uint32_t posix_threads = 4;
  uint32_t op_timeout_ms = 10000;     // per-operation deadline (I4): a late read becomes a miss
  bool fsync_on_publish = false;      // L4: off by default; a torn entry after power loss fails its checksum
  bool anonymous_temporaries = true;  // L4 via O_TMPFILE + linkat where the filesystem has it (a crash leaves
                                      // nothing); false: named temporaries (create, write, link, unlink)

  // Capacity (C1, C2).
  uint64_t disk_budget_bytes = 0;  // 0: unlimited
  double high_watermark = 0.95;    // evict when usage > high * budget ...
  double low_watermark = 0.85;     // ... down to low * budget

  // Security (K2, K3).
  mode_t dir_mode = 0750;  // files get the same mode without execute bits
  // Open refuses a root that is world-writable without the sticky bit, or owned by a user other than this process's
  // effective user or root: anyone who can write there could plant entries or symlinks. true skips that check.
  bool allow_insecure_root = false;
  // K3: keyed checksums. Empty: off (checksum_kind 1, unkeyed XXH3). Otherwise the secret shared by the trusted
  // instances, either "file:<path>" (the key file's bytes; it must not be readable by others) or the secret itself
  // (at least 16 bytes). Entries are then written with checksum_kind 2 (HMAC-SHA256 of the header, XXH3 of every
  // block under a secret derived from the key); entries written without the secret or with another one fail
  // verification and are misses (K1). docs/file-format.md has the construction.
  std::string checksum_secret;

  // Lookups of keys not in the in-memory index stat the file (entries published by other instances); a miss
  // is remembered this long before the filesystem is asked again.
  uint32_t negative_cache_ms = 1000;
  // M3: on a root several hosts mount (network, cluster, FUSE filesystems; probed at open) a miss is remembered
  // at most this long instead, so a key another host publishes is a hit here within about this bound.
  uint32_t shared_negative_cache_ms = 50;
  // M3: a load that verifies an entry whose modification time is older than this sets it to now (at most one touch
  // per entry per interval), so that the mtime is "last used" on every host: gc and every engine's eviction order
  // by it (least recently used across hosts, not first in first out). 0: never touch.
  uint32_t touch_interval_s = 60;
  uint32_t temp_max_age_s = 600;  // L5: temporaries older than this are swept at open

  std::string trace_path;  // O2: Chrome trace JSON; empty: off

  Status Validate() const;
};

// --- The options schema --------------------------------------------------------------------------------------------

enum class OptionType {
  kString,  // any string; min: the shortest length accepted
  kPath,    // a directory that must exist (a string; min: the shortest length)
  kSecret,  // checksum_secret's rule: "" (off), "file:<path>", or at least 16 bytes
  kChoice,  // one of `choices`
  kBool,
  kCount,     // an unsigned integer in [min, max]
  kBytes,     // a byte count in [min, max] (front ends accept sizes like "512MiB")
  kFraction,  // a real number in [min, max]
  kMode,      // a permission mode (at most 07777) that gives the owner rwx
};

using OptionValue = std::variant<bool, uint64_t, double, std::string>;

struct OptionSpec {
  const char* field;  // the EngineOptions member ("io_depth", "identity.model")
  const char* name;   // its name in options dicts ("io_depth", "model")
  OptionType type;
  double min, max;       // kCount, kBytes, kFraction: the accepted range; kString, kPath: min = shortest length
  const char* choices;   // kChoice: "a|b|c"
  const char* vllm_key;  // the kv_connector_extra_config key offered to vLLM users, or nullptr (not offered)
  const char* doc;
  OptionValue (*get)(const EngineOptions&);
  void (*set)(EngineOptions&, const OptionValue&);  // value of the row's type, already checked
};

// Every settable option, in documentation order.
const std::vector<OptionSpec>& OptionSchema();
// The row of option `name` (its name in options dicts), or nullptr.
const OptionSpec* FindOption(std::string_view name);
// Whether `value` (of the row's type: bool, uint64_t, double or string) is acceptable for the option:
// "option <field>: <why>" (kInvalidArgument) when it is not.
Status CheckOption(const OptionSpec& spec, const OptionValue& value);
// The rules over several options (low_watermark <= high_watermark, ...): Validate() = CheckOption of every row,
// then this.
Status CheckOptionCombinations(const EngineOptions& options);
// CheckOption, then stores the value in *options.
Status SetOption(EngineOptions* options, const OptionSpec& spec, const OptionValue& value);
// The accepted values in words ("1..1024", "lru | arc", "a permission mode with owner rwx").
std::string OptionAccepted(const OptionSpec& spec);
// "bool", "count", "bytes", ...
const char* OptionTypeName(OptionType type);

}  // namespace kvtier
