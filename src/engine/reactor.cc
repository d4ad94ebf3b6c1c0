// The reactor loop: its queues, places at the disk and piece budget, the ops it submits and the completions it
// dispatches, deadlines, and the end of every chunk (failure, finish, release). The chunks' own state machines are
// in load.cc and store.cc (states: src/engine/chunk_state.h). Both start from a slot the DRAM tier gave them
// (docs/architecture.md, "One data path"). A chunk that fails is finished at once (its job can complete with a
// miss), but its slot, fd and temporary are released only when every operation it started has come back: the
// kernel may still be writing into the slot.
#include "engine/reactor.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "layout/chunk_path.h"
#include "util/thread.h"

namespace kvtier {

namespace {
constexpr int64_t kReapWaitNs = 20 * 1000 * 1000;  // bounds how late a deadline (posix) is noticed
constexpr uint32_t kReadsPerDataPlace = 2;         // a reactor's piece budget: reads at the disk per place (its depth)
constexpr int64_t kMsToNs = 1000000;
}  // namespace

Reactor::Reactor(const Parts& parts, uint32_t index, uint32_t depth, std::unique_ptr<IoEngine> io)
    : options_(*parts.options),
      files_(*parts.files),
      ns_(parts.ns),
      pool_(parts.pool),
      trace_(parts.trace),
      stats_(*parts.stats),
      disk_(parts.disk),
      budget_(parts.budget),
      resident_(parts.resident),
      placement_(parts.placement),
      outcomes_(*parts.outcomes),
      inbox_(*parts.inbox),
      writes_(parts.writes),
      peers_(*parts.peers),
      index_(index),
      depth_(depth),
      trace_tid_(1 + index),
      io_(std::move(io)) {}

void Reactor::Start() {
  thread_ = StartThread([this] { Run(); });
}

void Reactor::Join() {
  if (thread_.joinable()) thread_.join();
}

int64_t Reactor::Deadline() const { return NowNs() + static_cast<int64_t>(options_.op_timeout_ms) * kMsToNs; }

void Reactor::InsertByAdmission(std::deque<Chunk*>& q, Chunk* c) {
  auto at = q.end();
  while (at != q.begin() && (*std::prev(at))->admitted > c->admitted) --at;
  q.insert(at, c);
}

// ---------------------------------------------------------------------------------------------------------------

void Reactor::Run() {
  std::vector<IoCompletion> cqes;
  for (;;) {
    bool stopping;
    {
      MutexLock lock(inbox_.mu);
      auto& commands = inbox_.parts[index_];
      while (!commands.empty()) {
        parts_.push_back(std::move(commands.front()));
        commands.pop_front();
      }
      stopping = inbox_.stop;
    }
    StartWaitingChunks();
    PumpData();
    RetryDeferredOps();
    io_->Flush();
    VerifyReadChunks();
    // Drop parts whose every chunk has settled (the job's result was published when its last chunk finished, on
    // whichever reactor that was); the job itself goes with its last part.
    std::erase_if(parts_, [](const std::unique_ptr<Part>& p) {
      for (Chunk* c : p->chunks) {
        if (c->state != ChunkState::kReleased || c->ops_in_flight > 0) return false;
      }
      return true;
    });
    if (stopping && parts_.empty() && ops_.empty()) break;

    cqes.clear();
    const bool waiting = !ops_.empty() || !parts_.empty();
    int rc = io_->Reap(&cqes, waiting ? kReapWaitNs : -1);
    if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -ETIMEDOUT) {
      stats_.io_errors.Add(1);
    }
    for (const IoCompletion& cqe : cqes) OnCompletion(cqe);
    // Chunks whose data transfer finished freed places at the disk: start the next reads/writes before any
    // checksum pass (loads' verification below).
    PumpData();
    io_->Flush();
    VerifyReadChunks();
    CheckDeadlines();
  }
}

void Reactor::EndDataPhase(Chunk& c) {
  if (!c.data_phase) return;
  c.data_phase = false;
  data_in_flight_--;
  if (c.job->kind == JobKind::kLoad) {
    std::erase(piece_queue_, &c);
  } else if (writes_ != nullptr) {
    writes_->held.fetch_sub(1);
    WakeWaiters(writes_->waiters);
  }
}

