// kvtier._kvtier: the Python edge of kvtier (docs/python-api.md is the contract).
//
// The only file that sees Python. It converts arguments while holding the GIL, releases the GIL around every call
// into the engine or the pool that may wait or copy, and turns Status values into exceptions afterwards (with the
// GIL held again): kInvalidArgument and kFailedPrecondition -> ValueError, kIoError, kNotFound and kNoSpace ->
// OSError, kTimedOut -> TimeoutError, anything else -> RuntimeError, with Status::ToString() as the message.
//
// Lifetime: PyEngine and PyPool own their C++ object. close() (or the destructor) destroys it; a shared_mutex keeps
// close() from destroying it under a call that runs on another Python thread with the GIL released. close() takes
// the lock exclusively only with the GIL released, and no thread ever waits for the GIL while it holds the lock
// (calls that may wait release the GIL before taking it shared), so the two can never deadlock.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/engine.h"
#include "kvtier/options.h"
#include "kvtier/stats.h"
#include "kvtier/status.h"
#include "layout/chunk_format.h"
#include "policy/job_client.h"
#include "policy/preload_planner.h"
#include "policy/stream_pump.h"
#include "staging/staging_pool.h"
#include "transfer/device_copier.h"
#include "util/thread.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

// --- Errors --------------------------------------------------------------------------------------------------------

// Raises the Python exception for a non-ok status. Call with the GIL held.
[[noreturn]] void ThrowStatus(const Status& s) {
  const std::string msg = s.ToString();
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition: PyErr_SetString(PyExc_ValueError, msg.c_str()); break;
    case StatusCode::kIoError:
    case StatusCode::kNotFound:
    case StatusCode::kNoSpace:
      if (s.error_number() != 0) {
        // OSError(errno, message): Python picks the subclass (FileNotFoundError, ...) and sets .errno.
        PyObject* args = Py_BuildValue("(is)", s.error_number(), msg.c_str());
        PyErr_SetObject(PyExc_OSError, args);
        Py_XDECREF(args);
      } else {
        PyErr_SetString(PyExc_OSError, msg.c_str());
      }
      break;
    case StatusCode::kTimedOut: PyErr_SetString(PyExc_TimeoutError, msg.c_str()); break;
    default: PyErr_SetString(PyExc_RuntimeError, msg.c_str()); break;
  }
  throw nb::python_error();
}

// --- Keys ----------------------------------------------------------------------------------------------------------

ChunkKey KeyFromBytes(const nb::bytes& b) {
  auto key = ChunkKey::FromBytes(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.c_str()), b.size()));
  if (!key.ok()) throw nb::value_error(("bad kvtier key: " + key.status().ToString()).c_str());
  return key.value();
}

std::vector<ChunkKey> KeysFromList(const std::vector<nb::bytes>& list) {
  std::vector<ChunkKey> keys;
  keys.reserve(list.size());
  for (const nb::bytes& b : list) keys.push_back(KeyFromBytes(b));
  return keys;
}

nb::bytes KeyToBytes(const ChunkKey& key) { return nb::bytes(reinterpret_cast<const char*>(key.data()), key.size()); }

// --- Options -------------------------------------------------------------------------------------------------------

// Names and types come from the options schema (OptionSchema(), src/engine/options.cc).

std::string AcceptedOptions() {
  std::string s;
  for (const OptionSpec& spec : OptionSchema()) {
    if (!s.empty()) s += ", ";
    s += spec.name;
  }
  return s;
}

[[noreturn]] void ThrowOptionType(const std::string& name, const char* expected, nb::handle value) {
  const std::string got = nb::cast<std::string>(nb::str(value.type().attr("__name__")));
  throw nb::type_error(("kvtier option '" + name + "' must be " + expected + ", not " + got).c_str());
}

// A Python value as the row's type: TypeError for a value of another type, ValueError for an int out of 64 bits.
OptionValue OptionFromPython(const OptionSpec& spec, nb::handle v) {
  const std::string name = spec.name;
  switch (spec.type) {
    case OptionType::kBool:
      if (!PyBool_Check(v.ptr())) ThrowOptionType(name, "a bool", v);
      return v.ptr() == Py_True;
    case OptionType::kCount:
    case OptionType::kBytes:
    case OptionType::kMode: {
      if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) ThrowOptionType(name, "an int", v);
      const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
      if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();  // OverflowError: negative or wider than 64 bits
        throw nb::value_error(
            ("kvtier option '" + name + "' must be a non-negative int; accepted: " + OptionAccepted(spec)).c_str());
      }
      return static_cast<uint64_t>(x);
    }
    case OptionType::kFraction:
      if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) {
        ThrowOptionType(name, "a float", v);
      }
      return PyFloat_AsDouble(v.ptr());
    case OptionType::kSecret:
      if (PyBytes_Check(v.ptr())) return std::string(PyBytes_AsString(v.ptr()), PyBytes_Size(v.ptr()));
      [[fallthrough]];  // the secret, or "file:<path>"
    default:
      if (!PyUnicode_Check(v.ptr())) ThrowOptionType(name, "a str", v);
      return nb::cast<std::string>(v);
  }
}

const OptionSpec& OptionNamed(nb::handle k) {
  if (!PyUnicode_Check(k.ptr())) throw nb::type_error("kvtier option names must be str");
  const std::string name = nb::cast<std::string>(k);
  const OptionSpec* spec = FindOption(name);
  if (spec == nullptr) {
    throw nb::value_error(("unknown kvtier option '" + name + "'; accepted: " + AcceptedOptions()).c_str());
  }
  return *spec;
}

