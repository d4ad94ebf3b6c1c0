#include "tier/dram_tier.h"

#include <algorithm>
#include <list>
#include <unordered_map>

namespace kvtier {

Result<DramPolicy> ParseDramPolicy(std::string_view name) {
  if (name == "lru") return DramPolicy::kLru;
  if (name == "arc") return DramPolicy::kArc;
  return Status(StatusCode::kInvalidArgument,
                "dram_policy: '" + std::string(name) + "' is not a policy; accepted: lru, arc");
}

const char* DramPolicyName(DramPolicy p) { return p == DramPolicy::kArc ? "arc" : "lru"; }

namespace {

// A recency list with O(1) find: most recent at the back.
class KeyList {
 public:
  bool Has(const ChunkKey& k) const { return pos_.count(k) != 0; }
  void PushBack(const ChunkKey& k) {
    list_.push_back(k);
    pos_[k] = std::prev(list_.end());
  }
  bool Remove(const ChunkKey& k) {
    auto it = pos_.find(k);
    if (it == pos_.end()) return false;
    list_.erase(it->second);
    pos_.erase(it);
    return true;
  }
  void MoveToBack(const ChunkKey& k) {
    auto it = pos_.find(k);
    if (it != pos_.end()) list_.splice(list_.end(), list_, it->second);
  }
  void PopFront() {
    if (list_.empty()) return;
    pos_.erase(list_.front());
    list_.pop_front();
  }
  std::optional<ChunkKey> FirstWhere(const DramTier::Evictable& ok) const {
    for (const ChunkKey& k : list_) {
      if (ok(k)) return k;
    }
    return std::nullopt;
  }
  size_t size() const { return list_.size(); }

 private:
  std::list<ChunkKey> list_;
  std::unordered_map<ChunkKey, std::list<ChunkKey>::iterator, ChunkKeyHash> pos_;
};

class LruTier final : public DramTier {
 public:
  explicit LruTier(size_t capacity) : capacity_(capacity) {}
  void Insert(const ChunkKey& k) override {
    if (list_.Has(k))
      list_.MoveToBack(k);
    else
      list_.PushBack(k);
  }
  void Touch(const ChunkKey& k) override { list_.MoveToBack(k); }
  void Evict(const ChunkKey& k) override { list_.Remove(k); }
  void Erase(const ChunkKey& k) override { list_.Remove(k); }
  std::optional<ChunkKey> Victim(const Evictable& ok) const override { return list_.FirstWhere(ok); }
  bool Contains(const ChunkKey& k) const override { return list_.Has(k); }
  size_t size() const override { return list_.size(); }
  size_t capacity() const override { return capacity_; }
  DramPolicy policy() const override { return DramPolicy::kLru; }

 private:
  size_t capacity_;
  KeyList list_;
};

class ArcTier final : public DramTier {
 public:
  explicit ArcTier(size_t capacity) : c_(std::max<size_t>(1, capacity)) {}

  void Insert(const ChunkKey& k) override {
    if (t1_.Has(k) || t2_.Has(k)) {
      Touch(k);
      return;
    }
    if (b1_.Has(k)) {  // evicted after one use and wanted again: T1 was too small
      p_ = std::min(c_, p_ + std::max<size_t>(1, b2_.size() / std::max<size_t>(1, b1_.size())));
      b1_.Remove(k);
      t2_.PushBack(k);
    } else if (b2_.Has(k)) {  // a frequent key came back: T2 was too small
      const size_t d = std::max<size_t>(1, b1_.size() / std::max<size_t>(1, b2_.size()));
      p_ = p_ > d ? p_ - d : 0;
      b2_.Remove(k);
      t2_.PushBack(k);
    } else {
      t1_.PushBack(k);
    }
    TrimGhosts();
  }
  void Touch(const ChunkKey& k) override {
    if (t1_.Remove(k))
      t2_.PushBack(k);
    else
      t2_.MoveToBack(k);
  }
  void Evict(const ChunkKey& k) override {
    if (t1_.Remove(k))
      b1_.PushBack(k);
    else if (t2_.Remove(k))
      b2_.PushBack(k);
    TrimGhosts();
  }
  void Erase(const ChunkKey& k) override { t1_.Remove(k) || t2_.Remove(k); }
  std::optional<ChunkKey> Victim(const Evictable& ok) const override {
    // ARC's REPLACE: take from T1 while it is above its target p, else from T2; fall back to the other list when
    // every key of the preferred one is in use.
    const bool from_t1 = t1_.size() > 0 && (t1_.size() > p_ || t2_.size() == 0);
    const KeyList& first = from_t1 ? t1_ : t2_;
    const KeyList& second = from_t1 ? t2_ : t1_;
    if (auto v = first.FirstWhere(ok)) return v;
    return second.FirstWhere(ok);
  }
  bool Contains(const ChunkKey& k) const override { return t1_.Has(k) || t2_.Has(k); }
  size_t size() const override { return t1_.size() + t2_.size(); }
  size_t capacity() const override { return c_; }
  DramPolicy policy() const override { return DramPolicy::kArc; }

  size_t target_t1() const { return p_; }

 private:
  void TrimGhosts() {
    while (t1_.size() + b1_.size() > c_ && b1_.size() > 0) b1_.PopFront();
    while (t1_.size() + t2_.size() + b1_.size() + b2_.size() > 2 * c_ && b2_.size() > 0) b2_.PopFront();
    while (t1_.size() + t2_.size() + b1_.size() + b2_.size() > 2 * c_ && b1_.size() > 0) b1_.PopFront();
  }

  size_t c_;
  size_t p_ = 0;
  KeyList t1_, t2_, b1_, b2_;
};

}  // namespace

std::unique_ptr<DramTier> DramTier::Make(DramPolicy policy, size_t capacity) {
  if (policy == DramPolicy::kArc) return std::make_unique<ArcTier>(capacity);
  return std::make_unique<LruTier>(capacity);
}

}  // namespace kvtier
