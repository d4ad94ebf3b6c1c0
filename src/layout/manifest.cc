// The MANIFEST's text and the namespace identity (docs/file-format.md, "MANIFEST"): validation, canonical text,
// parsing, fingerprint and directory name. No I/O: namespace.cc reads and publishes it.
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "layout/manifest_text.h"
#include "layout/namespace.h"

namespace kvtier {
namespace {

constexpr char kHexUpper[] = "0123456789ABCDEF";
constexpr char kHexLower[] = "0123456789abcdef";

int UpperHexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Status ManifestError(std::string_view field, std::string what) {
  return Status(StatusCode::kCorrupt, "MANIFEST field " + std::string(field) + ": " + what);
}

Result<std::string> Unescape(std::string_view field, std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f) return ManifestError(field, "raw control character in value");
    if (c != '%') {
      out.push_back(v[i]);
      continue;
    }
    if (i + 2 >= v.size()) return ManifestError(field, "truncated % escape");
    int hi = UpperHexValue(v[i + 1]);
    int lo = UpperHexValue(v[i + 2]);
    if (hi < 0 || lo < 0) return ManifestError(field, "bad % escape (two uppercase hex digits expected)");
    out.push_back(static_cast<char>(hi << 4 | lo));
    i += 2;
  }
  return out;
}

template <typename T>
Status ParseNumber(std::string_view field, std::string_view v, T* out) {
  if (v.empty()) return ManifestError(field, "empty number");
  // The value quoted as an lvalue: GCC 12 warns -Wrestrict (a false positive, GCC bug 105329) on
  // `"literal" + std::string(v)` (operator+ of a pointer and an rvalue string) in optimized builds.
  const auto quoted = [&v](const char* before, const char* after) {
    std::string s(before);
    s.append(v).append(after);
    return s;
  };
  if (v.size() > 1 && v[0] == '0') return ManifestError(field, quoted("number '", "' has a leading zero"));
  for (char c : v) {
    if (c < '0' || c > '9') return ManifestError(field, quoted("'", "' is not a decimal number"));
  }
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  if (ec != std::errc() || ptr != v.data() + v.size()) {
    return ManifestError(field, quoted("number '", "' is out of range"));
  }
  return Status::Ok();
}

}  // namespace

namespace internal {

std::string Escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '%' || c < 0x20 || c == 0x7f) {
      out.push_back('%');
      out.push_back(kHexUpper[c >> 4]);
      out.push_back(kHexUpper[c & 0xf]);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

std::vector<Field> Fields(const NamespaceIdentity& id) {
  return {
      {"format_version", std::to_string(id.format_version), false},
      {"model", id.model, true},
      {"revision", id.revision, true},
      {"kv_dtype", id.kv_dtype, true},
      {"tokens_per_chunk", std::to_string(id.tokens_per_chunk), false},
      {"blocks_per_chunk", std::to_string(id.blocks_per_chunk), false},
      {"block_bytes", std::to_string(id.block_bytes), false},
      {"tp_size", std::to_string(id.tp_size), false},
      {"pp_size", std::to_string(id.pp_size), false},
      {"layout_tag", id.layout_tag, true},
  };
}

bool IsChecksumKeyRecord(std::string_view v) {
  if (v == "none") return true;
  if (v.size() != 35 || v.substr(0, 3) != "k3:") return false;
  return std::all_of(v.begin() + 3, v.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace internal

using internal::Escape;
using internal::Field;
using internal::Fields;
using internal::IsChecksumKeyRecord;
using internal::kMaxManifestBytes;

bool operator==(const NamespaceIdentity& a, const NamespaceIdentity& b) {
  return a.model == b.model && a.revision == b.revision && a.kv_dtype == b.kv_dtype &&
         a.tokens_per_chunk == b.tokens_per_chunk && a.blocks_per_chunk == b.blocks_per_chunk &&
         a.block_bytes == b.block_bytes && a.tp_size == b.tp_size && a.pp_size == b.pp_size &&
         a.layout_tag == b.layout_tag && a.format_version == b.format_version;
}

Status ValidateIdentity(const NamespaceIdentity& id) {
  auto bad = [](const char* field, std::string why) {
    return Status(StatusCode::kInvalidArgument, std::string("namespace identity: ") + field + " " + why);
  };
  // docs/file-format.md ("MANIFEST"): a bound on each string keeps every MANIFEST under kMaxManifestBytes even when
  // fully escaped (4 x 3 x 4096 B), so no identity is accepted whose MANIFEST could be written but not read back.
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"model", &id.model},
                                     {"revision", &id.revision},
                                     {"kv_dtype", &id.kv_dtype},
                                     {"layout_tag", &id.layout_tag}}) {
    if (value->size() > kMaxIdentityStringBytes) {
      return bad(field, "is " + std::to_string(value->size()) + " bytes long; at most " +
                            std::to_string(kMaxIdentityStringBytes) + " are accepted");
    }
  }
  if (id.model.empty()) return bad("model", "is empty");
  if (id.revision.empty()) return bad("revision", "is empty (give the weights revision or a hash)");
  if (id.kv_dtype.empty()) return bad("kv_dtype", "is empty");
  if (id.layout_tag.empty()) return bad("layout_tag", "is empty");
  if (id.tokens_per_chunk == 0) return bad("tokens_per_chunk", "is 0");
  if (id.blocks_per_chunk == 0 || id.blocks_per_chunk > kMaxBlocksPerChunk) {
    return bad("blocks_per_chunk", std::to_string(id.blocks_per_chunk) + " is outside 1..256");
  }
  if (id.tokens_per_chunk % id.blocks_per_chunk != 0) {
    return bad("tokens_per_chunk", std::to_string(id.tokens_per_chunk) + " is not a multiple of blocks_per_chunk " +
                                       std::to_string(id.blocks_per_chunk));
  }
  if (id.block_bytes == 0 || id.block_bytes > kMaxBlockBytes) {
    return bad("block_bytes", std::to_string(id.block_bytes) + " is outside 1.." + std::to_string(kMaxBlockBytes));
  }
  if (id.tp_size == 0) return bad("tp_size", "is 0");
  if (id.pp_size == 0) return bad("pp_size", "is 0");
  if (id.format_version != kFormatVersion) {
    return bad("format_version", std::to_string(id.format_version) + " is not supported (this build writes " +
                                     std::to_string(kFormatVersion) + ")");
  }
  return Status::Ok();
}

