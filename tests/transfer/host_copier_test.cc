// HostCopier: byte-exact copies in both directions for every segment shape the engine hands it, on both of its
// copy-out paths (memcpy for small chunks, streaming stores for chunks of at least a quarter of the last-level
// cache), and not a byte written outside a segment.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transfer/device_copier.h"

namespace kvtier {
namespace {

uint8_t PatternByte(uint64_t i, uint8_t salt) { return static_cast<uint8_t>((i * 131 + (i >> 9) * 7 + salt) & 0xff); }

// Submits one task and waits for its completion (the copier's own thread does the work).
Status RunOne(DeviceCopier& copier, CopyTask task) {
  const uint64_t id = task.id;
  std::vector<CopyTask> batch;
  batch.push_back(std::move(task));
  copier.Submit(std::move(batch));
  for (int i = 0; i < 20000; ++i) {
    std::vector<CopyDone> done;
    copier.Poll(&done);
    if (!done.empty()) {
      EXPECT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0].id, id);
      return done[0].status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status(StatusCode::kInternal, "copy did not finish in 20 s");
}

struct Shape {
  uint64_t bytes;
  uint64_t slot_offset;
  uint64_t host_misalign;  // bytes past a 64-byte boundary
};

// Small to 2 MiB segments, each copied as its own task (below the streaming threshold of LLC/4: memcpy, unless the
// task says its job is larger than that); odd sizes leave a tail; misaligned ends on both sides. The streaming test
// below reuses them in one large task.
const std::vector<Shape> kShapes = {
    {100, 0, 0},       {4096, 4096, 3},           {(64 << 10) - 1, 17, 5}, {64 << 10, 0, 0}, {(64 << 10) + 1, 33, 31},
    {200003, 4096, 1}, {(1 << 20) + 77, 129, 32}, {(2 << 20), 0, 0},
};

std::unique_ptr<DeviceCopier> StartedHostCopier() {
  auto copier = CreateHostCopier();
  copier->SetWakeup([] {});
  return copier;
}

// A slot large enough for every shape's segment, filled with PatternByte(i, salt).
std::vector<uint8_t> PatternedSlot(const std::vector<Shape>& shapes, uint8_t salt) {
  uint64_t slot_bytes = 0;
  for (const Shape& s : shapes) slot_bytes = std::max(slot_bytes, s.slot_offset + s.bytes);
  std::vector<uint8_t> slot(slot_bytes);
  for (uint64_t i = 0; i < slot.size(); ++i) slot[i] = PatternByte(i, salt);
  return slot;
}

// A task over the whole of `slot`, without segments yet.
CopyTask TaskOver(uint64_t id, CopyDirection direction, std::vector<uint8_t>& slot) {
  CopyTask t;
  t.id = id;
  t.direction = direction;
  t.slot_data = slot.data();
  t.slot_bytes = slot.size();
  return t;
}

// Each shape alone, as a chunk of a small job (memcpy) and of a job larger than the cache (streaming stores where
// the build and CPU have them, HostCopierStreams).
TEST(HostCopier, CopiesOutOfASlotByteExactAndNothingOutsideTheSegments) {
  auto copier = StartedHostCopier();
  std::vector<uint8_t> slot = PatternedSlot(kShapes, 1);
  uint64_t id = 1;
  for (const uint64_t job_bytes : {uint64_t{0}, uint64_t{1} << 40}) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE("bytes " + std::to_string(s.bytes) + " slot offset " + std::to_string(s.slot_offset) +
                   " host misalignment " + std::to_string(s.host_misalign) + " job bytes " + std::to_string(job_bytes) +
                   (HostCopierStreams(s.bytes, job_bytes) ? " (streaming)" : " (memcpy)"));
      constexpr uint64_t kGuard = 256;
      std::vector<uint8_t> host(s.bytes + 2 * kGuard + 64, 0xee);
      uint8_t* base = host.data() + kGuard;
      base += (64 - (reinterpret_cast<uintptr_t>(base) & 63)) & 63;
      uint8_t* dst = base + s.host_misalign;
      CopyTask t = TaskOver(id++, CopyDirection::kSlotToDevice, slot);
      t.segments.push_back(CopySegment{s.slot_offset, reinterpret_cast<uint64_t>(dst), s.bytes});
      t.job_bytes = job_bytes;
      ASSERT_TRUE(RunOne(*copier, std::move(t)).ok());
      ASSERT_EQ(std::memcmp(dst, slot.data() + s.slot_offset, s.bytes), 0);
      for (uint8_t* p = host.data(); p < dst; ++p) ASSERT_EQ(*p, 0xee) << "byte before the segment written";
      for (uint8_t* p = dst + s.bytes; p < host.data() + host.size(); ++p) {
        ASSERT_EQ(*p, 0xee) << "byte after the segment written";
      }
    }
  }
}

