"""A pure-Python stand-in for kvtier._kvtier with the same slot-resident API (docs/python-api.md), so the vLLM
adapter's logic (lookup/promote/pin protocol, address math, partial chunks) can be tested without the C++ build.
The real extension is used instead whenever it is importable (see conftest.py)."""

import ctypes

import numpy as np

HEADER_BYTES = 4096


class _PoolMem:
    registry: dict = {}

    def __init__(self, name, nslots, slot_stride):
        self.name, self.nslots, self.slot_stride = name, nslots, slot_stride
        self.buf = np.zeros(nslots * slot_stride, dtype=np.uint8)
        self.gen = [0] * nslots
        self.state = ["free"] * nslots
        _PoolMem.registry[name] = self


class Pool:
    def __init__(self, mem):
        self._mem = mem
        self.num_slots, self.slot_stride = mem.nslots, mem.slot_stride
        self.base_address = mem.buf.ctypes.data
        self.mapped_bytes = mem.buf.nbytes

    @staticmethod
    def attach(name):
        mem = _PoolMem.registry.get(name)
        if mem is None:
            raise OSError(f"NotFound: no pool {name}")
        return Pool(mem)

    def slot_address(self, slot):
        if not 0 <= slot < self.num_slots:
            raise IndexError(slot)
        return self.base_address + slot * self.slot_stride

    def observe(self, slot):
        return self._mem.gen[slot], self._mem.state[slot]

    def close(self):
        pass


def copy_batch(dst, src, sizes, threads=1, direction=""):
    for d, s, n in zip(dst.tolist(), src.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)
    return int(sizes.sum())


