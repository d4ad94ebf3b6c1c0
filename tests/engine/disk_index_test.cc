// DiskIndex alone (src/engine/disk_index.h): LRU, pins, the negative cache, pending stores, evictions in flight and
// rescans, over a real namespace directory.
#include "engine/disk_index.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "layout/chunk_path.h"
#include "layout/temp_dir.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint64_t kEntry = 8192;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 16, 15, 0x77); }

class DiskIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ns = Namespace::Open(dir_.path(), testing::TestIdentity());  // the index uses no geometry of it
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::make_unique<Namespace>(std::move(ns.value()));
    DiskIndex::Options o;
    o.entry_bytes = kEntry;
    index_ = std::make_unique<DiskIndex>(*ns_, o, stats_);
  }
  // Writes key i's entry file (kEntry bytes, or `bytes`).
  void WriteEntry(uint64_t i, uint64_t bytes = kEntry) {
    ASSERT_TRUE(EnsureFanoutDir(ns_->dirfd(), Key(i), 0750).ok());
    const int fd = openat(ns_->dirfd(), ChunkRelPath(Key(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0640);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    close(fd);
  }
  std::vector<uint64_t> Keys(const std::vector<DiskIndex::Victim>& victims) {
    std::vector<uint64_t> out;
    for (const auto& v : victims) {
      for (uint64_t i = 0; i < 64; ++i) {
        if (v.key == Key(i)) out.push_back(i);
      }
    }
    return out;
  }

  test::TempDir dir_;
  std::unique_ptr<Namespace> ns_;
  Stats stats_;
  std::unique_ptr<DiskIndex> index_;
};

TEST_F(DiskIndexTest, ALookupOfAnUnknownKeyAsksTheFilesystemAndRemembersTheAnswer) {
  EXPECT_EQ(index_->Lookup(Key(1), 0), DiskIndex::Known::kUnknown);
  uint64_t bytes = 0;
  int64_t mtime = 0;
  EXPECT_FALSE(index_->Probe(Key(1), &bytes, &mtime));
  index_->LearnAbsent(Key(1), /*expires_ns=*/1000);
  EXPECT_EQ(index_->Lookup(Key(1), 999), DiskIndex::Known::kAbsent);
  EXPECT_EQ(index_->Lookup(Key(1), 1000), DiskIndex::Known::kUnknown);  // expired

  WriteEntry(1, kEntry - 1);  // M1: not exactly an entry's size: not an entry
  EXPECT_FALSE(index_->Probe(Key(1), &bytes, &mtime));
  WriteEntry(1);
  ASSERT_TRUE(index_->Probe(Key(1), &bytes, &mtime));
  EXPECT_EQ(bytes, kEntry);
  index_->LearnPresent(Key(1), bytes, mtime);
  EXPECT_EQ(index_->Lookup(Key(1), 0), DiskIndex::Known::kPresent);
  EXPECT_EQ(index_->bytes(), kEntry);
  EXPECT_EQ(stats_.Snapshot().disk_entries, 1u);
  EXPECT_EQ(stats_.Snapshot().disk_bytes_used, kEntry);
}

TEST_F(DiskIndexTest, OnDiskIndexesWhatItFindsAndRemembersAMiss) {
  WriteEntry(2);
  EXPECT_TRUE(index_->OnDisk(Key(2), 0, 100));
  EXPECT_TRUE(index_->Contains(Key(2)));
  EXPECT_FALSE(index_->OnDisk(Key(3), 0, 100));
  WriteEntry(3);
  EXPECT_FALSE(index_->OnDisk(Key(3), 50, 100)) << "the miss is remembered for the negative TTL";
  EXPECT_TRUE(index_->OnDisk(Key(3), 100, 100));
}

TEST_F(DiskIndexTest, PendingStoresArePendingUntilTheirLastChunkEnds) {
  index_->AddPendingStore(Key(4));
  index_->AddPendingStore(Key(4));
  EXPECT_EQ(index_->Lookup(Key(4), 0), DiskIndex::Known::kPending);
  EXPECT_TRUE(index_->ContainsOrPending(Key(4)));
  index_->EndPendingStore(Key(4));
  EXPECT_EQ(index_->Lookup(Key(4), 0), DiskIndex::Known::kPending);
  index_->EndPendingStore(Key(4));
  EXPECT_FALSE(index_->ContainsOrPending(Key(4)));
  index_->LearnAbsent(Key(4), 1000);
  index_->Publish(Key(4), kEntry, 1);  // a publish forgets the remembered miss
  EXPECT_EQ(index_->Lookup(Key(4), 0), DiskIndex::Known::kPresent);
}

TEST_F(DiskIndexTest, EvictionTakesTheLeastRecentlyUsedUnpinnedEntriesAndMarksThemEvicting) {
  for (uint64_t i = 0; i < 6; ++i) index_->Publish(Key(i), kEntry, 1);
  EXPECT_EQ(index_->Lookup(Key(0), 0), DiskIndex::Known::kPresent);  // 0 becomes the most recent
  DiskIndex::PinnedEntry pin = index_->Pin(Key(1));
  ASSERT_TRUE(pin.held());
  auto victims = index_->TakeExcess(3 * kEntry);
  EXPECT_EQ(Keys(victims), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(index_->bytes(), 3 * kEntry);
  EXPECT_EQ(index_->evicting_bytes(), 3 * kEntry);
  EXPECT_EQ(index_->Lookup(Key(2), 0), DiskIndex::Known::kAbsent) << "an unlink in flight is a miss";
  EXPECT_EQ(stats_.Snapshot().evictions, 3u);
  EXPECT_EQ(stats_.Snapshot().evicted_bytes, 3 * kEntry);
  index_->EndEviction(victims[0], /*still_on_disk=*/false);
  index_->EndEviction(victims[1], /*still_on_disk=*/false);
  index_->EndEviction(victims[2], /*still_on_disk=*/true);  // failed unlink: first in line again
  EXPECT_EQ(index_->evicting_bytes(), 0u);
  EXPECT_EQ(index_->Lookup(Key(2), 0), DiskIndex::Known::kUnknown);
  auto next = index_->TakeExcess(kEntry);
  EXPECT_EQ(Keys(next), (std::vector<uint64_t>{4}));
}

TEST_F(DiskIndexTest, APinHoldsItsEntryUntilReleasedOrDestroyedAndAnUnknownKeyPinsNothing) {
  for (uint64_t i = 0; i < 2; ++i) index_->Publish(Key(i), kEntry, 1);
  EXPECT_FALSE(index_->Pin(Key(9)).held()) << "not indexed: nothing to pin";
  {
    DiskIndex::PinnedEntry first = index_->Pin(Key(0));
    DiskIndex::PinnedEntry moved = std::move(first);  // one pin, now held by `moved`
    EXPECT_FALSE(first.held());
    ASSERT_TRUE(moved.held());
    EXPECT_EQ(Keys(index_->TakeExcess(kEntry)), (std::vector<uint64_t>{1})) << "the pinned entry stays";
    EXPECT_TRUE(index_->TakeExcess(kEntry).empty()) << "nothing else can go";
    moved.Release();
    moved.Release();  // a second release unpins nothing more
    DiskIndex::PinnedEntry again = index_->Pin(Key(0));
    ASSERT_TRUE(again.held());
    EXPECT_TRUE(index_->TakeExcess(kEntry).empty());
  }  // `again` is destroyed: unpinned
  EXPECT_EQ(Keys(index_->TakeExcess(kEntry)), (std::vector<uint64_t>{0}));
}

TEST_F(DiskIndexTest, TheWatermarkCountsUnlinksInFlightButDoesNotTakeTheirBytesAgain) {
  for (uint64_t i = 0; i < 10; ++i) index_->Publish(Key(i), kEntry, 1);
  // 10 entries, high 8, low 5: five go.
  auto first = index_->TakeAboveWatermark(index_->bytes(), 8 * kEntry, 5 * kEntry, 0);
  EXPECT_EQ(first.size(), 5u);
  // The shared usage still shows the ten (the unlinks are in flight): nothing more to take.
  EXPECT_TRUE(index_->TakeAboveWatermark(10 * kEntry, 8 * kEntry, 5 * kEntry, 0).empty());
  // Two engines sharing the excess (M2): each takes half of it, plus a byte.
  for (uint64_t i = 10; i < 14; ++i) index_->Publish(Key(i), kEntry, 1);
  for (const auto& v : first) index_->EndEviction(v, false);
  auto shared = index_->TakeAboveWatermark(9 * kEntry, 8 * kEntry, 5 * kEntry, 2);
  EXPECT_EQ(shared.size(), 3u) << "(4 entries over) / 2 + 1 byte: three entries";
}

TEST_F(DiskIndexTest, ARescanAddsWhatTheTreeHoldsAndDropsOnlyOlderUnpinnedEntriesThatAreGone) {
  for (uint64_t i = 0; i < 4; ++i) WriteEntry(i);
  ASSERT_TRUE(index_->Rescan(/*drop_absent=*/false).ok());
  EXPECT_EQ(index_->entries(), 4u);
  DiskIndex::PinnedEntry pin = index_->Pin(Key(0));
  ASSERT_TRUE(pin.held());
  ASSERT_EQ(unlinkat(ns_->dirfd(), ChunkRelPath(Key(0)).c_str(), 0), 0);
  ASSERT_EQ(unlinkat(ns_->dirfd(), ChunkRelPath(Key(1)).c_str(), 0), 0);
  ASSERT_TRUE(index_->Rescan(/*drop_absent=*/false).ok());
  EXPECT_EQ(index_->entries(), 4u) << "a plain merge only adds";
  ASSERT_TRUE(index_->Rescan(/*drop_absent=*/true).ok());
  EXPECT_TRUE(index_->Contains(Key(0))) << "pinned: a load in flight forgets it itself";
  EXPECT_FALSE(index_->Contains(Key(1)));
  EXPECT_EQ(index_->entries(), 3u);
  EXPECT_EQ(stats_.Snapshot().disk_bytes_used, 3 * kEntry);
}

TEST_F(DiskIndexTest, ConcurrentCallersKeepTheBooksBalanced) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (uint64_t n = 0; n < 2000; ++n) {
        const ChunkKey k = Key((n * 4 + t) % 64);
        index_->Publish(k, kEntry, 1);
        index_->Pin(k).Release();  // pinned and unpinned at once (nothing when not indexed)
        index_->Lookup(k, 0);
        for (const auto& v : index_->TakeAboveWatermark(index_->bytes(), 40 * kEntry, 20 * kEntry, 0)) {
          index_->EndEviction(v, false);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(index_->evicting_bytes(), 0u);
  EXPECT_EQ(index_->bytes(), index_->entries() * kEntry);
  EXPECT_LE(index_->entries(), 40u);
}

}  // namespace
}  // namespace kvtier
