// DiskBudget alone (src/engine/disk_budget.h): the usage two budgets on one namespace share, the watermarks, the
// unlinks' books and the maintenance thread's rescan, over a real namespace directory and a real host counter.
#include "engine/disk_budget.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "layout/chunk_path.h"
#include "layout/temp_dir.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint64_t kEntry = 8192;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 16, 15, 0x5b); }

// One engine's books: its index and its budget over the shared namespace directory.
struct Books {
  Stats stats;
  std::unique_ptr<DiskIndex> index;
  std::unique_ptr<DiskBudget> budget;
};

class DiskBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ns = Namespace::Open(dir_.path(), testing::TestIdentity());
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::make_unique<Namespace>(std::move(ns.value()));
  }
  // An engine's books with a budget of `entries` entries (0: none), watermarks 0.8 and 0.5, after a scan of the tree.
  std::unique_ptr<Books> Open(uint64_t entries) {
    auto b = std::make_unique<Books>();
    DiskIndex::Options io;
    io.entry_bytes = kEntry;
    b->index = std::make_unique<DiskIndex>(*ns_, io, b->stats);
    EXPECT_TRUE(b->index->Rescan(false).ok());
    DiskBudget::Options o;
    o.budget_bytes = entries * kEntry;
    o.high_watermark = 0.8;
    o.low_watermark = 0.5;
    b->budget = std::make_unique<DiskBudget>(*ns_, *b->index, o);
    return b;
  }
  void WriteEntry(uint64_t i) {
    ASSERT_TRUE(EnsureFanoutDir(ns_->dirfd(), Key(i), 0750).ok());
    const int fd = openat(ns_->dirfd(), ChunkRelPath(Key(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0640);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kEntry)), 0);
    close(fd);
  }
  // Writes entry i and books it as a store of `b` does (publish, then the usage).
  void Store(Books& b, uint64_t i) {
    WriteEntry(i);
    b.index->Publish(Key(i), kEntry, 1);
    b.budget->Add(static_cast<int64_t>(kEntry));
  }
  bool OnDisk(uint64_t i) { return faccessat(ns_->dirfd(), ChunkRelPath(Key(i)).c_str(), F_OK, 0) == 0; }

  test::TempDir dir_;
  std::unique_ptr<Namespace> ns_;
};

TEST_F(DiskBudgetTest, EnginesOnOneNamespaceShareOneUsageSetFromTheFirstScan) {
  for (uint64_t i = 0; i < 3; ++i) WriteEntry(i);
  auto a = Open(0);
  EXPECT_TRUE(a->budget->shared());
  EXPECT_EQ(a->budget->Usage(), 3 * kEntry) << "the first holder sets the counter from its scan";
  EXPECT_EQ(a->budget->Describe(), "this host's counter");
  auto b = Open(0);
  Store(*b, 3);
  EXPECT_EQ(a->budget->Usage(), 4 * kEntry) << "another engine's store counts in this one's usage";
  b->budget->Reserve(kEntry);
  EXPECT_EQ(a->budget->Usage(), 5 * kEntry) << "a reservation counts from the first write on";
  b->budget->Release(kEntry);
  EXPECT_EQ(a->budget->Usage(), 4 * kEntry);
  b->budget->Reserve(kEntry);
  b->budget->CommitReserved(kEntry);
  EXPECT_EQ(a->budget->Usage(), 5 * kEntry) << "a committed reservation is counted once";
}

TEST_F(DiskBudgetTest, WithoutABudgetNothingIsEverTaken) {
  auto a = Open(0);
  for (uint64_t i = 0; i < 20; ++i) Store(*a, i);
  EXPECT_FALSE(a->budget->has_budget());
  EXPECT_TRUE(a->budget->TakeAboveHighWatermark().empty());
  EXPECT_TRUE(a->budget->TakeDownToLowWatermark().empty());
  EXPECT_EQ(a->index->entries(), 20u);
}