class Engine:
    """Keys live on 'disk' (a dict of bytes) and/or in a slot. promote() needs `promote_steps` calls to finish."""

    def __init__(self, options):
        self.options = dict(options)
        bs = int(options["block_bytes"])
        self.block_stride = (bs + 4095) // 4096 * 4096
        self.chunk_payload_bytes = self.block_stride * int(options["blocks_per_chunk"])
        self.payload_offset = HEADER_BYTES
        slot_stride = HEADER_BYTES + self.chunk_payload_bytes
        n = max(1, int(options.get("pool_bytes", 1 << 24)) // slot_stride)
        self.pool_name = options.get("pool_name") or "/kvtier-fake"
        self._mem = _PoolMem(self.pool_name, n, slot_stride)
        self.preload_room = max(1, n // 2)  # Engine::max_unused_preloads (R2), without a demand reserve
        self.disk: dict = {}
        self.resident: dict = {}  # key -> [slot, state, pins]
        self.promoting: dict = {}  # key -> calls left
        self.promote_steps = 1
        self.counters = {"lookups": 0, "bytes_read": 0, "bytes_written": 0, "lookup_hits_dram": 0,
                         "lookup_hits_disk": 0, "lookup_misses": 0}
        self.closed = False

    # helpers
    def _free_slot(self):
        used = {r[0] for r in self.resident.values()}
        for s in range(self._mem.nslots):
            if s not in used:
                return s
        for k, r in list(self.resident.items()):  # evict an unpinned ready one
            if r[2] == 0 and r[1] == "ready":
                del self.resident[k]
                return r[0]
        return None

    def _payload(self, slot):
        off = slot * self._mem.slot_stride + HEADER_BYTES
        return self._mem.buf[off:off + self.chunk_payload_bytes]

    def drop_dram(self):
        for k, r in list(self.resident.items()):
            if r[2] == 0 and r[1] == "ready":
                self._mem.state[r[0]] = "free"
                del self.resident[k]

    # API
    def lookup(self, key):
        self.counters["lookups"] += 1
        r = self.resident.get(key)
        if r is not None:
            if r[1] == "ready":
                self.counters["lookup_hits_dram"] += 1
                return "dram"
            return "pending"
        if key in self.disk:
            self.counters["lookup_hits_disk"] += 1
            return "disk"
        self.counters["lookup_misses"] += 1
        return "absent"

    def lookup_prefix(self, keys):
        n = 0
        for k in keys:
            if self.lookup(k) not in ("dram", "disk"):
                break
            n += 1
        return n

    def promote(self, key, speculative=False):
        r = self.resident.get(key)
        if r is not None:
            return ("ready", r[0], self._mem.gen[r[0]]) if r[1] == "ready" else ("pending", 0, 0)
        if key not in self.disk:
            return ("miss", 0, 0)
        left = self.promoting.get(key, self.promote_steps)
        if left > 0:
            self.promoting[key] = left - 1
            return ("pending", 0, 0)
        self.promoting.pop(key, None)
        slot = self._free_slot()
        if slot is None:
            return ("miss", 0, 0)
        self._mem.gen[slot] += 1
        self._payload(slot)[:] = self.disk[key]
        self._mem.state[slot] = "ready"
        self.counters["bytes_read"] += self.chunk_payload_bytes
        self.resident[key] = [slot, "ready", 0]
        return ("ready", slot, self._mem.gen[slot])

    # Preload planner stand-in (the real one is src/policy/preload_planner.cc): a FIFO, K promotions per pump.
    def preload_configure(self, max_inflight=1, max_queue_age_ms=0):
        self.preload_k = int(max_inflight)
        self.preload_queue = []
        self.preload_log = []

    def preload_enqueue(self, request, keys):
        self.preload_queue += [(request, bytes(k)) for k in keys]
        self.preload_log.append(("enqueue", request, len(keys)))

    def preload_forget(self, request):
        self.preload_queue = [(r, k) for r, k in self.preload_queue if r != request]
        self.preload_log.append(("forget", request))

    def preload_demand(self, key):
        self.preload_queue = [(r, k) for r, k in self.preload_queue if k != key]
        return self.promote(key, False)

    def preload_pump(self):
        for _ in range(min(self.preload_k, len(self.preload_queue))):
            _, k = self.preload_queue.pop(0)
            self.promote(k, True)

    def preload_stats(self):
        return {"queued": len(self.preload_queue)}

    def residency(self, key):
        r = self.resident.get(key)
        return "miss" if r is None else ("ready" if r[1] == "ready" else "pending")

    def pin(self, keys):
        out = []
        for k in keys:
            r = self.resident.get(k)
            if r is None or r[1] != "ready":
                raise KeyError(k.hex())
            out.append((r[0], self._mem.gen[r[0]]))
        for k in keys:
            self.resident[k][2] += 1
        return out

    def unpin(self, keys):
        for k in keys:
            r = self.resident.get(k)
            if r is not None and r[2] > 0:
                r[2] -= 1

    def reserve_for_store(self, keys):
        out, taken = [], []
        for k in keys:
            if k in self.resident or k in self.disk or k in taken:
                out.append(None)
                continue
            slot = self._free_slot()
            if slot is None:
                for t in taken:
                    del self.resident[t]
                return None
            self._mem.gen[slot] += 1
            self._mem.state[slot] = "filling"
            self.resident[k] = [slot, "filling", 0]
            taken.append(k)
            out.append((slot, self._mem.gen[slot]))
        return out

    def commit_store(self, keys, success):
        for k in keys:
            r = self.resident.get(k)
            if r is None or r[1] != "filling":
                continue
            if not success:
                self._mem.state[r[0]] = "free"
                del self.resident[k]
                continue
            r[1] = "ready"
            self._mem.state[r[0]] = "ready"
            self.disk[k] = self._payload(r[0]).copy()
            self.counters["bytes_written"] += self.chunk_payload_bytes

    def stats(self):
        return dict(self.counters)

    def describe(self):
        return f"fake engine pool={self.pool_name}"

    def shared_root(self):
        # The extension's Engine.shared_root(): whether the root is on a file system several hosts mount. A fake
        # root is one host's: the manager reports its disk tier LOCAL (root_locality).
        return False

    def close(self):
        self.closed = True
