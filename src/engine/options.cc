// The options schema (include/kvtier/options.h) and EngineOptions::Validate. One row per settable field: adding
// an option is its member in EngineOptions plus one KVTIER_OPTION row here; the extension's options dict, the vLLM
// adapter's kvtier_* keys (python/kvtier/vllm/config.py) and their table in docs/vllm-integration.md follow.
#include "kvtier/options.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>

#include "layout/chunk_format.h"

namespace kvtier {
namespace {

constexpr double kU32Max = std::numeric_limits<uint32_t>::max();
constexpr double kU64Max = static_cast<double>(std::numeric_limits<uint64_t>::max());

const char* IoModeName(IoMode m) {
  switch (m) {
    case IoMode::kDirect: return "direct";
    case IoMode::kBuffered: return "buffered";
    default: return "auto";
  }
}

const char* BackendName(IoBackend b) {
  switch (b) {
    case IoBackend::kUring: return "uring";
    case IoBackend::kPosix: return "posix";
    default: return "auto";
  }
}

// Field <-> OptionValue, by the member's C++ type.
OptionValue ToValue(const std::string& v) { return v; }
OptionValue ToValue(bool v) { return v; }
OptionValue ToValue(double v) { return v; }
OptionValue ToValue(IoMode v) { return std::string(IoModeName(v)); }
OptionValue ToValue(IoBackend v) { return std::string(BackendName(v)); }
template <class T, class = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
OptionValue ToValue(T v) {
  return static_cast<uint64_t>(v);
}

void FromValue(std::string* f, const OptionValue& v) { *f = std::get<std::string>(v); }
void FromValue(bool* f, const OptionValue& v) { *f = std::get<bool>(v); }
void FromValue(double* f, const OptionValue& v) { *f = std::get<double>(v); }
void FromValue(IoMode* f, const OptionValue& v) {
  const std::string& s = std::get<std::string>(v);
  *f = s == "direct" ? IoMode::kDirect : s == "buffered" ? IoMode::kBuffered : IoMode::kAuto;
}
void FromValue(IoBackend* f, const OptionValue& v) {
  const std::string& s = std::get<std::string>(v);
  *f = s == "uring" ? IoBackend::kUring : s == "posix" ? IoBackend::kPosix : IoBackend::kAuto;
}
template <class T, class = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
void FromValue(T* f, const OptionValue& v) {
  *f = static_cast<T>(std::get<uint64_t>(v));
}

constexpr const char* FieldName(const char* field) {
  const char* name = field;
  for (const char* p = field; *p; ++p) {
    if (*p == '.') name = p + 1;
  }
  return name;
}

// One row: the member, its type, range (or shortest length), choices, vLLM key, documentation.
#define KVTIER_OPTION(member, type, min, max, choices, vllm_key, doc)                                                \
  OptionSpec {                                                                                                       \
#member, FieldName(#member), OptionType::type, min, max, choices, vllm_key, doc,                                 \
        [](const EngineOptions& o) { return ToValue(o.member); },                                                    \
                                                               [](EngineOptions & o,                                 \
                                                                  const OptionValue& v) { FromValue(&o.member, v); } \
  }

const std::vector<OptionSpec> kSchema = {
    KVTIER_OPTION(root, kPath, 1, 0, nullptr, "root",
                  "storage root: an existing, writable directory, absolute path (required)"),
    // Cache identity (L1): set by the vLLM adapter from vLLM's configuration, not by users.
    KVTIER_OPTION(identity.model, kString, 1, 0, nullptr, nullptr, "model name in the cache identity"),
    KVTIER_OPTION(identity.revision, kString, 0, 0, nullptr, nullptr, "weights revision in the cache identity"),
    KVTIER_OPTION(identity.kv_dtype, kString, 1, 0, nullptr, nullptr, "KV cache dtype in the cache identity"),
    KVTIER_OPTION(identity.tokens_per_chunk, kCount, 1, kU32Max, nullptr, nullptr, "tokens per chunk (one file)"),
    KVTIER_OPTION(identity.blocks_per_chunk, kCount, 1, kMaxBlocksPerChunk, nullptr, nullptr, "GPU blocks per chunk"),
    KVTIER_OPTION(identity.block_bytes, kCount, 1, 4294967296.0, nullptr, nullptr,
                  "bytes of one GPU block as stored: all layers and all TP ranks"),
    KVTIER_OPTION(identity.tp_size, kCount, 1, kU32Max, nullptr, nullptr, "tensor-parallel size"),
    KVTIER_OPTION(identity.pp_size, kCount, 1, kU32Max, nullptr, nullptr, "pipeline-parallel size"),
    KVTIER_OPTION(identity.layout_tag, kString, 0, 0, nullptr, nullptr, "byte order of a block in the payload"),
    // Staging pool and DRAM tier (S1, S2, T1).
    KVTIER_OPTION(pool_bytes, kBytes, 1, kU64Max, nullptr, "pool_bytes",
                  "staging pool size (shared memory); bounds host memory; the DRAM tier lives in it"),
    KVTIER_OPTION(demand_reserve_slots, kCount, 0, 1 << 20, nullptr, "demand_reserve_slots",
                  "pool slots speculative reads can never take (0: io_depth)"),
    KVTIER_OPTION(dram_policy, kChoice, 0, 0, "lru|arc", "dram_policy", "replacement policy of the DRAM tier (T1)"),
    KVTIER_OPTION(dram_max_slots, kCount, 0, 1 << 20, nullptr, "dram_max_slots",
                  "most pool slots the DRAM tier keeps (0: the whole pool); in-use slots never count as victims, "
                  "unused preloads are bounded apart (half the pool)"),
    KVTIER_OPTION(pool_name, kString, 0, 0, nullptr, nullptr, "POSIX shm name of the pool (empty: a unique one)"),
    KVTIER_OPTION(pool_populate, kBool, 0, 0, nullptr, nullptr, "fault the whole pool in at open"),
    // I/O (I1-I4).
    KVTIER_OPTION(backend, kChoice, 0, 0, "auto|uring|posix", "backend", "I/O engine (auto: io_uring where it works)"),
    KVTIER_OPTION(io_mode, kChoice, 0, 0, "auto|direct|buffered", "io_mode",
                  "O_DIRECT or the page cache (auto: O_DIRECT where the filesystem allows it)"),
    KVTIER_OPTION(io_depth, kCount, 1, 1024, nullptr, "io_depth", "disk operations in flight"),
    KVTIER_OPTION(reactors, kCount, 0, kMaxReactors, nullptr, "reactors",
                  "reactor threads, one ring each, chunks to the least busy (I1); "
                  "0: auto, one per core (2..16, <= io_depth)"),
    KVTIER_OPTION(max_writes_at_disk, kCount, 0, 1024, nullptr, "max_writes_at_disk",
                  "chunks being written at once over all reactors; reads keep the other places (0: io_depth / 2)"),
    KVTIER_OPTION(read_piece_bytes, kBytes, 0, 1073741824.0, nullptr, nullptr,
                  "a load's read size; each piece is verified as it lands (0: the whole chunk)"),
    KVTIER_OPTION(write_piece_bytes, kBytes, 0, 1073741824.0, nullptr, "write_piece_bytes",
                  "a store's write size, one piece of a chunk at the disk at a time (0: the whole chunk)"),
    KVTIER_OPTION(posix_threads, kCount, 1, 256, nullptr, nullptr, "threads of the POSIX I/O backend"),
    KVTIER_OPTION(op_timeout_ms, kCount, 1, 3600000, nullptr, "op_timeout_ms",
                  "per-operation deadline; a late read is a miss"),
    KVTIER_OPTION(fsync_on_publish, kBool, 0, 0, nullptr, "fsync", "fsync each entry before publishing it (L4)"),
    KVTIER_OPTION(anonymous_temporaries, kBool, 0, 0, nullptr, nullptr,
                  "write entries through O_TMPFILE where the filesystem has it (L4)"),
    // Capacity (C1, C2).
    KVTIER_OPTION(disk_budget_bytes, kBytes, 0, kU64Max, nullptr, "disk_budget_bytes",
                  "disk budget of the root (0: unlimited), enforced by LRU eviction"),
    KVTIER_OPTION(high_watermark, kFraction, 0, 1, nullptr, "high_watermark",
                  "evict when usage exceeds this fraction of the budget"),
    KVTIER_OPTION(low_watermark, kFraction, 0, 1, nullptr, "low_watermark",
                  "evict down to this fraction of the budget (0 < low <= high)"),
    // Security (K2, K3).
    KVTIER_OPTION(dir_mode, kMode, 0, 07777, nullptr, "dir_mode",
                  "mode of created directories (files: the same without x bits)"),
    KVTIER_OPTION(allow_insecure_root, kBool, 0, 0, nullptr, "allow_insecure_root",
                  "accept a root or namespace directory (its usage/ and fan-out directories too) that is "
                  "world-writable without the sticky bit, or owned by another user than this process's (or root; in "
                  "the namespace also a user of one of its groups); refused otherwise (K2, docs/reliability.md)"),
    KVTIER_OPTION(checksum_secret, kSecret, 0, 0, nullptr, "checksum_secret",
                  "keyed checksums (K3): 'file:<path>' of a key file that others cannot read (preferred: the secret "
                  "stays out of command lines and logs), or the secret itself (>= 16 bytes); every instance sharing "
                  "the root needs the same one; entries written without it are misses; '' = off"),
    // Lookups and housekeeping.
    KVTIER_OPTION(negative_cache_ms, kCount, 0, 3600000, nullptr, "negative_cache_ms",
                  "how long a miss is remembered before the filesystem is asked again (entries of other instances "
                  "appear after at most this long)"),
    KVTIER_OPTION(shared_negative_cache_ms, kCount, 0, 3600000, nullptr, "shared_negative_cache_ms",
                  "on a root several hosts mount (probed at open), how long a miss is remembered instead (M3: a key "
                  "another host publishes is a hit here within about this bound)"),
    KVTIER_OPTION(touch_interval_s, kCount, 0, kU32Max, nullptr, "touch_interval_s",
                  "a verified load sets an entry's mtime to now when it is older than this, so eviction and gc are "
                  "LRU across hosts (M3); 0: never touch"),
    KVTIER_OPTION(temp_max_age_s, kCount, 0, kU32Max, nullptr, nullptr,
                  "temporaries older than this are swept at open (L5)"),
    KVTIER_OPTION(trace_path, kString, 0, 0, nullptr, "trace_path",
                  "Chrome trace JSON of engine operations ('' = off)"),
};

#undef KVTIER_OPTION

Status Bad(const OptionSpec& s, const std::string& why) {
  return Status(StatusCode::kInvalidArgument, std::string("option ") + s.field + ": " + why);
}

std::string Number(double v) {
  if (v == kU64Max) return "2^64-1";
  if (v == kU32Max) return "2^32-1";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", v);
  }
  return buf;
}

bool IsChoice(const char* choices, const std::string& s) {
  std::string_view rest(choices);
  while (!rest.empty()) {
    const size_t bar = rest.find('|');
    if (rest.substr(0, bar) == s) return true;
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  return false;
}

bool HoldsTypeOf(const OptionSpec& s, const OptionValue& v) {
  switch (s.type) {
    case OptionType::kBool: return std::holds_alternative<bool>(v);
    case OptionType::kCount:
    case OptionType::kBytes:
    case OptionType::kMode: return std::holds_alternative<uint64_t>(v);
    case OptionType::kFraction: return std::holds_alternative<double>(v);
    default: return std::holds_alternative<std::string>(v);
  }
}

}  // namespace

const std::vector<OptionSpec>& OptionSchema() { return kSchema; }

const OptionSpec* FindOption(std::string_view name) {
  for (const OptionSpec& s : kSchema) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

const char* OptionTypeName(OptionType type) {
  switch (type) {
    case OptionType::kString: return "string";
    case OptionType::kPath: return "path";
    case OptionType::kSecret: return "secret";
    case OptionType::kChoice: return "choice";
    case OptionType::kBool: return "bool";
    case OptionType::kCount: return "count";
    case OptionType::kBytes: return "bytes";
    case OptionType::kFraction: return "fraction";
    case OptionType::kMode: return "mode";
  }
  return "?";
}

std::string OptionAccepted(const OptionSpec& s) {
  switch (s.type) {
    case OptionType::kBool: return "true or false";
    case OptionType::kChoice: {
      std::string out;
      for (char c : std::string_view(s.choices)) out += c == '|' ? std::string(" | ") : std::string(1, c);
      return out;
    }
    case OptionType::kCount:
    case OptionType::kBytes:
    case OptionType::kFraction: return Number(s.min) + ".." + Number(s.max);
    case OptionType::kMode:
      return "a permission mode (at most 0777, not world-writable) that gives the owner rwx, e.g. 0750";
    case OptionType::kSecret: return "'' (off), 'file:<path of a key file>', or a secret of at least 16 bytes";
    case OptionType::kString:
    case OptionType::kPath: return s.min > 0 ? "a non-empty string" : "a string";
  }
  return "";
}

Status CheckOption(const OptionSpec& s, const OptionValue& v) {
  if (!HoldsTypeOf(s, v)) return Bad(s, std::string("must be of type ") + OptionTypeName(s.type));
  switch (s.type) {
    case OptionType::kCount:
    case OptionType::kBytes: {
      const double x = static_cast<double>(std::get<uint64_t>(v));
      if (x < s.min || x > s.max) return Bad(s, "must be " + OptionAccepted(s));
      return Status::Ok();
    }
    case OptionType::kFraction: {
      const double x = std::get<double>(v);
      if (!(x >= s.min && x <= s.max)) return Bad(s, "must be " + OptionAccepted(s));
      return Status::Ok();
    }
    case OptionType::kMode: {
      const uint64_t m = std::get<uint64_t>(v);
      if ((m & ~uint64_t{07777}) != 0 || (m & 0700) != 0700) {
        return Bad(s, "must be a permission mode that gives the owner rwx (e.g. 0750, 0770)");
      }
      // K2: what the root check refuses (anyone could plant entries or symlinks) is refused for what kvtier creates
      // too, and no setuid, setgid or sticky bit is given to cache files and directories.
      if ((m & 07000) != 0) return Bad(s, "must not set setuid, setgid or sticky bits (at most 0777, e.g. 0750)");
      if ((m & 0002) != 0) return Bad(s, "must not be world-writable (e.g. 0750, 0770)");
      return Status::Ok();
    }
    case OptionType::kChoice:
      if (!IsChoice(s.choices, std::get<std::string>(v))) {
        return Bad(s, "is '" + std::get<std::string>(v) + "'; accepted: " + OptionAccepted(s));
      }
      return Status::Ok();
    case OptionType::kSecret: {
      const std::string& secret = std::get<std::string>(v);
      if (secret.empty()) return Status::Ok();
      if (secret.rfind("file:", 0) == 0) {
        if (secret.size() == 5) return Bad(s, "\"file:\" must be followed by a key file's path");
      } else if (secret.size() < 16) {
        return Bad(s, "must be at least 16 bytes, or \"file:<path of a key file>\" (empty: off)");
      }
      return Status::Ok();
    }
    case OptionType::kString:
    case OptionType::kPath:
      if (std::get<std::string>(v).size() < s.min) return Bad(s, "must not be empty");
      return Status::Ok();
    case OptionType::kBool: return Status::Ok();
  }
  return Status::Ok();
}

Status SetOption(EngineOptions* options, const OptionSpec& spec, const OptionValue& value) {
  if (Status st = CheckOption(spec, value); !st.ok()) return st;
  spec.set(*options, value);
  return Status::Ok();
}

Status CheckOptionCombinations(const EngineOptions& o) {
  if (!(o.low_watermark > 0 && o.low_watermark <= o.high_watermark)) {
    return Status(StatusCode::kInvalidArgument, "option high_watermark/low_watermark: need 0 < low <= high <= 1");
  }
  return Status::Ok();
}

Status EngineOptions::Validate() const {
  for (const OptionSpec& s : kSchema) {
    if (Status st = CheckOption(s, s.get(*this)); !st.ok()) {
      if (&s == &kSchema.front()) return Bad(s, "must name an existing directory");  // root
      return st;
    }
  }
  return CheckOptionCombinations(*this);
}

}  // namespace kvtier
