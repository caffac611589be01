"""Recovery time of a subscription actor (issue: fault tolerance). Prints a table.

For each pending count (default 1M and 10M): one topic with one partition (so one
subscription actor holds every pending message), one shared subscription, 100-byte
payloads on a local-dir store (``--store s3``: S3 on SeaweedFS; ``--store local,s3``:
both, one row each, with the ratio). Messages are published with deliver_at uniform over the
next hour, so about pending/3600 fall due every second; a consumer thread receives and
acks all along. Once everything is published and the tracker holds it, the bench kills
the subscription actor (``ray.kill(no_restart=False)``: Ray restarts it) and measures:

- **kill -> first delivery**: from the kill until the new actor process hands out its
  first message (the actor reports that moment's wall-clock time);
- **init -> first delivery**: the same inside the new actor, from its constructor's start;
  it includes waiting for the consumer to come back (Ray fails the consumer's pending
  call only once the actor is back), so the constructor's own time and the time from
  the first receive to the first delivery are shown apart;
- **bytes read during recovery**: what the new actor read from the store (cursor, bucket
  metadata and first segments, tombstones), plus the ledger objects it took from the log
  (tail and loose positions), until its first delivery; next to the log's size, which a
  re-read from mark-delete would have read;
- the delayed count the tracker holds before the kill and after the restart.

Usage: python bench/recovery_bench.py [--pending 1000000 10000000] [--store local|s3|local,s3]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

import raydelay  # noqa: E402
from bench.common import (  # noqa: E402
    BenchStore,
    add_store_args,
    bench_store,
    kill_and_recover,
    measure_stores,
    ratio,
    start_local_ray,
)
from raydelay.actors.handles import subscription_partition  # noqa: E402
from raydelay.actors.subscription import SubscriptionHost  # noqa: E402
from raydelay.clock import now_ms  # noqa: E402

PAYLOAD = b"x" * 100
BATCH = 5_000
SPREAD_MS = 3_600_000
RECEIVE = 10_000


def run(cluster, store: BenchStore, topic: str, pending: int) -> dict:
    cluster.create_topic(topic, partitions=1)
    consumer = cluster.subscribe(topic, "s")
    producer = cluster.create_producer(topic)
    sub = subscription_partition(topic, 0, "s")
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            batch = consumer.receive_batch(max_messages=RECEIVE, timeout_s=0.5)
            if len(batch):
                consumer.ack(batch)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    base = now_ms()
    for lo in range(0, pending, BATCH):
        n = min(BATCH, pending - lo)
        ats = base + rng.integers(1_000, SPREAD_MS, n)
        producer.send_many([PAYLOAD] * n, deliver_at=ats.tolist())
        if lo // BATCH % 200 == 0:
            print(
                f"  {topic}: published {lo + n:,}/{pending:,} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    publish_s = time.perf_counter() - t0
    before = ray.get(sub.submit(SubscriptionHost.stats))
    while before["read_ahead"] or before["delayed"] + before["acked"] < pending * 0.99:
        time.sleep(0.5)  # until the subscription has read everything in
        before = ray.get(sub.submit(SubscriptionHost.stats))
    time.sleep(1.0)  # let a cursor write and the last seals land
    before = ray.get(sub.submit(SubscriptionHost.stats))
    killed_ms, after, rec = kill_and_recover(sub, timeout_s=120)
    first_at = rec.get("first_delivery_at_ms")
    stop.set()
    reader.join(timeout=5)
    consumer.close()
    producer.close()
    log_bytes = store.bytes_under(f"topics/{topic}/")
    return {
        "pending": pending,
        "publish_rate": pending / publish_s,
        "delayed_before": before["delayed"],
        "buckets": before["buckets"],
        "delayed_after": after["delayed"],
        "kill_to_first_s": None if first_at is None else (first_at - killed_ms) / 1000,
        "init_to_first_s": rec.get("first_delivery_s"),
        "receive_to_first_s": round(rec["first_delivery_s"] - rec["first_receive_s"], 3)
        if "first_delivery_s" in rec and "first_receive_s" in rec
        else None,
        "init_s": rec["init_s"],
        "store_bytes": rec.get("store_bytes", 0),
        "log_read_bytes": rec["log_bytes"],
        "loose": rec["loose"],
        "log_size": log_bytes,
    }


def measure(args, store: str) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, bench_store(store, Path(tmp)) as st:
        start_local_ray()
        cluster = raydelay.connect({"storage": st.config})
        for pending in args.pending:
            rows.append(run(cluster, st, f"rec{pending}", pending))
        cluster.shutdown()
        ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pending", type=int, nargs="+", default=[1_000_000, 10_000_000])
    add_store_args(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = measure_stores(args, measure)
    if results is None:  # a child run for one store: its result is written
        return
    report(results)


def report(results: dict[str, list[dict]]) -> None:
    def mb(n: int) -> str:
        return f"{n / 1e6:,.1f}"

    stores = list(results)
    base = {r["pending"]: r for r in results.get("local", [])}
    print(f"\n## Subscription actor recovery (1 partition, shared, 100 B, {' vs '.join(stores)})\n")
    print(
        "| pending | store | buckets | kill -> first delivery s | vs local "
        "| init -> first delivery s | constructor s | vs local | first receive -> first delivery s "
        "| store MB read | log MB read | loose re-read | log MB (a full re-read) "
        "| delayed before -> after |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    by_pending = sorted({r["pending"] for rows in results.values() for r in rows})
    for pending in by_pending:
        for store in stores:
            for r in (r for r in results[store] if r["pending"] == pending):
                k2f = r["kill_to_first_s"]
                shown = "none in 120 s" if k2f is None else f"{k2f:.2f}"
                b = base.get(pending)
                vs = ratio(k2f, b["kill_to_first_s"]) if b and store != "local" else ""
                vs_init = ratio(r["init_s"], b["init_s"]) if b and store != "local" else ""
                print(
                    f"| {r['pending']:,} | {store} | {r['buckets']} | {shown} | {vs} "
                    f"| {r['init_to_first_s']} | {r['init_s']} | {vs_init} "
                    f"| {r['receive_to_first_s']} "
                    f"| {mb(r['store_bytes'])} | {mb(r['log_read_bytes'])} "
                    f"| {r['loose']:,} | {mb(r['log_size'])} "
                    f"| {r['delayed_before']:,} -> {r['delayed_after']:,} |"
                )
    print(
        "\nPublish rate while loading: "
        + ", ".join(
            f"{r['pending']:,} ({store}): {r['publish_rate']:,.0f} msg/s"
            for store in stores
            for r in results[store]
        )
    )


if __name__ == "__main__":
    main()