// ValueError "kvtier option 'name': InvalidArgument: option field: why[; accepted: ...]".
void SetFromPython(EngineOptions* o, const OptionSpec& spec, nb::handle v) {
  if (Status st = SetOption(o, spec, OptionFromPython(spec, v)); !st.ok()) {
    std::string msg = "kvtier option '" + std::string(spec.name) + "': " + st.ToString();
    if (st.message().find("accepted") == std::string::npos) msg += "; accepted: " + OptionAccepted(spec);
    throw nb::value_error(msg.c_str());
  }
}

EngineOptions OptionsFromDict(const nb::dict& d) {
  EngineOptions o;
  bool have_root = false;
  for (auto [k, v] : d) {
    const OptionSpec& spec = OptionNamed(k);
    SetFromPython(&o, spec, v);
    have_root = have_root || std::string_view(spec.name) == "root";
  }
  if (!have_root) throw nb::value_error("kvtier option 'root' is required (an existing, writable directory)");
  return o;
}

nb::object OptionToPython(const OptionValue& v) {
  if (const bool* b = std::get_if<bool>(&v)) return nb::bool_(*b);
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) return nb::int_(*u);
  if (const double* f = std::get_if<double>(&v)) return nb::float_(*f);
  return nb::str(std::get<std::string>(v).c_str());
}

// The schema for Python: one dict per option (name, field, type, default, min, max, choices, vllm_key, accepted, doc).
nb::list OptionSchemaForPython() {
  const EngineOptions defaults;
  nb::list out;
  for (const OptionSpec& s : OptionSchema()) {
    nb::dict row;
    row["name"] = s.name;
    row["field"] = s.field;
    row["type"] = OptionTypeName(s.type);
    row["default"] = OptionToPython(s.get(defaults));
    const bool integral = s.type == OptionType::kCount || s.type == OptionType::kBytes;
    if (integral) {
      row["min"] = nb::int_(static_cast<uint64_t>(s.min));
      row["max"] = s.max >= 18446744073709551615.0 ? nb::int_(std::numeric_limits<uint64_t>::max())
                                                   : nb::int_(static_cast<uint64_t>(s.max));
    } else if (s.type == OptionType::kFraction) {
      row["min"] = nb::float_(s.min);
      row["max"] = nb::float_(s.max);
    } else {
      row["min"] = nb::none();
      row["max"] = nb::none();
    }
    nb::list choices;
    if (s.choices != nullptr) {
      std::string_view rest(s.choices);
      while (true) {
        const size_t bar = rest.find('|');
        choices.append(nb::str(std::string(rest.substr(0, bar)).c_str()));
        if (bar == std::string_view::npos) break;
        rest.remove_prefix(bar + 1);
      }
    }
    row["choices"] = choices;
    row["vllm_key"] = s.vllm_key != nullptr ? nb::object(nb::str(s.vllm_key)) : nb::none();
    row["accepted"] = OptionAccepted(s);
    row["doc"] = s.doc;
    out.append(row);
  }
  return out;
}

// One option checked as the options dict would: TypeError or ValueError naming it, else None.
void CheckOptionFromPython(nb::handle name, nb::handle value) {
  EngineOptions scratch;
  SetFromPython(&scratch, OptionNamed(name), value);
}

// Several options (the others at their defaults): each as check_option, then the rules over several of them.
void CheckOptionsFromPython(const nb::dict& d) {
  EngineOptions o;
  for (auto [k, v] : d) SetFromPython(&o, OptionNamed(k), v);
  if (Status st = CheckOptionCombinations(o); !st.ok()) throw nb::value_error(("kvtier: " + st.ToString()).c_str());
}

// --- Conversions of results ----------------------------------------------------------------------------------------

const char* LocationName(ChunkLocation loc) {
  switch (loc) {
    case ChunkLocation::kAbsent: return "absent";
    case ChunkLocation::kDisk: return "disk";
    case ChunkLocation::kDram: return "dram";
    case ChunkLocation::kPending: return "pending";
  }
  return "absent";
}

const char* PromoteStateName(PromoteState s) {
  switch (s) {
    case PromoteState::kReady: return "ready";
    case PromoteState::kPending: return "pending";
    case PromoteState::kMiss: return "miss";
  }
  return "miss";
}

const char* SlotStateLabel(SlotState s) {
  switch (s) {
    case SlotState::kFree: return "free";
    case SlotState::kFilling: return "filling";
    case SlotState::kReady: return "ready";
    case SlotState::kFailed: return "failed";
  }
  return "free";
}

const char* WaitOutcomeLabel(SlotWaitOutcome w) {
  switch (w) {
    case SlotWaitOutcome::kReady: return "ready";
    case SlotWaitOutcome::kFailed: return "failed";
    case SlotWaitOutcome::kSuperseded: return "superseded";
    case SlotWaitOutcome::kTimedOut: return "timeout";
  }
  return "timeout";
}

nb::dict JobResultToDict(const JobResult& r) {
  nb::dict d;
  d["id"] = r.id;
  d["kind"] = r.kind == JobKind::kLoad ? "load" : "store";
  d["chunks_ok"] = r.chunks_ok;
  nb::list chunks;
  for (const ChunkOutcome& c : r.chunks) {
    nb::dict cd;
    cd["key"] = KeyToBytes(c.key);
    cd["ok"] = c.status.ok();
    cd["error"] = c.status.ok() ? std::string() : c.status.ToString();
    chunks.append(cd);
  }
  d["chunks"] = chunks;
  d["bytes"] = r.bytes;
  d["latency_ns"] = r.latency_ns;
  return d;
}