TEST_F(DiskBudgetTest, AboveTheHighWatermarkTheLeastRecentGoDownToTheLowOneCountingUnlinksInFlight) {
  auto a = Open(10);  // high 8 entries, low 5
  for (uint64_t i = 0; i < 8; ++i) Store(*a, i);
  EXPECT_TRUE(a->budget->TakeAboveHighWatermark().empty()) << "at the high watermark, not above it";
  Store(*a, 8);
  auto victims = a->budget->TakeAboveHighWatermark();
  ASSERT_EQ(victims.size(), 4u) << "9 entries down to 5";
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(victims[i].key, Key(i)) << "least recent first";
  Store(*a, 9);
  auto more = a->budget->TakeAboveHighWatermark();
  ASSERT_EQ(more.size(), 1u) << "10 on disk, 4 of them being unlinked: the 6 that stay go down to 5, not 10";
  EXPECT_EQ(more[0].key, Key(4));
  victims.push_back(more[0]);
  // The unlinks come back: four removed the file, one failed and stays in the index for a later eviction.
  for (uint64_t i = 0; i < 5; ++i) {
    if (i == 3) continue;
    ASSERT_EQ(unlinkat(ns_->dirfd(), ChunkRelPath(Key(i)).c_str(), 0), 0);
    a->budget->Unlinked(victims[i], 0);
  }
  a->budget->Unlinked(victims[3], -EIO);
  EXPECT_EQ(a->budget->Usage(), 6 * kEntry);
  EXPECT_TRUE(a->index->Contains(Key(3))) << "a failed unlink puts the entry back";
  EXPECT_EQ(a->index->evicting_bytes(), 0u);
}

TEST_F(DiskBudgetTest, AnUnlinkThatFoundNothingLeavesTheUsageAlone) {
  auto a = Open(10);
  for (uint64_t i = 0; i < 9; ++i) Store(*a, i);
  auto victims = a->budget->TakeAboveHighWatermark();
  ASSERT_FALSE(victims.empty());
  ASSERT_EQ(unlinkat(ns_->dirfd(), ChunkRelPath(victims[0].key).c_str(), 0), 0);  // gc got there first
  a->budget->Unlinked(victims[0], -ENOENT);
  EXPECT_EQ(a->budget->Usage(), 9 * kEntry) << "whoever removed it accounts for it";
  EXPECT_FALSE(a->index->Contains(victims[0].key));
}

TEST_F(DiskBudgetTest, EvictToBudgetUnlinksDownToTheLowWatermarkAndReportsTheBytesFreed) {
  auto a = Open(10);
  for (uint64_t i = 0; i < 8; ++i) Store(*a, i);
  const uint64_t freed = a->budget->UnlinkVictims(a->budget->TakeDownToLowWatermark());
  EXPECT_EQ(freed, 3 * kEntry);
  EXPECT_EQ(a->budget->Usage(), 5 * kEntry);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(OnDisk(i), i >= 3) << i;
  EXPECT_TRUE(a->budget->TakeDownToLowWatermark().empty());
}

TEST_F(DiskBudgetTest, ASpaceRetryTakesAtLeastWhatItAsksOrATenthOfTheIndex) {
  auto a = Open(0);
  for (uint64_t i = 0; i < 40; ++i) Store(*a, i);
  EXPECT_EQ(a->budget->TakeForSpace(2 * kEntry).size(), 4u) << "a tenth of 40 entries";
  EXPECT_EQ(a->budget->TakeForSpace(6 * kEntry).size(), 6u);
}

TEST_F(DiskBudgetTest, TheMaintenanceThreadDropsEntriesAnotherEngineRemoved) {
  auto a = Open(0);
  auto b = Open(0);
  for (uint64_t i = 0; i < 4; ++i) Store(*a, i);
  ASSERT_TRUE(b->index->Rescan(false).ok());
  ASSERT_EQ(b->index->entries(), 4u);
  b->budget->StartMaintenance();
  // a evicts two entries; b's index still holds them until its maintenance notices the others' usage went down.
  auto victims = a->index->TakeExcess(2 * kEntry);
  ASSERT_EQ(a->budget->UnlinkVictims(victims), 2 * kEntry);
  bool dropped = false;
  for (int i = 0; i < 100 && !dropped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    dropped = b->index->entries() == 2;
  }
  EXPECT_TRUE(dropped) << "b's index holds " << b->index->entries() << " entries after 10 s";
  b->budget->StopMaintenance();
}

}  // namespace
}  // namespace kvtier
