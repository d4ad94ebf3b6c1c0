#include "policy/preload_planner.h"

#include <time.h>

#include <algorithm>

#include "util/thread.h"

namespace kvtier {

namespace {
int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

PreloadPlanner::PreloadPlanner(Engine* engine, PlannerOptions options, Clock clock)
    : engine_(engine), options_(options), clock_(clock ? std::move(clock) : Clock(MonotonicNs)) {}

PreloadPlanner::~PreloadPlanner() { StopBackgroundPump(); }

void PreloadPlanner::StartBackgroundPump(std::chrono::microseconds period) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pump_thread_.joinable() || options_.max_inflight == 0) return;
  stop_ = false;
  pump_thread_ = StartThread([this, period] { BackgroundMain(period); });
}

void PreloadPlanner::StopBackgroundPump() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (pump_thread_.joinable()) pump_thread_.join();
}

void PreloadPlanner::BackgroundMain(std::chrono::microseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  bool stalled = false;  // the last pump could start nothing and nothing is in flight (no room for a preload)
  while (!stop_) {
    if (queue_.empty() && spec_inflight_.empty() && demand_inflight_.empty()) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });  // nothing to do until Enqueue
    } else {
      // While stalled, room appears only when demand uses or evicts something: look less often.
      wake_.wait_for(lock, stalled ? period * 20 : period, [&] { return stop_; });
    }
    if (stop_) break;
    const uint64_t started = stats_.started;
    PumpLocked();
    stalled = stats_.started == started && spec_inflight_.empty() && demand_inflight_.empty();
  }
}

void PreloadPlanner::Enqueue(const std::string& request, std::span<const ChunkKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.max_inflight == 0) return;
  const int64_t now = clock_();
  for (const ChunkKey& k : keys) {
    if (queued_keys_.count(k) || spec_inflight_.count(k) || demand_inflight_.count(k)) continue;
    queue_.push_back(Item{k, request, now});
    queued_keys_[k]++;
    stats_.enqueued++;
  }
  if (!queue_.empty()) wake_.notify_all();
}

void PreloadPlanner::DropRequestLocked(const std::string& request) {
  auto keep = std::remove_if(queue_.begin(), queue_.end(), [&](const Item& it) {
    if (it.request != request) return false;
    if (--queued_keys_[it.key] == 0) queued_keys_.erase(it.key);
    stats_.dropped++;
    return true;
  });
  queue_.erase(keep, queue_.end());
}

void PreloadPlanner::Forget(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  DropRequestLocked(request);
}

PromoteResult PreloadPlanner::Demand(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queued_keys_.count(key)) {  // demand takes it over: no speculative read of it later
    auto keep = std::remove_if(queue_.begin(), queue_.end(), [&](const Item& it) { return it.key == key; });
    queue_.erase(keep, queue_.end());
    queued_keys_.erase(key);
  }
  PromoteResult r = engine_->Promote(key, /*speculative=*/false);
  if (spec_inflight_.erase(key)) {
    stats_.joined_in_flight++;  // R3: the speculative read now serves demand; it no longer counts against K
  }
  if (r.state == PromoteState::kPending) {
    if (demand_inflight_.insert(key).second) stats_.demand_promotions++;
  } else {
    demand_inflight_.erase(key);
  }
  return r;
}

void PreloadPlanner::RetireLocked() {
  for (auto* set : {&spec_inflight_, &demand_inflight_}) {
    for (auto it = set->begin(); it != set->end();) {
      if (engine_->Residency(*it) != PromoteState::kPending)
        it = set->erase(it);
      else
        ++it;
    }
  }
}

void PreloadPlanner::Pump() {
  std::lock_guard<std::mutex> lock(mu_);
  PumpLocked();
}

void PreloadPlanner::PumpLocked() {
  RetireLocked();
  if (queue_.empty()) return;
  if (!demand_inflight_.empty()) {  // R2: demand first; queued preloads wait
    stats_.deferred_for_demand++;
    return;
  }
  const int64_t now = clock_();
  const int64_t max_age_ns = options_.max_queue_age_ms * 1000000;
  while (spec_inflight_.size() < options_.max_inflight && !queue_.empty()) {
    Item item = queue_.front();
    queue_.pop_front();
    if (--queued_keys_[item.key] == 0) queued_keys_.erase(item.key);
    if (max_age_ns > 0 && now - item.enqueued_ns > max_age_ns) {
      stats_.dropped++;
      continue;
    }
    if (engine_->Residency(item.key) != PromoteState::kMiss) {
      stats_.already_resident++;  // resident or being read: share it (X4)
      continue;
    }
    PromoteResult r = engine_->Promote(item.key, /*speculative=*/true);
    if (r.state == PromoteState::kPending) {
      spec_inflight_.insert(item.key);
      stats_.started++;
      continue;
    }
    if (r.state == PromoteState::kReady) {
      stats_.already_resident++;
      continue;
    }
    // kMiss: absent (the request's cached prefix ends here) or no slot a preload may take (try again later).
    if (engine_->Lookup(item.key) == ChunkLocation::kAbsent) {
      stats_.dropped++;
      DropRequestLocked(item.request);
      continue;
    }
    queue_.push_front(item);
    queued_keys_[item.key]++;
    stats_.refused_no_room++;
    break;
  }
}

size_t PreloadPlanner::inflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_inflight_.size();
}
size_t PreloadPlanner::demand_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return demand_inflight_.size();
}
size_t PreloadPlanner::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}
PlannerStats PreloadPlanner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kvtier
