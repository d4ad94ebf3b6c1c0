// S1: host memory is bounded by the staging pool, whatever the request size. Loads 10x the pool through it and
// compares the process's peak RSS growth (VmHWM, which counts the pool's shared-memory pages) with the pool size.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "kvtier/engine.h"
#include "support/temp_dir.h"
#include "util/tsan.h"

namespace kvtier {
namespace {

uint64_t PeakRssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

TEST(MemoryBound, LoadingTenTimesThePoolKeepsPeakRssAtThePoolSize) {
  test::TempDir dir;
  constexpr uint32_t kBlocks = 16;
  constexpr uint64_t kBlockBytes = 64 * 1024;  // 1 MiB chunks
  constexpr uint64_t kChunk = kBlocks * kBlockBytes;
  constexpr int kPoolSlots = 8;
  constexpr int kChunks = 10 * kPoolSlots;
  EngineOptions o;
  o.root = dir.path();
  o.identity = CacheIdentity{"memory", "1", "bfloat16", 256, kBlocks, kBlockBytes};
  o.pool_bytes = kPoolSlots * (4096 + kChunk);
  o.io_depth = 2;
  const uint64_t at_start = PeakRssBytes();
  auto opened = Engine::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Engine& e = *opened.value();

  // One source and one destination buffer, reused by every chunk: the test's own memory stays constant.
  std::vector<uint8_t> src(kChunk), dst(kChunk);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  // Every chunk holds src's bytes and lands in dst, several at once (one copier lane per reactor).
  KVTIER_BENIGN_RACE(dst.data(), dst.size(), "memory_test: every chunk copies the same bytes into one buffer");
  auto segments = [&](std::vector<uint8_t>& buf) {
    std::vector<CopySegment> s;
    for (uint32_t b = 0; b < kBlocks; ++b) {
      s.push_back({b * e.block_stride(), reinterpret_cast<uint64_t>(buf.data() + b * kBlockBytes), kBlockBytes});
    }
    return s;
  };
  auto key = [](int i) {
    uint8_t b[16] = {static_cast<uint8_t>(i), static_cast<uint8_t>(i >> 8), 0x11};
    return ChunkKey::FromBytes(std::span<const uint8_t>(b, sizeof(b))).value();
  };
  std::vector<ChunkTransfer> stores;
  for (int i = 0; i < kChunks; ++i) stores.push_back({key(i), 0, 0, segments(src)});
  auto sid = e.SubmitStore(std::move(stores));
  ASSERT_TRUE(sid.ok()) << sid.status().ToString();
  auto st = e.Wait(sid.value(), 120000);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(st->all_ok());

  const uint64_t before = PeakRssBytes();
  std::vector<ChunkTransfer> loads;
  for (int i = 0; i < kChunks; ++i) loads.push_back({key(i), 0, 0, segments(dst)});
  auto lid = e.SubmitLoad(std::move(loads));
  ASSERT_TRUE(lid.ok()) << lid.status().ToString();
  auto ld = e.Wait(lid.value(), 120000);
  ASSERT_TRUE(ld.ok());
  ASSERT_TRUE(ld->all_ok());
  EXPECT_EQ(dst, src);
  const uint64_t after = PeakRssBytes();
  const uint64_t loaded = uint64_t(kChunks) * kChunk;
  std::printf("memory bound: loaded %llu MiB through a %llu MiB pool; peak RSS before the engine %llu MiB, "
              "before the load %llu MiB, after %llu MiB; peak slots %llu of %d\n",
              static_cast<unsigned long long>(loaded >> 20), static_cast<unsigned long long>(o.pool_bytes >> 20),
              static_cast<unsigned long long>(at_start >> 20), static_cast<unsigned long long>(before >> 20),
              static_cast<unsigned long long>(after >> 20),
              static_cast<unsigned long long>(e.Stats().pool_peak_slots), kPoolSlots);
  // The pool was faulted in at open (pool_populate), so loading adds nothing proportional to the bytes loaded.
  EXPECT_LT(after - before, o.pool_bytes / 2) << "peak RSS grew with the request, not bounded by the pool";
  // Everything the engine added: the pool, the test's two 1 MiB buffers, and a little for threads and the index.
  // Not under ThreadSanitizer, whose shadow memory for the new mappings counts in RSS (4x the pool there).
#if !defined(__SANITIZE_THREAD__)
  EXPECT_LE(after - at_start, o.pool_bytes + 2 * kChunk + (8u << 20));
#endif
  EXPECT_LE(e.Stats().pool_peak_slots, static_cast<uint64_t>(kPoolSlots));
}

}  // namespace
}  // namespace kvtier