nb::dict HistogramToDict(const HistogramSnapshot& h) {
  nb::dict d;
  d["count"] = h.count;
  d["sum"] = h.sum_us;
  d["min"] = h.min_us;
  d["max"] = h.max_us;
  d["p50"] = h.p50_us;
  d["p95"] = h.p95_us;
  d["p99"] = h.p99_us;
  return d;
}

nb::dict StatsToDict(const StatsSnapshot& s) {
  nb::dict d;
#define KVTIER_FIELD(f) d[#f] = s.f;
  KVTIER_FIELD(lookups)
  KVTIER_FIELD(lookup_hits_dram)
  KVTIER_FIELD(lookup_hits_disk)
  KVTIER_FIELD(lookup_misses)
  KVTIER_FIELD(declined_loads)
  KVTIER_FIELD(loads_started)
  KVTIER_FIELD(loads_completed)
  KVTIER_FIELD(loads_failed)
  KVTIER_FIELD(chunks_loaded)
  KVTIER_FIELD(stores_started)
  KVTIER_FIELD(stores_completed)
  KVTIER_FIELD(stores_dropped)
  KVTIER_FIELD(stores_deduplicated)
  KVTIER_FIELD(bytes_read)
  KVTIER_FIELD(bytes_written)
  KVTIER_FIELD(bytes_needed)
  KVTIER_FIELD(preload_started)
  KVTIER_FIELD(preload_used)
  KVTIER_FIELD(preload_wasted)
  KVTIER_FIELD(evictions)
  KVTIER_FIELD(evicted_bytes)
  KVTIER_FIELD(corrupt_entries)
  KVTIER_FIELD(other_secret_misses)
  KVTIER_FIELD(io_errors)
  KVTIER_FIELD(timeouts)
  KVTIER_FIELD(enospc_events)
  KVTIER_FIELD(temporaries_swept)
  KVTIER_FIELD(disk_bytes_used)
  KVTIER_FIELD(disk_entries)
  KVTIER_FIELD(pool_slots_in_use)
  KVTIER_FIELD(pool_peak_slots)
  KVTIER_FIELD(dram_entries)
#undef KVTIER_FIELD
  d["read_amplification"] = s.read_amplification();
  d["load_latency_us"] = HistogramToDict(s.load_latency_us);
  d["store_latency_us"] = HistogramToDict(s.store_latency_us);
  d["read_latency_us"] = HistogramToDict(s.read_latency_us);
  d["write_latency_us"] = HistogramToDict(s.write_latency_us);
  return d;
}

// --- Engine --------------------------------------------------------------------------------------------------------

class PyEngine {
 public:
  explicit PyEngine(const nb::dict& options) {
    EngineOptions o = OptionsFromDict(options);
    Result<std::unique_ptr<Engine>> r = Status(StatusCode::kInternal, "not opened");
    {
      nb::gil_scoped_release unlocked;
      r = Engine::Open(o);
    }
    if (!r.ok()) ThrowStatus(r.status());
    engine_ = std::move(r.value());
  }

  ~PyEngine() {
    if (PyGILState_Check()) {
      nb::gil_scoped_release unlocked;
      Close();
    } else {
      Close();
    }
  }

  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // Runs fn(Engine&) with the GIL released and close() held off. Raises ValueError if closed.
  template <typename Fn>
  auto Call(Fn&& fn) {
    bool closed = false;
    using R = decltype(fn(*engine_));
    if constexpr (std::is_void_v<R>) {
      {
        nb::gil_scoped_release unlocked;
        std::shared_lock lock(mu_);
        if (engine_)
          fn(*engine_);
        else
          closed = true;
      }
      if (closed) throw nb::value_error("kvtier Engine is closed");
    } else {
      std::optional<R> out;
      {
        nb::gil_scoped_release unlocked;
        std::shared_lock lock(mu_);
        if (engine_)
          out.emplace(fn(*engine_));
        else
          closed = true;
      }
      if (closed) throw nb::value_error("kvtier Engine is closed");
      return std::move(*out);
    }
  }

  void Close() {
    std::unique_lock lock(mu_);
    {
      std::lock_guard<std::mutex> p(pump_mu_);
      jobs_.reset();  // finishes the jobs submitted (an engine dropped without close still drains its stores)
      pump_.reset();
    }
    planner_.reset();
    engine_.reset();  // waits for in-flight I/O, joins the reactor
  }

  bool stored(const nb::bytes& key) {
    ChunkKey k = KeyFromBytes(key);
    return Call([&](Engine& e) { return e.Stored(k); });
  }

  std::string lookup(const nb::bytes& key) {
    ChunkKey k = KeyFromBytes(key);
    return LocationName(Call([&](Engine& e) { return e.Lookup(k); }));
  }

