#include "policy/job_client.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "io/io_engine.h"
#include "layout/chunk_format.h"
#include "util/thread.h"

namespace kvtier {

namespace {

// A job's stream is opened over at most this many of its chunks at a time (the board holds kStreamBoardEntries for
// every stream of the engine's pool).
constexpr uint32_t kMaxPartChunks = 4096;

// The checks a ChunkTransfer passes before a job takes it: a key, a block range inside the chunk, whole chunks for
// stores (X3), segments inside the blocks transferred with an address. kInvalidArgument names what is wrong.
Status ValidateTransfer(JobKind kind, const ChunkTransfer& t, uint32_t blocks_per_chunk, uint64_t block_stride) {
  const uint32_t bpc = blocks_per_chunk;
  if (t.key.size() == 0) return Status(StatusCode::kInvalidArgument, "empty chunk key");
  if (kind == JobKind::kStore && (t.first_block != 0 || (t.num_blocks != 0 && t.num_blocks != bpc))) {
    return Status(StatusCode::kInvalidArgument, "stores write whole chunks (X3): first_block must be 0");
  }
  const uint32_t n = t.num_blocks ? t.num_blocks : bpc - std::min(t.first_block, bpc);
  if (t.first_block >= bpc || n == 0 || t.first_block + n > bpc) {
    return Status(StatusCode::kInvalidArgument, "block range [" + std::to_string(t.first_block) + ", +" +
                                                    std::to_string(n) + ") outside a chunk of " + std::to_string(bpc) +
                                                    " blocks");
  }
  const uint64_t span = static_cast<uint64_t>(n) * block_stride;
  for (const CopySegment& s : t.segments) {
    if (s.bytes == 0 || s.slot_offset + s.bytes > span || s.address == 0) {
      return Status(StatusCode::kInvalidArgument, "copy segment (offset " + std::to_string(s.slot_offset) + ", " +
                                                      std::to_string(s.bytes) + " B) outside the " +
                                                      std::to_string(span) + " B transferred, or null address");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<JobClient>> JobClient::Create(Engine* engine, std::unique_ptr<DeviceCopier> copier,
                                                     JobClientOptions options, StreamPump* pump) {
  if (engine == nullptr) return Status(StatusCode::kInvalidArgument, "JobClient needs an engine");
  auto view = StagingPool::Attach(engine->pool_name());
  if (!view.ok()) return view.status().WithContext("JobClient: the engine's pool");
  if ((*view)->stream_entries() == 0) {
    return Status(StatusCode::kFailedPrecondition, "JobClient: the engine's pool has no stream board");
  }
  StreamOptions so;
  so.max_window = options.max_window ? options.max_window : 2 * engine->options().io_depth;
  std::unique_ptr<StreamPump> own;
  if (pump == nullptr) {
    auto mine = StagingPool::Attach(engine->pool_name());
    if (!mine.ok()) return mine.status().WithContext("JobClient: the engine's pool");
    own = std::make_unique<StreamPump>(engine, std::move(mine).value(), so);
    pump = own.get();
  }
  std::vector<std::unique_ptr<DeviceCopier>> lanes;
  lanes.push_back(copier ? std::move(copier) : CreateHostCopier());
  for (uint32_t i = 1; i < options.copy_lanes; ++i) {
    std::unique_ptr<DeviceCopier> lane = lanes.front()->CreateLane();
    if (!lane) break;  // this kind makes no lanes: one copier for everything
    lanes.push_back(std::move(lane));
  }
  return std::make_unique<JobClient>(Passkey{}, engine, std::move(view).value(), std::move(own), pump, std::move(lanes),
                                     2 * so.max_window + 64);
}

JobClient::JobClient(Passkey, Engine* engine, std::unique_ptr<StagingPool> view, std::unique_ptr<StreamPump> own_pump,
                     StreamPump* pump, std::vector<std::unique_ptr<DeviceCopier>> lanes, uint32_t scan_window)
    : engine_(engine),
      view_(std::move(view)),
      own_pump_(std::move(own_pump)),
      pump_(pump),
      lanes_(std::move(lanes)),
      scan_window_(scan_window),
      blocks_per_chunk_(engine->options().identity.blocks_per_chunk),
      block_stride_(engine->block_stride()) {
  StagingPool* bell = view_.get();
  for (auto& lane : lanes_) lane->SetWakeup([bell] { bell->RingWorkers(); });
  thread_ = StartThread([this] { Run(); });
}

JobClient::~JobClient() {
  {
    // Every job submitted finishes first, as the engine's own jobs do at its close: its reads and writes end within
    // the engine's op deadline, and its slots within the window are given back as they do.
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    done_cv_.wait(lock, [&] { return jobs_.empty(); });
    stop_ = true;
  }
  view_->RingWorkers();
  thread_.join();
  // Copies in flight write into slots or destinations: they end before the streams give their slots back.
  std::vector<CopyDone> ignored;
  for (auto& lane : lanes_) {
    while (lane->pending() > 0) {
      lane->Poll(&ignored);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, job] : jobs_) {
    if (job->open) pump_->Close(job->span.id);
  }
  own_pump_.reset();  // stops its thread before the view goes
}

std::string_view JobClient::copier_name() const { return lanes_.front()->name(); }

Result<JobId> JobClient::SubmitLoad(std::vector<ChunkTransfer> chunks) {
  return Submit(JobKind::kLoad, std::move(chunks));
}

Result<JobId> JobClient::SubmitStore(std::vector<ChunkTransfer> chunks) {
  return Submit(JobKind::kStore, std::move(chunks));
}

Result<JobId> JobClient::Submit(JobKind kind, std::vector<ChunkTransfer> chunks) {
  auto job = std::make_unique<Job>();
  job->kind = kind;
  job->start_ns = NowNs();
  for (size_t i = 0; i < chunks.size(); ++i) {
    Status s = ValidateTransfer(kind, chunks[i], blocks_per_chunk_, block_stride_);
    if (!s.ok()) return s.WithContext("chunk " + std::to_string(i));
    ChunkTransfer& t = chunks[i];
    if (t.num_blocks == 0) t.num_blocks = blocks_per_chunk_ - t.first_block;
    for (const CopySegment& seg : t.segments) job->copy_bytes += seg.bytes;
    job->bytes_needed += uint64_t(t.num_blocks) * engine_->options().identity.block_bytes;
  }
  job->chunks = std::move(chunks);
  job->steps.assign(job->chunks.size(), Step::kWaiting);
  job->result.kind = kind;
  job->result.chunks.resize(job->chunks.size());
  for (size_t i = 0; i < job->chunks.size(); ++i) job->result.chunks[i].key = job->chunks[i].key;
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return Status(StatusCode::kFailedPrecondition, "the job client is shutting down");
  const JobId id = next_id_++;
  job->id = id;
  job->result.id = id;
  jobs_.emplace(id, std::move(job));
  if (kind == JobKind::kLoad) engine_->CountClientLoadStarted();
  view_->RingWorkers();  // the copy thread opens it
  return id;
}

std::vector<JobResult> JobClient::PollCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobResult> out;
  for (JobId id : done_order_) {
    auto it = done_.find(id);
    if (it == done_.end()) continue;  // already taken by Wait
    out.push_back(std::move(it->second));
    done_.erase(it);
  }
  done_order_.clear();
  return out;
}

Result<JobResult> JobClient::Wait(JobId id, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.count(id) && !jobs_.count(id)) {
    return Status(StatusCode::kNotFound, "unknown job " + std::to_string(id) + " (or already reported)");
  }
  const bool got = done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_.count(id) > 0; });
  if (!got) {
    if (jobs_.count(id)) return Status(StatusCode::kTimedOut, "job " + std::to_string(id) + " still running");
    return Status(StatusCode::kNotFound, "unknown job " + std::to_string(id) + " (or already reported)");
  }
  JobResult r = std::move(done_[id]);
  done_.erase(id);
  return r;
}

void JobClient::Run() {
  for (;;) {
    const uint32_t seen = view_->WorkerBell();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    const bool polling = Advance();
    // The pump rings the workers' bell when it publishes or fails a chunk, the copiers when a copy ends, Submit when
    // a job arrives; a store's write ends without a bell, so the thread polls while one is in flight.
    view_->WaitWorkerBell(seen, polling ? std::chrono::nanoseconds(std::chrono::microseconds(200))
                                        : std::chrono::nanoseconds(std::chrono::milliseconds(20)));
  }
}

bool JobClient::Advance() {
  std::vector<CopyDone> ended;
  for (auto& lane : lanes_) lane->Poll(&ended);
  std::vector<std::vector<CopyTask>> batches(lanes_.size());
  bool polling = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (const CopyDone& d : ended) {
    auto it = copies_.find(d.id);
    if (it == copies_.end()) continue;
    auto job = jobs_.find(it->second.first);
    if (job != jobs_.end()) CopyEndedLocked(*job->second, it->second.second, d.status);
    copies_.erase(it);
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *it->second;
    if (!job.open && job.part_first < job.chunks.size()) OpenPartLocked(job);
    if (job.open) ObserveLocked(job, &batches);
    // A part whose every chunk has an outcome or a copy done closes: a load's pins go, a store's acked chunks are
    // committed (the pump may have committed them already) and the others' slots given back.
    const uint32_t part_end = job.open ? job.part_first + job.span.count : job.part_first;
    if (job.open && job.settled == job.span.count) {
      pump_->Close(job.span.id);
      job.open = false;
      job.part_first = part_end;
      job.settled = 0;
    }
    const bool parts_done = !job.open && job.part_first >= job.chunks.size();
    if (parts_done && (job.kind == JobKind::kLoad || SettleWritesLocked(job))) {
      FinishLocked(job);
      it = jobs_.erase(it);
      continue;
    }
    if (parts_done) polling = true;  // writes in flight
    ++it;
  }
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (!batches[l].empty()) lanes_[l]->Submit(std::move(batches[l]));
  }
  return polling;
}

