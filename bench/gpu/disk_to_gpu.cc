// kvtier_gpu_bench: the engine's host path with the CUDA copier, on a GPU (scripts/gpu_bench.sh runs it). Loads and
// stores go through the job API as a client of the engine's slot path (JobClient with the CUDA copier,
// docs/architecture.md "One data path"): each chunk is read whole into a slot (or written from one) and only the
// blocks asked for are copied.
//
// KV is laid out as vLLM's per-layer tensors, blocks first: layer l is [num_gpu_blocks, kv_heads, 16, 2*head]
// bf16, so one GPU block of one layer is `layer_block_bytes` contiguous bytes, and a chunk of 16 blocks is
// 16 * layers scattered segments. Steps:
//   1. random KV in the GPU tensors; store `chunks` chunks from scattered GPU block ids (D2H through the engine);
//   2. poison the GPU tensors; load every chunk (and a partial range of some) into other scattered block ids (H2D);
//      copy the tensors back and compare byte for byte with what was stored;
//   3. timing, same run, alternating: raw O_DIRECT io_uring reads of the chunk files (same queue depth, one read per
//      file), raw cudaMemcpyAsync of the same payload bytes from pinned memory, engine disk->GPU loads, and, after
//      promoting every chunk into the pool, engine DRAM->GPU loads.
// A store's or load's chunks stay resident in the pool (the DRAM tier, T1): the engine is opened again (not timed)
// before each step that must read the disk.
// Prints one JSON object on stdout. Exit status 1 if a check fails.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_copier.h"
#include "kvtier/engine.h"
#include "policy/job_client.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier_gpu_bench: %s\n", what.c_str());
  std::exit(2);
}

struct Args {
  std::string root;
  std::string model = "llama-3.2-3b";
  uint32_t chunks = 48;
  uint32_t io_depth = 16;
  uint32_t passes = 3;
  std::string mode = "kernel";
  bool store = true;  // false: reuse chunks stored by an earlier run (same root, same model)
};

struct Geometry {
  uint32_t layers = 0, kv_heads = 0, head = 0;
  uint64_t layer_block_bytes() const { return uint64_t(kv_heads) * 16 * 2 * head * 2; }
  uint64_t block_bytes() const { return layer_block_bytes() * layers; }
};