  size_t lookup_prefix(const std::vector<nb::bytes>& keys) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    return Call([&](Engine& e) { return e.LookupPrefix(ks); });
  }

  std::tuple<std::string, uint32_t, uint32_t> promote(const nb::bytes& key, bool speculative) {
    ChunkKey k = KeyFromBytes(key);
    PromoteResult p = Call([&](Engine& e) { return e.Promote(k, speculative); });
    return {PromoteStateName(p.state), p.ref.slot, p.ref.generation};
  }

  // --- Streamed transfers (policy/stream_pump.h): the vLLM path's loads and stores -----------------------------
  // The pump is made at the first stream, over a second mapping of the engine's own pool (its stream board).
  StreamPump& PumpOf(Engine& e) {
    std::lock_guard<std::mutex> lock(pump_mu_);
    return PumpLocked(e);
  }
  StreamPump& PumpLocked(Engine& e) {
    if (!pump_) {
      auto pool = StagingPool::Attach(e.pool_name());
      if (!pool.ok())
        throw std::runtime_error("kvtier: cannot map the pool's stream board: " + pool.status().message());
      StreamOptions o;
      o.max_window = std::max<uint32_t>(1, 2 * e.options().io_depth);
      pump_ = std::make_unique<StreamPump>(&e, std::move(pool.value()), o);
    }
    return *pump_;
  }
  // Jobs (store, load, wait) go through a JobClient over the same pump (docs/architecture.md, "One data path"): the
  // path vLLM's workers use, with the host copier.
  JobClient& JobsOf(Engine& e) {
    std::lock_guard<std::mutex> lock(pump_mu_);
    if (!jobs_) {
      auto c = JobClient::Create(&e, nullptr, {}, &PumpLocked(e));
      if (!c.ok()) throw std::runtime_error("kvtier: cannot start the job client: " + c.status().message());
      jobs_ = std::move(c.value());
    }
    return *jobs_;
  }
  using StreamTuple = std::tuple<uint64_t, uint32_t, uint32_t, uint32_t>;
  std::optional<StreamTuple> stream_open(const std::vector<nb::bytes>& keys, uint32_t consumers, bool load) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    Result<StreamSpan> r = Call([&](Engine& e) {
      StreamPump& p = PumpOf(e);
      return load ? p.OpenLoad(ks, consumers) : p.OpenStore(ks, consumers);
    });
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kResourceExhausted) return std::nullopt;
      ThrowStatus(r.status());
    }
    return StreamTuple{r->id, r->first_entry, r->count, r->tag};
  }
  std::optional<StreamTuple> stream_open_load(const std::vector<nb::bytes>& keys, uint32_t consumers) {
    return stream_open(keys, consumers, true);
  }
  std::optional<StreamTuple> stream_open_store(const std::vector<nb::bytes>& keys, uint32_t consumers) {
    return stream_open(keys, consumers, false);
  }
  void stream_close(uint64_t id) {
    Call([&](Engine& e) { PumpOf(e).Close(id); });
  }
  std::optional<nb::dict> stream_progress(uint64_t id) {
    auto r = Call([&](Engine& e) { return PumpOf(e).Progress(id); });
    if (!r.ok()) return std::nullopt;
    nb::dict d;
    d["published"] = r->published;
    d["failed"] = r->failed;
    d["skipped"] = r->skipped;
    d["done"] = r->done;
    d["finished"] = r->finished;
    return d;
  }
  nb::dict stream_stats() {
    StreamStats st = Call([&](Engine& e) { return PumpOf(e).stats(); });
    nb::dict d;
    d["loads_opened"] = st.loads_opened;
    d["stores_opened"] = st.stores_opened;
    d["chunks_loaded"] = st.chunks_loaded;
    d["chunks_failed"] = st.chunks_failed;
    d["chunks_stored"] = st.chunks_stored;
    d["chunks_skipped"] = st.chunks_skipped;
    d["slot_waits"] = st.slot_waits;
    d["board_full"] = st.board_full;
    d["peak_window"] = st.peak_window;
    d["open"] = st.open;
    return d;
  }

  // --- Preload planner (R1-R3, src/policy): one per engine, configured once -----------------------------------
  void preload_configure(uint32_t max_inflight, int64_t max_queue_age_ms) {
    Call([&](Engine& e) {
      planner_ = std::make_unique<PreloadPlanner>(&e, PlannerOptions{max_inflight, max_queue_age_ms});
      // Reads advance as they complete, not only once per scheduler step (a step can be a multi-second prefill).
      planner_->StartBackgroundPump(std::chrono::microseconds(1000));
    });
  }
  PreloadPlanner& Planner() {
    if (!planner_) throw nb::value_error("kvtier: preload_configure() was not called");
    return *planner_;
  }
  void preload_enqueue(const std::string& request, const std::vector<nb::bytes>& keys) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    auto& p = Planner();
    Call([&](Engine&) { p.Enqueue(request, ks); });
  }
  void preload_forget(const std::string& request) {
    auto& p = Planner();
    Call([&](Engine&) { p.Forget(request); });
  }
  std::tuple<std::string, uint32_t, uint32_t> preload_demand(const nb::bytes& key) {
    ChunkKey k = KeyFromBytes(key);
    auto& p = Planner();
    PromoteResult r = Call([&](Engine&) { return p.Demand(k); });
    return {PromoteStateName(r.state), r.ref.slot, r.ref.generation};
  }
  void preload_pump() {
    auto& p = Planner();
    Call([&](Engine&) { p.Pump(); });
  }
  nb::dict preload_stats() {
    auto& p = Planner();
    PlannerStats st = Call([&](Engine&) { return p.stats(); });
    nb::dict d;
    d["enqueued"] = st.enqueued;
    d["started"] = st.started;
    d["already_resident"] = st.already_resident;
    d["joined_in_flight"] = st.joined_in_flight;
    d["deferred_for_demand"] = st.deferred_for_demand;
    d["refused_no_room"] = st.refused_no_room;
    d["dropped"] = st.dropped;
    d["demand_promotions"] = st.demand_promotions;
    d["inflight"] = p.inflight();
    d["queued"] = p.queued();
    d["demand_pending"] = p.demand_pending();
    return d;
  }
  std::string residency(const nb::bytes& key) {
    ChunkKey k = KeyFromBytes(key);
    return PromoteStateName(Call([&](Engine& e) { return e.Residency(k); }));
  }

  std::vector<std::tuple<uint32_t, uint32_t>> pin(const std::vector<nb::bytes>& keys) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    auto r = Call([&](Engine& e) { return e.PinResident(ks); });
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound) {
        PyErr_SetString(PyExc_KeyError, r.status().ToString().c_str());
        throw nb::python_error();
      }
      ThrowStatus(r.status());
    }
    std::vector<std::tuple<uint32_t, uint32_t>> out;
    out.reserve(r.value().size());
    for (const SlotRef& ref : r.value()) out.emplace_back(ref.slot, ref.generation);
    return out;
  }

  void unpin(const std::vector<nb::bytes>& keys) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    Call([&](Engine& e) { e.Unpin(ks); });
  }

  std::optional<std::vector<std::optional<std::tuple<uint32_t, uint32_t>>>> reserve_for_store(
      const std::vector<nb::bytes>& keys) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    auto r = Call([&](Engine& e) { return e.ReserveForStore(ks); });
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kResourceExhausted) return std::nullopt;
      ThrowStatus(r.status());
    }
    std::vector<std::optional<std::tuple<uint32_t, uint32_t>>> out;
    out.reserve(r.value().size());
    for (const std::optional<SlotRef>& ref : r.value()) {
      if (ref)
        out.emplace_back(std::make_tuple(ref->slot, ref->generation));
      else
        out.emplace_back(std::nullopt);
    }
    return out;
  }

  void commit_store(const std::vector<nb::bytes>& keys, bool success) {
    std::vector<ChunkKey> ks = KeysFromList(keys);
    Call([&](Engine& e) { e.CommitStore(ks, success); });
  }

  uint64_t store(const std::vector<std::tuple<nb::bytes, uint64_t>>& items) {
    const auto [stride, bpc, block_bytes] = Geometry();
    std::vector<ChunkTransfer> chunks;
    chunks.reserve(items.size());
    for (const auto& [key, address] : items) {
      ChunkTransfer t;
      t.key = KeyFromBytes(key);
      t.num_blocks = 0;
      for (uint32_t b = 0; b < bpc; ++b) t.segments.push_back({b * stride, address + b * block_bytes, block_bytes});
      chunks.push_back(std::move(t));
    }
    auto r = Call([&](Engine& e) { return JobsOf(e).SubmitStore(std::move(chunks)); });
    if (!r.ok()) ThrowStatus(r.status());
    return r.value();
  }

  uint64_t load(const std::vector<std::tuple<nb::bytes, uint32_t, uint32_t, uint64_t>>& items) {
    const auto [stride, bpc, block_bytes] = Geometry();
    std::vector<ChunkTransfer> chunks;
    chunks.reserve(items.size());
    for (const auto& [key, first_block, num_blocks, address] : items) {
      ChunkTransfer t;
      t.key = KeyFromBytes(key);
      t.first_block = first_block;
      t.num_blocks = num_blocks;
      // Out-of-range requests get no segments here; JobClient::SubmitLoad refuses their block range with a clear
      // message.
      const uint32_t n = num_blocks ? num_blocks : (first_block < bpc ? bpc - first_block : 0);
      if (first_block < bpc && n <= bpc - first_block) {
        for (uint32_t b = 0; b < n; ++b) t.segments.push_back({b * stride, address + b * block_bytes, block_bytes});
      }
      chunks.push_back(std::move(t));
    }
    auto r = Call([&](Engine& e) { return JobsOf(e).SubmitLoad(std::move(chunks)); });
    if (!r.ok()) ThrowStatus(r.status());
    return r.value();
  }

  nb::dict wait(uint64_t job_id, int64_t timeout_ms) {
    auto r = Call([&](Engine& e) { return JobsOf(e).Wait(job_id, timeout_ms); });
    if (!r.ok()) ThrowStatus(r.status());
    return JobResultToDict(r.value());
  }

  nb::dict stats() {
    return StatsToDict(Call([](Engine& e) { return e.Stats(); }));
  }

  std::string stats_prometheus(const std::string& prefix) {
    return Call([&](Engine& e) { return e.Stats().ToPrometheus(prefix); });
  }

  std::string describe() {
    return Call([](Engine& e) { return e.Describe(); });
  }

  bool shared_root() {
    return Call([](Engine& e) { return e.shared_root(); });
  }

  uint64_t evict_to_budget() {
    auto r = Call([](Engine& e) { return e.EvictToBudget(); });
    if (!r.ok()) ThrowStatus(r.status());
    return r.value();
  }

  void close() {
    nb::gil_scoped_release unlocked;
    Close();
  }

  // (block stride, blocks per chunk, block bytes): how a chunk's contiguous host bytes map onto a slot payload.
  std::tuple<uint64_t, uint32_t, uint64_t> Geometry() {
    return Call([](Engine& e) {
      return std::make_tuple(e.block_stride(), e.options().identity.blocks_per_chunk, e.options().identity.block_bytes);
    });
  }

  std::string pool_name() {
    return Call([](Engine& e) { return e.pool_name(); });
  }
  uint64_t block_stride() {
    return Call([](Engine& e) { return e.block_stride(); });
  }
  uint64_t chunk_payload_bytes() {
    return Call([](Engine& e) { return e.chunk_payload_bytes(); });
  }
  // Slots unused preloads may hold at most (R2; Engine::max_unused_preloads).
  uint32_t preload_room() {
    return Call([](Engine& e) { return e.max_unused_preloads(); });
  }
  // Slots one stream (or, with streaming off, one request's verified promotions) holds at most: 2 x io_depth, and
  // never more than the pool (policy/stream_pump.h).
  uint32_t stream_window() {
    return Call([](Engine& e) {
      const uint64_t slots = e.options().pool_bytes / (kvtier::kHeaderBytes + e.chunk_payload_bytes());
      return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(2ull * e.options().io_depth, slots)));
    });
  }

 private:
  std::shared_mutex mu_;
  std::unique_ptr<Engine> engine_;           // null once closed
  std::unique_ptr<PreloadPlanner> planner_;  // null until preload_configure; reset before engine_
  std::mutex pump_mu_;
  std::unique_ptr<StreamPump> pump_;  // null until the first stream; reset before engine_
  std::unique_ptr<JobClient> jobs_;   // null until the first job; over pump_, reset before it
};

