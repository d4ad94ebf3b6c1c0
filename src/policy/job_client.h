// JobClient: the job API (ChunkTransfer in, JobResult out: include/kvtier/engine.h) as a client of the slot path
// (S1, X1, X2; docs/architecture.md, "One data path"). Each job is one StreamPump stream over the engine's slot API
// with a single consumer, this client's copy thread, which hands every ready slot's segments to a DeviceCopier and
// acks the chunk when its copy ends. A caller that is not vLLM (`kvtier bench io`, the CLI's tools, the Python
// package, the benchmarks, tests) so moves its bytes the way vLLM's workers do: the same promotions, windows,
// verification and commits, and a job larger than the pool streams through it.
//
// Loads: each chunk is read whole into a slot (a promotion; a chunk resident in the DRAM tier is copied at once) and
// only the blocks asked for (first_block, num_blocks) are copied out. A chunk's ChunkOutcome is Ok, or kNotFound
// when it could not be loaded (absent, corrupt, late or unreadable: the engine's stats count which), or the copier's
// error. Nothing is copied to a chunk's destination unless every block of it verified.
// Stores: each chunk's segments are copied into the slot ReserveForStore grants, which is then committed (written
// and published by the engine's reactors). The job is reported once every chunk is written (Ok), covered by another
// writer (Ok: stored, resident or being stored already), or dropped (kIoError: the write failed or was dropped; or
// the copier's error when the copy into the slot failed).
// JobResult::bytes: the payload bytes copied (loads) or written (stores).
//
// Segments: addresses are the copier's (host pointers for the host copier); a segment's slot_offset is relative to
// the first block transferred. Chunks of a job are copied concurrently: their segments must not overlap.
//
// Threads: every method is thread-safe. One copy thread per client advances every job; copies run on the copier's
// lanes (the host copier: one helper thread per lane). Jobs open their streams in submission order; a job larger
// than the stream board goes through it in parts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtier/engine.h"
#include "policy/stream_pump.h"
#include "staging/staging_pool.h"
#include "transfer/device_copier.h"

namespace kvtier {

using JobId = uint64_t;

// One chunk of a job: which key, which of its blocks (loads), and where its bytes go to or come from.
struct ChunkTransfer {
  ChunkKey key;
  uint32_t first_block = 0;  // loads: first GPU block of the chunk needed; stores: must be 0
  uint32_t num_blocks = 0;   // 0: through the end of the chunk; stores always write whole chunks
  std::vector<CopySegment> segments;
};

struct ChunkOutcome {
  ChunkKey key;
  Status status;  // Ok, or why the chunk was a miss (loads) or dropped (stores)
};

struct JobResult {
  JobId id = 0;
  JobKind kind = JobKind::kLoad;
  uint32_t chunks_ok = 0;
  std::vector<ChunkOutcome> chunks;  // in request order
  uint64_t bytes = 0;                // payload bytes copied (loads) or written (stores)
  int64_t latency_ns = 0;
  bool all_ok() const { return chunks_ok == chunks.size(); }
};

struct JobClientOptions {
  uint32_t max_window = 0;  // slots one job's stream holds at most (0: 2 x the engine's io_depth)
  uint32_t copy_lanes = 1;  // copier lanes copying in parallel (DeviceCopier::CreateLane; 1 where it makes none)
};

class JobClient {
 private:
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  // copier: null = the host copier. pump: the StreamPump over the engine's pool the client's streams go through, when
  // the process has one already (a pool's stream board has one owner: two pumps would hand out the same entries);
  // null = a pump of the client's own (max_window applies to it only). The engine, and a given pump, must outlive
  // the client.
  static Result<std::unique_ptr<JobClient>> Create(Engine* engine, std::unique_ptr<DeviceCopier> copier = nullptr,
                                                   JobClientOptions options = {}, StreamPump* pump = nullptr);
  // Only Create constructs it (std::make_unique with a key nobody else can name).
  JobClient(Passkey, Engine* engine, std::unique_ptr<StagingPool> view, std::unique_ptr<StreamPump> own_pump,
            StreamPump* pump, std::vector<std::unique_ptr<DeviceCopier>> lanes, uint32_t scan_window);
  ~JobClient();  // finishes every job submitted (bounded by the engine's op deadlines), then stops
  JobClient(const JobClient&) = delete;
  JobClient& operator=(const JobClient&) = delete;

