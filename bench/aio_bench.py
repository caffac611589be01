"""The asyncio client against the sync client, in one run. Prints a table.

One process, one local raydelay (a temp local-dir store), one topic of one partition and
one shared subscription. Three figures, each measured for both clients in alternating
rounds (``--rounds``), so that the machine's drift falls on both alike:

- **receive round trip**: a message due now is sent, then one ``receive`` is timed from
  its call to its return with the message (the consumer asks its partition, the
  subscription answers, the reply comes back);
- **send**: one ``send`` awaited (sync: ``send()``), from the call until it is durable;
- **concurrent sends**: ``--burst`` sends in flight at once from one thread (sync:
  ``send_async`` then every future's result; asyncio: ``asyncio.gather`` of ``send``),
  in messages per second.

Usage: python bench/aio_bench.py [--trips 300] [--rounds 3] [--burst 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import raydelay  # noqa: E402
import raydelay.aio as aio  # noqa: E402
from raydelay.console import table  # noqa: E402

TOPIC = "aio-bench"


def sync_trips(producer, consumer, n: int) -> tuple[list[float], list[float]]:
    receive, send = [], []
    for i in range(n):
        t0 = time.perf_counter()
        producer.send(b"trip %d" % i)
        t1 = time.perf_counter()
        got = []
        while not got:
            got = consumer.receive(max_messages=1, timeout_s=5.0)
        t2 = time.perf_counter()
        consumer.ack(got)
        send.append(t1 - t0)
        receive.append(t2 - t1)
    return receive, send


async def aio_trips(producer, consumer, n: int) -> tuple[list[float], list[float]]:
    receive, send = [], []
    for i in range(n):
        t0 = time.perf_counter()
        await producer.send(b"trip %d" % i)
        t1 = time.perf_counter()
        got = []
        while not got:
            got = await consumer.receive(max_messages=1, timeout_s=5.0)
        t2 = time.perf_counter()
        await consumer.ack(got)
        send.append(t1 - t0)
        receive.append(t2 - t1)
    return receive, send


def sync_burst(producer, n: int) -> float:
    t0 = time.perf_counter()
    futures = [producer.send_async(b"burst %d" % i) for i in range(n)]
    for f in futures:
        f.result()
    return n / (time.perf_counter() - t0)


async def aio_burst(producer, n: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(producer.send(b"burst %d" % i) for i in range(n)))
    return n / (time.perf_counter() - t0)


async def drain(consumer) -> None:
    while True:
        got = await consumer.receive_batch(max_messages=10_000, timeout_s=0.5)
        if not len(got):
            return
        await consumer.ack(got)


def ms(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if q < 100 else max(values) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trips", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--burst", type=int, default=20_000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = tempfile.mkdtemp(prefix="aio-bench-")
    cluster = raydelay.connect({"storage": {"kind": "local", "local": {"root": root}}})
    cluster.create_topic(TOPIC, partitions=1)
    sync_producer = cluster.create_producer(TOPIC)
    sync_consumer = cluster.subscribe(TOPIC, "s")
    results: dict[str, dict[str, list[float]]] = {
        k: {"receive": [], "send": [], "burst": []} for k in ("sync", "asyncio")
    }

    async def run() -> None:
        acluster = aio.Cluster(cluster)
        aproducer = await acluster.create_producer(TOPIC)
        aconsumer = aio.Consumer(sync_consumer)  # the same subscription consumer, awaited
        for _ in range(10):  # warm both paths
            sync_trips(sync_producer, sync_consumer, 5)
            await aio_trips(aproducer, aconsumer, 5)
        for r in range(args.rounds):
            order = ("sync", "asyncio") if r % 2 == 0 else ("asyncio", "sync")
            for kind in order:
                if kind == "sync":
                    rec, snd = sync_trips(sync_producer, sync_consumer, args.trips)
                    rate = sync_burst(sync_producer, args.burst)
                else:
                    rec, snd = await aio_trips(aproducer, aconsumer, args.trips)
                    rate = await aio_burst(aproducer, args.burst)
                await drain(aconsumer)
                results[kind]["receive"] += rec
                results[kind]["send"] += snd
                results[kind]["burst"].append(rate)
        await aproducer.close()

    asyncio.run(run())
    s, a = results["sync"], results["asyncio"]
    rows = []
    for label, key in (("receive round trip", "receive"), ("send, awaited", "send")):
        rows.append(
            [
                f"{label} p50 / p99 ms",
                f"{ms(s[key], 50):.2f} / {ms(s[key], 99):.2f}",
                f"{ms(a[key], 50):.2f} / {ms(a[key], 99):.2f}",
                f"{ms(a[key], 50) / ms(s[key], 50):.2f}x",
            ]
        )
    rows.append(
        [
            f"{args.burst:,} sends in flight, msg/s (median of {args.rounds})",
            f"{statistics.median(s['burst']):,.0f}",
            f"{statistics.median(a['burst']):,.0f}",
            f"{statistics.median(a['burst']) / statistics.median(s['burst']):.2f}x",
        ]
    )
    print(
        table(
            ["figure", "sync client", "raydelay.aio", "asyncio / sync"],
            rows,
        )
    )
    print(
        f"({args.trips} trips x {args.rounds} rounds per client, alternating; one partition, "
        "local-dir store, fsync on)"
    )
    cluster.shutdown()


if __name__ == "__main__":
    main()
