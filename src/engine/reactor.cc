// The reactor loop and the per-chunk state machines of the engine's jobs (states: src/engine/chunk_state.h). Both
// start from a slot the DRAM tier gave them (docs/architecture.md, "One data path"):
//
// Load (a promotion): open -> read header + blocks into the slot -> verify -> slot ready (resident) -> release.
// Store (committed):  header + checksums over the filled slot -> open temporary -> write -> [fsync] -> link ->
//                     unlink temporary -> index -> release (the slot stays resident).
// A chunk that fails is finished at once (its job can complete with a miss), but its slot, fd and temporary are
// released only when every operation it started has come back: the kernel may still be writing into the slot.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/engine_impl.h"
#include "layout/chunk_path.h"

namespace kvtier {

namespace {
constexpr int64_t kReapWaitNs = 20 * 1000 * 1000;  // bounds how late a deadline (posix) is noticed
constexpr uint32_t kReadsPerDataPlace = 2;         // a reactor's piece budget: reads at the disk per place (its depth)
}  // namespace

void EngineImpl::InsertByAdmission(std::deque<Chunk*>& q, Chunk* c) {
  auto at = q.end();
  while (at != q.begin() && (*std::prev(at))->admitted > c->admitted) --at;
  q.insert(at, c);
}

// ---------------------------------------------------------------------------------------------------------------

void EngineImpl::ReactorMain(Reactor& r) {
  std::vector<io::IoCompletion> cqes;
  for (;;) {
    bool stopping;
    {
      MutexLock lock(cmd_mu_);
      auto& commands = commands_[r.index];
      while (!commands.empty()) {
        r.jobs.push_back(std::move(commands.front()));
        commands.pop_front();
      }
      stopping = stop_;
    }
    StartWaitingChunks(r);
    PumpData(r);
    RetryDeferredOps(r);
    r.io->Flush();
    VerifyReadChunks(r);
    // Drop parts whose every chunk has settled (the job's result was published when its last chunk finished, on
    // whichever reactor that was); the job itself goes with its last part.
    std::erase_if(r.jobs, [](const std::unique_ptr<Part>& p) {
      for (Chunk* c : p->chunks) {
        if (c->state != ChunkState::kReleased || c->ops_in_flight > 0) return false;
      }
      return true;
    });
    if (stopping && r.jobs.empty() && r.op_ctx.empty()) break;

    cqes.clear();
    const bool waiting = !r.op_ctx.empty() || !r.jobs.empty();
    int rc = r.io->Reap(&cqes, waiting ? kReapWaitNs : -1);
    if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -ETIMEDOUT) {
      stats_.io_errors.Add(1);
    }
    for (const io::IoCompletion& cqe : cqes) OnCompletion(r, cqe);
    // Chunks whose data transfer finished freed places at the disk: start the next reads/writes before any
    // checksum pass (loads' verification below).
    PumpData(r);
    r.io->Flush();
    VerifyReadChunks(r);
    CheckDeadlines(r);
  }
}

void EngineImpl::EndDataPhase(Chunk& c) {
  Reactor& r = *c.reactor;
  if (!c.data_phase) return;
  c.data_phase = false;
  r.data_in_flight--;
  if (c.job->kind == JobKind::kLoad) std::erase(r.piece_queue, &c);
}

bool EngineImpl::PiecesToAsk(const Chunk& c) {
  return c.data_phase && c.job->kind == JobKind::kLoad && c.next_piece < c.num_blocks;
}

void EngineImpl::FillPieces(Reactor& r) {
  // Oldest first: the chunk that entered its data phase first gets every piece it still needs before the next one
  // gets any, so chunks finish one after another at the device's pace and a job's last chunks keep the whole budget
  // (docs/architecture.md, "Reads in pieces").
  const uint32_t budget = kReadsPerDataPlace * r.depth;
  while (r.reads_at_disk < budget && !r.piece_queue.empty()) {
    Chunk* c = r.piece_queue.front();
    if (c->state != ChunkState::kTransferring || !PiecesToAsk(*c)) {
      r.piece_queue.pop_front();
      continue;
    }
    SubmitNextPiece(*c);
    if (!PiecesToAsk(*c)) r.piece_queue.pop_front();
  }
}

void EngineImpl::PumpData(Reactor& r) {
  while (r.data_in_flight < r.depth && !r.data_queue.empty()) {
    Chunk* c = r.data_queue.front();
    r.data_queue.pop_front();
    if (c->state == ChunkState::kFailed) {
      Settle(*c);
      continue;
    }
    SetState(*c, ChunkState::kTransferring);
    c->data_phase = true;
    r.data_in_flight++;
    if (c->job->kind == JobKind::kLoad) {
      uint8_t* base = pool_->SlotData(c->slot);
      const uint64_t piece = options_.read_piece_bytes;
      c->piece_blocks = piece == 0
                            ? c->num_blocks
                            : static_cast<uint32_t>(std::clamp<uint64_t>(piece / block_stride_, 1, c->num_blocks));
      c->next_piece = 0;
      c->pieces_at_disk = 1;
      c->header.reset();
      c->verified.assign(c->num_blocks, false);
      c->landed_unverified.clear();
      if (c->first_block == 0) {  // the header and the first piece in one aligned read
        c->next_piece = c->piece_blocks;
        SubmitRead(*c, base, kHeaderBytes + uint64_t(c->piece_blocks) * block_stride_, 0, 0, c->piece_blocks, true);
      } else {
        SubmitRead(*c, base, kHeaderBytes, 0, 0, 0, true);
      }
      if (PiecesToAsk(*c)) InsertByAdmission(r.piece_queue, c);
    } else {
      SubmitWrite(*c, pool_->SlotData(c->slot), slot_bytes_, 0);
    }
  }
  FillPieces(r);
}

