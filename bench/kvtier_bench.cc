// kvtier-bench: the engine's benchmarks, a program of the lab apart from the admin CLI (tools/). `kvtier bench io`
// and `kvtier bench meta` run it (tools/main.cc execs it from beside the kvtier binary, where the build and the
// Python package put it), so they are what users type; `kvtier-bench io|meta [flags]` runs them directly.
//   io    the engine's disk bandwidth against a raw io_uring baseline (bench/io/bench_io.cc)
//   meta  publish, lookup and eviction rates and the index rebuild time at index sizes (bench/meta/bench_meta.cc)
// Exit codes as the CLI's: 0 success, 1 the benchmark could not run, 2 usage error.
#include <cstdio>
#include <cstring>
#include <string>

#include "bench_commands.h"
#include "cli_util.h"

namespace kvtier {
namespace {

int Dispatch(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
      std::fputs("usage: kvtier bench io|meta [flags]   (or kvtier-bench io|meta [flags])\n", stdout);
      return 0;
    }
    throw UsageError("kvtier bench: which benchmark? accepted: io, meta, longdoc");
  }
  const std::string which = argv[1];
  if (which == "io") return RunBenchIo(argc - 2, argv + 2);
  if (which == "meta") return RunBenchMeta(argc - 2, argv + 2);
  throw UsageError("kvtier bench: unknown benchmark '" + which + "'; accepted: io, meta, longdoc");
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::RunCliMain(kvtier::Dispatch, argc, argv); }
