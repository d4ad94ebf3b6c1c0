#include "policy/stream_pump.h"

#include <algorithm>

#include "util/thread.h"

namespace kvtier {

StreamPump::StreamPump(Engine* engine, std::unique_ptr<StagingPool> pool, StreamOptions options)
    : engine_(engine), pool_(std::move(pool)), options_(options) {
  if (options_.background) thread_ = StartThread([this] { Run(); });
}

StreamPump::~StreamPump() {
  stop_.store(true);
  pool_->RingEngine();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, s] : streams_) ReleaseLocked(s);
  streams_.clear();
}

Result<StreamSpan> StreamPump::OpenLoad(std::span<const ChunkKey> keys, uint32_t consumers) {
  return Open(keys, consumers, /*load=*/true);
}

Result<StreamSpan> StreamPump::OpenStore(std::span<const ChunkKey> keys, uint32_t consumers) {
  return Open(keys, consumers, /*load=*/false);
}

Result<StreamSpan> StreamPump::Open(std::span<const ChunkKey> keys, uint32_t consumers, bool load) {
  if (keys.empty()) return Status(StatusCode::kInvalidArgument, "a stream needs at least one key");
  if (consumers == 0) return Status(StatusCode::kInvalidArgument, "a stream needs at least one consumer");
  std::lock_guard<std::mutex> lock(mu_);
  if (keys.size() > pool_->stream_entries()) {
    stats_.board_full++;
    return Status(StatusCode::kResourceExhausted, "a stream of " + std::to_string(keys.size()) +
                                                      " chunks is larger than the stream board (" +
                                                      std::to_string(pool_->stream_entries()) + " entries)");
  }
  std::optional<uint32_t> first = AllocateEntriesLocked(static_cast<uint32_t>(keys.size()));
  if (!first) {
    stats_.board_full++;
    return Status(StatusCode::kResourceExhausted,
                  "the stream board has no room for " + std::to_string(keys.size()) + " more entries");
  }
  Stream s;
  s.span = StreamSpan{next_id_++, *first, static_cast<uint32_t>(keys.size()), next_tag_++};
  if (next_tag_ == 0) next_tag_ = 1;  // 0 is the tag of entries never used
  s.load = load;
  s.consumers = consumers;
  s.chunks.reserve(keys.size());
  for (const ChunkKey& k : keys) s.chunks.push_back(Chunk{k});
  for (uint32_t i = 0; i < s.span.count; ++i) pool_->ResetEntry(s.span.first_entry + i, s.span.tag);
  (load ? stats_.loads_opened : stats_.stores_opened)++;
  const StreamSpan span = s.span;
  Stream& placed = streams_.emplace(span.id, std::move(s)).first->second;
  if (load) {
    pending_reads_ |= StartLoadsLocked(placed);
  } else {
    StartStoresLocked(placed);
  }
  stats_.open = static_cast<uint32_t>(streams_.size());
  pool_->RingEngine();  // the thread takes it from here
  return span;
}

std::optional<uint32_t> StreamPump::AllocateEntriesLocked(uint32_t count) {
  uint32_t at = 0;
  for (const auto& [first, n] : board_used_) {
    if (first - at >= count) break;
    at = first + n;
  }
  if (pool_->stream_entries() - at < count) return std::nullopt;
  board_used_.emplace(at, count);
  return at;
}

void StreamPump::Close(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  ReleaseLocked(it->second);
  board_used_.erase(it->second.span.first_entry);
  streams_.erase(it);
  stats_.open = static_cast<uint32_t>(streams_.size());
  pool_->RingEngine();  // the window it held is free for the others
}

Result<StreamProgress> StreamPump::Progress(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return Status(StatusCode::kNotFound, "no open stream " + std::to_string(id));
  return it->second.progress;
}

StreamStats StreamPump::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint32_t StreamPump::WindowLocked() const {
  const uint32_t share = pool_->num_slots() / std::max<uint32_t>(1, static_cast<uint32_t>(streams_.size()));
  return std::max<uint32_t>(1, std::min(options_.max_window, share));
}

void StreamPump::PublishLoadLocked(Stream& s, uint32_t i, SlotRef ref) {
  if (s.chunks[i].step == ChunkStep::kPromoting) reading_--;
  s.chunks[i].step = ChunkStep::kPublished;
  pool_->PublishEntry(s.span.first_entry + i, s.span.tag, ref.slot, ref.generation);
  s.progress.published++;
  pool_->RingWorkers();
}

