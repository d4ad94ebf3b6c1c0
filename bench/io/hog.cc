// A background load for scripts/io_interference.sh, busy for `duty` of the time:
//   memcpy  copies 2 MiB blocks between two 64 MiB buffers (DRAM reads and writes)
//   read    sums a 128 MiB buffer with SSE2 loads (DRAM reads only, as checksum verification does)
//   sread   sums a 128 MiB buffer with scalar 8-byte loads (the same reads without vector registers)
//   write   fills a 128 MiB buffer with memset (DRAM writes, with the reads for ownership)
//   stream  fills a 128 MiB buffer with non-temporal stores (DRAM writes only)
//   cached  copies 64 KiB blocks within a 256 KiB buffer (memory instructions that stay in the core's caches)
//   avx     independent 256-bit AVX2 integer operations on registers (vector units, no memory traffic)
//   scalar  8-byte loads and stores within a 256 KiB buffer (memory instructions without vector registers)
//   alu     independent integer operations on registers (busy execution units, no memory traffic)
//   spin    a chain of dependent multiplications on registers (one operation at a time, no memory traffic)
//   hog KIND DUTY   (DUTY in (0, 1]; runs until killed)
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

// 256-bit integer additions on eight independent registers: the vector units busy, no memory traffic.
__attribute__((target("avx2"))) unsigned long AvxBusy(unsigned long seed) {
  __m256i r[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_set1_epi64x(static_cast<long long>(seed + k));
  const __m256i inc = _mm256_set1_epi64x(3);
  for (long i = 0; i < 50000000; ++i) {
    for (int k = 0; k < 8; ++k) r[k] = _mm256_add_epi64(_mm256_xor_si256(r[k], inc), r[(k + 1) % 8]);
    asm volatile("" : "+x"(r[0]), "+x"(r[1]), "+x"(r[2]), "+x"(r[3]), "+x"(r[4]), "+x"(r[5]), "+x"(r[6]), "+x"(r[7]));
  }
  __m256i sum = r[0];
  for (int k = 1; k < 8; ++k) sum = _mm256_add_epi64(sum, r[k]);
  return static_cast<unsigned long>(_mm256_extract_epi64(sum, 0));
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hog memcpy|read|sread|write|stream|cached|avx|scalar|alu|spin DUTY\n");
    return 2;
  }
  const std::string kind = argv[1];
  const double duty = std::atof(argv[2]);
  const std::set<std::string> kinds = {"memcpy", "read", "sread",  "write", "stream",
                                       "cached", "avx",  "scalar", "alu",   "spin"};
  if (!kinds.count(kind) || !(duty > 0 && duty <= 1)) {
    std::fprintf(stderr,
                 "hog: kind must be memcpy, read, sread, write, stream, cached, avx, scalar, alu or spin; "
                 "duty in (0, 1]\n");
    return 2;
  }
  constexpr size_t kBytes = 64u << 20, kBlock = 2u << 20;
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  std::vector<long long> big_buf(2 * kBytes / sizeof(long long));  // read, write, stream: 128 MiB, 16-byte aligned
  __m128i* const big = reinterpret_cast<__m128i*>(big_buf.data());
  const size_t big_n = big_buf.size() * sizeof(long long) / sizeof(__m128i);
  volatile unsigned long x = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == "memcpy") {
      for (size_t off = 0; off < kBytes; off += kBlock) std::memcpy(b.data() + off, a.data() + off, kBlock);
    } else if (kind == "read") {
      __m128i sum = _mm_setzero_si128();
      for (size_t i = 0; i < big_n; ++i) sum = _mm_add_epi64(sum, _mm_load_si128(big + i));
      x = x + static_cast<unsigned long>(_mm_cvtsi128_si64(sum));
    } else if (kind == "sread") {
      const unsigned long* w = reinterpret_cast<const unsigned long*>(big);
      unsigned long s0 = 0, s1 = 0;
      for (size_t i = 0; i + 1 < 2 * big_n; i += 2) {
        s0 += w[i];
        s1 += w[i + 1];
        asm volatile("" : "+r"(s0), "+r"(s1));  // keeps the compiler from vectorizing the loop
      }
      x = x + s0 + s1;
    } else if (kind == "write") {
      std::memset(big, static_cast<int>(x & 0xff), big_n * sizeof(__m128i));
      x = x + 1;
    } else if (kind == "stream") {
      const __m128i v = _mm_set1_epi64x(static_cast<long long>(x));
      for (size_t i = 0; i < big_n; ++i) _mm_stream_si128(big + i, v);
      _mm_sfence();
      x = x + 1;
    } else if (kind == "cached") {
      for (int i = 0; i < 2048; ++i) std::memcpy(b.data() + (i % 2) * 65536, a.data() + 131072, 65536);
    } else if (kind == "avx") {
      x = x + AvxBusy(x);
    } else if (kind == "scalar") {
      volatile unsigned long* w = reinterpret_cast<volatile unsigned long*>(b.data());
      for (int pass = 0; pass < 400; ++pass) {
        for (size_t i = 0; i < 32768; ++i) w[i] = w[(i + 16384) % 32768] + 1;
      }
    } else if (kind == "alu") {
      unsigned long r0 = x, r1 = x + 1, r2 = x + 2, r3 = x + 3, r4 = x + 4, r5 = x + 5, r6 = x + 6, r7 = x + 7;
      for (long i = 0; i < 50000000; ++i) {
        r0 += r1 ^ 3, r1 += r2 ^ 5, r2 += r3 ^ 7, r3 += r4 ^ 9;
        r4 += r5 ^ 11, r5 += r6 ^ 13, r6 += r7 ^ 15, r7 += r0 ^ 17;
        asm volatile("" : "+r"(r0), "+r"(r1), "+r"(r2), "+r"(r3), "+r"(r4), "+r"(r5), "+r"(r6), "+r"(r7));
      }
      x = r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7;
    } else {
      for (long i = 0; i < 20000000; ++i) x = x * 6364136223846793005ul + 1;
    }
    const std::chrono::duration<double> busy = std::chrono::steady_clock::now() - t0;
    if (duty < 1) std::this_thread::sleep_for(busy * ((1 - duty) / duty));
  }
}
