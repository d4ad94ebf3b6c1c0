// Small helpers shared by the `kvtier` subcommands: flag parsing, sizes, a progress bar, tables, JSON text.
//
// Errors at this edge are exceptions (STYLE: exceptions only at the CLI and Python edges):
//   UsageError -> "kvtier: error: ..." and exit code 2 (a bad flag or value: the user must change the command line)
//   CliError   -> "kvtier: error: ..." and exit code 1 (the command could not do its work: a bad root, an I/O error)
// RunCliMain (the main() of kvtier and kvtier-bench) catches both; subcommands throw them and otherwise return their
// exit code.
//
// Thread safety: none needed; the CLI is single-threaded apart from the engine it drives.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A command-line program's main: runs dispatch(argc, argv) and turns what it throws into a one-line "kvtier: error:"
// on stderr and an exit code (UsageError 2, with where to find the usage; CliError and anything else 1).
int RunCliMain(int (*dispatch)(int, char**), int argc, char** argv);

// One accepted flag. `value_name` empty: a boolean switch (--repair); otherwise the flag takes a value, given as
// --flag=value or --flag value.
struct FlagSpec {
  std::string name;        // without the leading dashes
  std::string value_name;  // e.g. "DIR", "SIZE"; empty for switches
  std::string help;
  std::string default_text;  // shown in --help; empty: no default / required
};

// Parses the arguments of one subcommand. Every command also accepts --help (and -h).
class CliArgs {
 public:
  // command: e.g. "bench io" (used in messages); summary: one paragraph for --help.
  CliArgs(std::string command, std::string summary, std::vector<FlagSpec> flags);

  // Parses argv[0, argc) (the words after the subcommand). Throws UsageError naming the bad flag and listing the
  // accepted ones: unknown flag, missing value, value given to a switch, flag repeated, positional argument.
  void Parse(int argc, char** argv);
  // Parse, then for --help prints Usage() to stdout and returns false: the command has nothing more to do. Every
  // command's first line: `if (!args.ParseOrHelp(argc, argv)) return 0;`.
  bool ParseOrHelp(int argc, char** argv);

  bool help() const { return help_; }
  std::string Usage() const;

  bool Has(std::string_view name) const;  // given on the command line
  // Values; `fallback` when absent. Throw UsageError "--name: ..." when the value does not parse.
  std::string Str(std::string_view name, std::string_view fallback = "") const;
  std::string RequiredStr(std::string_view name) const;
  uint64_t Size(std::string_view name, uint64_t fallback) const;  // 28MiB, 2MiB, 1GiB, 4096, 1.5GiB, 64k...
  uint64_t Uint(std::string_view name, uint64_t fallback) const;  // plain decimal
  double Double(std::string_view name, double fallback) const;
  std::vector<uint64_t> SizeList(std::string_view name, std::string_view fallback) const;  // "28MiB,2MiB"
  std::vector<uint64_t> UintList(std::string_view name, std::string_view fallback) const;  // "4,16"
  // One of `choices`.
  std::string Choice(std::string_view name, std::string_view fallback, const std::vector<std::string>& choices) const;

  const std::string& command() const { return command_; }

 private:
  const FlagSpec* Find(std::string_view name) const;
  std::string Accepted() const;

  std::string command_;
  std::string summary_;
  std::vector<FlagSpec> flags_;
  std::vector<std::pair<std::string, std::string>> given_;
  bool help_ = false;
};

// "28MiB" -> 29360128. Accepts a decimal number (fraction allowed) and an optional unit: B, K/KB/KiB, M/MB/MiB,
// G/GB/GiB, T/TB/TiB (all binary: 1K = 1024; case-insensitive). Returns false on anything else or overflow.
bool ParseSize(std::string_view text, uint64_t* out);
// 29360128 -> "28MiB" when exact, else "28.0MiB"-style with one decimal.
std::string FormatSize(uint64_t bytes);

// sync(), then drops the page, dentry and inode caches (root only). False when not permitted.
bool DropPageCache();
// Fixed-point with `decimals` digits.
std::string FormatFixed(double v, int decimals);
// Rates with a sensible number of digits: 1234567 -> "1.23M", 12345 -> "12.3k", 12.3 -> "12.3".
std::string FormatRate(double per_second);

// A progress bar on stderr. Shown when stderr is a terminal, or when forced (--progress); otherwise silent.
// On a terminal it redraws one line at most 10 times a second; when forced onto a non-terminal (a log file) it
// writes a full line at most every 5 seconds, so logs never flood. total == 0: unknown total (shows a count).
class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total, bool force);
  ~ProgressBar();  // Finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Set(uint64_t done);
  void Add(uint64_t n) { Set(done_ + n); }
  void Finish();  // final state, newline on a terminal; idempotent
  bool shown() const { return enabled_; }

 private:
  void Draw(bool final);

  std::string label_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  bool enabled_ = false;
  bool tty_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// An aligned text table: a header row, then rows; numbers (cells starting with a digit, '-' or '+') are
// right-aligned, text left-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// JSON string literal with escapes.
std::string JsonString(std::string_view s);
// A JSON number; NaN and infinities become null.
std::string JsonNumber(double v);

// Writes text to path (throws CliError naming the path on failure).
void WriteFile(const std::string& path, const std::string& text);

// Local time "2025-01-31 12:34:56" of Unix nanoseconds.
std::string FormatTime(int64_t unix_ns);

double Median(std::vector<double> v);

}  // namespace kvtier
