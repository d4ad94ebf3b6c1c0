// Shared helpers of the reliability suites (tests/reliability/): deterministic contents per key, options, and
// store/load round trips. Iteration counts scale with KVTIER_SOAK (default 1: the CI run; e.g. 20 for a soak).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "io/io_engine.h"
#include "kvtier/engine.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "support/engine_options.h"
#include "support/job_engine.h"

namespace kvtier::rel {

constexpr uint32_t kBlocks = 4;
constexpr uint64_t kBlockBytes = 16384 + 100;  // not a multiple of 4096: padded stride
constexpr uint64_t kChunkFileBytes = 4096 + kBlocks * 20480;

inline int Soak() {
  const char* s = getenv("KVTIER_SOAK");
  const int v = s ? atoi(s) : 1;
  return v > 0 ? v : 1;
}

inline ChunkKey Key(uint64_t i, uint8_t tag = 0x3c) {
  uint8_t b[36] = {};
  // Spread keys over fan-out directories, deterministic per i.
  uint64_t h = i * 0x9E3779B97F4A7C15ull + tag;
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(h >> (8 * k));
  for (int k = 0; k < 8; ++k) b[8 + k] = static_cast<uint8_t>(i >> (8 * k));
  b[35] = tag;
  return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
}

// The bytes written for key i by writer w (w = 0: the one content every writer agrees on).
inline std::vector<uint8_t> ContentFor(uint64_t i, uint64_t writer = 0) {
  std::vector<uint8_t> v(kBlocks * kBlockBytes);
  std::mt19937_64 rng(i * 7919 + writer * 104729 + 1);
  for (size_t k = 0; k + 8 <= v.size(); k += 8) {
    uint64_t x = rng();
    std::memcpy(&v[k], &x, 8);
  }
  std::memcpy(v.data(), &writer, 8);  // a reader learns the writer from the first 8 bytes
  std::memcpy(v.data() + 8, &i, 8);
  return v;
}

inline EngineOptions Options(const std::string& root, const std::string& revision = "1") {
  EngineOptions o = test::BaseOptions(root, "reliability", 64, kBlocks, kBlockBytes, revision);
  o.pool_bytes = 32 * kChunkFileBytes;
  o.io_depth = 4;
  o.op_timeout_ms = 5000;
  o.pool_populate = false;
  return o;
}

inline std::vector<CopySegment> Segments(std::vector<uint8_t>& bytes, uint64_t stride) {
  std::vector<CopySegment> s;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    s.push_back({b * stride, reinterpret_cast<uint64_t>(bytes.data() + b * kBlockBytes), kBlockBytes});
  }
  return s;
}

// Stores key i with ContentFor(i, writer) through e's JobClient. Returns the chunk's status (kInternal if the job
// did not finish in 30 s).
inline Status StoreOne(test::JobEngine& e, uint64_t i, uint64_t writer = 0, uint8_t tag = 0x3c) {
  std::vector<uint8_t> data = ContentFor(i, writer);
  auto id = e.jobs->SubmitStore({{Key(i, tag), 0, 0, Segments(data, e->block_stride())}});
  if (!id.ok()) return id.status();
  auto r = e.jobs->Wait(id.value(), 30000);
  if (!r.ok()) return Status(StatusCode::kInternal, "job did not finish: " + r.status().ToString());
  return r->chunks[0].status;
}

// Loads key i into *out (filled with a sentinel first). On a miss *out must still be all sentinel.
inline Status LoadOne(test::JobEngine& e, const ChunkKey& key, std::vector<uint8_t>* out) {
  out->assign(kBlocks * kBlockBytes, 0xEE);
  auto id = e.jobs->SubmitLoad({{key, 0, 0, Segments(*out, e->block_stride())}});
  if (!id.ok()) return id.status();
  auto r = e.jobs->Wait(id.value(), 30000);
  if (!r.ok()) return Status(StatusCode::kInternal, "job did not finish: " + r.status().ToString());
  return r->chunks[0].status;
}

inline bool AllSentinel(const std::vector<uint8_t>& v) {
  for (uint8_t b : v) {
    if (b != 0xEE) return false;
  }
  return true;
}

// "<root>/ns-<hex>" of the options' identity.
inline std::string NsPath(const EngineOptions& o) {
  NamespaceIdentity id;
  id.model = o.identity.model;
  id.revision = o.identity.revision;
  id.kv_dtype = o.identity.kv_dtype;
  id.tokens_per_chunk = o.identity.tokens_per_chunk;
  id.blocks_per_chunk = o.identity.blocks_per_chunk;
  id.block_bytes = o.identity.block_bytes;
  id.tp_size = o.identity.tp_size;
  id.pp_size = o.identity.pp_size;
  id.layout_tag = o.identity.layout_tag;
  return o.root + "/" + NamespaceDirName(id);
}

inline std::string ChunkFile(const EngineOptions& o, const ChunkKey& key) {
  return NsPath(o) + "/" + ChunkRelPath(key);
}

inline bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// An engine over real I/O engines of `backend` (kUring or kPosix), one per reactor, each wrapped by
// wrap(std::unique_ptr<IoEngine>) -> std::unique_ptr<IoEngine> (fault injection, delays, counting).
template <typename Wrap>
Result<std::unique_ptr<Engine>> OpenWithWrappedIo(const EngineOptions& o, IoBackend backend, Wrap wrap) {
  IoEngineConfig cfg;
  cfg.kind = backend == IoBackend::kUring ? IoEngineKind::kUring : IoEngineKind::kPosix;
  cfg.depth = o.io_depth * 4 + 8;
  return EngineImpl::Create(o, [cfg, &wrap](uint32_t) -> std::unique_ptr<IoEngine> {
    auto inner = CreateIoEngine(cfg);
    if (!inner.ok()) return nullptr;  // Create fails: "I/O engine factory gave no engine"
    return wrap(std::move(inner.value()));
  });
}

}  // namespace kvtier::rel