// One task whose segments add up to more than the streaming threshold: every shape above, then one large segment.
TEST(HostCopier, StreamsALargeChunkOutOfASlotByteExactAndNothingOutsideTheSegments) {
  constexpr uint64_t kGuard = 256;
  std::vector<Shape> shapes = kShapes;
  uint64_t small_total = 0;
  for (const Shape& s : shapes) small_total += s.bytes;
  const uint64_t big = std::max<uint64_t>(uint64_t{96} << 20, small_total) + 4096 + 7;
  shapes.push_back(Shape{big, 0, 9});
  uint64_t total = 0;
  for (const Shape& s : shapes) total += s.bytes;
  if (!HostCopierStreams(total)) {
    GTEST_SKIP() << "this build or CPU has no streaming copy-out (no AVX2, a sanitizer build, or a last-level cache "
                    "over 4 x "
                 << total << " bytes)";
  }
  auto copier = StartedHostCopier();
  std::vector<uint8_t> slot = PatternedSlot(shapes, 5);
  // Each segment gets its own region of one host buffer, with guard bytes between regions.
  std::vector<uint64_t> starts;
  uint64_t host_bytes = 0;
  for (const Shape& s : shapes) {
    host_bytes = (host_bytes + kGuard + 63) / 64 * 64 + s.host_misalign;
    starts.push_back(host_bytes);
    host_bytes += s.bytes;
  }
  std::vector<uint8_t> host(host_bytes + kGuard + 64, 0xee);
  uint8_t* base = host.data() + ((64 - (reinterpret_cast<uintptr_t>(host.data()) & 63)) & 63);
  CopyTask t = TaskOver(1, CopyDirection::kSlotToDevice, slot);
  for (size_t i = 0; i < shapes.size(); ++i) {
    t.segments.push_back(
        CopySegment{shapes[i].slot_offset, reinterpret_cast<uint64_t>(base + starts[i]), shapes[i].bytes});
  }
  ASSERT_TRUE(RunOne(*copier, std::move(t)).ok());
  std::vector<bool> inside(host.size(), false);
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE("segment " + std::to_string(i) + " of " + std::to_string(shapes[i].bytes) + " bytes");
    ASSERT_EQ(std::memcmp(base + starts[i], slot.data() + shapes[i].slot_offset, shapes[i].bytes), 0);
    const uint64_t from = static_cast<uint64_t>(base - host.data()) + starts[i];
    std::fill(inside.begin() + from, inside.begin() + from + shapes[i].bytes, true);
  }
  for (uint64_t i = 0; i < host.size(); ++i) {
    if (!inside[i]) {
      ASSERT_EQ(host[i], 0xee) << "byte " << i << " outside every segment written";
    }
  }
}