// --- Pool ----------------------------------------------------------------------------------------------------------

class PyPool {
 public:
  explicit PyPool(std::unique_ptr<StagingPool> pool) : pool_(std::move(pool)) {}

  static std::unique_ptr<PyPool> attach(const std::string& name) {
    Result<std::unique_ptr<StagingPool>> r = Status(StatusCode::kInternal, "not attached");
    {
      nb::gil_scoped_release unlocked;
      r = StagingPool::Attach(name);
    }
    if (!r.ok()) ThrowStatus(r.status());
    return std::make_unique<PyPool>(std::move(r.value()));
  }

  // Geometry and observation are lock-free reads of the mapping; they hold the lock only to keep close() off.
  StagingPool& Get() {
    if (!pool_) throw nb::value_error("kvtier Pool is closed");
    return *pool_;
  }

  uint32_t num_slots() {
    std::shared_lock lock(mu_);
    return Get().num_slots();
  }
  uint64_t slot_stride() {
    std::shared_lock lock(mu_);
    return Get().slot_stride();
  }
  uint64_t base_address() {
    std::shared_lock lock(mu_);
    return reinterpret_cast<uintptr_t>(Get().base());
  }
  uint64_t mapped_bytes() {
    std::shared_lock lock(mu_);
    return Get().mapped_bytes();
  }

