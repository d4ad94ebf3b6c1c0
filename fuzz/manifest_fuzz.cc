// libFuzzer target: the namespace MANIFEST parser (src/layout/namespace.h), which reads a file any process sharing
// the root could have written. Properties: never crashes; whatever parses prints back canonically and parses to
// the same identity; identity validation never crashes on what parses.
#include <cstdint>
#include <string_view>

#include "layout/namespace.h"

namespace kvtier {

namespace {

int FuzzOne(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto id = ParseManifest(text);
  if (!id.ok()) return 0;
  (void)ValidateIdentity(id.value());
  const std::string canonical = CanonicalManifest(id.value());
  auto again = ParseManifest(canonical);
  if (!again.ok() || !(again.value() == id.value())) __builtin_trap();
  if (CanonicalManifest(again.value()) != canonical) __builtin_trap();
  (void)Fingerprint(id.value());
  return 0;
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kvtier::FuzzOne(data, size); }