  // kInvalidArgument (nothing queued): an empty key, a block range outside the chunk, a store of a partial chunk,
  // a segment outside the blocks transferred or with a null address.
  Result<JobId> SubmitLoad(std::vector<ChunkTransfer> chunks);
  Result<JobId> SubmitStore(std::vector<ChunkTransfer> chunks);
  // Jobs finished since the last call (non-blocking). A job is reported exactly once, by this or by Wait.
  std::vector<JobResult> PollCompleted();
  // Waits up to timeout_ms for job id; kTimedOut if it is still running, kNotFound if unknown or already reported.
  Result<JobResult> Wait(JobId id, int64_t timeout_ms);

  StreamStats stream_stats() { return pump_->stats(); }
  std::string_view copier_name() const;

 private:
  // A chunk's way through the client: its entry not settled yet; its copy in flight; (stores) acked for the pump
  // to commit, its write not yet ended; an outcome. The order matters: kCommitted and kDone are settled.
  enum class Step : uint8_t { kWaiting, kCopying, kCommitted, kDone };
  struct Job {
    JobId id = 0;
    JobKind kind = JobKind::kLoad;
    int64_t start_ns = 0;
    std::vector<ChunkTransfer> chunks;
    std::vector<Step> steps;
    JobResult result;
    uint64_t copy_bytes = 0;    // loads: every segment's bytes (CopyTask::job_bytes)
    uint64_t bytes_needed = 0;  // loads: the payload bytes of the blocks asked for (Engine::CountClientLoadEnded)
    // The part of the job open as a stream: chunks [part_first, part_first + span.count).
    uint32_t part_first = 0;
    bool open = false;
    StreamSpan span;
    uint32_t settled = 0;  // chunks of the part before it are copied (or failed): the scan starts here
    uint32_t done = 0;     // chunks with an outcome
  };

  Result<JobId> Submit(JobKind kind, std::vector<ChunkTransfer> chunks);
  void Run();
  // One pass: opens parts, observes the board, submits copies, acks copies that ended, finishes jobs. True while
  // something is in flight that no bell announces (copies, writes), so the thread polls rather than sleeps.
  bool Advance();
  void OpenPartLocked(Job& job);
  void ObserveLocked(Job& job, std::vector<std::vector<CopyTask>>* batches);
  void CopyEndedLocked(Job& job, uint32_t i, const Status& status);
  bool SettleWritesLocked(Job& job);  // true once no chunk of the job is being written
  void OutcomeLocked(Job& job, uint32_t i, Status status, uint64_t bytes);
  void FinishLocked(Job& job);

  Engine* const engine_;
  const std::unique_ptr<StagingPool> view_;  // the consumer's mapping of the pool (a vLLM worker's)
  std::unique_ptr<StreamPump> own_pump_;     // null when the client was given one
  StreamPump* const pump_;
  std::vector<std::unique_ptr<DeviceCopier>> lanes_;  // Submit/Poll on the copy thread only
  const uint32_t scan_window_;  // board entries past `settled` worth observing (the pump's window bounds them)
  const uint32_t blocks_per_chunk_;
  const uint64_t block_stride_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::map<JobId, std::unique_ptr<Job>> jobs_;  // unfinished, by id: submission order
  std::unordered_map<JobId, JobResult> done_;
  std::deque<JobId> done_order_;
  JobId next_id_ = 1;
  std::unordered_map<uint64_t, std::pair<JobId, uint32_t>> copies_;  // copy id -> (job, chunk)
  uint64_t next_copy_ = 1;
  size_t next_lane_ = 0;
  bool closing_ = false;  // the destructor runs: no more jobs
  bool stop_ = false;     // the copy thread ends
  std::thread thread_;
};

}  // namespace kvtier