bool Reactor::TakeWritePlace() {
  if (writes_ == nullptr) return true;
  auto take = [this] {
    uint32_t n = writes_->held.load();
    while (n < writes_->max) {
      if (writes_->held.compare_exchange_weak(n, n + 1)) return true;
    }
    return false;
  };
  if (take()) return true;
  // Marked before the second try: a place given back in between either is seen here or wakes this reactor.
  writes_->waiters.fetch_or(uint64_t{1} << index_);
  return take();
}

bool Reactor::PiecesToAsk(const Chunk& c) {
  return c.data_phase && c.job->kind == JobKind::kLoad && c.load().next_piece < c.load().num_blocks;
}

void Reactor::FillPieces() {
  // Oldest first: the chunk that entered its data phase first gets every piece it still needs before the next one
  // gets any, so chunks finish one after another at the device's pace and a job's last chunks keep the whole budget
  // (docs/architecture.md, "Reads in pieces").
  const uint32_t budget = kReadsPerDataPlace * depth_;
  while (reads_at_disk_ < budget && !piece_queue_.empty()) {
    Chunk* c = piece_queue_.front();
    if (c->state != ChunkState::kTransferring || !PiecesToAsk(*c)) {
      piece_queue_.pop_front();
      continue;
    }
    SubmitNextPiece(*c);
    if (!PiecesToAsk(*c)) piece_queue_.pop_front();
  }
}

void Reactor::PumpData() {
  // I1: loads go ahead of the writes queued before them. A request waits for its loads, while the write-back of what
  // was computed can wait a chunk's time; and a reactor may have a single place at the disk (depth_ is
  // ceil(io_depth / reactors): one on the GPU box), where a load behind its reactor's writes would wait for all of
  // them (docs/performance.md, "Loads during the write-back").
  for (const bool loads : {true, false}) {
    auto it = data_queue_.begin();
    while (data_in_flight_ < depth_ && it != data_queue_.end()) {
      Chunk* c = *it;
      if (c->state == ChunkState::kFailed) {
        data_queue_.erase(it);
        Settle(*c);
        it = data_queue_.begin();  // settling may have queued or ended others
        continue;
      }
      const bool load = c->job->kind == JobKind::kLoad;
      if (load != loads) {
        ++it;
        continue;
      }
      if (!load && !TakeWritePlace()) break;  // every write place is held: this reactor is woken when one is free
      data_queue_.erase(it);
      StartDataPhase(*c);
      it = data_queue_.begin();  // a failed submission may have queued or ended others
    }
  }
  FillPieces();
}

void Reactor::StartDataPhase(Chunk& c) {
  SetState(c, ChunkState::kTransferring);
  c.data_phase = true;
  data_in_flight_++;
  if (c.job->kind == JobKind::kLoad) {
    LoadState& l = c.load();
    uint8_t* base = pool_->SlotData(c.slot);
    const uint64_t piece = options_.read_piece_bytes;
    l.piece_blocks = piece == 0
                         ? l.num_blocks
                         : static_cast<uint32_t>(std::clamp<uint64_t>(piece / files_.block_stride, 1, l.num_blocks));
    l.next_piece = 0;
    l.pieces_at_disk = 1;
    l.header.reset();
    l.verified.assign(l.num_blocks, false);
    l.landed_unverified.clear();
    if (l.first_block == 0) {  // the header and the first piece in one aligned read
      l.next_piece = l.piece_blocks;
      SubmitRead(c, Transfer{.buf = base,
                             .len = kHeaderBytes + uint64_t(l.piece_blocks) * files_.block_stride,
                             .piece_blocks = l.piece_blocks,
                             .with_header = true});
    } else {
      SubmitRead(c, Transfer{.buf = base, .len = kHeaderBytes, .with_header = true});
    }
    if (PiecesToAsk(c)) InsertByAdmission(piece_queue_, &c);
  } else {
    SubmitWritePiece(c, 0);
  }
}