void StreamPump::FailLocked(Stream& s, uint32_t i, StreamEntryState state) {
  Chunk& c = s.chunks[i];
  if (c.step == ChunkStep::kPromoting) reading_--;
  if (c.step == ChunkStep::kPromoting || c.step == ChunkStep::kPublished) s.held--;
  c.step = ChunkStep::kDone;
  pool_->SetEntry(s.span.first_entry + i, s.span.tag, state);
  if (state == StreamEntryState::kSkipped) {
    s.progress.skipped++;
    stats_.chunks_skipped++;
  } else {
    s.progress.failed++;
    stats_.chunks_failed++;
  }
  s.progress.done++;
  s.progress.finished = s.progress.done == s.span.count;
  pool_->RingWorkers();
}

void StreamPump::FinishLocked(Stream& s, uint32_t i) {
  Chunk& c = s.chunks[i];
  c.step = ChunkStep::kDone;
  s.held--;
  if (s.load) {
    engine_->Unpin(std::span<const ChunkKey>(&c.key, 1));
    stats_.chunks_loaded++;
  } else {
    engine_->CommitStore(std::span<const ChunkKey>(&c.key, 1), true);
    stats_.chunks_stored++;
  }
  s.progress.done++;
  s.progress.finished = s.progress.done == s.span.count;
}

// A load chunk's read ended, or it was resident: pin it for the stream and publish it. False when it lost its slot
// in between (the caller reads it again or fails it).
static bool PinOne(Engine* engine, const ChunkKey& key, SlotRef* ref) {
  auto pinned = engine->PinResident(std::span<const ChunkKey>(&key, 1));
  if (!pinned.ok()) return false;
  *ref = (*pinned)[0];
  return true;
}

bool StreamPump::SettleLoadLocked(Stream& s) {
  bool pending = false;
  // Settle what is in the window: reads that ended, chunks every consumer acked.
  for (uint32_t i = s.first_open; i < s.next; ++i) {
    Chunk& c = s.chunks[i];
    if (c.step == ChunkStep::kPromoting) {
      const PromoteState r = engine_->Residency(c.key);
      if (r == PromoteState::kPending) {
        pending = true;
        continue;
      }
      SlotRef ref;
      if (r == PromoteState::kReady && PinOne(engine_, c.key, &ref)) {
        PublishLoadLocked(s, i, ref);
        continue;
      }
      // The read failed (the engine already counted why), or the chunk was evicted before we pinned it.
      if (r == PromoteState::kReady && c.retries < options_.max_retries) {
        c.retries++;
        const PromoteResult again = engine_->Promote(c.key, false);
        if (again.state == PromoteState::kPending) {
          pending = true;
          continue;
        }
        if (again.state == PromoteState::kReady && PinOne(engine_, c.key, &ref)) {
          PublishLoadLocked(s, i, ref);
          continue;
        }
      }
      FailLocked(s, i, StreamEntryState::kFailed);
    } else if (c.step == ChunkStep::kPublished) {
      if (pool_->EntryAcks(s.span.first_entry + i, s.span.tag) >= s.consumers) FinishLocked(s, i);
    }
  }
  AdvanceFirstOpen(s);
  return pending;
}

bool StreamPump::StartLoadsLocked(Stream& s) {
  bool pending = false;
  const uint32_t window = WindowLocked();
  // Reads over all streams stay below the window, so the oldest stream always has room for its next read when one
  // of its reads ends, even while its consumers copy the last ones (the header's "The disk").
  const uint32_t read_budget = std::max<uint32_t>(1, options_.max_window - options_.max_window / 4);
  while (s.next < s.span.count && s.held < window && reading_ < read_budget) {
    const uint32_t i = s.next;
    Chunk& c = s.chunks[i];
    const PromoteResult r = engine_->Promote(c.key, false);
    if (r.state == PromoteState::kMiss) {
      // No slot free right now, or the chunk is gone (absent, or it failed verification and was removed).
      if (engine_->Residency(c.key) == PromoteState::kMiss && !engine_->Stored(c.key)) {
        s.next++;
        FailLocked(s, i, StreamEntryState::kFailed);
        continue;
      }
      stats_.slot_waits++;
      break;
    }
    s.next++;
    s.held++;
    c.step = ChunkStep::kPromoting;
    reading_++;
    SlotRef ref;
    if (r.state == PromoteState::kReady && PinOne(engine_, c.key, &ref)) {
      PublishLoadLocked(s, i, ref);
    } else {
      pending = true;  // kPending, or resident but not pinnable yet: the settle pass decides
    }
  }
  stats_.peak_window = std::max(stats_.peak_window, s.held);
  AdvanceFirstOpen(s);
  return pending;
}

