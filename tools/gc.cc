// kvtier gc: enforces a disk budget across every namespace under a storage root (C1), from the tree alone.
//
// When the bytes under the root exceed high-watermark x budget, entries are removed oldest first by modification
// time (publication time: the tree knows no access time, and kvtier never relies on atime) until the total is at
// most low-watermark x budget. Stale publication temporaries are swept first. A fan-out directory that a removal
// empties is removed too (PruneFanoutDir: it would hold disk space no budget counts); running engines that cached
// its existence create it again when they next store there. A running engine that later opens a removed entry sees a
// miss, never an error.
//
// Shared roots (M2): a namespace with usage records (layout/usage_ledger.h) is reconciled afterwards: the
// difference between the bytes of its entries after gc and the records' committed sum is published as a closed
// record, which the next live engine folds in (so gc's removals, and any drift, reach every host's budget).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "layout/chunk_path.h"
#include "layout/scan.h"
#include "layout/usage_counter.h"
#include "layout/usage_ledger.h"
#include "root.h"

namespace kvtier {
namespace {

struct Candidate {
  int64_t mtime_ns;
  uint32_t ns_index;
  uint64_t bytes;
  std::string rel;
};

// M2: the sum of the committed bytes of ns's usage records. any: there are records (a root several hosts share);
// settled: every one was read whole and none is being folded (a claimed dead record's bytes are in no record then).
struct RecordsSum {
  bool any = false;
  bool settled = false;
  int64_t committed = 0;
  bool operator==(const RecordsSum& o) const {
    return any == o.any && settled == o.settled && committed == o.committed;
  }
};

RecordsSum RecordsCommitted(const Namespace& ns) {
  RecordsSum out;
  bool folding = false;
  auto recs = UsageLedger::ReadAll(ns, &folding);
  if (!recs.ok() || (recs->empty() && !folding)) return out;
  out.any = true;
  out.settled = !folding;
  for (const LedgerRecord& u : *recs) {
    out.settled = out.settled && u.valid;
    out.committed += u.valid ? u.committed : 0;
  }
  return out;
}

struct PerNs {
  uint64_t entries = 0, bytes = 0, removed = 0, removed_bytes = 0, swept = 0, swept_bytes = 0;
  RecordsSum records_before;  // RecordsCommitted before the scan
};

struct GcOptions {
  uint64_t temp_max_age_s = 600;
  bool dry = false;
  bool verbose = false;
  bool progress = false;  // a progress bar even when stderr is not a terminal
};

// Scans every namespace: its entries (candidates for removal, oldest first later), its stale temporaries (swept
// unless dry), the bytes under the root (*total). Errors are printed; the result is gc's exit status so far.
int ScanRoot(std::vector<RootNamespace>& spaces, const GcOptions& o, std::vector<PerNs>* per_ns,
             std::vector<Candidate>* candidates, uint64_t* total) {
  std::vector<PerNs>& per = *per_ns;
  int rc = 0;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  ProgressBar scan("scanning", 0, o.progress);
  for (uint32_t i = 0; i < spaces.size(); ++i) {
    auto& r = spaces[i];
    // The MANIFEST temporaries of a cut publication: recovered from, or swept (their bytes count either way).
    per[i].swept += r.recovery.removed;
    per[i].swept_bytes += r.recovery.removed_bytes;
    if (!r.ns) *total += r.recovery.temporary_bytes - r.recovery.removed_bytes;  // else the scan counts those left
    if (r.recovery.recovered) {
      std::printf("recovered %s/MANIFEST from %s (its publication was cut)\n", r.dir_name.c_str(),
                  r.recovery.from.c_str());
    }
    if (!r.ns) {
      std::fprintf(stderr, "kvtier: error: namespace %s: %s (its entries' bytes are not counted)\n", r.dir_name.c_str(),
                   r.error.c_str());
      rc = 1;
      continue;
    }
    const Namespace& ns = *r.ns;
    per[i].records_before = RecordsCommitted(ns);  // M2: compared again before reconciling
    Status st = ScanEntries(ns, [&](const EntryInfo& e) {
      scan.Add(1);
      if (e.is_foreign) return;
      if (e.is_temporary) {
        const bool stale = now_ns - e.mtime_ns >= static_cast<int64_t>(o.temp_max_age_s) * 1000000000;
        if (!stale) {
          *total += e.size_bytes;  // a live writer's: occupies disk, cannot be removed
          return;
        }
        per[i].swept++;
        per[i].swept_bytes += e.size_bytes;
        if (o.verbose) {
          std::printf("%s %s/%s (stale temporary, %s)\n", o.dry ? "would sweep" : "sweep", r.dir_name.c_str(),
                      e.rel_path.c_str(), FormatSize(e.size_bytes).c_str());
        }
        return;
      }
      per[i].entries++;
      per[i].bytes += e.size_bytes;
      *total += e.size_bytes;
      candidates->push_back(Candidate{e.mtime_ns, i, e.size_bytes, e.rel_path});
    });
    if (!st.ok()) {
      std::fprintf(stderr, "kvtier: error: scanning %s: %s\n", r.dir_name.c_str(), st.message().c_str());
      rc = 1;
    }
    if (!o.dry && per[i].swept > 0) {
      auto sw = SweepTemporaries(ns, std::chrono::seconds(o.temp_max_age_s));
      if (!sw.ok()) {
        std::fprintf(stderr, "kvtier: error: sweeping %s: %s\n", r.dir_name.c_str(), sw.status().message().c_str());
        rc = 1;
      } else {
        per[i].swept = sw->removed;
        per[i].swept_bytes = sw->removed_bytes;
      }
    }
  }
  return rc;
}

// Removes entries oldest first until the root holds at most `target` bytes (*total), keeping each namespace's shared
// usage counter in step (C1) and pruning the fan-out directories removals empty.
struct Eviction {
  uint64_t removed = 0, removed_bytes = 0, failed = 0;
};

Eviction EvictOldest(std::vector<RootNamespace>& spaces, const GcOptions& o, uint64_t target,
                     std::vector<Candidate>& candidates, std::vector<PerNs>& per, uint64_t* total) {
  Eviction out;
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.mtime_ns < b.mtime_ns; });
  ProgressBar progress(o.dry ? "selecting" : "removing", 0, o.progress);
  std::vector<std::unique_ptr<SharedUsage>> usages(spaces.size());
  for (const Candidate& c : candidates) {
    if (*total <= target) break;
    auto& r = spaces[c.ns_index];
    bool gone = true;
    const bool unlinked = !o.dry && unlinkat(r.ns->dirfd(), c.rel.c_str(), 0) == 0;
    if (unlinked) {
      // Engines compare the namespace's shared usage counter with their budget (layout/usage_counter.h). Held
      // until gc ends; if no engine holds it, it starts from this scan (minus what gc removed before this file).
      auto& usage = usages[c.ns_index];
      if (!usage) {
        const PerNs& p = per[c.ns_index];
        if (auto u = SharedUsage::Open(*r.ns, p.bytes > p.removed_bytes ? p.bytes - p.removed_bytes : 0); u.ok()) {
          usage = std::move(u.value());
        }
      }
      if (usage) usage->Add(-static_cast<int64_t>(c.bytes));
      // C1: no empty directories left (the entry's fan-out directory: its path up to the last '/').
      PruneFanoutDir(r.ns->dirfd(), std::string_view(c.rel).substr(0, c.rel.rfind('/')));
    }
    if (!o.dry && !unlinked && errno != ENOENT) {
      std::fprintf(stderr, "kvtier: error: cannot remove %s/%s: %s\n", r.dir_name.c_str(), c.rel.c_str(),
                   std::strerror(errno));
      gone = false;
      out.failed++;
    }
    if (!gone) continue;
    *total -= c.bytes;
    out.removed++;
    out.removed_bytes += c.bytes;
    per[c.ns_index].removed++;
    per[c.ns_index].removed_bytes += c.bytes;
    progress.Add(1);
    if (o.verbose) {
      std::printf("%s %s/%s (%s, modified %s)\n", o.dry ? "would remove" : "remove", r.dir_name.c_str(), c.rel.c_str(),
                  FormatSize(c.bytes).c_str(), FormatTime(c.mtime_ns).c_str());
    }
  }
  return out;
}