void Reactor::StartWaitingChunks() {
  for (auto& part : parts_) {
    if (part->chunks.empty() && part->job->chunks.empty() && part->next_to_start == 0) {
      part->next_to_start = 1;  // an empty job: nothing to wait for
      PublishJob(*part->job);
      continue;
    }
    while (part->next_to_start < part->chunks.size()) {
      Chunk& c = *part->chunks[part->next_to_start];
      const bool started = part->job->kind == JobKind::kLoad ? StartLoadChunk(*part, c) : StartStoreChunk(*part, c);
      if (!started) break;  // out of slots for this job (or globally); try again after a release
      ++part->next_to_start;
    }
  }
}

bool Reactor::TakeJobSlot(Part& part) {
  if (part.slots_held >= 2 * depth_) return false;
  Job& job = *part.job;
  const uint32_t limit = 2 * options_.io_depth;
  auto take = [&job, limit] {
    uint32_t held = job.slots_held.load();
    while (held < limit) {
      if (job.slots_held.compare_exchange_weak(held, held + 1)) return true;
    }
    return false;
  };
  if (!take()) {
    if (peers_.size() == 1) return false;
    // Record the wait before trying again: a slot returned in between is either seen or wakes this reactor.
    job.slot_waiters.fetch_or(uint64_t{1} << index_);
    if (!take()) return false;
  }
  part.slots_held++;
  return true;
}

void Reactor::WakeWaiters(std::atomic<uint64_t>& mask) {
  if (mask.load() == 0) return;
  uint64_t m = mask.exchange(0);
  while (m != 0) {
    const int i = __builtin_ctzll(m);
    m &= m - 1;
    peers_[i]->Wake();
  }
}

void Reactor::ReturnJobSlot(Chunk& c) {
  if (c.job->kind != JobKind::kStore || !c.store().counts_job_slot) return;  // only stores take them
  c.store().counts_job_slot = false;
  c.part->slots_held--;
  c.job->slots_held.fetch_sub(1);
  if (peers_.size() > 1) WakeWaiters(c.job->slot_waiters);
}

// ---------------------------------------------------------------------------------------------------------------
// Operations

void Reactor::Transfer::Bind(IoOp& io) const {
  io.buf = buf;
  io.len = static_cast<uint32_t>(std::min<uint64_t>(len, 1u << 30));  // a short transfer continues where it stopped
  io.offset = offset;
}

void Reactor::SubmitOp(Op op, IoOp io) {
  const uint64_t id = next_op_id_++;
  auto [it, inserted] = ops_.emplace(id, std::move(op));
  Op& o = it->second;
  std::visit([&io](const auto& args) { args.Bind(io); }, o.args);  // into the node: it does not move
  io.user_data = id;
  // I4: a close carries no linked timeout: a cancelled close (FUSE and NFS hand closes with a flush to a worker)
  // would leave the fd open for good. Its deadline still holds: CheckDeadlines fails the chunk on time.
  io.deadline_ns = io.code == OpCode::kClose ? 0 : o.deadline_ns;
  o.start_ns = NowNs();
  if (o.chunk) o.chunk->ops_in_flight++;
  if (o.role == OpRole::kRead) reads_at_disk_++;
  const int rc = io_->Submit(io);
  if (rc == -EAGAIN) {
    deferred_ops_.push_back(DeferredOp{id, io});  // ring full: resubmitted next iteration
  } else if (rc < 0) {
    IoCompletion fake{id, rc};
    OnCompletion(fake);
  }
}

IoOp Reactor::UnlinkAt(int flags) const {
  IoOp io;
  io.code = OpCode::kUnlinkAt;
  io.dirfd = ns_->dirfd();
  io.flags = flags;
  return io;
}

void Reactor::RetryDeferredOps() {
  while (!deferred_ops_.empty()) {
    DeferredOp& d = deferred_ops_.front();
    if (ops_.count(d.id) == 0) {  // should not happen; be safe
      deferred_ops_.pop_front();
      continue;
    }
    const int rc = io_->Submit(d.op);
    if (rc == -EAGAIN) return;
    const uint64_t id = d.id;
    deferred_ops_.pop_front();
    if (rc < 0) OnCompletion(IoCompletion{id, rc});
  }
}