void JobClient::OpenPartLocked(Job& job) {
  if (job.chunks.empty()) return;
  const uint32_t count = std::min<uint32_t>(kMaxPartChunks, static_cast<uint32_t>(job.chunks.size()) - job.part_first);
  std::vector<ChunkKey> keys;
  keys.reserve(count);
  for (uint32_t i = 0; i < count; ++i) keys.push_back(job.chunks[job.part_first + i].key);
  auto span = job.kind == JobKind::kLoad ? pump_->OpenLoad(keys, 1) : pump_->OpenStore(keys, 1);
  if (!span.ok()) return;  // the board has no room now: again on a later pass, once a stream closes
  job.span = *span;
  job.open = true;
  job.settled = 0;
}

void JobClient::ObserveLocked(Job& job, std::vector<std::vector<CopyTask>>* batches) {
  uint32_t waiting = 0;
  for (uint32_t k = job.settled; k < job.span.count && waiting < scan_window_; ++k) {
    const uint32_t i = job.part_first + k;
    if (job.steps[i] != Step::kWaiting) continue;
    const StreamEntryView v = view_->ObserveEntry(job.span.first_entry + k);
    if (v.tag != job.span.tag || v.state == StreamEntryState::kWaiting) {
      waiting++;
      continue;
    }
    const ChunkTransfer& t = job.chunks[i];
    if (v.state == StreamEntryState::kSkipped) {  // stores only: another writer covers the chunk
      OutcomeLocked(job, i, Status::Ok(), 0);
      continue;
    }
    if (v.state != StreamEntryState::kReady) {
      OutcomeLocked(job, i, Status(StatusCode::kNotFound, "chunk not loaded (absent, corrupt, late or unreadable)"), 0);
      continue;
    }
    const uint64_t first = job.kind == JobKind::kLoad ? uint64_t{t.first_block} * block_stride_ : 0;
    CopyTask task;
    task.id = next_copy_++;
    task.direction = job.kind == JobKind::kLoad ? CopyDirection::kSlotToDevice : CopyDirection::kDeviceToSlot;
    task.slot_data = view_->SlotData(v.slot) + kHeaderBytes + first;
    task.slot_bytes = uint64_t{t.num_blocks} * block_stride_;
    task.segments = t.segments;
    task.job_bytes = job.kind == JobKind::kLoad ? job.copy_bytes : 0;
    job.steps[i] = Step::kCopying;
    copies_.emplace(task.id, std::make_pair(job.id, i));
    (*batches)[next_lane_].push_back(std::move(task));
    next_lane_ = (next_lane_ + 1) % lanes_.size();
  }
  while (job.settled < job.span.count && job.steps[job.part_first + job.settled] >= Step::kCommitted) job.settled++;
}

