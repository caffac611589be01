"""A bulk load into one partition read by K shared subscriptions: what each subscription
adds, with the layout's idle floor taken out.

For each K, in a process of its own with a new local Ray on the machine's 2 cores and a
local-dir store: a one-partition topic with K shared subscriptions and no consumer, and a
bare Ray actor (a class with one method) beside them. Then:

1. **Idle.** After a 5 s settle, the CPU of every Ray worker process over ``--idle-s``
   seconds, per second (from each thread's schedstat, in ns): the layout's idle floor. In
   the same window, the idle CPU per subscription host process (the actors that serve
   subscriptions) and the bare actor's.
2. **Send.** ``--n`` delayed messages of 100 B, due in an hour, in ``send_many`` batches of
   ``--batch`` from one thread: the producer's time.
3. **Indexed.** Until every subscription counts all of them as delayed (asked one
   subscription at a time, at most 5 times a second).
4. **Idle again**, 2 s later, for ``--idle-s``: the layout's CPU per second with every
   subscription holding the messages (they fall due in an hour).

The CPU of the load is every Ray worker's CPU from the first send until every subscription
held all; "net of the floor" takes out the idle floor times that wall time. Ratios are
against K = 1 of the same run.

``--baseline SRC`` runs each K with the raydelay source tree at SRC too (for example a
``git worktree`` of an older commit), alternating with this tree ``--rounds`` times, and
prints the ratios of the means, from the same run.

Usage: python bench/fanout_bulk.py [--ks 1 8 32 128] [--n 300000] [--batch 5000]
           [--idle-s 3] [--rounds 1] [--baseline /tmp/old] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.child import run_child  # noqa: E402

CHILD = r"""
import json, os, sys, time
import numpy as np, psutil, ray
import raydelay
from raydelay.cluster.local import RAY_SYSTEM_CONFIG

k, n, batch, idle_s, settle_store, root = (int(sys.argv[1]), int(sys.argv[2]),
    int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
         log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG)


@ray.remote(num_cpus=0)
class Bare:
    def pid(self):
        import os
        return os.getpid()


bare = Bare.remote()
bare_pid = ray.get(bare.pid.remote())
cluster = raydelay.connect(config={"storage": {"kind": "local", "local": {"root": root}}})
cluster.create_topic("fan", partitions=1)
subs = [f"s{i}" for i in range(k)]
for name in subs:
    cluster.subscribe("fan", name).close()  # the subscription stays; nobody consumes
producer = cluster.create_producer("fan")


def workers():
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv and argv[0].startswith("ray::"):
            out[p.pid] = (p, argv[0][5:].split(".")[0])
    return out


def cpu(procs):
    total = {}
    for pid, (p, _) in procs.items():
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total[pid] = t.user + t.system
    return total


def cpu_ns(procs):
    # CPU seconds so far per process, from its threads' schedstat (nanoseconds, where
    # psutil's counts are 10 ms ticks: too coarse for an idle process over seconds)
    out = {}
    for pid in procs:
        total = 0
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        except OSError:
            continue
        out[pid] = total / 1e9
    return out


time.sleep(5)  # settle: the subscriptions' first reads stand, start-up is over
procs = workers()
c0, t0 = cpu_ns(procs), time.monotonic()
time.sleep(idle_s)
c1, idle_wall = cpu_ns(procs), time.monotonic() - t0
idle = {pid: (c1[pid] - c0[pid]) / idle_wall for pid in c1 if pid in c0}
floor = sum(idle.values())
sub_hosts = [pid for pid, (_, role) in procs.items() if "Subscription" in role]
per_sub_host = sum(idle[pid] for pid in sub_hosts) / max(len(sub_hosts), 1)

payload = b"x" * 100
due = int(time.time() * 1000) + 3_600_000
c0, t0 = cpu(procs), time.monotonic()
sent = 0
while sent < n:
    c = min(batch, n - sent)
    producer.send_many([payload] * c, deliver_at=[due] * c)
    sent += c
send_s = time.monotonic() - t0
held, i = [0] * k, 0
deadline = time.monotonic() + 600
while i < k and time.monotonic() < deadline:
    held[i] = cluster.stats("fan", subs[i])["delayed"]
    if held[i] >= n:
        i += 1
        continue
    time.sleep(0.2)
wall = time.monotonic() - t0
c1 = cpu(procs)
load = sum(c1[pid] - c0[pid] for pid in c1 if pid in c0)
roles = {}
for pid, (_, role) in procs.items():
    if pid in c1 and pid in c0:
        roles[role] = roles.get(role, 0.0) + c1[pid] - c0[pid]
time.sleep(2)  # (the last seals and reports of the load)
c0, t0 = cpu_ns(procs), time.monotonic()
time.sleep(idle_s)  # idle again, every subscription holding n pending
c1, after_wall = cpu_ns(procs), time.monotonic() - t0
floor_after = sum(c1[pid] - c0[pid] for pid in c1 if pid in c0) / after_wall
store = written = None
if settle_store > 0:  # the store's bytes once retention deleted the sealed ledgers
    from raydelay.actors.handles import topic_partition
    from raydelay.actors.host import HostActor
    time.sleep(settle_store)
    store = sum(os.path.getsize(os.path.join(d, f)) for base in ("topics", "subs")
                for d, _, fs in os.walk(os.path.join(root, base)) for f in fs)
    t = ray.get(topic_partition("fan", 0).submit(HostActor.stats))
    written = t["bytes_written"] + t["sealed_bytes"] + t.get("merged_bytes", 0)
print("RESULT " + json.dumps({
    "store_per_payload": None if store is None else store / (n * len(payload)),
    "written_per_appended": None if written is None else written / (n * len(payload)),
    "k": k, "n": n, "complete": i == k, "send_s": send_s, "indexed_s": wall,
    "cpu_s": load, "floor_per_s": floor, "net_cpu_s": load - floor * wall,
    "floor_after_per_s": floor_after,
    "workers": len(procs), "sub_hosts": len(sub_hosts),
    "idle_per_sub_host": per_sub_host, "idle_bare": idle.get(bare_pid, 0.0),
    "cpu_by_role": roles,
}))
producer.close()
cluster.shutdown()
"""


def run(
    k: int, n: int, batch: int, idle_s: float, src: str | None, settle_store: float = 0.0
) -> dict:
    """One run (a process of its own, with its own Ray) at K = ``k``; ``settle_store``:
    seconds to wait after the load before the store's bytes are measured (0: not)."""
    argv = [str(k), str(n), str(batch), str(idle_s), str(settle_store)]
    result = run_child(CHILD, argv, src, timeout_s=900)
    if not result["complete"]:
        raise SystemExit(f"K={k}: not every subscription indexed all {n:,} in 600 s")
    return result


def measure(ks: list[int], n: int, batch: int = 5_000, idle_s: float = 3.0) -> list[dict]:
    """One run per K (bench/compare.py's fanout scenario), with the store's bytes 12 s
    after the load (retention runs every 5 s)."""
    return [run(k, n, batch, idle_s, None, settle_store=12.0) for k in sorted(set(ks))]