  void CheckSlot(StagingPool& p, int64_t slot) {
    if (slot < 0 || slot >= static_cast<int64_t>(p.num_slots())) {
      throw nb::index_error(
          ("slot " + std::to_string(slot) + " outside a pool of " + std::to_string(p.num_slots()) + " slots").c_str());
    }
  }

  uint64_t slot_address(int64_t slot) {
    std::shared_lock lock(mu_);
    StagingPool& p = Get();
    CheckSlot(p, slot);
    return reinterpret_cast<uintptr_t>(p.SlotData(static_cast<uint32_t>(slot)));
  }

  std::tuple<uint32_t, std::string> observe(int64_t slot) {
    std::shared_lock lock(mu_);
    StagingPool& p = Get();
    CheckSlot(p, slot);
    SlotView v = p.Observe(static_cast<uint32_t>(slot));
    return {v.generation, SlotStateLabel(v.state)};
  }

  std::string wait_ready(int64_t slot, uint32_t generation, double timeout_s) {
    {
      std::shared_lock lock(mu_);
      CheckSlot(Get(), slot);
    }
    if (!(timeout_s >= 0)) throw nb::value_error("timeout_s must be >= 0");
    const auto timeout = std::chrono::nanoseconds(static_cast<int64_t>(std::min(timeout_s, 1e9) * 1e9));
    bool closed = false;
    SlotWaitOutcome w = SlotWaitOutcome::kTimedOut;
    {
      nb::gil_scoped_release unlocked;
      std::shared_lock lock(mu_);
      if (pool_)
        w = pool_->WaitReady(static_cast<uint32_t>(slot), generation, timeout);
      else
        closed = true;
    }
    if (closed) throw nb::value_error("kvtier Pool is closed");
    return WaitOutcomeLabel(w);
  }

