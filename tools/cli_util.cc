#include "cli_util.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace kvtier {

// ---------------------------------------------------------------------------------------------------------------
// CliArgs

CliArgs::CliArgs(std::string command, std::string summary, std::vector<FlagSpec> flags)
    : command_(std::move(command)), summary_(std::move(summary)), flags_(std::move(flags)) {}

const FlagSpec* CliArgs::Find(std::string_view name) const {
  for (const FlagSpec& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string CliArgs::Accepted() const {
  std::string s;
  for (const FlagSpec& f : flags_) {
    s += "--" + f.name + (f.value_name.empty() ? "" : " " + f.value_name) + ", ";
  }
  return s + "--help";
}

int RunCliMain(int (*dispatch)(int, char**), int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kvtier: error: %s\n(run 'kvtier --help' or 'kvtier <command> --help')\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // CliError and anything else
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 1;
  }
}

bool CliArgs::ParseOrHelp(int argc, char** argv) {
  Parse(argc, argv);
  if (!help_) return true;
  std::fputs(Usage().c_str(), stdout);
  return false;
}

void CliArgs::Parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() < 3 || a.substr(0, 2) != "--") {
      throw UsageError("kvtier " + command_ + ": unexpected argument '" + std::string(a) +
                       "' (flags start with --); accepted: " + Accepted());
    }
    std::string_view body = a.substr(2);
    std::string name(body.substr(0, body.find('=')));
    const bool inline_value = body.find('=') != std::string_view::npos;
    const FlagSpec* f = Find(name);
    if (f == nullptr) {
      throw UsageError("kvtier " + command_ + ": unknown flag --" + name + "; accepted: " + Accepted());
    }
    std::string value;
    if (f->value_name.empty()) {
      if (inline_value) throw UsageError("--" + name + " takes no value (it is a switch)");
    } else if (inline_value) {
      value = std::string(body.substr(body.find('=') + 1));
    } else {
      if (i + 1 >= argc) throw UsageError("--" + name + " needs a value (" + f->value_name + ")");
      value = argv[++i];
    }
    for (auto& [n, v] : given_) {
      if (n == name) throw UsageError("--" + name + " given more than once");
    }
    given_.emplace_back(name, value);
  }
}

std::string CliArgs::Usage() const {
  std::ostringstream o;
  o << "usage: kvtier " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  size_t w = 0;
  std::vector<std::string> lhs;
  for (const FlagSpec& f : flags_) {
    lhs.push_back("--" + f.name + (f.value_name.empty() ? "" : " " + f.value_name));
    w = std::max(w, lhs.back().size());
  }
  for (size_t i = 0; i < flags_.size(); ++i) {
    o << "  " << lhs[i] << std::string(w - lhs[i].size() + 2, ' ') << flags_[i].help;
    if (!flags_[i].default_text.empty()) o << " (default " << flags_[i].default_text << ")";
    o << "\n";
  }
  o << "  --help" << std::string(w > 6 ? w - 6 + 2 : 2, ' ') << "this text\n";
  return o.str();
}

bool CliArgs::Has(std::string_view name) const {
  for (auto& [n, v] : given_) {
    if (n == name) return true;
  }
  return false;
}

std::string CliArgs::Str(std::string_view name, std::string_view fallback) const {
  for (auto& [n, v] : given_) {
    if (n == name) return v;
  }
  return std::string(fallback);
}

std::string CliArgs::RequiredStr(std::string_view name) const {
  if (!Has(name)) {
    const FlagSpec* f = Find(name);
    throw UsageError("kvtier " + command_ + ": --" + std::string(name) + " " + (f ? f->value_name : "") +
                     " is required");
  }
  std::string v = Str(name);
  if (v.empty()) throw UsageError("--" + std::string(name) + ": empty value");
  return v;
}

uint64_t CliArgs::Size(std::string_view name, uint64_t fallback) const {
  if (!Has(name)) return fallback;
  uint64_t v = 0;
  const std::string s = Str(name);
  if (!ParseSize(s, &v)) {
    throw UsageError("--" + std::string(name) + ": '" + s + "' is not a size (examples: 4096, 64KiB, 2MiB, 1GiB)");
  }
  return v;
}

uint64_t CliArgs::Uint(std::string_view name, uint64_t fallback) const {
  if (!Has(name)) return fallback;
  const std::string s = Str(name);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno != 0) {
    throw UsageError("--" + std::string(name) + ": '" + s + "' is not a non-negative integer");
  }
  return v;
}

double CliArgs::Double(std::string_view name, double fallback) const {
  if (!Has(name)) return fallback;
  const std::string s = Str(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) {
    throw UsageError("--" + std::string(name) + ": '" + s + "' is not a number");
  }
  return v;
}

