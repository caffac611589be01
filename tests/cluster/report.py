"""Markdown tables from the multi-node tier's runs.

``RAYDELAY_CLUSTER_RESULTS=runs.jsonl make cluster`` keeps one JSON line per run; then
``python -m tests.cluster.report runs.jsonl`` prints a table of the runs (the failure, the
pause in delivery of the lost node's partitions and of the others, lost, early, duplicates)
and the placement of the actors before and after the failure.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

KINDS = {
    "worker_kill": "SIGKILL of a worker node",
    "worker_kill_ray_defaults": "SIGKILL of a worker node, Ray's default health checks",
    "subscription_node_kill": "SIGKILL of the worker node serving most subscription units",
    "subscription_node_kill_ray_defaults": (
        "SIGKILL of the worker node serving most subscription units, Ray's default health checks"
    ),
    "subscription_node_vanish": (
        "the worker node serving most subscription units frozen (SIGSTOP: no socket closes)"
    ),
    "coordinator_node_kill": "SIGKILL of the coordinator's node",
    "coordinator_node_kill_ray_defaults": (
        "SIGKILL of the coordinator's node, Ray's default health checks"
    ),
    "kill_with_store_outage": "SIGKILL of a worker node, S3 down for 10 s",
    "drain": "graceful removal of a worker node",
}


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _hit(row: dict) -> bool:
    """Whether a (subscription, partition) row lost its host or its unit's host."""
    return bool(row["on_lost_node"] or row.get("actor_on_lost_node"))


