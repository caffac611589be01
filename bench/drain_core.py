"""An overdue backlog drained through the pure core, in one process, no Ray. Prints a table.

``bench/drain_buckets.py`` measures the drain through the actors; this one measures only
what the subscription's own code costs, so that a change to the delivery path can be
weighed without Ray's calls and the store's threads around it. It seals ``--messages``
rows (100-byte payloads, due uniformly over one minute, all overdue) into buckets of one
ledger each, into an in-memory store, three ways: 50,000-row ledgers (a few dozen
buckets); 2,000-row ledgers (about a thousand buckets) merged down to ``--max-buckets`` as
a partition merges them (a meta over their runs); and the same left unmerged. Then one
shared subscription adopts them and drains them the way its actor does: a step (which
asks for loads; they are done at once), ``collect_due``, the staged rows of the keys to
hand out, ``deliver`` and an ``ack`` of the whole batch, ``--receive`` at a time.

Usage: python bench/drain_core.py [--messages 2000000] [--receive 10000] [--max-buckets 64]
       [--profile]   (cProfile of each run's drain, the 25 costliest calls)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydelay.clock import ManualClock  # noqa: E402
from raydelay.delayed import InMemoryDelayedDeliveryTracker  # noqa: E402
from raydelay.delayed.reader import SealedReader  # noqa: E402
from raydelay.delayed.sealed import SealedMeta, TopicIndex, merge_metas, seal  # noqa: E402
from raydelay.delayed.store import SealedStore  # noqa: E402
from raydelay.dispatch.subscription import Subscription  # noqa: E402
from raydelay.log.entries import Entries, LedgerObject  # noqa: E402
from raydelay.storage.memory import MemoryObjectStore  # noqa: E402

FIRST_DUE = 1_000_000
SPREAD_MS = 60_000
NOW = FIRST_DUE + SPREAD_MS + 1_000  # everything overdue


def build(n: int, per_ledger: int, max_buckets: int) -> tuple[SealedStore, list[SealedMeta]]:
    """Buckets of one ledger of ``per_ledger`` rows each, merged down to ``max_buckets``
    adjacent ones at a time (0: not merged)."""
    store = SealedStore(MemoryObjectStore(), "t", 0)
    rng = np.random.default_rng(1)
    payloads = [b"x" * 100] * per_ledger
    metas: list[SealedMeta] = []
    for ledger in range(1, n // per_ledger + 1):
        due = FIRST_DUE + rng.integers(0, SPREAD_MS, per_ledger).astype(np.int64)
        index = TopicIndex(min_index_count=1, sealed_through=ledger - 1)
        index.add(LedgerObject(ledger, 0, 0, Entries.build(payloads, due), {}))
        job = index.ledger_closed(ledger)
        assert job is not None and job.rows is not None
        meta, data, idx = seal(
            job.rows,
            start_ledger=ledger,
            end_ledger=ledger,
            bucket_id=ledger,
            max_indexes=5_000,
            max_step_ms=300_000,
        )
        store.write(meta, data, idx)
        metas.append(meta)
    if max_buckets <= 0 or len(metas) <= max_buckets:
        return store, metas
    per = -(-len(metas) // max_buckets)
    merged = []
    for i in range(0, len(metas), per):
        chunk = metas[i : i + per]
        if len(chunk) == 1:
            merged.append(chunk[0])
            continue
        meta = merge_metas(chunk, bucket_id=100_000 + i, group_rows=5_000)
        store.write_merged(meta, chunk)
        merged.append(meta)
    return store, merged


def drain(store: SealedStore, metas: list[SealedMeta], n: int, receive: int, profile: bool) -> dict:
    clock = ManualClock(NOW)
    reader = SealedReader()
    tracker = InMemoryDelayedDeliveryTracker(clock=clock, tick_time_ms=1, strict=True)
    sub = Subscription(
        name="t/0/s", subscription_type="shared", tracker=tracker, clock=clock, sealed=reader
    )
    for meta in metas:
        sub.adopt(meta)
    sub.add_consumer("c")
    got, now, load_s, receives = 0, NOW, 0.0, 0
    prof = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if prof:
        prof.enable()
    while got < n:
        step = sub.step(now)
        t = time.perf_counter()
        for ld in step.loads:  # as the actor does them (there: on threads, in parallel)
            rows = [store.segment(p.run_key, p.offset, p.length) for p in ld.reads]
            bucket = reader.buckets[ld.key]
            keys = store.part_keys(bucket.meta, ld.keys_only) if ld.keys_only else []
            reader.install(ld.key, ld.no, rows, keys)
        load_s += time.perf_counter() - t
        sub.collect_due(now, receive)
        groups, need = sub.staged(sub.keys_to_fetch(receive))
        if len(need):
            raise AssertionError(f"{len(need)} rows were not staged with their payloads")
        out = sub.deliver("c", groups, receive, now)
        keys = np.concatenate([dv.keys for dv in out]) if out else np.zeros(0, np.int64)
        if not len(keys) and not step.loads:
            raise AssertionError(f"the drain stalled at {got:,} of {n:,}")
        sub.ack("c", keys)
        got += len(keys)
        receives += 1
        now += 1
    seconds = time.perf_counter() - started
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return {"seconds": seconds, "load_s": load_s, "receives": receives, "rate": n / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--receive", type=int, default=10_000)
    ap.add_argument("--max-buckets", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.messages < 50_000 or args.receive < 1 or args.max_buckets < 2:
        ap.error("need --messages >= 50000, --receive >= 1 and --max-buckets >= 2")
    n = args.messages - args.messages % 50_000  # whole ledgers in every layout
    runs = [
        ("50,000-row ledgers", 50_000, 0),
        (f"2,000-row ledgers, merged to {args.max_buckets}", 2_000, args.max_buckets),
        ("2,000-row ledgers, not merged", 2_000, 0),
    ]
    rows = []
    for label, per_ledger, max_buckets in runs:
        print(f"  {label}: sealing ...", file=sys.stderr, flush=True)
        store, metas = build(n, per_ledger, max_buckets)
        print(f"  {label}: draining ...", file=sys.stderr, flush=True)
        rows.append((label, len(metas), drain(store, metas, n, args.receive, args.profile)))
    base = rows[0][2]["rate"]
    print(f"\n## Overdue drain through the core, {n:,} messages, receive x{args.receive:,}\n")
    print(
        "| ledgers | buckets | drain msg/s | vs the first | seconds | of which loads s | receives |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, buckets, r in rows:
        print(
            f"| {label} | {buckets:,} | {r['rate']:,.0f} | {r['rate'] / base:.2f}x "
            f"| {r['seconds']:.2f} | {r['load_s']:.2f} | {r['receives']:,} |"
        )


if __name__ == "__main__":
    main()
