// The MANIFEST's text, shared by namespace.cc (which reads, compares and publishes it) and manifest.cc (which
// writes and parses it: docs/file-format.md, "MANIFEST"). Internal to src/layout.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "layout/namespace.h"

namespace kvtier::internal {

// A MANIFEST longer than this is refused when read; a valid identity's is far shorter (ValidateIdentity).
inline constexpr size_t kMaxManifestBytes = 64 * 1024;
static_assert(4 * 3 * kMaxIdentityStringBytes + 1024 < kMaxManifestBytes, "a valid identity's MANIFEST is readable");

// A field's value as the MANIFEST writes it: '%', control characters (below 0x20) and DEL as %XX (upper-case hex);
// every other byte as it is.
std::string Escape(std::string_view v);

// The manifest's fields in canonical order, each rendered as its (unescaped) value. Used to write the manifest and
// to name the first differing field.
struct Field {
  const char* name;
  std::string value;
  bool is_string;
};
std::vector<Field> Fields(const NamespaceIdentity& id);

// K3: "none" or "k3:" + 32 lowercase hex digits.
bool IsChecksumKeyRecord(std::string_view v);

}  // namespace kvtier::internal