void Reactor::SubmitRead(Chunk& c, Transfer t) {
  IoOp io;
  io.code = OpCode::kRead;
  io.fd = c.fd;
  Submit<&Reactor::OnReadDone>(Op{.role = OpRole::kRead, .chunk = &c, .deadline_ns = Deadline()}, t, io);
}

void Reactor::SubmitWritePiece(Chunk& c, uint64_t offset) {
  uint64_t piece = options_.write_piece_bytes & ~uint64_t{4095};
  if (options_.write_piece_bytes != 0) piece = std::max<uint64_t>(piece, 4096);
  const uint64_t left = files_.slot_bytes - offset;
  SubmitWrite(c, Transfer{.buf = pool_->SlotData(c.slot) + offset,
                          .len = piece == 0 ? left : std::min(left, piece),
                          .offset = offset});
}

void Reactor::SubmitWrite(Chunk& c, Transfer t) {
  IoOp io;
  io.code = OpCode::kWrite;
  io.fd = c.fd;
  Submit<&Reactor::OnWriteDone>(Op{.role = OpRole::kWrite, .chunk = &c, .deadline_ns = Deadline()}, t, io);
}

void Reactor::SubmitClose(int fd, std::string then_unlink) {
  if (fd < 0) {
    if (!then_unlink.empty()) SubmitUnlinkTemporary(std::move(then_unlink));
    return;
  }
  IoOp io;
  io.code = OpCode::kClose;
  io.fd = fd;
  if (then_unlink.empty()) {
    Submit<&Reactor::Ignore<NoArgs>>(Op{.role = OpRole::kClose}, NoArgs{}, io);
  } else {
    Submit<&Reactor::OnClosedThenUnlink>(Op{.role = OpRole::kClose}, ThenUnlink{std::move(then_unlink)}, io);
  }
}

void Reactor::OnClosedThenUnlink(const Op&, const ThenUnlink& then, int64_t) { SubmitUnlinkTemporary(then.tmp); }

void Reactor::SubmitUnlinkTemporary(std::string path) {
  // Fire and forget, no deadline: the name must go.
  Submit<&Reactor::Ignore<Named>>(Op{.role = OpRole::kUnlinkTmp}, Named{std::move(path)}, UnlinkAt());
}

void Reactor::OnCompletion(const IoCompletion& cqe) {
  auto it = ops_.find(cqe.user_data);
  if (it == ops_.end()) return;
  Op op = std::move(it->second);
  ops_.erase(it);
  const int64_t res = cqe.result;
  if (res < 0 && res != -EEXIST && res != -ENOENT && !op.errors_are_answers) {
    if (res == -ETIMEDOUT || res == -ECANCELED) {
      stats_.timeouts.Add(op.late ? 0 : 1);
    } else {
      stats_.io_errors.Add(1);
    }
    if (res == -ENOSPC || res == -EDQUOT) stats_.enospc_events.Add(1);
  }
  Chunk* c = op.chunk;
  if (c != nullptr) c->ops_in_flight--;
  if (op.role == OpRole::kRead) reads_at_disk_--;
  op.complete(*this, op, res);  // the op's own continuation
  if (c == nullptr) return;     // an op of no chunk: an eviction's unlink, a directory removal, a close or unlink
  // The place at the disk goes with the last data transfer (a load's last piece asked for and back), or as soon
  // as the chunk moved on from transferring (written: syncing or linking; failed).
  if ((c->ops_in_flight == 0 && !PiecesToAsk(*c)) || c->state != ChunkState::kTransferring) EndDataPhase(*c);
  Settle(*c);
}

