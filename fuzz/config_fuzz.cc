// libFuzzer target: the configuration parsers in C++: the CLI's flag parser and value parsers (tools/cli_util.h:
// sizes like "1.5GiB", integers, fractions, lists, choices), and EngineOptions::Validate on values taken from the
// input (the checks behind the Python options dict and the vLLM kvtier_* keys). Input: NUL-separated words, used
// as a command line. Properties: never crashes; a bad word is a UsageError (an exception at the CLI edge), never
// undefined behaviour; Validate returns a Status for any field values.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvtier/options.h"

namespace kvtier {

namespace {

int FuzzOne(const uint8_t* data, size_t size) {
  std::vector<std::string> words;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  words.push_back(cur);
  if (words.size() > 64) return 0;
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  try {
    CliArgs args("fuzz", "fuzzing",
                 {{"root", "DIR", "root", ""},
                  {"budget", "SIZE", "budget", ""},
                  {"depths", "LIST", "depths", "4"},
                  {"sizes", "SIZES", "sizes", "1MiB"},
                  {"watermark", "FRACTION", "w", "0.9"},
                  {"mode", "direct|buffered", "m", "direct"},
                  {"repair", "", "switch", ""}});
    args.Parse(static_cast<int>(argv.size()), argv.data());
    (void)args.Size("budget", 0);
    (void)args.UintList("depths", "4");
    (void)args.SizeList("sizes", "1MiB");
    (void)args.Double("watermark", 0.9);
    (void)args.Choice("mode", "direct", {"direct", "buffered"});
    (void)args.Uint("budget", 1);
    (void)args.Usage();
  } catch (const std::exception&) {
  }
  // Engine options from the first words' bytes.
  EngineOptions o;
  o.root = words.empty() ? "" : words[0];
  auto num = [&](size_t i) -> uint64_t {
    uint64_t v = 0;
    if (i < words.size()) std::memcpy(&v, words[i].data(), std::min<size_t>(8, words[i].size()));
    return v;
  };
  o.identity.model = words.size() > 1 ? words[1] : "";
  o.identity.kv_dtype = "bf16";
  o.identity.blocks_per_chunk = static_cast<uint32_t>(num(2));
  o.identity.block_bytes = num(3);
  o.identity.tokens_per_chunk = static_cast<uint32_t>(num(4));
  o.io_depth = static_cast<uint32_t>(num(5));
  o.high_watermark = static_cast<double>(num(6) % 2000) / 1000.0;
  o.low_watermark = static_cast<double>(num(7) % 2000) / 1000.0;
  o.dir_mode = static_cast<mode_t>(num(8));
  o.pool_bytes = num(9);
  o.checksum_secret = words.size() > 10 ? words[10] : "";
  (void)o.Validate();
  return 0;
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kvtier::FuzzOne(data, size); }
