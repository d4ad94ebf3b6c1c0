#!/usr/bin/env python3
"""The multi-host suite (SPEC M1-M4): engines on several FUSE mounts of one MooseFS volume, each in its own network
namespace ("host"), as brought up by scripts/dfs/moosefs.sh. Run by scripts/test_multihost.sh, which brings the
filesystem up and down; standard library only (it runs with the machine's python3).

    python3 tests/multihost/test_multihost.py --env DIR/env --tool build/dev/kvtier_mh_engine \
        --kvtier build/dev/kvtier [-k CASE]...

Each case uses a root of its own on the shared volume and prints its figures on lines starting with "figure:".
Exit status: 0 when every case passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import traceback

CHUNK_FILE_BYTES = 4096 + int(os.environ.get("KVTIER_MH_BLOCKS", "4")) * (int(os.environ.get("KVTIER_MH_BLOCK_KIB", "256")) << 10)


def read_env(path: str) -> dict[str, str]:
    """The KEY=VALUE lines scripts/dfs/<fs>.sh up writes (mount points, namespaces, addresses)."""
    env = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            env[k] = v.strip('"')
    return env


class Host:
    """One engine process (tests/multihost/mh_engine.cc) in a host's network namespace, on that host's mount."""

    def __init__(self, suite: "Suite", host: str, root_rel: str, *extra: str):
        self.name = host
        self.mount = suite.env[f"KVTIER_DFS_MNT_{host}"]
        self.root = os.path.join(self.mount, root_rel)
        argv = ["ip", "netns", "exec", suite.env[f"KVTIER_DFS_NS_{host}"], suite.tool, "--root", self.root, *extra]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        hello = self._read()
        if not hello.get("ready"):
            raise AssertionError(f"host {host}: engine did not open: {hello}")
        self.pid = hello["pid"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"host {self.name}: engine exited (rc {self.proc.wait()})")
        return json.loads(line)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def cmd(self, line: str) -> dict:
        self.send(line)
        return self._read()

    def stats(self) -> dict:
        return self.cmd("stats")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class Suite:
    def __init__(self, env: dict, tool: str, kvtier: str):
        self.env = env
        self.tool = tool
        self.kvtier = kvtier
        self.hosts_started: list[Host] = []
        self.case = ""
        self.engine_args = shlex.split(os.environ.get("KVTIER_MH_ENGINE_ARGS", ""))

    def host(self, name: str, *extra: str) -> Host:
        h = Host(self, name, self.case, *extra)
        self.hosts_started.append(h)
        return h

    def root_on(self, host: str) -> str:
        return os.path.join(self.env[f"KVTIER_DFS_MNT_{host}"], self.case)

    def entries(self, host: str) -> dict[str, int]:
        """name -> size of every chunk file under the case's root, as host sees it."""
        out = {}
        for dirpath, _dirs, files in os.walk(self.root_on(host)):
            for f in files:
                if f.endswith(".kvc"):
                    out[f] = os.stat(os.path.join(dirpath, f)).st_size
        return out

    def chunk_paths(self, host: str) -> dict[str, str]:
        """chunk file name -> path, under the case's root as host sees it."""
        out = {}
        for dirpath, _dirs, files in os.walk(self.root_on(host)):
            for f in files:
                if f.endswith(".kvc"):
                    out[f] = os.path.join(dirpath, f)
        return out

    def key_names(self, h: "Host", n: int) -> list[str]:
        """The chunk file names of the tool's keys 0..n-1."""
        return [k + ".kvc" for k in h.cmd(f"keys 0 {n}")["hex"]]

    def cli(self, host: str, *args: str) -> subprocess.CompletedProcess:
        argv = ["ip", "netns", "exec", self.env[f"KVTIER_DFS_NS_{host}"], self.kvtier, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def figure(case: str, **values) -> None:
    print("figure: " + case + " " + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


# --------------------------------------------------------------------------------------------------------------
# Cases


def case_publish_then_load(s: Suite) -> None:
    """M1: A stores 30 chunks (named temporaries: FUSE has no O_TMPFILE); B, on the other mount, loads them right
    after A's store returns. Every chunk is a hit with the right bytes and no good entry is removed."""
    b = s.host("b", *s.engine_args)  # opened first, so that its load follows A's store at once
    a = s.host("a", *s.engine_args)
    r = a.cmd("store 0 30")
    check(r["ok"] == 30, f"A stored {r}")
    lr = b.cmd("load 0 30")
    sb = b.stats()
    after = s.entries("a")
    full = sum(1 for v in after.values() if v == CHUNK_FILE_BYTES)
    figure("publish_then_load", stored=r["ok"], loaded_ok=lr["ok"], missed=lr["miss"], wrong_bytes=lr["wrong"],
           corrupt_counted=sb["corrupt_entries"], entries_left=len(after), entries_full=full,
           store_ms=r["ms"], load_ms=lr["ms"])
    check(lr["wrong"] == 0, "wrong bytes handed out")
    check(full == 30, f"good entries removed: {30 - full} of 30 gone or short ({lr['error']})")
    check(sb["corrupt_entries"] == 0, f"B counted {sb['corrupt_entries']} good entries corrupt ({lr['error']})")
    check(lr["ok"] == 30, f"B loaded {lr['ok']} of 30 ({lr['error']})")


def case_chase_while_storing(s: Suite) -> None:
    """M1: B loads each of A's 30 chunks the moment it can, while A is still storing them: a name published before
    its data reached the filesystem's other clients is a 0-byte file on B, and B must never remove a good entry."""
    b = s.host("b", *s.engine_args)
    a = s.host("a", *s.engine_args)
    b.send("chase 0 30 20000")
    r = a.cmd("store 0 30 1")
    cr = b._read()
    sb = b.stats()
    after = s.entries("a")
    full = sum(1 for v in after.values() if v == CHUNK_FILE_BYTES)
    figure("chase_while_storing", stored=r["ok"], loaded_ok=cr["ok"], wrong_bytes=cr["wrong"], rounds=cr["rounds"],
           short_or_bad_loads=cr["bad_seen"], corrupt_counted=sb["corrupt_entries"], entries_left=len(after),
           entries_full=full)
    check(r["ok"] == 30, f"A stored {r}")
    check(cr["wrong"] == 0, "wrong bytes handed out")
    check(full == 30, f"good entries removed: {30 - full} of 30 gone or short")
    check(sb["corrupt_entries"] == 0, f"B counted {sb['corrupt_entries']} good entries corrupt")
    check(cr["ok"] == 30, f"B loaded {cr['ok']} of 30")
    # Data reaches the filesystem before the name does (close, then link): B never even sees a short entry.
    check(cr["bad_seen"] == 0, f"B saw {cr['bad_seen']} short or unreadable entries: names published before data")


def case_young_short_entry_kept(s: Suite) -> None:
    """M1: a short entry on a shared root is a miss; while young it stays (it may be another host's entry whose
    data this client cannot see yet); once older than temp_max_age_s fsck --repair removes it as corrupt. B's loads
    (the slot path) do not open either file: an engine takes only files of a chunk's size for entries (its index
    scan and lookups, M1), so a short file is absent to it, never served, counted or removed by a load."""
    a = s.host("a", *s.engine_args)
    r = a.cmd("store 0 2")
    check(r["ok"] == 2, f"A stored {r}")
    files = []
    for dirpath, _dirs, names in os.walk(s.root_on("a")):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".kvc")]
    check(len(files) == 2, f"expected 2 entries, found {files}")
    for f in files:
        os.truncate(f, 4096)  # a header page only: what another client sees of a name published too early
    old = time.time() - 3600
    os.utime(files[1], (old, old))  # the second one is an hour old
    on_b = [f.replace(s.env["KVTIER_DFS_MNT_a"], s.env["KVTIER_DFS_MNT_b"]) for f in files]
    b = s.host("b", *s.engine_args)
    lr = b.cmd("load 0 2")
    sb = b.stats()
    young_left, old_left = os.path.exists(on_b[0]), os.path.exists(on_b[1])
    fsck = s.cli("b", "fsck", "--root", s.root_on("b"), "--repair")
    young_after_fsck, old_after_fsck = os.path.exists(on_b[0]), os.path.exists(on_b[1])
    figure("young_short_entry_kept", loaded_ok=lr["ok"], missed=lr["miss"], corrupt_counted=sb["corrupt_entries"],
           young_kept=young_left, old_kept=old_left, fsck_rc=fsck.returncode, young_kept_by_fsck=young_after_fsck,
           old_kept_by_fsck=old_after_fsck)
    check(fsck.returncode == 0 and young_after_fsck, f"fsck --repair: rc {fsck.returncode}: {fsck.stdout[-600:]}")
    check("young:" in fsck.stdout, f"fsck did not report the young entry: {fsck.stdout[-600:]}")
    check(lr["ok"] == 0 and lr["wrong"] == 0, f"short entries loaded: {lr}")
    check(young_left, "a young short entry on a shared root was removed")
    check(not old_after_fsck, f"fsck --repair kept an old short entry: {fsck.stdout[-600:]}")


