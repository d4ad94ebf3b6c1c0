// The committed-store state machine (states: src/engine/chunk_state.h, data flow: docs/architecture.md, "Data
// flow"): header and checksums over the filled slot -> the fan-out directories (mkdir, checked or chmod'ed, K2) ->
// a temporary (O_TMPFILE, or named) -> a place at the disk -> write -> [fsync] -> [close before link, M1] -> link ->
// the index (and eviction above the high watermark) -> released (the slot stays resident). ENOSPC evicts and
// retries once (C2); a fan-out directory that vanished is made again (C1, M1). Runs on the chunk's reactor; what
// only a store keeps is its chunk's StoreState (reactor.h).
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/reactor.h"
#include "layout/chunk_path.h"

namespace kvtier {

bool Reactor::StartStoreChunk(Part& part, Chunk& c) {
  c.started_ns = NowNs();
  if (c.admitted == 0) c.admitted = next_admission_++;
  if (disk_->Contains(c.key) || stores_in_flight_.count(c.key)) {
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
  if (committed_started_ >= 2 * depth_) return false;
  if (!TakeJobSlot(part)) return false;
  c.store().counts_job_slot = true;
  c.store().counts_committed = true;
  committed_started_++;
  stores_in_flight_[c.key] = &c;
  BeginStoreWrite(c);
  return true;
}

void Reactor::BeginStoreWrite(Chunk& c) {
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
  if (files_.block_stride > bb) {  // deterministic padding between blocks
    for (uint32_t b = 0; b < bpc; ++b) {
      std::memset(base + kHeaderBytes + uint64_t(b) * files_.block_stride + bb, 0, files_.block_stride - bb);
    }
  }
  if (Status fs = FillPayloadFields(&h, base + kHeaderBytes, files_.checksum_key.get()); !fs.ok()) {
    FailChunk(c, fs);
    return;
  }
  Status s = EncodeHeader(h, std::span<uint8_t>(base, kHeaderBytes), files_.checksum_key.get());
  if (!s.ok()) {
    FailChunk(c, s);
    return;
  }
  if (budget_->shared() && budget_->has_budget() && !c.store().usage_reserved) {
    budget_->Reserve(files_.slot_bytes);
    c.store().usage_reserved = true;
    EvictAboveHighWatermark();
  }
  OpenTemporary(c);
}

void Reactor::OpenTemporary(Chunk& c) {
  StoreState& s = c.store();
  if (!fanout_cache_.Has(c.key)) {
    SubmitMkdir(c, fanout_cache_.HasFirstLevel(c.key.data()[0]) ? 2 : 1);
    return;
  }
  IoOp io;
  io.code = OpCode::kOpenAt;
  io.dirfd = ns_->dirfd();
  io.mode = files_.file_mode;
  if (files_.tmpfile_publish) {
    s.tmp_anonymous = true;
    s.tmp_path = FanoutDir(c.key);
    io.flags = O_TMPFILE | O_WRONLY | O_CLOEXEC | files_.open_flags;
  } else {
    s.tmp_anonymous = false;
    s.tmp_path = TempRelPath(c.key);
    io.flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | files_.open_flags;
  }
  io.resolve = files_.open_resolve;
  SetState(c, ChunkState::kCreating);
  Submit<&Reactor::OnOpenDone>(Op{.role = OpRole::kOpen, .chunk = &c, .deadline_ns = Deadline()}, Named{s.tmp_path},
                               io);
}

void Reactor::SubmitMkdir(Chunk& c, int level) {
  IoOp io;
  io.code = OpCode::kMkdirAt;
  io.dirfd = ns_->dirfd();
  io.mode = options_.dir_mode;
  FanoutDirOp dir{.path = FanoutDir(c.key), .level = level, .key = c.key};  // "ab/cd"
  if (level == 1) dir.path.resize(2);
  SetState(c, ChunkState::kMakingDir);
  Submit<&Reactor::OnMkdirDone>(Op{.role = OpRole::kMkdir, .chunk = &c, .deadline_ns = Deadline()}, std::move(dir), io);
}

void Reactor::OnMkdirDone(const Op& op, const FanoutDirOp& dir, int64_t res) {
  Chunk& c = *op.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res == 0) {
    // mkdir applied the umask; group-shared deployments need the configured mode exactly (K2). Rare: only where
    // the umask strips bits of dir_mode.
    if (files_.chmod_dirs) {
      IoOp io;
      io.code = OpCode::kFchmod;
      io.dirfd = ns_->dirfd();
      io.flags = O_DIRECTORY;  // K2: whatever replaced the new directory meanwhile is refused, not chmod'ed
      io.mode = options_.dir_mode;
      Submit<&Reactor::OnFanoutChmodDone>(Op{.role = OpRole::kChmod, .chunk = &c, .deadline_ns = Deadline()}, dir, io);
      return;
    }
  } else if (res == -EEXIST) {
    // Another chunk or instance made it; it must be a real directory (a symlink or file there: refuse, K2).
    SubmitStatx<&Reactor::OnFanoutStatxDone>(c, dir);
    return;
  } else if (res == -ESTALE && c.store().mkdir_retries < kMkdirRetries) {
    // M1: another client's mkdir of the same directory (or of its parent) can leave this client's handle stale
    // for an instant (GlusterFS, two hosts storing the same keys): look the path up again by asking again.
    c.store().mkdir_retries++;
    fanout_cache_.Forget(c.key);
    SubmitMkdir(c, dir.level);
    return;
  } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(c)) {
    return;
  } else if ((res == -ENOENT || res == -ESTALE) && dir.level == 2 && RetryAfterVanishedDir(c)) {
    return;  // the first level went away behind our back (eviction, gc): created again
  } else {
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "mkdir " + dir.path));
    return;
  }
  FanoutLevelReady(c, dir.level);
}