void EngineImpl::StartWaitingChunks(Reactor& r) {
  for (auto& part : r.jobs) {
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

bool EngineImpl::TakeJobSlot(Part& part) {
  Reactor& r = *part.chunks.front()->reactor;
  if (part.slots_held >= 2 * r.depth) return false;
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
    if (reactors_.size() == 1) return false;
    // Record the wait before trying again: a slot returned in between is either seen or wakes this reactor.
    job.slot_waiters.fetch_or(uint64_t{1} << r.index);
    if (!take()) return false;
  }
  part.slots_held++;
  return true;
}

void EngineImpl::ReturnJobSlot(Chunk& c) {
  if (!c.counts_job_slot) return;
  c.counts_job_slot = false;
  c.part->slots_held--;
  c.job->slots_held.fetch_sub(1);
  if (reactors_.size() > 1) WakeWaiters(c.job->slot_waiters);
}

// ---------------------------------------------------------------------------------------------------------------
// Operations

void EngineImpl::SubmitOp(Reactor& r, OpCtx ctx, io::IoOp op) {
  const uint64_t id = r.next_op_id++;
  auto [it, inserted] = r.op_ctx.emplace(id, std::move(ctx));
  OpCtx& c = it->second;
  // Pointers into the context: stable, unordered_map nodes do not move.
  if (!c.path.empty()) op.path = c.path.c_str();
  if (!c.path2.empty()) op.path2 = c.path2.c_str();
  op.user_data = id;
  // I4: a close carries no linked timeout: a cancelled close (FUSE and NFS hand closes with a flush to a worker)
  // would leave the fd open for good. Its deadline still holds: CheckDeadlines fails the chunk on time.
  op.deadline_ns = op.code == io::OpCode::kClose ? 0 : c.deadline_ns;
  c.start_ns = io::NowNs();
  if (c.chunk) c.chunk->ops_in_flight++;
  if (c.role == OpRole::kRead) r.reads_at_disk++;
  const int rc = r.io->Submit(op);
  if (rc == -EAGAIN) {
    r.deferred_ops.push_back(DeferredOp{id, op});  // ring full: resubmitted next iteration
  } else if (rc < 0) {
    io::IoCompletion fake{id, rc};
    OnCompletion(r, fake);
  }
}

void EngineImpl::RetryDeferredOps(Reactor& r) {
  while (!r.deferred_ops.empty()) {
    DeferredOp& d = r.deferred_ops.front();
    if (r.op_ctx.count(d.id) == 0) {  // should not happen; be safe
      r.deferred_ops.pop_front();
      continue;
    }
    const int rc = r.io->Submit(d.op);
    if (rc == -EAGAIN) return;
    const uint64_t id = d.id;
    r.deferred_ops.pop_front();
    if (rc < 0) OnCompletion(r, io::IoCompletion{id, rc});
  }
}

void EngineImpl::SubmitRead(Chunk& c, uint8_t* buf, uint64_t len, uint64_t offset, uint32_t piece_first,
                            uint32_t piece_blocks, bool with_header) {
  Reactor& r = *c.reactor;
  OpCtx ctx{OpRole::kRead, &c, &EngineImpl::OnReadDone, buf, len, offset, Deadline()};
  ctx.piece_first = piece_first;
  ctx.piece_blocks = piece_blocks;
  ctx.with_header = with_header;
  io::IoOp op;
  op.code = io::OpCode::kRead;
  op.fd = c.fd;
  op.buf = buf;
  op.len = static_cast<uint32_t>(std::min<uint64_t>(len, 1u << 30));
  op.offset = offset;
  SubmitOp(r, std::move(ctx), op);
}

void EngineImpl::SubmitWrite(Chunk& c, uint8_t* buf, uint64_t len, uint64_t offset) {
  Reactor& r = *c.reactor;
  OpCtx ctx{OpRole::kWrite, &c, &EngineImpl::OnWriteDone, buf, len, offset, Deadline()};
  io::IoOp op;
  op.code = io::OpCode::kWrite;
  op.fd = c.fd;
  op.buf = buf;
  op.len = static_cast<uint32_t>(std::min<uint64_t>(len, 1u << 30));
  op.offset = offset;
  SubmitOp(r, std::move(ctx), op);
}

void EngineImpl::SubmitClose(Reactor& r, int fd) {
  if (fd < 0) return;
  io::IoOp op;
  op.code = io::OpCode::kClose;
  op.fd = fd;
  SubmitOp(r, OpCtx{OpRole::kClose, nullptr, nullptr}, op);  // nothing to do when it is back
}

void EngineImpl::OnCompletion(Reactor& r, const io::IoCompletion& cqe) {
  auto it = r.op_ctx.find(cqe.user_data);
  if (it == r.op_ctx.end()) return;
  OpCtx ctx = std::move(it->second);
  r.op_ctx.erase(it);
  const int64_t res = cqe.result;
  if (res < 0 && res != -EEXIST && res != -ENOENT && !ctx.errors_are_answers) {
    if (res == -ETIMEDOUT || res == -ECANCELED) {
      stats_.timeouts.Add(ctx.late ? 0 : 1);
    } else {
      stats_.io_errors.Add(1);
    }
    if (res == -ENOSPC || res == -EDQUOT) stats_.enospc_events.Add(1);
  }
  Chunk* c = ctx.chunk;
  if (c != nullptr) c->ops_in_flight--;
  if (ctx.role == OpRole::kRead) r.reads_at_disk--;
  if (ctx.on_done != nullptr) (this->*ctx.on_done)(r, ctx, res);  // the op's own continuation
  if (c == nullptr) return;  // an eviction's unlink, a directory removal, a fire-and-forget close or unlink
  // The place at the disk goes with the last data transfer (a load's last piece asked for and back), or as soon
  // as the chunk moved on from transferring (written: syncing or linking; failed).
  if ((c->ops_in_flight == 0 && !PiecesToAsk(*c)) || c->state != ChunkState::kTransferring) EndDataPhase(*c);
  Settle(*c);
}

void EngineImpl::OnUnlinkEvictedDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  if (res == 0 || res == -ENOENT) SubmitRmdirFanout(r, ctx.key, 2);
  budget_->Unlinked(DiskBudget::Victim{ctx.key, ctx.len}, static_cast<int>(res));
}

void EngineImpl::OnRmdirFanoutDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  // C1: ENOTEMPTY (the directory holds entries or a store's temporary) and ENOENT (gone already) are answers
  // (OpCtx::errors_are_answers).
  if (res != 0) return;
  r.fanout_cache.Forget(ctx.key);
  if (ctx.len == 2) SubmitRmdirFanout(r, ctx.key, 1);
}

void EngineImpl::OnOpenDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  if (res >= 0) {
    c->fd = static_cast<int>(res);
    if (c->job->kind == JobKind::kStore) c->tmp_exists = !c->tmp_anonymous;
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
        QuarantineCorrupt(c->reactor->index, c->key, c->rel_path, why);
        FailChunk(*c, why);
      } else if (res == -ENOENT) {
        ForgetEntry(c->key);  // evicted by another instance, or never there
        FailChunk(*c, Status(StatusCode::kNotFound, "chunk file absent"));
      } else {
        FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "open " + c->rel_path));
      }
    } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) {
      // retried
    } else if ((res == -ENOENT || res == -ESTALE || (res == -EPERM && c->tmp_anonymous)) && RetryAfterVanishedDir(*c)) {
      // the fan-out directory went away (eviction, gc): created again
    } else {
      FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "create " + c->tmp_path));
    }
    return;
  }
  if (c->job->kind == JobKind::kLoad) {
    SubmitStatx(*c, &EngineImpl::OnStatxDone);  // checks the file's shape, then queues the chunk for the disk
    return;
  }
  if (fchmod_files_) {
    // K2: the umask stripped bits of file_mode_ (e.g. group write of a 0770 deployment): set it exactly, before
    // the temporary is written and linked.
    io::IoOp op;
    op.code = io::OpCode::kFchmod;
    op.fd = c->fd;
    op.mode = file_mode_;
    OpCtx chmod{OpRole::kChmod, c, &EngineImpl::OnTemporaryChmodDone};
    chmod.deadline_ns = Deadline();
    SubmitOp(r, std::move(chmod), op);
    return;
  }
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(r.data_queue, c);  // PumpData starts its reads or writes when the disk has room (io_depth)
}

void EngineImpl::OnTemporaryChmodDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  if (c->state == ChunkState::kFailed) return;
  // A failed chmod is counted (an I/O error) and the store goes on: the entry is published with the umask's mode.
  static_cast<void>(res);
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(r.data_queue, c);
}

void EngineImpl::SubmitStatx(Chunk& c, OpHandler on_done, std::string path, uint64_t level) {
  if (!c.statx_buf) c.statx_buf = std::make_unique<struct statx>();
  io::IoOp op;
  op.code = io::OpCode::kStatx;
  op.fd = c.fd;
  op.dirfd = ns_->dirfd();
  op.buf = c.statx_buf.get();  // the chunk outlives its ops (Settle waits for them)
  op.len = sizeof(struct statx);
  OpCtx ctx{OpRole::kStatx, &c, on_done};
  ctx.path = std::move(path);  // empty: the open file's (SubmitOp passes no path)
  ctx.len = level;
  ctx.deadline_ns = Deadline();
  SubmitOp(*c.reactor, std::move(ctx), op);
}

void EngineImpl::OnStatxDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  if (c->state == ChunkState::kFailed) return;
  const struct statx& sx = *c->statx_buf;
  Status shape = res < 0 ? Status::FromErrno(static_cast<int>(-res), "statx") : CheckOpenedChunk(c->fd, sx);
  if (res >= 0) {
    c->opened_ino = sx.stx_ino;
    c->opened_mtime_ns = S_ISREG(sx.stx_mode) ? int64_t(sx.stx_mtime.tv_sec) * 1000000000 + sx.stx_mtime.tv_nsec : 0;
  }
  if (!shape.ok()) {
    if (shape.code() != StatusCode::kCorrupt) {
      // statx itself failed (EIO, ESTALE): the filesystem did not answer, which says nothing about the entry
    } else if (YoungOnSharedRoot(*c)) {
      ForgetEntry(c->key);  // M1: maybe another host's entry whose data is not visible here yet
    } else {
      QuarantineCorrupt(c->reactor->index, c->key, c->rel_path, shape, c->opened_ino);
    }
    FailChunk(*c, shape.WithContext(c->rel_path));
    return;
  }
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(r.data_queue, c);
}

void EngineImpl::TraceTransfer(Reactor& r, const OpCtx& ctx, int64_t res, const char* name) {
  if (trace_ && trace_->enabled()) {
    trace_->Complete(name, "io", ctx.start_ns, io::NowNs() - ctx.start_ns, r.trace_tid,
                     {{"bytes", res > 0 ? uint64_t(res) : 0}});
  }
}

void EngineImpl::OnReadDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  TraceTransfer(r, ctx, res, "read");
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "read " + c->rel_path));
  } else if (res == 0) {
    if (YoungOnSharedRoot(*c)) {
      ForgetEntry(c->key);  // M1: see YoungOnSharedRoot
    } else {
      QuarantineCorrupt(c->reactor->index, c->key, c->rel_path,
                        Status(StatusCode::kCorrupt, "file shorter than its header says"), c->opened_ino);
    }
    FailChunk(*c, Status(StatusCode::kCorrupt, "truncated chunk file " + c->rel_path));
  } else {
    stats_.bytes_read.Add(static_cast<uint64_t>(res));
    if (static_cast<uint64_t>(res) < ctx.len) {  // short read: continue where it stopped, same piece
      SubmitRead(*c, ctx.buf + res, ctx.len - res, ctx.offset + res, ctx.piece_first, ctx.piece_blocks,
                 ctx.with_header);
      return;
    }
    c->pieces_at_disk--;
    PieceLanded(*c, ctx);  // the next pieces are asked for by FillPieces, after this round of completions
    if (c->state == ChunkState::kFailed) return;
    if (c->ops_in_flight == 0 && !PiecesToAsk(*c)) {
      // The disk is done with this chunk: its place goes to the next opened chunk, whose read the reactor
      // submits before verifying this one's last piece (VerifyReadChunks), so the disk never waits for
      // checksums (the raw baseline re-arms a finished slot at once too).
      EndDataPhase(*c);
      SetState(*c, ChunkState::kVerifying);
      r.read_done.push_back(c);
    }
  }
}

void EngineImpl::OnWriteDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  TraceTransfer(r, ctx, res, "write");
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) return;
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "write " + c->tmp_path));
  } else if (res == 0) {
    FailChunk(*c, Status(StatusCode::kIoError, "write made no progress on " + c->tmp_path));
  } else {
    stats_.bytes_written.Add(static_cast<uint64_t>(res));
    if (static_cast<uint64_t>(res) < ctx.len) {
      SubmitWrite(*c, ctx.buf + res, ctx.len - res, ctx.offset + res);
    } else if (c->ops_in_flight == 0) {
      StoreWritesDone(*c);
    }
  }
}

void EngineImpl::OnFsyncDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "fsync " + c->tmp_path));
  } else {
    StoreWritesDone(*c);
  }
}

void EngineImpl::OnLinkDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk* c = ctx.chunk;
  if (c->state == ChunkState::kFailed) {
    // I4: the link came back after its deadline had failed the chunk, and made the entry all the same: it is on
    // disk, so it is counted and indexed (C1, M2), or the shared usage would miss its bytes until a gc.
    if (res == 0) {
      const bool reserved = c->usage_reserved;
      if (reserved) budget_->CommitReserved(slot_bytes_);
      c->usage_reserved = false;
      PublishIndexed(r, c->key, slot_bytes_, /*linked=*/!reserved);
    }
    return;
  }
  if (res == 0 || res == -EEXIST) {
    // EEXIST: another writer published the same key first; its bytes are equally valid (L4).
    if (res == -EEXIST) stats_.stores_deduplicated.Add(1);
    if (res != 0 && c->usage_reserved) budget_->Release(slot_bytes_);  // not ours
    if (res == 0 && c->usage_reserved) budget_->CommitReserved(slot_bytes_);
    PublishIndexed(r, c->key, kHeaderBytes + uint64_t(options_.identity.blocks_per_chunk) * block_stride_,
                   /*linked=*/res == 0 && !c->usage_reserved);
    c->usage_reserved = false;
    c->job->bytes += slot_bytes_;
    if (c->fd >= 0) {  // an anonymous temporary's fd, kept open for linkat
      SubmitClose(r, c->fd);
      c->fd = -1;
    }
    FinishChunk(*c);  // Settle() removes a named temporary
  } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) {
    // retried
  } else if ((res == -ENOENT || res == -ESTALE) && c->tmp_anonymous && c->fd >= 0 && RetryAfterVanishedDir(*c)) {
    // the final name's directory went away while the anonymous temporary was written: created again, then
    // linked (OnMkdirDone)
  } else {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "link " + c->rel_path));
  }
}

void EngineImpl::CheckDeadlines(Reactor& r) {
  const int64_t now = io::NowNs();
  for (auto& [id, ctx] : r.op_ctx) {
    if (ctx.chunk == nullptr || ctx.late || ctx.deadline_ns == 0 || ctx.deadline_ns > now) continue;
    ctx.late = true;  // I4: the chunk becomes a miss now; its buffer stays held until the op returns
    stats_.timeouts.Add(1);
    FailChunk(*ctx.chunk, Status(StatusCode::kTimedOut, std::string(OpRoleName(ctx.role)) + " passed its " +
                                                            std::to_string(options_.op_timeout_ms) + " ms deadline"));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Loads

bool EngineImpl::StartLoadChunk(Part&, Chunk& c) {
  Reactor& r = *c.reactor;
  c.started_ns = io::NowNs();
  if (c.admitted == 0) c.admitted = r.next_admission++;
  c.pinned = disk_->Pin(c.key);
  c.slot_gen = pool_->BeginFill(c.slot);

  io::IoOp op;
  op.code = io::OpCode::kOpenAt;
  op.dirfd = ns_->dirfd();
  // K2: no symlink anywhere on the path and nothing outside the namespace (openat2; O_NOFOLLOW where the kernel
  // lacks it). O_NONBLOCK: a FIFO planted under a chunk's name must not block the open (it is cleared again once
  // statx has shown a regular file, since io_uring would return EAGAIN for reads of a non-blocking file).
  op.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | open_flags_extra_;
  op.resolve = open_resolve_;
  OpCtx ctx{OpRole::kOpen, &c, &EngineImpl::OnOpenDone};
  ctx.path = c.rel_path;
  ctx.deadline_ns = Deadline();
  SetState(c, ChunkState::kOpening);
  SubmitOp(r, std::move(ctx), op);
  return true;
}

void EngineImpl::VerifyReadChunks(Reactor& r) {
  if (r.read_done.empty()) return;
  std::vector<Chunk*> done;
  done.swap(r.read_done);
  for (Chunk* c : done) {
    if (c->state == ChunkState::kVerifying && c->ops_in_flight == 0) LoadReadsDone(*c);
    Settle(*c);
  }
}

void EngineImpl::SubmitNextPiece(Chunk& c) {
  const uint32_t n = std::min(c.piece_blocks, c.num_blocks - c.next_piece);
  uint8_t* base = pool_->SlotData(c.slot);
  SubmitRead(c, base + kHeaderBytes + uint64_t(c.next_piece) * block_stride_, uint64_t(n) * block_stride_,
             BlockRangeOffset(block_stride_, c.first_block + c.next_piece), c.next_piece, n, false);
  c.next_piece += n;
  c.pieces_at_disk++;
}

void EngineImpl::PieceLanded(Chunk& c, const OpCtx& ctx) {
  if (ctx.with_header) {
    const ChunkGeometry geometry = ns_->geometry();
    auto header = DecodeHeader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, checksum_key_.get());
    if (!header.ok()) {
      FailVerification(c, header.status());
      return;
    }
    c.header = std::make_unique<ChunkHeader>(*header);
  }
  if (ctx.piece_blocks > 0) c.landed_unverified.emplace_back(ctx.piece_first, ctx.piece_blocks);
  // K1: while more of the chunk is still at the disk or to be asked for, a landed piece is checked now, its bytes
  // still in the cache; the last one waits for LoadReadsDone, after the disk has the next chunk's reads.
  const bool more = c.next_piece < c.num_blocks || c.pieces_at_disk > 0;
  if (!more || !c.header) return;
  for (const auto& [first, n] : c.landed_unverified) {
    Status v = VerifyPiece(c, first, n);
    if (!v.ok()) {
      FailVerification(c, v);
      return;
    }
  }
  c.landed_unverified.clear();
}

Status EngineImpl::VerifyPiece(Chunk& c, uint32_t first, uint32_t n) {
  const uint8_t* data = pool_->SlotData(c.slot) + kHeaderBytes + uint64_t(first) * block_stride_;
  Status v = VerifyBlocks(*c.header, c.first_block + first, n, data, checksum_key_.get());
  if (v.ok()) {
    for (uint32_t j = first; j < first + n && j < c.verified.size(); ++j) c.verified[j] = true;
  }
  return v;
}

bool EngineImpl::OtherSecret(const Chunk& c) const {
  if (c.header || !ns_->checksum_key_record().empty()) return false;
  const ChunkGeometry geometry = ns_->geometry();
  return KeyedForAnotherReader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, checksum_key_.get());
}

