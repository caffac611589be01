"""raydelay side by side with what its users would pick instead, in one run on this machine.

Peers: a Redis sorted-set delay queue (``bench/peer_redis.py``) and an in-process heapq
(``bench/peer_heapq.py``). The peers run one after another, so none shares the CPU with
another; Ray is started only for raydelay's turn. Every peer gets the same work
(``bench/workload.py``): distinct 100-byte payloads carrying their own sequence and due
time, producers in batches of 5,000, and one driver thread that consumes and acks.

Scenarios:
1. ingest: N messages due uniformly over the next hour -> messages/s until durable.
2. memory per pending message at each load point, and disk / store bytes.
3. burst: N messages due at the same instant -> seconds from that instant until the last
   is delivered and acked, and the delivery curve.
4. lateness: messages falling due at a steady rate -> p50 / p99 / max, and how many early.
4b. send (raydelay, Redis): send() one at a time in a loop -> latency p50 / p99 and msg/s;
   16 threads sharing one producer -> msg/s; send_async x200k from one thread -> msg/s.
   Redis both with appendfsync everysec and always (durable per write, as raydelay is).
4c. steady (raydelay, Redis): one producer thread sends every 10 ms, each message due 2 s
   after it was sent, one consumer -> lateness p50 / p99 / p99.9 / max and early, at 5k,
   20k and 50k msg/s (raydelay: default receive, and with prefetch at 20k).
5. recovery: the state holder killed at the chosen load points -> time to first delivery.
6. scale (full suite): 100M pending in one raydelay subscription -> RSS over time, store
   size, drain rate.
7. fanout (raydelay): K = 1, 8, 32 shared subscriptions (full: and 128) of one partition
   index 300k delayed messages -> the send time, every Ray worker's CPU with the layout's
   idle floor taken out, against K = 1; idle CPU per subscription host against a bare Ray
   actor; store bytes and bytes written per payload byte (bench/fanout_bulk.py, each K in
   a process of its own).
8. drain (raydelay): 2M messages of one partition due over 60 s, all overdue when a
   consumer comes -> messages/s.
9. topology (raydelay): 4 topics x 4 partitions x 8 subscriptions, one consumer each,
   idle -> worker processes, PSS per subscription-partition, idle CPU, set-up seconds
   (bench/topology_bench.py, in a process of its own).

Writes ``bench/results/<date>-<suite>.md`` and its PNG plots.

Usage: python bench/compare.py [--suite quick|full] [--peers raydelay redis heapq]
       [--scenarios ingest memory burst lateness scale fanout drain topology] [--resume]
       [--fanout-ks 1 8 32]
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peer_heapq, report  # noqa: E402
from bench.workload import now_ms, progress  # noqa: E402

M = 1_000_000
SUITES = {
    "quick": {
        "ingest": M,
        "memory": [M],
        "kill_at": [M],
        "burst": M,
        "lateness_rate": 20_000,
        "lateness_s": 20,
        "scale": 0,
        "scale_drain_s": 0,
        "fanout_ks": [1, 8, 32],
        "fanout": 300_000,
        "drain": 2 * M,
        "drain_spread_s": 60,
        "send_loop": 2_000,
        "send_threads_n": 8_000,
        "send_async": 200_000,
        "steady_rates": [5_000, 20_000, 50_000],
        "steady_s": 20,
        "steady_prefetch": [20_000],
        "topology": [4, 4, 8],
    },
    "full": {
        "ingest": M,
        "memory": [M, 10 * M, 50 * M],
        "kill_at": [M, 10 * M],
        "burst": M,
        "lateness_rate": 20_000,
        "lateness_s": 60,
        "scale": 100 * M,
        "scale_drain_s": 120,
        "fanout_ks": [1, 8, 32, 128],
        "fanout": 300_000,
        "drain": 2 * M,
        "drain_spread_s": 60,
        "send_loop": 2_000,
        "send_threads_n": 8_000,
        "send_async": 200_000,
        "steady_rates": [5_000, 20_000, 50_000],
        "steady_s": 60,
        "steady_prefetch": [20_000],
        "topology": [4, 4, 8],
    },
}
PEERS = ("heapq", "redis", "raydelay")  # the order they run in
SCENARIOS = (
    "ingest",
    "memory",
    "burst",
    "lateness",
    "send",
    "steady",
    "scale",
    "fanout",
    "drain",
    "topology",
)
SEND_THREADS = 16
THREADS = 4  # producer threads of raydelay and Redis (the heap takes one: it holds a lock)


def lead_ms(n: int) -> int:
    """How far ahead the first due time is set so that loading ``n`` messages finishes
    first (5 s, plus 1 s per 100k messages)."""
    return 5_000 + n // 100


def shrink(plan: dict, by: int) -> dict:
    """The plan with every message count divided by ``by`` (rates and seconds kept)."""
    if by == 1:
        return plan
    out = dict(plan)
    for k in ("ingest", "burst", "scale", "fanout", "drain", "send_loop", "send_threads_n",
              "send_async"):  # fmt: skip
        out[k] = plan[k] // by
    out["memory"] = [p // by for p in plan["memory"]]
    out["kill_at"] = [p // by for p in plan["kill_at"]]
    out["lateness_s"] = max(plan["lateness_s"] // by, 5)
    out["steady_s"] = max(plan["steady_s"] // by, 5)
    out["scale_drain_s"] = plan["scale_drain_s"] // by and max(plan["scale_drain_s"] // by, 10)
    return out


def run_peer(name: str, plan: dict, scenarios: list[str], root: str) -> dict:
    out: dict = {}
    if "topology" in scenarios and name == "raydelay":
        # (first, in a process of its own with its own Ray: before this peer starts one)
        from bench import topology_bench

        topics, partitions, subs = plan["topology"]
        out["topology"] = topology_bench.measure(topics, partitions, subs)
    if "fanout" in scenarios and name == "raydelay":
        # (the same: each K in a process of its own, with a Ray of its own)
        from bench import fanout_bulk

        out["fanout"] = fanout_bulk.measure(plan["fanout_ks"], plan["fanout"])
    if name == "heapq":
        peer = peer_heapq.HeapqPeer()
    elif name == "redis":
        from bench.peer_redis import RedisPeer

        peer = RedisPeer(root)
        out["version"] = peer.version
    else:
        from bench.peer_raydelay import RaydelayPeer

        peer = RaydelayPeer(root)
    try:
        if "ingest" in scenarios:
            out["ingest"] = peer.ingest(plan["ingest"], THREADS)
        if "memory" in scenarios:
            out["memory"] = peer.memory(plan["memory"], set(plan["kill_at"]), THREADS)
        if "burst" in scenarios:
            n = plan["burst"]
            out["burst"] = peer.burst(n, now_ms() + lead_ms(n), THREADS)
            if name == "raydelay":  # the same burst at the default size, and through receive()
                out["burst_10k"] = peer.burst(n, now_ms() + lead_ms(n), THREADS, size=10_000)
                out["burst_receive"] = peer.burst(n, now_ms() + lead_ms(n), THREADS, "list")
        if "lateness" in scenarios:
            rate, secs = plan["lateness_rate"], plan["lateness_s"]
            out["lateness"] = peer.lateness(rate, secs, now_ms() + lead_ms(rate * secs), THREADS)
        if "send" in scenarios and name != "heapq":
            out["send"] = peer.send(plan["send_loop"], SEND_THREADS, plan["send_threads_n"],
                                    plan["send_async"])  # fmt: skip
        if "steady" in scenarios and name == "redis":
            out["steady"] = peer.steady(plan["steady_rates"], plan["steady_s"])
        if "steady" in scenarios and name == "raydelay":
            steady = peer.steady(plan["steady_rates"], plan["steady_s"], plan["steady_prefetch"])
            out["steady"], out["steady_prefetch"] = steady["default"], steady["prefetch"]
        if "scale" in scenarios and name == "raydelay" and plan["scale"]:
            out["scale"] = peer.scale(plan["scale"], plan["scale_drain_s"], 2)
        if "drain" in scenarios and name == "raydelay":
            out["drain"] = peer.drain(plan["drain"], plan["drain_spread_s"], THREADS)
    finally:
        peer.close()
    return out


def machine() -> dict:
    import psutil
    import ray

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "kernel": platform.release(),
        "commit": commit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="quick")
    ap.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tmp", default=None, help="where stores and AOFs go (default: $TMPDIR)")
    ap.add_argument(
        "--points",
        type=int,
        nargs="+",
        help="memory / recovery load points instead of the suite's (kills at the suite's)",
    )
    ap.add_argument(
        "--fanout-ks", type=int, nargs="+", help="subscription counts of the fanout scenario"
    )
    ap.add_argument("--tag", default="", help="appended to the report's name")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the peers an interrupted run of the same suite already measured",
    )
    ap.add_argument(
        "--shrink", type=int, default=1, help="divide every count by this (a smoke run)"
    )
    args = ap.parse_args()
    if args.shrink < 1:
        ap.error("--shrink: must be >= 1")
    logging.basicConfig(level=logging.WARNING)
    plan = shrink(SUITES[args.suite], args.shrink)
    if args.fanout_ks:
        if any(k < 1 for k in args.fanout_ks):
            ap.error("--fanout-ks: every count must be >= 1")
        plan = plan | {"fanout_ks": sorted(set(args.fanout_ks))}
    if args.points:
        plan = plan | {"memory": sorted(args.points)}
        plan["kill_at"] = [p for p in plan["kill_at"] if p in args.points]
    results: dict = {"suite": args.suite, "plan": plan, "machine": machine(), "peers": {}}
    date = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{date}-{args.suite}" + (f"-{args.tag}" if args.tag else "")
    stem = out / (name if args.shrink == 1 else f"{name}-smoke")
    # each peer's results are kept as it finishes, so a failure later loses only that peer
    partial = stem.with_name(f".{stem.name}.partial.pkl")
    done: dict = {}
    if args.resume and partial.exists():
        saved = pickle.loads(partial.read_bytes())
        if saved["plan"] == plan and saved["scenarios"] == args.scenarios:
            done = saved["peers"]
            progress(f"resuming: {', '.join(done)} already measured ({partial.name})")
    for name in [p for p in PEERS if p in args.peers]:
        if name in done:
            results["peers"][name] = done[name]
            continue
        progress(f"--- {name} ---")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=args.tmp) as root:
            results["peers"][name] = run_peer(name, plan, args.scenarios, root)
        results["peers"][name]["elapsed_s"] = time.monotonic() - t0
        progress(f"{name} done in {time.monotonic() - t0:.0f} s")
        saved = {"plan": plan, "scenarios": args.scenarios, "peers": results["peers"]}
        partial.write_bytes(pickle.dumps(saved))
    results["elapsed_s"] = sum(p.get("elapsed_s", 0) for p in results["peers"].values())
    text = report.write(results, stem)
    partial.unlink(missing_ok=True)
    raw = stem.with_suffix(".json")
    raw.write_text(json.dumps(report.without_samples(results), indent=1, default=float))
    print(text)
    progress(f"wrote {stem}.md, its plots and {raw.name} in {results['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