void Reactor::OnFanoutChmodDone(const Op& op, const FanoutDirOp& dir, int64_t res) {
  Chunk& c = *op.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "chmod " + dir.path));
    return;
  }
  FanoutLevelReady(c, dir.level);
}

void Reactor::OnFanoutStatxDone(const Op& op, const FanoutDirOp& dir, int64_t res) {
  Chunk& c = *op.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {
    // M1: on a distributed filesystem another client's mkdir of the same directory can make ours fail with
    // EEXIST before this client can see it (GlusterFS, two hosts storing the same keys): ask again, a few times.
    if (res == -ENOENT && c.store().mkdir_retries < kMkdirRetries) {
      c.store().mkdir_retries++;
      SubmitMkdir(c, dir.level);
      return;
    }
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "stat " + dir.path));
    return;
  }
  const struct statx& sx = *c.statx_buf;
  if (!S_ISDIR(sx.stx_mode)) {
    FailChunk(c, Status(StatusCode::kFailedPrecondition,
                        "fan-out path " + dir.path + " exists but is not a directory (symlink or file)"));
    return;
  }
  // K2: a fan-out directory others can write to is refused as the root and the namespace directory are
  // (Namespace::Open checks the first level at open; this is where a second-level one is first met).
  if (!options_.allow_insecure_root) {
    Status trusted = CheckTrustedDirectory(sx.stx_mode, sx.stx_uid, sx.stx_gid,
                                           "fan-out directory " + ns_->path() + "/" + dir.path, true);
    if (!trusted.ok()) {
      FailChunk(c, std::move(trusted));
      return;
    }
  }
  FanoutLevelReady(c, dir.level);
}

void Reactor::FanoutLevelReady(Chunk& c, int level) {
  if (level == 1) {
    SubmitMkdir(c, 2);
    return;
  }
  fanout_cache_.Add(c.key);
  if (c.store().tmp_anonymous && c.fd >= 0) {
    SubmitLink(c);  // RetryAfterVanishedDir from a link: the temporary is open and written
  } else {
    OpenTemporary(c);
  }
}

bool Reactor::RetryAfterVanishedDir(Chunk& c) {
  if (c.store().dir_retries >= kVanishedDirRetries) return false;
  c.store().dir_retries++;
  fanout_cache_.Forget(c.key);
  SubmitMkdir(c, 1);
  return true;
}

