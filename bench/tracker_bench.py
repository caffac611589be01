"""Delayed-index benchmarks (issue: the delayed-delivery index). Prints a table.

1. add + drain: N positions (ledgers of 50k entries, deliver_at uniform over 1 hour,
   add_messages in batches of 10k), drained by stepping a ManualClock one second at a
   time; the same work done with a plain heapq of (deliver_at, ledger, entry) tuples,
   in the same run. Ratio = heapq time / tracker time.
2. memory: RSS growth per pending position after adding M positions to a bucket
   tracker on a LocalDirObjectStore (tick 10, strict, other settings default); each
   measurement runs in a fresh interpreter. heapq's figure is given for reference.
3. flat memory (--scale N): RSS at every 10M pending, up to N.
4. call latency in real time: 500k positions/s added in batches of 10k (deliver_at 1-5 s
   ahead) on a SystemClock, popping what is due in between, for 12 s: over a hundred seals
   and dozens of merges (max_num_buckets 16) happen meanwhile. p50 / p99 / worst of each
   call, and the lateness of what was popped; a seal or merge that stalled the caller
   would show as the worst call.

Usage: python bench/tracker_bench.py [--positions 1000000] [--memory 5000000] [--scale 0]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydelay.clock import ManualClock  # noqa: E402
from raydelay.delayed import (  # noqa: E402
    BucketDelayedDeliveryTracker,
    InMemoryBucketRegistry,
    InMemoryDelayedDeliveryTracker,
)
from raydelay.storage import LocalDirObjectStore  # noqa: E402

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
LEDGER = 50_000
BATCH = 10_000


def batches(n: int, seed: int = 7):
    """(ledger_ids, entry_ids, deliver_ats) batches in log order."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, BATCH):
        idx = np.arange(start, min(n, start + BATCH), dtype=np.int64)
        yield idx // LEDGER + 1, idx % LEDGER, T0 + 1_000 + rng.integers(0, HOUR_MS, len(idx))