void JobClient::CopyEndedLocked(Job& job, uint32_t i, const Status& status) {
  const uint32_t entry = job.span.first_entry + (i - job.part_first);
  const ChunkTransfer& t = job.chunks[i];
  if (job.kind == JobKind::kLoad) {
    view_->AckEntry(entry, job.span.tag);  // the pump unpins it, copied or not
    OutcomeLocked(job, i, status, status.ok() ? uint64_t{t.num_blocks} * block_stride_ : 0);
    return;
  }
  if (!status.ok()) {
    // Not acked: closing the part gives the slot back unwritten.
    OutcomeLocked(job, i, Status(status.code(), "copy into the slot failed: " + status.message()), 0);
    return;
  }
  engine_->WatchStore(t.key);            // before the commit: the engine keeps its outcome for SettleWritesLocked
  view_->AckEntry(entry, job.span.tag);  // the pump commits it
  job.steps[i] = Step::kCommitted;
}

bool JobClient::SettleWritesLocked(Job& job) {
  bool writing = false;
  for (size_t i = 0; i < job.chunks.size(); ++i) {
    if (job.steps[i] != Step::kCommitted) continue;
    // The store's own outcome (Engine::TakeStoreOutcome), not the index's: the entry may be evicted once published.
    // A dropped store is kIoError whatever the engine's reason, which the message keeps (stores_dropped counts it).
    std::optional<Status> outcome = engine_->TakeStoreOutcome(job.chunks[i].key);
    if (!outcome.has_value()) {
      writing = true;
    } else if (outcome->ok()) {
      OutcomeLocked(job, static_cast<uint32_t>(i), Status::Ok(), engine_->chunk_payload_bytes());
    } else {
      OutcomeLocked(job, static_cast<uint32_t>(i),
                    Status(StatusCode::kIoError, "not written (dropped): " + outcome->ToString()), 0);
    }
  }
  return !writing;
}

void JobClient::OutcomeLocked(Job& job, uint32_t i, Status status, uint64_t bytes) {
  job.steps[i] = Step::kDone;
  if (status.ok()) job.result.chunks_ok++;
  job.result.bytes += bytes;
  job.result.chunks[i].status = std::move(status);
  job.done++;
}

void JobClient::FinishLocked(Job& job) {
  job.result.latency_ns = NowNs() - job.start_ns;
  if (job.kind == JobKind::kLoad) {
    engine_->CountClientLoadEnded(job.result.all_ok(), job.result.chunks_ok, job.bytes_needed, job.result.latency_ns);
  }
  done_.emplace(job.id, std::move(job.result));
  done_order_.push_back(job.id);
  done_cv_.notify_all();
}

}  // namespace kvtier