class UsageSampler:
    """Bytes under a case's root as the filesystem's server counts them, sampled in a thread: on MooseFS from the
    master (mfsdirinfo: one request, a few milliseconds, whatever the number of files), on GlusterFS from the statfs
    of the brick's own tmpfs (scripts/dfs/glusterfs.sh): the pages the volume's files hold, one atomic figure, offset
    by a walk of the case's root at the start (a walk is not one instant: while entries come and go it counts
    files evicted after it passed them beside files created ahead of it)."""

    def __init__(self, s: Suite, host: str = "a"):
        import threading

        self.argv = ["ip", "netns", "exec", s.env[f"KVTIER_DFS_NS_{host}"], "mfsdirinfo", "-n", s.root_on(host)]
        self.brick = s.env.get("KVTIER_DFS_BRICK")
        self.base = 0
        if self.brick:
            self.base = self.walk(os.path.join(self.brick, s.case)) - self.brick_pages()
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def walk(root: str) -> int:
        sizes = {}  # by inode: a temporary and the entry it was linked to are one file until the unlink
        for dirpath, _dirs, files in os.walk(root):
            if ".glusterfs" in dirpath or os.path.basename(dirpath) == "usage":
                continue
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                    sizes[st.st_ino] = st.st_size
                except FileNotFoundError:
                    pass
        return sum(sizes.values())

    def brick_pages(self) -> int:
        st = os.statvfs(self.brick)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def usage(self) -> int:
        if self.brick:
            return self.base + self.brick_pages()
        out = subprocess.run(self.argv, capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if line.strip().startswith("length:"):
                return int(line.split(":")[1])
        raise AssertionError(f"mfsdirinfo printed no length: {out!r}")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.usage())
            self.samples += 1
            if self.brick:
                time.sleep(0.0005)  # a statfs takes microseconds: leave the two cores to what is measured

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