def runs_table(runs: list[dict]) -> str:
    head = (
        "| failure | health checks | lost node's partitions: pause (s) | other partitions: "
        "longest pause (s) | lost | early | cancelled delivered | duplicates (unmarked) | "
        "longest send (s) | units moved (to a running host) | coordinator | actors alive |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for r in runs:
        if r["scenario"] not in KINDS:
            continue
        parts = r["partitions"]
        lost = [p["longest_pause_s"] for p in parts if _hit(p)]
        other = [p["longest_pause_s"] for p in parts if not _hit(p)]
        rep = r["report"].values()
        h = r["health"]
        rows.append(
            f"| {KINDS[r['scenario']]} | {h['health_check_period_ms']} ms x "
            f"{h['health_check_failure_threshold']} | {_span(lost)} | "
            f"{max(other, default=0):.1f} | {sum(x['lost'] for x in rep)} | "
            f"{sum(x['early'] for x in rep)} | {sum(x['cancelled_delivered'] for x in rep)} | "
            f"{sum(x['duplicates'] for x in rep)} ({sum(x['unmarked_duplicates'] for x in rep)}) "
            f"| {r['longest_send_s']:.1f} | {_moved(r)} | {_coordinator(r)} | "
            f"{'all' if r['all_alive'] else r['missing']} |"
        )
    return "\n".join(rows)


def _moved(run: dict) -> str:
    moves = run.get("moves", {}).values()
    return f"{len(moves)} ({sum(m['to_was_running'] for m in moves)})"


def _coordinator(run: dict) -> str:
    """Whether the coordinator moved, and to a process that ran before the failure (its
    standby) or to a new one."""
    c = run.get("coordinator")
    if c is None or "moved" not in c:
        return "-"
    if not c["moved"]:
        return "stayed"
    return "standby took over" if c["was_running"] else "new process"


def partitions_table(runs: list[dict]) -> str:
    """Per run and partition: the longest pause in delivery after the failure began (the
    larger of the two subscriptions'); * marks a partition whose host was on the lost node,
    + one whose unit's subscription host was."""
    n = max((p["partition"] for r in runs for p in r.get("partitions", [])), default=-1) + 1
    head = "| failure | " + " | ".join(f"p{i}" for i in range(n)) + " |"
    rows = [head, "|---" * (n + 1) + "|"]
    for r in runs:
        if r["scenario"] not in KINDS:
            continue
        worst: dict[int, tuple[float, str]] = {}
        for p in r["partitions"]:
            old = worst.get(p["partition"], (0.0, ""))
            mark = ("*" if p["on_lost_node"] else "") + ("+" if p.get("actor_on_lost_node") else "")
            marks = "".join(sorted(set(old[1] + mark)))
            worst[p["partition"]] = (max(old[0], p["longest_pause_s"]), marks)
        cells = [f"{worst[i][0]:.1f}{worst[i][1]}" for i in range(n)]
        rows.append(f"| {KINDS[r['scenario']]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def recovery_table(runs: list[dict]) -> str:
    """Per run whose units moved: when the moved partitions' recovery began in their new
    host (seconds after the failure), when its steps ended (seconds from its beginning:
    peers found, cursor loaded, sealed buckets read, log caught up = recovered), its first
    delivery, and the coordinator's busiest methods meanwhile (calls, seconds)."""
    rows = [
        "| failure | began (s after the failure) | peers | cursor | sealed | recovered | "
        "first delivery | coordinator's busiest methods: calls, s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rec = [x for x in r.get("recoveries", {}).values() if x.get("began_s") is not None]
        if r["scenario"] not in KINDS or not rec:
            continue
        steps = [x.get("steps") or {} for x in rec]
        cells = [_span([x["began_s"] for x in rec])]
        cells += [_span([s[k] for s in steps if k in s]) for k in ("peers", "cursor", "sealed")]
        cells += [
            _span([x[k] for x in rec if x.get(k) is not None])
            for k in ("init_s", "first_delivery_s")
        ]
        calls = r.get("coordinator_calls", {}).get("methods", {})
        busy = ", ".join(
            f"{m} {c['calls']}, {c['seconds']:.2f}" for m, c in list(calls.items())[:4]
        )
        rows.append(f"| {KINDS[r['scenario']]} | " + " | ".join(cells) + f" | {busy or '-'} |")
    return "\n".join(rows)


def placement_table(rows: list[dict]) -> str:
    """Actors per node: hosts (and the partitions they serve), subscription actors,
    coordinator."""
    nodes = sorted({r["node"] for r in rows}, key=lambda n: (not _head(rows, n), n))
    out = [
        "| node | hosts | partitions | subscription hosts | subscription partitions | coordinator |",
        "|---|---|---|---|---|---|",
    ]
    count = Counter((r["node"], r["class"]) for r in rows)
    parts = Counter(r["node"] for r in rows if r["class"] == "HostActor" for _ in r["serves"])
    subparts = Counter(
        r["node"] for r in rows if r["class"] == "SubscriptionHost" for _ in r["serves"]
    )
    for i, n in enumerate(nodes):
        name = "head" if _head(rows, n) else f"worker {i + 1} ({n[:8]})"
        out.append(
            f"| {name} | {count[(n, 'HostActor')]} | {parts[n]} | "
            f"{count[(n, 'SubscriptionHost')]} | {subparts[n]} | "
            f"{_roles(rows, n)} |"
        )
    return "\n".join(out)


def _roles(rows: list[dict], node: str) -> str:
    """The coordinators on ``node``: serving, standby."""
    return " ".join(
        "yes" if r.get("role", "serving") == "serving" else "standby"
        for r in rows
        if r["node"] == node and r["class"] == "CoordinatorActor"
    )


def _head(rows: list[dict], node: str) -> bool:
    return any(r["head"] for r in rows if r["node"] == node)


def main(path: str) -> None:
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    print(runs_table(runs))
    print(
        "\nLongest pause in delivery per partition, in seconds (* its host on the lost node, "
        "+ its unit's subscription host there):\n"
    )
    print(partitions_table(runs))
    print("\nThe moved units' recovery, in seconds:\n")
    print(recovery_table(runs))
    for r in runs:
        if r["scenario"] == "placement":
            print("\nPlacement of 6 partitions x 2 subscriptions on a head and 3 workers:\n")
            print(placement_table(r["placement"]))
        if r["scenario"] == "worker_kill":
            print(f"\nAfter {KINDS['worker_kill']} ({r['lost_node'][:8]}):\n")
            print(placement_table(r["placement_after"]))


if __name__ == "__main__":
    main(sys.argv[1])