def mean_of(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


# (figure, how it is made from a run's means, format); the ratios to K = 1 follow
FIGURES = [
    ("send s", lambda m: m["send_s"], "{:.2f}"),
    ("send msg/s", lambda m: m["n"] / m["send_s"], "{:,.0f}"),
    ("s until all indexed", lambda m: m["indexed_s"], "{:.2f}"),
    ("CPU s, all workers", lambda m: m["cpu_s"], "{:.2f}"),
    ("idle floor ms/s", lambda m: 1000 * m["floor_per_s"], "{:.0f}"),
    ("idle ms/s after the load (n pending)", lambda m: 1000 * m["floor_after_per_s"], "{:.0f}"),
    ("CPU s net of the floor", lambda m: m["net_cpu_s"], "{:.2f}"),
    ("idle ms/s per subscription host", lambda m: 1000 * m["idle_per_sub_host"], "{:.1f}"),
    ("idle ms/s, bare Ray actor", lambda m: 1000 * m["idle_bare"], "{:.1f}"),
    (
        "subscription host / bare",
        lambda m: m["idle_per_sub_host"] / max(m["idle_bare"], 1e-9),
        "{:.2f}x",
    ),  # fmt: skip
    ("worker processes", lambda m: m["workers"], "{:.0f}"),
]
RATIOS = ("send s", "CPU s, all workers", "CPU s net of the floor")
KEYS = ("n", "send_s", "indexed_s", "cpu_s", "floor_per_s", "net_cpu_s", "workers",
        "idle_per_sub_host", "idle_bare", "floor_after_per_s")  # fmt: skip


def means(rows: list[dict]) -> dict:
    return {key: mean_of(rows, key) for key in KEYS}


def table(by_k: dict[int, dict], base_by_k: dict[int, dict] | None) -> list[str]:
    ks = sorted(by_k)
    lines = ["| figure | " + " | ".join(f"K={k}" for k in ks) + " |"]
    lines.append("|---|" + "---:|" * len(ks))
    for name, get, fmt in FIGURES:
        cells = [fmt.format(get(by_k[k])) for k in ks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if name in RATIOS:
            one = get(by_k[ks[0]])
            cells = [f"{get(by_k[k]) / one:.2f}x" if one > 0 else "-" for k in ks]
            lines.append(f"| {name}, vs K={ks[0]} | " + " | ".join(cells) + " |")
        if base_by_k is not None and name in RATIOS:
            cells = [f"{get(by_k[k]) / max(get(base_by_k[k]), 1e-9):.2f}x" for k in ks]
            lines.append(f"| {name}, vs baseline | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--ks", type=int, nargs="+", default=[1, 8, 32, 128], help="subscription counts"
    )
    ap.add_argument("--n", type=int, default=300_000, help="messages sent in each run")
    ap.add_argument("--batch", type=int, default=5_000, help="messages per send_many")
    ap.add_argument("--idle-s", type=float, default=3.0, help="the idle window, seconds")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each variant per K")
    ap.add_argument("--baseline", help="a raydelay source tree to run the same load with")
    ap.add_argument("--json", help="write every run's figures here too")
    args = ap.parse_args()
    for name, value in (("--ks", min(args.ks)), ("--n", args.n), ("--batch", args.batch),
                        ("--rounds", args.rounds)):  # fmt: skip
        if value < 1:
            ap.error(f"{name}: must be >= 1")
    if args.idle_s <= 0:
        ap.error("--idle-s: must be > 0")
    ks = sorted(set(args.ks))
    started = time.time()
    ours: dict[int, list[dict]] = {k: [] for k in ks}
    base: dict[int, list[dict]] = {k: [] for k in ks}
    for rnd in range(args.rounds):  # alternating: a slow minute of the machine hits both
        for k in ks:
            print(f"round {rnd + 1}, K={k}", file=sys.stderr)
            ours[k].append(run(k, args.n, args.batch, args.idle_s, None))
            if args.baseline:
                base[k].append(run(k, args.n, args.batch, args.idle_s, args.baseline))
    print(
        f"\n{args.n:,} delayed messages into one partition, `send_many` of {args.batch:,}, read "
        f"by K shared subscriptions (no consumer); idle floor over {args.idle_s:g} s; "
        f"{args.rounds} run(s) a variant, means; {time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print("\n".join(table({k: means(ours[k]) for k in ks}, None)))
    if args.baseline:
        print(f"\nbaseline {args.baseline}:\n")
        print("\n".join(table({k: means(base[k]) for k in ks}, None)))
        print("\nthis tree, with its ratios to the baseline:\n")
        print("\n".join(table({k: means(ours[k]) for k in ks},
                              {k: means(base[k]) for k in ks})))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": ours, "baseline": base}, indent=1))
    print(f"\n({time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