  // --- Stream board (staging_pool.h): a consumer's side of streamed transfers ---
  uint32_t stream_entries() {
    std::shared_lock lock(mu_);
    return Get().stream_entries();
  }
  void CheckEntries(StagingPool& p, int64_t first, int64_t count) {
    if (first < 0 || count < 0 || first + count > static_cast<int64_t>(p.stream_entries())) {
      throw nb::index_error(("entries [" + std::to_string(first) + ", +" + std::to_string(count) +
                             ") outside a board of " + std::to_string(p.stream_entries()))
                                .c_str());
    }
  }
  // count entries from first, packed as 4 uint32 each: tag, state (StreamEntryState), slot, generation.
  nb::bytes observe_entries(int64_t first, int64_t count) {
    std::shared_lock lock(mu_);
    StagingPool& p = Get();
    CheckEntries(p, first, count);
    std::vector<uint32_t> out(static_cast<size_t>(count) * 4);
    for (int64_t i = 0; i < count; ++i) {
      StreamEntryView v = p.ObserveEntry(static_cast<uint32_t>(first + i));
      out[i * 4] = v.tag;
      out[i * 4 + 1] = static_cast<uint32_t>(v.state);
      out[i * 4 + 2] = v.slot;
      out[i * 4 + 3] = v.generation;
    }
    return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(uint32_t));
  }
  bool ack_entry(int64_t entry, uint32_t tag) {
    std::shared_lock lock(mu_);
    StagingPool& p = Get();
    CheckEntries(p, entry, 1);
    return p.AckEntry(static_cast<uint32_t>(entry), tag);
  }
  uint32_t worker_bell() {
    std::shared_lock lock(mu_);
    return Get().WorkerBell();
  }
  void wait_worker_bell(uint32_t seen, double timeout_s) {
    if (!(timeout_s >= 0)) throw nb::value_error("timeout_s must be >= 0");
    const auto timeout = std::chrono::nanoseconds(static_cast<int64_t>(std::min(timeout_s, 60.0) * 1e9));
    nb::gil_scoped_release unlocked;
    std::shared_lock lock(mu_);
    if (pool_) pool_->WaitWorkerBell(seen, timeout);
  }

  void close() {
    nb::gil_scoped_release unlocked;
    std::unique_lock lock(mu_);
    pool_.reset();
  }

 private:
  std::shared_mutex mu_;
  std::unique_ptr<StagingPool> pool_;  // null once closed
};

// --- copy_batch ----------------------------------------------------------------------------------------------------

// Read-only views: the arrays hold addresses and sizes, only read here (so read-only arrays are accepted too).
using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;

void CheckU64Vector(const AnyArray& a, const char* name) {
  if (a.dtype() != nb::dtype<uint64_t>()) {
    throw nb::type_error((std::string("copy_batch: ") + name + " must be a numpy array of dtype uint64").c_str());
  }
  if (a.ndim() != 1) {
    throw nb::value_error((std::string("copy_batch: ") + name + " must be one-dimensional, not " +
                           std::to_string(a.ndim()) + "-dimensional")
                              .c_str());
  }
}

uint64_t At(const AnyArray& a, size_t i) {
  return static_cast<const uint64_t*>(a.data())[static_cast<int64_t>(i) * a.stride(0)];
}

// direction: "h2d" (a load: out of pool slots into KV memory), "d2h" (a store: into pool slots), "" (plain memcpy).
// Loads and stores copy as the engine's host copier does (HostCopy, HostCopierStreams: streaming stores out of the
// slots of a load of at least a quarter of the last-level cache), so `kvtier bench io` measures this path too.
uint64_t CopyBatch(const AnyArray& dst, const AnyArray& src, const AnyArray& sizes, int threads,
                   const std::string& direction) {
  if (direction != "h2d" && direction != "d2h" && !direction.empty()) {
    throw nb::value_error(("copy_batch: direction must be 'h2d', 'd2h' or '', not '" + direction + "'").c_str());
  }
  CheckU64Vector(dst, "dst");
  CheckU64Vector(src, "src");
  CheckU64Vector(sizes, "sizes");
  const size_t n = dst.shape(0);
  if (src.shape(0) != n || sizes.shape(0) != n) {
    throw nb::value_error(("copy_batch: dst, src and sizes must have equal lengths (got " + std::to_string(n) + ", " +
                           std::to_string(src.shape(0)) + ", " + std::to_string(sizes.shape(0)) + ")")
                              .c_str());
  }
  if (threads < 1) throw nb::value_error("copy_batch: threads must be >= 1");
  struct Copy {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t bytes;
  };
  std::vector<Copy> copies;
  copies.reserve(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bytes = At(sizes, i);
    if (bytes == 0) continue;
    const uint64_t d = At(dst, i), s = At(src, i);
    if (d == 0 || s == 0) {
      throw nb::value_error(("copy_batch: null address at index " + std::to_string(i)).c_str());
    }
    copies.push_back({reinterpret_cast<uint8_t*>(d), reinterpret_cast<const uint8_t*>(s), bytes});
    total += bytes;
  }
  const CopyDirection dir = direction == "h2d" ? CopyDirection::kSlotToDevice : CopyDirection::kDeviceToSlot;
  const bool stream = direction == "h2d" && HostCopierStreams(0, total);
  nb::gil_scoped_release unlocked;
  const size_t workers = std::min<size_t>(static_cast<size_t>(threads), copies.size());
  if (workers <= 1) {
    for (const Copy& c : copies) HostCopy(dir, c.dst, c.src, c.bytes, stream);
    return total;
  }
  // Split by bytes, not by count: worker w copies the byte range [w*total/workers, (w+1)*total/workers) of the
  // concatenated copies, so one large copy among small ones is shared too.
  auto run = [&](size_t w) {
    const uint64_t begin = total * w / workers, end = total * (w + 1) / workers;
    uint64_t pos = 0;
    for (const Copy& c : copies) {
      const uint64_t lo = std::max(pos, begin), hi = std::min(pos + c.bytes, end);
      if (lo < hi) HostCopy(dir, c.dst + (lo - pos), c.src + (lo - pos), hi - lo, stream);
      pos += c.bytes;
      if (pos >= end) break;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) pool.push_back(StartThread(run, w));
  run(0);
  for (std::thread& t : pool) t.join();
  return total;
}

}  // namespace
}  // namespace kvtier