BUDGET = 100 << 20


def case_budget_across_hosts(s: Suite) -> None:
    """M2: A and B, each with the same 100 MiB budget, store 200 distinct chunks each at once: the volume holds the
    one budget (peak within 5% of it). Then C joins with the same budget and stores enough to cross the high
    watermark together with A's and B's entries: it sees A's and B's
    usage (it evicts although its own entries are far below the budget) and the budget still holds."""
    args = [*s.engine_args, "--budget", str(BUDGET)]
    a = s.host("a", *args)
    b = s.host("b", *args)
    sampler = UsageSampler(s)
    a.send("store 0 200 4")
    b.send("store 100000 200 4")
    ra, rb = a._read(), b._read()
    peak_ab = sampler.stop()
    samples_ab = sampler.samples
    mib = 1 << 20
    after_ab = sampler.usage()
    if sampler.brick:  # the statfs figure against a walk, now that nothing changes (the offset is the same walk's)
        walked = sampler.walk(os.path.join(sampler.brick, s.case))
        figure("budget_brick_statfs", statfs_mib=f"{after_ab / mib:.2f}", walk_mib=f"{walked / mib:.2f}")
        check(abs(after_ab - walked) <= 2 << 20, f"the brick's statfs says {after_ab} B, a walk {walked} B")
    sa, sb = a.stats(), b.stats()
    c = s.host("c", *args)
    sampler = UsageSampler(s)
    # Enough to cross the high watermark only together with A's and B's entries (alone C stays far below it).
    n_c = max(0, int(0.95 * BUDGET - after_ab)) // CHUNK_FILE_BYTES + 8
    rc = c.cmd(f"store 200000 {n_c} 4")
    peak_c = sampler.stop()
    sc = c.stats()
    final = sampler.usage()
    figure("budget_across_hosts", budget_mib=BUDGET // mib, stored_a=ra["ok"], stored_b=rb["ok"],
           written_mib=(ra["ok"] + rb["ok"]) * CHUNK_FILE_BYTES // mib, peak_mib=f"{peak_ab / mib:.1f}",
           peak_ratio=f"{peak_ab / BUDGET:.3f}", after_mib=f"{after_ab / mib:.1f}", evictions_a=sa["evictions"],
           evictions_b=sb["evictions"], deduplicated=sa["stores_deduplicated"] + sb["stores_deduplicated"], samples=samples_ab, store_s=f"{max(ra['ms'], rb['ms']) / 1000:.1f}")
    figure("budget_third_host", stored_c=rc["ok"], own_mib=f"{n_c * CHUNK_FILE_BYTES / mib:.1f}", evictions_c=sc["evictions"], peak_mib=f"{peak_c / mib:.1f}",
           peak_ratio=f"{peak_c / BUDGET:.3f}", final_mib=f"{final / mib:.1f}")
    st = json.loads(s.cli("c", "stats", "--root", s.root_on("c"), "--json").stdout)["namespaces"][0]
    figure("budget_stats", usage_records=len(st["usage"]), usage_sum_mib=f"{st['usage_sum'] / mib:.1f}",
           entries_mib=f"{st['bytes'] / mib:.1f}")
    check(len(st["usage"]) >= 3, f"kvtier stats shows {len(st['usage'])} usage records, want one per live host")
    check(abs(st["usage_sum"] - st["bytes"]) <= 4 * CHUNK_FILE_BYTES,
          f"usage records sum {st['usage_sum']} B, the tree {st['bytes']} B; records {st['usage']}")
    # gc from a fourth place (host c's namespace, no engine of its own) removes entries; its correction record is
    # folded by a live engine, so every host's view of the usage follows (docs/operations.md, gc and the records).
    gc = s.cli("c", "gc", "--root", s.root_on("c"), "--budget", str(60 << 20))
    deadline = time.monotonic() + 10
    while True:
        st2 = json.loads(s.cli("c", "stats", "--root", s.root_on("c"), "--json").stdout)["namespaces"][0]
        folded = not any(u["name"].startswith("gc-") for u in st2["usage"])
        if (folded and abs(st2["usage_sum"] - st2["bytes"]) <= 4 * CHUNK_FILE_BYTES) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    figure("budget_gc", gc_rc=gc.returncode, after_gc_mib=f"{st2['bytes'] / mib:.1f}",
           usage_sum_mib=f"{st2['usage_sum'] / mib:.1f}", correction_folded=folded)
    check(gc.returncode == 0 and st2["bytes"] <= 60 << 20, f"gc: rc {gc.returncode}: {gc.stdout[-400:]}")
    check(folded and abs(st2["usage_sum"] - st2["bytes"]) <= 4 * CHUNK_FILE_BYTES,
          f"after gc the records sum {st2['usage_sum']} B, the tree {st2['bytes']} B (correction folded: {folded})")
    check(ra["ok"] + ra["failed"] == 200 and rb["ok"] + rb["failed"] == 200, f"stores {ra} {rb}")
    check(peak_ab <= BUDGET * 1.05, f"peak {peak_ab / mib:.1f} MiB over the 100 MiB budget + 5%")
    check(after_ab <= BUDGET, f"{after_ab / mib:.1f} MiB left after the stores")
    check(sc["evictions"] > 0, "host C did not evict: it did not see the others' usage")
    check(peak_c <= BUDGET * 1.05, f"peak {peak_c / mib:.1f} MiB with C over the budget + 5%")