void Reactor::OnTemporaryChmodDone(const Op& op, const NoArgs&, int64_t res) {
  Chunk* c = op.chunk;
  if (c->state == ChunkState::kFailed) return;
  // A failed chmod is counted (an I/O error) and the store goes on: the entry is published with the umask's mode.
  static_cast<void>(res);
  SetState(*c, ChunkState::kWaitingForDisk);
  InsertByAdmission(data_queue_, c);
}

void Reactor::OnWriteDone(const Op& op, const Transfer& t, int64_t res) {
  Chunk* c = op.chunk;
  TraceTransfer(op, res, "write");
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) return;
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "write " + c->store().tmp_path));
  } else if (res == 0) {
    FailChunk(*c, Status(StatusCode::kIoError, "write made no progress on " + c->store().tmp_path));
  } else {
    stats_.bytes_written.Add(static_cast<uint64_t>(res));
    if (t.offset + res < files_.slot_bytes) {  // the next piece, or the rest of a short write
      SubmitWritePiece(*c, t.offset + res);
    } else if (c->ops_in_flight == 0) {
      StoreWritesDone(*c);
    }
  }
}

void Reactor::StoreWritesDone(Chunk& c) {
  // M1: an anonymous temporary on a shared root is made durable to the filesystem's other clients before linkat
  // names it (it stays open until then, so its close cannot do it first).
  const bool sync = options_.fsync_on_publish || (files_.shared_root && c.store().tmp_anonymous);
  if (sync && c.state == ChunkState::kTransferring) {
    IoOp io;
    io.code = OpCode::kFsync;
    io.fd = c.fd;
    SetState(c, ChunkState::kSyncing);
    Submit<&Reactor::OnFsyncDone>(Op{.role = OpRole::kFsync, .chunk = &c, .deadline_ns = Deadline()}, NoArgs{}, io);
    return;
  }
  ReturnJobSlot(c);  // the bytes are in the file: the next resident slot of the job may start
  if (c.store().tmp_anonymous) {
    SubmitLink(c);
  } else {
    SubmitCloseBeforeLink(c);
  }
}

void Reactor::OnFsyncDone(const Op& op, const NoArgs&, int64_t res) {
  Chunk* c = op.chunk;
  if (c->state == ChunkState::kFailed) return;
  if (res < 0) {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "fsync " + c->store().tmp_path));
  } else {
    StoreWritesDone(*c);
  }
}

void Reactor::SubmitCloseBeforeLink(Chunk& c) {
  IoOp io;
  io.code = OpCode::kClose;
  io.fd = c.fd;
  c.fd = -1;  // the close owns it now
  SetState(c, ChunkState::kClosing);
  Submit<&Reactor::OnCloseBeforeLinkDone>(Op{.role = OpRole::kCloseBeforeLink, .chunk = &c, .deadline_ns = Deadline()},
                                          NoArgs{}, io);
}

void Reactor::OnCloseBeforeLinkDone(const Op& op, const NoArgs&, int64_t res) {
  Chunk& c = *op.chunk;
  if (c.state == ChunkState::kFailed) return;
  if (res < 0) {  // NFS and FUSE report deferred write errors at close: the temporary's bytes are not all there
    FailChunk(c, Status::FromErrno(static_cast<int>(-res), "close " + c.store().tmp_path));
    return;
  }
  SubmitLink(c);
}

void Reactor::SubmitLink(Chunk& c) {
  IoOp io;
  io.code = OpCode::kLinkAt;
  io.dirfd = ns_->dirfd();
  LinkNames names{.to = c.rel_path};
  if (c.store().tmp_anonymous) {
    // The open fd is the file's only name: link it through /proc (AT_SYMLINK_FOLLOW, no privilege needed).
    names.from = "/proc/self/fd/" + std::to_string(c.fd);
    io.flags = AT_SYMLINK_FOLLOW;
  } else {
    names.from = c.store().tmp_path;
  }
  SetState(c, ChunkState::kLinking);
  Submit<&Reactor::OnLinkDone>(Op{.role = OpRole::kLink, .chunk = &c, .deadline_ns = Deadline()}, std::move(names), io);
}

