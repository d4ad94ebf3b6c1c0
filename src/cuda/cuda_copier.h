// CudaCopier: moves N scattered segments between host memory (the staging pool's slots) and GPU memory (vLLM's
// paged KV blocks) with one launch per batch, on a dedicated stream per direction, completion by events (X1, X2).
//
// Two ways to run a batch, chosen by CudaCopyMode (docs/gpu.md has the measurements behind the default):
//   kBatchApi  cudaMemcpyBatchAsync (CUDA 12.8+): the copy engines take every segment from one call.
//   kKernel    a copy kernel: one thread block per piece (a segment split into pieces of at most 256 KiB),
//              16-byte loads and stores, reading (H2D) or writing (D2H) registered host memory through its mapped
//              device pointer (cudaHostGetDevicePointer). Host ranges must have been registered (RegisterHost).
//
// Ordering: each batch first waits (cudaStreamWaitEvent, never a host or device-wide sync) for the work queued so
// far on the caller's stream (e.g. the forward pass that produced the KV a store copies out), then runs on the
// copier's own stream for that direction. A ticket names the completion of everything queued on that direction's
// stream up to it; Query polls it, Wait blocks the calling thread on that event alone.
//
// No CUDA type appears here: streams are opaque integers (a cudaStream_t's value; torch's
// `torch.cuda.current_stream().cuda_stream`), so the Python edge and the engine need no CUDA headers.
//
// Threads: every method is thread-safe (one internal mutex; Wait does not hold it while blocking). The device is
// made current on the calling thread by each call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvtier/status.h"
#include "transfer/device_copier.h"

namespace kvtier {

enum class CudaCopyMode { kAuto, kBatchApi, kKernel };
enum class CudaCopyDirection { kHostToDevice, kDeviceToHost };

std::string_view CudaCopyModeName(CudaCopyMode mode);        // "auto" | "batch_api" | "kernel"
Result<CudaCopyMode> ParseCudaCopyMode(std::string_view s);  // the names above; kInvalidArgument otherwise

// The caller's stream handle: copies wait for the work queued on it so far. 0 is the legacy default stream.
using CudaStreamHandle = uintptr_t;
inline constexpr CudaStreamHandle kNoCudaStreamDependency = ~CudaStreamHandle{0};

// cudaHostRegister refuses very large ranges on some drivers; RegisterHost registers in pieces of at most this.
inline constexpr uint64_t kMaxRegisterPieceBytes = uint64_t{64} << 30;

struct CudaCopierOptions {
  int device = 0;
  CudaCopyMode mode = CudaCopyMode::kAuto;  // kAuto: the measured default (docs/gpu.md), kernel if no batch API
  uint32_t kernel_threads = 256;            // threads per block of the copy kernel (a multiple of 32, <= 1024)
  uint32_t kernel_blocks_per_sm = 4;        // grid = min(pieces, SMs * this)
  uint64_t kernel_piece_bytes = 256 << 10;  // segments are split into pieces of at most this many bytes
};

class CudaCopier {
 public:
  // Errors: kUnsupported when there is no CUDA device (or the driver is missing), kInvalidArgument for a bad
  // device or option, kUnsupported for mode kBatchApi where the runtime or driver lacks cudaMemcpyBatchAsync.
  static Result<std::unique_ptr<CudaCopier>> Create(const CudaCopierOptions& options);
  ~CudaCopier();  // waits for its own streams, then unregisters every range it registered
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  // Registers [base, base + bytes) with CUDA (portable, mapped) in pieces of at most kMaxRegisterPieceBytes, so
  // copies from and to it run at DMA speed and the kernel can address it. Registering a range that overlaps one
  // registered earlier is kAlreadyExists. Unregistered on destruction.
  Status RegisterHost(void* base, size_t bytes);
  // Registers the whole mapping of this process that contains addr (from /proc/self/maps), e.g. the engine's
  // staging pool, of which only slot addresses are known. Ok if it is registered already.
  Status RegisterMappingContaining(const void* addr);
  // Registers every mapping of POSIX shared-memory object `shm_name` ("/kvtier-..."), e.g. Engine::pool_name().
  Status RegisterShmMappings(std::string_view shm_name);
  bool IsRegistered(const void* addr, size_t bytes) const;

  // Queues the copies dst[i] <- src[i] (sizes[i] bytes, i < n) after the work queued so far on `stream`, as one
  // launch, and returns the ticket of their completion. For kHostToDevice src are host addresses and dst device
  // addresses; the reverse for kDeviceToHost. Segments must not overlap each other's destination. n == 0 is
  // allowed (a ticket for the work queued so far). Errors: kInvalidArgument (null address, a host range not
  // registered in kernel mode), kInternal with the CUDA error's name and message.
  Result<uint64_t> CopyBatch(CudaCopyDirection direction, const uint64_t* dst, const uint64_t* src,
                             const uint64_t* sizes, size_t n, CudaStreamHandle stream);
  // A ticket for everything queued so far on the direction's stream.
  Result<uint64_t> Record(CudaCopyDirection direction);
  // True once the ticket's copies completed (and for tickets already waited for or seen complete). False while
  // running, and for tickets never issued.
  bool Query(uint64_t ticket);
  // Blocks the calling thread until the ticket completes (cudaEventSynchronize on its event alone). kNotFound for
  // tickets never issued; kInternal if the copies failed.
  Status Wait(uint64_t ticket);
  // Makes `stream` wait (on the device, no host block) for the ticket's copies: e.g. the forward pass after a load.
  Status StreamWait(uint64_t ticket, CudaStreamHandle stream);

  // Calls fn(arg) on a CUDA-owned thread after the work queued so far on the direction's stream
  // (cudaLaunchHostFunc). fn must be cheap and must not call CUDA; arg must outlive the call. Used to wake the
  // engine's reactor when a copy completes.
  Status Notify(CudaCopyDirection direction, void (*fn)(void*), void* arg);

  CudaCopyMode mode() const;  // never kAuto
  int device() const;
  std::string Describe() const;  // device name, mode, registered bytes

  struct Impl;

 private:
  // Only Create constructs it (std::make_unique with a key nobody else can name).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  CudaCopier(Passkey, std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// The engine's DeviceCopier on top of a CudaCopier: every task of one Submit becomes one launch per direction;
// CopySegment.address is a device pointer. The staging pool's mapping is registered on first sight (the engine
// hands over slot pointers only). Completion wakes the engine's reactor through a host callback.
Result<std::unique_ptr<DeviceCopier>> CreateCudaDeviceCopier(const CudaCopierOptions& options);

}  // namespace kvtier
