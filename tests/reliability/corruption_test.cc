// Corruption suite (SPEC K1, K2): entries damaged on disk in every way we could think of. Every load of a damaged
// entry is a miss that leaves the destination untouched (never other bytes), is counted, and removes the file
// (or, for a non-empty directory planted under the name, leaves it and misses every time); an intact entry loaded
// after each damage is compared byte for byte with what was stored. Runs on io_uring and on the POSIX engine.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>

#include "reliability/reliability_util.h"
#include "support/temp_dir.h"

namespace kvtier::rel {
namespace {

namespace fs = std::filesystem;

void FlipBit(const std::string& path, uint64_t offset, int bit) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, offset), 1);
  b ^= static_cast<uint8_t>(1u << bit);
  ASSERT_EQ(pwrite(fd, &b, 1, offset), 1);
  close(fd);
}

void ZeroRange(const std::string& path, uint64_t offset, uint64_t len) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> z(len, 0);
  ASSERT_EQ(pwrite(fd, z.data(), len, offset), static_cast<ssize_t>(len));
  close(fd);
}

struct Damage {
  std::string name;
  // Damages key `i`'s entry. `partner` is another stored key (for swaps). Returns whether a file is expected to
  // remain at the entry's name afterwards (a non-empty directory cannot be removed).
  std::function<bool(const EngineOptions& o, uint64_t i, uint64_t partner, test::JobEngine& other_ns)> apply;
  bool partner_damaged = false;  // swaps damage the partner too
};