def case_cross_host_hit(s: Suite) -> None:
    """M3: B looks a key up (a miss, remembered), A publishes it; B's lookups find it within the shared negative
    cache's bound (shared_negative_cache_ms, 50 ms, plus the filesystem's delay), not after negative_cache_ms."""
    b = s.host("b", *s.engine_args)
    a = s.host("a", *s.engine_args)
    lat = []
    for k in range(20):
        check(b.cmd(f"lookup {k} 1")["hits"] == 0, "a hit before the store")
        check(a.cmd(f"store {k} 1")["ok"] == 1, "store failed")
        r = b.cmd(f"waithit {k} 5000")
        check(r["hit"], f"key {k} published on A never became a hit on B")
        lat.append(r["ms"])
    lat.sort()
    figure("cross_host_hit", keys=len(lat), median_ms=f"{lat[len(lat) // 2]:.1f}", max_ms=f"{lat[-1]:.1f}",
           bound_ms=50)
    # Not a timing test: only that the 1000 ms negative cache of local roots no longer hides other hosts' entries.
    check(lat[-1] < 500, f"a cross-host hit took {lat[-1]:.0f} ms: the negative cache hid it")


def case_lru_across_hosts(s: Suite) -> None:
    """M3: a hit on B refreshes the entry's mtime, so A's eviction (and gc) takes the entry least recently used on
    any host, not the oldest publication."""
    args = [*s.engine_args, "--touch-s", "1", "--budget", str(4 * CHUNK_FILE_BYTES)]
    a = s.host("a", *args)
    check(a.cmd("store 0 3 1")["ok"] == 3, "store failed")  # key 0 oldest, then 1, then 2
    time.sleep(2.2)  # older than touch_interval_s
    b = s.host("b", *args)
    check(b.cmd("load 0 1")["ok"] == 1, "B could not load key 0")
    mt = {k: os.stat(p).st_mtime for k, p in s.chunk_paths("a").items()}
    check(a.cmd("store 3 1")["ok"] == 1, "store failed")  # over the high watermark: one entry goes
    left = set(s.chunk_paths("a"))
    paths = s.key_names(a, 4)
    figure("lru_across_hosts", entries_left=len(left), key0_kept=paths[0] in left, key1_kept=paths[1] in left,
           key0_touched=f"{mt[paths[0]] - mt[paths[1]]:.1f}s")
    check(mt[paths[0]] > mt[paths[1]], "B's hit did not refresh key 0's mtime")
    check(paths[0] in left, "A evicted key 0, which B had just used (FIFO, not LRU across hosts)")
    check(paths[1] not in left, "A did not evict key 1, the least recently used entry")


