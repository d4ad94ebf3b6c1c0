"""The transfer spec the manager hands the workers: which pool slots hold the chunks of one load or store."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .compat import LoadStoreSpec


class KVTierLoadStoreSpec(LoadStoreSpec):
    """Pool slots of the chunks of one transfer, one per key in the scheduler's key order (group by group).

    Carries what a worker needs to find the bytes: the pool's shm name, the payload geometry and, per chunk, the
    slot and the generation the engine gave it (the worker checks it against the slot's state word)."""

    def __init__(self, pool_name: str, block_stride: int, payload_offset: int, slots: Iterable[int],
                 gens: Iterable[int], stream: tuple[int, int, int] | None = None):
        self.pool_name = pool_name
        self.block_stride = int(block_stride)
        self.payload_offset = int(payload_offset)
        self.slots = np.asarray(list(slots), dtype=np.int64)
        self.gens = np.asarray(list(gens), dtype=np.int64)
        assert self.slots.shape == self.gens.shape
        # A streamed transfer (docs/architecture.md "Streamed transfers"): (first board entry, chunks, tag); chunk i's
        # slot is published on the pool's stream board entry first + i as the engine reads (load) or grants (store)
        # it. Tag 0: the stream could not open (every chunk failed). slots/gens are empty then.
        self.stream = tuple(int(x) for x in stream) if stream is not None else None

    def __len__(self) -> int:
        return self.stream[1] if self.stream is not None else len(self.slots)

    def __repr__(self) -> str:
        if self.stream is not None:
            return f"KVTierLoadStoreSpec(pool={self.pool_name}, stream={self.stream})"
        return f"KVTierLoadStoreSpec(pool={self.pool_name}, slots={self.slots.tolist()})"
