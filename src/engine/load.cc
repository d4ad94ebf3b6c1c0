// The load state machine (a promotion into the slot the DRAM tier granted; states: src/engine/chunk_state.h, data
// flow: docs/architecture.md, "Data flow"): open (OnOpenDone, reactor.cc) -> statx: a regular file of exactly a
// chunk's size -> a place at the disk -> the header and the blocks in pieces (FillPieces, reactor.cc) -> each piece
// verified as it lands -> the slot ready (resident) -> released (Settle). A bad entry is removed (K1) unless it may be
// another host's publication not visible yet (M1) or keyed for another secret (K3); a verified load of an old entry
// touches it (M3). Runs on the chunk's reactor; what only a load keeps is its chunk's LoadState (reactor.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/reactor.h"
#include "layout/chunk_path.h"

namespace kvtier {

void Reactor::OnStatxDone(const Op& op, const NoArgs&, int64_t res) {
  Chunk* c = op.chunk;
  if (c->state == ChunkState::kFailed) return;
  LoadState& l = c->load();
  const struct statx& sx = *c->statx_buf;
  Status shape = res < 0 ? Status::FromErrno(static_cast<int>(-res), "statx") : CheckOpenedChunk(c->fd, sx);
  if (res >= 0) {
    l.opened_ino = sx.stx_ino;
    l.opened_mtime_ns = S_ISREG(sx.stx_mode) ? int64_t(sx.stx_mtime.tv_sec) * 1000000000 + sx.stx_mtime.tv_nsec : 0;
  }
  if (!shape.ok()) {
    if (shape.code() != StatusCode::kCorrupt) {
      // statx itself failed (EIO, ESTALE): the filesystem did not answer, which says nothing about the entry
    } else if (YoungOnSharedRoot(*c)) {
      ForgetEntry(c->key);  // M1: maybe another host's entry whose data is not visible here yet
    } else {
      QuarantineCorrupt(*c);
    }
    FailChunk(*c, shape.WithContext(c->rel_path));
    return;
  }
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(data_queue_, c);
}

Status Reactor::CheckOpenedChunk(int fd, const struct statx& sx) const {
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
  if (sx.stx_size != files_.slot_bytes) {
    return Status(StatusCode::kCorrupt, "file has " + std::to_string(sx.stx_size) + " bytes, a chunk has " +
                                            std::to_string(files_.slot_bytes) +
                                            (sx.stx_size < files_.slot_bytes ? " (truncated)" : ""));
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) return Status::FromErrno(errno, "fcntl");
  return Status::Ok();
}

bool Reactor::StartLoadChunk(Part&, Chunk& c) {
  c.started_ns = NowNs();
  if (c.admitted == 0) c.admitted = next_admission_++;
  c.load().pin = disk_->Pin(c.key);
  c.load().slot_gen = pool_->BeginFill(c.slot);

  IoOp io;
  io.code = OpCode::kOpenAt;
  io.dirfd = ns_->dirfd();
  // K2: no symlink anywhere on the path and nothing outside the namespace (openat2; O_NOFOLLOW where the kernel
  // lacks it). O_NONBLOCK: a FIFO planted under a chunk's name must not block the open (it is cleared again once
  // statx has shown a regular file, since io_uring would return EAGAIN for reads of a non-blocking file).
  io.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | files_.open_flags;
  io.resolve = files_.open_resolve;
  SetState(c, ChunkState::kOpening);
  Submit<&Reactor::OnOpenDone>(Op{.role = OpRole::kOpen, .chunk = &c, .deadline_ns = Deadline()}, Named{c.rel_path},
                               io);
  return true;
}

void Reactor::OnReadDone(const Op& op, const Transfer& t, int64_t res) {
  Chunk* c = op.chunk;
  TraceTransfer(op, res, "read");
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "read " + c->rel_path));
  } else if (res == 0) {
    if (YoungOnSharedRoot(*c)) {
      ForgetEntry(c->key);  // M1: see YoungOnSharedRoot
    } else {
      QuarantineCorrupt(*c);  // shorter than its header says
    }
    FailChunk(*c, Status(StatusCode::kCorrupt, "truncated chunk file " + c->rel_path));
  } else {
    stats_.bytes_read.Add(static_cast<uint64_t>(res));
    if (static_cast<uint64_t>(res) < t.len) {  // short read: continue where it stopped, same piece
      Transfer rest = t;
      rest.buf += res;
      rest.len -= res;
      rest.offset += res;
      SubmitRead(*c, rest);
      return;
    }
    c->load().pieces_at_disk--;
    PieceLanded(*c, t);  // the next pieces are asked for by FillPieces, after this round of completions
    if (c->state == ChunkState::kFailed) return;
    if (c->ops_in_flight == 0 && !PiecesToAsk(*c)) {
      // The disk is done with this chunk: its place goes to the next opened chunk, whose read the reactor
      // submits before verifying this one's last piece (VerifyReadChunks), so the disk never waits for
      // checksums (the raw baseline re-arms a finished slot at once too).
      EndDataPhase(*c);
      SetState(*c, ChunkState::kVerifying);
      read_done_.push_back(c);
    }
  }
}

