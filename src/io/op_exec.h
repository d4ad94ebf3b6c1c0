// Helpers shared by the engines that run ops with ordinary blocking syscalls (PosixEngine, FakeEngine) and by
// every engine's Submit() validation. Internal to src/io.
#pragma once

#include "io/io_engine.h"

namespace kvtier::internal {

// 0 when op is well formed for its code, else -EINVAL (missing path, negative fd, null buffer with len > 0).
int ValidateOp(const IoOp& op);

// Runs op with the matching blocking syscall in the calling thread and returns its result as bytes / fd / 0 or
// -errno. Retries EINTR except for close (a retried close may close an fd another thread just opened).
int64_t ExecuteBlocking(const IoOp& op);

}  // namespace kvtier::internal
