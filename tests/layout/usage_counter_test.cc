// SharedUsage (SPEC C1): one counter per namespace shared by every engine on the host; the first holder sets it,
// later holders join it, and a sweep never removes a counter somebody holds.
#include "layout/usage_counter.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "layout/temp_dir.h"

namespace kvtier {
namespace {

using testing::TempDir;
using testing::TestIdentity;

Namespace OpenNs(const std::string& root) {
  auto ns = Namespace::Open(root, TestIdentity());
  EXPECT_TRUE(ns.ok()) << ns.status().ToString();
  return std::move(ns.value());
}

bool ShmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// Overwrites the path recorded in a counter object, as if it had been created for a namespace deleted since.
void RecordPath(const std::string& name, const std::string& path) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  char* map = static_cast<char*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  std::memset(map + 64, 0, 4096 - 64);
  std::memcpy(map + 64, path.c_str(), path.size());
  munmap(map, 4096);
}

TEST(SharedUsage, TheFirstHolderSetsTheCounterAndLaterHoldersJoinIt) {
  TempDir dir;
  Namespace ns = OpenNs(dir.path());
  auto a = SharedUsage::Open(ns, 1000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a.value()->first_holder());
  EXPECT_EQ(a.value()->Load(), 1000u);
  a.value()->Add(24);                 // a running engine's reservation
  auto b = SharedUsage::Open(ns, 5);  // a second engine's scan must not erase it
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b.value()->first_holder());
  EXPECT_EQ(b.value()->Load(), 1024u);
  b.value()->Add(-1000);
  EXPECT_EQ(a.value()->Load(), 24u);
  const std::string name = SharedUsage::ShmName(ns);
  a.value().reset();
  b.value().reset();
  auto c = SharedUsage::Open(ns, 77);  // nobody holds it: rebuilt from this scan
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c.value()->first_holder());
  EXPECT_EQ(c.value()->Load(), 77u);
  c.value().reset();
  shm_unlink(name.c_str());
}

TEST(SharedUsage, ASweepRemovesUnheldCountersOfDeletedNamespacesOnly) {
  TempDir gone_root, live_root;
  std::string gone_name;
  {
    Namespace gone = OpenNs(gone_root.path());
    gone_name = SharedUsage::ShmName(gone);
    // An engine killed while it held the counter: its destructor never runs, the kernel drops its lock.
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(SharedUsage::Open(gone, 1).ok() ? 0 : 1);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ASSERT_TRUE(ShmExists(gone_name));
  RecordPath(gone_name, gone_root.path() + "/no-such-namespace");
  Namespace live = OpenNs(live_root.path());
  auto u = SharedUsage::Open(live, 0);  // sweeps
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(ShmExists(gone_name)) << "an unheld counter of a deleted namespace stays";
  EXPECT_TRUE(ShmExists(SharedUsage::ShmName(live)));
  const std::string live_name = SharedUsage::ShmName(live);
  u.value().reset();
  shm_unlink(live_name.c_str());
}

// The last engine to close removes the counter (an unheld counter is disposable), so none outlives its root;
// while another engine holds it, closing leaves it in place.
TEST(SharedUsage, TheLastHolderRemovesTheCounterWhenItCloses) {
  TempDir root;
  std::string name;
  {
    Namespace ns = OpenNs(root.path());
    name = SharedUsage::ShmName(ns);
    auto a = SharedUsage::Open(ns, 10);
    auto b = SharedUsage::Open(ns, 10);
    ASSERT_TRUE(a.ok() && b.ok());
    a.value()->Add(5);
    a.value().reset();
    ASSERT_TRUE(ShmExists(name)) << "removed while another engine holds it";
    EXPECT_EQ(b.value()->Load(), 15u);
    auto c = SharedUsage::Open(ns, 0);  // joins the same object
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c.value()->first_holder());
    EXPECT_EQ(c.value()->Load(), 15u);
    b.value().reset();
    ASSERT_TRUE(ShmExists(name));
    c.value().reset();
    EXPECT_FALSE(ShmExists(name)) << "the last holder left its counter";
  }
  // The root is removed after its engines closed: nothing of it is left in /dev/shm.
  {
    TempDir other;
    Namespace ns = OpenNs(other.path());
    name = SharedUsage::ShmName(ns);
    ASSERT_TRUE(SharedUsage::Open(ns, 1).ok());
  }
  EXPECT_FALSE(ShmExists(name));
}

// The CI failure this guards against: directory inodes are reused, so a new namespace can be named like the
// counter of a deleted one whose recorded path is gone. Another engine's sweep then unlinked the counter while
// engines used it, later engines created a fresh one, and the processes sharing the root counted in different
// objects (the budget was exceeded by 80%).
TEST(SharedUsage, ACounterInUseIsNeverSweptEvenWithAStalePath) {
  TempDir root, other_root;
  Namespace ns = OpenNs(root.path());
  const std::string name = SharedUsage::ShmName(ns);
  auto held = SharedUsage::Open(ns, 0);
  ASSERT_TRUE(held.ok());
  RecordPath(name, root.path() + "/deleted-long-ago");  // what a reused inode's old counter records
  Namespace other = OpenNs(other_root.path());
  for (int i = 0; i < 3; ++i) {  // other engines open (and sweep) meanwhile
    auto o = SharedUsage::Open(other, 0);
    ASSERT_TRUE(o.ok());
  }
  ASSERT_TRUE(ShmExists(name)) << "a held counter was swept";
  auto joined = SharedUsage::Open(ns, 999);
  ASSERT_TRUE(joined.ok());
  held.value()->Add(4096);
  EXPECT_EQ(joined.value()->Load(), 4096u) << "two engines of one namespace count in different objects";
  held.value().reset();
  joined.value().reset();
  shm_unlink(name.c_str());
  shm_unlink(SharedUsage::ShmName(other).c_str());
}

// Processes that open and close counters of throw-away namespaces (sweeping each time) race with two holders of
// one namespace whose recorded path is stale: the holders must keep seeing each other's additions.
TEST(SharedUsage, ConcurrentOpensAndSweepsNeverSplitACounter) {
  TempDir root;
  Namespace ns = OpenNs(root.path());
  const std::string name = SharedUsage::ShmName(ns);
  auto a = SharedUsage::Open(ns, 0);
  ASSERT_TRUE(a.ok());
  RecordPath(name, root.path() + "/stale");
  std::vector<pid_t> kids;
  for (int p = 0; p < 3; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      for (int i = 0; i < 40; ++i) {
        TempDir t;
        auto n = Namespace::Open(t.path(), TestIdentity());
        if (!n.ok()) {
          bad++;
          continue;
        }
        auto u = SharedUsage::Open(n.value(), 1);
        if (!u.ok()) bad++;
        const std::string own = SharedUsage::ShmName(n.value());
        u.value().reset();
        shm_unlink(own.c_str());
        // And a process of the shared namespace joins and leaves.
        auto j = SharedUsage::Open(ns, 12345);
        if (!j.ok() || j.value()->first_holder()) bad++;
      }
      _exit(bad == 0 ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto b = SharedUsage::Open(ns, 5);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b.value()->first_holder());
  a.value()->Add(100);
  EXPECT_EQ(b.value()->Load(), 100u);
  a.value().reset();
  b.value().reset();
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace kvtier
