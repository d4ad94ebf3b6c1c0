"""The scheduler side: KVTierManager, vLLM's OffloadingManager over one kvtier Engine (docs/vllm-integration.md
"Who does what", "The slot protocol", "Preload and the break-even gate")."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from . import compat, metrics
from .compat import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    logger,
)
from .transfer import KVTierLoadStoreSpec

# A scheduler step that ends this soon after the previous one ran no forward pass (none takes under half a
# millisecond); while such steps only wait for our reads, each one yields the CPU this long.
_IDLE_STEP_S = 0.0005
# Scheduler steps after reset_cache before the slots of the jobs it dropped are released (see reset_cache).
_RESET_QUARANTINE_STEPS = 3
_IDLE_BACKOFF_S = 0.001


def root_locality(engine: Any) -> str:
    """"REMOTE" when the engine found its root on a file system several hosts mount (its open-time probe,
    Engine.shared_root(): include/kvtier/engine.h), "LOCAL" otherwise: the locality of kvtier's disk tier in vLLM's
    terms (base.py Locality: relative to the publishing instance)."""
    return "REMOTE" if engine.shared_root() else "LOCAL"


class KVTierManager(OffloadingManager):
    """The scheduler-side manager: wraps one kvtier Engine (one per vLLM instance)."""

    def __init__(self, engine: Any, stats_interval_s: float = 10.0, stats_path: str | None = None,
                 preload_max_inflight: int = 0, thresholds: dict[str, int] | None = None,
                 hashes_per_chunk: Iterable[int] = (), tokens_per_chunk: int = 0,
                 group_ids: Iterable[int] | None = None, world_size: int = 1, estimates: dict | None = None):
        self.engine = engine
        # kvtier's disk as a tier of a request's kv_load_tiers (docs/vllm-integration.md "Per-request controls"):
        # STORAGE, LOCAL or REMOTE (a root several hosts mount).
        self.locality = root_locality(engine)
        # Streamed loads (docs/architecture.md "Streamed transfers"): a disk hit is answered from the index and read
        # chunk by chunk through a bounded window while the workers copy; a chunk that fails mid-stream is reported
        # to vLLM as invalid blocks, which only kvtier's connector can do (compat.KVTierConnector sets this). Off:
        # every chunk is read and verified into the pool before its lookup says HIT (at most a window of them).
        self.streaming = False
        self._window = int(getattr(engine, "stream_window", 0) or 32)
        self._consumers = max(1, int(world_size))  # workers that copy each chunk (every rank its slice)
        self._streams: dict[str, list[int]] = {}  # req_id -> its open load streams
        self._store_stream_of: dict[bytes, int] = {}  # key being stored -> its store stream
        self._store_keys_left: dict[int, set[bytes]] = {}  # store stream -> keys vLLM has not completed yet
        # Preload (R1-R3): the engine's PreloadPlanner (src/policy), fed from note_request/on_new_request; off at 0.
        self._preload = preload_max_inflight > 0
        if self._preload:
            engine.preload_configure(int(preload_max_inflight))
        self._preload_room = int(getattr(engine, "preload_room", 0) or 0)  # chunks a request can be read ahead, R2
        # Break-even gate (G1): {"dram": N, "disk": M, "store": K} min tokens, or None (off).
        self._gate = thresholds
        # The calibration's curves behind the gate's per-request estimate (config.load_estimate_curves), or None.
        self._curves = estimates
        self._estimates: dict[str, dict[str, Any]] = {}  # req_id -> the gate's last estimate (gate_estimate)
        self._hashes_per_chunk = [int(h) for h in hashes_per_chunk]  # per KV-cache group
        # the group index vLLM packs into each group's keys (compat.group_ids), by default the group's position
        self._group_ids = ([int(g) for g in group_ids] if group_ids is not None
                           else list(range(len(self._hashes_per_chunk))))
        self._tokens_per_chunk = int(tokens_per_chunk)
        self._req_keys: dict[str, list[bytes]] = {}   # req_id -> its chunk keys (group by group), from note_request
        self._req_pos: dict[str, dict[bytes, int]] = {}  # req_id -> {chunk key: its index in _req_keys}
        self._gate_ok: dict[str, dict[int, bool]] = {}  # req_id -> {first chunk index: load allowed}
        # req_id -> (block hashes, prompt tokens) from note_request, until its on_new_request takes them.
        self._noted: dict[str, tuple[list[bytes], int]] = {}
        self.requests_noted = False  # set by a connector that calls note_request (compat.KVTierConnector)
        self._warned_no_hashes = False
        self.pool_name: str = engine.pool_name
        self.block_stride: int = int(engine.block_stride)
        self.payload_offset: int = int(engine.payload_offset)
        # req_id -> {key: (slot, gen)}: chunks pinned for a request, from the lookup that found them resident
        # until its load completes or the request finishes (so that no promotion for another request can take
        # their slots between lookup and prepare_load).
        self._pins: dict[str, dict[bytes, tuple[int, int]]] = {}
        self._loading: dict[str, int] = {}  # req_id -> loads in flight
        self._finished: set[str] = set()    # finished while a load was in flight
        self._promoting: set[bytes] = set()
        self._disk_hits: dict[str, set[bytes]] = {}  # req_id -> keys its lookups found on disk (get_load_source)
        self._streamed: dict[str, set[bytes]] = {}  # req_id -> keys answered HIT to be streamed from disk
        self._storing: set[bytes] = set()
        self._mgr = dict.fromkeys(metrics.MANAGER_COUNTERS, 0)
        self._chunk_payload_bytes = int(getattr(engine, "chunk_payload_bytes", 0) or 0)
        self.load_bytes_needed = 0  # payload bytes of chunks handed to loads (the figure read amplification uses)
        self._deltas = metrics.StatsDeltas()
        self._last_stats_t = 0.0
        self._last_schedule_end = 0.0
        self._quarantine: list[list] = []  # [steps left, pinned keys, store keys] of jobs dropped by reset_cache
        self._stats_interval_s = stats_interval_s
        self._stats_path = stats_path
        self._last_log_t = time.monotonic()
        self._closed = False
        self._tl = metrics.timeline()
        self._tl_seen: dict[str, Any] = {}  # request -> the last lookup answer recorded

    # -- lookups -------------------------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._tl is None:
            return self._lookup(key, req_context)
        t = time.time()
        res = self._lookup(key, req_context)
        rid = req_context.req_id
        if self._tl_seen.get(rid) != res:  # the first answer and every change of answer kind
            self._tl_seen[rid] = res
            self._tl("lookup", req=rid, t0=t, ms=(time.time() - t) * 1e3, result=str(res))
        return res

    def _lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        key = bytes(key)
        pins = self._pins.get(req_context.req_id)
        if pins is not None and key in pins:
            return LookupResult.HIT
        if self._gate is not None and not self._gate_allows(key, req_context.req_id):
            return LookupResult.MISS
        # vLLM asks again every step: a streamed hit's answer stands until the load, without asking the engine (a
        # chunk gone from disk by then fails in the stream and is recomputed, as one gone after the first answer).
        streamed = self._streamed.get(req_context.req_id)
        if streamed is not None and key in streamed:
            return LookupResult.HIT
        if not self._disk_allowed(req_context):  # kv_load_tiers excludes kvtier's disk: resident chunks only
            ready = self.engine.residency(key) == "ready"
            return LookupResult.HIT if ready and self._pin_for(req_context.req_id, key) else LookupResult.MISS
        if self._preload and req_context.req_id in self._req_keys:
            self.engine.preload_forget(req_context.req_id)  # being admitted: demand reads take over
        # A read this manager started: ask the read, not the index (keeps the engine's lookup counters honest
        # while vLLM re-asks every step).
        where = "disk" if key in self._promoting else self.engine.lookup(key)
        if where == "pending":  # being read from disk (preload, or another request's promotion)
            self._mgr["lookup_pending"] += 1
            self._disk_hits.setdefault(req_context.req_id, set()).add(key)
            return LookupResult.HIT_PENDING
        if where == "dram":
            if self._pin_for(req_context.req_id, key):
                return LookupResult.HIT
            where = "disk"  # lost its slot since: read it again
        if where == "disk":
            self._disk_hits.setdefault(req_context.req_id, set()).add(key)  # read for this request (get_load_source)
            if self.streaming:
                self._streamed.setdefault(req_context.req_id, set()).add(key)
                return LookupResult.HIT  # read by prepare_load's stream, verified chunk by chunk
            if self._window_full(req_context.req_id, key):
                return LookupResult.MISS  # verified mode: what fits in the window is loaded, the rest recomputed
            state, _, _ = self.engine.preload_demand(key) if self._preload else self.engine.promote(key, False)
            if state == "ready":
                self._promoting.discard(key)
                if self._pin_for(req_context.req_id, key):
                    return LookupResult.HIT
                return LookupResult.MISS
            if state == "pending":
                if key not in self._promoting:
                    self._mgr["promotions"] += 1
                self._promoting.add(key)
                self._mgr["lookup_pending"] += 1
                return LookupResult.HIT_PENDING
            self._promoting.discard(key)
            return LookupResult.MISS  # failed verification, vanished, or no slot to read into: recompute
        return LookupResult.MISS

    def _disk_allowed(self, req_context: ReqContext) -> bool:
        """Whether the request's kv_load_tiers admits kvtier's disk, a STORAGE tier of this root's locality. The
        staging pool (kvtier's DRAM tier) is the host tier vLLM loads from, which vLLM's own tiering never filters
        (tiering/manager.py, lookup: only secondary tiers are matched), so resident chunks always serve."""
        return compat.load_allows(req_context, "STORAGE", self.locality)

    def _window_full(self, req_id: str, key: bytes) -> bool:
        """Verified mode: a request holds at most a window of slots (pinned, or being read for it), so that one
        request larger than the pool loads its first chunks instead of evicting its own promotions (S1)."""
        if key in self._promoting:
            return False
        held = len(self._pins.get(req_id, ())) + len(self._disk_hits.get(req_id, ())) - 1
        return held >= self._window

    def _gate_allows(self, key: bytes, req_id: str) -> bool:
        """G1: would this hit load enough tokens from its tier to beat recomputing them? Decided once per
        request and starting chunk (vLLM asks again every step), over the run of cached chunks from key on."""
        keys = self._req_keys.get(req_id)
        idx = self._req_pos[req_id].get(key) if keys else None  # vLLM asks chunk by chunk, every step: no scan
        if idx is None or self._tokens_per_chunk <= 0:
            return True  # request not seen by on_new_request: no basis to decline
        decided = self._gate_ok.setdefault(req_id, {})
        for start, ok in decided.items():
            if start <= idx:
                return ok
        rest = keys[idx:]
        n = int(self.engine.lookup_prefix(rest))
        tokens = n * self._tokens_per_chunk
        dram = all(self.engine.residency(k) == "ready" for k in rest[:n])
        tier = "dram" if dram else "disk"
        need = self._gate[tier]
        ok = tokens >= need
        decided[idx] = ok
        self._estimates[req_id] = self._estimate(tier, tokens, need, ok)
        if not ok:
            self._mgr["declined_loads"] += 1
            logger.debug("kvtier: request %s: declined a %s load of %d tokens (< %d)", req_id,
                         "DRAM" if dram else "disk", tokens, need)
        return ok

    def _estimate(self, tier: str, tokens: int, need: int, ok: bool) -> dict[str, Any]:
        """The gate's per-request estimate (G1; docs/break-even.md "The estimate a router reads"): the tokens the hit
        would load and from which tier, the tier's threshold, the decision, and where the thresholds file holds the
        calibration's curves, the expected TTFT of loading them (g of the tier) and of recomputing them (f)."""
        est: dict[str, Any] = {"tier": tier, "load_tokens": tokens, "min_load_tokens": need,
                               "decision": "load" if ok else "recompute",
                               "expected_load_s": None, "expected_recompute_s": None}
        if self._curves is not None and tokens > 0:
            g, f = self._curves.get(tier), self._curves.get("recompute")
            est["expected_load_s"] = round(g(tokens), 6) if g is not None else None
            est["expected_recompute_s"] = round(f(tokens), 6) if f is not None else None
        return est

    def gate_estimate(self, req_id: str) -> dict[str, Any] | None:
        """The break-even gate's last estimate for a request not finished yet (None: the gate is off or never saw a
        hit for it). compat.KVTierConnector puts it in the finished request's kv_transfer_params ("kvtier_gate")."""
        est = self._estimates.get(req_id)
        return dict(est) if est is not None else None

    def _keys_of(self, block_hashes: Sequence[bytes], n_tokens: int) -> list[bytes]:
        """A request's chunk keys exactly as OffloadingConnectorScheduler derives them (RequestOffloadState.
        update_offload_keys): per group g, make_offload_key(block_hashes[h-1 + i*h], group id of g) with
        h = hashes_per_chunk, over full chunks only; a chunk that ends at the prompt's last token (n_tokens) is left
        out (vLLM always computes the last token, so it is never loaded)."""
        hashes = list(block_hashes)
        out: list[bytes] = []
        for g, h in zip(self._group_ids, self._hashes_per_chunk):
            if h <= 0:
                continue
            for i in range(h - 1, len(hashes), h):
                if n_tokens and (i + 1) // h * self._tokens_per_chunk >= n_tokens:
                    break
                out.append(bytes(hashes[i]) + g.to_bytes(4, "big", signed=False))
        return out

    def _pin_for(self, req_id: str, key: bytes) -> bool:
        try:
            (ref,) = self.engine.pin([key])
        except KeyError:
            return False
        self._pins.setdefault(req_id, {})[key] = (int(ref[0]), int(ref[1]))
        return True

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        req_id = req_context.req_id
        if self.streaming:
            return self._prepare_stream_load([bytes(k) for k in keys], req_id)
        pins = self._pins.setdefault(req_id, {})
        slots, gens = [], []
        for k in keys:
            k = bytes(k)
            ref = pins.get(k)
            if ref is None:  # not from our lookup (should not happen): pin it now
                if not self._pin_for(req_id, k):
                    raise RuntimeError(f"kvtier: chunk {k.hex()} is not resident for request {req_id}; "
                                       "prepare_load needs a preceding HIT lookup")
                ref = pins[k]
            slots.append(ref[0])
            gens.append(ref[1])
        self._loading[req_id] = self._loading.get(req_id, 0) + 1
        if self._tl is not None:
            self._tl("prepare_load", req=req_id, chunks=len(slots))
        self.load_bytes_needed += len(slots) * self._chunk_payload_bytes
        self._mgr["load_bytes_needed"] = self.load_bytes_needed
        return KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, slots, gens)

    def _prepare_stream_load(self, keys: list[bytes], req_id: str) -> LoadStoreSpec:
        opened = self.engine.stream_open_load(keys, self._consumers)
        self._loading[req_id] = self._loading.get(req_id, 0) + 1
        self.load_bytes_needed += len(keys) * self._chunk_payload_bytes
        self._mgr["load_bytes_needed"] = self.load_bytes_needed
        if opened is None:  # the stream board is full: every chunk fails, vLLM recomputes them
            self._mgr["streams_refused"] += 1
            logger.warning("kvtier: request %s: no room on the stream board for %d chunks; recomputing them", req_id,
                           len(keys))
            stream = (0, 0, len(keys), 0)
        else:
            self._streams.setdefault(req_id, []).append(int(opened[0]))
            stream = tuple(int(x) for x in opened)
        if self._tl is not None:
            self._tl("prepare_load", req=req_id, chunks=len(keys), stream=stream[0])
        return KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, [], [],
                                   stream=stream[1:])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext):
        req_id = req_context.req_id
        if self._tl is not None:
            self._tl("complete_load", req=req_id, chunks=len(keys))
        n = self._loading.get(req_id, 0) - 1
        if n > 0:
            self._loading[req_id] = n
            return
        self._loading.pop(req_id, None)
        self._release(req_id)
        self._finished.discard(req_id)

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> Any:
        """vLLM 0.32+ (vllm:prompt_tokens_cached_by_source): DISK for a chunk that was being read, or had to be read,
        from the root when this request looked it up; HOST for one already in the staging pool (stored or read
        earlier)."""
        return compat.load_source(bytes(key) in self._disk_hits.get(req_context.req_id, ()))

    def _release(self, req_id: str) -> None:
        for sid in self._streams.pop(req_id, ()):
            self.engine.stream_close(sid)
        self._disk_hits.pop(req_id, None)
        self._streamed.pop(req_id, None)
        pins = self._pins.pop(req_id, None)
        if pins:
            self.engine.unpin(list(pins))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext):
        return  # recency is kept by the engine's own lookups and pins

    # -- stores --------------------------------------------------------------------------------------------
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        klist = [bytes(k) for k in keys]
        if self._gate is not None and self._gate["store"] > 0:
            rkeys = self._req_keys.get(req_context.req_id)
            storable = len(rkeys) * self._tokens_per_chunk if rkeys else None
            if storable is not None and storable < self._gate["store"]:
                self._mgr["stores_declined"] += 1  # G1: an entry this short could only produce declined loads
                return PrepareStoreOutput(keys_to_store=[], evicted_keys=[],
                                          store_spec=KVTierLoadStoreSpec(self.pool_name, self.block_stride,
                                                                         self.payload_offset, [], []))
        if self.streaming:
            return self._prepare_stream_store(klist)
        refs = self.engine.reserve_for_store(klist)
        if refs is None:
            self._mgr["store_pool_full"] += 1
            return None
        to_store, slots, gens = [], [], []
        for k, ref in zip(klist, refs):
            if ref is None:
                continue
            to_store.append(OffloadKey(k))
            slots.append(int(ref[0]))
            gens.append(int(ref[1]))
        self._storing.update(bytes(k) for k in to_store)
        spec = KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, slots, gens)
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=spec, evicted_keys=[])

    def _prepare_stream_store(self, klist: list[bytes]) -> PrepareStoreOutput | None:
        """X2 through a bounded window: the chunks not stored, resident or being stored already go in one store
        stream; its workers fill each chunk's slot as the pump grants it and the reactors write it out, so a store
        never waits for the pool to hold all of it (S1)."""
        fresh = [k for k in klist if k not in self._store_stream_of and self.engine.residency(k) == "miss"
                 and not self.engine.stored(k)]
        if not fresh:
            return PrepareStoreOutput(keys_to_store=[], evicted_keys=[],
                                      store_spec=KVTierLoadStoreSpec(self.pool_name, self.block_stride,
                                                                     self.payload_offset, [], []))
        opened = self.engine.stream_open_store(fresh, self._consumers)
        if opened is None:
            self._mgr["store_pool_full"] += 1  # the stream board is full: vLLM offers these chunks again later
            return None
        sid = int(opened[0])
        for k in fresh:
            self._store_stream_of[k] = sid
        self._store_keys_left[sid] = set(fresh)
        self._storing.update(fresh)
        spec = KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, [], [],
                                   stream=tuple(int(x) for x in opened[1:]))
        return PrepareStoreOutput(keys_to_store=[OffloadKey(k) for k in fresh], store_spec=spec, evicted_keys=[])

    def _complete_stream_store(self, klist: list[bytes]) -> None:
        for k in klist:
            sid = self._store_stream_of.pop(k, None)
            if sid is None:
                continue
            left = self._store_keys_left.get(sid)
            if left is not None:
                left.discard(k)
                if not left:
                    del self._store_keys_left[sid]
                    self.engine.stream_close(sid)  # commits what the workers filled

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True):
        klist = [bytes(k) for k in keys]
        if self.streaming and any(k in self._store_stream_of for k in klist):
            self._storing.difference_update(klist)
            self._complete_stream_store(klist)
            return
        self._storing.difference_update(klist)
        self.engine.commit_store(klist, bool(success))

    # -- lifecycle -----------------------------------------------------------------------------------------
    def note_request(self, req_id: str, block_hashes: Sequence[bytes], num_prompt_tokens: int) -> None:
        """A new request's block hashes, handed over just before on_new_request by the connector that has the
        Request (compat.KVTierConnector: vLLM 0.26 passes the manager only a ReqContext)."""
        if self._preload or self._gate is not None:
            self._noted[req_id] = (list(block_hashes), int(num_prompt_tokens))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        req_id = req_context.req_id
        if self._tl is not None:
            self._tl("new", req=req_id)
        if not (self._preload or self._gate is not None):
            return RequestOffloadingContext()
        noted = self._noted.pop(req_id, None)
        if noted is None:
            if not self.requests_noted and not self._warned_no_hashes:
                self._warned_no_hashes = True
                logger.warning("kvtier: preload and the break-even gate are configured but off: they need each "
                               "request's block hashes, which vLLM passes only to the connector; use "
                               "\"kv_connector\":\"KVTierConnector\",\"kv_connector_module_path\":\"kvtier.vllm\" "
                               "(docs/vllm-integration.md)")
            return RequestOffloadingContext()
        keys = self._keys_of(*noted)
        self._req_keys[req_id] = keys
        self._req_pos[req_id] = {}
        for i, k in enumerate(keys):
            self._req_pos[req_id].setdefault(k, i)
        # R1: start reading its cached prefix while it waits (bounded by the planner, R2).
        if self._preload and keys and self._disk_allowed(req_context) and self._preload_can_pay(keys):
            self.engine.preload_enqueue(req_id, keys)
            self.engine.preload_pump()
        return RequestOffloadingContext()

    def _preload_can_pay(self, keys: list[bytes]) -> bool:
        """Whether reading this request ahead can serve a load the gate admits (G1): as a disk hit (at least the disk
        tier's min_load_tokens), or read ahead whole as a DRAM hit (at least the DRAM tier's, and no more chunks than
        unused preloads may hold, R2). Otherwise the gate declines its load and every chunk read ahead is wasted
        (docs/vllm-integration.md, "Preload and the break-even gate")."""
        if self._gate is None:
            return True
        tokens = len(keys) * self._tokens_per_chunk
        return tokens >= self._gate["disk"] or (tokens >= self._gate["dram"] and len(keys) <= self._preload_room)

    def on_request_finished(self, req_context: ReqContext) -> None:
        req_id = req_context.req_id
        if self._tl is not None:
            self._tl("finished", req=req_id)
            self._tl_seen.pop(req_id, None)
        self._req_pos.pop(req_id, None)
        if self._req_keys.pop(req_id, None) is not None and self._preload:
            self.engine.preload_forget(req_id)
        self._gate_ok.pop(req_id, None)
        self._estimates.pop(req_id, None)
        self._noted.pop(req_id, None)
        if self._loading.get(req_id):
            self._finished.add(req_id)  # complete_load will release its pins
        else:
            self._release(req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._tl is not None:
            self._tl("step", loading=len(self._loading), promoting=len(self._promoting))
        if self._quarantine:
            self._age_quarantine()
        if self._preload:
            self.engine.preload_pump()
        if self._promoting:
            done = [k for k in self._promoting if self.engine.promote(k, False)[0] != "pending"]
            self._promoting.difference_update(done)
            # Requests waiting on our reads (HIT_PENDING) keep vLLM's engine loop stepping. When steps come back
            # faster than any forward pass (nothing else was scheduled), yield the CPU briefly instead of spinning
            # a core that the reads, the copies and the other requests need.
            now = time.monotonic()
            if self._promoting and now - self._last_schedule_end < _IDLE_STEP_S:
                time.sleep(_IDLE_BACKOFF_S)
        self._last_schedule_end = time.monotonic()
        self._maybe_log()

    def has_pending_work(self) -> bool:
        # A quarantine keeps the scheduler stepping until it is released (steps are what age it).
        return bool(self._promoting or self._quarantine)

    def reset_cache(self) -> None:
        # vLLM forgets every in-flight job: release what they held. Disk entries stay (they are the point).
        # Not at once: vLLM tells the workers to wait for those jobs only in the next step's metadata, so a copy
        # may still be reading (load) or writing (store) a slot now. Released now, the engine could refill the slot
        # from disk while the copy runs (a torn load, or a late store write over another chunk's verified bytes).
        # The slots are quarantined until _RESET_QUARANTINE_STEPS more scheduler steps have ended: by then the
        # workers have run the step that waits for the flushed jobs (one more step covers async scheduling).
        pins = [k for req_id in list(self._pins) for k in self._pins.pop(req_id)]
        self._disk_hits.clear()
        self._streamed.clear()
        streams = [sid for sids in self._streams.values() for sid in sids] + list(self._store_keys_left)
        storing = [k for k in self._storing if k not in self._store_stream_of]
        self._streams.clear()
        self._store_stream_of.clear()
        self._store_keys_left.clear()
        if pins or storing or streams:
            self._quarantine.append([_RESET_QUARANTINE_STEPS, pins, storing, streams])
        self._loading.clear()
        self._finished.clear()
        self._storing.clear()
        self._promoting.clear()

    def _age_quarantine(self) -> None:
        keep = []
        for q in self._quarantine:
            q[0] -= 1
            if q[0] > 0:
                keep.append(q)
                continue
            if q[1]:
                self.engine.unpin(q[1])
            if q[2]:
                self.engine.commit_store(q[2], False)
            for sid in q[3]:
                self.engine.stream_close(sid)
        self._quarantine = keep

    def take_events(self):
        return ()

    # -- stats ---------------------------------------------------------------------------------------------
    def get_stats(self):
        now = time.monotonic()
        if self._closed or now - self._last_stats_t < 1.0:
            return None
        self._last_stats_t = now
        return self._deltas.stats(self.engine.stats(), self._mgr)

    def _maybe_log(self, force: bool = False) -> None:
        if self._closed or self._stats_interval_s <= 0:
            return
        now = time.monotonic()
        if not force and now - self._last_log_t < self._stats_interval_s:
            return
        self._last_log_t = now
        snap = self.engine.stats()
        logger.info("kvtier: lookups=%d dram_hits=%d disk_hits=%d misses=%d read=%dB written=%dB stores=%d "
                    "dropped=%d corrupt=%d pool_slots_in_use=%d dram_entries=%d disk_entries=%d",
                    snap.get("lookups", 0), snap.get("lookup_hits_dram", 0), snap.get("lookup_hits_disk", 0),
                    snap.get("lookup_misses", 0), snap.get("bytes_read", 0), snap.get("bytes_written", 0),
                    snap.get("stores_completed", 0), snap.get("stores_dropped", 0),
                    snap.get("corrupt_entries", 0), snap.get("pool_slots_in_use", 0),
                    snap.get("dram_entries", 0), snap.get("disk_entries", 0))
        if self._stats_path:
            self._write_stats_file(snap)

    def _write_stats_file(self, snap: dict) -> None:
        try:
            data = {k: v for k, v in snap.items() if isinstance(v, (int, float, str))}
            data["manager"] = dict(self._mgr)
            if self._preload:  # why preloads did or did not start (src/policy/preload_planner.h, PlannerStats)
                data["preload_planner"] = dict(self.engine.preload_stats())
            data["pool_name"] = self.pool_name
            data["pid"] = os.getpid()
            data["time"] = time.time()
            tmp = f"{self._stats_path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self._stats_path)
        except OSError as e:
            logger.warning("kvtier: cannot write stats file %s: %s", self._stats_path, e)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._maybe_log(force=True)
        self._closed = True
        self.engine.close()
        # Dropped, not kept: vLLM's EngineCore objects outlive interpreter shutdown, and nanobind reports an Engine
        # still referenced then as a leak in the server log.
        self.engine = None
        logger.info("kvtier: engine closed")  # tests/vllm/test_shutdown.py: kvtier's shutdown ran
