// kvtier._kvtier_cuda: the CUDA copier for vLLM's worker processes (docs/gpu.md; C++ contract src/cuda/cuda_copier.h).
//
// Built only with KVTIER_WITH_CUDA (src/cuda/python.cmake). No torch and no CUDA types here: addresses and stream
// handles are Python ints (tensor.data_ptr(), torch.cuda.current_stream().cuda_stream), segment lists are 1-D
// uint64 numpy arrays. Calls that may wait or launch release the GIL. Errors are raised as in kvtier._kvtier:
// kInvalidArgument -> ValueError, kNotFound -> KeyError... (see ThrowStatus), kUnsupported -> RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/cuda_copier.h"
#include "kvtier/status.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

[[noreturn]] void ThrowStatus(const Status& s) {
  const std::string msg = s.ToString();
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists: throw nb::value_error(msg.c_str());
    case StatusCode::kNotFound: throw nb::key_error(msg.c_str());
    case StatusCode::kTimedOut: PyErr_SetString(PyExc_TimeoutError, msg.c_str()); throw nb::python_error();
    default: throw std::runtime_error(msg);
  }
}

using U64Array = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

CudaCopyDirection ParseDirection(const std::string& d) {
  if (d == "h2d") return CudaCopyDirection::kHostToDevice;
  if (d == "d2h") return CudaCopyDirection::kDeviceToHost;
  throw nb::value_error(("direction '" + d + "'; accepted: h2d, d2h").c_str());
}

class PyCudaCopier {
 public:
  PyCudaCopier(int device, const std::string& mode, uint32_t kernel_threads, uint32_t kernel_blocks_per_sm) {
    auto m = ParseCudaCopyMode(mode);
    if (!m.ok()) ThrowStatus(m.status());
    CudaCopierOptions o;
    o.device = device;
    o.mode = *m;
    o.kernel_threads = kernel_threads;
    o.kernel_blocks_per_sm = kernel_blocks_per_sm;
    Result<std::unique_ptr<CudaCopier>> c = Status::Ok();
    {
      nb::gil_scoped_release release;
      c = CudaCopier::Create(o);
    }
    if (!c.ok()) ThrowStatus(c.status());
    copier_ = std::move(c.value());
  }

  void RegisterHost(uint64_t address, uint64_t bytes) {
    Status s;
    {
      nb::gil_scoped_release release;
      s = copier_->RegisterHost(reinterpret_cast<void*>(address), bytes);
    }
    if (!s.ok()) ThrowStatus(s);
  }

  uint64_t CopyBatch(const std::string& direction, U64Array dst, U64Array src, U64Array sizes, uint64_t stream) {
    const CudaCopyDirection d = ParseDirection(direction);
    const size_t n = dst.shape(0);
    if (src.shape(0) != n || sizes.shape(0) != n) {
      throw nb::value_error("copy_batch: dst, src and sizes must have the same length");
    }
    Result<uint64_t> t = Status::Ok();
    {
      nb::gil_scoped_release release;
      t = copier_->CopyBatch(d, dst.data(), src.data(), sizes.data(), n, static_cast<CudaStreamHandle>(stream));
    }
    if (!t.ok()) ThrowStatus(t.status());
    return *t;
  }

  uint64_t Record(const std::string& direction) {
    auto t = copier_->Record(ParseDirection(direction));
    if (!t.ok()) ThrowStatus(t.status());
    return *t;
  }

  bool Query(uint64_t ticket) { return copier_->Query(ticket); }

  void Wait(uint64_t ticket) {
    Status s;
    {
      nb::gil_scoped_release release;
      s = copier_->Wait(ticket);
    }
    if (!s.ok()) ThrowStatus(s);
  }

  void StreamWait(uint64_t ticket, uint64_t stream) {
    Status s = copier_->StreamWait(ticket, static_cast<CudaStreamHandle>(stream));
    if (!s.ok()) ThrowStatus(s);
  }

  bool IsRegistered(uint64_t address, uint64_t bytes) const {
    return copier_->IsRegistered(reinterpret_cast<const void*>(address), bytes);
  }

  std::string Mode() const { return std::string(CudaCopyModeName(copier_->mode())); }
  int Device() const { return copier_->device(); }
  std::string Describe() const { return copier_->Describe(); }

  void Close() {
    nb::gil_scoped_release release;
    copier_.reset();
  }
  CudaCopier& copier() const {
    if (!copier_) throw nb::value_error("kvtier CudaCopier is closed");
    return *copier_;
  }

 private:
  std::unique_ptr<CudaCopier> copier_;
};

}  // namespace
}  // namespace kvtier

NB_MODULE(_kvtier_cuda, m) {
  using kvtier::PyCudaCopier;
  m.doc() = "kvtier CUDA copier: batched host<->GPU copies of scattered KV segments (docs/gpu.md)";
  nb::class_<PyCudaCopier>(m, "CudaCopier")
      .def(nb::init<int, const std::string&, uint32_t, uint32_t>(), "device"_a = 0, "mode"_a = "auto",
           "kernel_threads"_a = 256, "kernel_blocks_per_sm"_a = 4)
      .def(
          "register_host",
          [](PyCudaCopier& c, uint64_t a, uint64_t b) {
            c.copier();
            c.RegisterHost(a, b);
          },
          "address"_a, "bytes"_a)
      .def(
          "is_registered",
          [](PyCudaCopier& c, uint64_t a, uint64_t b) {
            c.copier();
            return c.IsRegistered(a, b);
          },
          "address"_a, "bytes"_a)
      .def(
          "copy_batch",
          [](PyCudaCopier& c, const std::string& d, kvtier::U64Array dst, kvtier::U64Array src, kvtier::U64Array sizes,
             uint64_t stream) {
            c.copier();
            return c.CopyBatch(d, dst, src, sizes, stream);
          },
          "direction"_a, "dst"_a, "src"_a, "sizes"_a, "stream"_a = 0)
      .def(
          "record",
          [](PyCudaCopier& c, const std::string& d) {
            c.copier();
            return c.Record(d);
          },
          "direction"_a)
      .def(
          "query",
          [](PyCudaCopier& c, uint64_t t) {
            c.copier();
            return c.Query(t);
          },
          "ticket"_a)
      .def(
          "wait",
          [](PyCudaCopier& c, uint64_t t) {
            c.copier();
            c.Wait(t);
          },
          "ticket"_a)
      .def(
          "stream_wait",
          [](PyCudaCopier& c, uint64_t t, uint64_t s) {
            c.copier();
            c.StreamWait(t, s);
          },
          "ticket"_a, "stream"_a)
      .def_prop_ro("mode",
                   [](PyCudaCopier& c) {
                     c.copier();
                     return c.Mode();
                   })
      .def_prop_ro("device",
                   [](PyCudaCopier& c) {
                     c.copier();
                     return c.Device();
                   })
      .def("describe",
           [](PyCudaCopier& c) {
             c.copier();
             return c.Describe();
           })
      .def("close", &PyCudaCopier::Close)
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyCudaCopier& c, nb::args) { c.Close(); });
  m.attr("NO_STREAM_DEPENDENCY") = static_cast<uint64_t>(kvtier::kNoCudaStreamDependency);
}
