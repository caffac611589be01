"""End-to-end benchmarks of the Ray data path (issue: the Ray data path). Prints a table.

1. Sustained throughput: one topic with 4 partitions, one shared subscription, 100-byte
   payloads, a local-dir store (``--store s3``: S3 on SeaweedFS; ``--store local,s3``: both,
   one row each, with the ratio). Four threads share one producer and call ``send_many``
   with batches of 1,000; a consumer thread calls ``receive_batch`` (up to 10,000 per call)
   and acks each batch whole, concurrently. Measured from the
   first send to the last ack, so it covers produce -> durable -> indexed -> delivered ->
   acked. Run twice: immediate messages, and messages delayed 1 s (these go through the
   bucket tracker and their payloads are fetched again when due). The last messages of
   the delayed run are due 1 s after they were sent, so that run's end-to-end figure
   includes 1 s of pure waiting; the next column leaves it out.
   "Where the time goes": CPU seconds each process spent during the run (psutil).
2. Lateness: messages due at 10k/s for ``--lateness-seconds`` seconds (sent ahead of
   time); lateness = receive time - deliver_at, p50 / p99 / max, and how many arrived
   early (strict mode: must be 0).

Usage: python bench/e2e_bench.py [--messages 1000000] [--lateness-seconds 10] [--batch 1000]
       [--store local|s3|local,s3]
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
    add_store_args,
    bench_store,
    cpu_times,
    measure_stores,
    ratio,
    ray_processes,
    start_local_ray,
)
from raydelay.accounting import Lateness  # noqa: E402
from raydelay.clock import now_ms  # noqa: E402

PAYLOAD = b"x" * 100
BATCH = 1_000
PRODUCER_THREADS = 4
RECEIVE = 10_000  # max_messages per receive (a quarter asked of each partition)
KINDS = (("immediate", None), ("delayed 1 s", 1.0))  # (label, deliver_after seconds)


def throughput(cluster, topic: str, n: int, delay_s: float | None, batch: int = BATCH) -> dict:
    cluster.create_topic(topic, partitions=4)
    consumer = cluster.subscribe(topic, "bench")
    producer = cluster.create_producer(topic)
    roles = ray_processes()
    cpu0 = cpu_times(roles)
    acked = 0
    done = threading.Event()

    def consume() -> None:
        nonlocal acked
        while acked < n and not done.is_set():
            batch = consumer.receive_batch(max_messages=RECEIVE, timeout_s=1.0)
            if len(batch):
                consumer.ack(batch)
                acked += len(batch)

    t = threading.Thread(target=consume, daemon=True)
    start = time.perf_counter()
    t.start()
    payloads = [PAYLOAD] * batch

    def produce(batches: int) -> None:
        for _ in range(batches):
            producer.send_many(payloads, deliver_after=delay_s)

    # Threads share the producer, so one batch's durability wait overlaps the next sends.
    senders = [
        threading.Thread(target=produce, args=(n // batch // PRODUCER_THREADS,))
        for _ in range(PRODUCER_THREADS)
    ]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    produced = time.perf_counter() - start
    t.join(timeout=300)
    done.set()
    elapsed = time.perf_counter() - start
    cpu1 = cpu_times(roles)
    cpu = {k: cpu1.get(k, 0) - cpu0.get(k, 0) for k in cpu1}
    consumer.close()
    producer.close()
    return {"n": n, "acked": acked, "elapsed": elapsed, "produce": produced, "cpu": cpu}


def lateness(cluster, topic: str, seconds: int, rate: int = 10_000) -> dict:
    cluster.create_topic(topic, partitions=4)
    consumer = cluster.subscribe(topic, "late")
    producer = cluster.create_producer(topic)
    n = seconds * rate
    start_at = now_ms() + 4_000 + n // 50  # enough lead time to send everything first
    ats = start_at + (np.arange(n) * 1000 // rate)
    for lo in range(0, n, 5_000):
        producer.send_many(
            [PAYLOAD] * len(ats[lo : lo + 5_000]), deliver_at=[int(a) for a in ats[lo : lo + 5_000]]
        )
    lates: list[np.ndarray] = []
    got = 0
    deadline = time.monotonic() + (start_at - now_ms()) / 1000 + seconds + 60
    while got < n and time.monotonic() < deadline:
        batch = consumer.receive_batch(max_messages=5_000, timeout_s=1.0)
        t = now_ms()
        lates.append(t - batch.deliver_at_ms)
        got += len(batch)
        if len(batch):
            consumer.ack(batch)
    arr = np.concatenate(lates) if lates else np.zeros(0, dtype=np.int64)
    consumer.close()
    return Lateness.of(arr).as_dict() | {"n": n, "got": len(arr)}


def measure(args, store: str) -> dict:
    """One store's figures: the throughput rows (label -> result) and the lateness run."""
    with tempfile.TemporaryDirectory() as tmp, bench_store(store, Path(tmp)) as st:
        start_local_ray()
        cluster = raydelay.connect({"storage": st.config})
        rows = {}
        for label, delay in KINDS:
            rows[label] = throughput(cluster, f"tput-{label[:3]}", args.messages, delay, args.batch)
        late = lateness(cluster, "late", args.lateness_seconds)
        cluster.shutdown()
        ray.shutdown()
    return {"throughput": rows, "lateness": late}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--lateness-seconds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=BATCH, help="messages per send_many call")
    add_store_args(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = measure_stores(args, measure)
    if results is None:  # a child run for one store: its result is written
        return
    report(results, args)


def report(results: dict[str, dict], args) -> None:
    stores = list(results)
    base = results.get("local")
    print(
        f"\n## Sustained throughput (4 partitions, 1 shared subscription, 100 B, "
        f"send_many x{args.batch}, store: {' vs '.join(stores)})\n"
    )
    print(
        "| messages | kind | store | end to end msg/s | vs local | without the last delay "
        "| produce msg/s | acked | seconds |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for label, delay in KINDS:
        for store in stores:
            r = results[store]["throughput"][label]
            e2e = r["acked"] / r["elapsed"]
            steady = r["acked"] / (r["elapsed"] - (delay or 0))
            vs = ""
            if base is not None and store != "local":
                b = base["throughput"][label]
                vs = ratio(e2e, b["acked"] / b["elapsed"])
            print(
                f"| {r['n']:,} | {label} | {store} | {e2e:,.0f} | {vs} | {steady:,.0f} | "
                f"{r['n'] / r['produce']:,.0f} | {r['acked']:,} | {r['elapsed']:.1f} |"
            )
    print("\n## Where the time goes (CPU seconds per process during each run)\n")
    runs = [
        (f"{label}, {store}", results[store]["throughput"][label])
        for label, _ in KINDS
        for store in stores
    ]
    roles = sorted({k for _, r in runs for k in r["cpu"]})
    print("| process | " + " | ".join(label for label, _ in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for role in roles:
        cells = " | ".join(f"{r['cpu'].get(role, 0):.1f}" for _, r in runs)
        print(f"| {role} | {cells} |")
    print(f"\n## Lateness at 10k msg/s due for {args.lateness_seconds} s (strict mode)\n")
    print("| store | messages | received | p50 ms | p99 ms | max ms | early |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for store in stores:
        late = results[store]["lateness"]
        print(
            f"| {store} | {late['n']:,} | {late['got']:,} | {late['p50']:.0f} | "
            f"{late['p99']:.0f} | {late['max']} | {late['early']} |"
        )


if __name__ == "__main__":
    main()
