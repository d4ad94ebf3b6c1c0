// kvtier: the command-line tool (SPEC B1). Dispatches to one subcommand per file under tools/.
//
// Exit codes: 0 success; 1 the command ran and found a problem or could not work (bad root, corrupt entries
// left, I/O error); 2 usage error (bad flag or value).
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"

namespace kvtier {
namespace {

// The one list of every `kvtier` command, the C++ ones and those of the Python package (python/kvtier/cli.py runs
// them itself and hands every other argv, --help included, to this binary): purpose and where its docs are.
constexpr const char* kUsage =
    "usage: kvtier <command> [flags]\n"
    "\n"
    "commands:\n"
    "  bench io       raw io_uring vs kvtier engine read/write bandwidth on a directory     docs/cli.md\n"
    "  bench meta     publish / lookup / evict rates and index rebuild time at index sizes  docs/cli.md\n"
    "  bench longdoc  long-document TTFT benchmark against a running vLLM server [py]       docs/performance.md\n"
    "  stats          what a storage root holds, per namespace                              docs/cli.md\n"
    "  fsck           verify every entry of a storage root; --repair removes corrupt ones   docs/cli.md\n"
    "  gc             enforce a disk budget on a storage root (oldest entries first)        docs/cli.md\n"
    "  calibrate      break-even frontier of a model on this machine: thresholds file [py]  docs/calibration.md\n"
    "  replay         replay a JSONL request trace against vLLM: TTFT and hit report [py]   docs/calibration.md\n"
    "\n"
    "[py]: in the Python package (pip install ., README.md), whose `kvtier` command runs them and this binary.\n"
    "Run 'kvtier <command> --help' for the flags of a command.\n";

// Commands of the Python package; this binary alone (a CMake build's build/<preset>/kvtier) does not have them.
bool IsPythonCommand(const std::string& cmd, const char* sub) {
  return cmd == "calibrate" || cmd == "replay" ||
         (cmd == "bench" && sub != nullptr && std::strcmp(sub, "longdoc") == 0);
}

// `kvtier bench io|meta`: the benchmark program kvtier-bench (bench/kvtier_bench.cc), which the build puts beside
// this binary (building the kvtier target builds it too) and the Python package installs beside it. Replaces this
// process; returns only by throwing.
[[noreturn]] void ExecBench(int argc, char** argv) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) throw CliError(std::string("cannot find this binary's directory: ") + std::strerror(errno));
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "kvtier-bench";
  std::vector<char*> args{path.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  throw CliError("cannot run " + path + " (" + std::strerror(errno) +
                 "): 'kvtier bench io|meta' runs the benchmark program kvtier-bench from beside this binary; build "
                 "it (cmake --build <dir> --target kvtier builds both)");
}

int Dispatch(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (IsPythonCommand(cmd, argc >= 3 ? argv[2] : nullptr)) {
    throw CliError("'" + cmd + (cmd == "bench" ? " longdoc" : "") +
                   "' is a command of the Python package: run the `kvtier` that pip install . puts on PATH "
                   "(README.md), or python -m kvtier.cli");
  }
  if (cmd == "bench") {
    if (argc < 3 || argv[2][0] == '-') {
      if (argc >= 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
        std::fputs("usage: kvtier bench io|meta|longdoc [flags]\n", stdout);
        return 0;
      }
      throw UsageError("kvtier bench: which benchmark? accepted: io, meta, longdoc");
    }
    const std::string which = argv[2];
    if (which == "io" || which == "meta") ExecBench(argc, argv);
    throw UsageError("kvtier bench: unknown benchmark '" + which + "'; accepted: io, meta, longdoc");
  }
  if (cmd == "stats") return RunStats(argc - 2, argv + 2);
  if (cmd == "fsck") return RunFsck(argc - 2, argv + 2);
  if (cmd == "gc") return RunGc(argc - 2, argv + 2);
  throw UsageError("unknown command '" + cmd +
                   "'; accepted: bench io, bench meta, bench longdoc, stats, fsck, gc, calibrate, replay");
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::RunCliMain(kvtier::Dispatch, argc, argv); }
