// kvtier: the command-line tool (SPEC B1). Dispatches to one subcommand per file under tools/.
//
// Exit codes: 0 success; 1 the command ran and found a problem or could not work (bad root, corrupt entries
// left, I/O error); 2 usage error (bad flag or value).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli_util.h"
#include "commands.h"

namespace {

constexpr const char* kUsage =
    "usage: kvtier <command> [flags]\n"
    "\n"
    "commands:\n"
    "  bench io     raw io_uring vs kvtier engine read/write bandwidth on a directory\n"
    "  bench meta   publish / lookup / evict rates and index rebuild time at several index sizes\n"
    "  stats        what a storage root holds, per namespace\n"
    "  fsck         verify every entry of a storage root; --repair removes corrupt entries and stale temporaries\n"
    "  gc           enforce a disk budget on a storage root (oldest entries first)\n"
    "\n"
    "Run 'kvtier <command> --help' for the flags of a command.\n";

int Dispatch(int argc, char** argv) {
  using namespace kvtier::cli;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "bench") {
    if (argc < 3 || argv[2][0] == '-') {
      if (argc >= 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
        std::fputs("usage: kvtier bench io|meta [flags]\n", stdout);
        return 0;
      }
      throw UsageError("kvtier bench: which benchmark? accepted: io, meta");
    }
    const std::string which = argv[2];
    if (which == "io") return RunBenchIo(argc - 3, argv + 3);
    if (which == "meta") return RunBenchMeta(argc - 3, argv + 3);
    throw UsageError("kvtier bench: unknown benchmark '" + which + "'; accepted: io, meta");
  }
  if (cmd == "stats") return RunStats(argc - 2, argv + 2);
  if (cmd == "fsck") return RunFsck(argc - 2, argv + 2);
  if (cmd == "gc") return RunGc(argc - 2, argv + 2);
  throw UsageError("unknown command '" + cmd + "'; accepted: bench io, bench meta, stats, fsck, gc");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Dispatch(argc, argv);
  } catch (const kvtier::cli::UsageError& e) {
    std::fprintf(stderr, "kvtier: error: %s\n(run 'kvtier --help' or 'kvtier <command> --help')\n", e.what());
    return 2;
  } catch (const kvtier::cli::CliError& e) {
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 1;
  }
}
