// The test vectors of docs/file-format.md ("Test vectors"): two roots committed under tests/data/format-vectors/
// (unkeyed: checksum_kind 1; keyed: kind 2 under kVectorSecret), each one namespace with its MANIFEST and one
// chunk of 2 blocks, written once by kvtier's own layout code (KVTIER_WRITE_FORMAT_VECTORS=<dir> makes this binary
// write them again). The test parses them with kvtier's parser, re-derives every field from the rules of
// docs/file-format.md alone (XXH3 and HMAC-SHA256 called directly, offsets from the page's table, not from
// chunk_format.h), checks both against the values listed on that page, and checks that the current code writes the
// same bytes. A change of the format code that changes any of these values fails here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "layout/chunk_format.h"
#include "layout/chunk_path.h"
#include "layout/namespace.h"
#include "layout/temp_dir.h"

namespace kvtier {
namespace {

// --- The vectors' inputs (docs/file-format.md, "Test vectors") ---
constexpr char kVectorSecret[] = "kvtier-format-vector-secret";  // 27 ASCII bytes, the keyed vector's secret
constexpr uint32_t kBlocks = 2;
constexpr uint64_t kBlockBytes = 4000;  // stride 4096: each block is followed by 96 zero bytes of padding
constexpr uint64_t kCreatedNs = 1700000000000000000ull;
constexpr size_t kKeyBytes = 36;  // key byte j = 0x10 + j (vLLM's size: a 32-byte hash and a 4-byte group)

NamespaceIdentity VectorIdentity() {
  NamespaceIdentity id;
  id.model = "kvtier/format-vector";
  id.revision = "v1";
  id.kv_dtype = "bfloat16";
  id.tokens_per_chunk = 32;
  id.blocks_per_chunk = kBlocks;
  id.block_bytes = kBlockBytes;
  id.tp_size = 1;
  id.pp_size = 1;
  id.layout_tag = "vllm-canonical-v1";
  return id;
}

std::vector<uint8_t> VectorKey() {
  std::vector<uint8_t> k(kKeyBytes);
  for (size_t j = 0; j < kKeyBytes; ++j) k[j] = static_cast<uint8_t>(0x10 + j);
  return k;
}

// Data byte j of block i: (j + 31 * i) mod 251.
uint8_t PayloadByte(uint32_t i, uint64_t j) { return static_cast<uint8_t>((j + 31 * i) % 251); }

// --- The values listed in docs/file-format.md ---
constexpr char kManifestIdentityLines[] =
    "format_version=1\n"
    "model=kvtier/format-vector\n"
    "revision=v1\n"
    "kv_dtype=bfloat16\n"
    "tokens_per_chunk=32\n"
    "blocks_per_chunk=2\n"
    "block_bytes=4000\n"
    "tp_size=1\n"
    "pp_size=1\n"
    "layout_tag=vllm-canonical-v1\n";
constexpr char kFingerprintHex[] = "5c495dbaa320fe04d5dafce47a5523d3";
constexpr char kNsDir[] = "ns-5c495dbaa320fe04";
constexpr char kKeyIdRecord[] = "k3:7c5d27b553c6fae04a8c639b5a6459f5";
constexpr char kChunkRel[] = "10/11/101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f30313233.kvc";
constexpr uint64_t kSeed[kBlocks] = {0x46a4173b31f21aa8ull, 0x06a38ea159f90572ull};
constexpr uint64_t kUnkeyedChecksum[kBlocks] = {0x92bf5eb54fa28ff5ull, 0xa3360821d8db154dull};
constexpr uint64_t kUnkeyedHeaderChecksum = 0x5455424cc13d36abull;
constexpr uint64_t kKeyedChecksum[kBlocks] = {0xf78b308644a0c139ull, 0x5290e957a47f7b9full};
constexpr char kKeyedHeaderMacHex[] = "fcfe30a0fea1a82530c801e92647abc8c38f88a7c24cf28ecec601acab2096d6";
constexpr uint64_t kKeyedHeaderChecksum = 0xacf0d8e99a5e0029ull;

// --- Independent derivation (docs/file-format.md only) ---
std::string Hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += {d[p[i] >> 4], d[p[i] & 15]};
  return s;
}
uint32_t Le32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24; }
uint64_t Le64(const uint8_t* p) { return Le32(p) | static_cast<uint64_t>(Le32(p + 4)) << 32; }
std::vector<uint8_t> Hmac(const std::string& key, const uint8_t* msg, size_t n) {
  std::vector<uint8_t> out(32);
  unsigned len = 32;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg, n, out.data(), &len);
  return out;
}
std::vector<uint8_t> Hmac(const std::string& key, const std::string& msg) {
  return Hmac(key, reinterpret_cast<const uint8_t*>(msg.data()), msg.size());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string VectorsDir() { return std::string(KVTIER_SOURCE_DIR) + "/tests/data/format-vectors"; }

// Writes one vector root with kvtier's code: Namespace::Open publishes the MANIFEST, FillPayloadFields and
// EncodeHeader make the chunk.
void WriteVector(const std::string& root, bool keyed) {
  ASSERT_EQ(mkdir(root.c_str(), 0755) == 0 || errno == EEXIST, true) << root;
  Result<ChecksumKey> key = DeriveChecksumKey(kVectorSecret);
  ASSERT_TRUE(key.ok());
  const ChecksumKey* k = keyed ? &key.value() : nullptr;
  NamespaceOpenOptions o;
  o.dir_mode = 0755;
  o.checksum_key = ChecksumKeyRecord(k);
  auto ns = Namespace::Open(root, VectorIdentity(), o);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  ChunkHeader h;
  h.fingerprint = ns.value().fingerprint();
  h.key = ChunkKey::FromBytes(VectorKey()).value();
  h.num_blocks = kBlocks;
  h.block_bytes = kBlockBytes;
  h.created_unix_ns = kCreatedNs;
  std::vector<uint8_t> file(ChunkFileBytes(kBlocks, kBlockBytes), 0);
  uint8_t* payload = file.data() + kHeaderBytes;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    for (uint64_t j = 0; j < kBlockBytes; ++j) payload[i * BlockStride(kBlockBytes) + j] = PayloadByte(i, j);
  }
  ASSERT_TRUE(FillPayloadFields(&h, payload, k).ok());
  ASSERT_TRUE(EncodeHeader(h, {file.data(), kHeaderBytes}, k).ok());
  ASSERT_TRUE(EnsureFanoutDir(ns.value().dirfd(), h.key, 0755).ok());
  const std::string path = ns.value().path() + "/" + ChunkRelPath(h.key);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(file.data()), file.size());
  chmod(path.c_str(), 0644);
}

