#include "layout/xxh3_dispatch.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>

#include "util/cpu.h"

namespace kvtier::internal {
namespace {

// KVTIER_XXH3=libxxhash forces the package's build (to compare the two, or to rule this path out).
bool UseAvx2() {
#if defined(KVTIER_XXH3_AVX2)
  static const bool use = [] {
    const char* forced = std::getenv("KVTIER_XXH3");
    if (forced != nullptr && std::strcmp(forced, "libxxhash") == 0) return false;
    return CpuHasAvx2();
  }();
  return use;
#else
  return false;
#endif
}

}  // namespace

uint64_t Xxh3Seeded(const void* data, size_t len, uint64_t seed) {
#if defined(KVTIER_XXH3_AVX2)
  if (UseAvx2()) return Xxh3SeededAvx2(data, len, seed);
#endif
  return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t Xxh3Secret(const void* data, size_t len, const void* secret, size_t secret_len) {
#if defined(KVTIER_XXH3_AVX2)
  if (UseAvx2()) return Xxh3SecretAvx2(data, len, secret, secret_len);
#endif
  return XXH3_64bits_withSecret(data, len, secret, secret_len);
}

std::string_view Xxh3Variant() { return UseAvx2() ? "avx2" : "libxxhash"; }

}  // namespace kvtier::internal
