// M1: a named temporary is closed, and the close has come back, before its link(): on network and FUSE filesystems
// the close is where the client pushes the data, so an entry must not be published when it fails (and another host
// must never see the name before the data: tests/multihost, case chase_while_storing, shows that on MooseFS).
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "engine/engine_impl.h"
#include "io/fault_engine.h"
#include "support/engine_options.h"
#include "support/job_engine.h"
#include "support/keys.h"
#include "support/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlocks = 2;
constexpr uint64_t kBlockBytes = 8192;

ChunkKey Key(uint64_t i) { return kvtier::test::NumberedKey(i, 32, 10, 0x3c); }

EngineOptions Options(const std::string& root) {
  EngineOptions o = test::BaseOptions(root, "publish-order", 32, kBlocks, kBlockBytes);
  o.pool_bytes = 8 * (4096 + kBlocks * kBlockBytes);
  o.io_depth = 2;
  o.anonymous_temporaries = false;  // named temporaries, as on filesystems without O_TMPFILE
  return o;
}

size_t ChunkFiles(const std::string& root) {
  size_t n = 0;
  for (auto& p : std::filesystem::recursive_directory_iterator(root)) n += p.path().extension() == ".kvc";
  return n;
}

TEST(PublishOrder, AFailedCloseOfANamedTemporaryPublishesNothing) {
  test::TempDir dir;
  auto inner = CreateIoEngine(IoEngineConfig{IoEngineKind::kAuto, 64, 4});
  ASSERT_TRUE(inner.ok());
  auto fault = std::make_unique<FaultInjectingEngine>(std::move(inner.value()));
  fault->AddRule(FaultRule::FailEvery(OpCode::kClose, EIO));  // a write error reported at close (NFS, FUSE)
  auto opened = EngineImpl::Create(Options(dir.path()), std::move(fault));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto e = test::WithJobs(std::move(opened).value());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> bytes(kBlocks * kBlockBytes, 0x42);
  const CopySegment whole{0, reinterpret_cast<uint64_t>(bytes.data()), bytes.size()};
  auto r = e->Run(e->jobs->SubmitStore({ChunkTransfer{Key(1), 0, 0, {whole}}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->all_ok()) << "the store succeeded although the temporary's close failed";
  EXPECT_EQ(ChunkFiles(dir.path()), 0u) << "an entry was published before its close came back";
  EXPECT_EQ((*e)->Stats().stores_dropped, 1u);
}

TEST(PublishOrder, NamedTemporariesPublishAndLeaveNoTemporary) {
  test::TempDir dir;
  auto e = test::OpenWithJobs(Options(dir.path()));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> bytes(kBlocks * kBlockBytes, 0x43);
  const CopySegment whole{0, reinterpret_cast<uint64_t>(bytes.data()), bytes.size()};
  auto r = e->Run(e->jobs->SubmitStore({ChunkTransfer{Key(2), 0, 0, {whole}}}));
  ASSERT_TRUE(r.ok() && r->all_ok());
  e.value().reset();  // the temporary's unlink has come back
  size_t temps = 0;
  for (auto& p : std::filesystem::recursive_directory_iterator(dir.path())) {
    temps += p.path().filename().string().rfind(".tmp.", 0) == 0;
  }
  EXPECT_EQ(ChunkFiles(dir.path()), 1u);
  EXPECT_EQ(temps, 0u);
}

}  // namespace
}  // namespace kvtier