namespace {
std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

std::vector<uint64_t> CliArgs::SizeList(std::string_view name, std::string_view fallback) const {
  const std::string s = Has(name) ? Str(name) : std::string(fallback);
  std::vector<uint64_t> out;
  for (const std::string& item : SplitComma(s)) {
    uint64_t v = 0;
    if (!ParseSize(item, &v) || v == 0) {
      throw UsageError("--" + std::string(name) + ": '" + item +
                       "' is not a size; give a comma-separated list such as 28MiB,2MiB");
    }
    out.push_back(v);
  }
  return out;
}

std::vector<uint64_t> CliArgs::UintList(std::string_view name, std::string_view fallback) const {
  const std::string s = Has(name) ? Str(name) : std::string(fallback);
  std::vector<uint64_t> out;
  for (const std::string& item : SplitComma(s)) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || item[0] == '-' || *end != '\0' || errno != 0 || v == 0) {
      throw UsageError("--" + std::string(name) + ": '" + item +
                       "' is not a positive integer; give a comma-separated list such as 4,16");
    }
    out.push_back(v);
  }
  return out;
}

std::string CliArgs::Choice(std::string_view name, std::string_view fallback,
                            const std::vector<std::string>& choices) const {
  const std::string v = Has(name) ? Str(name) : std::string(fallback);
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : "|") + c;
  throw UsageError("--" + std::string(name) + ": '" + v + "' is not one of " + list);
}

// ---------------------------------------------------------------------------------------------------------------
// Sizes and numbers

bool ParseSize(std::string_view text, uint64_t* out) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) return false;
  std::string unit(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  long double mult = 1;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = 1024.0L;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = 1024.0L * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = 1024.0L * 1024 * 1024;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    mult = 1024.0L * 1024 * 1024 * 1024;
  } else {
    return false;
  }
  const long double v = std::strtold(number.c_str(), nullptr) * mult;
  if (!(v >= 0) || v > 1.8e19L) return false;
  const long double rounded = std::floor(v + 0.5L);
  if (std::fabs(static_cast<double>(rounded - v)) > 1e-6) return false;  // fractional bytes
  *out = static_cast<uint64_t>(rounded);
  return true;
}

std::string FormatSize(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t div = 1;
  while (u < 4 && bytes >= div * 1024) {
    div *= 1024;
    ++u;
  }
  if (bytes % div == 0) return std::to_string(bytes / div) + units[u];
  return FormatFixed(static_cast<double>(bytes) / static_cast<double>(div), 1) + units[u];
}

std::string FormatFixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string FormatRate(double v) {
  if (!std::isfinite(v)) return "-";
  if (v >= 1e6) return FormatFixed(v / 1e6, 2) + "M";
  if (v >= 1e4) return FormatFixed(v / 1e3, 1) + "k";
  if (v >= 100) return FormatFixed(v, 0);
  return FormatFixed(v, 1);
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------------------------------------------------------
// ProgressBar

ProgressBar::ProgressBar(std::string label, uint64_t total, bool force)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()) {
  tty_ = isatty(STDERR_FILENO) == 1;
  enabled_ = tty_ || force;
  last_draw_ = start_ - std::chrono::seconds(60);
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Set(uint64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto every = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (now - last_draw_ < every) return;
  last_draw_ = now;
  Draw(false);
}

void ProgressBar::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) Draw(true);
}

void ProgressBar::Draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = label_ + " ";
  if (total_ > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth);
    line += "[" + std::string(fill, '#') + std::string(kWidth - fill, '.') + "] " + std::to_string(done_) + "/" +
            std::to_string(total_) + " " + FormatFixed(frac * 100, 0) + "%";
    if (!final && frac > 0.01 && secs > 1) line += " eta " + FormatFixed(secs / frac - secs, 0) + "s";
  } else {
    line += std::to_string(done_);
  }
  line += " " + FormatFixed(secs, 1) + "s";
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

// ---------------------------------------------------------------------------------------------------------------
// TextTable

std::string TextTable::Render() const {
  std::vector<size_t> w(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) w[c] = headers_[c].size();
  for (const auto& r : rows_) {
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  }
  auto numeric = [](const std::string& s) {
    return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+');
  };
  std::ostringstream o;
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    std::string l;
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const std::string pad(w[c] - cell.size(), ' ');
      const bool right = !header ? numeric(cell) : (c > 0);
      l += (c ? "  " : "") + (right ? pad + cell : cell + pad);
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    o << l << "\n";
  };
  line(headers_, true);
  size_t total = 0;
  for (size_t c = 0; c < w.size(); ++c) total += w[c] + (c ? 2 : 0);
  o << std::string(total, '-') << "\n";
  for (const auto& r : rows_) line(r, false);
  return o.str();
}

// ---------------------------------------------------------------------------------------------------------------
// JSON, files, time

std::string JsonString(std::string_view s) {
  std::string o = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw CliError("cannot write " + path + ": " + std::strerror(errno));
  f << text;
  f.close();
  if (!f) throw CliError("cannot write " + path + ": " + std::strerror(errno));
}

std::string FormatTime(int64_t unix_ns) {
  if (unix_ns <= 0) return "-";
  const time_t t = static_cast<time_t>(unix_ns / 1000000000);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

bool DropPageCache() {
  sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace kvtier