void Reactor::OnLinkDone(const Op& op, const LinkNames&, int64_t res) {
  Chunk* c = op.chunk;
  StoreState& s = c->store();
  if (c->state == ChunkState::kFailed) {
    // I4: the link came back after its deadline had failed the chunk, and made the entry all the same: it is on
    // disk, so it is counted and indexed (C1, M2), or the shared usage would miss its bytes until a gc.
    if (res == 0) {
      const bool reserved = s.usage_reserved;
      if (reserved) budget_->CommitReserved(files_.slot_bytes);
      s.usage_reserved = false;
      PublishIndexed(c->key, files_.slot_bytes, /*linked=*/!reserved);
    }
    return;
  }
  if (res == 0 || res == -EEXIST) {
    // EEXIST: another writer published the same key first; its bytes are equally valid (L4).
    if (res == -EEXIST) stats_.stores_deduplicated.Add(1);
    if (res != 0 && s.usage_reserved) budget_->Release(files_.slot_bytes);  // not ours
    if (res == 0 && s.usage_reserved) budget_->CommitReserved(files_.slot_bytes);
    PublishIndexed(c->key, kHeaderBytes + uint64_t(options_.identity.blocks_per_chunk) * files_.block_stride,
                   /*linked=*/res == 0 && !s.usage_reserved);
    s.usage_reserved = false;
    c->job->bytes += files_.slot_bytes;
    if (c->fd >= 0) {  // an anonymous temporary's fd, kept open for linkat
      SubmitClose(c->fd);
      c->fd = -1;
    }
    FinishChunk(*c);  // Settle() removes a named temporary
  } else if ((res == -ENOSPC || res == -EDQUOT) && RetryStoreAfterEnospc(*c)) {
    // retried
  } else if ((res == -ENOENT || res == -ESTALE) && s.tmp_anonymous && c->fd >= 0 && RetryAfterVanishedDir(*c)) {
    // the final name's directory went away while the anonymous temporary was written: created again, then
    // linked (OnMkdirDone)
  } else {
    FailChunk(*c, Status::FromErrno(static_cast<int>(-res), "link " + c->rel_path));
  }
}

// C2: on ENOSPC evict and retry once; the caller (a completion handler: OnCompletion settles the chunk after it)
// drops the store when this returns false.
bool Reactor::RetryStoreAfterEnospc(Chunk& c) {
  StoreState& s = c.store();
  // The slot stays resident (not evictable) until the store ends (ResidentSet::Written): a retry rewrites from it.
  if (s.enospc_retried || c.ops_in_flight > 0) return false;
  s.enospc_retried = true;
  EndDataPhase(c);
  // The temporary is closed and then unlinked, and the victims (room for a few chunks) unlinked, through the ring
  // as the chunk's own ops; the next temporary is opened once the last of them is back (EnospcRemovalBack). Held
  // while they are submitted: one refused at submission completes at once, before the others are out.
  c.ops_in_flight++;
  if (c.fd >= 0) {
    IoOp io;
    io.code = OpCode::kClose;
    io.fd = c.fd;
    // A named temporary is unlinked once closed (NFS, FUSE: never while open).
    Submit<&Reactor::OnEnospcCloseDone>(Op{.role = OpRole::kClose, .chunk = &c, .deadline_ns = Deadline()},
                                        ThenUnlink{s.tmp_exists ? s.tmp_path : std::string()}, io);
    c.fd = -1;
  } else if (s.tmp_exists) {
    SubmitEnospcTmpUnlink(c, s.tmp_path);
  }
  s.tmp_exists = false;
  for (const DiskBudget::Victim& v : budget_->TakeForSpace(4 * files_.slot_bytes)) {
    Submit<&Reactor::OnEnospcVictimUnlinkDone>(
        Op{.role = OpRole::kUnlinkEvicted, .chunk = &c, .deadline_ns = Deadline()},
        EntryOp{v.key, ChunkRelPath(v.key), v.bytes}, UnlinkAt());
  }
  c.ops_in_flight--;
  if (c.ops_in_flight == 0 && c.state != ChunkState::kFailed) OpenTemporary(c);  // nothing in flight: at once
  return true;
}

