"""Keys of the caller's choosing: what the key index costs, and what a keyed call costs
beside an unkeyed one, in one run. Prints two tables.

1. **Memory** (no Ray): a partition's key index (``raydelay.log.keys.KeyIndex``) takes in
   ``--pending`` keyed delayed messages (``order-<i>``, due over a day) as committed ledger
   objects of 50,000 entries, the way the log feeds it. An unkeyed message puts nothing
   in this index, and everything else a partition keeps for a pending message (its
   tracker entry, its row in a bucket) is the same keyed or not, so the index's bytes per
   key are the keyed message's extra memory. Measured: what the index holds (``nbytes``:
   its columns, its recent dict, its bitmap); the resident memory a restarted host's
   index takes, loaded from its base; and the resident memory grown while filling it
   (which counts the objects the fill made and Python kept for reuse). Also: a lookup's
   time at that size.
2. **Calls** (``--calls N``, a local raydelay on a temp local-dir store, fsync on): per
   round, in alternating order, N sends of each kind from one Python client, p50/p99:
   an unkeyed send (the floor), a keyed send of a new key, a keyed send of a pending key
   (``ignore``), a ``replace``; and cancels by id and by key of messages sent for an
   hour later.

Usage: python bench/keys_bench.py [--pending 10000000] [--calls 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydelay.console import table  # noqa: E402
from raydelay.log.entries import Entries, LedgerObject  # noqa: E402
from raydelay.log.keys import KeyIndex  # noqa: E402

OBJECT = 50_000  # entries per ledger object fed to the index
DAY_MS = 86_400_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def memory(pending: int) -> list[list[str]]:
    gc.collect()
    before = rss_bytes()
    index = KeyIndex()
    now = int(time.time() * 1000)
    rng = np.random.default_rng(7)
    started = time.perf_counter()
    for lo in range(0, pending, OBJECT):
        n = min(OBJECT, pending - lo)
        keys = [f"order-{i}" for i in range(lo, lo + n)]
        due = now + 60_000 + rng.integers(0, DAY_MS, n)
        entries = Entries.build([b""] * n, due, keys)
        index.observe(LedgerObject(1 + lo // OBJECT, 0, now, entries, {}))
        index.take_delta()  # (the log cuts a delta at each ledger roll: its changes go)
        del keys, entries
        if lo // OBJECT % 40 == 0:
            print(f"  {lo + n:,} of {pending:,} keys in", file=sys.stderr)
    index.merge()
    fill_s = time.perf_counter() - started
    gc.collect()
    grown = rss_bytes() - before
    # what a restarted host holds: the index loaded from its base (no fill-time garbage)
    base = index.base(now)
    gc.collect()
    at_load = rss_bytes()
    loaded = KeyIndex()
    loaded.apply(base)
    gc.collect()
    resident = rss_bytes() - at_load
    del loaded, base
    probes = [f"order-{i}" for i in rng.integers(0, pending, 2_000)]
    t0 = time.perf_counter()
    hits = sum(1 for k in probes if index.candidates(k, now))
    lookup_us = (time.perf_counter() - t0) / len(probes) * 1e6
    assert hits == len(probes), "every key sent is pending"
    return [
        ["pending keyed messages", f"{pending:,}"],
        ["index bytes per key (nbytes)", f"{index.nbytes() / pending:.2f}"],
        ["resident per key, the index loaded from its base", f"{resident / pending:.2f}"],
        ["resident grown per key while filling (with fill-time garbage)", f"{grown / pending:.2f}"],
        ["unkeyed message, bytes in the index", "0"],
        ["a key's lookup (candidates), us", f"{lookup_us:.1f}"],
        ["taking in the keys, keys/s", f"{pending / fill_s:,.0f}"],
    ]


def ms(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def calls(n: int, rounds: int) -> list[list[str]]:
    import raydelay

    root = tempfile.mkdtemp(prefix="keys-bench-")
    cluster = raydelay.connect({"storage": {"kind": "local", "local": {"root": root}}})
    cluster.create_topic("keys-bench", partitions=2)
    cluster.subscribe("keys-bench", "s").close()
    producer = cluster.create_producer("keys-bench")
    hour = 3_600
    times: dict[str, list[float]] = {
        k: [] for k in ("unkeyed", "new key", "pending key (ignore)", "replace", "id", "key")
    }
    counter = iter(range(10**9))

    def timed(name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)

    for _ in range(20):  # warm both paths
        producer.send(b"w", deliver_after=hour)
        producer.send(b"w", deliver_after=hour, key=f"warm-{next(counter)}")
    for r in range(rounds):
        kinds = ["sends", "cancels"] if r % 2 == 0 else ["cancels", "sends"]
        for kind in kinds:
            for _ in range(n):
                if kind == "sends":
                    k = f"k-{next(counter)}"
                    timed("unkeyed", lambda: producer.send(b"p", deliver_after=hour))
                    timed("new key", lambda k=k: producer.send(b"p", deliver_after=hour, key=k))
                    timed(
                        "pending key (ignore)",
                        lambda k=k: producer.send(b"q", deliver_after=hour, key=k),
                    )
                    timed(
                        "replace",
                        lambda k=k: producer.send(
                            b"r", deliver_after=hour, key=k, on_duplicate="replace"
                        ),
                    )
                else:
                    mid = producer.send(b"c", deliver_after=hour)
                    k = f"c-{next(counter)}"
                    producer.send(b"c", deliver_after=hour, key=k)
                    timed("id", lambda mid=mid: cluster.cancel([mid]))
                    timed("key", lambda k=k: cluster.cancel("keys-bench", key=k))
        print(f"round {r + 1} of {rounds} done", file=sys.stderr)
    cluster.shutdown()
    floor = ms(times["unkeyed"], 50)
    rows = []
    for name in ("unkeyed", "new key", "pending key (ignore)", "replace"):
        t = times[name]
        rows.append(
            [f"send: {name}", f"{ms(t, 50):.2f} / {ms(t, 99):.2f}", f"{ms(t, 50) / floor:.2f}x"]
        )
    by_id = ms(times["id"], 50)
    for name in ("id", "key"):
        t = times[name]
        rows.append(
            [f"cancel by {name}", f"{ms(t, 50):.2f} / {ms(t, 99):.2f}", f"{ms(t, 50) / by_id:.2f}x"]
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending", type=int, default=10_000_000)
    ap.add_argument("--calls", type=int, default=300, help="calls of each kind per round; 0: none")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(table(["memory", "figure"], memory(args.pending)))
    if args.calls:
        print(
            table(
                ["call (Python client)", "p50 / p99 ms", "vs its floor"],
                calls(args.calls, args.rounds),
            )
        )
        print(
            f"({args.calls} calls of each kind per round, {args.rounds} rounds alternating; "
            "2 partitions, one subscription, local-dir store, fsync on; the floor of the sends "
            "is the unkeyed send, of the cancels the cancel by id)"
        )


if __name__ == "__main__":
    main()
