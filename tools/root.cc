#include "root.h"

#include <dirent.h>

#include <cstring>

#include "cli_util.h"

namespace kvtier::cli {

std::vector<RootNamespace> OpenRootNamespaces(const std::string& root, const std::string& only) {
  auto names = ListNamespaces(root);
  if (!names.ok()) throw CliError(names.status().message());
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
    auto ns = Namespace::OpenExisting(root, name);
    if (ns.ok()) {
      r.ns.emplace(std::move(ns.value()));
    } else {
      r.error = ns.status().message();
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvtier::cli
