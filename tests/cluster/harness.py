"""One multi-node run: raydelay on a ``ray.cluster_utils.Cluster`` (a head and 3 workers)
over SeaweedFS, under a steady load, with one kind of failure.

Run as ``python -m tests.cluster.harness <scenario> <workdir>`` (a process of its own: a
test session's Ray is a single node). It prints one line ``RESULT <json>``:

- ``report``: lost, early, cancelled-delivered, duplicates (and those without a raised
  ``redelivery_count``) per subscription;
- ``partitions``: per partition, whether its host was on the lost node, and the longest pause in
  delivery after the failure (for a partition of the lost node: node loss -> delivery
  resumed);
- ``placement`` before and after, and whether every actor is alive at the end.

- ``moves``: per subscription unit whose host was on the lost node, where it went and
  whether that host was running before the failure (no process start on the way back);
- ``recoveries``: what re-opening each moved unit's partitions cost.

Scenarios: ``placement`` (no failure), ``worker_kill``, ``worker_kill_ray_defaults`` (Ray's
own health-check settings), ``subscription_node_kill`` (the worker whose subscription hosts
serve the most units; ``..._ray_defaults`` likewise), ``subscription_node_vanish`` (that
worker's raylet and every process it started frozen with SIGSTOP: a machine that vanished
without closing a socket, found only by Ray's health checks), ``coordinator_node_kill``
(``..._ray_defaults`` likewise),
``kill_with_store_outage``, ``drain``, ``local_refused``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from tests.chaos.workload import Ledger, now_ms
from tests.seaweed import start_seaweed

PARTITIONS = 6
SUBSCRIPTIONS = ("a", "b")
# First a backlog due steadily over the whole run (about 30 messages a second per
# partition, whatever the producer does later), then a producer sending a batch every
# SEND_EVERY_S with short delays, the failure coming at FAIL_AT_S.
BACKLOG = 6_000
BACKLOG_FROM_S, BACKLOG_TO_S = 4.0, 40.0
SEND_EVERY_S = 0.1
BATCH = 60
PRODUCE_S = 24.0
FAIL_AT_S = 10.0
OUTAGE_S = 10.0
SETTLE_S = 150.0  # how long the run waits for every message after production ends
RAY_DEFAULT_HEALTH = {
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
    "health_check_failure_threshold": 5,
}

log = logging.getLogger("cluster-harness")
_FIRST_PIDS: set[int] = set()  # the actors' processes before the failure
_FAILED_AT = [0]  # when the failure began (ms)
_SERVING_BEFORE: dict = {}  # the coordinator serving as the failure began
_FROZEN: list = []  # the processes of a vanished node (psutil), killed at the end


def main(scenario: str, workdir: str) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    import raydelay
    from raydelay.cluster.local import RAY_SYSTEM_CONFIG
    from raydelay.config import RayConfig

    work = Path(workdir)
    s3 = start_seaweed(work / "s3")
    os.environ.update(s3.child_env())  # the nodes' processes inherit the credentials
    health = (
        RAY_DEFAULT_HEALTH if scenario.endswith("ray_defaults") else RayConfig().system_config()
    )
    cluster = Cluster(
        initialize_head=True,
        # 4 CPUs a node: Ray starts as many worker processes at once as a node has CPUs
        head_node_args={"num_cpus": 4, "_system_config": {**RAY_SYSTEM_CONFIG, **health}},
    )
    workers = [cluster.add_node(num_cpus=4) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raydelay", log_to_driver=False)
    finished = threading.Event()
    try:
        if scenario == "local_refused":
            return _local_refused(raydelay, work)
        config = {
            "storage": s3.storage_config(s3.bucket("raydelay")),
            "topic": {"max_entries_per_ledger": 5_000, "retention_interval_ms": 1_000},
            "subscription": {"cursor_persist_interval_ms": 300},
            "delayed": {"min_index_count_per_bucket": 5_000},
            "client": {"retry_deadline_s": 120.0},
        }
        rd = raydelay.connect(config=config)
        rd.create_topic("orders", PARTITIONS)
        consumers = {s: rd.subscribe("orders", s) for s in SUBSCRIPTIONS}
        before = rd.placement()
        _FIRST_PIDS.update(r["pid"] for r in before)
        if scenario == "placement":
            deadline = time.monotonic() + 30  # (the standby coordinator starts meanwhile)
            while time.monotonic() < deadline and not any(
                r.get("role") == "standby" for r in before
            ):
                time.sleep(0.2)
                before = rd.placement()
            return {"scenario": scenario, "placement": before, **_alive(rd)}
        by_address = {w.node_id: w for w in workers}
        chaos = lambda: _chaos(scenario, cluster, by_address, rd, s3)  # noqa: E731 - at FAIL_AT_S
        calls_before = _coordinator_calls()
        ledger, fail_ms, lost_node, sends = _run(rd, consumers, chaos, finished)
        _FAILED_AT[0] = fail_ms
        after = rd.placement()
        moves = _moves(before, after, lost_node)
        serving = _serving_coordinator(after)
        recovered = _recoveries(moves, fail_ms)
        coordinator = _busiest(calls_before, _coordinator_calls())
        out = {
            "scenario": scenario,
            "health": health,
            "report": ledger.check(),
            "partitions": _pauses(ledger, fail_ms, before, lost_node),
            "longest_send_s": round(max(sends["send"]), 2),
            "median_send_s": round(sorted(sends["send"])[len(sends["send"]) // 2], 3),
            "median_cancel_s": round(sorted(sends["cancel"])[len(sends["cancel"]) // 2], 3),
            "sent": len(ledger.sent),
            "longest_receive_s": round(sends["receive"] / 1000, 2),  # a call, after the failure
            "producer_retries": ledger.producer_retries,
            "lost_node": lost_node,
            "moves": moves,
            "recoveries": recovered,
            "coordinator_calls": coordinator,
            "coordinator": {  # the one serving at the end; did its process run before?
                "before": _SERVING_BEFORE.get("name"),
                "moved": _SERVING_BEFORE.get("pid") != serving["pid"],
                "name": serving["name"],
                "node": serving["node"],
                "was_running": serving["pid"] in _FIRST_PIDS,
                "standbys": [r["name"] for r in after if r.get("role") == "standby"],
            },
            "placement": before,
            "placement_after": after,
            **_alive(rd),
        }
        rd.shutdown()
        return out
    finally:
        finished.set()  # the failure's thread ends (the S3 server it resumed dies with it)
        for proc in _FROZEN:  # (SIGKILL ends a stopped process too)
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - gone already
                pass
        ray.shutdown()
        cluster.shutdown()
        s3.stop()


def _local_refused(raydelay, work: Path) -> dict:
    from raydelay.errors import InvalidArgument

    try:
        raydelay.connect(config={"storage": {"kind": "local", "local": {"root": str(work)}}})
        return {"scenario": "local_refused", "refused": None}
    except InvalidArgument as exc:
        return {"scenario": "local_refused", "refused": str(exc)}


def _chaos(scenario, cluster, workers, rd, s3):
    """The failure of ``scenario``: a function that injects it and returns the lost node.
    Where things are is looked at as the failure begins (the standby coordinator, say,
    starts a second after the coordinator)."""
    placement = rd.placement()
    _FIRST_PIDS.update(r["pid"] for r in placement)
    # partitions per node (of the hosts there): the busiest worker holds the most
    topics = Counter()
    for r in placement:
        if r["class"] == "HostActor":
            topics[r["node"]] += len(r["serves"])
    _SERVING_BEFORE.update(_serving_coordinator(placement))
    coordinator_node = _SERVING_BEFORE["node"]

    def busiest_worker() -> str:
        return max((n for n in topics if n in workers), key=lambda n: (topics[n], n))

    def subscription_worker() -> str:  # the worker serving the most subscription units
        units = Counter(
            r["node"]
            for r in placement
            if r["class"] == "SubscriptionHost"
            for _ in {tuple(k.split("/")[:2]) for k in r["serves"]}
        )
        return max((n for n in units if n in workers), key=lambda n: (units[n], n))

    def kill(node: str, graceful: bool = False) -> str:
        cluster.remove_node(workers[node], allow_graceful=graceful)
        return node

    if scenario in ("worker_kill", "worker_kill_ray_defaults"):
        return lambda: kill(busiest_worker())
    if scenario in ("subscription_node_kill", "subscription_node_kill_ray_defaults"):
        return lambda: kill(subscription_worker())
    if scenario == "subscription_node_vanish":

        def freeze() -> str:
            import psutil
            from ray._private import ray_constants

            node = subscription_worker()
            info = workers[node].all_processes[ray_constants.PROCESS_TYPE_RAYLET][0]
            raylet = psutil.Process(info.process.pid)
            procs = [raylet, *raylet.children(recursive=True)]
            for proc in procs:  # (its sockets stay open: connections hang, none is refused)
                proc.send_signal(signal.SIGSTOP)
            _FROZEN.extend(procs)
            log.info("froze node %s: %d processes", node[:8], len(procs))
            return node

        return freeze
    if scenario in ("coordinator_node_kill", "coordinator_node_kill_ray_defaults"):
        return lambda: kill(coordinator_node)
    if scenario == "drain":
        return lambda: kill(busiest_worker(), graceful=True)
    if scenario == "kill_with_store_outage":

        def outage() -> str:
            s3.pause()  # the S3 server is gone (connections refused) ...
            node = kill(busiest_worker())
            time.sleep(OUTAGE_S)  # ... for 10 s, while the lost node's actors come back
            s3.resume()
            return node

        return outage
    raise SystemExit(f"unknown scenario {scenario!r}")


def _run(rd, consumers, chaos, finished: threading.Event):
    """Produce for PRODUCE_S seconds (and cancel a share), consume and ack throughout,
    run ``chaos`` at FAIL_AT_S; returns the ledger, when the failure began, the lost node
    and every send's duration. The thread that runs ``chaos`` lives until ``finished``:
    a SeaweedFS server it resumed ends with the thread that started it."""
    rng = random.Random(7)
    ledger = Ledger(received={s: [] for s in consumers})
    producer = rd.create_producer("orders")
    stop = threading.Event()
    lock = threading.Lock()
    calls: list[tuple[int, int]] = []  # (receive began, how long it took), in ms

    def consume(name: str) -> None:
        consumer = consumers[name]
        while not stop.is_set():
            t0 = now_ms()
            msgs = consumer.receive(max_messages=2_000, timeout_s=0.2)
            t = now_ms()
            calls.append((t0, t - t0))
            with lock:
                ledger.record(name, msgs, t)
            if msgs:
                consumer.ack(msgs)

    threads = [threading.Thread(target=consume, args=(s,), daemon=True) for s in consumers]
    for t in threads:
        t.start()
    fail = {}

    failed = threading.Event()

    def inject() -> None:
        time.sleep(FAIL_AT_S)
        try:
            inject_it = chaos()  # (where things are, looked at before the clock starts)
            log.warning("the failure begins")
            fail["ms"] = now_ms()
            fail["node"] = inject_it()
        except BaseException as exc:  # the run reports it instead of waiting forever
            fail["error"] = exc
            raise
        finally:
            failed.set()
        finished.wait()

    started = time.monotonic()
    threading.Thread(target=inject, daemon=True).start()
    sends: list[float] = []
    cancels: list[float] = []
    base = now_ms()
    # (not sorted: each partition gets a run of them, due over the whole window)
    ats = [
        base + rng.randint(int(BACKLOG_FROM_S * 1000), int(BACKLOG_TO_S * 1000))
        for _ in range(BACKLOG)
    ]
    mids = producer.send_many(
        [b"backlog-%d" % i for i in range(BACKLOG)],
        deliver_at=ats,
        keys=[str(i) for i in range(BACKLOG)],  # keys spread it over the partitions
    )
    ledger.sent.update(zip(mids, ats, strict=True))
    n = BACKLOG
    while time.monotonic() - started < PRODUCE_S:
        base = now_ms()
        ats = [base + rng.randint(300, 3_000) for _ in range(BATCH)]
        t0 = time.monotonic()
        mids = producer.send_many([b"%d" % (n + i) for i in range(BATCH)], deliver_at=ats)
        sends.append(time.monotonic() - t0)
        n += BATCH
        ledger.sent.update(zip(mids, ats, strict=True))
        doomed = [m for m, at in zip(mids, ats, strict=True) if at > base + 2_000][:6]
        ledger.cancel_attempts.update(doomed)
        t1 = time.monotonic()
        honoured = producer.cancel_many(doomed)
        cancels.append(time.monotonic() - t1)
        ledger.cancelled.update(m for m, ok in zip(doomed, honoured, strict=True) if ok)
        time.sleep(max(0.0, SEND_EVERY_S - (time.monotonic() - t0)))
    failed.wait()
    if "error" in fail:
        raise RuntimeError(f"injecting the failure failed: {fail['error']!r}")
    ledger.producer_retries = producer.retries
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        with lock:
            if ledger.all_received():
                break
        time.sleep(0.5)
    time.sleep(2.0)  # late duplicates, if any, arrive now
    stop.set()
    for t in threads:
        t.join(timeout=10)
    slowest = max((ms for t0, ms in calls if t0 >= fail["ms"]), default=0)
    return ledger, fail["ms"], fail["node"], {"send": sends, "cancel": cancels, "receive": slowest}


def _pauses(ledger: Ledger, fail_ms: int, placement, lost_node: str) -> list[dict]:
    """Per partition and subscription: the longest pause between deliveries from the
    failure until production's messages were due (the load is steady: about 100 messages a
    second per partition), and whether its host was on the lost node."""
    node_of = {
        int(key.rsplit("/", 1)[1]): r["node"]
        for r in placement
        if r["class"] == "HostActor"
        for key in r["serves"]
        if key.startswith("orders/")
    }
    actor_node = {  # (subscription, partition) -> the node of the host serving its unit
        (key.split("/")[1], int(key.rsplit("/", 1)[1])): r["node"]
        for r in placement
        if r["class"] == "SubscriptionHost"
        for key in r["serves"]
    }
    last_due: dict[int, int] = defaultdict(int)
    for mid, at in ledger.sent.items():
        last_due[mid.partition] = max(last_due[mid.partition], at)
    times: dict[tuple[str, int], list[int]] = defaultdict(list)
    for name, got in ledger.received.items():
        for mid, _, t, _ in got:
            times[(name, mid.partition)].append(t)
    rows = []
    for (name, p), ts in sorted(times.items()):
        end = last_due[p]
        ts = sorted(t for t in ts if fail_ms <= t <= end)
        marks = [fail_ms, *ts, end]
        gap, at = max((b - a, a) for a, b in zip(marks, marks[1:], strict=False))
        rows.append(
            {
                "subscription": name,
                "partition": p,
                "on_lost_node": node_of.get(p) == lost_node,
                "actor_on_lost_node": actor_node.get((name, p)) == lost_node,
                "longest_pause_s": round(gap / 1000, 2),
                "pause_began_s": round((at - fail_ms) / 1000, 2),  # after the failure began
                "deliveries": len(ts),
            }
        )
    return rows


def _units(placement) -> dict[str, dict]:
    """Subscription unit (``topic/subscription``) -> the row of the host serving it."""
    return {
        "/".join(key.split("/")[:2]): r
        for r in placement
        if r["class"] == "SubscriptionHost"
        for key in r["serves"]
    }


def _moves(before, after, lost_node: str) -> dict:
    """Per unit whose host was on the lost node: its host before and after, and whether the
    new host's process ran before the failure (then nothing started on the way back)."""
    was, now = _units(before), _units(after)
    out = {}
    for unit, r in sorted(was.items()):
        if r["node"] != lost_node:
            continue
        new = now.get(unit)
        out[unit] = {
            "from": r["name"],
            "to": new and new["name"],
            "to_node": new and new["node"],
            "to_was_running": bool(new and new["pid"] in _FIRST_PIDS),
            "to_started_s": new and round((new["started_ms"] - _FAILED_AT[0]) / 1000, 2),
        }
    return out


