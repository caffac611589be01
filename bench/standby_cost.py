"""What the spare capacity for failover costs (issue: a lost node is a blip). Prints a table.

A lost node's units move to subscription hosts that already run, and
``placement.warm_subscription_hosts`` keeps that many running on every node, idle or not.
This bench measures one such idle host against a bare Ray actor (a class with no method
called, Ray's own floor per process) in the same run, on a local Ray started for it:

- a layout with two subscription host slots on the node, both kept warm, and one topic with
  one subscription whose consumer is attached, so that one host serves the unit and the
  other idles as a standby;
- the coordinator's standby: a second ``CoordinatorActor`` that stands by (on a cluster
  of several nodes the serving coordinator keeps one on another node; on this single node
  it is started by hand), beside the serving coordinator;
- after ``--settle`` seconds, over ``--window`` seconds: each process's CPU time per second
  and its proportional set size (PSS).

Usage: python bench/standby_cost.py [--settle 15 --window 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.child import run_child  # noqa: E402

CHILD = r"""
import json, sys, time, psutil, ray
import raydelay
from raydelay.cluster import placement

settle_s, window_s, root = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
cluster = raydelay.connect(config={
    "storage": {"kind": "local", "local": {"root": root}},
    # (no standby coordinator of its own: on one node it would be ended as sharing the
    # coordinator's node; the bench starts one by hand)
    "placement": {"subscription_hosts_per_node": 2, "warm_subscription_hosts": 2,
                  "standby_coordinator": False},
})
cluster.create_topic("t", 1)
consumer = cluster.subscribe("t", "s")


@ray.remote
class Bare:
    def pid(self):
        import os
        return os.getpid()


bare = Bare.remote()
bare_pid = ray.get(bare.pid.remote())
from raydelay.actors.coordinator import CoordinatorActor, spawn_coordinator
from raydelay.actors.handles import coordinator_handle
from raydelay.actors.host import adopt_on_host, spawn_host
from raydelay.cluster.names import COORDINATORS
from raydelay.config import config_to_dict
standby = spawn_coordinator(
    config_to_dict(cluster.config), spawn_host, adopt_on_host, name=COORDINATORS[1], node=None
)
assert ray.get(standby.role.remote()) == "standing by"
time.sleep(settle_s)
serving = set(ray.get(coordinator_handle().submit(CoordinatorActor.unit_assignments)).values())
rows = {}
for a in placement.actors():
    if a["class"] == "SubscriptionHost":
        rows["standby" if a["name"] not in serving else "serving"] = a["pid"]
    if a["class"] == "CoordinatorActor":
        rows["coordinator_standby" if a["name"] == COORDINATORS[1] else "coordinator"] = a["pid"]
rows["bare"] = bare_pid
procs = {k: psutil.Process(pid) for k, pid in rows.items()}

def cpu(p):
    c = p.cpu_times()
    return c.user + c.system

before = {k: cpu(p) for k, p in procs.items()}
time.sleep(window_s)
out = {
    k: {"cpu_ms_per_s": 1000 * (cpu(p) - before[k]) / window_s, "pss": p.memory_full_info().pss}
    for k, p in procs.items()
}
print("RESULT " + json.dumps(out))
consumer.close()
cluster.shutdown()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds before measuring")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured")
    args = ap.parse_args()
    out = run_child(CHILD, [str(args.settle), str(args.window)], None)
    if "standby" not in out:
        raise SystemExit(f"no idle subscription host was found: {out}")
    bare = out["bare"]
    print(f"\nIdle processes, {time.strftime('%Y-%m-%d %H:%M')} (window {args.window:.0f} s)\n")
    print("| process | CPU ms/s | vs bare actor | PSS MiB | vs bare actor |")
    print("|---|---:|---:|---:|---:|")
    for key, label in (
        ("standby", "warm subscription host, idle (the standby)"),
        ("serving", "subscription host serving one idle unit"),
        ("coordinator_standby", "standby coordinator, idle"),
        ("coordinator", "serving coordinator, idle"),
        ("bare", "bare Ray actor (the floor)"),
    ):
        r = out.get(key)
        if r is None:
            continue
        cpu_ratio = r["cpu_ms_per_s"] / bare["cpu_ms_per_s"] if bare["cpu_ms_per_s"] else 0.0
        print(
            f"| {label} | {r['cpu_ms_per_s']:.1f} | {cpu_ratio:.2f}x | "
            f"{r['pss'] / 2**20:.0f} | {r['pss'] / bare['pss']:.2f}x |"
        )


if __name__ == "__main__":
    main()