void Reactor::VerifyReadChunks() {
  if (read_done_.empty()) return;
  std::vector<Chunk*> done;
  done.swap(read_done_);
  for (Chunk* c : done) {
    if (c->state == ChunkState::kVerifying && c->ops_in_flight == 0) LoadReadsDone(*c);
    Settle(*c);
  }
}

void Reactor::SubmitNextPiece(Chunk& c) {
  LoadState& l = c.load();
  const uint32_t n = std::min(l.piece_blocks, l.num_blocks - l.next_piece);
  uint8_t* base = pool_->SlotData(c.slot);
  SubmitRead(c, Transfer{.buf = base + kHeaderBytes + uint64_t(l.next_piece) * files_.block_stride,
                         .len = uint64_t(n) * files_.block_stride,
                         .offset = BlockRangeOffset(files_.block_stride, l.first_block + l.next_piece),
                         .piece_first = l.next_piece,
                         .piece_blocks = n});
  l.next_piece += n;
  l.pieces_at_disk++;
}

void Reactor::PieceLanded(Chunk& c, const Transfer& piece) {
  LoadState& l = c.load();
  if (piece.with_header) {
    const ChunkGeometry geometry = ns_->geometry();
    auto header = DecodeHeader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, files_.checksum_key.get());
    if (!header.ok()) {
      FailVerification(c, header.status());
      return;
    }
    l.header = std::make_unique<ChunkHeader>(*header);
  }
  if (piece.piece_blocks > 0) l.landed_unverified.emplace_back(piece.piece_first, piece.piece_blocks);
  // K1: while more of the chunk is still at the disk or to be asked for, a landed piece is checked now, its bytes
  // still in the cache; the last one waits for LoadReadsDone, after the disk has the next chunk's reads.
  const bool more = l.next_piece < l.num_blocks || l.pieces_at_disk > 0;
  if (!more || !l.header) return;
  for (const auto& [first, n] : l.landed_unverified) {
    Status v = VerifyPiece(c, first, n);
    if (!v.ok()) {
      FailVerification(c, v);
      return;
    }
  }
  l.landed_unverified.clear();
}

Status Reactor::VerifyPiece(Chunk& c, uint32_t first, uint32_t n) {
  LoadState& l = c.load();
  const uint8_t* data = pool_->SlotData(c.slot) + kHeaderBytes + uint64_t(first) * files_.block_stride;
  Status v = VerifyBlocks(*l.header, l.first_block + first, n, data, files_.checksum_key.get());
  if (v.ok()) {
    for (uint32_t j = first; j < first + n && j < l.verified.size(); ++j) l.verified[j] = true;
  }
  return v;
}

bool Reactor::OtherSecret(const Chunk& c) const {
  if (c.load().header || !ns_->checksum_key_record().empty()) return false;
  const ChunkGeometry geometry = ns_->geometry();
  return KeyedForAnotherReader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, files_.checksum_key.get());
}

void Reactor::FailVerification(Chunk& c, const Status& verdict) {
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
    QuarantineCorrupt(c);
  }
  FailChunk(c, verdict.WithContext(c.rel_path));
}