def _recoveries(moves: dict, fail_ms: int) -> dict:
    """What re-opening each moved unit's partitions cost: when the recovery began in the
    new host (seconds after the failure), when each of its steps ended and the recovery
    itself (``init_s``), and the first delivery, in seconds from its beginning."""
    import ray

    from raydelay.actors.handles import subscription_partition
    from raydelay.actors.subscription import SubscriptionHost

    out = {}
    for unit in moves:
        topic, sub = unit.split("/")
        for p in range(PARTITIONS):
            part = subscription_partition(topic, p, sub)
            rec = ray.get(part.submit(SubscriptionHost.stats))["recovery"]
            row = {k: rec.get(k) for k in ("steps", "init_s", "first_delivery_s")}
            if rec.get("began_at_ms") is not None:
                row["began_s"] = round((rec["began_at_ms"] - fail_ms) / 1000, 2)
            out[f"{unit}/{p}"] = row
    return out


def _coordinator_calls() -> dict:
    """The coordinator's calls so far, per method ({} when it cannot be asked)."""
    import ray

    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle

    try:
        return ray.get(coordinator_handle().submit(CoordinatorActor.call_times), timeout=30)
    except Exception:  # noqa: BLE001 - a figure, not a check
        return {}


def _busiest(before: dict, after: dict, top: int = 8) -> dict:
    """The coordinator's methods that took most of its time between two readings (all of
    ``after`` when it restarted in between), with their calls, seconds, and the longest call since it started."""
    restarted = any(after.get(m, {}).get("calls", 0) < r["calls"] for m, r in before.items())
    rows = {}
    for method, r in after.items():
        b = {} if restarted else before.get(method, {})
        calls = r["calls"] - b.get("calls", 0)
        if calls:
            rows[method] = {
                "calls": calls,
                "seconds": round(r["seconds"] - b.get("seconds", 0.0), 3),
                "longest_s": r["longest_s"],
            }
    ranked = sorted(rows.items(), key=lambda kv: -kv[1]["seconds"])[:top]
    return {"restarted": restarted, "methods": dict(ranked)}


def _serving_coordinator(placement) -> dict:
    return next(r for r in placement if r.get("role") == "serving")


def _alive(rd) -> dict:
    """Whether every actor raydelay needs is alive (they are re-created on demand: ask
    each once, as a client would)."""
    for s in SUBSCRIPTIONS:
        rd.stats("orders", s)  # reaches every actor of the subscription and its topic
    rows = rd.placement()
    served = {k for r in rows if r["state"] == "ALIVE" for k in r["serves"]}
    roles = {"serving"}
    wanted = {f"orders/{p}" for p in range(PARTITIONS)}
    wanted |= {f"orders/{s}/{p}" for s in SUBSCRIPTIONS for p in range(PARTITIONS)}
    alive = {r.get("role") for r in rows if r["state"] == "ALIVE"}
    missing = sorted((roles - alive) | (wanted - served))
    return {"all_alive": not missing, "missing": missing}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = main(sys.argv[1], sys.argv[2])
    print("RESULT " + json.dumps(result), flush=True)
