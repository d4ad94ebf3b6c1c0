// CudaCopier: batched copies between registered host memory and GPU memory (cuda_copier.h is the contract).
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_copier.h"

namespace kvtier {

namespace {

// One unit of work of the copy kernel: a segment, or a piece of one (see CudaCopierOptions::kernel_piece_bytes).
struct Piece {
  uint64_t dst;
  uint64_t src;
  uint64_t bytes;
};

Status CudaError(cudaError_t e, std::string_view what) {
  return Status(StatusCode::kInternal,
                std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define KVTIER_CUDA_RETURN(expr, what)                 \
  do {                                                 \
    const cudaError_t kvtier_e_ = (expr);              \
    if (kvtier_e_ != cudaSuccess) {                    \
      (void)cudaGetLastError(); /* clear non-sticky */ \
      return CudaError(kvtier_e_, what);               \
    }                                                  \
  } while (0)

// Streaming loads and stores (evict-first): KV bytes pass through once and should not push other data out of L2.
// Each thread issues kUnroll independent 16-byte loads before its first store, so a block keeps
// threads * kUnroll * 16 bytes of PCIe reads in flight (H2D reads host memory over the bus with ~1-2 us latency).
template <int kUnroll>
__global__ void CopyPiecesKernel(const Piece* __restrict__ pieces, uint32_t n) {
  for (uint32_t i = blockIdx.x; i < n; i += gridDim.x) {
    const Piece p = pieces[i];
    if (((p.dst | p.src | p.bytes) & 15u) == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(p.src);
      uint4* dst = reinterpret_cast<uint4*>(p.dst);
      const uint64_t nv = p.bytes >> 4;
      const uint32_t stride = blockDim.x;
      uint64_t t = threadIdx.x;
      for (; t + uint64_t(kUnroll - 1) * stride < nv; t += uint64_t(kUnroll) * stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(src + t + u * stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) __stcs(dst + t + u * stride, v[u]);
      }
      for (; t < nv; t += stride) __stcs(dst + t, __ldcs(src + t));
    } else {  // unaligned segments: correct, not fast (kvtier's slots and vLLM's blocks are 16-byte aligned)
      const uint8_t* src = reinterpret_cast<const uint8_t*>(p.src);
      uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst);
      for (uint64_t t = threadIdx.x; t < p.bytes; t += blockDim.x) dst[t] = src[t];
    }
  }
}
constexpr int kKernelUnroll = 4;

// One registered piece of host memory and its mapped device address.
struct Range {
  uintptr_t host = 0;
  uint64_t bytes = 0;
  uintptr_t dev = 0;
};

// Pinned host + device buffers holding one kernel launch's pieces; reusable once `done` has completed.
struct Slab {
  Piece* host = nullptr;
  Piece* dev = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool busy = false;
};

struct Ticket {
  cudaEvent_t event = nullptr;
  int waiters = 0;
};

constexpr size_t kMaxSlabs = 64;

bool BatchApiAvailable() {
#if CUDART_VERSION >= 12080
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess) return false;
  return runtime >= 12080 && driver >= 12080;
#else
  return false;
#endif
}

// [start, end) and path of every mapping of this process (from /proc/self/maps).
struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string path;
};
std::vector<Mapping> ReadMappings() {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    unsigned long long s = 0, e = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %*s %*s %*s %*s %n", &s, &e, &consumed) < 2) continue;
    m.start = s;
    m.end = e;
    if (consumed > 0 && size_t(consumed) < line.size()) m.path = line.substr(consumed);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

std::string_view CudaCopyModeName(CudaCopyMode mode) {
  switch (mode) {
    case CudaCopyMode::kAuto: return "auto";
    case CudaCopyMode::kBatchApi: return "batch_api";
    case CudaCopyMode::kKernel: return "kernel";
  }
  return "?";
}

Result<CudaCopyMode> ParseCudaCopyMode(std::string_view s) {
  if (s == "auto") return CudaCopyMode::kAuto;
  if (s == "batch_api") return CudaCopyMode::kBatchApi;
  if (s == "kernel") return CudaCopyMode::kKernel;
  return Status(StatusCode::kInvalidArgument,
                "CUDA copy mode '" + std::string(s) + "'; accepted: auto, batch_api, kernel");
}

struct CudaCopier::Impl {
  CudaCopierOptions options;
  CudaCopyMode mode = CudaCopyMode::kKernel;
  int sm_count = 0;
  std::string device_name;
  cudaStream_t streams[2] = {nullptr, nullptr};    // indexed by CudaCopyDirection
  cudaEvent_t dependency[2] = {nullptr, nullptr};  // recorded on the caller's stream, waited on by ours

  mutable std::mutex mu;      // guards everything below
  std::vector<Range> ranges;  // sorted by host address
  uint64_t registered_bytes = 0;
  std::vector<Slab> slabs;
  size_t next_slab_victim = 0;
  std::vector<cudaEvent_t> free_events;
  std::unordered_map<uint64_t, Ticket> tickets;
  uint64_t next_ticket = 1;
  std::vector<Piece> pieces;  // scratch
  std::vector<void*> batch_dst;
  std::vector<const void*> batch_src;
  std::vector<size_t> batch_sizes;

  cudaStream_t stream(CudaCopyDirection d) const { return streams[d == CudaCopyDirection::kHostToDevice ? 0 : 1]; }
  cudaEvent_t dep(CudaCopyDirection d) const { return dependency[d == CudaCopyDirection::kHostToDevice ? 0 : 1]; }

  // The registered range containing addr, or nullptr. Call with mu held.
  const Range* Find(uintptr_t addr) const {
    auto it =
        std::upper_bound(ranges.begin(), ranges.end(), addr, [](uintptr_t a, const Range& r) { return a < r.host; });
    if (it == ranges.begin()) return nullptr;
    --it;
    return addr < it->host + it->bytes ? &*it : nullptr;
  }

  bool Covered(uintptr_t addr, uint64_t bytes) const {
    while (bytes > 0) {
      const Range* r = Find(addr);
      if (!r) return false;
      const uint64_t n = std::min<uint64_t>(bytes, r->host + r->bytes - addr);
      addr += n;
      bytes -= n;
    }
    return true;
  }

  Status RegisterLocked(void* base, size_t bytes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    if (base == nullptr || bytes == 0) return Status(StatusCode::kInvalidArgument, "RegisterHost: empty range");
    for (const Range& r : ranges) {
      if (b < r.host + r.bytes && r.host < b + bytes) {
        return Status(StatusCode::kAlreadyExists, "RegisterHost: range overlaps one registered earlier");
      }
    }
    std::vector<Range> added;
    for (uint64_t off = 0; off < bytes; off += kMaxRegisterPieceBytes) {
      Range r;
      r.host = b + off;
      r.bytes = std::min<uint64_t>(kMaxRegisterPieceBytes, bytes - off);
      void* host = reinterpret_cast<void*>(r.host);
      cudaError_t e = cudaHostRegister(host, r.bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
      void* dev = nullptr;
      if (e == cudaSuccess) {
        e = cudaHostGetDevicePointer(&dev, host, 0);
        if (e != cudaSuccess) (void)cudaHostUnregister(host);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        for (const Range& a : added) (void)cudaHostUnregister(reinterpret_cast<void*>(a.host));
        return CudaError(e, "cudaHostRegister of " + std::to_string(r.bytes) + " B");
      }
      r.dev = reinterpret_cast<uintptr_t>(dev);
      added.push_back(r);
    }
    for (const Range& r : added) {
      ranges.push_back(r);
      registered_bytes += r.bytes;
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.host < y.host; });
    return Status::Ok();
  }

  Result<cudaEvent_t> TakeEvent() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    KVTIER_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  Result<uint64_t> RecordLocked(CudaCopyDirection d) {
    auto ev = TakeEvent();
    if (!ev.ok()) return ev.status();
    const cudaError_t e = cudaEventRecord(*ev, stream(d));
    if (e != cudaSuccess) {
      free_events.push_back(*ev);
      KVTIER_CUDA_RETURN(e, "cudaEventRecord");
    }
    const uint64_t t = next_ticket++;
    tickets[t] = Ticket{*ev, 0};
    return t;
  }

  // A slab with room for n pieces whose last launch has completed.
  Result<Slab*> TakeSlab(size_t n) {
    for (Slab& s : slabs) {
      if (s.capacity < n) continue;
      if (s.busy) {
        const cudaError_t q = cudaEventQuery(s.done);
        if (q == cudaErrorNotReady) continue;
        if (q != cudaSuccess) KVTIER_CUDA_RETURN(q, "cudaEventQuery (slab)");
        s.busy = false;
      }
      return &s;
    }
    Slab* s = nullptr;
    if (slabs.size() < kMaxSlabs) {
      slabs.emplace_back();
      s = &slabs.back();
      KVTIER_CUDA_RETURN(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming), "cudaEventCreate (slab)");
    } else {  // every slab busy or too small: wait for one (its event alone), then grow it if needed
      s = &slabs[next_slab_victim++ % slabs.size()];
      KVTIER_CUDA_RETURN(cudaEventSynchronize(s->done), "cudaEventSynchronize (slab)");
      s->busy = false;
    }
    if (s->capacity < n) {
      if (s->host) (void)cudaFreeHost(s->host);
      if (s->dev) (void)cudaFree(s->dev);
      s->host = nullptr;
      s->dev = nullptr;
      s->capacity = 0;
      const size_t cap = std::max<size_t>(n, 4096);
      KVTIER_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&s->host), cap * sizeof(Piece), cudaHostAllocDefault),
                         "cudaHostAlloc (pieces)");
      KVTIER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s->dev), cap * sizeof(Piece)), "cudaMalloc (pieces)");
      s->capacity = cap;
    }
    return s;
  }

  // Splits the segments into kernel pieces, host side translated to mapped device addresses.
  Status BuildPieces(CudaCopyDirection d, const uint64_t* dst, const uint64_t* src, const uint64_t* sizes, size_t n) {
    pieces.clear();
    const uint64_t max_piece = options.kernel_piece_bytes;
    const bool host_is_src = d == CudaCopyDirection::kHostToDevice;
    for (size_t i = 0; i < n; ++i) {
      uint64_t host = host_is_src ? src[i] : dst[i];
      uint64_t dev = host_is_src ? dst[i] : src[i];
      uint64_t left = sizes[i];
      while (left > 0) {
        const Range* r = Find(host);
        if (!r) {
          return Status(StatusCode::kInvalidArgument, "copy segment " + std::to_string(i) +
                                                          ": host address not in a registered range "
                                                          "(kernel mode needs RegisterHost)");
        }
        const uint64_t take = std::min({left, max_piece, r->host + r->bytes - host});
        const uint64_t mapped = r->dev + (host - r->host);
        pieces.push_back(host_is_src ? Piece{dev, mapped, take} : Piece{mapped, dev, take});
        host += take;
        dev += take;
        left -= take;
      }
    }
    return Status::Ok();
  }

  Status LaunchKernel(CudaCopyDirection d) {
    if (pieces.empty()) return Status::Ok();
    auto slab = TakeSlab(pieces.size());
    if (!slab.ok()) return slab.status();
    Slab& s = **slab;
    std::copy(pieces.begin(), pieces.end(), s.host);
    cudaStream_t st = stream(d);
    KVTIER_CUDA_RETURN(cudaMemcpyAsync(s.dev, s.host, pieces.size() * sizeof(Piece), cudaMemcpyHostToDevice, st),
                       "cudaMemcpyAsync (pieces)");
    const uint32_t n = static_cast<uint32_t>(pieces.size());
    const uint32_t grid = std::max<uint32_t>(1, std::min<uint32_t>(n, sm_count * options.kernel_blocks_per_sm));
    CopyPiecesKernel<kKernelUnroll><<<grid, options.kernel_threads, 0, st>>>(s.dev, n);
    KVTIER_CUDA_RETURN(cudaGetLastError(), "copy kernel launch");
    KVTIER_CUDA_RETURN(cudaEventRecord(s.done, st), "cudaEventRecord (slab)");
    s.busy = true;
    return Status::Ok();
  }

  Status LaunchBatchApi(CudaCopyDirection d, const uint64_t* dst, const uint64_t* src, const uint64_t* sizes,
                        size_t n) {
#if CUDART_VERSION >= 12080
    batch_dst.clear();
    batch_src.clear();
    batch_sizes.clear();
    for (size_t i = 0; i < n; ++i) {
      // Adjacent segments (both sides contiguous) become one copy: fewer descriptors for the copy engines.
      if (!batch_sizes.empty() && reinterpret_cast<uint64_t>(batch_dst.back()) + batch_sizes.back() == dst[i] &&
          reinterpret_cast<uint64_t>(batch_src.back()) + batch_sizes.back() == src[i]) {
        batch_sizes.back() += sizes[i];
        continue;
      }
      batch_dst.push_back(reinterpret_cast<void*>(dst[i]));
      batch_src.push_back(reinterpret_cast<const void*>(src[i]));
      batch_sizes.push_back(sizes[i]);
    }
    if (batch_sizes.empty()) return Status::Ok();
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    KVTIER_CUDA_RETURN(cudaMemcpyBatchAsync(batch_dst.data(), batch_src.data(), batch_sizes.data(), batch_sizes.size(),
                                            &attr, &attr_index, 1, stream(d)),
                       "cudaMemcpyBatchAsync");
#else
    size_t fail_index = 0;
    KVTIER_CUDA_RETURN(cudaMemcpyBatchAsync(batch_dst.data(), const_cast<void**>(batch_src.data()), batch_sizes.data(),
                                            batch_sizes.size(), &attr, &attr_index, 1, &fail_index, stream(d)),
                       "cudaMemcpyBatchAsync");
#endif
    return Status::Ok();
#else
    return Status(StatusCode::kUnsupported, "cudaMemcpyBatchAsync needs CUDA 12.8 or later");
#endif
  }
};