void Reactor::LoadReadsDone(Chunk& c) {
  LoadState& l = c.load();
  SubmitClose(c.fd);
  c.fd = -1;
  Status verdict;
  if (!l.header) {  // not decoded as it landed (PieceLanded always does; kept for any path that did not)
    const ChunkGeometry geometry = ns_->geometry();
    auto header = DecodeHeader(std::span<const uint8_t>(pool_->SlotData(c.slot), kHeaderBytes), ns_->fingerprint(),
                               c.key, &geometry, files_.checksum_key.get());
    verdict = header.status();
    if (verdict.ok()) l.header = std::make_unique<ChunkHeader>(*header);
  }
  if (l.verified.size() != l.num_blocks) l.verified.assign(l.num_blocks, false);
  // K1: the blocks not checked as their pieces landed (the last piece; every block with one read per chunk).
  for (uint32_t j = 0; verdict.ok() && j < l.num_blocks;) {
    if (l.verified[j]) {
      ++j;
      continue;
    }
    uint32_t k = j;
    while (k < l.num_blocks && !l.verified[k]) ++k;
    verdict = VerifyPiece(c, j, k - j);
    j = k;
  }
  if (!verdict.ok()) {
    FailVerification(c, verdict);
    return;
  }
  if (trace_ && trace_->enabled()) {
    trace_->Complete("load_read", "load", c.started_ns, NowNs() - c.started_ns, trace_tid_,
                     {{"blocks", l.num_blocks}, {"job", c.job->id}});
  }
  MaybeTouchEntry(c);
  pool_->PublishReady(c.slot, l.slot_gen);
  resident_->Loaded(c.key, c.slot, l.slot_gen, true, NowNs());
  pool_->RingEngine();  // a load stream waits for this read (policy/stream_pump.h)
  c.job->bytes += uint64_t(l.num_blocks) * options_.identity.block_bytes;
  FinishChunk(c);  // VerifyReadChunks settles it
}

void Reactor::MaybeTouchEntry(const Chunk& c) {
  if (options_.touch_interval_s == 0 || c.load().opened_mtime_ns == 0) return;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
  if (now_ns - c.load().opened_mtime_ns < int64_t(options_.touch_interval_s) * 1000000000) return;
  // Both times "now": write permission suffices, as in group-shared deployments (K2). Not following a symlink as
  // the last component; the fan-out directories were checked when created (docs/operations.md, K2). Through the
  // ring's side (no synchronous utimensat on the reactor); OnTouchDone tells the index.
  IoOp io;
  io.code = OpCode::kUtimensAt;
  io.dirfd = ns_->dirfd();
  // errors_are_answers: a root mounted read-only or without write permission: no touch, no error.
  Submit<&Reactor::OnTouchDone>(Op{.role = OpRole::kTouch, .errors_are_answers = true}, EntryOp{c.key, c.rel_path}, io);
}

void Reactor::OnTouchDone(const Op&, const EntryOp& entry, int64_t res) {
  if (res != 0) return;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);  // at or just after the touch: never ahead of what another host sees
  disk_->SetMtime(entry.key, int64_t(now.tv_sec) * 1000000000 + now.tv_nsec);
}

bool Reactor::YoungOnSharedRoot(const Chunk& c) const {
  if (!files_.shared_root || c.load().opened_mtime_ns == 0) return false;  // only regular files seen at open
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
  // Writers' clocks may run ahead of ours: a future mtime is young too.
  return now_ns - c.load().opened_mtime_ns < int64_t(options_.temp_max_age_s) * 1000000000;
}

void Reactor::QuarantineCorrupt(Chunk& c) {
  LoadState& l = c.load();
  if (l.quarantine) return;  // one removal per load
  // K1: a bad entry is removed so no reader sees it again; the miss and the counter tell the operator.
  stats_.corrupt_entries.Add(1);
  ForgetEntry(c.key);
  if (trace_ && trace_->enabled()) trace_->Instant("corrupt_entry", "integrity", NowNs(), trace_tid_);
  l.quarantine = std::make_unique<Quarantine>();
  l.quarantine->name = c.rel_path.substr(c.rel_path.rfind('/') + 1);
  SubmitQuarantineOpen(c, files_.open_resolve != 0 ? 2 : 1);
}