def bucket_tracker(tmp: str, clock, name: str, **kw) -> BucketDelayedDeliveryTracker:
    """The bench's bucket tracker: local dir store (its I/O on the caller's thread), tick
    10 ms, strict, other settings as given."""
    return BucketDelayedDeliveryTracker(
        store=LocalDirObjectStore(tmp),
        registry=InMemoryBucketRegistry(),
        name=f"subs/bench/0/{name}",
        clock=clock,
        tick_time_ms=10,
        strict=True,
        **kw,
    )


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_tracker(kind: str, n: int, tmp: str) -> dict:
    clock = ManualClock(T0)
    if kind == "memory":
        t = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=10, strict=True)
    else:
        t = bucket_tracker(tmp, clock, kind)
    data = list(batches(n))
    add_lat, pop_lat = [], []
    started = time.perf_counter()
    for ls, es, ds in data:
        a = time.perf_counter()
        t.add_messages(ls, es, ds)
        add_lat.append(time.perf_counter() - a)
    added = time.perf_counter()
    delivered = 0
    for second in range(0, HOUR_MS // 1000 + 3):
        clock.set(T0 + second * 1000)
        while True:
            a = time.perf_counter()
            got = t.get_scheduled_messages(100_000)
            pop_lat.append(time.perf_counter() - a)
            delivered += len(got)
            if len(got) < 100_000:
                break
    # Synthetic time runs far ahead of background loads; whatever they had not brought in
    # by the last step comes out here (counted, so a loss would still show).
    tail = 0
    for _ in range(1_000):
        if t.number_of_delayed_messages() == 0:
            break
        t.flush()
        got = t.get_scheduled_messages(1_000_000)
        tail += len(got)
    delivered += tail
    finished = time.perf_counter()
    stats = t.stats() if hasattr(t, "stats") else {}
    t.close()
    return {
        "add_s": added - started,
        "drain_s": finished - added,
        "total_s": finished - started,
        "delivered": delivered,
        "tail": tail,
        "worst_add_ms": max(add_lat) * 1e3,
        "p99_add_ms": float(np.percentile(add_lat, 99)) * 1e3,
        "p50_add_ms": float(np.percentile(add_lat, 50)) * 1e3,
        "worst_pop_ms": max(pop_lat) * 1e3,
        "p99_pop_ms": float(np.percentile(pop_lat, 99)) * 1e3,
        "stats": stats,
    }


def run_steady(seconds: float, rate: int, tmp: str) -> dict:
    """Real time: add ``rate`` positions/s in batches of 10k (deliver_at 1-5 s ahead) and pop
    what is due between batches, on a SystemClock, with background I/O."""
    from raydelay.clock import SystemClock

    clock = SystemClock()
    t = bucket_tracker(tmp, clock, "steady", max_num_buckets=16)
    rng = np.random.default_rng(3)
    due_at = {}
    add_lat, pop_lat, lateness = [], [], []
    period = BATCH / rate
    steps = int(seconds / period)
    started = time.perf_counter()
    for step in range(steps):
        idx = np.arange(step * BATCH, (step + 1) * BATCH, dtype=np.int64)
        ds = clock.now_ms() + rng.integers(1_000, 5_000, BATCH)
        due_at[step] = ds
        a = time.perf_counter()
        t.add_messages(idx // LEDGER + 1, idx % LEDGER, ds)
        add_lat.append(time.perf_counter() - a)
        while True:
            a = time.perf_counter()
            got = t.get_scheduled_messages(100_000)
            pop_lat.append(time.perf_counter() - a)
            now = clock.now_ms()
            for lg, e in got:
                i = (lg - 1) * LEDGER + e
                lateness.append(now - int(due_at[i // BATCH][i % BATCH]))
            nxt = started + (step + 1) * period
            if time.perf_counter() >= nxt:
                break
            time.sleep(min(0.002, max(0.0, nxt - time.perf_counter())))
    stats = t.stats()
    t.close()
    ms = lambda xs, q: float(np.percentile(xs, q)) * 1e3  # noqa: E731
    late = np.array(lateness)
    return {
        "steps": steps,
        "added": steps * BATCH,
        "elapsed_s": time.perf_counter() - started,
        "p50_add_ms": ms(add_lat, 50),
        "p99_add_ms": ms(add_lat, 99),
        "worst_add_ms": max(add_lat) * 1e3,
        "p50_pop_ms": ms(pop_lat, 50),
        "p99_pop_ms": ms(pop_lat, 99),
        "worst_pop_ms": max(pop_lat) * 1e3,
        "popped": len(late),
        "late_p50": float(np.percentile(late, 50)),
        "late_p99": float(np.percentile(late, 99)),
        "late_max": int(late.max()),
        "early": int((late < 0).sum()),
        "stats": stats,
    }


def run_heapq(n: int) -> dict:
    data = list(batches(n))
    heap: list[tuple[int, int, int]] = []
    started = time.perf_counter()
    for ls, es, ds in data:
        for d, lg, e in zip(ds.tolist(), ls.tolist(), es.tolist()):
            heapq.heappush(heap, (d, lg, e))
    added = time.perf_counter()
    delivered = 0
    for second in range(0, HOUR_MS // 1000 + 3):
        cutoff = T0 + second * 1000
        out = []
        while heap and heap[0][0] <= cutoff:
            _, lg, e = heapq.heappop(heap)
            out.append((lg, e))
        out.sort()
        delivered += len(out)
    finished = time.perf_counter()
    return {
        "add_s": added - started,
        "drain_s": finished - added,
        "total_s": finished - started,
        "delivered": delivered,
    }


# -- memory, in a fresh interpreter each ------------------------------------------------------


def memory_child(kind: str, n: int, checkpoints: list[int]) -> None:
    tmp = tempfile.mkdtemp(prefix="rd-mem-")
    clock = ManualClock(T0)
    gc.collect()
    if kind == "heapq":
        base = rss_bytes()
        heap: list = []
        series = []
        for ls, es, ds in batches(n):
            for d, lg, e in zip(ds.tolist(), ls.tolist(), es.tolist()):
                heapq.heappush(heap, (d, lg, e))
            if len(heap) in checkpoints:
                series.append((len(heap), rss_bytes() - base))
        print(json.dumps({"base": base, "series": series}))
        return
    t = bucket_tracker(tmp, clock, "memory")
    # warm up imports and allocator pools before the baseline
    t.add_messages(np.array([0]), np.array([0]), np.array([T0 + 5_000]))
    gc.collect()
    base = rss_bytes()
    series = []
    pending = 0
    for ls, es, ds in batches(n):
        t.add_messages(ls, es, ds)
        pending += len(ls)
        if pending in checkpoints:
            t.flush()
            gc.collect()
            series.append(
                (pending, rss_bytes() - base, t.immutable_bucket_count(), t.buffer_memory_usage())
            )
            print(
                f"  .. {pending:,} pending, rss +{(rss_bytes() - base) / 2**20:.1f} MiB",
                file=sys.stderr,
                flush=True,
            )
    store_bytes = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    t.close()
    print(json.dumps({"base": base, "series": series, "store_bytes": store_bytes}))


def measure_memory(kind: str, n: int, checkpoints: list[int]) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--n",
            str(n),
            "--checkpoints",
            ",".join(map(str, checkpoints)),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--positions", type=int, default=1_000_000, help="positions for add + drain (default 1M)"
    )
    ap.add_argument(
        "--memory",
        type=int,
        default=5_000_000,
        help="positions for the RSS measurement (default 5M)",
    )
    ap.add_argument(
        "--steady-rate",
        type=int,
        default=500_000,
        help="positions/s in the real-time latency run (default 500k)",
    )
    ap.add_argument(
        "--steady-s",
        type=float,
        default=12.0,
        help="seconds of the real-time latency run (default 12)",
    )
    ap.add_argument(
        "--scale",
        type=int,
        default=0,
        help="also run the flat-memory series up to this many (e.g. 50000000)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoints", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        memory_child(args.child, args.n, [int(x) for x in args.checkpoints.split(",")])
        return

    n = args.positions
    print(
        f"tracker_bench: {n:,} positions, deliver_at uniform over 1 h, batches of {BATCH:,}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rd-bench-") as tmp:
        print("  running heapq ...", flush=True)
        hq = run_heapq(n)
        print("  running bucket tracker (local dir store) ...", flush=True)
        bucket = run_tracker("bucket", n, tmp)
        print("  running in-memory tracker ...", flush=True)
        mem = run_tracker("memory", n, tmp)
    for r in (hq, bucket, mem):
        assert r["delivered"] == n, f"delivered {r['delivered']} of {n}"

    print()
    print("## 1. add + drain (same work, same run)")
    print(
        f"| {'implementation':<38} | {'add s':>7} | {'drain s':>7} | {'total s':>7} | {'vs heapq':>8} |"
    )
    print(f"|{'-' * 40}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 10}|")
    rows = (
        ("heapq (no durability)", hq),
        ("Bucket tracker, local dir", bucket),
        ("InMemoryDelayedDeliveryTracker", mem),
    )
    for name, r in rows:
        ratio = hq["total_s"] / r["total_s"]
        print(
            f"| {name:<38} | {r['add_s']:7.2f} | {r['drain_s']:7.2f} | {r['total_s']:7.2f} | {ratio:7.2f}x |"
        )
    s = bucket["stats"]
    print(
        f"bucket work during the run: sealed {s['sealed']}, merged {s['merged']}, segments loaded "
        f"{s['segments_loaded']}, downgraded {s['downgraded']}, bytes written {s['bytes_written']:,}"
    )

    print()
    print(
        f"## 4. call latency in real time: {args.steady_rate:,} positions/s for {args.steady_s:.0f} s, "
        "deliver_at 1-5 s ahead, max_num_buckets 16",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rd-steady-") as tmp:
        st = run_steady(args.steady_s, args.steady_rate, tmp)
    print(f"| {'call':<22} | {'p50 ms':>7} | {'p99 ms':>7} | {'worst ms':>8} |")
    print(f"|{'-' * 24}|{'-' * 9}|{'-' * 9}|{'-' * 10}|")
    print(
        f"| {'add_messages (10k)':<22} | {st['p50_add_ms']:7.2f} | {st['p99_add_ms']:7.2f} | {st['worst_add_ms']:8.2f} |"
    )
    print(
        f"| {'get_scheduled_messages':<22} | {st['p50_pop_ms']:7.2f} | {st['p99_pop_ms']:7.2f} | {st['worst_pop_ms']:8.2f} |"
    )
    s2 = st["stats"]
    print(
        f"during it: added {st['added']:,} in {st['elapsed_s']:.1f} s, popped {st['popped']:,}; sealed {s2['sealed']}, "
        f"merged {s2['merged']}, segments loaded {s2['segments_loaded']}, downgraded {s2['downgraded']}"
    )
    print(
        f"lateness of popped positions (pop time - deliver_at): p50 {st['late_p50']:.0f} ms, p99 {st['late_p99']:.0f} ms, "
        f"max {st['late_max']} ms, early {st['early']}"
    )

    m = args.memory
    print()
    print(
        f"## 2. memory: RSS growth per pending position at {m:,} (fresh process each)", flush=True
    )
    b = measure_memory("bucket", m, [m])
    pending, grown, buckets, est = b["series"][-1]
    h = measure_memory("heapq", min(m, 5_000_000), [min(m, 5_000_000)])
    hp, hg = h["series"][-1]
    print(
        f"| {'implementation':<34} | {'pending':>11} | {'RSS growth MiB':>14} | {'B/pending':>9} |"
    )
    print(f"|{'-' * 36}|{'-' * 13}|{'-' * 16}|{'-' * 11}|")
    print(
        f"| {'BucketDelayedDeliveryTracker':<34} | {pending:>11,} | {grown / 2**20:14.1f} | {grown / pending:9.2f} |"
    )
    print(
        f"| {'heapq of tuples (reference)':<34} | {hp:>11,} | {hg / 2**20:14.1f} | {hg / hp:9.2f} |"
    )
    print(
        f"bucket tracker: {buckets} immutable buckets, own estimate {est / 2**20:.1f} MiB, store {b['store_bytes'] / 2**20:.1f} MiB "
        f"({b['store_bytes'] / pending:.1f} B/position on disk)"
    )

    if args.scale:
        step = 10_000_000
        points = list(range(step, args.scale + 1, step))
        print()
        print(f"## 3. flat memory: RSS as pending grows to {args.scale:,}", flush=True)
        r = measure_memory("bucket", args.scale, points)
        print(f"| {'pending':>11} | {'RSS growth MiB':>14} | {'B/pending':>9} | {'buckets':>7} |")
        print(f"|{'-' * 13}|{'-' * 16}|{'-' * 11}|{'-' * 9}|")
        for pending, grown, buckets, _ in r["series"]:
            print(
                f"| {pending:>11,} | {grown / 2**20:14.1f} | {grown / pending:9.2f} | {buckets:>7} |"
            )
        print(f"store: {r['store_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