std::string CanonicalManifest(const NamespaceIdentity& id) {
  std::string out;
  for (const Field& f : Fields(id)) {
    out += f.name;
    out += '=';
    out += f.is_string ? Escape(f.value) : f.value;
    out += '\n';
  }
  return out;
}

std::string ChecksumKeyRecord(const ChecksumKey* key) {
  if (key == nullptr) return "none";
  std::string out = "k3:";
  for (uint8_t b : key->key_id) {
    out.push_back(kHexLower[b >> 4]);
    out.push_back(kHexLower[b & 0xf]);
  }
  return out;
}

std::string ManifestText(const NamespaceIdentity& id, const std::string& checksum_key_record) {
  std::string out = CanonicalManifest(id);
  if (!checksum_key_record.empty()) out += "checksum_key=" + checksum_key_record + "\n";
  return out;
}

Result<NamespaceIdentity> ParseManifest(std::string_view text, std::string* checksum_key_record) {
  NamespaceIdentity id;
  // The identity's fields, then checksum_key (K3), the one optional field.
  constexpr size_t kNumFields = 11;
  constexpr size_t kChecksumKeyField = 10;
  static constexpr const char* kNames[kNumFields] = {
      "format_version", "model",   "revision", "kv_dtype",   "tokens_per_chunk", "blocks_per_chunk",
      "block_bytes",    "tp_size", "pp_size",  "layout_tag", "checksum_key"};
  std::string checksum_key;
  bool seen[kNumFields] = {};
  if (!text.empty() && text.back() != '\n') {
    return Status(StatusCode::kCorrupt, "MANIFEST does not end with a newline (truncated?)");
  }
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return Status(StatusCode::kCorrupt, "MANIFEST line '" + Escape(line) + "' has no '='");
    }
    std::string_view key = line.substr(0, eq);
    std::string_view value = line.substr(eq + 1);
    size_t index = kNumFields;
    for (size_t i = 0; i < kNumFields; ++i) {
      if (key == kNames[i]) index = i;
    }
    if (index == kNumFields) {
      return Status(StatusCode::kCorrupt, "MANIFEST has unknown field '" + Escape(key) + "'");
    }
    if (seen[index]) return ManifestError(key, "appears twice");
    seen[index] = true;
    switch (index) {
      case 0: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.format_version)); break;
      case 4: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.tokens_per_chunk)); break;
      case 5: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.blocks_per_chunk)); break;
      case 6: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.block_bytes)); break;
      case 7: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.tp_size)); break;
      case 8: KVTIER_RETURN_IF_ERROR(ParseNumber(key, value, &id.pp_size)); break;
      case kChecksumKeyField:
        if (!IsChecksumKeyRecord(value)) {
          // Built with append, not "'" + ...: GCC 12 -Wrestrict false positive (GCC bug 105329).
          return ManifestError(key, std::string(1, '\'')
                                        .append(Escape(value))
                                        .append("' is neither 'none' nor 'k3:' and 32 lowercase hex digits"));
        }
        checksum_key = value;
        break;
      default: {
        auto s = Unescape(key, value);
        if (!s.ok()) return s.status();
        std::string* dst = index == 1   ? &id.model
                           : index == 2 ? &id.revision
                           : index == 3 ? &id.kv_dtype
                                        : &id.layout_tag;
        *dst = std::move(s).value();
      }
    }
  }
  for (size_t i = 0; i < kNumFields; ++i) {
    if (!seen[i] && i != kChecksumKeyField) return ManifestError(kNames[i], "is missing");
  }
  if (checksum_key_record != nullptr) *checksum_key_record = std::move(checksum_key);
  return id;
}

Fingerprint16 FingerprintBytes(const NamespaceIdentity& id) {
  std::string text = CanonicalManifest(id);
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(text.data(), text.size()));
  Fingerprint16 out;
  std::memcpy(out.data(), canon.digest, 16);
  return out;
}

std::string Fingerprint(const NamespaceIdentity& id) {
  Fingerprint16 fp = FingerprintBytes(id);
  std::string out;
  for (uint8_t b : fp) {
    out.push_back(kHexLower[b >> 4]);
    out.push_back(kHexLower[b & 0xf]);
  }
  return out;
}

std::string NamespaceDirName(const NamespaceIdentity& id) { return "ns-" + Fingerprint(id).substr(0, 16); }

bool IsNamespaceDirName(std::string_view name) {
  if (name.size() != 19 || name.substr(0, 3) != "ns-") return false;
  for (char c : name.substr(3)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace kvtier
