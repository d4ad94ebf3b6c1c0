// XXH3 with AVX2 for the payload checksums. Debian's libxxhash is built for baseline x86-64 (SSE2), which hashes
// ~19 GB/s per thread on the machines we test on; the same algorithm from the package's own header compiled with
// AVX2 does ~30 GB/s on 64 MiB (`kvtier bench io --verbose` prints both). The results are bit-identical (XXH3's vector
// paths are interchangeable), so this only changes how much CPU a load's verification or a store's checksums take.
// CMake compiles this file with -mavx2 and defines KVTIER_XXH3_AVX2 on x86-64; xxh3_dispatch.cc calls it only when
// the CPU reports AVX2 at run time.
#if defined(KVTIER_XXH3_AVX2)
#if !defined(__AVX2__)
#error "xxh3_avx2.cc must be compiled with -mavx2 (see CMakeLists.txt)"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "layout/xxh3_dispatch.h"

namespace kvtier::internal {

uint64_t Xxh3SeededAvx2(const void* data, size_t len, uint64_t seed) { return XXH3_64bits_withSeed(data, len, seed); }

uint64_t Xxh3SecretAvx2(const void* data, size_t len, const void* secret, size_t secret_len) {
  return XXH3_64bits_withSecret(data, len, secret, secret_len);
}

}  // namespace kvtier::internal
#endif
