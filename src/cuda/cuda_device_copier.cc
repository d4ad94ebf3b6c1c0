// CudaDeviceCopier: the engine's DeviceCopier seam on a CudaCopier (cuda_copier.h). Every task of one Submit goes
// out as one launch per direction (X1); completions come back by ticket, and a host callback queued after each
// launch wakes the reactor, so it does not wait out its reap timeout.
//
// Threads: Submit, Poll and pending() run on the engine's reactor thread. The wakeup runs on a CUDA-owned thread.
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/cuda_copier.h"

namespace kvtier {
namespace {

class CudaDeviceCopier final : public DeviceCopier {
 public:
  explicit CudaDeviceCopier(std::unique_ptr<CudaCopier> copier) : copier_(std::move(copier)) {}
  // The CudaCopier's destructor waits for its streams, host callbacks included, before `this` goes away.
  ~CudaDeviceCopier() override { copier_.reset(); }

  std::string_view name() const override {
    return copier_->mode() == CudaCopyMode::kKernel ? "cuda-kernel" : "cuda-batch-api";
  }
  void SetWakeup(std::function<void()> wakeup) override { wakeup_ = std::move(wakeup); }

  void Submit(std::vector<CopyTask> batch) override {
    Launch(CudaCopyDirection::kHostToDevice, CopyDirection::kSlotToDevice, batch);
    Launch(CudaCopyDirection::kDeviceToHost, CopyDirection::kDeviceToSlot, batch);
  }

  void Poll(std::vector<CopyDone>* done) override {
    for (CopyDone& d : failed_) done->push_back(std::move(d));
    pending_ -= failed_.size();
    failed_.clear();
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (!copier_->Query(it->ticket)) {
        ++it;
        continue;
      }
      const Status status = copier_->Wait(it->ticket);  // already complete: returns at once, with any error
      for (uint64_t id : it->ids) done->push_back(CopyDone{id, status});
      pending_ -= it->ids.size();
      it = in_flight_.erase(it);
    }
  }

  size_t pending() const override { return pending_; }

 private:
  struct InFlight {
    uint64_t ticket = 0;
    std::vector<uint64_t> ids;
  };

  static void WakeTrampoline(void* self) {
    auto* me = static_cast<CudaDeviceCopier*>(self);
    if (me->wakeup_) me->wakeup_();
  }

  void Fail(uint64_t id, Status status) {
    failed_.push_back(CopyDone{id, std::move(status)});
    ++pending_;
  }

  void Launch(CudaCopyDirection cuda_dir, CopyDirection dir, const std::vector<CopyTask>& batch) {
    dst_.clear();
    src_.clear();
    sizes_.clear();
    InFlight f;
    for (const CopyTask& t : batch) {
      if (t.direction != dir) continue;
      bool ok = true;
      for (const CopySegment& s : t.segments) {
        if (s.slot_offset + s.bytes > t.slot_bytes || s.address == 0) ok = false;
      }
      if (!ok) {
        Fail(t.id, Status(StatusCode::kInvalidArgument, "copy segment outside the slot or to a null address"));
        continue;
      }
      if (t.slot_bytes > 0 && !copier_->IsRegistered(t.slot_data, t.slot_bytes)) {
        // The engine's staging pool: register its whole mapping once (later slots are then covered).
        Status s = copier_->RegisterMappingContaining(t.slot_data);
        if (!s.ok() && copier_->mode() == CudaCopyMode::kKernel) {
          Fail(t.id, s.WithContext("registering the staging pool"));
          continue;
        }
      }
      const uint64_t slot = reinterpret_cast<uint64_t>(t.slot_data);
      for (const CopySegment& s : t.segments) {
        const uint64_t host = slot + s.slot_offset;
        dst_.push_back(dir == CopyDirection::kSlotToDevice ? s.address : host);
        src_.push_back(dir == CopyDirection::kSlotToDevice ? host : s.address);
        sizes_.push_back(s.bytes);
      }
      f.ids.push_back(t.id);
    }
    if (f.ids.empty()) return;
    pending_ += f.ids.size();
    auto ticket =
        copier_->CopyBatch(cuda_dir, dst_.data(), src_.data(), sizes_.data(), sizes_.size(), kNoCudaStreamDependency);
    if (!ticket.ok()) {
      pending_ -= f.ids.size();
      for (uint64_t id : f.ids) Fail(id, ticket.status());
      return;
    }
    f.ticket = *ticket;
    in_flight_.push_back(std::move(f));
    if (wakeup_) (void)copier_->Notify(cuda_dir, &WakeTrampoline, this);
  }

  std::unique_ptr<CudaCopier> copier_;
  std::function<void()> wakeup_;
  std::deque<InFlight> in_flight_;
  std::vector<CopyDone> failed_;  // rejected before launch; returned by the next Poll
  size_t pending_ = 0;
  std::vector<uint64_t> dst_, src_, sizes_;  // scratch
};

}  // namespace

Result<std::unique_ptr<DeviceCopier>> CreateCudaDeviceCopier(const CudaCopierOptions& options) {
  auto copier = CudaCopier::Create(options);
  if (!copier.ok()) return copier.status();
  return std::unique_ptr<DeviceCopier>(std::make_unique<CudaDeviceCopier>(std::move(copier.value())));
}

}  // namespace kvtier