void EngineImpl::FailVerification(Chunk& c, const Status& verdict) {
  if (OtherSecret(c)) {
    // K3: never removed (it may be the good entry of every other engine on the root); a miss for this one.
    stats_.other_secret_misses.Add(1);
    ForgetEntry(c.key);
    FailChunk(c, Status(StatusCode::kFailedPrecondition,
                        verdict.message() + " (this namespace's MANIFEST does not record its checksum key: the entry "
                                            "is kept, a miss for this engine)")
                     .WithContext(c.rel_path));
    return;
  }
  if (YoungOnSharedRoot(c)) {
    ForgetEntry(c.key);  // M1: see YoungOnSharedRoot
  } else {
    QuarantineCorrupt(c.reactor->index, c.key, c.rel_path, verdict, c.opened_ino);
  }
  FailChunk(c, verdict.WithContext(c.rel_path));
}

void EngineImpl::LoadReadsDone(Chunk& c) {
  Reactor& r = *c.reactor;
  SubmitClose(r, c.fd);
  c.fd = -1;
  Status verdict;
  if (!c.header) {  // not decoded as it landed (PieceLanded always does; kept for any path that did not)
    const ChunkGeometry geometry = ns_->geometry();
    auto header = DecodeHeader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, checksum_key_.get());
    verdict = header.status();
    if (verdict.ok()) c.header = std::make_unique<ChunkHeader>(*header);
  }
  if (c.verified.size() != c.num_blocks) c.verified.assign(c.num_blocks, false);
  // K1: the blocks not checked as their pieces landed (the last piece; every block with one read per chunk).
  for (uint32_t j = 0; verdict.ok() && j < c.num_blocks;) {
    if (c.verified[j]) {
      ++j;
      continue;
    }
    uint32_t k = j;
    while (k < c.num_blocks && !c.verified[k]) ++k;
    verdict = VerifyPiece(c, j, k - j);
    j = k;
  }
  if (!verdict.ok()) {
    FailVerification(c, verdict);
    return;
  }
  if (trace_ && trace_->enabled()) {
    trace_->Complete("load_read", "load", c.started_ns, io::NowNs() - c.started_ns, r.trace_tid,
                     {{"blocks", c.num_blocks}, {"job", c.job->id}});
  }
  MaybeTouchEntry(c);
  c.ready = true;
  pool_->PublishReady(c.slot, c.slot_gen);
  resident_->Loaded(c.key, c.slot, c.slot_gen, true, io::NowNs());
  pool_->RingEngine();  // a load stream waits for this read (policy/stream_pump.h)
  c.job->bytes += uint64_t(c.num_blocks) * options_.identity.block_bytes;
  FinishChunk(c);  // VerifyReadChunks settles it
}

// ---------------------------------------------------------------------------------------------------------------
// Stores

bool EngineImpl::StartStoreChunk(Part& part, Chunk& c) {
  Reactor& r = *c.reactor;
  c.started_ns = io::NowNs();
  if (c.admitted == 0) c.admitted = r.next_admission++;
  if (disk_->Contains(c.key) || r.stores_in_flight.count(c.key)) {
    // Already published (or being published by an earlier job): nothing to write.
    stats_.stores_deduplicated.Add(1);
    FinishChunk(c);
    Settle(c);  // holds nothing; a resident slot is marked written
    return true;
  }
  // A worker filled this resident slot (CommitStore): write it out as it is.
  // I1/S1: at most the job's allowance (2 x io_depth) of its resident slots are checksummed and at the disk at once:
  // started all at once, a large commit had its reactor checksum every chunk before the first write went out, and
  // the disk waited. The reactor's own bound does the same for many small commits (vLLM commits a request's chunks
  // each step), which each have an allowance of their own.
  if (r.committed_started >= 2 * r.depth) return false;
  if (!TakeJobSlot(part)) return false;
  c.counts_job_slot = true;
  c.counts_committed = true;
  r.committed_started++;
  r.stores_in_flight[c.key] = &c;
  BeginStoreWrite(c);
  return true;
}

void EngineImpl::BeginStoreWrite(Chunk& c) {
  Reactor& r = *c.reactor;
  uint8_t* base = pool_->SlotData(c.slot);
  const uint32_t bpc = options_.identity.blocks_per_chunk;
  const uint64_t bb = options_.identity.block_bytes;
  ChunkHeader h;
  h.fingerprint = ns_->fingerprint();
  h.key = c.key;
  h.num_blocks = bpc;
  h.block_bytes = bb;
  h.created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  if (block_stride_ > bb) {  // deterministic padding between blocks
    for (uint32_t b = 0; b < bpc; ++b) {
      std::memset(base + kHeaderBytes + uint64_t(b) * block_stride_ + bb, 0, block_stride_ - bb);
    }
  }
  if (Status fs = FillPayloadFields(&h, base + kHeaderBytes, checksum_key_.get()); !fs.ok()) {
    FailChunk(c, fs);
    return;
  }
  Status s = EncodeHeader(h, std::span<uint8_t>(base, kHeaderBytes), checksum_key_.get());
  if (!s.ok()) {
    FailChunk(c, s);
    return;
  }
  if (budget_->shared() && budget_->has_budget() && !c.usage_reserved) {
    budget_->Reserve(slot_bytes_);
    c.usage_reserved = true;
    EvictAboveHighWatermark(r);
  }
  OpenTemporary(c);
}

void EngineImpl::OpenTemporary(Chunk& c) {
  Reactor& r = *c.reactor;
  if (!r.fanout_cache.Has(c.key)) {
    SubmitMkdir(c, r.fanout_cache.HasFirstLevel(c.key.data()[0]) ? 2 : 1);
    return;
  }
  io::IoOp op;
  op.code = io::OpCode::kOpenAt;
  op.dirfd = ns_->dirfd();
  op.mode = file_mode_;
  OpCtx ctx{OpRole::kOpen, &c, &EngineImpl::OnOpenDone};
  if (tmpfile_publish_) {
    c.tmp_anonymous = true;
    c.tmp_path = FanoutDir(c.key);
    op.flags = O_TMPFILE | O_WRONLY | O_CLOEXEC | open_flags_extra_;
  } else {
    c.tmp_anonymous = false;
    c.tmp_path = TempRelPath(c.key);
    op.flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | open_flags_extra_;
  }
  op.resolve = open_resolve_;
  ctx.path = c.tmp_path;
  ctx.deadline_ns = Deadline();
  SetState(c, ChunkState::kCreating);
  SubmitOp(r, std::move(ctx), op);
}

