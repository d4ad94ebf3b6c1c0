// A background load for scripts/io_interference.sh: either copies memory (memcpy of 2 MiB blocks over two 64 MiB
// buffers, i.e. mostly DRAM traffic) or spins on registers (no memory traffic), busy for `duty` of the time.
//   hog memcpy|spin DUTY   (DUTY in (0, 1]; runs until killed)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hog memcpy|spin DUTY\n");
    return 2;
  }
  const std::string kind = argv[1];
  const double duty = std::atof(argv[2]);
  if ((kind != "memcpy" && kind != "spin") || !(duty > 0 && duty <= 1)) {
    std::fprintf(stderr, "hog: kind must be memcpy or spin, duty in (0, 1]\n");
    return 2;
  }
  constexpr size_t kBytes = 64u << 20, kBlock = 2u << 20;
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  volatile unsigned long x = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == "memcpy") {
      for (size_t off = 0; off < kBytes; off += kBlock) std::memcpy(b.data() + off, a.data() + off, kBlock);
    } else {
      for (long i = 0; i < 20000000; ++i) x = x * 6364136223846793005ul + 1;
    }
    const std::chrono::duration<double> busy = std::chrono::steady_clock::now() - t0;
    if (duty < 1) std::this_thread::sleep_for(busy * ((1 - duty) / duty));
  }
}
