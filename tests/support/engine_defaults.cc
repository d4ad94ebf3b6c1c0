// The engine's defaults for a whole suite run (EngineImpl::SetTestDefaults), from the environment scripts/test.sh
// sets: KVTIER_TEST_REACTORS=N runs every engine whose options leave reactors automatic with N reactors (the dev
// suite's second pass, N = 1); KVTIER_TEST_READ_PIECE_BYTES=N reads loads in pieces of N bytes where the options
// keep the default (the sanitizer suites, N = 1: every load lands in several verified pieces). Linked into every
// test binary that links the engine (CMakeLists.txt); the engine itself reads no environment.
#include <cstdlib>

#include "engine/engine_impl.h"

namespace kvtier {
namespace {

uint64_t FromEnv(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? strtoull(v, nullptr, 10) : 0;
}

const bool kInstalled = [] {
  EngineImpl::TestDefaults d;
  d.reactors = static_cast<uint32_t>(FromEnv("KVTIER_TEST_REACTORS"));
  d.read_piece_bytes = FromEnv("KVTIER_TEST_READ_PIECE_BYTES");
  EngineImpl::SetTestDefaults(d);
  return true;
}();

}  // namespace
}  // namespace kvtier
