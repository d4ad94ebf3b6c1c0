"""kvtier's metrics on vLLM's offloading stats path (O1, docs/vllm-integration.md "Metrics") and the optional
per-event timeline (KVTIER_TIMELINE_DIR)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from .compat import (OffloadingCounterMetadata, OffloadingGaugeMetadata, OffloadingMetricMetadata, connector_stats,
                     logger)

COUNTERS = {
    "lookups": "kvtier engine lookups",
    "lookup_hits_dram": "kvtier lookups found in the DRAM tier (a pool slot)",
    "lookup_hits_disk": "kvtier lookups found on disk",
    "lookup_misses": "kvtier lookups that found nothing",
    "bytes_read": "bytes kvtier read from disk",
    "bytes_written": "bytes kvtier wrote to disk",
    "chunks_loaded": "chunks kvtier read from disk into the pool",
    "stores_completed": "kvtier store jobs written and published",
    "stores_dropped": "kvtier stores dropped (pool full, ENOSPC, failed)",
    "stores_deduplicated": "kvtier stores skipped because the chunk was already cached",
    "corrupt_entries": "kvtier entries that failed verification (treated as misses and removed)",
    "other_secret_misses": "kvtier loads that met an entry keyed for another checksum secret (a miss, kept)",
    "evictions": "kvtier entries evicted from disk for the budget",
    "io_errors": "kvtier I/O errors",
    "timeouts": "kvtier operations past their deadline",
}
GAUGES = {
    "disk_bytes_used": "bytes of kvtier entries on disk (this instance's view)",
    "disk_entries": "kvtier entries on disk (this instance's view)",
    "pool_slots_in_use": "kvtier staging pool slots in use",
    "dram_entries": "chunks resident in the kvtier DRAM tier",
}
MANAGER_COUNTERS = {
    "promotions": "chunks the manager asked kvtier to read from disk for a waiting request",
    "lookup_pending": "manager lookups answered HIT_PENDING (a read or a store in flight)",
    "store_pool_full": "store attempts refused because the staging pool was full (vLLM retries later)",
    "declined_loads": "hits the break-even gate reported as misses (recomputed instead; docs/break-even.md)",
    "stores_declined": "store requests below the gate's store_min_tokens (not written)",
    "streams_refused": "loads whose stream found no room on the pool's stream board (their chunks recomputed)",
    "load_bytes_needed": "payload bytes of the chunks handed to loads (bytes the admitted requests needed)",
}


def metric_name(name: str) -> str:
    return f"vllm:kvtier_{name}"


def definitions(counters: dict[str, str] | None = None) -> dict[str, OffloadingMetricMetadata]:
    """vLLM metric name -> its metadata, for OffloadingSpec.build_metric_definitions: the engine's counters and
    gauges and `counters` of the adapter's own (default: the manager's)."""
    defs: dict[str, OffloadingMetricMetadata] = {}
    for name, doc in {**COUNTERS, **(MANAGER_COUNTERS if counters is None else counters)}.items():
        defs[metric_name(name)] = OffloadingCounterMetadata(documentation=doc)
    for name, doc in GAUGES.items():
        defs[metric_name(name)] = OffloadingGaugeMetadata(documentation=doc)
    return defs


class StatsDeltas:
    """vLLM's stats are per interval, kvtier's counters cumulative: each call of `stats` reports what the engine's
    counters (a stats() snapshot) and the adapter's own (`own`) gained since the previous call, and the gauges."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def stats(self, snap: dict[str, Any], own: dict[str, int]) -> Any:
        out = connector_stats()
        for name, cur in [(n, float(snap.get(n, 0))) for n in COUNTERS] + [("own:" + n, v) for n, v in own.items()]:
            delta = cur - self._last.get(name, 0.0)
            if delta > 0:
                out.increase_counter(metric_name(name.removeprefix("own:")), int(delta))
            self._last[name] = cur
        for name in GAUGES:
            out.set_gauge(metric_name(name), int(snap.get(name, 0)))
        return out


# ---------------------------------------------------------------------------------------------------------------
# Timeline (diagnostics): KVTIER_TIMELINE_DIR=<dir> makes the manager and every worker append one JSON object per
# event to <dir>/timeline-<pid>.jsonl, wall-clock stamped (time.time(): comparable across processes). Events:
# manager "new", "lookup" (first answer per request and answer kind), "prepare_load", "complete_load", "finished",
# "step" (every on_schedule_end); worker "submit" (job, direction, bytes, pages; addr_ms: attaching the pool,
# checking the slots and building the address arrays; issue_ms: issuing the copy), "stream_copy" (a streamed job's
# copy of the chunks that became ready together) and "done" (job seen complete; a streamed one with first_copy_ms).
# bench/h200/timeline.py turns the files into per-request phases.
# ---------------------------------------------------------------------------------------------------------------

class Timeline:
    """Diagnostics only: a write that fails (a full or read-only file system) ends the timeline with one warning and
    never reaches the caller, which is vLLM's scheduler or a worker's copy loop."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"timeline-{os.getpid()}.jsonl")
        self._f = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "ev": ev, "pid": os.getpid(), **fields})
        with self._lock:
            if self._f is None:
                return
            try:
                self._f.write(line + "\n")
            except OSError as e:
                logger.warning("kvtier: timeline %s stopped: %s (serving continues)", self.path, e)
                try:
                    self._f.close()
                except OSError:
                    pass
                self._f = None


def timeline() -> Timeline | None:
    d = os.environ.get("KVTIER_TIMELINE_DIR", "")
    return Timeline(d) if d else None
