#include "root.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstring>

#include "cli_util.h"

namespace kvtier {
namespace {

// CheckTrustedDirectory's advice, for the CLI: the engine's option is the CLI's flag.
std::string WithFlag(std::string msg) {
  const std::string option = "set allow_insecure_root";
  if (const size_t at = msg.find(option); at != std::string::npos) {
    msg.replace(at, option.size(), "pass --allow-insecure-root");
  }
  return msg;
}

}  // namespace

std::vector<RootNamespace> OpenRootNamespaces(const std::string& root, const std::string& only, const RootOpen& how) {
  auto names = ListNamespaces(root);
  if (!names.ok()) throw CliError(names.status().message());
  // K2: the engine's root check (the namespace directories' own checks stay the engine's).
  if (struct stat st; !how.allow_insecure && stat(CanonicalRootPath(root).c_str(), &st) == 0) {
    Status trusted = CheckTrustedDirectory(st, "storage root " + root, /*group_shared=*/false);
    if (!trusted.ok()) throw CliError(WithFlag(trusted.message()));
  }
  std::vector<RootNamespace> out;
  if (!only.empty()) {
    if (!IsNamespaceDirName(only)) {
      throw UsageError("--namespace: '" + only + "' is not a namespace directory name (ns-<16 hex digits>)");
    }
    bool found = false;
    for (const auto& n : *names) found = found || n == only;
    if (!found) throw CliError("namespace " + only + " does not exist under " + root);
    names = std::vector<std::string>{only};
  }
  if (names->empty()) {
    // An empty root is a fresh cache; a root full of other things is probably the wrong directory.
    DIR* d = opendir(root.c_str());
    if (d == nullptr) throw CliError("cannot read storage root " + root + ": " + std::strerror(errno));
    int others = 0;
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++others;
    }
    closedir(d);
    if (others > 0) {
      throw CliError("storage root " + root + " holds no kvtier namespace (ns-<16 hex>/MANIFEST) but " +
                     std::to_string(others) + " other entries: is it the right directory?");
    }
  }
  for (const std::string& name : *names) {
    RootNamespace r;
    r.dir_name = name;
    // K2: the namespace's directories as the engine checks them (all of them: the tools act on the whole tree),
    // before anything is recovered, read or removed there.
    if (Status trusted = how.allow_insecure ? Status::Ok() : CheckNamespaceTree(root, name); !trusted.ok()) {
      r.error = WithFlag(trusted.message());
      out.push_back(std::move(r));
      continue;
    }
    if (how.recover) {
      auto rec = RecoverManifest(root, name, how.temp_max_age, /*apply=*/true);
      if (rec.ok()) r.recovery = rec.value();
    }
    auto ns = Namespace::OpenExisting(root, name);
    if (ns.ok()) {
      r.ns.emplace(std::move(ns.value()));
    } else {
      r.error = ns.status().message();
      if (auto rec = RecoverManifest(root, name, how.temp_max_age, /*apply=*/false);
          !how.recover && rec.ok() && rec->temporaries > 0) {
        r.recovery = rec.value();
        r.error += rec->recoverable ? "; its publication was cut: " + rec->from +
                                          " is whole, and --repair (fsck) or gc recovers MANIFEST from it"
                                    : "; its publication was cut and no temporary is whole: --repair (fsck) or gc "
                                      "removes them once older than --temp-max-age";
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvtier
