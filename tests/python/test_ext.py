"""Tests of the kvtier Python extension (docs/python-api.md): options, host store/load, lookup states, the slot-resident
path seen from worker processes (multiprocessing spawn), copy_batch, stats, lifetime, and the console script."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import kvtier

BLOCKS = 4
BLOCK_BYTES = 8192 + 100  # not a multiple of 4096: the slot stride is padded
SLOT_BYTES = 4096 + BLOCKS * 12288


def options(root, **extra):
    o = {
        "root": str(root),
        "model": "test-model",
        "revision": "r1",
        "kv_dtype": "bfloat16",
        "tokens_per_chunk": 64,
        "blocks_per_chunk": BLOCKS,
        "block_bytes": BLOCK_BYTES,
        "pool_bytes": 16 * SLOT_BYTES,
        "backend": "posix",
        "io_mode": "buffered",
    }
    o.update(extra)
    return o


def key(i: int) -> bytes:
    return i.to_bytes(4, "little") * 8  # 32 bytes, like vLLM's block hashes


def chunk_bytes(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCKS * BLOCK_BYTES, dtype=np.uint8)


def address(a: np.ndarray) -> int:
    return a.ctypes.data


def run_job(engine, job_id):
    r = engine.wait(job_id, 30000)
    assert r["id"] == job_id
    return r


def store(engine, chunks: dict[int, np.ndarray]):
    r = run_job(engine, engine.store([(key(i), address(a)) for i, a in chunks.items()]))
    assert r["kind"] == "store"
    assert r["chunks_ok"] == len(chunks), r
    return r


def promote_ready(engine, k: bytes):
    for _ in range(1000):
        state, slot, gen = engine.promote(k)
        if state != "pending":
            break
        import time

        time.sleep(0.002)
    assert state == "ready"
    return slot, gen


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "root"
    d.mkdir()
    return d


@pytest.fixture
def engine(root):
    with kvtier.Engine(options(root)) as e:
        yield e


# --- Options ---------------------------------------------------------------------------------------------------------


def test_reactors_option_sets_the_engines_reactor_count(root):
    with kvtier.Engine(options(root, reactors=3)) as e:
        assert "reactors 3 (by option" in e.describe()
    with pytest.raises(ValueError, match="reactors"):
        kvtier.Engine(options(root, reactors=65))


def test_unknown_option_is_a_value_error_naming_it_and_the_accepted_ones(root):
    with pytest.raises(ValueError, match=r"unknown kvtier option 'pool_size'; accepted: root, model"):
        kvtier.Engine(options(root, pool_size=1))


@pytest.mark.parametrize(
    "name,value",
    [("block_bytes", "8192"), ("root", 3), ("fsync_on_publish", 1), ("io_depth", True), ("high_watermark", "x"),
     ("io_depth", 1.5)],
)
def test_an_option_of_the_wrong_type_is_a_type_error_naming_it(root, name, value):
    with pytest.raises(TypeError, match=f"'{name}'"):
        kvtier.Engine(options(root, **{name: value}))


def test_bad_option_values_are_value_errors(root):
    with pytest.raises(ValueError, match="'backend'"):
        kvtier.Engine(options(root, backend="spdk"))
    with pytest.raises(ValueError, match="'io_mode'"):
        kvtier.Engine(options(root, io_mode="raw"))
    with pytest.raises(ValueError, match="'io_depth'"):
        kvtier.Engine(options(root, io_depth=-1))
    with pytest.raises(ValueError, match="'tp_size'"):
        kvtier.Engine(options(root, tp_size=2**32))
    with pytest.raises(ValueError, match="InvalidArgument"):
        kvtier.Engine(options(root, blocks_per_chunk=0))
    o = options(root)
    del o["root"]
    with pytest.raises(ValueError, match="'root' is required"):
        kvtier.Engine(o)


def test_a_missing_root_is_an_os_error(tmp_path):
    with pytest.raises((OSError, ValueError), match="does-not-exist"):
        kvtier.Engine(options(tmp_path / "does-not-exist"))


def test_another_identity_on_the_same_root_is_refused_or_namespaced(root):
    # Either a separate namespace or a refusal: never the other identity's bytes.
    with kvtier.Engine(options(root)) as e:
        a = chunk_bytes(1)
        store(e, {0: a})
    with kvtier.Engine(options(root, revision="r2")) as e:
        assert e.lookup(key(0)) == "absent"


# --- Host path ----------------------------------------------------------------------------------------------------------


def test_store_then_load_round_trips_through_host_buffers(engine):
    src = {i: chunk_bytes(i) for i in range(3)}
    r = store(engine, src)
    assert r["bytes"] >= 3 * BLOCKS * BLOCK_BYTES
    dst = {i: np.zeros(BLOCKS * BLOCK_BYTES, np.uint8) for i in range(3)}
    r = run_job(engine, engine.load([(key(i), 0, BLOCKS, address(dst[i])) for i in range(3)]))
    assert r["kind"] == "load" and r["chunks_ok"] == 3
    assert [c["key"] for c in r["chunks"]] == [key(i) for i in range(3)]
    assert all(c["ok"] and c["error"] == "" for c in r["chunks"])
    assert r["latency_ns"] > 0
    for i in range(3):
        np.testing.assert_array_equal(dst[i], src[i])


def test_a_partial_load_reads_only_the_blocks_asked_for(engine):
    src = chunk_bytes(7)
    store(engine, {0: src})
    dst = np.zeros(2 * BLOCK_BYTES, np.uint8)
    r = run_job(engine, engine.load([(key(0), 1, 2, address(dst))]))
    assert r["chunks_ok"] == 1
    np.testing.assert_array_equal(dst, src[BLOCK_BYTES : 3 * BLOCK_BYTES])
    tail = np.zeros(3 * BLOCK_BYTES, np.uint8)
    assert run_job(engine, engine.load([(key(0), 1, 0, address(tail))]))["chunks_ok"] == 1  # 0: to the end
    np.testing.assert_array_equal(tail, src[BLOCK_BYTES:])


def test_loading_an_absent_chunk_is_a_miss_not_an_error(engine):
    dst = np.zeros(BLOCKS * BLOCK_BYTES, np.uint8)
    r = run_job(engine, engine.load([(key(99), 0, BLOCKS, address(dst))]))
    assert r["chunks_ok"] == 0
    assert r["chunks"][0]["ok"] is False and r["chunks"][0]["error"]


def test_bad_requests_raise(engine):
    buf = np.zeros(BLOCKS * BLOCK_BYTES, np.uint8)
    with pytest.raises(ValueError, match="block range"):
        engine.load([(key(0), BLOCKS, 1, address(buf))])
    with pytest.raises(ValueError, match="key"):
        engine.load([(b"", 0, 1, address(buf))])
    with pytest.raises(ValueError, match="key"):
        engine.lookup(b"x" * 65)
    with pytest.raises(TypeError):
        engine.lookup("not-bytes")
    with pytest.raises(OSError):
        engine.wait(123456, 10)


def test_lookup_states_and_prefix(root):
    with kvtier.Engine(options(root)) as first:
        assert first.lookup(key(0)) == "absent"
        store(first, {0: chunk_bytes(0), 1: chunk_bytes(1)})
        assert first.lookup(key(0)) == "dram"  # a store through the slot path stays resident (write-through, T1)
    with kvtier.Engine(options(root)) as engine:
        assert engine.lookup(key(0)) == "disk"
        assert engine.lookup_prefix([key(0), key(1), key(2), key(0)]) == 2
        assert engine.lookup_prefix([]) == 0
        promote_ready(engine, key(0))
        assert engine.lookup(key(0)) == "dram"
        reserved = engine.reserve_for_store([key(5)])
        assert reserved is not None and reserved[0] is not None
        assert engine.lookup(key(5)) == "pending"
        engine.commit_store([key(5)], False)
        assert engine.lookup(key(5)) == "absent"


# --- Slot-resident path, seen from worker processes --------------------------------------------------------------------


def _worker_read_slot(pool_name: str, slot: int, generation: int, stride: int) -> list[bytes]:
    import kvtier

    with kvtier.Pool.attach(pool_name) as pool:
        assert pool.wait_ready(slot, generation, 5.0) == "ready"
        assert pool.observe(slot) == (generation, "ready")
        payload = pool.slot_address(slot) + kvtier.HEADER_BYTES
        return [ctypes.string_at(payload + b * stride, BLOCK_BYTES) for b in range(BLOCKS)]


def _worker_fill_slots(pool_name: str, slots: list[int], stride: int, seeds: list[int]) -> None:
    import kvtier

    pool = kvtier.Pool.attach(pool_name)
    for slot, seed in zip(slots, seeds):
        data = chunk_bytes(seed)
        payload = pool.slot_address(slot) + kvtier.HEADER_BYTES
        for b in range(BLOCKS):
            ctypes.memmove(payload + b * stride, address(data) + b * BLOCK_BYTES, BLOCK_BYTES)
    pool.close()
    pool.close()


def spawn():
    return multiprocessing.get_context("spawn")


def test_a_promoted_chunk_is_read_from_its_slot_by_a_spawned_worker(engine):
    src = chunk_bytes(42)
    store(engine, {0: src})
    slot, gen = promote_ready(engine, key(0))
    assert engine.pin([key(0)]) == [(slot, gen)]
    with spawn().Pool(1) as workers:
        blocks = workers.apply(_worker_read_slot, (engine.pool_name, slot, gen, engine.block_stride))
    engine.unpin([key(0)])
    assert b"".join(blocks) == src.tobytes()


def test_worker_filled_slots_are_published_and_served_after_a_restart(root):
    with kvtier.Engine(options(root)) as e:
        keys = [key(0), key(1)]
        reserved = e.reserve_for_store(keys)
        assert reserved is not None and all(r is not None for r in reserved)
        with spawn().Pool(1) as workers:
            workers.apply(_worker_fill_slots, (e.pool_name, [r[0] for r in reserved], e.block_stride, [10, 11]))
        e.commit_store(keys, True)
        assert e.lookup(key(0)) == "dram"
        assert e.reserve_for_store(keys) == [None, None]  # already resident: nothing to write
    with kvtier.Engine(options(root)) as e:
        dst = [np.zeros(BLOCKS * BLOCK_BYTES, np.uint8) for _ in range(2)]
        r = run_job(e, e.load([(key(i), 0, BLOCKS, address(dst[i])) for i in range(2)]))
        assert r["chunks_ok"] == 2
        np.testing.assert_array_equal(dst[0], chunk_bytes(10))
        np.testing.assert_array_equal(dst[1], chunk_bytes(11))


def test_pin_of_a_chunk_that_is_not_resident_is_a_key_error(root):
    with kvtier.Engine(options(root)) as e:
        store(e, {0: chunk_bytes(0)})
    with kvtier.Engine(options(root)) as e:  # on disk, not resident
        with pytest.raises(KeyError):
            e.pin([key(0)])


def test_a_reservation_larger_than_the_pool_returns_none(root):
    with kvtier.Engine(options(root, pool_bytes=4 * SLOT_BYTES)) as e:
        assert e.reserve_for_store([key(i) for i in range(5)]) is None
        assert e.stats()["pool_slots_in_use"] == 0


def test_pool_geometry_and_errors(engine):
    with kvtier.Pool.attach(engine.pool_name) as pool:
        assert pool.num_slots == 16
        assert pool.slot_stride >= 4096 + BLOCKS * engine.block_stride
        assert engine.chunk_payload_bytes == BLOCKS * engine.block_stride
        assert engine.payload_offset == kvtier.HEADER_BYTES == 4096
        assert pool.base_address <= pool.slot_address(0) < pool.base_address + pool.mapped_bytes
        assert pool.slot_address(1) - pool.slot_address(0) == pool.slot_stride
        assert pool.observe(3)[1] == "free"
        assert pool.wait_ready(3, 12345, 0.01) in ("superseded", "timeout")
        with pytest.raises(IndexError):
            pool.slot_address(16)
        with pytest.raises(IndexError):
            pool.observe(-1)
    with pytest.raises(ValueError, match="closed"):
        pool.observe(0)
    with pytest.raises(OSError):
        kvtier.Pool.attach("/kvtier-no-such-pool")


# --- copy_batch ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["", "h2d", "d2h"])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_copy_batch_copies_every_range(threads, direction):
    rng = np.random.default_rng(threads)
    src = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    sizes = np.array([1, 0, 4096, 100_000, 7, 500_000], dtype=np.uint64)
    src_off = np.array([0, 10, 20, 30_000, 200_000, 300_000], dtype=np.uint64)
    dst_off = np.array([900_000, 0, 1, 5000, 110_000, 120_000], dtype=np.uint64)
    copied = kvtier.copy_batch(dst_off + address(dst), src_off + address(src), sizes, threads=threads,
                               direction=direction)
    assert copied == int(sizes.sum())
    expected = np.zeros_like(src)
    for d, s, n in zip(dst_off, src_off, sizes):
        expected[d : d + n] = src[s : s + n]
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.parametrize("threads", [1, 3])
def test_copy_batch_of_a_large_load_copies_every_byte(threads):
    """A load (h2d) of 64 MiB in all is above the host copier's streaming threshold (a quarter of the last-level
    cache) on any machine we run on: the streaming path, with unaligned starts and odd lengths, copies exactly."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, 64 << 20, dtype=np.uint8)
    dst = np.zeros(len(src) + 4096, np.uint8)
    sizes = np.array([(32 << 20) + 13, 4095, (32 << 20) - 4095 - 13 - 100], dtype=np.uint64)
    src_off = np.array([0, (32 << 20) + 13, (32 << 20) + 13 + 4095], dtype=np.uint64)
    dst_off = src_off + np.uint64(7)
    copied = kvtier.copy_batch(dst_off + address(dst), src_off + address(src), sizes, threads=threads,
                               direction="h2d")
    assert copied == int(sizes.sum())
    n = int(sizes.sum())
    np.testing.assert_array_equal(dst[7:7 + n], src[:n])
    assert not dst[:7].any() and not dst[7 + n:].any()


def test_copy_batch_of_nothing_copies_nothing():
    empty = np.zeros(0, np.uint64)
    assert kvtier.copy_batch(empty, empty, empty, threads=4) == 0


def test_copy_batch_validates_its_arguments():
    a = np.zeros(2, np.uint64)
    with pytest.raises(TypeError, match="dtype uint64"):
        kvtier.copy_batch(a.astype(np.int64), a, a)
    with pytest.raises(TypeError):
        kvtier.copy_batch([0, 0], a, a)
    with pytest.raises(ValueError, match="equal lengths"):
        kvtier.copy_batch(a, a, np.zeros(3, np.uint64))
    with pytest.raises(ValueError, match="threads"):
        kvtier.copy_batch(a, a, a, threads=0)
    with pytest.raises(ValueError, match="null address"):
        kvtier.copy_batch(a, a, np.ones(2, np.uint64))
    with pytest.raises(ValueError, match="direction"):
        kvtier.copy_batch(a, a, a, direction="sideways")


# --- Stats, lifetime, CLI -------------------------------------------------------------------------------------------------


def test_stats_has_every_field_and_counts_work(engine):
    store(engine, {0: chunk_bytes(0)})
    engine.lookup(key(0))
    s = engine.stats()
    for name in ["lookups", "lookup_hits_dram", "lookup_hits_disk", "lookup_misses", "declined_loads",
                 "loads_started", "loads_completed", "loads_failed", "chunks_loaded", "stores_started",
                 "stores_completed", "stores_dropped", "stores_deduplicated", "bytes_read", "bytes_written",
                 "bytes_needed", "preload_started", "preload_used", "preload_wasted", "evictions", "evicted_bytes",
                 "corrupt_entries", "other_secret_misses", "io_errors", "timeouts", "enospc_events",
                 "temporaries_swept",
                 "disk_bytes_used", "disk_entries", "pool_slots_in_use", "pool_peak_slots", "dram_entries",
                 "read_amplification"]:
        assert name in s, name
    for h in ["load_latency_us", "store_latency_us", "read_latency_us", "write_latency_us"]:
        assert set(s[h]) == {"count", "sum", "min", "max", "p50", "p95", "p99"}
    assert s["stores_completed"] == 1
    assert s["disk_entries"] == 1
    assert s["store_latency_us"]["count"] == 1
    prom = engine.stats_prometheus("kvt_")
    assert "kvt_stores_completed_total 1" in prom
    assert "root" in engine.describe()
    assert engine.shared_root() is False  # a local file system: "(shared: ...)" is not in describe()
    assert "(shared:" not in engine.describe()
    assert engine.evict_to_budget() == 0


def test_close_is_idempotent_and_later_calls_raise(root):
    e = kvtier.Engine(options(root))
    name = e.pool_name
    assert os.path.exists("/dev/shm" + name)
    e.close()
    e.close()
    assert not os.path.exists("/dev/shm" + name)
    with pytest.raises(ValueError, match="closed"):
        e.lookup(key(0))
    with pytest.raises(ValueError, match="closed"):
        e.pool_name


def test_an_engine_dropped_without_close_drains_its_stores(root):
    src = chunk_bytes(3)  # must outlive the store
    e = kvtier.Engine(options(root))
    e.store([(key(0), address(src))])
    del e  # the destructor waits for the store
    with kvtier.Engine(options(root)) as e:
        assert e.lookup(key(0)) == "disk"


def test_the_console_script_runs_the_cli():
    exe = shutil.which("kvtier", path=os.path.dirname(sys.executable))
    assert exe, "console script kvtier not installed beside the interpreter"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "usage: kvtier" in r.stdout
    r = subprocess.run([exe, "no-such-command"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2


def test_copy_batch_accepts_read_only_and_strided_arrays():
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, np.uint8)
    table = np.array([address(dst), 0, address(src) + 8, 0, 8, 0], dtype=np.uint64)
    table.flags.writeable = False
    assert kvtier.copy_batch(table[0:1], table[2:3], table[4:5]) == 8
    strided = np.array([address(dst) + 16, 1, address(dst) + 32, 1], dtype=np.uint64)[::2]
    assert kvtier.copy_batch(strided, np.array([address(src), address(src) + 1], np.uint64),
                             np.array([2, 2], np.uint64)) == 4
    np.testing.assert_array_equal(dst[:8], src[8:16])
    np.testing.assert_array_equal(dst[16:18], src[0:2])
    np.testing.assert_array_equal(dst[32:34], src[1:3])


def _threads_and_blocked_signals() -> dict[int, int]:
    """{thread id: its blocked-signal mask} for each thread of this process (/proc/self/task/*/status), but the
    kernel's io_uring workers (iou-*: they take no signals at all)."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # a thread that ended meanwhile
        if fields["Name"].strip().startswith("iou-"):
            continue
        out[int(task)] = int(fields["SigBlk"], 16)
    return out


def test_a_signal_to_the_process_is_never_taken_by_the_extensions_threads(root):
    """CPython runs Python signal handlers only in the main thread; a process-directed signal that lands on another
    thread wakes nothing (vLLM's EngineCore, asleep in queue.get, once ignored its SIGTERM so: src/util/thread.h).
    Every thread the extension starts (the engine's reactors, its stream pump, a job's copier, copy_batch's helpers)
    blocks the process's signals, so the kernel never gives one of them a SIGTERM or SIGINT. Threads that were there
    before the engine (numpy's BLAS threads, say) are not the extension's and are not checked."""
    before = set(_threads_and_blocked_signals())
    with kvtier.Engine(options(root, backend="auto", reactors=2)) as e:
        e.stream_open_store([key(90), key(91)], 1)  # the pump's thread
        store(e, {i: chunk_bytes(i) for i in range(4)})  # the job client's copier, the reactors
        new = {tid: mask for tid, mask in _threads_and_blocked_signals().items() if tid not in before}
    assert len(new) >= 3, f"the engine started {len(new)} threads: expected its reactors, pump and copier"
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        taking = [tid for tid, mask in new.items() if not mask & (1 << (sig - 1))]
        assert not taking, f"{len(taking)} of the extension's {len(new)} threads leave {sig.name} unblocked"
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):  # faults stay with their handlers (faulthandler)
        assert not any(mask & (1 << (sig - 1)) for mask in new.values()), f"{sig.name} blocked in a kvtier thread"
