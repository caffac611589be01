"""A steady stream of sends into one partition read by K shared subscriptions: what the
subscriptions' standing reads cost the partition's host.

For each K: a one-partition topic with K shared subscriptions and no consumer, on a local
Ray started for the run (local-dir store). ``--senders`` threads, each with a producer of
its own, call ``send()`` one message at a time (due in an hour) for ``--seconds``; each
waits for its send to be durable before the next. Measured over that window:

- **sends/s**: sends that returned, per second (the host's commit path is the limit: the
  threads never wait for anything else);
- **send p50 / p99**: how long one ``send()`` took;
- **host CPU per send**: the partition host's CPU time over the window, per send;
- **subscriptions' CPU**: the CPU time of the subscription hosts serving the K
  subscriptions, per second of the window.

``--baseline SRC`` runs each K with the raydelay source tree at SRC too (for example a
``git worktree`` of an older commit), alternating with this tree ``--rounds`` times, and
prints the ratios of the means, from the same run. Each run is a process of its own.

Usage: python bench/fanout_stream.py [--ks 1 32] [--seconds 10] [--senders 4]
           [--rounds 2] [--baseline /tmp/old]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.child import run_child  # noqa: E402

CHILD = r"""
import json, sys, threading, time
import numpy as np, psutil, ray
import raydelay
from raydelay.actors.host import HostActor
from raydelay.actors.handles import subscription_partition, topic_partition
from raydelay.cluster.local import RAY_SYSTEM_CONFIG

k, seconds, senders, root = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
         log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG)
cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
cluster.create_topic("stream", partitions=1)
subs = [f"s{i}" for i in range(k)]
for name in subs:
    cluster.subscribe("stream", name).close()  # the subscription stays; nobody consumes
host = topic_partition("stream", 0)
actors = [host] + [subscription_partition("stream", 0, name) for name in subs]
host_pid, *sub_pids = ray.get([a.pid() for a in actors])
# (the subscription hosts serving the K subscriptions: one process each, however many)
procs = [psutil.Process(pid) for pid in [host_pid, *sorted(set(sub_pids) - {host_pid})]]
time.sleep(3)  # (the subscriptions' first reads are standing)


def cpu(ps):
    return sum(p.cpu_times().user + p.cpu_times().system for p in ps)


producers = [cluster.create_producer("stream") for _ in range(senders)]
took = [[] for _ in producers]
stop = time.monotonic() + seconds


def run(i):
    while time.monotonic() < stop:
        t = time.perf_counter()
        producers[i].send(b"x" * 100, deliver_after=3600)
        took[i].append(time.perf_counter() - t)


commits0 = ray.get(host.submit(HostActor.stats))["commits"]
host0, subs0, t0 = cpu(procs[:1]), cpu(procs[1:]), time.monotonic()
threads = [threading.Thread(target=run, args=(i,)) for i in range(senders)]
for t in threads:
    t.start()
for t in threads:
    t.join()
window = time.monotonic() - t0
host_s, subs_s = cpu(procs[:1]) - host0, cpu(procs[1:]) - subs0
commits = ray.get(host.submit(HostActor.stats))["commits"] - commits0
lat = np.concatenate([np.asarray(x) for x in took]) * 1000
print("RESULT " + json.dumps({
    "k": k, "window_s": window, "sends": int(len(lat)), "commits": int(commits),
    "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
    "host_cpu_s": host_s, "subs_cpu_s": subs_s,
}))
for p in producers:
    p.close()
cluster.shutdown()
"""


def run(k: int, seconds: float, senders: int, src: str | None) -> dict:
    return run_child(CHILD, [str(k), str(seconds), str(senders)], src)


FIGURES = [
    ("sends/s", lambda r: r["sends"] / r["window_s"], "{:,.0f}"),
    ("send p50 ms", lambda r: r["p50_ms"], "{:.1f}"),
    ("send p99 ms", lambda r: r["p99_ms"], "{:.1f}"),
    ("host CPU ms per send", lambda r: 1000 * r["host_cpu_s"] / max(r["sends"], 1), "{:.2f}"),
    ("subscriptions' CPU s/s", lambda r: r["subs_cpu_s"] / r["window_s"], "{:.2f}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 32], help="subscription counts")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long each run sends")
    ap.add_argument("--senders", type=int, default=4, help="threads sending, one producer each")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each variant per K")
    ap.add_argument("--baseline", help="a raydelay source tree to run the same stream with")
    args = ap.parse_args()
    for name, value in (("--ks", min(args.ks)), ("--senders", args.senders),
                        ("--rounds", args.rounds)):  # fmt: skip
        if value < 1:
            ap.error(f"{name}: must be >= 1")
    if args.seconds <= 0:
        ap.error("--seconds: must be > 0")
    started = time.time()
    print(
        f"\nA stream of send() calls, {args.senders} threads, into one partition read by K "
        f"shared subscriptions; {args.seconds:.0f} s a run, {args.rounds} run(s) a variant; "
        f"{time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    head = "| K | figure | raydelay |" + (
        " baseline | raydelay / baseline |" if args.baseline else ""
    )
    print(head)
    print("|---:|---|---:|" + ("---:|---:|" if args.baseline else ""))
    for k in args.ks:
        ours: list[dict] = []
        base: list[dict] = []
        for _ in range(args.rounds):  # alternating: a slow minute of the machine hits both
            ours.append(run(k, args.seconds, args.senders, None))
            if args.baseline:
                base.append(run(k, args.seconds, args.senders, args.baseline))
        for name, value, fmt in FIGURES:
            mine = statistics.mean(value(r) for r in ours)
            line = f"| {k} | {name} | {fmt.format(mine)} |"
            if base:
                theirs = statistics.mean(value(r) for r in base)
                ratio = mine / theirs if theirs else float("nan")
                line += f" {fmt.format(theirs)} | {ratio:.2f}x |"
            print(line, flush=True)
    print(f"\n({time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
