"""What Key_Shared costs next to Shared, in one run. Prints a table.

One topic (``--partitions``) gets a backlog of ``--messages`` over ``--keys`` keys, half
immediate and half due together a few seconds after the load (the delayed half goes
through the topic's sealed buckets). Two subscriptions of it, one ``shared`` and one
``key_shared``, exist before the load, so both hold the same backlog. Each is then drained
by ``--consumers`` consumers (one thread each, ``receive_batch`` + ``ack``), one
subscription after the other. Reported per subscription: the drain rate, whether every
message arrived once, and for key_shared whether each key stayed on one consumer and in
send order (the immediate ones among themselves, the delayed ones among themselves: an
immediate message sent after a delayed one of its key was deliverable before it).

Usage: python bench/key_shared.py [--messages 200000] [--keys 1000] [--consumers 4]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import raydelay  # noqa: E402
from raydelay.clock import now_ms  # noqa: E402

TOPIC = "ks-bench"


def drain(cluster, sub: str, kind: str, n: int, consumers: int) -> dict:
    cs = [cluster.subscribe(TOPIC, sub, kind) for _ in range(consumers)]
    # per consumer: ((key, "d" delayed / "i" immediate), seq) received
    seen: list[list[tuple[tuple[str, str], int]]] = [[] for _ in cs]
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    def run(i: int) -> None:
        idle_since = time.monotonic()
        while not done.is_set():
            batch = cs[i].receive_batch(max_messages=5_000, timeout_s=0.5)
            if not len(batch):
                if time.monotonic() - idle_since > 30:
                    return
                continue
            idle_since = time.monotonic()
            keys = batch.keys.to_pylist()
            payloads = batch.payloads.to_pylist()
            seen[i].extend(
                ((k, p[:1].decode()), int(p[1:])) for k, p in zip(keys, payloads, strict=True)
            )
            cs[i].ack(batch)
            with lock:
                count[0] += len(batch)
                if count[0] >= n:
                    done.set()

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for c in cs:
        c.close()
    got = [x for s in seen for x in s]
    per_key: dict[str, set[int]] = defaultdict(set)
    in_order = True
    for i, s in enumerate(seen):
        last: dict[tuple[str, str], int] = {}
        for k, q in s:
            per_key[k[0]].add(i)
            if q < last.get(k, -1):
                if in_order:
                    print(f"{kind}: consumer {i} got {k} #{q} after #{last[k]}")
                in_order = False
            last[k] = q
    return {
        "sub": f"{kind} ({consumers} consumers)",
        "received": len(got),
        "unique": len(set(got)),
        "rate": len(got) / elapsed,
        "elapsed": elapsed,
        "one_consumer_per_key": all(len(v) == 1 for v in per_key.values()),
        "in_order": in_order,
        "spread": [len(s) for s in seen],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--delayed", type=float, default=0.5, help="the share sent with a delay")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = tempfile.mkdtemp(prefix="rd-key-shared-")
    cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
    try:
        cluster.create_topic(TOPIC, args.partitions)
        for sub, kind in (("s-shared", "shared"), ("s-keyed", "key_shared")):
            cluster.subscribe(TOPIC, sub, kind).close()
        producer = cluster.create_producer(TOPIC)
        n, half = args.messages, int(args.messages * args.delayed)
        keys = [f"key-{i % args.keys}" for i in range(n)]
        # per key: d0, d1, ... (delayed), then i<n>, ... (immediate)
        seqs = [b"%s%d" % (b"d" if i < half else b"i", i // args.keys) for i in range(n)]
        # the delayed half first (its seqs are the lower ones), due 5 s after the load
        due = now_ms() + 5_000 + n // 50
        for lo, hi, at in ((0, half, due), (half, n, None)):
            for c in range(lo, hi, 10_000):
                end = min(hi, c + 10_000)
                producer.send_many(
                    seqs[c:end],
                    keys=keys[c:end],
                    deliver_at=None if at is None else np.full(end - c, at),
                    on_duplicate="allow",  # (many per key: the key orders, it is no identity)
                )
        time.sleep(max(0.0, (due - now_ms()) / 1000) + 1)
        runs = [
            drain(cluster, "s-shared", "shared", n, args.consumers),
            drain(cluster, "s-keyed", "key_shared", n, args.consumers),
        ]
    finally:
        cluster.shutdown()
    base = runs[0]["rate"]
    print(f"\n## Key_Shared vs Shared: {n:,} messages ({half:,} delayed), {args.keys:,} keys, "
          f"{args.partitions} partitions\n")  # fmt: skip
    print("| subscription | drain msg/s | vs shared | all once | one consumer per key | "
          "each consumer got a key in send order | messages per consumer |")  # fmt: skip
    print("|---|---:|---:|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['sub']} | {r['rate']:,.0f} | {r['rate'] / base:.2f}x "
            f"| {r['received'] == r['unique'] == n} | {r['one_consumer_per_key']} "
            f"| {r['in_order']} | {', '.join(f'{x:,}' for x in r['spread'])} |"
        )


if __name__ == "__main__":
    main()
