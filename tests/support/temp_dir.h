// A temporary directory for a test, removed with everything in it when the object goes out of scope.
// Lives on the disk under $KVTIER_TEST_DIR (default /var/tmp), not tmpfs, so O_DIRECT paths are exercised.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kvtier::test {

class TempDir {
 public:
  TempDir() {
    const char* base = getenv("KVTIER_TEST_DIR");
    std::string tmpl = std::string(base ? base : "/var/tmp") + "/kvtier-test-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvtier::test