void Reactor::SubmitQuarantineOpen(Chunk& c, int level) {
  // K2: a symlink planted on the path is never followed to delete something outside the root: the fan-out
  // directory is opened with openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or one level at a time with O_NOFOLLOW.
  const std::string dir = FanoutDir(c.key);
  IoOp io;
  io.code = OpCode::kOpenAt;
  io.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  FanoutDirOp args{.level = level, .key = c.key};
  if (files_.open_resolve != 0) {
    io.dirfd = ns_->dirfd();
    io.resolve = files_.open_resolve;
    args.path = dir;
  } else {
    io.flags |= O_NOFOLLOW;
    io.dirfd = level == 1 ? ns_->dirfd() : c.load().quarantine->first_fd;
    args.path = level == 1 ? dir.substr(0, 2) : dir.substr(3);
  }
  Submit<&Reactor::OnQuarantineDirOpen>(Op{.role = OpRole::kOpen, .chunk = &c, .deadline_ns = Deadline()},
                                        std::move(args), io);
}

void Reactor::OnQuarantineDirOpen(const Op& op, const FanoutDirOp& dir, int64_t res) {
  Chunk& c = *op.chunk;
  Quarantine& q = *c.load().quarantine;
  if (res < 0) {  // gone (ENOENT), not a directory, or the filesystem did not answer: nothing removed
    EndQuarantine(c, false);
    return;
  }
  if (dir.level == 1) {
    q.first_fd = static_cast<int>(res);
    SubmitQuarantineOpen(c, 2);
    return;
  }
  q.dirfd = static_cast<int>(res);
  IoOp io;
  io.code = OpCode::kStatx;
  io.dirfd = q.dirfd;
  io.buf = &q.sx;
  io.len = sizeof(q.sx);
  Submit<&Reactor::OnQuarantineStatx>(Op{.role = OpRole::kStatx, .chunk = &c, .deadline_ns = Deadline()}, Named{q.name},
                                      io);
}

void Reactor::OnQuarantineStatx(const Op& op, const Named& entry, int64_t res) {
  Chunk& c = *op.chunk;
  Quarantine& q = *c.load().quarantine;
  // M1: unknown (statx failed), or the name points at another file than the one that failed (a writer republished
  // it): leave it. (A replacement between this check and the unlink is not excluded; it costs that writer's entry
  // one miss.)
  if (res < 0 || (c.load().opened_ino != 0 && q.sx.stx_ino != c.load().opened_ino)) {
    EndQuarantine(c, res == -ENOENT);
    return;
  }
  IoOp io;
  io.code = OpCode::kUnlinkAt;
  io.dirfd = q.dirfd;
  io.flags = S_ISDIR(q.sx.stx_mode) ? AT_REMOVEDIR : 0;
  Submit<&Reactor::OnQuarantineUnlink>(Op{.role = OpRole::kUnlinkCorrupt,
                                          .chunk = &c,
                                          .deadline_ns = Deadline(),
                                          // ENOTEMPTY: a directory with something in it stays
                                          .errors_are_answers = S_ISDIR(q.sx.stx_mode) != 0},
                                       Named{entry.path}, io);
}

void Reactor::OnQuarantineUnlink(const Op& op, const Named&, int64_t res) {
  Chunk& c = *op.chunk;
  const struct statx& sx = c.load().quarantine->sx;
  if (res < 0 && op.errors_are_answers && res != -ENOENT && res != -ENOTEMPTY && !op.late) {
    // A directory's other failures (a file's are counted by OnCompletion).
    (res == -ETIMEDOUT || res == -ECANCELED ? stats_.timeouts : stats_.io_errors).Add(1);
  } else if (res == 0 && S_ISREG(sx.stx_mode) && sx.stx_size == files_.slot_bytes) {
    // C1, M2: a file of a chunk's size was counted in the usage when it was linked; it leaves it now. (A file of
    // another size never was one of ours: a lookup requires the exact size; gc reconciles anything else.)
    budget_->Add(-static_cast<int64_t>(files_.slot_bytes));
  }
  EndQuarantine(c, res == 0 || res == -ENOENT);
}

void Reactor::EndQuarantine(Chunk& c, bool prune) {
  Quarantine& q = *c.load().quarantine;
  SubmitClose(q.first_fd);
  SubmitClose(q.dirfd);
  q.first_fd = q.dirfd = -1;
  if (prune) SubmitRmdirFanout(c.key, 2, &c);  // C1
}

void Reactor::ForgetEntry(const ChunkKey& key) { disk_->Forget(key); }

}  // namespace kvtier
