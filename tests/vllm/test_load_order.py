"""kvtier_load_order (docs/vllm-integration.md "Several loads at once"): how the worker's stream thread orders the
copies of several requests' streamed loads. A fake stream board (the engine's side: a window of chunks ready per
load, the next one made ready as each is acked) and a fake link (one queued copy completes per pass, in queue order,
as on the CUDA copier's one stream) drive KVTierWorker's real pass; the clock is the bytes the link has moved."""

import time

import numpy as np
import pytest

import kvtier.vllm as kv
from kvtier.vllm import worker as worker_mod

from test_spec_unit import LAYERS, PAGE, make_kv

MIB = 1 << 20
CHUNK = 64 * MIB  # a 256-token chunk of the 32B shape
WINDOW = 6  # chunks the engine keeps ready per load (its stream window)


class Board:
    """The engine's side of the stream board for jobs laid out one after another: each job's first WINDOW chunks
    ready at once, then one more each time one is acked."""

    def __init__(self, counts):
        self.state = []  # per entry: 0 waiting, 1 ready, 4 acked
        self.jobs = []
        for n in counts:
            first = len(self.state)
            self.jobs.append((first, n))
            self.state += [1 if k < WINDOW else 0 for k in range(n)]

    def observe_entries(self, first, count):
        e = np.zeros((count, 4), dtype=np.uint32)
        for k in range(count):
            i = first + k
            e[k] = (1, 1 if self.state[i] == 1 else 0, i, 1)  # tag 1, state, slot = entry, generation 1
        return e.tobytes()

    def observe(self, slot):
        return 1, "ready"

    def slot_address(self, slot):
        return 0x10000 * (slot + 1)

    def ack_entry(self, index, tag):
        self.state[index] = 4
        first, n = next((f, c) for f, c in self.jobs if f <= index < f + c)
        nxt = next((i for i in range(first, first + n) if self.state[i] == 0), None)
        if nxt is not None:
            self.state[nxt] = 1


class Link:
    """An asynchronous copier: copies queue in order; tick() completes the first one."""

    asynchronous = True

    def __init__(self):
        self.queue, self.completed, self.clock = [], {}, 0
        self.log = []  # (job id, bytes) per copy, in queue order
        self.most_queued = 0  # the most bytes queued at once

    def copy(self, direction, dst, src, sizes, after=None):
        ticket = len(self.log)
        self.log.append((int(dst[0]) >> 40, int(sizes.sum())))
        self.queue.append(ticket)
        self.most_queued = max(self.most_queued, sum(self.log[t][1] for t in self.queue))
        return ticket

    def tick(self):
        if self.queue:
            t = self.queue.pop(0)
            self.clock += self.log[t][1]
            self.completed[t] = self.clock

    def done(self, ticket):
        return ticket in self.completed

    def wait(self, ticket):
        assert ticket in self.completed

    def close(self):
        return

    def describe(self):
        return "fake link"


def _job(job_id, board, index):
    first, n = board.jobs[index]
    layout = (np.zeros(n, dtype=np.uint64), np.full(n, job_id << 40, dtype=np.uint64),
              np.full(n, CHUNK, dtype=np.uint64), np.arange(n), np.arange(n), np.arange(n))
    return worker_mod._StreamJob(job_id, True, board, (first, n, 1), layout, None, time.perf_counter())


def _run(order, counts, **kwargs):
    """Each load's completion time (bytes the link had moved when its last copy landed), and the link (its log: the
    copies in queue order)."""
    _, kv_caches = make_kv(1)
    link = Link()
    w = kv.KVTierWorker(kv_caches, 1, 0, LAYERS * PAGE, copier=link, load_order=order, **kwargs)
    board = Board(counts)
    jobs = [_job(i + 1, board, i) for i in range(len(counts))]
    done_at = {}
    for _ in range(10_000):
        w._stream_pass(jobs, True)
        for j in jobs:
            if j.job_id not in done_at and not j.todo.any() and not j.inflight:
                done_at[j.job_id] = link.clock
        if len(done_at) == len(jobs):
            break
        link.tick()
    w.shutdown()
    assert all(j.nbytes == CHUNK * j.count for j in jobs)  # every chunk copied and acked once
    return [done_at[j.job_id] for j in jobs], link