// Rewrites the committed vectors (a tool, not a check: disabled, so the suite never runs it):
// KVTIER_WRITE_FORMAT_VECTORS=<dir> test_layout_format_vectors --gtest_also_run_disabled_tests
//   --gtest_filter='*WriteOnRequest', then commit <dir> as tests/data/format-vectors and update docs/file-format.md.
TEST(FormatVectors, DISABLED_WriteOnRequest) {
  const char* out = std::getenv("KVTIER_WRITE_FORMAT_VECTORS");
  ASSERT_NE(out, nullptr) << "set KVTIER_WRITE_FORMAT_VECTORS=<dir> to write the vectors";
  mkdir(out, 0755);
  WriteVector(std::string(out) + "/unkeyed", false);
  WriteVector(std::string(out) + "/keyed", true);
}

struct Vector {
  const char* name;
  bool keyed;
};
void PrintTo(const Vector& v, std::ostream* os) { *os << v.name; }

class FormatVectorsTest : public ::testing::TestWithParam<Vector> {};

// Every field of the committed files, derived from docs/file-format.md's rules, equals the documented value.
TEST_P(FormatVectorsTest, EveryFieldMatchesTheDocumentedRulesAndValues) {
  const bool keyed = GetParam().keyed;
  const std::string root = VectorsDir() + "/" + GetParam().name;
  const std::string identity = kManifestIdentityLines;

  // MANIFEST: the identity lines, then checksum_key.
  const std::string manifest = ReadFile(root + "/" + kNsDir + "/MANIFEST");
  EXPECT_EQ(manifest, identity + "checksum_key=" + (keyed ? kKeyIdRecord : "none") + "\n");
  // Fingerprint: XXH3_128bits (seed 0) of the identity lines, canonical big-endian; the directory's name is
  // "ns-" + its first 16 hex digits.
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(identity.data(), identity.size()));
  const std::string fp = Hex(c.digest, 16);
  EXPECT_EQ(fp, kFingerprintHex);
  EXPECT_EQ("ns-" + fp.substr(0, 16), kNsDir);
  // checksum_key: the first 16 bytes of HMAC-SHA256(secret, "kvtier-k3-key-id").
  EXPECT_EQ("k3:" + Hex(Hmac(kVectorSecret, "kvtier-k3-key-id").data(), 16), kKeyIdRecord);

  // Chunk name: <key[0] hex>/<key[1] hex>/<key hex>.kvc.
  const std::vector<uint8_t> key = VectorKey();
  EXPECT_EQ(Hex(&key[0], 1) + "/" + Hex(&key[1], 1) + "/" + Hex(key.data(), key.size()) + ".kvc", kChunkRel);
  const std::string s = ReadFile(root + "/" + kNsDir + "/" + kChunkRel);
  const auto* f = reinterpret_cast<const uint8_t*>(s.data());
  const uint64_t stride = 4096;  // round_up(4000, 4096)
  ASSERT_EQ(s.size(), 4096 + kBlocks * stride);

  // Header, offset by offset (all little-endian).
  EXPECT_EQ(s.substr(0, 8), "KVTCHUNK");
  EXPECT_EQ(Le32(f + 8), 1u);
  EXPECT_EQ(Le32(f + 12), 4096u);
  EXPECT_EQ(Hex(f + 16, 16), fp);
  EXPECT_EQ(f[32], kKeyBytes);
  for (int i = 33; i < 40; ++i) EXPECT_EQ(f[i], 0) << i;
  EXPECT_EQ(Hex(f + 40, kKeyBytes), Hex(key.data(), key.size()));
  for (size_t i = 40 + kKeyBytes; i < 104; ++i) EXPECT_EQ(f[i], 0) << "key padding " << i;
  EXPECT_EQ(Le32(f + 104), kBlocks);
  EXPECT_EQ(Le32(f + 108), keyed ? 2u : 1u);
  EXPECT_EQ(Le64(f + 112), kBlockBytes);
  EXPECT_EQ(Le64(f + 120), stride);
  EXPECT_EQ(Le64(f + 128), kBlocks * stride);
  EXPECT_EQ(Le64(f + 136), kCreatedNs);

  // Block checksums. Seed of block i: XXH3_64bits (seed 0) of fingerprint(16) || key_size(1) || key || i (u32 LE).
  const std::string secret = kVectorSecret;
  std::vector<uint8_t> xxh3_secret;
  for (int i = 0; i < 6; ++i) {
    auto part = Hmac(secret, "kvtier-k3-block-secret-" + std::to_string(i));
    xxh3_secret.insert(xxh3_secret.end(), part.begin(), part.end());
  }
  for (uint32_t i = 0; i < kBlocks; ++i) {
    std::vector<uint8_t> m(c.digest, c.digest + 16);
    m.push_back(static_cast<uint8_t>(kKeyBytes));
    m.insert(m.end(), key.begin(), key.end());
    for (int b = 0; b < 4; ++b) m.push_back(static_cast<uint8_t>(i >> (8 * b)));
    const uint64_t seed = XXH3_64bits(m.data(), m.size());
    EXPECT_EQ(seed, kSeed[i]) << "block " << i;
    const uint8_t* data = f + 4096 + i * stride;
    for (uint64_t j = 0; j < kBlockBytes; ++j) ASSERT_EQ(data[j], PayloadByte(i, j)) << "block " << i << " byte " << j;
    for (uint64_t j = kBlockBytes; j < stride; ++j) ASSERT_EQ(data[j], 0) << "block " << i << " padding " << j;
    const uint64_t sum = keyed
                             ? XXH3_64bits_withSecret(data, kBlockBytes, xxh3_secret.data(), xxh3_secret.size()) ^ seed
                             : XXH3_64bits_withSeed(data, kBlockBytes, seed);
    EXPECT_EQ(Le64(f + 144 + 8 * i), sum) << "block " << i;
    EXPECT_EQ(sum, keyed ? kKeyedChecksum[i] : kUnkeyedChecksum[i]) << "block " << i;
  }
  for (uint32_t i = kBlocks; i < 256; ++i) EXPECT_EQ(Le64(f + 144 + 8 * i), 0u) << "checksum slot " << i;
  // Header MAC (kind 2: HMAC-SHA256(HMAC-SHA256(secret, "kvtier-k3-header-mac"), bytes [0, 2192)); kind 1: zero).
  if (keyed) {
    const auto mac_key = Hmac(secret, "kvtier-k3-header-mac");
    const auto mac = Hmac(std::string(mac_key.begin(), mac_key.end()), f, 2192);
    EXPECT_EQ(Hex(f + 2192, 32), Hex(mac.data(), 32));
    EXPECT_EQ(Hex(f + 2192, 32), kKeyedHeaderMacHex);
  } else {
    for (int i = 2192; i < 2224; ++i) EXPECT_EQ(f[i], 0) << i;
  }
  for (int i = 2224; i < 4088; ++i) EXPECT_EQ(f[i], 0) << "reserved " << i;
  EXPECT_EQ(Le64(f + 4088), XXH3_64bits(f, 4088));
  EXPECT_EQ(Le64(f + 4088), keyed ? kKeyedHeaderChecksum : kUnkeyedHeaderChecksum);
}