def case_concurrent_same_keys(s: Suite) -> None:
    """L4 across hosts: A and B store the same 50 keys at once. Every store succeeds (one link wins, the other's
    EEXIST is success), each key is one complete entry, and both hosts load identical, correct bytes."""
    a = s.host("a", *s.engine_args)
    b = s.host("b", *s.engine_args)
    a.send("store 0 50 5")
    b.send("store 0 50 5")
    ra, rb = a._read(), b._read()
    la, lb = a.cmd("load 0 50"), b.cmd("load 0 50")
    sa, sb = a.stats(), b.stats()
    after = s.entries("b")
    full = sum(1 for v in after.values() if v == CHUNK_FILE_BYTES)
    figure("concurrent_same_keys", stored_a=ra["ok"], stored_b=rb["ok"],
           deduplicated=sa["stores_deduplicated"] + sb["stores_deduplicated"], loaded_a=la["ok"], loaded_b=lb["ok"],
           wrong_bytes=la["wrong"] + lb["wrong"], entries=len(after), entries_full=full,
           corrupt_counted=sa["corrupt_entries"] + sb["corrupt_entries"])
    check(ra["ok"] == 50 and rb["ok"] == 50, f"stores {ra} {rb}")
    check(len(after) == 50 and full == 50, f"{len(after)} entries, {full} complete")
    check(la["ok"] == 50 and lb["ok"] == 50 and la["wrong"] + lb["wrong"] == 0, f"loads {la} {lb}")
    check(sa["corrupt_entries"] + sb["corrupt_entries"] == 0, "entries counted corrupt")


def case_sigkill_mid_store(s: Suite) -> None:
    """A host SIGKILLed mid-store: the other keeps serving its entries and every entry A published loads with the
    right bytes; what A leaves behind are temporaries only, and fsck finds the tree clean."""
    b = s.host("b", *s.engine_args)
    check(b.cmd("store 100000 20 4")["ok"] == 20, "B's stores failed")
    a = s.host("a", *s.engine_args)
    a.send("store 0 300 2")
    deadline = time.monotonic() + 60
    while len(s.entries("b")) < 20 + 10 and time.monotonic() < deadline:  # A is well into its store
        time.sleep(0.05)
    os.kill(a.pid, 9)
    a.proc.wait()
    served = b.cmd("load 100000 20")
    published = sorted(s.entries("b").items())
    keys_a = [n for n, _ in published]
    names = s.key_names(b, 300)
    stored_a = [i for i, n in enumerate(names) if n in keys_a]
    la_ok = la_wrong = 0
    for i in stored_a:
        r = b.cmd(f"load {i} 1")
        la_ok += r["ok"]
        la_wrong += r["wrong"]
    temps = [f for _d, _s, fs in os.walk(s.root_on("b")) for f in fs if f.startswith(".tmp.")]
    fsck = s.cli("b", "fsck", "--root", s.root_on("b"))
    sb = b.stats()
    figure("sigkill_mid_store", a_published_before_kill=len(stored_a), b_served=served["ok"], a_entries_loaded=la_ok,
           wrong_bytes=served["wrong"] + la_wrong, temporaries_left=len(temps), fsck_rc=fsck.returncode,
           corrupt_counted=sb["corrupt_entries"])
    check(0 < len(stored_a) < 300, f"A published {len(stored_a)} of 300 before the kill: not a mid-store kill")
    check(served["ok"] == 20 and served["wrong"] == 0, f"B stopped serving: {served}")
    check(la_ok == len(stored_a) and la_wrong == 0, f"A's published entries: {la_ok} of {len(stored_a)} loaded")
    check(fsck.returncode == 0, f"fsck after the kill: rc {fsck.returncode}: {fsck.stdout[-800:]} {fsck.stderr[-800:]}")
    check(sb["corrupt_entries"] == 0, "entries counted corrupt")


CASES = {
    "chase_while_storing": case_chase_while_storing,
    "young_short_entry_kept": case_young_short_entry_kept,
    "budget_across_hosts": case_budget_across_hosts,
    "cross_host_hit": case_cross_host_hit,
    "lru_across_hosts": case_lru_across_hosts,
    "concurrent_same_keys": case_concurrent_same_keys,
    "sigkill_mid_store": case_sigkill_mid_store,
    "publish_then_load": case_publish_then_load,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", required=True, help="the env file scripts/dfs/moosefs.sh up wrote")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--kvtier", required=True)
    ap.add_argument("-k", action="append", default=[], help="run only these cases")
    args = ap.parse_args()
    env = read_env(args.env)
    run_id = f"run-{os.getpid()}-{int(time.time())}"
    failed = []
    for name, fn in CASES.items():
        if args.k and name not in args.k:
            continue
        s = Suite(env, args.tool, args.kvtier)
        s.case = f"{run_id}/{name}"
        os.makedirs(s.root_on(env["KVTIER_DFS_HOSTS"].split()[0]), mode=0o750, exist_ok=True)
        t0 = time.monotonic()
        print(f"=== multihost ({env.get('KVTIER_DFS', '?')}): {name}", flush=True)
        try:
            fn(s)
            print(f"--- PASS {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - a failed case is reported and the suite goes on
            failed.append(name)
            traceback.print_exc() if not isinstance(e, AssertionError) else None
            print(f"--- FAIL {name} ({time.monotonic() - t0:.1f} s): {e}", flush=True)
        finally:
            for h in s.hosts_started:
                h.close()
    print(f"=== multihost: {'FAILED: ' + ' '.join(failed) if failed else 'all cases passed'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
