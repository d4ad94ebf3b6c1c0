// Opening a storage root's namespaces for the tree-reading commands (stats, fsck, gc).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "layout/namespace.h"

namespace kvtier {

struct RootNamespace {
  std::string dir_name;         // "ns-<16 hex>"
  std::optional<Namespace> ns;  // empty when it could not be opened
  std::string error;            // why not (MANIFEST missing, corrupt, another format version...)
  ManifestRecovery recovery;    // a cut MANIFEST publication found (and with RootOpen::recover, repaired)
};

struct RootOpen {
  // K2, as the engine: refuse a root that is world-writable without the sticky bit, or owned by another user than
  // this one or root, unless allow_insecure (--allow-insecure-root); and a namespace whose directories (namespace,
  // usage/, both fan-out levels) the engine would refuse (CheckNamespaceTree): that namespace is returned with
  // `error` set, untouched.
  bool allow_insecure = false;
  // L5 (docs/file-format.md, "Creation"): recover a namespace whose MANIFEST publication was cut (RecoverManifest,
  // temporaries older than temp_max_age removed) before opening it; otherwise such a namespace is only reported.
  bool recover = false;
  std::chrono::seconds temp_max_age{600};
};

// Lists and opens the namespaces under root (only `only` when non-empty). Throws CliError with a one-line message
// for a root that cannot be used: missing, not a directory, a symlink (also written "L/" or "L/."), refused by the
// K2 check (RootOpen::allow_insecure), unreadable, or a non-empty directory that holds no kvtier namespace at all
// (probably the wrong directory). A namespace that fails to open is returned with `error` set: callers report it
// and exit 1.
std::vector<RootNamespace> OpenRootNamespaces(const std::string& root, const std::string& only = "",
                                              const RootOpen& how = {});

// The CLI's --allow-insecure-root flag, shared by stats, fsck and gc.
inline constexpr const char* kAllowInsecureRootHelp =
    "accept a root that is world-writable without the sticky bit, or owned by another user (refused otherwise, as "
    "by the engine: docs/cli.md)";

}  // namespace kvtier
