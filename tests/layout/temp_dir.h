// A mkdtemp directory under /tmp, removed recursively (without following symlinks) at scope exit.
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "layout/namespace.h"

namespace kvtier::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/kvtier-layout-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    if (path_.empty()) return;
    nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int type, struct FTW*) {
          chmod(p, 0700);  // tests make directories read-only
          return type == FTW_DP ? rmdir(p) : unlink(p);
        },
        16, FTW_DEPTH | FTW_PHYS);
    // Directories made read-only are listed before being made writable: retry once.
    nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int type, struct FTW*) { return type == FTW_DP ? rmdir(p) : unlink(p); },
        16, FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline NamespaceIdentity TestIdentity() {
  NamespaceIdentity id;
  id.model = "Qwen/Qwen2.5-7B-Instruct";
  id.revision = "a09a35458c702b33eeacc393d103063234e8bc28";
  id.kv_dtype = "bfloat16";
  id.tokens_per_chunk = 256;
  id.blocks_per_chunk = 16;
  id.block_bytes = 917504;
  id.tp_size = 2;
  id.pp_size = 1;
  id.layout_tag = "vllm-canonical-v1";
  return id;
}

}  // namespace kvtier::testing
