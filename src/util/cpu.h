// What the CPU this process runs on can execute, for code that picks a vector path at run time (the AVX2 XXH3
// build in src/layout/xxh3_dispatch.cc, the host copier's streaming copy-out in src/transfer/host_copier.cc).
#pragma once

namespace kvtier {

// True when the CPU has AVX2 and the OS saves its registers (the compiler's cpu-support check, which also reads
// XGETBV). Always false off x86-64. Computed once.
bool CpuHasAvx2();

}  // namespace kvtier