Geometry ModelGeometry(const std::string& model) {
  if (model == "llama-3.2-3b") return {28, 8, 128};
  if (model == "qwen3-4b") return {36, 8, 128};
  Die("unknown model " + model + " (llama-3.2-3b, qwen3-4b)");
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

ChunkKey KeyOf(const std::string& model, uint32_t i) {
  std::string s = model + "/chunk/" + std::to_string(i);
  std::vector<uint8_t> b(s.begin(), s.end());
  b.resize(32, 0);
  auto k = ChunkKey::FromBytes(b);
  if (!k.ok()) Die(k.status().ToString());
  return *k;
}

struct Kv {
  Geometry g;
  uint32_t num_blocks = 0;
  std::vector<uint8_t*> layers;  // device, num_blocks * layer_block_bytes each
  uint64_t Address(uint32_t layer, uint32_t block) const {
    return reinterpret_cast<uint64_t>(layers[layer]) + uint64_t(block) * g.layer_block_bytes();
  }
};

// Segments of chunk blocks [first, first+n) to/from GPU blocks ids[first..first+n) (offsets relative to block first).
std::vector<CopySegment> Segments(const Kv& kv, uint64_t block_stride, const std::vector<uint32_t>& ids, uint32_t first,
                                  uint32_t n) {
  std::vector<CopySegment> segs;
  for (uint32_t b = 0; b < n; ++b) {
    for (uint32_t l = 0; l < kv.g.layers; ++l) {
      segs.push_back(CopySegment{uint64_t(b) * block_stride + l * kv.g.layer_block_bytes(),
                                 kv.Address(l, ids[first + b]), kv.g.layer_block_bytes()});
    }
  }
  return segs;
}

// An engine and the JobClient its jobs go through, with a CUDA copier of its own.
struct Bench {
  std::unique_ptr<Engine> engine;
  // Declared last, so destroyed first: it finishes its jobs, and its copier unregisters the client's mapping of the
  // pool, before the engine goes.
  std::unique_ptr<JobClient> jobs;
  void reset() {
    jobs.reset();
    engine.reset();
  }
};

Bench OpenBench(const EngineOptions& o, CudaCopyMode mode) {
  Bench b;
  auto opened = Engine::Open(o);
  if (!opened.ok()) Die("Engine::Open: " + opened.status().ToString());
  b.engine = std::move(opened.value());
  CudaCopierOptions co;
  co.mode = mode;
  auto copier = CreateCudaDeviceCopier(co);
  if (!copier.ok()) Die("CUDA copier: " + copier.status().ToString());
  auto client = JobClient::Create(b.engine.get(), std::move(copier.value()));
  if (!client.ok()) Die("JobClient: " + client.status().ToString());
  b.jobs = std::move(client.value());
  return b;
}

JobResult RunJob(Bench& b, Result<JobId> id) {
  if (!id.ok()) Die("submit: " + id.status().ToString());
  auto r = b.jobs->Wait(*id, 600000);
  if (!r.ok()) Die("wait: " + r.status().ToString());
  return *r;
}

// Raw baseline: every file read whole with O_DIRECT through io_uring, `depth` reads in flight.
double RawDirectRead(const std::vector<std::string>& files, uint32_t depth, uint64_t* bytes_out) {
  std::vector<uint64_t> sizes;
  uint64_t max_size = 0;
  for (auto& f : files) {
    sizes.push_back(std::filesystem::file_size(f));
    max_size = std::max(max_size, sizes.back());
  }
  const uint64_t buf_size = (max_size + 4095) / 4096 * 4096;
  std::vector<void*> bufs(depth);
  for (auto& b : bufs) {
    if (posix_memalign(&b, 4096, buf_size) != 0) Die("posix_memalign");
    std::memset(b, 0, buf_size);
  }
  io_uring ring;
  if (io_uring_queue_init(depth * 2, &ring, 0) != 0) Die("io_uring_queue_init");
  std::vector<int> fds(files.size(), -1);
  std::vector<uint32_t> free_bufs(depth);
  std::iota(free_bufs.begin(), free_bufs.end(), 0);
  const auto t0 = Clock::now();
  size_t next = 0, done = 0;
  uint64_t bytes = 0;
  while (done < files.size()) {
    while (next < files.size() && !free_bufs.empty()) {
      fds[next] = open(files[next].c_str(), O_RDONLY | O_DIRECT);
      if (fds[next] < 0) Die("open " + files[next]);
      const uint32_t b = free_bufs.back();
      free_bufs.pop_back();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const uint64_t len = (sizes[next] + 4095) / 4096 * 4096;
      io_uring_prep_read(sqe, fds[next], bufs[b], len, 0);
      io_uring_sqe_set_data64(sqe, (uint64_t(next) << 32) | b);
      ++next;
    }
    io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) Die("io_uring_wait_cqe");
    do {
      if (cqe->res < 0) Die(std::string("raw read: ") + std::strerror(-cqe->res));
      const uint64_t d = io_uring_cqe_get_data64(cqe);
      if (uint64_t(cqe->res) < sizes[d >> 32]) Die("raw read: short read (not handled by the baseline)");
      bytes += sizes[d >> 32];
      close(fds[d >> 32]);
      free_bufs.push_back(uint32_t(d & 0xffffffffu));
      ++done;
      io_uring_cqe_seen(&ring, cqe);
    } while (io_uring_peek_cqe(&ring, &cqe) == 0);
  }
  const double s = Seconds(t0, Clock::now());
  io_uring_queue_exit(&ring);
  for (auto b : bufs) free(b);
  *bytes_out = bytes;
  return s;
}