TEST(HostCopier, CopiesIntoASlotByteExactAndNothingOutsideTheSegments) {
  auto copier = StartedHostCopier();
  uint64_t id = 1;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("bytes " + std::to_string(s.bytes) + " slot offset " + std::to_string(s.slot_offset));
    std::vector<uint8_t> host(s.bytes + s.host_misalign);
    for (uint64_t i = 0; i < host.size(); ++i) host[i] = PatternByte(i, 2);
    std::vector<uint8_t> slot(s.slot_offset + s.bytes + 128, 0xee);
    CopyTask t = TaskOver(id++, CopyDirection::kDeviceToSlot, slot);
    t.segments.push_back(
        CopySegment{s.slot_offset, reinterpret_cast<uint64_t>(host.data() + s.host_misalign), s.bytes});
    ASSERT_TRUE(RunOne(*copier, std::move(t)).ok());
    ASSERT_EQ(std::memcmp(slot.data() + s.slot_offset, host.data() + s.host_misalign, s.bytes), 0);
    for (uint64_t i = 0; i < s.slot_offset; ++i) ASSERT_EQ(slot[i], 0xee);
    for (uint64_t i = s.slot_offset + s.bytes; i < slot.size(); ++i) ASSERT_EQ(slot[i], 0xee);
  }
}

TEST(HostCopier, RefusesASegmentOutsideTheSlotOrToANullAddress) {
  auto copier = StartedHostCopier();
  std::vector<uint8_t> slot(1 << 20), host(1 << 20);
  CopyTask outside = TaskOver(1, CopyDirection::kSlotToDevice, slot);
  outside.segments.push_back(CopySegment{(1 << 20) - 100, reinterpret_cast<uint64_t>(host.data()), 200});
  EXPECT_EQ(RunOne(*copier, std::move(outside)).code(), StatusCode::kInvalidArgument);
  CopyTask null_address = TaskOver(2, CopyDirection::kSlotToDevice, slot);
  null_address.segments.push_back(CopySegment{0, 0, 100});
  EXPECT_EQ(RunOne(*copier, std::move(null_address)).code(), StatusCode::kInvalidArgument);
}

TEST(HostCopier, NamesHowItCopies) {
  auto copier = CreateHostCopier();
  const std::string name(copier->name());
  EXPECT_EQ(name.rfind("host (", 0), 0u) << name;
  EXPECT_EQ(name.find("streaming") != std::string::npos, HostCopierStreams(uint64_t{1} << 40)) << name;
}

TEST(HostCopier, StreamsOnlyChunksOrJobsLargerThanTheCacheCanHold) {
  if (const char* forced = std::getenv("KVTIER_HOST_COPY"); forced != nullptr) {
    GTEST_SKIP() << "KVTIER_HOST_COPY=" << forced << " overrides the size rule";
  }
  // 64 KiB is below a quarter of any last-level cache worth the name; small chunks of small jobs take memcpy.
  EXPECT_FALSE(HostCopierStreams(64 << 10));
  EXPECT_FALSE(HostCopierStreams(64 << 10, 1 << 20));
  // A small chunk of a job larger than the cache streams whenever streaming exists at all.
  EXPECT_EQ(HostCopierStreams(64 << 10, uint64_t{1} << 40), HostCopierStreams(uint64_t{1} << 40));
}

// HostCopy is the copy the engine's host copier and the vLLM worker's copy_batch share: both directions, streaming
// or not, copy exactly the bytes asked for from any alignment.
TEST(HostCopy, CopiesExactlyInBothDirectionsStreamingOrNot) {
  std::vector<uint8_t> src(3 << 20), dst(src.size() + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (CopyDirection dir : {CopyDirection::kSlotToDevice, CopyDirection::kDeviceToSlot}) {
    for (bool stream : {false, true}) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{33}}) {
        for (size_t n : {size_t{0}, size_t{100}, size_t{4096}, size_t{(2 << 20) + 77}}) {
          std::fill(dst.begin(), dst.end(), 0xEE);
          HostCopy(dir, dst.data() + offset, src.data() + 5, n, stream);
          ASSERT_EQ(std::memcmp(dst.data() + offset, src.data() + 5, n), 0) << n << " stream=" << stream;
          for (size_t i = 0; i < offset; ++i) ASSERT_EQ(dst[i], 0xEE);
          for (size_t i = offset + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier
