// HostCopier: memcpy between staging slots and host memory on one helper thread, so the reactor never stalls on
// a large copy while disk reads are waiting to be issued.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "transfer/device_copier.h"

namespace kvtier {
namespace {

class HostCopier final : public DeviceCopier {
 public:
  HostCopier() : thread_([this] { Run(); }) {}
  ~HostCopier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::string_view name() const override { return "host"; }
  void SetWakeup(std::function<void()> wakeup) override {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = std::move(wakeup);
  }

  void Submit(std::vector<CopyTask> batch) override {
    if (batch.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ += batch.size();
      for (auto& t : batch) queue_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

  void Poll(std::vector<CopyDone>* done) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= finished_.size();
    for (auto& d : finished_) done->push_back(std::move(d));
    finished_.clear();
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_;
  }

 private:
  static Status Copy(const CopyTask& t) {
    for (const CopySegment& s : t.segments) {
      if (s.slot_offset + s.bytes > t.slot_bytes || s.address == 0) {
        return Status(StatusCode::kInvalidArgument, "copy segment outside the slot or to a null address");
      }
      void* host = reinterpret_cast<void*>(s.address);
      if (t.direction == CopyDirection::kSlotToDevice) {
        std::memcpy(host, t.slot_data + s.slot_offset, s.bytes);
      } else {
        std::memcpy(t.slot_data + s.slot_offset, host, s.bytes);
      }
    }
    return Status::Ok();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      CopyTask task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status status = Copy(task);
      lock.lock();
      finished_.push_back(CopyDone{task.id, std::move(status)});
      if (wakeup_) wakeup_();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CopyTask> queue_;
  std::vector<CopyDone> finished_;
  size_t pending_ = 0;
  bool stop_ = false;
  std::function<void()> wakeup_;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace

std::unique_ptr<DeviceCopier> CreateHostCopier() { return std::make_unique<HostCopier>(); }

}  // namespace kvtier