void Reactor::OnOpenDone(const Op& op, const Named&, int64_t res) {
  Chunk* c = op.chunk;
  if (res >= 0) {
    c->fd = static_cast<int>(res);
    if (c->job->kind == JobKind::kStore) c->store().tmp_exists = !c->store().tmp_anonymous;
  }
  if (c->state == ChunkState::kFailed) return;  // late: Settle() closes the fd
  if (res < 0) {
    if (c->job->kind == JobKind::kLoad) {
      // EINVAL: O_DIRECT refused, which on a filesystem that passed the O_DIRECT probe means a directory or
      // a FIFO under the chunk's name.
      if (res == -ELOOP || res == -EXDEV || res == -ENOTDIR || res == -ENXIO || res == -EISDIR || res == -EINVAL) {
        // Something other than a regular file or a real directory path (K1, K2): never followed, removed.
        Status why(StatusCode::kCorrupt,
                   "open " + c->rel_path + " refused (" + std::string(strerror(static_cast<int>(-res))) +
                       "): a symlink or special file where a chunk belongs",
                   static_cast<int>(-res));
        QuarantineCorrupt(*c);
        FailChunk(*c, why);
      } else if (res == -ENOENT) {
        ForgetEntry(c->key);  // evicted by another instance, or never there
        FailChunk(*c, Status(StatusCode::kNotFound, "chunk file absent"));
      } else {
        FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "open " + c->rel_path));
      }
    } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) {
      // retried
    } else if ((res == -ENOENT || res == -ESTALE || (res == -EPERM && c->store().tmp_anonymous)) &&
               RetryAfterVanishedDir(*c)) {
      // the fan-out directory went away (eviction, gc): created again
    } else {
      FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "create " + c->store().tmp_path));
    }
    return;
  }
  if (c->job->kind == JobKind::kLoad) {
    SubmitStatx<&Reactor::OnStatxDone>(*c, NoArgs{});  // checks the file's shape, then queues it for the disk
    return;
  }
  if (files_.chmod_files) {
    // K2: the umask stripped bits of files_.file_mode (e.g. group write of a 0770 deployment): set it exactly, before
    // the temporary is written and linked.
    IoOp io;
    io.code = OpCode::kFchmod;
    io.fd = c->fd;
    io.mode = files_.file_mode;
    Submit<&Reactor::OnTemporaryChmodDone>(Op{.role = OpRole::kChmod, .chunk = c, .deadline_ns = Deadline()}, NoArgs{},
                                           io);
    return;
  }
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(data_queue_, c);  // PumpData starts its reads or writes when the disk has room (io_depth)
}

void Reactor::TraceTransfer(const Op& op, int64_t res, const char* name) {
  if (trace_ && trace_->enabled()) {
    trace_->Complete(name, "io", op.start_ns, NowNs() - op.start_ns, trace_tid_,
                     {{"bytes", res > 0 ? uint64_t(res) : 0}});
  }
}