void EngineImpl::SubmitMkdir(Chunk& c, int level) {
  Reactor& r = *c.reactor;
  io::IoOp op;
  op.code = io::OpCode::kMkdirAt;
  op.dirfd = ns_->dirfd();
  op.mode = options_.dir_mode;
  OpCtx ctx{OpRole::kMkdir, &c, &EngineImpl::OnMkdirDone};
  ctx.path = FanoutDir(c.key);  // "ab/cd"
  if (level == 1) ctx.path.resize(2);
  ctx.len = static_cast<uint64_t>(level);
  ctx.deadline_ns = Deadline();
  SetState(c, ChunkState::kMakingDir);
  SubmitOp(r, std::move(ctx), op);
}

namespace {
// The process umask, read without changing it (umask(2) cannot be read atomically from a threaded process).
mode_t ProcessUmask() {
  static const mode_t mask = [] {
    mode_t m = 022;
    if (FILE* f = fopen("/proc/self/status", "re")) {
      char line[256];
      while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Umask:", 6) == 0) m = static_cast<mode_t>(strtoul(line + 6, nullptr, 8));
      }
      fclose(f);
    }
    return m;
  }();
  return mask;
}
}  // namespace

void EngineImpl::OnMkdirDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk& c = *ctx.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res == 0) {
    // mkdir applied the umask; group-shared deployments need the configured mode exactly (K2). Rare: only where
    // the umask strips bits of dir_mode.
    if ((options_.dir_mode & ProcessUmask()) != 0) {
      io::IoOp op;
      op.code = io::OpCode::kFchmod;
      op.dirfd = ns_->dirfd();
      op.mode = options_.dir_mode;
      OpCtx chmod{OpRole::kChmod, &c, &EngineImpl::OnFanoutChmodDone};
      chmod.path = ctx.path;
      chmod.len = ctx.len;
      chmod.deadline_ns = Deadline();
      SubmitOp(r, std::move(chmod), op);
      return;
    }
  } else if (res == -EEXIST) {
    // Another chunk or instance made it; it must be a real directory (a symlink or file there: refuse, K2).
    SubmitStatx(c, &EngineImpl::OnFanoutStatxDone, ctx.path, ctx.len);
    return;
  } else if (res == -ESTALE && c.mkdir_retries < kMkdirRetries) {
    // M1: another client's mkdir of the same directory (or of its parent) can leave this client's handle stale
    // for an instant (GlusterFS, two hosts storing the same keys): look the path up again by asking again.
    c.mkdir_retries++;
    r.fanout_cache.Forget(c.key);
    SubmitMkdir(c, static_cast<int>(ctx.len));
    return;
  } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(c)) {
    return;
  } else if ((res == -ENOENT || res == -ESTALE) && ctx.len == 2 && RetryAfterVanishedDir(c)) {
    return;  // the first level went away behind our back (eviction, gc): created again
  } else {
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "mkdir " + ctx.path));
    return;
  }
  FanoutLevelReady(c, static_cast<int>(ctx.len));
}

void EngineImpl::OnFanoutChmodDone(Reactor&, const OpCtx& ctx, int64_t res) {
  Chunk& c = *ctx.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "chmod " + ctx.path));
    return;
  }
  FanoutLevelReady(c, static_cast<int>(ctx.len));
}

void EngineImpl::OnFanoutStatxDone(Reactor&, const OpCtx& ctx, int64_t res) {
  Chunk& c = *ctx.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {
    // M1: on a distributed filesystem another client's mkdir of the same directory can make ours fail with
    // EEXIST before this client can see it (GlusterFS, two hosts storing the same keys): ask again, a few times.
    if (res == -ENOENT && c.mkdir_retries < kMkdirRetries) {
      c.mkdir_retries++;
      SubmitMkdir(c, static_cast<int>(ctx.len));
      return;
    }
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "stat " + ctx.path));
    return;
  }
  const struct statx& sx = *c.statx_buf;
  if (!S_ISDIR(sx.stx_mode)) {
    FailChunk(c, Status(StatusCode::kFailedPrecondition,
                        "fan-out path " + ctx.path + " exists but is not a directory (symlink or file)"));
    return;
  }
  // K2: a fan-out directory others can write to is refused as the root and the namespace directory are
  // (Namespace::Open checks the first level at open; this is where a second-level one is first met).
  if (!options_.allow_insecure_root) {
    struct stat st {};
    st.st_mode = sx.stx_mode;
    st.st_uid = sx.stx_uid;
    st.st_gid = sx.stx_gid;
    Status trusted = CheckTrustedDirectory(st, "fan-out directory " + ns_->path() + "/" + ctx.path, true);
    if (!trusted.ok()) {
      FailChunk(c, std::move(trusted));
      return;
    }
  }
  FanoutLevelReady(c, static_cast<int>(ctx.len));
}

void EngineImpl::FanoutLevelReady(Chunk& c, int level) {
  if (level == 1) {
    SubmitMkdir(c, 2);
    return;
  }
  c.reactor->fanout_cache.Add(c.key);
  if (c.tmp_anonymous && c.fd >= 0) {
    SubmitLink(c);  // RetryAfterVanishedDir from a link: the temporary is open and written
  } else {
    OpenTemporary(c);
  }
}

bool EngineImpl::RetryAfterVanishedDir(Chunk& c) {
  if (c.dir_retries >= kVanishedDirRetries) return false;
  c.dir_retries++;
  c.reactor->fanout_cache.Forget(c.key);
  SubmitMkdir(c, 1);
  return true;
}

void EngineImpl::SubmitRmdirFanout(Reactor& r, const ChunkKey& key, int level) {
  io::IoOp op;
  op.code = io::OpCode::kUnlinkAt;
  op.dirfd = ns_->dirfd();
  op.flags = AT_REMOVEDIR;
  OpCtx ctx{OpRole::kRmdirFanout, nullptr, &EngineImpl::OnRmdirFanoutDone};
  ctx.errors_are_answers = true;
  ctx.path = FanoutDir(key);
  if (level == 1) ctx.path.resize(2);
  ctx.len = static_cast<uint64_t>(level);
  ctx.key = key;
  SubmitOp(r, std::move(ctx), op);
}