void StreamPump::SettleStoreLocked(Stream& s) {
  for (uint32_t i = s.first_open; i < s.next; ++i) {
    Chunk& c = s.chunks[i];
    if (c.step == ChunkStep::kPublished && pool_->EntryAcks(s.span.first_entry + i, s.span.tag) >= s.consumers) {
      FinishLocked(s, i);
    }
  }
  AdvanceFirstOpen(s);
}

void StreamPump::StartStoresLocked(Stream& s) {
  const uint32_t window = WindowLocked();
  while (s.next < s.span.count && s.held < window) {
    const uint32_t i = s.next;
    Chunk& c = s.chunks[i];
    auto reserved = engine_->ReserveForStore(std::span<const ChunkKey>(&c.key, 1));
    if (!reserved.ok()) {
      stats_.slot_waits++;  // the pool is full of slots in use: wait for one
      break;
    }
    s.next++;
    if (!(*reserved)[0]) {  // stored, resident or being stored by someone else meanwhile
      FailLocked(s, i, StreamEntryState::kSkipped);
      continue;
    }
    s.held++;
    c.step = ChunkStep::kPublished;
    const SlotRef ref = *(*reserved)[0];
    pool_->PublishEntry(s.span.first_entry + i, s.span.tag, ref.slot, ref.generation);
    s.progress.published++;
    pool_->RingWorkers();
  }
  stats_.peak_window = std::max(stats_.peak_window, s.held);
  AdvanceFirstOpen(s);
}

void StreamPump::AdvanceFirstOpen(Stream& s) {
  while (s.first_open < s.next && s.chunks[s.first_open].step == ChunkStep::kDone) s.first_open++;
}

void StreamPump::ReleaseLocked(Stream& s) {
  for (uint32_t i = 0; i < s.next; ++i) {
    Chunk& c = s.chunks[i];
    if (c.step == ChunkStep::kPublished) {
      // Every consumer finished with the stream before Close: an ack that reached the count settles normally.
      if (pool_->EntryAcks(s.span.first_entry + i, s.span.tag) >= s.consumers) {
        FinishLocked(s, i);
        continue;
      }
      if (s.load) {
        engine_->Unpin(std::span<const ChunkKey>(&c.key, 1));
      } else {
        engine_->CommitStore(std::span<const ChunkKey>(&c.key, 1), false);
        stats_.chunks_failed++;
      }
      c.step = ChunkStep::kDone;
    }
    // kPromoting: the read finishes into an ordinary resident entry (protected a moment, then evictable).
    if (c.step == ChunkStep::kPromoting) {
      reading_--;
      c.step = ChunkStep::kDone;
    }
  }
  // Entries keep the tag until reused: a late consumer sees the stream's last word, never another stream's.
}

void StreamPump::Pump() {
  std::lock_guard<std::mutex> lock(mu_);
  bool pending = false;
  for (auto& [id, s] : streams_) {
    if (s.load) {
      pending |= SettleLoadLocked(s);
    } else {
      SettleStoreLocked(s);
    }
  }
  for (auto& [id, s] : streams_) {
    if (s.load) {
      pending |= StartLoadsLocked(s);
    } else {
      StartStoresLocked(s);
    }
  }
  pending_reads_ = pending;
}

void StreamPump::Run() {
  while (!stop_.load()) {
    const uint32_t seen = pool_->EngineBell();
    Pump();
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy = !streams_.empty();
    }
    // Acks and the ends of promotions ring the bell; a stream waiting for a slot another user frees (an eviction, a
    // store written) is re-checked every kIdlePoll.
    pool_->WaitEngineBell(seen, busy ? std::chrono::nanoseconds(kIdlePoll) : std::chrono::milliseconds(50));
  }
}

}  // namespace kvtier