std::vector<Damage> Damages(uint32_t seed) {
  std::vector<Damage> d;
  std::mt19937 rng(seed);
  // Header: one bit in each field region, and random header bits.
  for (uint64_t off : {0ull, 8ull, 12ull, 16ull, 33ull, 40ull, 104ull, 108ull, 112ull, 120ull, 128ull, 136ull, 144ull,
                       2191ull, 2192ull, 3000ull, 4088ull, 4095ull}) {
    d.push_back(
        {"header bit at " + std::to_string(off), [off](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
           FlipBit(ChunkFile(o, Key(i)), off, static_cast<int>(off % 8));
           return false;
         }});
  }
  for (int k = 0; k < 8; ++k) {
    const uint64_t off = std::uniform_int_distribution<uint64_t>(0, 4095)(rng);
    const int bit = std::uniform_int_distribution<int>(0, 7)(rng);
    d.push_back({"random header bit " + std::to_string(off) + "." + std::to_string(bit),
                 [off, bit](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                   FlipBit(ChunkFile(o, Key(i)), off, bit);
                   return false;
                 }});
  }
  // Payload: first and last data byte of every block, and random data bits.
  for (uint32_t b = 0; b < kBlocks; ++b) {
    for (uint64_t in : {uint64_t{0}, kBlockBytes - 1}) {
      const uint64_t off = 4096 + b * 20480ull + in;
      d.push_back({"payload block " + std::to_string(b) + " byte " + std::to_string(in),
                   [off](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                     FlipBit(ChunkFile(o, Key(i)), off, 3);
                     return false;
                   }});
    }
  }
  for (int k = 0; k < 8; ++k) {
    const uint32_t b = std::uniform_int_distribution<uint32_t>(0, kBlocks - 1)(rng);
    const uint64_t off = 4096 + b * 20480ull + std::uniform_int_distribution<uint64_t>(0, kBlockBytes - 1)(rng);
    d.push_back({"random payload bit at " + std::to_string(off),
                 [off](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                   FlipBit(ChunkFile(o, Key(i)), off, 5);
                   return false;
                 }});
  }
  // Sizes.
  for (uint64_t len :
       std::vector<uint64_t>{0, 1, 100, 4095, 4096, 4096 + 20480, kChunkFileBytes - 4096, kChunkFileBytes - 1}) {
    d.push_back(
        {"truncated to " + std::to_string(len), [len](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
           EXPECT_EQ(truncate(ChunkFile(o, Key(i)).c_str(), static_cast<off_t>(len)), 0);
           return false;
         }});
  }
  for (uint64_t extra : {1ull, 4096ull}) {
    d.push_back({"extended by " + std::to_string(extra),
                 [extra](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                   EXPECT_EQ(truncate(ChunkFile(o, Key(i)).c_str(), static_cast<off_t>(kChunkFileBytes + extra)), 0);
                   return false;
                 }});
  }
  // Zero fills.
  d.push_back({"zero-filled", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 ZeroRange(ChunkFile(o, Key(i)), 0, kChunkFileBytes);
                 return false;
               }});
  d.push_back({"zero-filled header", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 ZeroRange(ChunkFile(o, Key(i)), 0, 4096);
                 return false;
               }});
  d.push_back({"zero-filled block 2", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 ZeroRange(ChunkFile(o, Key(i)), 4096 + 2 * 20480, 20480);
                 return false;
               }});
  d.push_back(
      {"zero-filled last 4 KiB (torn tail)", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
         ZeroRange(ChunkFile(o, Key(i)), kChunkFileBytes - 4096, 4096);
         return false;
       }});
  // Files of other entries and other namespaces.
  d.push_back({"swapped with another entry's file",
               [](const EngineOptions& o, uint64_t i, uint64_t j, test::JobEngine&) {
                 const std::string a = ChunkFile(o, Key(i)), b = ChunkFile(o, Key(j)), t = a + ".swap";
                 EXPECT_EQ(rename(a.c_str(), t.c_str()), 0);
                 EXPECT_EQ(rename(b.c_str(), a.c_str()), 0);
                 EXPECT_EQ(rename(t.c_str(), b.c_str()), 0);
                 return false;
               },
               /*partner_damaged=*/true});
  d.push_back(
      {"hard link to another entry's file", [](const EngineOptions& o, uint64_t i, uint64_t j, test::JobEngine&) {
         const std::string a = ChunkFile(o, Key(i));
         EXPECT_EQ(unlink(a.c_str()), 0);
         EXPECT_EQ(link(ChunkFile(o, Key(j)).c_str(), a.c_str()), 0);
         return false;
       }});
  d.push_back({"copied from another namespace (same key)",
               [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine& other) {
                 EXPECT_TRUE(StoreOne(other, i).ok());
                 EngineOptions oo = o;
                 oo.identity.revision = other->options().identity.revision;
                 fs::copy_file(ChunkFile(oo, Key(i)), ChunkFile(o, Key(i)), fs::copy_options::overwrite_existing);
                 return false;
               }});
  // Things that are not regular files.
  d.push_back({"symlink to a valid copy", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 const std::string p = ChunkFile(o, Key(i)), outside = o.root + "/outside-" + std::to_string(i);
                 EXPECT_EQ(rename(p.c_str(), outside.c_str()), 0);
                 EXPECT_EQ(symlink(outside.c_str(), p.c_str()), 0);
                 return false;
               }});
  d.push_back({"fan-out directory replaced by a symlink to a valid copy",
               [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 const std::string dir = NsPath(o) + "/" + FanoutDir(Key(i));
                 const std::string outside = o.root + "/outside-dir-" + std::to_string(i);
                 EXPECT_EQ(rename(dir.c_str(), outside.c_str()), 0);
                 EXPECT_EQ(symlink(outside.c_str(), dir.c_str()), 0);
                 return true;  // the symlink is never followed, so nothing behind it is removed
               }});
  d.push_back({"empty directory", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 const std::string p = ChunkFile(o, Key(i));
                 EXPECT_EQ(unlink(p.c_str()), 0);
                 EXPECT_EQ(mkdir(p.c_str(), 0700), 0);
                 return false;
               }});
  d.push_back({"non-empty directory", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 const std::string p = ChunkFile(o, Key(i));
                 EXPECT_EQ(unlink(p.c_str()), 0);
                 EXPECT_EQ(mkdir(p.c_str(), 0700), 0);
                 FILE* f = fopen((p + "/x").c_str(), "w");
                 if (f) fclose(f);
                 return true;
               }});
  d.push_back({"FIFO (no writer: must not hang)", [](const EngineOptions& o, uint64_t i, uint64_t, test::JobEngine&) {
                 const std::string p = ChunkFile(o, Key(i));
                 EXPECT_EQ(unlink(p.c_str()), 0);
                 EXPECT_EQ(mkfifo(p.c_str(), 0600), 0);
                 return false;
               }});
  return d;
}

class CorruptionSuite : public ::testing::TestWithParam<IoBackend> {};