CudaCopier::CudaCopier(Passkey, std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CudaCopier>> CudaCopier::Create(const CudaCopierOptions& options) {
  if (options.kernel_threads == 0 || options.kernel_threads % 32 != 0 || options.kernel_threads > 1024) {
    return Status(StatusCode::kInvalidArgument, "kernel_threads must be a multiple of 32 in [32, 1024]");
  }
  if (options.kernel_blocks_per_sm == 0 || options.kernel_piece_bytes < 4096) {
    return Status(StatusCode::kInvalidArgument, "kernel_blocks_per_sm must be > 0 and kernel_piece_bytes >= 4096");
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Status(StatusCode::kUnsupported,
                  std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "count is 0"));
  }
  if (options.device < 0 || options.device >= count) {
    return Status(StatusCode::kInvalidArgument,
                  "CUDA device " + std::to_string(options.device) + " (" + std::to_string(count) + " present)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const bool batch_api = BatchApiAvailable();
  switch (options.mode) {
    case CudaCopyMode::kBatchApi:
      if (!batch_api)
        return Status(StatusCode::kUnsupported, "cudaMemcpyBatchAsync needs CUDA 12.8+ runtime and driver");
      impl->mode = CudaCopyMode::kBatchApi;
      break;
    case CudaCopyMode::kKernel: impl->mode = CudaCopyMode::kKernel; break;
    case CudaCopyMode::kAuto:
      // The kernel: measured on the H200 (docs/gpu.md) at full PCIe speed for 64 KiB segments in both directions.
      impl->mode = CudaCopyMode::kKernel;
      break;
  }
  KVTIER_CUDA_RETURN(cudaSetDevice(options.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  KVTIER_CUDA_RETURN(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  impl->sm_count = prop.multiProcessorCount;
  impl->device_name = prop.name;
  for (int i = 0; i < 2; ++i) {
    KVTIER_CUDA_RETURN(cudaStreamCreateWithFlags(&impl->streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
    KVTIER_CUDA_RETURN(cudaEventCreateWithFlags(&impl->dependency[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  return std::make_unique<CudaCopier>(Passkey{}, std::move(impl));
}

CudaCopier::~CudaCopier() {
  Impl& m = *impl_;
  (void)cudaSetDevice(m.options.device);
  for (cudaStream_t s : m.streams) {
    if (s) (void)cudaStreamSynchronize(s);  // our streams only: never a device-wide sync
  }
  for (auto& [t, ticket] : m.tickets) (void)cudaEventDestroy(ticket.event);
  for (cudaEvent_t e : m.free_events) (void)cudaEventDestroy(e);
  for (Slab& s : m.slabs) {
    if (s.host) (void)cudaFreeHost(s.host);
    if (s.dev) (void)cudaFree(s.dev);
    if (s.done) (void)cudaEventDestroy(s.done);
  }
  for (const Range& r : m.ranges) (void)cudaHostUnregister(reinterpret_cast<void*>(r.host));
  for (int i = 0; i < 2; ++i) {
    if (m.dependency[i]) (void)cudaEventDestroy(m.dependency[i]);
    if (m.streams[i]) (void)cudaStreamDestroy(m.streams[i]);
  }
  (void)cudaGetLastError();
}

Status CudaCopier::RegisterHost(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  KVTIER_CUDA_RETURN(cudaSetDevice(impl_->options.device), "cudaSetDevice");
  return impl_->RegisterLocked(base, bytes);
}

Status CudaCopier::RegisterMappingContaining(const void* addr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  for (const Mapping& m : ReadMappings()) {
    if (a < m.start || a >= m.end) continue;
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->Covered(m.start, m.end - m.start)) return Status::Ok();
    KVTIER_CUDA_RETURN(cudaSetDevice(impl_->options.device), "cudaSetDevice");
    return impl_->RegisterLocked(reinterpret_cast<void*>(m.start), m.end - m.start);
  }
  return Status(StatusCode::kNotFound, "no mapping of this process contains the address");
}

Status CudaCopier::RegisterShmMappings(std::string_view shm_name) {
  std::string_view bare = shm_name;
  while (!bare.empty() && bare.front() == '/') bare.remove_prefix(1);
  const std::string path = "/dev/shm/" + std::string(bare);
  int found = 0;
  for (const Mapping& m : ReadMappings()) {
    if (m.path != path) continue;
    ++found;
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->Covered(m.start, m.end - m.start)) continue;
    KVTIER_CUDA_RETURN(cudaSetDevice(impl_->options.device), "cudaSetDevice");
    KVTIER_RETURN_IF_ERROR(impl_->RegisterLocked(reinterpret_cast<void*>(m.start), m.end - m.start));
  }
  if (found == 0) return Status(StatusCode::kNotFound, "no mapping of " + path + " in this process");
  return Status::Ok();
}

bool CudaCopier::IsRegistered(const void* addr, size_t bytes) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->Covered(reinterpret_cast<uintptr_t>(addr), bytes);
}

Result<uint64_t> CudaCopier::CopyBatch(CudaCopyDirection direction, const uint64_t* dst, const uint64_t* src,
                                       const uint64_t* sizes, size_t n, CudaStreamHandle stream) {
  for (size_t i = 0; i < n; ++i) {
    if (sizes[i] != 0 && (dst[i] == 0 || src[i] == 0)) {
      return Status(StatusCode::kInvalidArgument, "copy segment " + std::to_string(i) + " has a null address");
    }
  }
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  KVTIER_CUDA_RETURN(cudaSetDevice(m.options.device), "cudaSetDevice");
  if (m.mode == CudaCopyMode::kKernel) KVTIER_RETURN_IF_ERROR(m.BuildPieces(direction, dst, src, sizes, n));
  if (stream != kNoCudaStreamDependency) {
    KVTIER_CUDA_RETURN(cudaEventRecord(m.dep(direction), reinterpret_cast<cudaStream_t>(stream)),
                       "cudaEventRecord on the caller's stream");
    KVTIER_CUDA_RETURN(cudaStreamWaitEvent(m.stream(direction), m.dep(direction), 0), "cudaStreamWaitEvent");
  }
  if (n > 0) {
    if (m.mode == CudaCopyMode::kKernel) {
      KVTIER_RETURN_IF_ERROR(m.LaunchKernel(direction));
    } else {
      KVTIER_RETURN_IF_ERROR(m.LaunchBatchApi(direction, dst, src, sizes, n));
    }
  }
  return m.RecordLocked(direction);
}

Result<uint64_t> CudaCopier::Record(CudaCopyDirection direction) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  KVTIER_CUDA_RETURN(cudaSetDevice(impl_->options.device), "cudaSetDevice");
  return impl_->RecordLocked(direction);
}

bool CudaCopier::Query(uint64_t ticket) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (ticket == 0 || ticket >= m.next_ticket) return false;
  auto it = m.tickets.find(ticket);
  if (it == m.tickets.end()) return true;  // seen complete before
  const cudaError_t e = cudaEventQuery(it->second.event);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) return true;  // failed: done, and Wait reports the error
  if (it->second.waiters == 0) {
    m.free_events.push_back(it->second.event);
    m.tickets.erase(it);
  }
  return true;
}

Status CudaCopier::Wait(uint64_t ticket) {
  Impl& m = *impl_;
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (ticket == 0 || ticket >= m.next_ticket) {
      return Status(StatusCode::kNotFound, "CUDA copy ticket " + std::to_string(ticket) + " was never issued");
    }
    auto it = m.tickets.find(ticket);
    if (it == m.tickets.end()) return Status::Ok();
    it->second.waiters++;
    event = it->second.event;
  }
  (void)cudaSetDevice(m.options.device);
  const cudaError_t e = cudaEventSynchronize(event);  // this event alone, never the device
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.tickets.find(ticket);
  if (--it->second.waiters == 0 && e == cudaSuccess) {
    m.free_events.push_back(it->second.event);
    m.tickets.erase(it);
  }
  KVTIER_CUDA_RETURN(e, "CUDA copy");
  return Status::Ok();
}

Status CudaCopier::StreamWait(uint64_t ticket, CudaStreamHandle stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (ticket == 0 || ticket >= m.next_ticket) {
    return Status(StatusCode::kNotFound, "CUDA copy ticket " + std::to_string(ticket) + " was never issued");
  }
  auto it = m.tickets.find(ticket);
  if (it == m.tickets.end()) return Status::Ok();
  KVTIER_CUDA_RETURN(cudaSetDevice(m.options.device), "cudaSetDevice");
  KVTIER_CUDA_RETURN(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), it->second.event, 0),
                     "cudaStreamWaitEvent");
  return Status::Ok();
}

Status CudaCopier::Notify(CudaCopyDirection direction, void (*fn)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  KVTIER_CUDA_RETURN(cudaSetDevice(impl_->options.device), "cudaSetDevice");
  KVTIER_CUDA_RETURN(cudaLaunchHostFunc(impl_->stream(direction), fn, arg), "cudaLaunchHostFunc");
  return Status::Ok();
}

CudaCopyMode CudaCopier::mode() const { return impl_->mode; }
int CudaCopier::device() const { return impl_->options.device; }

std::string CudaCopier::Describe() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::ostringstream d;
  d << "CUDA device " << impl_->options.device << " (" << impl_->device_name << ", " << impl_->sm_count
    << " SMs), mode " << CudaCopyModeName(impl_->mode) << ", registered " << impl_->registered_bytes << " B in "
    << impl_->ranges.size() << " pieces";
  return d.str();
}

}  // namespace kvtier