void EngineImpl::StoreWritesDone(Chunk& c) {
  Reactor& r = *c.reactor;
  // M1: an anonymous temporary on a shared root is made durable to the filesystem's other clients before linkat
  // names it (it stays open until then, so its close cannot do it first).
  const bool sync = options_.fsync_on_publish || (shared_root_ && c.tmp_anonymous);
  if (sync && c.state == ChunkState::kTransferring) {
    io::IoOp op;
    op.code = io::OpCode::kFsync;
    op.fd = c.fd;
    OpCtx ctx{OpRole::kFsync, &c, &EngineImpl::OnFsyncDone};
    ctx.deadline_ns = Deadline();
    SetState(c, ChunkState::kSyncing);
    SubmitOp(r, std::move(ctx), op);
    return;
  }
  ReturnJobSlot(c);  // the bytes are in the file: the next resident slot of the job may start
  if (c.tmp_anonymous) {
    SubmitLink(c);
  } else {
    SubmitCloseBeforeLink(c);
  }
}

void EngineImpl::SubmitCloseBeforeLink(Chunk& c) {
  io::IoOp op;
  op.code = io::OpCode::kClose;
  op.fd = c.fd;
  c.fd = -1;  // the close owns it now
  OpCtx ctx{OpRole::kCloseBeforeLink, &c, &EngineImpl::OnCloseBeforeLinkDone};
  ctx.deadline_ns = Deadline();
  SetState(c, ChunkState::kClosing);
  SubmitOp(*c.reactor, std::move(ctx), op);
}

void EngineImpl::OnCloseBeforeLinkDone(Reactor& r, const OpCtx& ctx, int64_t res) {
  Chunk& c = *ctx.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {  // NFS and FUSE report deferred write errors at close: the temporary's bytes are not all there
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "close " + c.tmp_path));
    return;
  }
  SubmitLink(c);
}

void EngineImpl::SubmitLink(Chunk& c) {
  io::IoOp op;
  op.code = io::OpCode::kLinkAt;
  op.dirfd = ns_->dirfd();
  OpCtx ctx{OpRole::kLink, &c, &EngineImpl::OnLinkDone};
  if (c.tmp_anonymous) {
    // The open fd is the file's only name: link it through /proc (AT_SYMLINK_FOLLOW, no privilege needed).
    ctx.path = "/proc/self/fd/" + std::to_string(c.fd);
    op.flags = AT_SYMLINK_FOLLOW;
  } else {
    ctx.path = c.tmp_path;
  }
  ctx.path2 = c.rel_path;
  ctx.deadline_ns = Deadline();
  SetState(c, ChunkState::kLinking);
  SubmitOp(*c.reactor, std::move(ctx), op);
}

int64_t EngineImpl::NegativeTtlNs() const {
  const uint32_t ms = shared_root_ ? std::min(options_.negative_cache_ms, options_.shared_negative_cache_ms)
                                   : options_.negative_cache_ms;
  return static_cast<int64_t>(ms) * 1000000;
}

void EngineImpl::MaybeTouchEntry(const Chunk& c) {
  if (options_.touch_interval_s == 0 || c.opened_mtime_ns == 0) return;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
  if (now_ns - c.opened_mtime_ns < int64_t(options_.touch_interval_s) * 1000000000) return;
  // Both times "now": write permission suffices, as in group-shared deployments (K2). Not following a symlink as
  // the last component; the fan-out directories were checked when created (docs/operations.md, K2). Through the
  // ring's side (no synchronous utimensat on the reactor); OnTouchDone tells the index.
  io::IoOp op;
  op.code = io::OpCode::kUtimensAt;
  op.dirfd = ns_->dirfd();
  OpCtx ctx{OpRole::kTouch, nullptr, &EngineImpl::OnTouchDone};
  ctx.errors_are_answers = true;  // a root mounted read-only or without write permission: no touch, no error
  ctx.path = c.rel_path;
  ctx.key = c.key;
  SubmitOp(*c.reactor, std::move(ctx), op);
}

void EngineImpl::OnTouchDone(Reactor&, const OpCtx& ctx, int64_t res) {
  if (res != 0) return;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);  // at or just after the touch: never ahead of what another host sees
  disk_->SetMtime(ctx.key, int64_t(now.tv_sec) * 1000000000 + now.tv_nsec);
}

bool EngineImpl::YoungOnSharedRoot(const Chunk& c) const {
  if (!shared_root_ || c.opened_mtime_ns == 0) return false;  // only regular files seen at open
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
  // Writers' clocks may run ahead of ours: a future mtime is young too.
  return now_ns - c.opened_mtime_ns < int64_t(options_.temp_max_age_s) * 1000000000;
}

