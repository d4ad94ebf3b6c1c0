// Picks the fastest XXH3 build this CPU runs (see xxh3_avx2.cc); every variant returns the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvtier::internal {

#if defined(KVTIER_XXH3_AVX2)  // set by CMake on x86-64, where xxh3_avx2.cc is built with -mavx2
uint64_t Xxh3SeededAvx2(const void* data, size_t len, uint64_t seed);
uint64_t Xxh3SecretAvx2(const void* data, size_t len, const void* secret, size_t secret_len);
#endif

// XXH3_64bits_withSeed / _withSecret through the chosen variant.
uint64_t Xxh3Seeded(const void* data, size_t len, uint64_t seed);
uint64_t Xxh3Secret(const void* data, size_t len, const void* secret, size_t secret_len);

// "avx2" or "libxxhash" (the package's build): which one Xxh3Seeded/Xxh3Secret use on this CPU.
std::string_view Xxh3Variant();

}  // namespace kvtier::internal
