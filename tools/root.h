// Opening a storage root's namespaces for the tree-reading commands (stats, fsck, gc).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "layout/namespace.h"

namespace kvtier::cli {

struct RootNamespace {
  std::string dir_name;          // "ns-<16 hex>"
  std::optional<Namespace> ns;   // empty when it could not be opened
  std::string error;             // why not (MANIFEST missing, corrupt, another format version...)
};

// Lists and opens the namespaces under root (only `only` when non-empty). Throws CliError with a one-line message
// for a root that cannot be used: missing, not a directory, a symlink, unreadable, or a non-empty directory that
// holds no kvtier namespace at all (probably the wrong directory). A namespace that fails to open is returned
// with `error` set: callers report it and exit 1.
std::vector<RootNamespace> OpenRootNamespaces(const std::string& root, const std::string& only = "");

}  // namespace kvtier::cli
