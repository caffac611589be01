"""How long a peek takes on a large backlog (issue: operations). Prints a table.

One topic, one partition (so one subscription actor holds the whole backlog), one shared
subscription whose consumer never receives, 100-byte payloads with keys ``k0`` ..
``k999``, on a local-dir store with the default config (buckets of 50k, segments of 5k).
``--pending`` messages (default 10M) are published with deliver_at uniform over the day
after the next hour, so nothing is due, or loaded ahead of its time, while the bench
runs: everything waits in sealed buckets not loaded, but the unsealed tail.

Each peek is asked ``--repeat`` times through ``Cluster.peek`` (the median and the worst
are shown), and once through the ``raydelay peek`` command in a new process (its own
timing of the peek, and the whole command's wall time with attaching to Ray). Beside
each: the sealed segments it read from the store and their bytes, against the
backlog's (what a peek that loads the backlog would read: the baseline the ratio is
taken against).

Usage: python bench/peek_bench.py [--pending 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

import raydelay  # noqa: E402
from bench.common import start_local_ray  # noqa: E402
from raydelay.actors.handles import subscription_partition, topic_partition  # noqa: E402
from raydelay.actors.host import HostActor  # noqa: E402
from raydelay.actors.subscription import SubscriptionHost  # noqa: E402
from raydelay.clock import now_ms  # noqa: E402

PAYLOAD = b"x" * 100
BATCH = 10_000
KEYS = 1_000
DAY_MS = 86_400_000


def publish(cluster, topic: str, pending: int) -> float:
    producer = cluster.create_producer(topic)
    rng = np.random.default_rng(7)
    keys = [f"k{i % KEYS}" for i in range(BATCH)]
    base = now_ms() + 3_600_000  # (nothing comes within a lookahead while the bench runs)
    t0 = time.perf_counter()
    for lo in range(0, pending, BATCH):
        n = min(BATCH, pending - lo)
        ats = base + rng.integers(0, DAY_MS, n)
        producer.send_many(
            [PAYLOAD] * n, deliver_at=ats.tolist(), keys=keys[:n], on_duplicate="allow"
        )
        if lo // BATCH % 100 == 0:
            done = lo + n
            print(
                f"  published {done:,}/{pending:,} ({time.perf_counter() - t0:.0f} s)", flush=True
            )
    producer.close()
    return base


def wait_settled(topic: str, pending: int) -> dict:
    """Until the topic sealed what it will seal and the subscription took up its buckets."""
    sub = subscription_partition(topic, 0, "s")
    part = topic_partition(topic, 0)
    while True:
        t = ray.get(part.submit(HostActor.stats))
        s = ray.get(sub.submit(SubscriptionHost.stats))
        if s["delayed"] >= pending * 0.999 and t["unsealed_delayed"] < 100_000:
            return {
                "buckets": s["buckets"],
                "unsealed": t["unsealed_delayed"],
                "delayed": s["delayed"],
            }
        print(
            f"  waiting: delayed {s['delayed']:,}, unsealed {t['unsealed_delayed']:,}", flush=True
        )
        time.sleep(2)


def backlog_segments(cluster, topic: str) -> tuple[int, int]:
    """Sealed segments and their bytes in the partition's buckets."""
    from raydelay.delayed.store import SealedStore
    from raydelay.storage import make_store

    store = SealedStore(make_store(cluster.config), topic, 0)
    info = ray.get(topic_partition(topic, 0).submit(HostActor.buckets))
    segs = nbytes = 0
    for key in info.buckets:
        for run in store.meta(key).runs:
            segs += len(run.segments)
            nbytes += sum(s.length for s in run.segments)
    return segs, nbytes


def peek_reads(topic: str) -> dict:
    return ray.get(subscription_partition(topic, 0, "s").submit(SubscriptionHost.stats))["peek"]


def time_peeks(cluster, topic: str, label: str, repeat: int, **kw) -> dict:
    times, found = [], []
    before = peek_reads(topic)
    for _ in range(repeat):
        t0 = time.perf_counter()
        found = cluster.peek(topic, "s", **kw)
        times.append(time.perf_counter() - t0)
    after = peek_reads(topic)
    return {
        "case": label,
        "found": len(found),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "segments": (after["segments_read"] - before["segments_read"]) / repeat,
        "bytes": (after["segment_bytes_read"] - before["segment_bytes_read"]) / repeat,
    }


def time_cli(topic: str, address: str, config: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "raydelay.cli", "--config", config, "--address", address]
        + ["peek", topic, "s", "-n", "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"raydelay peek failed: {out.stderr.strip()[-500:]}")
    lines = [x for x in out.stderr.splitlines() if "scheduled message" in x]
    own = float(lines[-1].rsplit(" in ", 1)[1].split()[0])
    return {"lines": len(out.stdout.splitlines()), "peek_s": own, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pending", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "peek.toml"
        config.write_text(f'[storage]\nkind = "local"\n[storage.local]\nroot = "{tmp}/data"\n')
        start_local_ray()
        cluster = raydelay.connect(str(config))
        topic = "peek"
        cluster.create_topic(topic, partitions=1)
        consumer = cluster.subscribe(topic, "s")  # (never receives: the backlog stays)
        t0 = time.perf_counter()
        base = publish(cluster, topic, args.pending)
        publish_s = time.perf_counter() - t0
        state = wait_settled(topic, args.pending)
        segs, nbytes = backlog_segments(cluster, topic)
        mid = base + DAY_MS // 2
        rows = [
            time_peeks(cluster, topic, "next 100", args.repeat, limit=100),
            time_peeks(cluster, topic, "next 1,000", args.repeat, limit=1_000),
            time_peeks(
                cluster, topic, "100 due after +12 h", args.repeat, limit=100, due_after=mid
            ),
            time_peeks(
                cluster,
                topic,
                "1 hour window, -1 (all)",
                args.repeat,
                limit=-1,
                due_after=mid,
                due_before=mid + 3_600_000,
            ),
            time_peeks(
                cluster, topic, "next 10 of one key (of 1,000)", args.repeat, limit=10, key="k7"
            ),
        ]
        cli = time_cli(topic, ray.get_runtime_context().gcs_address, str(config))
        consumer.close()
        cluster.shutdown()
        ray.shutdown()
    print(
        f"\n## Peek on a backlog of {args.pending:,} (1 partition, {state['buckets']} buckets, "
        f"{segs:,} segments, {nbytes / 1e9:.2f} GB of segments; {state['unsealed']:,} unsealed)\n"
    )
    print(
        "| peek | found | median s | worst s | segments read | MB read | of the backlog's bytes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['found']:,} | {r['median_s']:.3f} | {r['max_s']:.3f} "
            f"| {r['segments']:,.0f} | {r['bytes'] / 1e6:,.1f} | {r['bytes'] / nbytes:.4f}x |"
        )
    print(
        f"\n`raydelay peek peek s -n 100` in a new process: {cli['lines']} lines; the peek "
        f"{cli['peek_s']:.2f} s, the whole command {cli['wall_s']:.1f} s (with attaching to Ray)."
    )
    print(f"Published at {args.pending / publish_s:,.0f} msg/s.")


if __name__ == "__main__":
    main()
