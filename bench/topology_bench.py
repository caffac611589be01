"""What a layout costs while idle: processes, memory and CPU (issue: processes follow load).

A layout of T topics x P partitions x S shared subscriptions, one consumer each, nothing
sent, on a local Ray started for the run (local-dir store). Once set up, the bench waits
``--settle`` seconds and then measures for ``--window`` seconds:

- **worker processes**: Ray's worker processes (``ray::...``), raydelay's actors and idle
  pool workers alike (the driver and Ray's own daemons, its raylet, GCS and agents, are
  not counted);
- **PSS**: their proportional set size summed (shared pages split between the processes
  that map them), in all and per subscription-partition (S x T x P);
- **idle CPU**: their CPU time over the window, as a share of one core;
- **set-up**: seconds to create the topics and subscribe every consumer.

``--baseline SRC`` runs the same layout a second time with the raydelay source tree at SRC
(for example a ``git worktree`` of an older commit) and prints both columns and their
ratio, from the same run. Each variant runs in a child process of its own.

Usage: python bench/topology_bench.py [--topics 4 --partitions 4 --subscriptions 8]
           [--settle 20 --window 20] [--baseline /tmp/old]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.child import run_child  # noqa: E402

CHILD = r"""
import json, sys, time, psutil
import raydelay

topics, partitions, subs, settle_s, window_s, root = sys.argv[1:7]
topics, partitions, subs = int(topics), int(partitions), int(subs)
t0 = time.monotonic()
cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
consumers = []
for t in range(topics):
    cluster.create_topic(f"t{t}", partitions)
    for s in range(subs):
        consumers.append(cluster.subscribe(f"t{t}", f"s{s}"))
setup_s = time.monotonic() - t0
time.sleep(float(settle_s))


AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's own daemons, not workers


def workers():
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::") and not cmd[0].startswith(AGENTS):
            out.append(p)
    return out


procs = workers()
def cpu(ps):
    total = 0.0
    for p in ps:
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total
before = cpu(procs)
time.sleep(float(window_s))
used = cpu(procs) - before
pss = 0
for p in procs:
    try:
        pss += p.memory_full_info().pss
    except psutil.NoSuchProcess:
        pass
print("RESULT " + json.dumps({
    "processes": len(procs),
    "pss_bytes": pss,
    "idle_cpu": used / float(window_s),
    "setup_s": setup_s,
    "sub_partitions": topics * partitions * subs,
}))
for c in consumers:
    c.close()
cluster.shutdown()
"""


def measure(
    topics: int = 4,
    partitions: int = 4,
    subscriptions: int = 8,
    settle_s: float = 20.0,
    window_s: float = 20.0,
    src: str | None = None,
) -> dict:
    """One layout's figures (the keys of the child's RESULT line, and the layout)."""
    args = argparse.Namespace(
        topics=topics,
        partitions=partitions,
        subscriptions=subscriptions,
        settle=settle_s,
        window=window_s,
    )
    out = run_variant(args, src)
    return out | {"topics": topics, "partitions": partitions, "subscriptions": subscriptions}


def run_variant(args: argparse.Namespace, src: str | None) -> dict:
    argv = [args.topics, args.partitions, args.subscriptions, args.settle, args.window]
    return run_child(CHILD, [str(a) for a in argv], src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--topics", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--subscriptions", type=int, default=8)
    ap.add_argument("--settle", type=float, default=20.0, help="seconds before measuring")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of CPU measured")
    ap.add_argument("--baseline", help="a raydelay source tree to run the same layout with")
    args = ap.parse_args()
    started = time.time()
    ours = run_variant(args, None)
    base = run_variant(args, args.baseline) if args.baseline else None
    n = ours["sub_partitions"]
    gib = 1024**3
    rows = [
        ("worker processes", lambda r: f"{r['processes']}", lambda r: r["processes"]),
        ("PSS in all", lambda r: f"{r['pss_bytes'] / gib:.2f} GiB", lambda r: r["pss_bytes"]),
        (
            "PSS per subscription-partition",
            lambda r: f"{r['pss_bytes'] / n / 2**20:.1f} MiB",
            lambda r: r["pss_bytes"],
        ),
        (
            "idle CPU of all workers",
            lambda r: f"{100 * r['idle_cpu']:.0f}% of a core",
            lambda r: r["idle_cpu"],
        ),
        ("set-up", lambda r: f"{r['setup_s']:.1f} s", lambda r: r["setup_s"]),
    ]
    layout = (
        f"{args.topics} topics x {args.partitions} partitions x {args.subscriptions} subscriptions"
    )
    print(f"\n{layout} ({n} subscription-partitions), idle; {time.strftime('%Y-%m-%d %H:%M')}\n")
    head = "| figure | raydelay |" + (" baseline | raydelay / baseline |" if base else "")
    print(head)
    print("|---|---|" + ("---|---|" if base else ""))
    for name, show, value in rows:
        line = f"| {name} | {show(ours)} |"
        if base:
            ratio = value(ours) / value(base) if value(base) else float("nan")
            line += f" {show(base)} | {ratio:.2f}x |"
        print(line)
    print(
        f"\n(settle {args.settle:.0f} s, window {args.window:.0f} s; {time.time() - started:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
