// The benchmarks of kvtier-bench (bench/kvtier_bench.cc). Each takes the words after its name and returns the
// process exit code; usage and fatal errors are thrown as UsageError / CliError (tools/cli_util.h).
#pragma once

namespace kvtier {

int RunBenchIo(int argc, char** argv);    // bench/io/bench_io.cc
int RunBenchMeta(int argc, char** argv);  // bench/meta/bench_meta.cc

}  // namespace kvtier
