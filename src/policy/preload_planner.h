// PreloadPlanner: scheduler-aware preloading (R1-R3) on top of Engine::Promote.
//
// The vLLM manager tells it about waiting requests (Enqueue, from on_new_request: their chunk keys in prefix order)
// and about demand (Demand, from lookups of the request the scheduler is about to admit). The rules:
//  - Demand first (R2): Demand() promotes at once with demand priority; while any demand read is in flight no
//    speculative read starts (queued ones are deferred, not dropped).
//  - Bounded (R2): at most max_inflight speculative chunk reads are in flight (default 1). They acquire with
//    SlotPriority::kSpeculative, so they never take the pool's demand reserve (S2), and the engine never lets a preload
//    evict another unused preload or anything in use, and caps unused preloads at half of the non-reserved slots.
//  - Shared (X4, R3): a key already resident or being read is not read again; a demand load of a key with a preload
//    in flight or finished joins it (the engine's resident map; counted as preload_used by the engine, as
//    joined_in_flight here).
//  - Stale work is dropped: a request that was admitted, finished or cancelled (Forget), a queued read older than
//    max_queue_age_ms, and the rest of a request once one of its chunks is absent (the prefix ends there).
//
// Progress: Pump() retires finished reads and starts the next ones. The scheduler calls it once per step, but a step
// can take seconds (a long prefill), and with K reads in flight that would read only K chunks per step. So
// StartBackgroundPump() runs Pump() on a thread of its own as well: every period while reads are queued or in
// flight, and not at all while there is nothing to do (Enqueue wakes it).
//
// Threads: an internal mutex makes every method safe from any thread (vLLM's scheduler thread and the background
// pump). The clock is injectable so tests can age queued work deterministically (they run no background pump).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kvtier/engine.h"

namespace kvtier {

struct PlannerOptions {
  uint32_t max_inflight = 1;     // speculative chunk reads in flight at once (preload_max_inflight); 0: off
  int64_t max_queue_age_ms = 0;  // queued reads older than this are dropped; 0: never
};

struct PlannerStats {
  uint64_t enqueued = 0;             // chunk keys queued for preload
  uint64_t started = 0;              // speculative promotions started (reads issued)
  uint64_t already_resident = 0;     // queued keys found resident or being read: nothing to do
  uint64_t joined_in_flight = 0;     // demand arrived while this planner's speculative read of the key was in flight
  uint64_t deferred_for_demand = 0;  // pumps that started nothing because demand reads were in flight
  uint64_t refused_no_room = 0;      // pumps that found no slot a preload may take (retried on a later pump)
  uint64_t dropped = 0;              // queued keys dropped: forgotten request, stale, or absent prefix
  uint64_t demand_promotions = 0;    // Demand() calls that started or joined a read
};

class PreloadPlanner {
 public:
  using Clock = std::function<int64_t()>;  // nanoseconds, monotonic

  PreloadPlanner(Engine* engine, PlannerOptions options, Clock clock = nullptr);
  ~PreloadPlanner();  // stops the background pump
  PreloadPlanner(const PreloadPlanner&) = delete;
  PreloadPlanner& operator=(const PreloadPlanner&) = delete;

  // Pumps every `period` on an internal thread while there is queued or in-flight work (see Progress above).
  // Idempotent; the thread ends with the planner (or StopBackgroundPump).
  void StartBackgroundPump(std::chrono::microseconds period);
  void StopBackgroundPump();

  // R1: queue speculative reads of a waiting request's chunks, in order. Keys queued already are not duplicated.
  void Enqueue(const std::string& request, std::span<const ChunkKey> keys);
  // The request left the waiting queue (admitted, finished, aborted): its queued reads are dropped. Reads in flight
  // finish and stay resident (a demand load may still join them).
  void Forget(const std::string& request);
  // Demand promotion of a key (a lookup of the request being admitted). Joins a speculative read (R3).
  PromoteResult Demand(const ChunkKey& key);
  // Retire finished reads and start speculative ones within the bounds. Call once per scheduler step.
  void Pump();

  size_t inflight() const;        // speculative reads in flight
  size_t demand_pending() const;  // demand reads in flight
  size_t queued() const;
  PlannerStats stats() const;
  const PlannerOptions& options() const { return options_; }

 private:
  struct Item {
    ChunkKey key;
    std::string request;
    int64_t enqueued_ns = 0;
  };
  void RetireLocked();
  void DropRequestLocked(const std::string& request);
  void PumpLocked();
  void BackgroundMain(std::chrono::microseconds period);

  Engine* engine_;
  PlannerOptions options_;
  Clock clock_;
  mutable std::mutex mu_;
  std::deque<Item> queue_;
  std::unordered_map<ChunkKey, int, ChunkKeyHash> queued_keys_;
  std::unordered_set<ChunkKey, ChunkKeyHash> spec_inflight_;
  std::unordered_set<ChunkKey, ChunkKeyHash> demand_inflight_;
  PlannerStats stats_;
  std::condition_variable wake_;  // Enqueue -> background pump
  bool stop_ = false;
  std::thread pump_thread_;
};

}  // namespace kvtier
