// The `kvtier` subcommands (the benchmarks are a program of their own: bench/kvtier_bench.cc). Each takes the words
// after its name and returns the process exit code; usage errors and fatal errors are thrown as UsageError /
// CliError (cli_util.h) and turned into exit codes by main.
#pragma once

namespace kvtier {

int RunStats(int argc, char** argv);  // tools/stats.cc
int RunFsck(int argc, char** argv);   // tools/fsck.cc
int RunGc(int argc, char** argv);     // tools/gc.cc

}  // namespace kvtier