TEST_P(CorruptionSuite, EveryDamagedEntryIsAMissCountedAndRemovedAndNoOtherBytesAreEverServed) {
  test::TempDir dir;
  EngineOptions o = Options(dir.path());
  o.backend = GetParam();
  o.op_timeout_ms = 2000;
  auto opened = test::OpenWithJobs(o);
  if (!opened.ok() && GetParam() == IoBackend::kUring) GTEST_SKIP() << opened.status().ToString();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  test::JobEngine& e = *opened;
  EngineOptions other_o = Options(dir.path(), "other-namespace");
  other_o.backend = GetParam();
  auto other = test::OpenWithJobs(other_o);
  ASSERT_TRUE(other.ok());

  constexpr uint64_t kControl = 1'000'000;
  ASSERT_TRUE(StoreOne(e, kControl).ok());
  uint64_t tried = 0, misses = 0, removed = 0, served_wrong = 0, control_loads = 0, bytes_compared = 0, corrupt = 0;
  uint64_t next = 0;
  const int rounds = Soak();
  for (int round = 0; round < rounds; ++round) {
    for (const Damage& damage : Damages(static_cast<uint32_t>(round + 1))) {
      SCOPED_TRACE(damage.name);
      const uint64_t i = next++, j = 500'000 + next;
      ASSERT_TRUE(StoreOne(e, i).ok());
      ASSERT_TRUE(StoreOne(e, j).ok());
      // The stores' chunks stay resident (write-through DRAM tier): a fresh engine's loads read the damaged files.
      e.reset();
      auto again = test::OpenWithJobs(o);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      e = std::move(again).value();
      const uint64_t corrupt_before = e->Stats().corrupt_entries;
      const bool remains = damage.apply(o, i, j, other.value());
      ++tried;
      std::vector<uint8_t> got;
      const auto t0 = std::chrono::steady_clock::now();
      Status s = LoadOne(e, Key(i), &got);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "a load hung";
      if (s.ok()) {
        ++served_wrong;  // any damage must be a miss
        ADD_FAILURE() << "a damaged entry was served"
                      << (got == ContentFor(i) ? " (bytes equal)" : " WITH OTHER BYTES");
      } else {
        ++misses;
        EXPECT_TRUE(AllSentinel(got)) << "a miss wrote into the destination";
        if (!AllSentinel(got)) ++served_wrong;
      }
      EXPECT_GT(e->Stats().corrupt_entries, corrupt_before) << s.ToString();
      corrupt += e->Stats().corrupt_entries - corrupt_before;
      if (!remains) {
        EXPECT_FALSE(Exists(ChunkFile(o, Key(i)))) << "the damaged file was not removed: " << s.ToString();
        removed += !Exists(ChunkFile(o, Key(i)));
      }
      // A second load of the same key is a miss as well, and never hangs.
      EXPECT_FALSE(LoadOne(e, Key(i), &got).ok());
      EXPECT_TRUE(AllSentinel(got));
      if (damage.partner_damaged) {
        ++tried;
        Status sp = LoadOne(e, Key(j), &got);
        EXPECT_FALSE(sp.ok());
        if (sp.ok() || !AllSentinel(got)) ++served_wrong;
        misses += !sp.ok();
      } else {
        ASSERT_TRUE(LoadOne(e, Key(j), &got).ok());
        EXPECT_EQ(got, ContentFor(j));
        bytes_compared += got.size();
        ++control_loads;
      }
      // Outside copies behind symlinks are untouched.
      if (Exists(o.root + "/outside-" + std::to_string(i))) {
        EXPECT_EQ(fs::file_size(o.root + "/outside-" + std::to_string(i)), kChunkFileBytes);
      }
      std::vector<uint8_t> control;
      ASSERT_TRUE(LoadOne(e, Key(kControl), &control).ok());
      EXPECT_EQ(control, ContentFor(kControl)) << "an intact entry changed";
      bytes_compared += control.size();
      ++control_loads;
    }
  }
  // The engine still stores and serves after all that.
  ASSERT_TRUE(StoreOne(e, 2'000'000).ok());
  std::vector<uint8_t> got;
  ASSERT_TRUE(LoadOne(e, Key(2'000'000), &got).ok());
  EXPECT_EQ(got, ContentFor(2'000'000));
  EXPECT_EQ(served_wrong, 0u);
  std::printf(
      "corruption suite (%s): %llu damaged files tried (%zu kinds x %d rounds), %llu misses, %llu removed, "
      "%llu corrupt_entries counted, %llu intact loads (%llu bytes compared), served wrong: %llu\n",
      GetParam() == IoBackend::kUring ? "io_uring" : "posix", (unsigned long long)tried, Damages(1).size(), rounds,
      (unsigned long long)misses, (unsigned long long)removed, (unsigned long long)corrupt,
      (unsigned long long)control_loads, (unsigned long long)bytes_compared, (unsigned long long)served_wrong);
}

INSTANTIATE_TEST_SUITE_P(Backends, CorruptionSuite, ::testing::Values(IoBackend::kUring, IoBackend::kPosix),
                         [](const auto& info) { return info.param == IoBackend::kUring ? "Uring" : "Posix"; });

}  // namespace
}  // namespace kvtier::rel