void Reactor::OnEnospcCloseDone(const Op& op, const ThenUnlink& then, int64_t) {
  if (!then.tmp.empty()) {
    // The temporary's unlink, now that it is closed: the chunk's op, or on its own once the chunk has failed.
    if (op.chunk->state == ChunkState::kFailed) {
      SubmitUnlinkTemporary(then.tmp);
    } else {
      SubmitEnospcTmpUnlink(*op.chunk, then.tmp);
    }
  }
  EnospcRemovalBack(*op.chunk);
}

void Reactor::SubmitEnospcTmpUnlink(Chunk& c, std::string path) {
  Submit<&Reactor::OnEnospcTmpUnlinkDone>(Op{.role = OpRole::kUnlinkTmp, .chunk = &c, .deadline_ns = Deadline()},
                                          Named{std::move(path)}, UnlinkAt());
}

void Reactor::OnEnospcTmpUnlinkDone(const Op& op, const Named& tmp, int64_t res) {
  if (res < 0 && res != -ENOENT) SubmitUnlinkTemporary(tmp.path);  // failed or late: asked again on its own
  EnospcRemovalBack(*op.chunk);
}

void Reactor::OnEnospcVictimUnlinkDone(const Op& op, const EntryOp& victim, int64_t res) {
  OnUnlinkEvictedDone(op, victim, res);  // the budget's books (a failed unlink puts the entry back), the fan-out dirs
  EnospcRemovalBack(*op.chunk);
}

void Reactor::EnospcRemovalBack(Chunk& c) {
  if (c.state == ChunkState::kFailed || c.ops_in_flight > 0) return;
  OpenTemporary(c);  // the last of them is back: the retry (a failed unlink only leaves less room)
}

void Reactor::PublishIndexed(const ChunkKey& key, uint64_t bytes, bool linked) {
  if (linked) budget_->Add(static_cast<int64_t>(bytes));
  // M3: our own publication; its mtime is about now (a touch by another host comes later than that).
  disk_->Publish(
      key, bytes,
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  EvictAboveHighWatermark();
}

void Reactor::EvictAboveHighWatermark() {
  // On the reactor: unlink through its I/O engine so eviction never stalls other I/O; OnUnlinkEvictedDone reports
  // each to the budget.
  for (const DiskBudget::Victim& v : budget_->TakeAboveHighWatermark()) {
    // v.bytes: subtracted from the shared usage when this unlink removes the file.
    Submit<&Reactor::OnUnlinkEvictedDone>(Op{.role = OpRole::kUnlinkEvicted},
                                          EntryOp{v.key, ChunkRelPath(v.key), v.bytes}, UnlinkAt());
  }
}

void Reactor::OnUnlinkEvictedDone(const Op&, const EntryOp& victim, int64_t res) {
  if (res == 0 || res == -ENOENT) SubmitRmdirFanout(victim.key, 2);
  budget_->Unlinked(DiskBudget::Victim{victim.key, victim.bytes}, static_cast<int>(res));
}

void Reactor::SubmitRmdirFanout(const ChunkKey& key, int level, Chunk* owner) {
  FanoutDirOp dir{.path = FanoutDir(key), .level = level, .key = key};
  if (level == 1) dir.path.resize(2);
  // C1: ENOTEMPTY (the directory holds entries or a store's temporary) and ENOENT (gone already) are answers.
  Submit<&Reactor::OnRmdirFanoutDone>(Op{.role = OpRole::kRmdirFanout, .chunk = owner, .errors_are_answers = true},
                                      std::move(dir), UnlinkAt(AT_REMOVEDIR));
}

void Reactor::OnRmdirFanoutDone(const Op& op, const FanoutDirOp& dir, int64_t res) {
  if (res != 0) return;
  fanout_cache_.Forget(dir.key);
  if (dir.level == 2) SubmitRmdirFanout(dir.key, 1, op.chunk);
}

}  // namespace kvtier
