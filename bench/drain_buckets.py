"""Overdue drain against the number of sealed buckets, in one run. Prints a table.

At 100M pending (``make bench-full``) one partition holds about 1,200 sealed buckets, and
an overdue backlog is spread over every one of them. This bench gets there at a small
size: the same backlog (``--messages`` in one partition, due over ``--spread`` seconds,
no consumer until all of it is overdue, then one consumer drains it) is drained three
times: with the default ledgers (a few dozen buckets); with small ledgers and buckets
(about a thousand sealed), which the partition merges down to ``max_num_buckets`` (64)
as it seals them; and the same with merges off (``max_num_buckets = -1``). The ratio of
each drain rate to the first is the cost of many buckets, with and without merges. For
each run it also reports the buckets the partition holds, the merges it made, the bytes
it wrote to the store per byte appended (log, buckets and merges), the subscription
actor's peak RSS during the drain and the most rows it held loaded from buckets.

Usage: python bench/drain_buckets.py [--messages 2000000] [--spread 60]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

from bench import peer_raydelay  # noqa: E402
from bench.peer_raydelay import RaydelayPeer  # noqa: E402
from raydelay.actors.handles import subscription_partition  # noqa: E402

SMALL = {  # (64, as the default)
    "topic": {"max_entries_per_ledger": 2_000},
    "delayed": {"min_index_count_per_bucket": 2_000, "max_num_buckets": 64},
}
SMALL_UNMERGED = {
    "topic": {"max_entries_per_ledger": 2_000},
    "delayed": {"min_index_count_per_bucket": 2_000, "max_num_buckets": -1},
}


def one_run(label: str, config: dict, n: int, spread_s: int) -> dict:
    root = tempfile.mkdtemp(prefix="rd-drain-buckets-")
    peer = RaydelayPeer(root, config)
    peaks = {"rss": 0, "loaded": 0}
    stop = threading.Event()

    def sample() -> None:  # the subscription actor of the "drain" topic, once it exists
        proc = None
        while not stop.wait(0.5):
            try:
                if proc is None:
                    actor = subscription_partition("drain", 0, peer_raydelay.SUB)
                    proc = psutil.Process(ray.get(actor.pid(), timeout=5))
                peaks["rss"] = max(peaks["rss"], proc.memory_info().rss)
                parts = peer.cluster.stats("drain", peer_raydelay.SUB)["partitions"]
                peaks["loaded"] = max(peaks["loaded"], parts[0]["loaded_indexes"])
            except Exception:  # noqa: BLE001 - not there yet, or restarting: sample later
                proc = None

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out = peer.drain(n, spread_s, threads=2)
    finally:
        stop.set()
        sampler.join()
        peer.close()
    return out | {"label": label, "peak_rss": peaks["rss"], "peak_loaded": peaks["loaded"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--spread", type=int, default=60, help="seconds the due times cover")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    runs = [
        one_run("default ledgers", {}, args.messages, args.spread),
        one_run("small ledgers (2,000 entries), merged", SMALL, args.messages, args.spread),
        one_run("small ledgers, merges off", SMALL_UNMERGED, args.messages, args.spread),
    ]
    base = runs[0]["rate"]
    print(f"\n## Overdue drain, {args.messages:,} messages due over {args.spread} s, 1 partition\n")
    print("| ledgers | buckets left after the drain | merges | written / appended | drain msg/s | vs default "
          "| complete | subscription peak RSS MiB | peak rows loaded |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in runs:
        print(
            f"| {r['label']} | {r['topic_buckets']:,} | {r['merges']:,} "
            f"| {r['written_per_appended']:.2f}x | {r['rate']:,.0f} | {r['rate'] / base:.2f}x "
            f"| {r['complete']} | {r['peak_rss'] / 2**20:,.0f} | {r['peak_loaded']:,} |"
        )


if __name__ == "__main__":
    main()
