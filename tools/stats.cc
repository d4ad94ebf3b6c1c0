// kvtier stats: what a storage root holds, per namespace, read from the tree (not from a live engine).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "layout/scan.h"
#include "layout/usage_ledger.h"
#include "root.h"

namespace kvtier {
namespace {

struct NsStats {
  std::string dir_name;
  std::string error;
  NamespaceIdentity id;
  std::string fingerprint;
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t temporaries = 0;
  uint64_t temp_bytes = 0;
  uint64_t foreign = 0;
  int64_t oldest_ns = 0;
  int64_t newest_ns = 0;
  std::vector<LedgerRecord> usage;  // M2: the per-engine usage records of a shared root
  int64_t usage_sum = 0;
};

std::string IdentityJson(const NamespaceIdentity& id) {
  return "{\"model\": " + JsonString(id.model) + ", \"revision\": " + JsonString(id.revision) +
         ", \"kv_dtype\": " + JsonString(id.kv_dtype) +
         ", \"tokens_per_chunk\": " + std::to_string(id.tokens_per_chunk) +
         ", \"blocks_per_chunk\": " + std::to_string(id.blocks_per_chunk) +
         ", \"block_bytes\": " + std::to_string(id.block_bytes) + ", \"tp_size\": " + std::to_string(id.tp_size) +
         ", \"pp_size\": " + std::to_string(id.pp_size) + ", \"layout_tag\": " + JsonString(id.layout_tag) +
         ", \"format_version\": " + std::to_string(id.format_version) + "}";
}

// One namespace's figures: its identity, a scan of its entries, its usage records. An error is printed on stderr
// (once) and kept in the result.
NsStats ScanNamespace(RootNamespace& r, bool progress_bar) {
  NsStats s;
  s.dir_name = r.dir_name;
  if (!r.ns) {
    s.error = r.error;
    std::fprintf(stderr, "kvtier: error: namespace %s: %s\n", r.dir_name.c_str(), r.error.c_str());
    return s;
  }
  s.id = r.ns->identity();
  s.fingerprint = Fingerprint(s.id);
  s.oldest_ns = std::numeric_limits<int64_t>::max();
  ProgressBar progress("scanning " + r.dir_name, 0, progress_bar);
  Status st = ScanEntries(*r.ns, [&](const EntryInfo& e) {
    if (e.is_foreign) {
      s.foreign++;
    } else if (e.is_temporary) {
      s.temporaries++;
      s.temp_bytes += e.size_bytes;
    } else {
      s.entries++;
      s.bytes += e.size_bytes;
      s.oldest_ns = std::min(s.oldest_ns, e.mtime_ns);
      s.newest_ns = std::max(s.newest_ns, e.mtime_ns);
    }
    progress.Add(1);
  });
  progress.Finish();
  if (s.entries == 0) s.oldest_ns = 0;
  if (auto recs = UsageLedger::ReadAll(*r.ns); recs.ok()) {
    s.usage = std::move(recs.value());
    for (const LedgerRecord& u : s.usage) s.usage_sum += u.valid ? u.committed + (u.closed ? 0 : u.reserved) : 0;
  }
  if (!st.ok()) {
    s.error = st.message();
    std::fprintf(stderr, "kvtier: error: namespace %s: %s\n", r.dir_name.c_str(), st.message().c_str());
  }
  return s;
}

void PrintJson(const std::string& root, const std::vector<NsStats>& all, uint64_t total_entries, uint64_t total_bytes) {
  std::string o = "{\"root\": " + JsonString(root) + ", \"total_entries\": " + std::to_string(total_entries) +
                  ", \"total_bytes\": " + std::to_string(total_bytes) + ", \"namespaces\": [";
  for (size_t i = 0; i < all.size(); ++i) {
    const NsStats& s = all[i];
    o += (i ? ", " : "") + std::string("{\"name\": ") + JsonString(s.dir_name);
    if (!s.error.empty()) o += ", \"error\": " + JsonString(s.error);
    if (!s.fingerprint.empty()) {
      o += ", \"fingerprint\": " + JsonString(s.fingerprint) + ", \"identity\": " + IdentityJson(s.id) +
           ", \"entries\": " + std::to_string(s.entries) + ", \"bytes\": " + std::to_string(s.bytes) +
           ", \"temporaries\": " + std::to_string(s.temporaries) +
           ", \"temporary_bytes\": " + std::to_string(s.temp_bytes) + ", \"foreign\": " + std::to_string(s.foreign) +
           ", \"oldest_mtime_ns\": " + std::to_string(s.oldest_ns) +
           ", \"newest_mtime_ns\": " + std::to_string(s.newest_ns) + ", \"usage_sum\": " + std::to_string(s.usage_sum) +
           ", \"usage\": [";
      for (size_t j = 0; j < s.usage.size(); ++j) {
        const LedgerRecord& u = s.usage[j];
        o += (j ? ", " : "") + std::string("{\"name\": ") + JsonString(u.name) +
             ", \"valid\": " + (u.valid ? "true" : "false") + ", \"committed\": " + std::to_string(u.committed) +
             ", \"reserved\": " + std::to_string(u.reserved) + ", \"closed\": " + (u.closed ? "true" : "false") +
             ", \"written_unix_ns\": " + std::to_string(u.written_unix_ns) + "}";
      }
      o += "]";
    }
    o += "}";
  }
  o += "]}\n";
  std::fputs(o.c_str(), stdout);
}

void PrintText(const std::string& root, const std::vector<NsStats>& all, uint64_t total_entries, uint64_t total_bytes) {
  std::printf("root %s: %zu namespace%s, %llu entries, %s\n", root.c_str(), all.size(), all.size() == 1 ? "" : "s",
              static_cast<unsigned long long>(total_entries), FormatSize(total_bytes).c_str());
  for (const NsStats& s : all) {
    std::printf("\n%s\n", s.dir_name.c_str());
    if (s.fingerprint.empty()) {
      std::printf("  error        (above)\n");  // printed once, on stderr, when it was found
      continue;
    }
    const NamespaceIdentity& id = s.id;
    std::printf("  model        %s (revision %s)\n", id.model.c_str(), id.revision.c_str());
    std::printf("  kv           %s, %u tokens/chunk, %u blocks/chunk x %llu B, tp %u pp %u, layout %s, format v%u\n",
                id.kv_dtype.c_str(), id.tokens_per_chunk, id.blocks_per_chunk,
                static_cast<unsigned long long>(id.block_bytes), id.tp_size, id.pp_size, id.layout_tag.c_str(),
                id.format_version);
    std::printf("  fingerprint  %s\n", s.fingerprint.c_str());
    std::printf("  entries      %llu (%s)\n", static_cast<unsigned long long>(s.entries), FormatSize(s.bytes).c_str());
    std::printf("  temporaries  %llu (%s)\n", static_cast<unsigned long long>(s.temporaries),
                FormatSize(s.temp_bytes).c_str());
    std::printf("  foreign      %llu\n", static_cast<unsigned long long>(s.foreign));
    std::printf("  oldest       %s\n", FormatTime(s.oldest_ns).c_str());
    std::printf("  newest       %s\n", FormatTime(s.newest_ns).c_str());
    if (!s.usage.empty()) {
      // M2: one record per engine that used this namespace on a shared root; their sum is what engines compare
      // with the budget (a record's own figure is what that engine changed, not what it owns).
      std::printf("  usage        %zu records, sum %s (docs/operations.md, shared filesystems)\n", s.usage.size(),
                  FormatSize(static_cast<uint64_t>(std::max<int64_t>(0, s.usage_sum))).c_str());
      for (const LedgerRecord& u : s.usage) {
        if (!u.valid) {
          std::printf("    %-40s unreadable\n", u.name.c_str());
          continue;
        }
        std::printf("    %-40s committed %s%s, reserved %s, %s %s\n", u.name.c_str(), u.committed < 0 ? "-" : "",
                    FormatSize(static_cast<uint64_t>(u.committed < 0 ? -u.committed : u.committed)).c_str(),
                    FormatSize(static_cast<uint64_t>(std::max<int64_t>(0, u.reserved))).c_str(),
                    u.closed ? "closed" : "written", FormatTime(u.written_unix_ns).c_str());
      }
    }
    if (!s.error.empty()) std::printf("  error        (above)\n");
  }
}

}  // namespace

int RunStats(int argc, char** argv) {
  CliArgs args("stats",
               "Reads a storage root and prints, for each namespace: its identity (from MANIFEST), the number of\n"
               "entries and their bytes, publication temporaries, foreign files, and the oldest and newest entry.\n"
               "Live engine counters (hits, loads, ...) come from the running engine, not from here.",
               {{"root", "DIR", "storage root", ""},
                {"json", "", "print one JSON object instead of text", ""},
                {"allow-insecure-root", "", kAllowInsecureRootHelp, ""},
                {"progress", "", "show a progress bar even when stderr is not a terminal", ""}});
  if (!args.ParseOrHelp(argc, argv)) return 0;
  const std::string root = args.RequiredStr("root");
  auto spaces = OpenRootNamespaces(root, "", RootOpen{args.Has("allow-insecure-root")});

  std::vector<NsStats> all;
  int rc = 0;
  uint64_t total_entries = 0, total_bytes = 0;
  for (auto& r : spaces) {
    all.push_back(ScanNamespace(r, args.Has("progress")));
    if (!all.back().error.empty()) rc = 1;
    total_entries += all.back().entries;
    total_bytes += all.back().bytes + all.back().temp_bytes;
  }
  if (args.Has("json")) {
    PrintJson(root, all, total_entries, total_bytes);
  } else {
    PrintText(root, all, total_entries, total_bytes);
  }
  return rc;
}

}  // namespace kvtier