// M2: reconciles the usage records of namespaces on shared roots with what the tree holds now. Returns 1 when a
// correction could not be published.
int ReconcileRecords(std::vector<RootNamespace>& spaces, const std::vector<PerNs>& per) {
  int rc = 0;
  for (size_t i = 0; i < spaces.size(); ++i) {
    if (!spaces[i].ns) continue;
    const RecordsSum now_sum = RecordsCommitted(*spaces[i].ns);
    if (!now_sum.any && !per[i].records_before.any) continue;  // no records: one host's root, nothing to reconcile
    if (!now_sum.settled || !(now_sum == per[i].records_before)) {
      // An engine stored or evicted during the scan, a record was unreadable or torn, or a dead one was being
      // folded: the tree and the records were not read at one moment, and a correction would be wrong.
      std::printf(
          "gc: %s: usage records changed during the scan, or one was unreadable or being folded: not "
          "reconciled; run gc again when the engines are idle\n",
          spaces[i].dir_name.c_str());
      continue;
    }
    const int64_t committed = now_sum.committed;
    const int64_t entries_now = static_cast<int64_t>(per[i].bytes - per[i].removed_bytes);
    const int64_t delta = entries_now - committed;
    if (delta == 0) continue;
    auto name = UsageLedger::PublishCorrection(*spaces[i].ns, delta);
    if (!name.ok()) {
      std::fprintf(stderr, "kvtier: error: %s: usage records: %s\n", spaces[i].dir_name.c_str(),
                   name.status().message().c_str());
      rc = 1;
      continue;
    }
    std::printf("gc: %s: usage records held %s, the tree %s: correction %s%s published (usage/%s)\n",
                spaces[i].dir_name.c_str(), FormatSize(static_cast<uint64_t>(std::max<int64_t>(0, committed))).c_str(),
                FormatSize(static_cast<uint64_t>(entries_now)).c_str(), delta < 0 ? "-" : "+",
                FormatSize(static_cast<uint64_t>(delta < 0 ? -delta : delta)).c_str(), name->c_str());
  }

  return rc;
}

}  // namespace

