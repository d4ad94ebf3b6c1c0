// DeviceCopier: the seam between staging slots and the memory a model reads KV from (X1, X2).
//
// The engine's reactor submits the copies that became ready since its last submission as one batch (one launch for
// the CUDA copier; it submits up to three times per iteration of its loop), and polls for completions. Implementations:
// HostCopier (memcpy on a helper thread; vLLM's CPU platform and tests), the CUDA copier (src/cuda, worker side), and
// test doubles.
//
// Threads: Submit and Poll are called by the reactor thread only. The wakeup callback is called from the
// copier's own thread when a completion is ready; it must be cheap and thread-safe (the engine wakes its reactor).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/transfer_types.h"

namespace kvtier {

enum class CopyDirection { kSlotToDevice, kDeviceToSlot };

struct CopyTask {
  uint64_t id = 0;  // chosen by the engine, returned in CopyDone
  CopyDirection direction = CopyDirection::kSlotToDevice;
  uint8_t* slot_data = nullptr;       // start of the bytes transferred in the slot
  uint64_t slot_bytes = 0;            // bytes valid from slot_data (bounds for segments)
  std::vector<CopySegment> segments;  // slot_offset relative to slot_data
  uint64_t job_bytes = 0;             // loads: bytes the whole job copies out of slots (0: unknown); a hint
};

struct CopyDone {
  uint64_t id = 0;
  Status status;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual std::string_view name() const = 0;
  // Called once by the engine before the first Submit.
  virtual void SetWakeup(std::function<void()> wakeup) = 0;
  // Starts the copies; never blocks on them.
  virtual void Submit(std::vector<CopyTask> batch) = 0;
  // Appends finished copies to *done; never blocks.
  virtual void Poll(std::vector<CopyDone>* done) = 0;
  // Number of submitted copies not yet returned by Poll.
  virtual size_t pending() const = 0;
  // Another copier of the same kind, independent of this one (its own thread and queues), or null when this kind
  // cannot make one. An engine with several reactors gives each its own copier this way, so copies spread over
  // cores and no reactor polls another's completions; a copier that returns null is shared by all reactors.
  virtual std::unique_ptr<DeviceCopier> CreateLane() const { return nullptr; }
};

// memcpy on one helper thread; `address` in segments is a host pointer.
std::unique_ptr<DeviceCopier> CreateHostCopier();

// The host copy itself, used by the host copier and by the vLLM worker's copies (kvtier._kvtier.copy_batch), so that
// what `kvtier bench io` measures is what vLLM's CPU workers do: `n` bytes from src to dst, out of a slot
// (kSlotToDevice) with streaming stores when `stream` (HostCopierStreams decides), else memcpy.
void HostCopy(CopyDirection direction, void* dst, const void* src, size_t n, bool stream);

// Whether the host copier copies a chunk of `chunk_bytes` out of its slot with streaming (non-temporal) stores:
// chunks, or chunks of load jobs (`job_bytes`, CopyTask::job_bytes), of at least a quarter of the last-level cache,
// on CPUs with AVX2, outside sanitizer builds, unless KVTIER_HOST_COPY=memcpy. Exposed for tests and `kvtier bench io`.
bool HostCopierStreams(uint64_t chunk_bytes, uint64_t job_bytes = 0);

}  // namespace kvtier