// C2: on ENOSPC evict and retry once; the caller drops the store when this returns false.
bool EngineImpl::RetryStoreAfterEnospc(Chunk& c) {
  // The slot stays resident (not evictable) until the store ends (ResidentSet::Written): a retry rewrites from it.
  if (c.enospc_retried || c.ops_in_flight > 0) return false;
  c.enospc_retried = true;
  EndDataPhase(c);
  if (c.fd >= 0) {
    close(c.fd);
    c.fd = -1;
  }
  if (c.tmp_exists) {
    unlinkat(ns_->dirfd(), c.tmp_path.c_str(), 0);
    c.tmp_exists = false;
  }
  // Synchronously: the retry needs the space now.
  budget_->UnlinkVictims(budget_->TakeForSpace(4 * slot_bytes_));
  OpenTemporary(c);
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// Completion, failure, release

void EngineImpl::FailChunk(Chunk& c, Status status) {
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

void EngineImpl::FinishChunk(Chunk& c) {
  Reactor& r = *c.reactor;
  if (IsFinished(c.state)) return;
  SetState(c, c.status.ok() ? ChunkState::kSucceeded : ChunkState::kFailed);
  Job& job = *c.job;
  if (c.pinned) {
    disk_->Unpin(c.key);
    c.pinned = false;
  }
  if (job.kind == JobKind::kStore) {
    auto it = r.stores_in_flight.find(c.key);
    if (it != r.stores_in_flight.end() && it->second == &c) r.stores_in_flight.erase(it);
    disk_->EndPendingStore(c.key);
    RecordStoreOutcome(c.key, c.status);  // after the publish (or the drop) it reports
  }
  UnplaceChunk(c.key);
  // Last, after every effect of this chunk (index, pending stores): the reactor whose chunk is the job's last one
  // publishes the result; acq_rel makes the other reactors' chunk outcomes visible to it.
  if (job.unfinished.fetch_sub(1, std::memory_order_acq_rel) == 1) PublishJob(job);
}

void EngineImpl::PublishJob(Job& job) {
  const int64_t latency_ns = io::NowNs() - job.start_ns;
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
  // their watched outcomes (RecordStoreOutcome).
}

// Returns the chunk's resources once nothing in flight can touch them any more.
void EngineImpl::Settle(Chunk& c) {
  Reactor& r = *c.reactor;
  if (c.ops_in_flight > 0) return;
  if (c.state != ChunkState::kSucceeded && c.state != ChunkState::kFailed) return;  // progressing, or released
  SetState(c, ChunkState::kReleased);
  if (c.fd >= 0) {
    close(c.fd);
    c.fd = -1;
  }
  if (c.tmp_exists) {
    // After a successful link the temporary is a second name of the entry; after a failure it is garbage.
    io::IoOp op;
    op.code = io::OpCode::kUnlinkAt;
    op.dirfd = ns_->dirfd();
    OpCtx ctx{OpRole::kUnlinkTmp, nullptr, nullptr};  // fire and forget
    ctx.path = c.tmp_path;
    SubmitOp(r, std::move(ctx), op);
    c.tmp_exists = false;
  }
  if (c.job->kind == JobKind::kStore) {
    if (c.usage_reserved) {  // dropped: its bytes never became an entry
      budget_->Release(slot_bytes_);
      c.usage_reserved = false;
    }
    resident_->Written(c.key);  // written or not, the slot's bytes stay valid in the DRAM tier
  } else if (!c.ready) {
    // A failed promotion gives its slot back, now that no read of it is in flight (the kernel may have been
    // writing into it until the last one came back).
    resident_->Loaded(c.key, c.slot, 0, false, io::NowNs());
    pool_->RingEngine();  // a load stream waits for this read (policy/stream_pump.h)
  }
  if (c.counts_committed) {
    c.counts_committed = false;
    r.committed_started--;
  }
  ReturnJobSlot(c);
}

Status EngineImpl::CheckOpenedChunk(int fd, const struct statx& sx) const {
  const mode_t mode = sx.stx_mode;
  if (!S_ISREG(mode)) {
    return Status(StatusCode::kCorrupt,
                  std::string("not a regular file (") +
                      (S_ISDIR(mode)    ? "a directory"
                       : S_ISFIFO(mode) ? "a FIFO"
                                        : "a special file") +
                      ") where a chunk belongs",
                  S_ISDIR(mode) ? EISDIR : 0);
  }
  if (sx.stx_size != slot_bytes_) {
    return Status(StatusCode::kCorrupt, "file has " + std::to_string(sx.stx_size) + " bytes, a chunk has " +
                                            std::to_string(slot_bytes_) +
                                            (sx.stx_size < slot_bytes_ ? " (truncated)" : ""));
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) return Status::FromErrno(errno, "fcntl");
  return Status::Ok();
}

void EngineImpl::QuarantineCorrupt(uint32_t trace_reactor, const ChunkKey& key, const std::string& rel_path,
                                   const Status& why, uint64_t opened_ino) {
  // K1: a bad entry is removed so no reader sees it again; the miss and the counter tell the operator.
  stats_.corrupt_entries.Add(1);
  ForgetEntry(key);
  // Removed by name in its fan-out directory opened without following symlinks (K2): a symlink planted on the path
  // is never followed to delete something outside the root. Synchronous: corrupt entries are rare. A directory is
  // removed only when empty.
  const std::string dir = FanoutDir(key);
  int dfd = -1;
  if (open_resolve_ != 0) {
    open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    how.resolve = open_resolve_;
    dfd = static_cast<int>(syscall(SYS_openat2, ns_->dirfd(), dir.c_str(), &how, sizeof(how)));
  } else {
    const int first = openat(ns_->dirfd(), dir.substr(0, 2).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (first >= 0) {
      dfd = openat(first, dir.substr(3).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      close(first);
    }
  }
  if (dfd >= 0) {
    const std::string name = rel_path.substr(rel_path.rfind('/') + 1);
    struct stat st;
    const bool named = fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    const bool directory = named && S_ISDIR(st.st_mode);
    // M1: the name points at another file than the one that failed (a writer republished it): leave it. (A
    // replacement between this check and the unlink is not excluded; it costs that writer's entry one miss.)
    if (named && opened_ino != 0 && st.st_ino != opened_ino) {
      // nothing to remove
    } else if (unlinkat(dfd, name.c_str(), directory ? AT_REMOVEDIR : 0) != 0) {
      if (errno != ENOENT && errno != ENOTEMPTY) stats_.io_errors.Add(1);
    } else if (named && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == slot_bytes_) {
      // C1, M2: a file of a chunk's size was counted in the usage when it was linked; it leaves it now. (A file of
      // another size never was one of ours: a lookup requires the exact size; gc reconciles anything else.)
      budget_->Add(-static_cast<int64_t>(slot_bytes_));
    }
    close(dfd);
    PruneFanoutDir(ns_->dirfd(), dir);  // C1
  }
  if (trace_ && trace_->enabled()) {
    trace_->Instant("corrupt_entry", "integrity", io::NowNs(), reactors_[trace_reactor]->trace_tid);
  }
}

void EngineImpl::ForgetEntry(const ChunkKey& key) { disk_->Forget(key); }

void EngineImpl::SetState(Chunk& c, ChunkState to) {
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

const char* EngineImpl::OpRoleName(OpRole r) {
  switch (r) {
    case OpRole::kOpen: return "open";
    case OpRole::kRead: return "read";
    case OpRole::kWrite: return "write";
    case OpRole::kFsync: return "fsync";
    case OpRole::kClose:
    case OpRole::kCloseBeforeLink: return "close";
    case OpRole::kLink: return "link";
    case OpRole::kUnlinkTmp:
    case OpRole::kUnlinkEvicted: return "unlink";
    case OpRole::kMkdir: return "mkdir";
    case OpRole::kRmdirFanout: return "rmdir";
    case OpRole::kStatx: return "statx";
    case OpRole::kChmod: return "chmod";
    case OpRole::kTouch: return "touch";
  }
  return "op";
}

}  // namespace kvtier
