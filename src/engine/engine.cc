// The engine's caller-side half: options, open (reactors, pool, index), lookups, the queueing of its own jobs
// (promotions, committed stores: one part per reactor), capacity and the DRAM tier. The reactors' loop is in
// reactor.cc, the chunks' state machines in load.cc and store.cc; engine_impl.h has threads and ownership.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#include "engine/engine_impl.h"
#include "layout/chunk_path.h"
#include "layout/scan.h"
#include "layout/shared_fs.h"

namespace kvtier {

namespace {
NamespaceIdentity ToNamespaceIdentity(const CacheIdentity& c) {
  NamespaceIdentity id;
  id.model = c.model;
  id.revision = c.revision;
  id.kv_dtype = c.kv_dtype;
  id.tokens_per_chunk = c.tokens_per_chunk;
  id.blocks_per_chunk = c.blocks_per_chunk;
  id.block_bytes = c.block_bytes;
  id.tp_size = c.tp_size;
  id.pp_size = c.pp_size;
  id.layout_tag = c.layout_tag;
  return id;
}

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// K2: a root that others can write to lets them plant entries or symlinks: refuse it unless told otherwise.
Status CheckRootOwnership(const EngineOptions& o) {
  struct stat st;
  if (stat(o.root.c_str(), &st) != 0) return Status::Ok();  // Namespace::Open reports a missing root
  if (o.allow_insecure_root) return Status::Ok();
  return CheckTrustedDirectory(st, "storage root " + o.root, /*group_shared=*/false);
}

// I2: O_DIRECT works there with an alignment our 4 KiB layout meets.
bool DirectIoUsable(const DirectIoInfo& dio) {
  return dio.supported && dio.mem_align <= 4096 && dio.offset_align <= 4096;
}

Status DirectIoRefused(const EngineOptions& o, const DirectIoInfo& dio) {
  return Status(StatusCode::kUnsupported, "io_mode=direct but the filesystem of " + o.root +
                                              " refuses O_DIRECT: " + dio.how + "; set io_mode=auto or buffered");
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) { return EngineImpl::Create(options); }

Result<std::unique_ptr<Engine>> EngineImpl::Create(const EngineOptions& options, std::unique_ptr<IoEngine> io) {
  if (!io) return Create(options, IoFactory());
  auto given = std::make_shared<std::unique_ptr<IoEngine>>(std::move(io));
  auto engine = std::make_unique<EngineImpl>(Passkey{});
  Status s = engine->Init(
      options, [given](uint32_t) { return std::move(*given); }, /*forced_reactors=*/1);
  if (!s.ok()) return s;
  return std::unique_ptr<Engine>(std::move(engine));
}

Result<std::unique_ptr<Engine>> EngineImpl::Create(const EngineOptions& options, IoFactory io_factory) {
  auto engine = std::make_unique<EngineImpl>(Passkey{});
  Status s = engine->Init(options, std::move(io_factory), /*forced_reactors=*/0);
  if (!s.ok()) return s;
  return std::unique_ptr<Engine>(std::move(engine));
}

namespace {
// SetTestDefaults'.
std::atomic<uint32_t> test_reactors{0};
std::atomic<uint64_t> test_read_piece_bytes{0};
std::atomic<bool> test_without_openat2{false};
}  // namespace

EngineImpl::TestDefaults EngineImpl::GetTestDefaults() {
  return {test_reactors.load(std::memory_order_relaxed), test_read_piece_bytes.load(std::memory_order_relaxed),
          test_without_openat2.load(std::memory_order_relaxed)};
}

void EngineImpl::SetTestDefaults(const TestDefaults& d) {
  test_reactors.store(d.reactors, std::memory_order_relaxed);
  test_read_piece_bytes.store(d.read_piece_bytes, std::memory_order_relaxed);
  test_without_openat2.store(d.without_openat2, std::memory_order_relaxed);
}

uint32_t EngineImpl::ResolveReactors(const EngineOptions& options, std::string* why) {
  // I1/S1: never more reactors than io_depth: each reactor keeps at least one chunk at the disk, so more would put
  // more than io_depth chunks there.
  const uint32_t most = std::max(1u, options.io_depth);
  if (options.reactors != 0) {
    if (why) *why = options.reactors > most ? "by option, at most io_depth" : "by option";
    return std::min(options.reactors, most);
  }
  if (const uint32_t v = test_reactors.load(std::memory_order_relaxed); v >= 1 && v <= kMaxReactors) {
    if (why) *why = "the test binary's default";
    return std::min(v, most);
  }
  // I1 auto: one reactor per core this process may run on, at least 2 so a fast device's per-byte work spreads, at
  // most 16 and at most io_depth (a reactor with no chunk at the disk has nothing to do). A reactor waiting on its
  // ring costs no CPU; on a device whose copy runs in the submitting thread (the GPU box's zram) 16 reactors read
  // 28 MiB chunks at 18.8 GB/s where 8 read 12-13 (docs/performance.md, "Engine against the device").
  cpu_set_t set;
  uint32_t cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = static_cast<uint32_t>(CPU_COUNT(&set));
  if (cores == 0) cores = std::max(1u, std::thread::hardware_concurrency());
  if (why) *why = "auto: " + std::to_string(cores) + " cores";
  return std::min(std::clamp(cores, 2u, 16u), most);
}

std::optional<uint32_t> EngineImpl::PlacedReactor(const ChunkKey& key) { return placement_->Placed(key); }

Status EngineImpl::Init(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  options_ = options;
  if (const uint64_t v = test_read_piece_bytes.load(std::memory_order_relaxed);
      v != 0 && options.read_piece_bytes == EngineOptions{}.read_piece_bytes) {
    options_.read_piece_bytes = v;
  }
  OpenReport report;
  KVTIER_RETURN_IF_ERROR(InitFileModes(options));
  // I2, V4: O_DIRECT is probed before anything is written under the root, so that io_mode=direct on a filesystem
  // that refuses it fails with the root as it was (no namespace directory, no MANIFEST).
  // The probe file is an O_TMPFILE or a name unlinked at once, in the namespace directory or, where that does not
  // exist yet, the root; none where neither can hold one: Namespace::Open reports those, and the engine probes the
  // namespace directory once it has it.
  std::optional<DirectIoInfo> dio =
      ProbeDirectIoBeneath(CanonicalRootPath(options.root), NamespaceDirName(ToNamespaceIdentity(options.identity)));
  if (dio && options.io_mode == IoMode::kDirect && !DirectIoUsable(*dio)) return DirectIoRefused(options, *dio);
  std::vector<std::unique_ptr<IoEngine>> ios;
  KVTIER_RETURN_IF_ERROR(CreateIoEngines(options, std::move(io_factory), forced_reactors, &report, &ios));
  KVTIER_RETURN_IF_ERROR(CreatePool(options, &report));
  if (!options.trace_path.empty()) {
    auto trace = TraceRecorder::Open(options.trace_path);
    if (!trace.ok()) return trace.status().WithContext("option trace_path");
    trace_ = std::move(trace.value());
  }
  // V4 (docs/file-format.md, "Creation"): everything above fails without writing under the root (options, the key
  // file, the pool, the trace); the namespace is created (or opened) only now, so a failed open leaves the root as it
  // was.
  KVTIER_RETURN_IF_ERROR(OpenNamespace(options, dio, &report));
  KVTIER_RETURN_IF_ERROR(BuildIndex(options));
  BuildReactors(std::move(ios), report.reactor_depth);
  describe_ = DescribeOpen(options, report);
  for (auto& r : reactors_) r->Start();
  budget_->StartMaintenance();
  return Status::Ok();
}

Status EngineImpl::InitFileModes(const EngineOptions& options) {
  files_.file_mode = options.dir_mode & 0666;
  KVTIER_RETURN_IF_ERROR(CheckRootOwnership(options));
  {
    // The umask, read without changing it (umask(2) cannot be read atomically from a threaded process).
    mode_t mask = 022;
    if (FILE* f = fopen("/proc/self/status", "re")) {
      char line[256];
      while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Umask:", 6) == 0) mask = static_cast<mode_t>(strtoul(line + 6, nullptr, 8));
      }
      fclose(f);
    }
    files_.chmod_files = (files_.file_mode & mask) != 0;
    files_.chmod_dirs = (options.dir_mode & mask) != 0;
  }
  if (!options.checksum_secret.empty()) {
    auto key = ChecksumKeyFromOption(options.checksum_secret);
    if (!key.ok()) return key.status().WithContext("option checksum_secret");
    files_.checksum_key = std::make_unique<ChecksumKey>(key.value());
  }
  const bool openat2 = Openat2Available() && !test_without_openat2.load(std::memory_order_relaxed);
  files_.open_resolve = openat2 ? (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) : 0;
  return Status::Ok();
}

Status EngineImpl::CreateIoEngines(const EngineOptions& options, IoFactory io_factory, uint32_t forced_reactors,
                                   OpenReport* report, std::vector<std::unique_ptr<IoEngine>>* ios) {
  // I1: several reactors, one ring and one issuer thread each; a chunk's reactor is ChunkPlacement's choice.
  report->reactors_why = "given I/O engine";
  const uint32_t nreactors = forced_reactors ? forced_reactors : ResolveReactors(options, &report->reactors_why);
  report->reactor_depth = (options.io_depth + nreactors - 1) / nreactors;
  IoEngineConfig io_cfg;
  io_cfg.kind = options.backend == IoBackend::kUring   ? IoEngineKind::kUring
                : options.backend == IoBackend::kPosix ? IoEngineKind::kPosix
                                                       : IoEngineKind::kAuto;
  // Each chunk in flight needs up to ~4 ops at once (open, header/payload reads or writes, close, unlink).
  io_cfg.depth = report->reactor_depth * 4 + 8;
  io_cfg.posix_threads = options.posix_threads;
  report->backend_why = "given";
  for (uint32_t i = 0; i < nreactors; ++i) {
    if (io_factory) {
      ios->push_back(io_factory(i));
      if (!ios->back()) return Status(StatusCode::kInternal, "I/O engine factory gave no engine");
    } else {
      auto io = CreateIoEngine(io_cfg, &report->backend_why);
      if (!io.ok()) return io.status().WithContext("reactor " + std::to_string(i));
      ios->push_back(std::move(io.value()));
    }
  }
  placement_ = std::make_unique<ChunkPlacement>(nreactors);
  return Status::Ok();
}

void EngineImpl::BuildReactors(std::vector<std::unique_ptr<IoEngine>> ios, uint32_t depth) {
  {
    MutexLock lock(inbox_.mu);
    inbox_.parts.resize(ios.size());
  }
  Reactor::Parts parts;
  parts.options = &options_;
  parts.files = &files_;
  parts.ns = ns_.get();
  parts.pool = pool_.get();
  parts.trace = trace_.get();
  parts.stats = &stats_;
  parts.disk = disk_.get();
  parts.budget = budget_.get();
  parts.resident = resident_.get();
  parts.placement = placement_.get();
  parts.outcomes = &outcomes_;
  parts.inbox = &inbox_;
  write_places_.max =
      options_.max_writes_at_disk != 0 ? options_.max_writes_at_disk : std::max(1u, options_.io_depth / 2);
  parts.writes = write_places_.max < options_.io_depth ? &write_places_ : nullptr;  // else every place may write
  parts.peers = &reactors_;
  for (uint32_t i = 0; i < ios.size(); ++i) {
    reactors_.push_back(std::make_unique<Reactor>(parts, i, depth, std::move(ios[i])));
  }
}

Status EngineImpl::CreatePool(const EngineOptions& options, OpenReport* report) {
  files_.block_stride = RoundUp(options.identity.block_bytes, kHeaderBytes);
  files_.slot_bytes = kHeaderBytes + files_.block_stride * options.identity.blocks_per_chunk;
  StagingPoolOptions pool_opts;
  pool_opts.slot_bytes = files_.slot_bytes;
  pool_opts.alignment = 4096;
  uint64_t slots = options.pool_bytes / RoundUp(files_.slot_bytes, 4096);
  if (slots == 0) {
    return Status(StatusCode::kInvalidArgument, "option pool_bytes: " + std::to_string(options.pool_bytes) +
                                                    " B holds no chunk of " + std::to_string(files_.slot_bytes) +
                                                    " B; raise pool_bytes");
  }
  pool_opts.num_slots = static_cast<uint32_t>(std::min<uint64_t>(slots, 1u << 20));
  pool_opts.demand_reserve = options.demand_reserve_slots != 0
                                 ? std::min(options.demand_reserve_slots, pool_opts.num_slots)
                                 : std::min(options.io_depth, pool_opts.num_slots / 4);
  pool_opts.name = options.pool_name;
  pool_opts.populate = options.pool_populate;
  pool_opts.stream_entries = kStreamBoardEntries;
  // Pools of engines that died without closing (SIGKILL) would hold shared memory forever: reclaim them.
  if (auto orphans = StagingPool::RemoveOrphans(); orphans.ok() && orphans.value() > 0) {
    report->orphan_pools_removed = orphans.value();
  }
  auto pool = StagingPool::Create(pool_opts);
  if (!pool.ok() && pool.status().code() == StatusCode::kInvalidArgument && !options.pool_name.empty()) {
    return pool.status().WithContext("option pool_name");  // a name that is not a POSIX shm name
  }
  if (!pool.ok()) return pool.status();
  pool_ = std::move(pool.value());
  ResidentSet::Options dram_opts;
  dram_opts.policy = ParseDramPolicy(options.dram_policy).value();
  dram_opts.max_slots =
      options.dram_max_slots ? std::min(options.dram_max_slots, pool_->num_slots()) : pool_->num_slots();
  // R2: unused preloads hold at most half of the non-reserved slots, so they never crowd out the DRAM tier.
  dram_opts.max_unused_preloads = std::max<uint32_t>(1, (pool_->num_slots() - pool_opts.demand_reserve) / 2);
  resident_ = std::make_unique<ResidentSet>(*pool_, dram_opts, stats_, [this](uint32_t slot) {
    pool_->MarkFree(slot);
    pool_->Release(slot);
  });

  report->demand_reserve = pool_opts.demand_reserve;
  return Status::Ok();
}

Status EngineImpl::OpenNamespace(const EngineOptions& options, std::optional<DirectIoInfo> dio, OpenReport* report) {
  NamespaceOpenOptions ns_opts;
  ns_opts.create = true;
  ns_opts.dir_mode = options.dir_mode;
  ns_opts.allow_insecure = options.allow_insecure_root;
  ns_opts.checksum_key = ChecksumKeyRecord(files_.checksum_key.get());  // K3: another secret is refused, not trusted
  auto ns = Namespace::Open(options.root, ToNamespaceIdentity(options.identity), ns_opts);
  if (!ns.ok()) return ns.status();
  ns_ = std::make_unique<Namespace>(std::move(ns.value()));

  // I2: direct I/O where the filesystem allows it and its alignment fits our 4 KiB layout. Probed above where the
  // root (or the namespace directory) could be; here only when that probe could make no file.
  if (!dio) dio = ProbeDirectIo(ns_->dirfd());
  bool direct = false;
  if (options.io_mode == IoMode::kBuffered) {
    report->io_mode_why = "buffered (by option)";
  } else if (DirectIoUsable(*dio)) {
    direct = true;
    report->io_mode_why = "O_DIRECT (" + dio->how + ", mem " + std::to_string(dio->mem_align) + " B, offset " +
                          std::to_string(dio->offset_align) + " B)";
  } else if (options.io_mode == IoMode::kDirect) {
    return DirectIoRefused(options, *dio);
  } else {
    report->io_mode_why = "buffered (O_DIRECT unavailable: " + dio->how + ")";
  }
  files_.open_flags = direct ? O_DIRECT : 0;
  const FilesystemKind fs_kind = ProbeFilesystem(ns_->dirfd());  // M1
  files_.shared_root = fs_kind.shared;
  report->filesystem = fs_kind.name;
  if (options.anonymous_temporaries) {
    files_.tmpfile_publish = TmpfileAvailable(ns_->dirfd(), files_.open_flags, files_.file_mode) &&
                             access("/proc/self/fd", F_OK) == 0;  // linkat names it through /proc/self/fd
  }

  return Status::Ok();
}

Status EngineImpl::BuildIndex(const EngineOptions& options) {
  auto swept = SweepTemporaries(*ns_, std::chrono::seconds(options.temp_max_age_s));
  if (swept.ok()) stats_.temporaries_swept.Add(swept->removed);
  DiskIndex::Options index_opts;
  index_opts.entry_bytes = files_.slot_bytes;
  index_opts.touch_interval_s = options.touch_interval_s;
  index_opts.shared_root = files_.shared_root;
  disk_ = std::make_unique<DiskIndex>(*ns_, index_opts, stats_);
  KVTIER_RETURN_IF_ERROR(disk_->Rescan(/*drop_absent=*/false));  // at open: the whole LRU order, by mtime
  DiskBudget::Options budget_opts;
  budget_opts.budget_bytes = options.disk_budget_bytes;
  budget_opts.high_watermark = options.high_watermark;
  budget_opts.low_watermark = options.low_watermark;
  budget_opts.shared_root = files_.shared_root;
  budget_ = std::make_unique<DiskBudget>(*ns_, *disk_, budget_opts);

  return Status::Ok();
}

std::string EngineImpl::DescribeOpen(const EngineOptions& options, const OpenReport& report) const {
  std::ostringstream d;
  d << "root " << options.root << " namespace " << ns_->path() << "; I/O " << reactors_[0]->io().name() << " ("
    << report.backend_why << "), " << report.io_mode_why << ", depth " << options.io_depth << ", reactors "
    << reactors_.size() << " (" << report.reactors_why << ", depth " << report.reactor_depth << " each), publish via "
    << (files_.tmpfile_publish ? (files_.shared_root ? "O_TMPFILE + fsync + linkat" : "O_TMPFILE + linkat")
                               : "named temporary + close + link")
    << ", filesystem " << report.filesystem
    << (files_.shared_root ? " (shared: young bad entries are misses, not removed)" : "") << ", opens via "
    << (files_.open_resolve ? "openat2 (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)" : "openat (O_NOFOLLOW)")
    << (files_.checksum_key ? ", keyed checksums" : "") << "; pool " << pool_->name() << " " << pool_->num_slots()
    << " slots x " << files_.slot_bytes << " B (reserve " << report.demand_reserve << "), DRAM tier "
    << DramPolicyName(resident_->policy()) << " " << resident_->max_slots() << " slots; index " << disk_->entries()
    << " entries, " << disk_->bytes() << " B";
  if (options.disk_budget_bytes) d << "; budget " << options.disk_budget_bytes << " B";
  d << "; usage " << budget_->Describe();
  if (report.orphan_pools_removed)
    d << "; removed " << report.orphan_pools_removed << " orphaned pools of dead engines";
  return d.str();
}

EngineImpl::~EngineImpl() {
  if (budget_) budget_->StopMaintenance();
  {
    MutexLock lock(inbox_.mu);
    inbox_.stop = true;
  }
  for (auto& r : reactors_) r->Wake();
  for (auto& r : reactors_) r->Join();
  reactors_.clear();
}

// ---------------------------------------------------------------------------------------------------------------
// Lookup (caller threads)

ChunkLocation EngineImpl::Lookup(const ChunkKey& key) {
  stats_.lookups.Add(1);
  const int64_t now = NowNs();
  switch (resident_->Lookup(key)) {
    case ResidentSet::Hit::kReady: stats_.lookup_hits_dram.Add(1); return ChunkLocation::kDram;
    case ResidentSet::Hit::kFilling: return ChunkLocation::kPending;
    case ResidentSet::Hit::kNone: break;
  }
  switch (disk_->Lookup(key, now)) {
    case DiskIndex::Known::kPresent: stats_.lookup_hits_disk.Add(1); return ChunkLocation::kDisk;
    case DiskIndex::Known::kPending: return ChunkLocation::kPending;
    case DiskIndex::Known::kAbsent: stats_.lookup_misses.Add(1); return ChunkLocation::kAbsent;
    case DiskIndex::Known::kUnknown: break;
  }
  // Not known here: another instance (or process) may have published it under the same root. M1: exactly a
  // chunk's size (DiskIndex::Probe).
  uint64_t bytes;
  int64_t mtime;
  if (disk_->Probe(key, &bytes, &mtime)) {
    disk_->LearnPresent(key, bytes, mtime);
    stats_.lookup_hits_disk.Add(1);
    return ChunkLocation::kDisk;
  }
  disk_->LearnAbsent(key, now + NegativeTtlNs());
  stats_.lookup_misses.Add(1);
  return ChunkLocation::kAbsent;
}

size_t EngineImpl::LookupPrefix(std::span<const ChunkKey> keys) {
  size_t n = 0;
  for (const ChunkKey& k : keys) {
    const ChunkLocation where = Lookup(k);
    if (where != ChunkLocation::kDisk && where != ChunkLocation::kDram) break;
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// The engine's own jobs (caller threads): promotions and committed stores

Status EngineImpl::Enqueue(JobKind kind, std::vector<ChunkKey> keys, std::vector<uint32_t> slots) {
  auto job = std::make_shared<Job>();
  job->kind = kind;
  job->start_ns = NowNs();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto c = std::make_unique<Chunk>(kind);
    c->job = job.get();
    c->index = i;
    if (kind == JobKind::kLoad) {
      c->load().first_block = 0;
      c->load().num_blocks = options_.identity.blocks_per_chunk;
    }
    c->key = std::move(keys[i]);
    c->slot = slots[i];
    c->rel_path = ChunkRelPath(c->key);
    job->chunks.push_back(std::move(c));
  }
  job->unfinished = static_cast<uint32_t>(job->chunks.size());
  job->id = next_job_id_.fetch_add(1);
  // One part per reactor the job has chunks on (I1); an empty job goes to reactor 0, which finishes it.
  std::vector<std::unique_ptr<Part>> parts(reactors_.size());
  std::vector<ChunkKey> job_keys;
  job_keys.reserve(job->chunks.size());
  for (const auto& c : job->chunks) job_keys.push_back(c->key);
  const std::vector<uint32_t> placed = placement_->Place(job_keys);
  for (size_t i = 0; i < job->chunks.size(); ++i) {
    auto& c = job->chunks[i];
    const uint32_t ri = placed[i];
    if (!parts[ri]) {
      parts[ri] = std::make_unique<Part>();
      parts[ri]->job = job;
    }
    c->part = parts[ri].get();
    parts[ri]->chunks.push_back(c.get());
  }
  if (job->chunks.empty()) {
    parts[0] = std::make_unique<Part>();
    parts[0]->job = job;
  }
  MutexLock inbox_lock(inbox_.mu);
  if (inbox_.stop) {
    for (auto& c : job->chunks) placement_->Unplace(c->key);
    return Status(StatusCode::kFailedPrecondition, "engine is shutting down");
  }
  if (kind == JobKind::kStore) {
    for (auto& c : job->chunks) disk_->AddPendingStore(c->key);
  }
  for (size_t ri = 0; ri < parts.size(); ++ri) {
    if (!parts[ri]) continue;
    inbox_.parts[ri].push_back(std::move(parts[ri]));
    reactors_[ri]->Wake();
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------------
// Capacity (C1, M2: src/engine/disk_budget.h)

Result<uint64_t> EngineImpl::EvictToBudget() { return budget_->UnlinkVictims(budget_->TakeDownToLowWatermark()); }

// ---------------------------------------------------------------------------------------------------------------
// Slot-resident chunks (DRAM tier)

PromoteState EngineImpl::Residency(const ChunkKey& key) { return resident_->Residency(key); }

bool EngineImpl::Stored(const ChunkKey& key) { return disk_->Contains(key); }

void EngineImpl::WatchStore(const ChunkKey& key) { outcomes_.Watch(key); }

std::optional<Status> EngineImpl::TakeStoreOutcome(const ChunkKey& key) { return outcomes_.Take(key); }

PromoteResult EngineImpl::Promote(const ChunkKey& key, bool speculative) {
  const int64_t now = NowNs();
  if (auto resident = resident_->PromoteResident(key, speculative, now)) return *resident;
  if (!disk_->OnDisk(key, now, NegativeTtlNs())) return PromoteResult{PromoteState::kMiss, {}};
  PromoteResult result;
  const std::optional<uint32_t> slot = resident_->BeginLoad(key, speculative, now, &result);
  if (!slot) return result;
  if (speculative) stats_.preload_started.Add(1);
  if (!Enqueue(JobKind::kLoad, {key}, {*slot}).ok()) {
    resident_->Loaded(key, *slot, 0, false, NowNs());
    return PromoteResult{PromoteState::kMiss, {}};
  }
  return result;
}

Result<std::vector<SlotRef>> EngineImpl::PinResident(std::span<const ChunkKey> keys) { return resident_->Pin(keys); }

void EngineImpl::Unpin(std::span<const ChunkKey> keys) { resident_->Unpin(keys); }

Result<std::vector<std::optional<SlotRef>>> EngineImpl::ReserveForStore(std::span<const ChunkKey> keys) {
  // Stores deduplicate against entries indexed or being stored, asked before the resident set (never under its
  // lock: the two are independent, and a key published in between is deduplicated when its store starts).
  std::vector<bool> on_disk(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) on_disk[i] = disk_->ContainsOrPending(keys[i]);
  return resident_->ReserveForStore(keys, on_disk);
}

void EngineImpl::CommitStore(std::span<const ChunkKey> keys, bool success) {
  std::vector<ChunkKey> written;
  std::vector<uint32_t> slots;
  resident_->Commit(keys, success, &written, &slots);
  // A key this commit does not write (given up, or no reservation of it filling) is dropped for its watcher.
  for (const ChunkKey& k : keys) {
    if (std::find(written.begin(), written.end(), k) == written.end()) {
      outcomes_.Record(k, Status(StatusCode::kFailedPrecondition, "not committed (given up, or no slot reserved)"));
    }
  }
  if (written.empty()) return;
  stats_.stores_started.Add(1);
  if (!Enqueue(JobKind::kStore, written, std::move(slots)).ok()) {
    for (const ChunkKey& k : written) {
      resident_->Written(k);  // shutting down: keep them resident, unwritten
      outcomes_.Record(k, Status(StatusCode::kFailedPrecondition, "engine is shutting down"));
    }
  }
}

void EngineImpl::CountClientLoadStarted() { stats_.loads_started.Add(1); }

void EngineImpl::CountClientLoadEnded(bool all_ok, uint32_t chunks_loaded, uint64_t bytes_needed, int64_t latency_ns) {
  (all_ok ? stats_.loads_completed : stats_.loads_failed).Add(1);
  stats_.chunks_loaded.Add(chunks_loaded);
  stats_.bytes_needed.Add(bytes_needed);
  stats_.load_latency_us.Record(static_cast<uint64_t>(std::max<int64_t>(latency_ns, 0) / 1000));
}

StatsSnapshot EngineImpl::Stats() const {
  StatsSnapshot s = stats_.Snapshot();
  s.pool_slots_in_use = pool_->in_use();
  s.pool_peak_slots = pool_->peak_in_use();
  return s;
}

std::string EngineImpl::Describe() const { return describe_; }
std::string EngineImpl::pool_name() const { return pool_->name(); }

int64_t EngineImpl::NegativeTtlNs() const {
  const uint32_t ms = files_.shared_root ? std::min(options_.negative_cache_ms, options_.shared_negative_cache_ms)
                                         : options_.negative_cache_ms;
  return static_cast<int64_t>(ms) * 1000000;
}

}  // namespace kvtier