// kvtier's own parser reads the committed files as the documented values.
TEST_P(FormatVectorsTest, KvtiersParserReadsThem) {
  const bool keyed = GetParam().keyed;
  const std::string root = VectorsDir() + "/" + GetParam().name;
  auto ns = Namespace::OpenExisting(root, kNsDir);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_EQ(ns.value().identity(), VectorIdentity());
  EXPECT_EQ(Fingerprint(VectorIdentity()), kFingerprintHex);
  EXPECT_EQ(ns.value().checksum_key_record(), keyed ? std::string(kKeyIdRecord) : "none");
  std::string record;
  auto parsed = ParseManifest(ReadFile(root + "/" + kNsDir + "/MANIFEST"), &record);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed.value(), VectorIdentity());

  Result<ChecksumKey> key = DeriveChecksumKey(kVectorSecret);
  ASSERT_TRUE(key.ok());
  const ChecksumKey* k = keyed ? &key.value() : nullptr;
  EXPECT_EQ(ChecksumKeyRecord(k), keyed ? std::string(kKeyIdRecord) : "none");
  const std::string s = ReadFile(root + "/" + kNsDir + "/" + kChunkRel);
  const auto* f = reinterpret_cast<const uint8_t*>(s.data());
  const ChunkKey ck = ChunkKey::FromBytes(VectorKey()).value();
  EXPECT_EQ(ChunkRelPath(ck), kChunkRel);
  const ChunkGeometry geometry = ns.value().geometry();
  auto h = DecodeHeader({f, kHeaderBytes}, ns.value().fingerprint(), ck, &geometry, k);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h.value().num_blocks, kBlocks);
  EXPECT_EQ(h.value().block_bytes, kBlockBytes);
  EXPECT_EQ(h.value().block_stride, 4096u);
  EXPECT_EQ(h.value().payload_bytes, 8192u);
  EXPECT_EQ(h.value().created_unix_ns, kCreatedNs);
  EXPECT_EQ(h.value().checksum_kind, keyed ? 2u : 1u);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(BlockChecksumSeed(h.value(), i), kSeed[i]);
    EXPECT_EQ(h.value().block_checksums[i], keyed ? kKeyedChecksum[i] : kUnkeyedChecksum[i]);
  }
  EXPECT_EQ(h.value().header_checksum, keyed ? kKeyedHeaderChecksum : kUnkeyedHeaderChecksum);
  EXPECT_TRUE(CheckFileSize(h.value(), s.size()).ok());
  EXPECT_TRUE(VerifyBlocks(h.value(), 0, kBlocks, f + kHeaderBytes, k).ok());
  // The other reader is refused: kind 1 under a secret, kind 2 without one.
  EXPECT_FALSE(
      DecodeHeader({f, kHeaderBytes}, ns.value().fingerprint(), ck, &geometry, keyed ? nullptr : &key.value()).ok());
}

// The current code writes the committed bytes exactly (MANIFEST and chunk).
TEST_P(FormatVectorsTest, TheCodeStillWritesTheseBytes) {
  testing::TempDir dir;
  const std::string root = dir.path() + "/" + GetParam().name;
  WriteVector(root, GetParam().keyed);
  const std::string committed = VectorsDir() + "/" + GetParam().name + "/" + kNsDir;
  for (const std::string& rel : {std::string("MANIFEST"), std::string(kChunkRel)}) {
    const std::string now = ReadFile(root + "/" + kNsDir + "/" + rel);
    ASSERT_FALSE(now.empty()) << rel;
    EXPECT_TRUE(now == ReadFile(committed + "/" + rel)) << rel << " differs from the committed vector";
  }
}

INSTANTIATE_TEST_SUITE_P(Vectors, FormatVectorsTest, ::testing::Values(Vector{"unkeyed", false}, Vector{"keyed", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvtier
