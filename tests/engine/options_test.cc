// The options schema (include/kvtier/options.h, src/engine/options.cc): every row is reachable by name, its
// default passes its own check, its range is enforced by CheckOption and by Validate, and SetOption stores what
// it checked.
#include "kvtier/options.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kvtier {
namespace {

EngineOptions Complete() {
  EngineOptions o;
  o.root = "/tmp";
  // Not 1-char literals: GCC 12 warns -Wrestrict on them in optimized builds (a false positive, GCC bug 105329).
  o.identity.model = "model";
  o.identity.revision = "rev";
  o.identity.kv_dtype = "bfloat16";
  o.identity.tokens_per_chunk = 256;
  o.identity.blocks_per_chunk = 16;
  o.identity.block_bytes = 4096;
  return o;
}

TEST(OptionSchema, NamesAreUniqueAndFound) {
  std::set<std::string> names, vllm_keys;
  for (const OptionSpec& s : OptionSchema()) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate option " << s.name;
    if (s.vllm_key != nullptr) {
      EXPECT_TRUE(vllm_keys.insert(s.vllm_key).second) << "duplicate key " << s.vllm_key;
    }
    EXPECT_EQ(FindOption(s.name), &s);
    EXPECT_NE(std::string(s.doc), "");
  }
  EXPECT_EQ(FindOption("no_such_option"), nullptr);
  EXPECT_NE(FindOption("model"), nullptr) << "identity fields go by their own name";
}

TEST(OptionSchema, DefaultsOfACompleteConfigurationValidate) {
  const EngineOptions o = Complete();
  for (const OptionSpec& s : OptionSchema()) {
    EXPECT_TRUE(CheckOption(s, s.get(o)).ok()) << s.field << ": " << CheckOption(s, s.get(o)).ToString();
  }
  EXPECT_TRUE(o.Validate().ok()) << o.Validate().ToString();
}

TEST(OptionSchema, RangesAreEnforcedByCheckOptionAndValidate) {
  int checked = 0;
  for (const OptionSpec& s : OptionSchema()) {
    if (s.type != OptionType::kCount && s.type != OptionType::kBytes) continue;
    std::vector<uint64_t> outside;
    if (s.min > 0) outside.push_back(static_cast<uint64_t>(s.min) - 1);
    if (s.max < 1.8e19) outside.push_back(static_cast<uint64_t>(s.max) + 1);
    for (uint64_t v : outside) {
      const Status st = CheckOption(s, v);
      EXPECT_FALSE(st.ok()) << s.field << " accepted " << v;
      EXPECT_NE(st.message().find(s.field), std::string::npos) << st.message();
      ++checked;
      if (v > 0xffffffffull) continue;  // would not fit a 32-bit member: only CheckOption sees such a value
      EngineOptions o = Complete();
      s.set(o, v);
      EXPECT_FALSE(o.Validate().ok()) << "Validate accepted " << s.field << " = " << v;
    }
    EXPECT_TRUE(CheckOption(s, static_cast<uint64_t>(s.min)).ok()) << s.field;
  }
  EXPECT_GT(checked, 10);
}

TEST(OptionSchema, TypedRulesAndSetOption) {
  EngineOptions o = Complete();
  const OptionSpec& mode = *FindOption("dir_mode");
  EXPECT_FALSE(SetOption(&o, mode, uint64_t{0640}).ok());
  EXPECT_FALSE(SetOption(&o, mode, uint64_t{010750}).ok());
  EXPECT_TRUE(SetOption(&o, mode, uint64_t{0770}).ok());
  EXPECT_EQ(o.dir_mode, 0770u);
  const OptionSpec& policy = *FindOption("dram_policy");
  EXPECT_FALSE(SetOption(&o, policy, std::string("fifo")).ok());
  EXPECT_TRUE(SetOption(&o, policy, std::string("arc")).ok());
  EXPECT_EQ(o.dram_policy, "arc");
  const OptionSpec& io_mode = *FindOption("io_mode");
  EXPECT_TRUE(SetOption(&o, io_mode, std::string("buffered")).ok());
  EXPECT_EQ(o.io_mode, IoMode::kBuffered);
  EXPECT_EQ(std::get<std::string>(io_mode.get(o)), "buffered");
  const OptionSpec& secret = *FindOption("checksum_secret");
  EXPECT_FALSE(SetOption(&o, secret, std::string("short")).ok());
  EXPECT_FALSE(SetOption(&o, secret, std::string("file:")).ok());
  EXPECT_TRUE(SetOption(&o, secret, std::string("0123456789abcdef")).ok());
  EXPECT_FALSE(SetOption(&o, *FindOption("io_depth"), std::string("16")).ok()) << "a value of another type";
  const OptionSpec& high = *FindOption("high_watermark");
  EXPECT_FALSE(SetOption(&o, high, 1.5).ok());
  o.low_watermark = 0.9;
  o.high_watermark = 0.8;
  EXPECT_FALSE(CheckOptionCombinations(o).ok());
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace kvtier