int RunGc(int argc, char** argv) {
  CliArgs args("gc",
               "Enforces a disk budget on a storage root: when the bytes of all namespaces exceed\n"
               "high-watermark x budget, removes entries oldest first (by modification time, i.e. publication) until\n"
               "they are at most low-watermark x budget. Also removes publication temporaries older than\n"
               "--temp-max-age. Prints what it removed.",
               {{"root", "DIR", "storage root", ""},
                {"budget", "SIZE", "disk budget for the whole root, e.g. 500GiB", ""},
                {"low-watermark", "FRACTION", "evict down to this fraction of the budget", "0.85"},
                {"high-watermark", "FRACTION", "evict only when usage exceeds this fraction of the budget", "1.0"},
                {"temp-max-age", "SECONDS", "sweep temporaries older than this", "600"},
                {"dry-run", "", "print what would be removed, remove nothing", ""},
                {"no-reconcile", "", "leave the usage records of shared roots as they are", ""},
                {"allow-insecure-root", "", kAllowInsecureRootHelp, ""},
                {"verbose", "", "print every removed file", ""},
                {"progress", "", "show a progress bar even when stderr is not a terminal", ""}});
  if (!args.ParseOrHelp(argc, argv)) return 0;
  const std::string root = args.RequiredStr("root");
  if (!args.Has("budget")) throw UsageError("kvtier gc: --budget SIZE is required");
  const uint64_t budget = args.Size("budget", 0);
  if (budget == 0) throw UsageError("--budget: must be > 0");
  const double low = args.Double("low-watermark", 0.85);
  const double high = args.Double("high-watermark", 1.0);
  if (!(low > 0 && low <= 1)) throw UsageError("--low-watermark: must be in (0, 1]");
  if (!(high >= low && high <= 1)) throw UsageError("--high-watermark: must be in [low-watermark, 1]");
  GcOptions o;
  o.temp_max_age_s = args.Uint("temp-max-age", 600);
  o.dry = args.Has("dry-run");
  o.verbose = args.Has("verbose");
  o.progress = args.Has("progress");

  // L5 (docs/file-format.md, "Creation"): a namespace whose MANIFEST publication was cut is recovered (or its
  // temporaries swept) first.
  auto spaces = OpenRootNamespaces(
      root, "", RootOpen{args.Has("allow-insecure-root"), !o.dry, std::chrono::seconds(o.temp_max_age_s)});
  std::vector<PerNs> per(spaces.size());
  std::vector<Candidate> candidates;
  uint64_t total = 0;
  int rc = ScanRoot(spaces, o, &per, &candidates, &total);
  const uint64_t before = total;
  const auto trigger = static_cast<uint64_t>(static_cast<double>(budget) * high);
  const auto target = static_cast<uint64_t>(static_cast<double>(budget) * low);
  Eviction ev;
  if (total > trigger) ev = EvictOldest(spaces, o, target, candidates, per, &total);
  if (!o.dry && !args.Has("no-reconcile")) rc |= ReconcileRecords(spaces, per);
  TextTable t(
      {"namespace", "entries", "bytes", o.dry ? "would remove" : "removed", "removed bytes", "temporaries swept"});
  uint64_t swept = 0, swept_bytes = 0;
  for (size_t i = 0; i < spaces.size(); ++i) {
    const PerNs& p = per[i];
    swept += p.swept;
    swept_bytes += p.swept_bytes;
    t.AddRow({spaces[i].dir_name, std::to_string(p.entries - p.removed), FormatSize(p.bytes - p.removed_bytes),
              std::to_string(p.removed), FormatSize(p.removed_bytes),
              std::to_string(p.swept) + " (" + FormatSize(p.swept_bytes) + ")"});
  }
  std::fputs(t.Render().c_str(), stdout);
  std::printf(
      "gc: %s before, %s after, budget %s (evict above %s down to %s): %s %llu entries (%s), %llu "
      "temporaries (%s)\n",
      FormatSize(before).c_str(), FormatSize(total).c_str(), FormatSize(budget).c_str(), FormatSize(trigger).c_str(),
      FormatSize(target).c_str(), o.dry ? "would remove" : "removed", static_cast<unsigned long long>(ev.removed),
      FormatSize(ev.removed_bytes).c_str(), static_cast<unsigned long long>(swept), FormatSize(swept_bytes).c_str());
  if (ev.failed > 0 || total > budget) {
    std::fprintf(stderr, "kvtier: error: the root is still over budget (%s > %s)%s\n", FormatSize(total).c_str(),
                 FormatSize(budget).c_str(), ev.failed ? "; some entries could not be removed" : "");
    rc = 1;
  }
  return rc;
}

}  // namespace kvtier