// Raw baseline: cudaMemcpyAsync of `total` bytes in pieces of `piece` from pinned memory to one device buffer.
double RawH2D(uint64_t piece, uint32_t count, cudaStream_t stream) {
  void* host = nullptr;
  void* dev = nullptr;
  CHECK_CUDA(cudaHostAlloc(&host, piece, cudaHostAllocDefault));
  std::memset(host, 0x5a, piece);
  CHECK_CUDA(cudaMalloc(&dev, piece));
  CHECK_CUDA(cudaMemcpyAsync(dev, host, piece, cudaMemcpyHostToDevice, stream));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < count; ++i) CHECK_CUDA(cudaMemcpyAsync(dev, host, piece, cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double s = Seconds(t0, Clock::now());
  CHECK_CUDA(cudaFree(dev));
  CHECK_CUDA(cudaFreeHost(host));
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + k);
      return argv[++i];
    };
    if (k == "--root")
      a.root = val();
    else if (k == "--model")
      a.model = val();
    else if (k == "--chunks")
      a.chunks = std::stoul(val());
    else if (k == "--io-depth")
      a.io_depth = std::stoul(val());
    else if (k == "--passes")
      a.passes = std::stoul(val());
    else if (k == "--mode")
      a.mode = val();
    else if (k == "--no-store")
      a.store = false;
    else
      Die("unknown flag " + k);
  }
  if (a.root.empty()) Die("--root is required");
  const Geometry g = ModelGeometry(a.model);
  constexpr uint32_t kBlocksPerChunk = 16;
  auto mode = ParseCudaCopyMode(a.mode);
  if (!mode.ok()) Die(mode.status().ToString());

  // GPU KV tensors: room for every chunk twice (store ids and load ids are drawn from disjoint halves).
  Kv kv;
  kv.g = g;
  kv.num_blocks = a.chunks * kBlocksPerChunk * 2;
  const uint64_t layer_bytes = uint64_t(kv.num_blocks) * g.layer_block_bytes();
  std::mt19937_64 rng(0x6b767469657231ull);
  std::vector<std::vector<uint8_t>> host_kv(g.layers, std::vector<uint8_t>(layer_bytes));
  for (uint32_t l = 0; l < g.layers; ++l) {
    uint8_t* p;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), layer_bytes));
    kv.layers.push_back(p);
    auto* w = reinterpret_cast<uint64_t*>(host_kv[l].data());
    for (uint64_t i = 0; i < layer_bytes / 8; ++i) w[i] = rng();
    CHECK_CUDA(cudaMemcpy(p, host_kv[l].data(), layer_bytes, cudaMemcpyHostToDevice));
  }
  std::vector<uint32_t> perm(kv.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<uint32_t> store_ids(perm.begin(), perm.begin() + a.chunks * kBlocksPerChunk);
  const std::vector<uint32_t> load_ids(perm.begin() + a.chunks * kBlocksPerChunk, perm.end());

  EngineOptions o;
  o.root = a.root;
  o.identity.model = a.model;
  o.identity.revision = "random-kv";
  o.identity.kv_dtype = "bfloat16";
  o.identity.tokens_per_chunk = 256;
  o.identity.blocks_per_chunk = kBlocksPerChunk;
  o.identity.block_bytes = g.block_bytes();
  o.io_depth = a.io_depth;
  o.io_mode = IoMode::kAuto;  // O_DIRECT where the filesystem allows it (Describe() in the JSON says which)
  const uint64_t slot_bytes = 4096 + kBlocksPerChunk * ((g.block_bytes() + 4095) / 4096 * 4096);
  o.pool_bytes = (uint64_t(a.chunks) + 2 * a.io_depth + 4) * (slot_bytes + 4096);
  Bench b = OpenBench(o, *mode);
  // The geometry of every engine opened below (the same options).
  const uint64_t stride = b.engine->block_stride();
  const uint64_t chunk_payload = b.engine->chunk_payload_bytes();

  std::ostringstream js;
  js << "{\"model\":\"" << a.model << "\",\"mode\":\"" << a.mode << "\",\"chunks\":" << a.chunks
     << ",\"chunk_payload_bytes\":" << chunk_payload << ",\"segments_per_chunk\":" << kBlocksPerChunk * g.layers
     << ",\"segment_bytes\":" << g.layer_block_bytes() << ",\"io_depth\":" << a.io_depth << ",\"describe\":\""
     << b.engine->Describe() << "\"";

  // 1. Store from scattered GPU blocks.
  if (a.store) {
    std::vector<ChunkTransfer> st;
    for (uint32_t c = 0; c < a.chunks; ++c) {
      st.push_back(ChunkTransfer{KeyOf(a.model, c), 0, 0,
                                 Segments(kv, stride, store_ids, c * kBlocksPerChunk, kBlocksPerChunk)});
    }
    const auto t0 = Clock::now();
    JobResult r = RunJob(b, b.jobs->SubmitStore(std::move(st)));
    const double s = Seconds(t0, Clock::now());
    if (!r.all_ok()) {
      for (auto& c : r.chunks)
        if (!c.status.ok()) Die("store: " + c.status.ToString());
    }
    js << ",\"store_s\":" << s << ",\"store_gbps\":" << double(a.chunks) * chunk_payload / s / 1e9;
  }

  // 2. Poison, load (whole chunks, and a partial range of every third one) from the disk, compare.
  bool exact = true;
  uint64_t checked_blocks = 0;
  {
    b.reset();
    b = OpenBench(o, *mode);
    for (auto* p : kv.layers) CHECK_CUDA(cudaMemset(p, 0xA5, layer_bytes));
    std::vector<ChunkTransfer> ld;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // per chunk: first, count
    for (uint32_t c = 0; c < a.chunks; ++c) {
      const uint32_t first = c % 3 == 1 ? 5 : 0;
      const uint32_t n = c % 3 == 1 ? 7 : kBlocksPerChunk;
      ranges.push_back({first, n});
      ld.push_back(
          ChunkTransfer{KeyOf(a.model, c), first, n, Segments(kv, stride, load_ids, c * kBlocksPerChunk + first, n)});
    }
    JobResult r = RunJob(b, b.jobs->SubmitLoad(std::move(ld)));
    for (auto& c : r.chunks)
      if (!c.status.ok()) Die("load: " + c.status.ToString());
    std::vector<uint8_t> back(layer_bytes);
    const uint64_t lb = g.layer_block_bytes();
    for (uint32_t l = 0; l < g.layers; ++l) {
      CHECK_CUDA(cudaMemcpy(back.data(), kv.layers[l], layer_bytes, cudaMemcpyDeviceToHost));
      for (uint32_t c = 0; c < a.chunks; ++c) {
        for (uint32_t b = 0; b < kBlocksPerChunk; ++b) {
          const uint32_t dst = load_ids[c * kBlocksPerChunk + b];
          const bool loaded = b >= ranges[c].first && b < ranges[c].first + ranges[c].second;
          if (loaded) {
            if (!a.store) continue;  // the data stored by an earlier run is not known here
            const uint32_t src = store_ids[c * kBlocksPerChunk + b];
            if (std::memcmp(back.data() + dst * lb, host_kv[l].data() + uint64_t(src) * lb, lb) != 0) exact = false;
            ++checked_blocks;
          } else {  // blocks outside the partial range stay poisoned
            for (uint64_t i = 0; i < lb; ++i)
              if (back[dst * lb + i] != 0xA5) {
                exact = false;
                break;
              }
          }
        }
      }
    }
    js << ",\"load_exact\":" << (exact ? "true" : "false") << ",\"checked_layer_blocks\":" << checked_blocks;
  }

  // 3. Timing.
  std::vector<std::string> files;
  for (auto& f : std::filesystem::recursive_directory_iterator(a.root)) {
    if (f.is_regular_file() && f.path().extension() == ".kvc") files.push_back(f.path().string());
  }
  std::sort(files.begin(), files.end());
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uint64_t payload = uint64_t(a.chunks) * chunk_payload;
  auto full_load = [&]() {
    std::vector<ChunkTransfer> ld;
    for (uint32_t c = 0; c < a.chunks; ++c) {
      ld.push_back(
          ChunkTransfer{KeyOf(a.model, c), 0, 0, Segments(kv, stride, load_ids, c * kBlocksPerChunk, kBlocksPerChunk)});
    }
    const auto t0 = Clock::now();
    JobResult r = RunJob(b, b.jobs->SubmitLoad(std::move(ld)));
    const double s = Seconds(t0, Clock::now());
    if (!r.all_ok()) Die("timed load failed");
    return s;
  };
  std::vector<double> raw_disk, raw_h2d, eng_disk, eng_dram;
  uint64_t raw_bytes = 0;
  uint64_t read_by_disk_loads = 0;
  for (uint32_t p = 0; p < a.passes; ++p) {
    raw_disk.push_back(RawDirectRead(files, a.io_depth, &raw_bytes));
    b.reset();  // a fresh engine, whose load reads the disk
    b = OpenBench(o, *mode);
    const uint64_t read_before = b.engine->Stats().bytes_read;
    eng_disk.push_back(full_load());
    read_by_disk_loads += b.engine->Stats().bytes_read - read_before;
    raw_h2d.push_back(RawH2D(chunk_payload, a.chunks, stream));
  }
  // DRAM tier: promote every chunk into the pool (the last disk load left them resident: this makes sure), then load
  // from the resident slots.
  for (uint32_t c = 0; c < a.chunks; ++c) {
    for (int tries = 0;; ++tries) {
      PromoteResult pr = b.engine->Promote(KeyOf(a.model, c), false);
      if (pr.state == PromoteState::kReady) break;
      if (pr.state == PromoteState::kMiss || tries > 100000) Die("promote failed for chunk " + std::to_string(c));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  const uint64_t read_before_dram = b.engine->Stats().bytes_read;
  for (uint32_t p = 0; p < a.passes; ++p) eng_dram.push_back(full_load());
  const uint64_t read_by_dram_loads = b.engine->Stats().bytes_read - read_before_dram;

  auto gbps = [](uint64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e9 : 0.0; };
  const double disk = gbps(raw_bytes, Median(raw_disk));
  const double h2d = gbps(payload, Median(raw_h2d));
  const double eng = gbps(payload, Median(eng_disk));
  const double dram = gbps(payload, Median(eng_dram));
  auto list = [](const std::vector<double>& v) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
    o << "]";
    return o.str();
  };
  js << ",\"files\":" << files.size() << ",\"file_bytes\":" << raw_bytes << ",\"payload_bytes\":" << payload
     << ",\"raw_disk_s\":" << list(raw_disk) << ",\"raw_h2d_s\":" << list(raw_h2d)
     << ",\"engine_disk_s\":" << list(eng_disk) << ",\"engine_dram_s\":" << list(eng_dram)
     << ",\"raw_disk_gbps\":" << disk << ",\"raw_h2d_gbps\":" << h2d << ",\"engine_disk_to_gpu_gbps\":" << eng
     << ",\"engine_dram_to_gpu_gbps\":" << dram << ",\"disk_to_gpu_ratio\":" << eng / std::min(disk, h2d)
     << ",\"dram_to_gpu_ratio\":" << dram / h2d << ",\"bytes_read_by_disk_loads\":" << read_by_disk_loads
     << ",\"bytes_read_by_dram_loads\":" << read_by_dram_loads << "}";
  std::printf("%s\n", js.str().c_str());
  CHECK_CUDA(cudaStreamDestroy(stream));
  b.reset();  // client (and copier) and engine before the tensors it copies into
  for (auto* p : kv.layers) CHECK_CUDA(cudaFree(p));
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::Main(argc, argv); }