NB_MODULE(_kvtier, m) {
  using kvtier::PyEngine;
  using kvtier::PyPool;
  m.doc() = "kvtier: external KV cache engine for vLLM (see docs/python-api.md)";
  m.attr("HEADER_BYTES") = kvtier::kHeaderBytes;

  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const nb::dict&>(), "options"_a)
      .def("lookup", &PyEngine::lookup, "key"_a)
      .def("lookup_prefix", &PyEngine::lookup_prefix, "keys"_a)
      .def("promote", &PyEngine::promote, "key"_a, "speculative"_a = false)
      .def("preload_configure", &PyEngine::preload_configure, "max_inflight"_a = 1, "max_queue_age_ms"_a = 0)
      .def("preload_enqueue", &PyEngine::preload_enqueue, "request"_a, "keys"_a)
      .def("preload_forget", &PyEngine::preload_forget, "request"_a)
      .def("preload_demand", &PyEngine::preload_demand, "key"_a)
      .def("preload_pump", &PyEngine::preload_pump)
      .def("preload_stats", &PyEngine::preload_stats)
      .def("residency", &PyEngine::residency, "key"_a)
      .def("pin", &PyEngine::pin, "keys"_a)
      .def("unpin", &PyEngine::unpin, "keys"_a)
      .def("stream_open_load", &PyEngine::stream_open_load, "keys"_a, "consumers"_a = 1)
      .def("stream_open_store", &PyEngine::stream_open_store, "keys"_a, "consumers"_a = 1)
      .def("stream_close", &PyEngine::stream_close, "stream_id"_a)
      .def("stream_progress", &PyEngine::stream_progress, "stream_id"_a)
      .def("stream_stats", &PyEngine::stream_stats)
      .def(
          "stored", [](PyEngine& self, const nb::bytes& key) { return self.stored(key); }, "key"_a)
      .def("reserve_for_store", &PyEngine::reserve_for_store, "keys"_a)
      .def("commit_store", &PyEngine::commit_store, "keys"_a, "success"_a)
      .def("store", &PyEngine::store, "items"_a)
      .def("load", &PyEngine::load, "items"_a)
      .def("wait", &PyEngine::wait, "job_id"_a, "timeout_ms"_a = 60000)
      .def("stats", &PyEngine::stats)
      .def("stats_prometheus", &PyEngine::stats_prometheus, "prefix"_a = "kvtier_")
      .def("describe", &PyEngine::describe)
      .def("shared_root", &PyEngine::shared_root)
      .def("evict_to_budget", &PyEngine::evict_to_budget)
      .def("close", &PyEngine::close)
      .def(
          "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
      .def("__exit__", [](PyEngine& self, nb::args) { self.close(); })
      .def_prop_ro("pool_name", &PyEngine::pool_name)
      .def_prop_ro("block_stride", &PyEngine::block_stride)
      .def_prop_ro("chunk_payload_bytes", &PyEngine::chunk_payload_bytes)
      .def_prop_ro("stream_window", &PyEngine::stream_window)
      .def_prop_ro("preload_room", &PyEngine::preload_room)
      .def_prop_ro("payload_offset", [](PyEngine&) { return kvtier::kHeaderBytes; });

  nb::class_<PyPool>(m, "Pool")
      .def_static("attach", &PyPool::attach, "name"_a)
      .def_prop_ro("num_slots", &PyPool::num_slots)
      .def_prop_ro("slot_stride", &PyPool::slot_stride)
      .def_prop_ro("base_address", &PyPool::base_address)
      .def_prop_ro("mapped_bytes", &PyPool::mapped_bytes)
      .def("slot_address", &PyPool::slot_address, "slot"_a)
      .def("observe", &PyPool::observe, "slot"_a)
      .def("wait_ready", &PyPool::wait_ready, "slot"_a, "generation"_a, "timeout_s"_a)
      .def_prop_ro("stream_entries", &PyPool::stream_entries)
      .def("observe_entries", &PyPool::observe_entries, "first"_a, "count"_a)
      .def("ack_entry", &PyPool::ack_entry, "entry"_a, "tag"_a)
      .def("worker_bell", &PyPool::worker_bell)
      .def("wait_worker_bell", &PyPool::wait_worker_bell, "seen"_a, "timeout_s"_a)
      .def("close", &PyPool::close)
      .def(
          "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
      .def("__exit__", [](PyPool& self, nb::args) { self.close(); });

  m.def("option_schema", &kvtier::OptionSchemaForPython,
        "The engine's options schema: one dict per option (name, field, type, default, min, max, choices, vllm_key, "
        "accepted, doc), from src/engine/options.cc.");
  m.def("check_option", &kvtier::CheckOptionFromPython, "name"_a, "value"_a,
        "Checks one option as Engine(options) would: TypeError or ValueError naming it, else None.");
  m.def("check_options", &kvtier::CheckOptionsFromPython, "options"_a,
        "Checks options as Engine(options) would, without the required ones (root, identity): each value, then the "
        "rules over several (low_watermark <= high_watermark); TypeError or ValueError naming them, else None.");
  m.def("copy_batch", &kvtier::CopyBatch, "dst"_a, "src"_a, "sizes"_a, "threads"_a = 1, "direction"_a = "",
        "Copies sizes[i] bytes from src[i] to dst[i] for every i (1-D uint64 arrays of addresses and sizes), GIL "
        "released, split over `threads` threads; returns the bytes copied. direction 'h2d' (out of pool slots, a "
        "load) or 'd2h' (into pool slots, a store) copies as the engine's host copier does (streaming stores out of "
        "the slots of a large load); '' is plain memcpy.");
}