def test_oldest_first_finishes_the_older_load_before_the_link_serves_the_younger():
    (a, b), link = _run("oldest_first", [12, 12])
    log = link.log
    assert a == 12 * CHUNK and b == 24 * CHUNK  # as if the loads came one after another
    assert max(n for _, n in log) <= worker_mod._LOAD_PIECE_BYTES  # acked piece by piece
    first_b = next(i for i, (job, _) in enumerate(log) if job == 2)
    assert {job for job, _ in log[:first_b]} == {1} and {job for job, _ in log[first_b:]} == {2}


def test_shared_interleaves_the_loads_and_the_older_finishes_late():
    (a, b), link = _run("shared", [12, 12])
    log = link.log
    assert b == 24 * CHUNK and a > 12 * CHUNK + 4 * CHUNK  # the older load waited for the younger's copies
    assert [job for job, _ in log[:3]] == [1, 2, 1]


def test_the_queue_bound_limits_what_is_queued_on_the_link_and_keeps_the_order():
    """kvtier_load_queue_mib: with 1 GiB the oldest load queues its whole ready window (6 chunks, more at the handover
    to the next load); with 128 MiB at most two chunks are queued at any time, and the loads still finish one after
    the other."""
    assert _run("oldest_first", [12, 12])[1].most_queued >= WINDOW * CHUNK
    (a, b), link = _run("oldest_first", [12, 12], load_queue_bytes=2 * CHUNK)
    assert link.most_queued == 2 * CHUNK and (a, b) == (12 * CHUNK, 24 * CHUNK)
    (a, b), link = _run("oldest_first", [3, 12], load_queue_bytes=CHUNK)  # a younger load too keeps within the bound
    assert link.most_queued == CHUNK and (a, b) == (3 * CHUNK, 15 * CHUNK)
    _, kv_caches = make_kv(1)
    with pytest.raises(ValueError, match="load_queue_bytes must be positive"):
        kv.KVTierWorker(kv_caches, 1, 0, LAYERS * PAGE, copier=Link(), load_queue_bytes=0)


def test_a_younger_load_fills_the_link_while_the_oldest_has_nothing_ready():
    """Work conserving: the oldest load's window is all queued and none of it is ready yet, so the younger load gets
    at most two pieces queued; the oldest load still finishes first."""
    (a, b), _ = _run("oldest_first", [3, 12])  # the oldest: 3 chunks, fewer than its window
    assert a == 3 * CHUNK and b == 15 * CHUNK


@pytest.mark.parametrize("allowance,expect", [(0, 0), (-5, 0), (1, 1), (CHUNK, 1), (CHUNK + 1, 1), (2 * CHUNK, 2),
                                              (100 * CHUNK, 4)])
def test_fit_takes_the_chunks_that_fit_and_at_least_one(allowance, expect):
    assert worker_mod._fit(np.full(4, CHUNK, dtype=np.int64), allowance) == expect


def test_pieces_cut_at_the_piece_size_and_keep_a_large_chunk_whole():
    sizes = np.array([64, 64, 64, 200, 10, 10], dtype=np.int64) * MIB
    cuts = worker_mod._pieces(sizes, 128 * MIB)
    assert [(s.start, s.stop) for s in cuts] == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert worker_mod._pieces(np.zeros(0, dtype=np.int64), 128 * MIB) == []


def test_an_unknown_load_order_is_refused():
    _, kv_caches = make_kv(1)
    with pytest.raises(ValueError, match="load_order 'fifo'"):
        kv.KVTierWorker(kv_caches, 1, 0, LAYERS * PAGE, copier=Link(), load_order="fifo")