void Reactor::CheckDeadlines() {
  const int64_t now = NowNs();
  for (auto& [id, op] : ops_) {
    if (op.chunk == nullptr || op.late || op.deadline_ns == 0 || op.deadline_ns > now) continue;
    op.late = true;  // I4: the chunk becomes a miss now; its buffer stays held until the op returns
    stats_.timeouts.Add(1);
    FailChunk(*op.chunk, Status(StatusCode::kTimedOut, std::string(OpRoleName(op.role)) + " passed its " +
                                                           std::to_string(options_.op_timeout_ms) + " ms deadline"));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Completion, failure, release

void Reactor::FailChunk(Chunk& c, Status status) {
  if (IsFinished(c.state)) return;
  c.status = std::move(status);
  if (c.status.ok()) c.status = Status(StatusCode::kInternal, "chunk failed without a reason");
  if (c.job->kind == JobKind::kStore) {
    stats_.stores_dropped.Add(1);
    FinishChunk(c);
    return;
  }
  FinishChunk(c);
}

void Reactor::FinishChunk(Chunk& c) {
  if (IsFinished(c.state)) return;
  SetState(c, c.status.ok() ? ChunkState::kSucceeded : ChunkState::kFailed);
  Job& job = *c.job;
  if (job.kind == JobKind::kLoad) c.load().pin.Release();
  if (job.kind == JobKind::kStore) {
    auto it = stores_in_flight_.find(c.key);
    if (it != stores_in_flight_.end() && it->second == &c) stores_in_flight_.erase(it);
    disk_->EndPendingStore(c.key);
    outcomes_.Record(c.key, c.status);  // after the publish (or the drop) it reports
  }
  placement_->Unplace(c.key);
  // Last, after every effect of this chunk (index, pending stores): the reactor whose chunk is the job's last one
  // publishes the result; acq_rel makes the other reactors' chunk outcomes visible to it.
  if (job.unfinished.fetch_sub(1, std::memory_order_acq_rel) == 1) PublishJob(job);
}

void Reactor::PublishJob(Job& job) {
  const int64_t latency_ns = NowNs() - job.start_ns;
  uint32_t ok = 0;
  for (auto& ch : job.chunks) ok += ch->status.ok() ? 1 : 0;
  const uint64_t us = static_cast<uint64_t>(latency_ns / 1000);
  if (job.kind == JobKind::kLoad) {
    stats_.read_latency_us.Record(us);  // a promotion: disk -> verified resident slot
  } else {
    stats_.store_latency_us.Record(us);
    stats_.stores_completed.Add(1);
  }
  if (trace_ && trace_->enabled()) {
    trace_->Complete(job.kind == JobKind::kLoad ? "load_job" : "store_job", "job", job.start_ns, latency_ns, 0,
                     {{"chunks", job.chunks.size()}, {"ok", ok}, {"bytes", job.bytes.load()}});
  }
  // Nobody waits for the result: promotions report through the resident map, committed stores through it and
  // their watched outcomes (StoreOutcomes::Record).
}

// Returns the chunk's resources once nothing in flight can touch them any more.
void Reactor::Settle(Chunk& c) {
  if (c.ops_in_flight > 0) return;
  if (c.state != ChunkState::kSucceeded && c.state != ChunkState::kFailed) return;  // progressing, or released
  const bool succeeded = c.state == ChunkState::kSucceeded;  // a load's: verified and published ready in its slot
  SetState(c, ChunkState::kReleased);
  // After a successful link a named temporary is a second name of the entry; after a failure it is garbage. Closed
  // first (on NFS and FUSE a name unlinked while open becomes a hidden file holding its space), then unlinked.
  const bool is_store = c.job->kind == JobKind::kStore;
  SubmitClose(c.fd, is_store && c.store().tmp_exists ? c.store().tmp_path : std::string());
  c.fd = -1;
  if (is_store) {
    StoreState& s = c.store();
    s.tmp_exists = false;
    if (s.usage_reserved) {  // dropped: its bytes never became an entry
      budget_->Release(files_.slot_bytes);
      s.usage_reserved = false;
    }
    resident_->Written(c.key);  // written or not, the slot's bytes stay valid in the DRAM tier
    if (s.counts_committed) {
      s.counts_committed = false;
      committed_started_--;
    }
  } else if (!succeeded) {
    // A failed promotion gives its slot back, now that no read of it is in flight (the kernel may have been
    // writing into it until the last one came back).
    resident_->Loaded(c.key, c.slot, 0, false, NowNs());
    pool_->RingEngine();  // a load stream waits for this read (policy/stream_pump.h)
  }
  ReturnJobSlot(c);
}

void Reactor::SetState(Chunk& c, ChunkState to) {
#ifndef NDEBUG
  if (!LegalChunkTransition(c.job->kind, c.state, to)) {
    std::fprintf(stderr, "kvtier: internal error: %s chunk %s moved from %s to %s\n",
                 c.job->kind == JobKind::kLoad ? "load" : "store", c.key.Hex().c_str(), ChunkStateName(c.state),
                 ChunkStateName(to));
    std::abort();
  }
#endif
  c.state = to;
}

const char* Reactor::OpRoleName(OpRole r) {
  switch (r) {
    case OpRole::kOpen: return "open";
    case OpRole::kRead: return "read";
    case OpRole::kWrite: return "write";
    case OpRole::kFsync: return "fsync";
    case OpRole::kClose:
    case OpRole::kCloseBeforeLink: return "close";
    case OpRole::kLink: return "link";
    case OpRole::kUnlinkTmp:
    case OpRole::kUnlinkEvicted:
    case OpRole::kUnlinkCorrupt: return "unlink";
    case OpRole::kMkdir: return "mkdir";
    case OpRole::kRmdirFanout: return "rmdir";
    case OpRole::kStatx: return "statx";
    case OpRole::kChmod: return "chmod";
    case OpRole::kTouch: return "touch";
  }
  return "op";
}

}  // namespace kvtier
