"""Scheduled Ray calls (issue #29) beside Celery ETA tasks on a Redis broker, in one run on
this machine: scheduling throughput, start lateness, no-op tasks started per second against
a plain Ray submission loop, a burst due at one instant, and memory while tasks wait.

The peers run one after the other, so neither shares the CPU with the other:

- raydelay: a local Ray on the machine's 2 cores (``bench/common.py``), a local-dir store in
  a temp dir, the default ``tasks`` config (4 partitions, 1 runner, max_in_flight 1000)
  unless a row says otherwise. The driver's cwd is the repo root, so the runners' Ray
  workers import ``bench.task_funcs`` (calls are stored by import path, not pickled).
- Celery (``bench/celery_app.py``): Debian's redis-server as the broker (AOF,
  ``appendfsync everysec``, as ``bench/peer_redis.py`` starts it), one worker
  ``-P prefork -c 2`` (one pool process per core), Celery's defaults otherwise (acks
  before the task runs, prefetch multiplier 4, no result backend).

Every start is timed by the task itself: ``bench/task_funcs.py:record`` writes
``<due_ms> <started_ms>`` from inside the task body (a Ray worker, or a Celery pool
process); lateness is started - due, in ms of the machine's one wall clock.

Scenarios (the full plan; ``--quick`` divides every count and window by 10, keeping the
1k tasks/s rate):

1. schedule: ``schedule_many`` of 100k calls due over the next 60 s (one numpy int64
   array of deliver_at) -> tasks/s until it returns (the calls are durable then);
   ``schedule`` one call at a time (10k, at most 30 s; due in an hour, cancelled after)
   -> tasks/s and ms per call. Celery: ``apply_async(eta=...)`` in a loop, one at a time.
2. lateness: those 100k while they fall due (1.67k/s), and 30k due at 1k/s for 30 s
   (all scheduled before the first is due).
3. no-op rate (raydelay only): 20k no-op calls due at one instant -> from the due instant
   until all are acknowledged, with 1 and 2 runners x max_in_flight 1000 and 5000; against
   a plain Ray loop ``ray.get([noop.remote() for _ in range(20k)])`` of the same no-op in
   the same Ray, run before and after the four (the ratio uses their mean).
4. burst: 100k calls due at one instant -> from that instant until the last one started
   (and, raydelay, until all are acknowledged).
5. memory: raydelay, on a fresh cluster: 1M no-op calls due one to two hours from now ->
   RSS and PSS of every raydelay actor (coordinator, hosts, subscription actors, runner)
   idle, with 100k and with 1M waiting. Celery, on a fresh worker: 100k no-op ETA tasks
   one to two hours ahead (1M with ``--celery-million``) -> RSS and PSS of the worker
   (the main process holds ETA tasks; the pool processes are listed apart).

Writes ``bench/results/<date>-tasks.md`` (``-tasks-quick`` with ``--quick``).

Usage: python bench/tasks_bench.py [--quick] [--peers raydelay celery] [--celery-million]
       [--profile] [--tag NAME]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402

import raydelay  # noqa: E402
from bench import task_funcs  # noqa: E402
from bench.common import cpu_times, ray_processes, start_local_ray  # noqa: E402
from bench.workload import now_ms, progress, sleep_until  # noqa: E402
from raydelay.client.runner import RUNNERS_SUBSCRIPTION, runner_name  # noqa: E402
from raydelay.cluster import placement  # noqa: E402

MIB = 2**20
# Calls per schedule_many (raydelay) in the memory scenario: the driver builds one list each.
MEMORY_CHUNK = 100_000
# The memory scenario's calls fall due between one and two hours from now: never in the run.
HOUR_MS = 3_600_000
# How long a scenario may go without a new start before it is given up (and marked).
STALL_S = 60.0


@dataclass(frozen=True)
class Plan:
    """The counts of one run (``--quick``: :meth:`smaller`)."""

    window: int = 100_000  # calls due over window_s (scenarios 1 and 2)
    window_s: int = 60
    one_by_one: int = 10_000  # schedule() one at a time, at most one_by_one_s
    one_by_one_s: float = 30.0
    rate: int = 1_000  # tasks/s of the steady lateness case, for rate_s
    rate_s: int = 30
    low_rate: int = 100  # tasks/s of the light steady case (issue #51's second row)
    noop: int = 20_000  # no-op calls due at one instant, per runner config
    configs: tuple[tuple[int, int], ...] = ((1, 1000), (1, 5000), (2, 1000), (2, 5000))
    burst: int = 100_000
    memory: tuple[int, ...] = (100_000, 1_000_000)  # raydelay's checkpoints
    celery_memory: tuple[int, ...] = (100_000,)
    lead_ms: int = 5_000  # the least time from scheduling a case to its first due time

    def smaller(self, by: int) -> Plan:
        return replace(
            self,
            window=self.window // by,
            window_s=max(self.window_s // by, 5),
            one_by_one=self.one_by_one // by,
            one_by_one_s=max(self.one_by_one_s / by, 5.0),
            rate_s=max(self.rate_s // by, 5),
            noop=self.noop // by,
            burst=self.burst // by,
            memory=tuple(m // by for m in self.memory),
            celery_memory=tuple(m // by for m in self.celery_memory),
            lead_ms=2_000,
        )


# --- what the tasks left behind -----------------------------------------------------------


class Records:
    """The lines ``task_funcs.record`` wrote under one directory (a file per process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _files(self) -> list[Path]:
        return sorted(self.path.glob("*.txt")) if self.path.exists() else []

    def count(self) -> int:
        return sum(f.read_bytes().count(b"\n") for f in self._files())

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """(due_ms, started_ms) of every complete line."""
        pairs = [
            line.split()
            for f in self._files()
            for line in f.read_bytes().split(b"\n")
            if line.count(b" ") == 1
        ]
        a = np.array(pairs, dtype=np.float64).reshape(-1, 2)
        return a[:, 0], a[:, 1]

    def wait(self, n: int, timeout_s: float) -> int:
        """Wait until ``n`` lines are there, ``timeout_s`` passed, or none came for
        ``STALL_S``; returns how many there are."""
        deadline = time.monotonic() + timeout_s
        last, changed = -1, time.monotonic()
        while True:
            c = self.count()
            now = time.monotonic()
            if c >= n:
                return c
            if c != last:
                last, changed = c, now
            if now > deadline or now - changed > STALL_S:
                return c
            time.sleep(0.25)


def lateness(due: np.ndarray, started: np.ndarray) -> dict[str, Any]:
    """Start lateness (started - due, ms): n, p50, p99, max, how many early, the span from
    the first due time to the last start (s), and in how many of the seconds the calls
    were due over (counted from the first due time) some call started > 100 ms late."""
    if len(due) == 0:
        return {"n": 0}
    late = started - due
    second = ((due - due.min()) // 1000).astype(np.int64)
    return {
        "n": int(len(late)),
        "p50": float(np.percentile(late, 50)),
        "p99": float(np.percentile(late, 99)),
        "max": float(late.max()),
        "early": int((late < 0).sum()),
        "first_due_to_last_start_s": float((started.max() - due.min()) / 1000),
        "seconds": int(second.max()) + 1,
        "late_seconds": int(len(np.unique(second[late > 100]))),
    }


def memory_of(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of one process (PSS 0 when smaps cannot be read)."""
    p = psutil.Process(pid)
    try:
        full = p.memory_full_info()
        return full.rss, getattr(full, "pss", 0)
    except psutil.AccessDenied:
        return p.memory_info().rss, 0


# --- raydelay --------------------------------------------------------------------------------


noop_remote = ray.remote(task_funcs.noop)  # the plain Ray loop's task: the same no-op
record_remote = ray.remote(task_funcs.record)  # ... and the lateness floor's

# Process roles of ``bench.common.ray_processes`` -> the groups CPU time is reported in.
CPU_GROUPS = {
    "TaskRunner": "runner",
    "SubscriptionHost": "subscription",
    "HostActor": "hosts",
    "CoordinatorActor": "coordinator",
    "ray raylet": "raylet",
    "ray gcs": "GCS",
    "driver (producer + consumer)": "driver",
}
CPU_OTHER = "task workers, agents"  # Ray workers running the tasks (ray::IDLE, ...), agents


class CpuMeter:
    """CPU seconds per group (``CPU_GROUPS``) of this driver's Ray processes between
    :meth:`start` and :meth:`stop`; processes started meanwhile count from zero."""

    def start(self) -> None:
        self._before = self._per_pid()

    def stop(self) -> dict[str, float]:
        after = self._per_pid()
        out: dict[str, float] = {}
        for pid, (group, cpu) in after.items():
            delta = cpu - self._before.get(pid, (group, 0.0))[1]
            out[group] = out.get(group, 0.0) + delta
        return out

    @staticmethod
    def _per_pid() -> dict[int, tuple[str, float]]:
        out = {}
        for pid, role in ray_processes().items():
            cpu = cpu_times({pid: role}).get(role)
            if cpu is not None:
                out[pid] = (CPU_GROUPS.get(role, CPU_OTHER), cpu)
        return out


def warm_workers() -> None:
    """200 plain no-op tasks: Ray's workers are up before a timed case (Ray stops idle
    workers after a while, and starting one takes most of a second here)."""
    ray.get([noop_remote.remote() for _ in range(200)])


class RaydelayPeer:
    """A local Ray, raydelay connected over a fresh local-dir store, and its runners."""

    def __init__(self, root: Path, lead_ms: int) -> None:
        self.root = root
        self.lead_ms = lead_ms
        self._n = 0
        start_local_ray()
        store = {"kind": "local", "local": {"root": str(root / "store")}}
        self.cluster = raydelay.connect({"storage": store})
        self.topic = self.cluster.config.tasks.topic
        self.default_cap = self.cluster.config.tasks.max_in_flight
        # the first call makes the tasks topic and starts the runners (tasks.runners)
        self._handles: list[Any] = []
        self._warm(self.cluster.config.tasks.runners)
        warm_workers()

    def close(self) -> None:
        self.cluster.shutdown()
        ray.shutdown()

    def _records(self, name: str) -> Records:
        self._n += 1
        return Records(self.root / f"out-{self._n}-{name}")

    def _warm(self, runners: int) -> None:
        """One call run and acknowledged, and the handles of the ``runners`` runners."""
        warm = self._records("warm")
        self.cluster.schedule(task_funcs.record, str(warm.path), now_ms(), deliver_after=0)
        self._handles = [placement.lookup(runner_name(i)) for i in range(runners)]
        if warm.wait(1, 120) < 1:
            raise RuntimeError("the runners ran no call in 120 s")
        self._until_acked(self._counts()[1], 60)

    def _counts(self) -> tuple[int, int]:
        """(submitted, succeeded) over the runners, since they started."""
        stats = ray.get([h.stats.remote() for h in self._handles])
        return sum(s["started"] for s in stats), sum(s["succeeded"] for s in stats)

    def _until_acked(self, succeeded: int, timeout_s: float, poll_s: float = 0.1) -> dict:
        """Poll the runners until ``succeeded`` calls succeeded (and were acknowledged).
        Returns the epoch ms at which all were first seen submitted and succeeded (None
        if not in ``timeout_s``, or nothing moved for ``STALL_S``)."""
        out: dict[str, Any] = {"all_submitted_ms": None, "all_acked_ms": None}
        deadline = time.monotonic() + timeout_s
        last, changed = -1, time.monotonic()
        while time.monotonic() < deadline:
            started, done = self._counts()
            now = now_ms()
            if out["all_submitted_ms"] is None and started >= succeeded:
                out["all_submitted_ms"] = now
            if done >= succeeded:
                out["all_acked_ms"] = now
                out["all_submitted_ms"] = out["all_submitted_ms"] or now
                return out
            if done != last:
                last, changed = done, time.monotonic()
            elif time.monotonic() - changed > STALL_S:
                break
            time.sleep(poll_s)
        return out

    def set_runners(self, count: int, cap: int) -> None:
        self.cluster.stop_runners()
        self.cluster.start_runners(count, cap)
        self._warm(count)

    # --- scenarios ----------------------------------------------------------------------------

    def window(self, n: int, window_s: int) -> dict:
        """Scenarios 1 and 2: ``n`` record calls due uniformly over ``window_s`` seconds,
        in one schedule_many."""
        rec = self._records("window")
        first = now_ms() + self.lead_ms + n // 20  # scheduled before it is due (100k: +5 s)
        due = first + (np.arange(n, dtype=np.int64) * window_s * 1000) // n
        return self._timed(rec, due, window_s)

    def steady(self, rate: int, seconds: int) -> dict:
        """Scenario 2: calls due at ``rate`` per second for ``seconds``."""
        n = rate * seconds
        rec = self._records("steady")
        first = now_ms() + self.lead_ms + n // 20
        due = first + (np.arange(n, dtype=np.int64) * 1000) // rate
        return self._timed(rec, due, seconds)

    def ray_floor(self, rate: int, seconds: int) -> dict:
        """Scenario 2's floor: the steady case's calls as plain Ray tasks, each submitted by
        the driver at its due time (a sleep until then): what Ray itself adds to lateness
        when the timer is exact and nothing else runs."""
        n = rate * seconds
        rec = self._records("floor")
        warm_workers()
        first = now_ms() + 2_000
        due = first + (np.arange(n, dtype=np.int64) * 1000) // rate
        refs = []
        for d in due:
            wait_s = int(d) / 1000 - time.time()
            if wait_s > 0:
                time.sleep(wait_s)
            refs.append(record_remote.remote(str(rec.path), int(d)))
        ray.get(refs)
        got = rec.wait(n, 30)
        d, s = rec.load()
        return {"n": n, "started": got, "lateness": lateness(d, s)}

    def burst(self, n: int) -> dict:
        """Scenario 4: ``n`` record calls due at one instant."""
        rec = self._records("burst")
        due = np.full(n, now_ms() + self.lead_ms + n // 20, dtype=np.int64)
        return self._timed(rec, due, 0)

    def _warm_runners(self, n: int = 200) -> None:
        """``n`` no-op calls through the runners, due at once, waited for: the Ray workers
        that run the runners' tasks are up before a timed case (they are not the driver's:
        ``warm_workers`` does not start them)."""
        base = self._counts()[1]
        self.cluster.schedule_many(task_funcs.noop, [()] * n, deliver_after=0)
        self._until_acked(base + n, 60)

    def _timed(self, rec: Records, due: np.ndarray, span_s: float) -> dict:
        n = len(due)
        warm_workers()
        self._warm_runners()
        args = [(str(rec.path), int(d)) for d in due]
        base = self._counts()[1]
        t0 = time.perf_counter()
        self.cluster.schedule_many(task_funcs.record, args, deliver_at=due)
        took = time.perf_counter() - t0
        overran_ms = max(0, now_ms() - int(due.min()))
        sleep_until(int(due.min()))
        acked = self._until_acked(base + n, span_s + 600, poll_s=0.05)
        got = rec.wait(n, 30)
        d, s = rec.load()
        out = {
            "n": n,
            "schedule_s": took,
            "schedule_rate": n / took,
            "overran_ms": overran_ms,
            "started": got,
            "lateness": lateness(d, s),
        }
        if acked["all_acked_ms"] is not None:
            out["due_to_all_acked_s"] = (acked["all_acked_ms"] - int(due.max())) / 1000
        return out

    def one_by_one(self, n: int, max_s: float) -> dict:
        """Scenario 1: ``schedule`` of no-op calls due in an hour, one at a time, for at
        most ``max_s``; they are cancelled after (``cancel_tasks``, timed too)."""
        took: list[float] = []
        ids = []
        stop = time.perf_counter() + max_s
        for _ in range(n):
            t0 = time.perf_counter()
            ids.append(self.cluster.schedule(task_funcs.noop, deliver_after=3600))
            took.append(time.perf_counter() - t0)
            if time.perf_counter() > stop:
                break
        t0 = time.perf_counter()
        cancelled = sum(self.cluster.cancel_tasks(ids))
        cancel_s = time.perf_counter() - t0
        ms = np.array(took) * 1000
        return {
            "n": len(took),
            "rate": len(took) / sum(took),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "cancelled": cancelled,
            "cancel_s": cancel_s,
        }

    def ray_loop(self, n: int) -> dict:
        """Scenario 3's baseline: the same no-op as a plain Ray task, ``n`` submitted in a
        loop from the driver, then ray.get of all."""
        meter = CpuMeter()
        meter.start()
        t0 = time.perf_counter()
        ray.get([noop_remote.remote() for _ in range(n)])
        took = time.perf_counter() - t0
        return {"n": n, "s": took, "rate": n / took, "cpu": meter.stop()}

    def noop_rate(self, n: int, runners: int, cap: int, profile: Path | None) -> dict:
        """Scenario 3: ``n`` no-op calls due at one instant, with ``runners`` runners of
        ``cap`` calls in flight each."""
        self.set_runners(runners, cap)
        base = self._counts()[1]
        due = now_ms() + max(self.lead_ms - 2_000, 2_000) + n // 20  # (no records to set up)
        t0 = time.perf_counter()
        self.cluster.schedule_many(task_funcs.noop, [()] * n, deliver_at=np.full(n, due))
        took = time.perf_counter() - t0
        sleep_until(due)
        meter = CpuMeter()
        meter.start()
        spy = None
        if profile is not None:
            from bench.burst_profile import spy as start_spy

            pid = ray.get(self._handles[0].pid.remote())
            spy = start_spy(pid, max(5, n // 800), 100, profile)
        acked = self._until_acked(base + n, 600, poll_s=0.01)
        cpu = meter.stop()
        if spy is not None:
            spy.wait()
        out: dict[str, Any] = {
            "n": n,
            "runners": runners,
            "cap": cap,
            "schedule_s": took,
            "cpu": cpu,
        }
        if acked["all_acked_ms"] is None:
            out["incomplete"] = True
            return out
        out["submitted_s"] = (acked["all_submitted_ms"] - due) / 1000
        out["acked_s"] = (acked["all_acked_ms"] - due) / 1000
        out["rate"] = n / out["acked_s"]
        return out

    # --- memory (on a fresh cluster) -------------------------------------------------------------

    def memory(self, checkpoints: tuple[int, ...]) -> dict:
        """Scenario 5: RSS / PSS of the raydelay actors idle, then with each checkpoint's
        count of no-op calls waiting (due in one to two hours)."""
        rng = np.random.default_rng(29)
        rows = [{"pending": 0, "roles": self._actor_memory()}]
        sent, took = 0, 0.0
        for target in checkpoints:
            while sent < target:
                k = min(MEMORY_CHUNK, target - sent)
                due = now_ms() + HOUR_MS + rng.integers(0, HOUR_MS, k)
                t0 = time.perf_counter()
                self.cluster.schedule_many(task_funcs.noop, [()] * k, deliver_at=due)
                took += time.perf_counter() - t0
                sent += k
            settled = self._settle(sent)
            rows.append({"pending": sent, "settled": settled, "roles": self._actor_memory()})
            progress(f"raydelay: {sent:,} waiting, {_mib(_total(rows[-1]['roles'])[0])} RSS")
        return {"rows": rows, "schedule_rate": sent / took if took else None}

    def _settle(self, pending: int, timeout_s: float = 300) -> bool:
        """Wait until the runners' subscription has indexed ``pending`` delayed calls and
        read nothing ahead, then 2 s more for the processes' memory to settle."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.cluster.stats(self.topic, RUNNERS_SUBSCRIPTION)
            if s["delayed"] >= pending and s["read_ahead"] == 0:
                time.sleep(2)
                return True
            time.sleep(1)
        return False

    def _actor_memory(self) -> dict[str, dict]:
        """Per actor class: how many, RSS and PSS (bytes), from ``cluster.placement()``."""
        roles: dict[str, dict] = {}
        for row in self.cluster.placement():
            if not row.get("pid"):
                continue
            rss, pss = memory_of(int(row["pid"]))
            r = roles.setdefault(row["class"], {"n": 0, "rss": 0, "pss": 0})
            r["n"] += 1
            r["rss"] += rss
            r["pss"] += pss
        return roles


# --- Celery ----------------------------------------------------------------------------------


class CeleryPeer:
    """Debian's redis-server and one Celery worker (``-P prefork -c <concurrency>``)."""

    def __init__(self, root: Path, concurrency: int, lead_ms: int) -> None:
        from bench.peer_redis import RedisServer, redis_binary, redis_version

        binary = redis_binary()
        self.redis_version = redis_version(binary)
        self.server = RedisServer(binary, str(root))
        self.url = f"redis://127.0.0.1:{self.server.port}/0"
        os.environ["RAYDELAY_BENCH_BROKER"] = self.url  # read by bench.celery_app on import
        from bench import celery_app

        self.tasks = celery_app
        self.root = root
        self.lead_ms = lead_ms
        self.concurrency = concurrency
        self.worker: subprocess.Popen | None = None
        self.publish_rate = 1_500.0  # tasks/s, a first guess until one is measured
        self._n = 0
        self.start_worker()

    def close(self) -> None:
        self.stop_worker()
        self.server.close()

    def _records(self, name: str) -> Records:
        self._n += 1
        return Records(self.root / f"out-{self._n}-{name}")

    def start_worker(self) -> None:
        cmd = [
            sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "-P", "prefork", "-c", str(self.concurrency), "-l", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        )
        with open(self.root / "worker.log", "ab") as log:
            self.worker = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        warm = self._records("warm")
        self.tasks.record.apply_async((str(warm.path), now_ms()))
        if warm.wait(1, 120) < 1:
            raise RuntimeError(
                f"the Celery worker ran no task in 120 s: see {self.root}/worker.log"
            )
        time.sleep(1)

    def stop_worker(self) -> None:
        """SIGKILL the worker and its pool processes (by pid), and empty the broker: what
        the worker held is gone with it."""
        if self.worker is None:
            return
        try:
            procs = [psutil.Process(self.worker.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        self.worker.wait()
        self.worker = None
        self.server.client().flushall()

    def _worker_memory(self) -> dict[str, dict]:
        assert self.worker is not None
        main = psutil.Process(self.worker.pid)
        out = {"worker main process": {"n": 1, "rss": 0, "pss": 0}}
        out["worker main process"]["rss"], out["worker main process"]["pss"] = memory_of(main.pid)
        pool = {"n": 0, "rss": 0, "pss": 0}
        for child in main.children(recursive=True):
            rss, pss = memory_of(child.pid)
            pool["n"] += 1
            pool["rss"] += rss
            pool["pss"] += pss
        out["pool processes"] = pool
        return out

    def _publish(self, task: Any, args: list[tuple], due: np.ndarray) -> float:
        """``apply_async(args, eta=...)`` one at a time; the seconds the loop took (the
        eta datetimes are made before)."""
        utc = datetime.UTC
        etas = [datetime.datetime.fromtimestamp(int(d) / 1000, tz=utc) for d in due]
        t0 = time.perf_counter()
        for a, eta in zip(args, etas):
            task.apply_async(a, eta=eta)
        took = time.perf_counter() - t0
        self.publish_rate = len(args) / took
        return took

    def _lead_ms(self, n: int) -> int:
        """How far ahead the first due time goes, for publishing ``n`` to end before it:
        the plan's lead plus 1.25x the time at the last measured rate."""
        return self.lead_ms + int(1.25 * 1000 * n / self.publish_rate)

    # --- scenarios ----------------------------------------------------------------------------

    def window(self, n: int, window_s: int) -> dict:
        rec = self._records("window")
        first = now_ms() + self._lead_ms(n)
        due = first + (np.arange(n, dtype=np.int64) * window_s * 1000) // n
        return self._timed(rec, due, window_s)

    def steady(self, rate: int, seconds: int) -> dict:
        n = rate * seconds
        rec = self._records("steady")
        first = now_ms() + self._lead_ms(n)
        due = first + (np.arange(n, dtype=np.int64) * 1000) // rate
        return self._timed(rec, due, seconds)

    def burst(self, n: int) -> dict:
        rec = self._records("burst")
        due = np.full(n, now_ms() + self._lead_ms(n), dtype=np.int64)
        return self._timed(rec, due, 0)

    def _timed(self, rec: Records, due: np.ndarray, span_s: float) -> dict:
        n = len(due)
        took = self._publish(self.tasks.record, [(str(rec.path), int(d)) for d in due], due)
        overran_ms = max(0, now_ms() - int(due.min()))
        sleep_until(int(due.min()))
        got = rec.wait(n, span_s + 600)
        d, s = rec.load()
        return {
            "n": n,
            "schedule_s": took,
            "schedule_rate": n / took,
            "overran_ms": overran_ms,
            "started": got,
            "lateness": lateness(d, s),
        }

    def memory(self, checkpoints: tuple[int, ...]) -> dict:
        """Scenario 5: worker memory idle, then with each checkpoint's count of no-op ETA
        tasks waiting (one to two hours ahead). The worker is killed after."""
        rng = np.random.default_rng(29)
        rows = [{"pending": 0, "roles": self._worker_memory()}]
        sent, took = 0, 0.0
        for target in checkpoints:
            k = target - sent
            due = now_ms() + HOUR_MS + rng.integers(0, HOUR_MS, k)
            took += self._publish(self.tasks.noop, [()] * k, due)
            sent = target
            settled = self._settle()
            rows.append({"pending": sent, "settled": settled, "roles": self._worker_memory()})
            progress(f"celery: {sent:,} waiting, {_mib(_total(rows[-1]['roles'])[0])} RSS")
        self.publish_rate = sent / took
        return {"rows": rows, "schedule_rate": sent / took}

    def _settle(self, timeout_s: float = 300) -> bool:
        """Wait until the worker took every message off the queue (it holds ETA tasks
        unacknowledged in its own memory) and its RSS held still for 2 s."""
        client = self.server.client()
        deadline = time.monotonic() + timeout_s
        assert self.worker is not None
        main = psutil.Process(self.worker.pid)
        last = -1
        while time.monotonic() < deadline:
            rss = main.memory_info().rss
            if client.llen("celery") == 0 and abs(rss - last) < MIB:
                return True
            last = rss
            time.sleep(2)
        return False


# --- the report ------------------------------------------------------------------------------


def _mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / MIB:,.0f} MiB"


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def _total(roles: dict[str, dict]) -> tuple[int, int]:
    return sum(r["rss"] for r in roles.values()), sum(r["pss"] for r in roles.values())


def _get(results: dict, *path: str) -> Any:
    node: Any = results
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def _late_cell(t: dict | None) -> str:
    if not t or not t.get("lateness", {}).get("n"):
        return "n/a"
    lt = t["lateness"]
    cell = f"{lt['p50']:,.1f} / {lt['p99']:,.1f} / {lt['max']:,.0f}"
    notes = []
    if t["started"] < t["n"]:
        notes.append(f"only {t['started']:,} of {t['n']:,} started")
    elif t["started"] > t["n"]:
        notes.append(f"{t['started'] - t['n']:,} extra starts")
    if lt["early"]:
        notes.append(f"{lt['early']:,} early")
    if t.get("overran_ms"):
        notes.append(f"scheduling ended {t['overran_ms'] / 1000:.1f} s after the first due time")
    return cell + (f" ({'; '.join(notes)})" if notes else "")


def report(results: dict) -> str:
    plan: Plan = results["plan"]
    rd, ce = results.get("raydelay", {}), results.get("celery", {})
    w = f"{plan.window // 1000}k"
    lines = [
        f"# Scheduled Ray calls (#29) beside Celery ETA tasks, {results['date']}",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Load average "
        f"(1 min) {results['load_start']:.1f} at the start, {results['load_end']:.1f} at the "
        f"end; {results['elapsed_s'] / 60:.1f} min in all (raydelay {rd.get('elapsed_s', 0):.0f}"
        f" s, Celery {ce.get('elapsed_s', 0):.0f} s).",
        "",
        "raydelay: a local Ray on 2 CPUs, a local-dir store (fsync per write), default `tasks` "
        "config (4 partitions, 1 runner, max_in_flight 1000) unless a row says otherwise. "
        f"Celery {results.get('celery_version', '?')} on redis-server "
        f"{results.get('redis_version', '?')} (AOF, appendfsync everysec), one worker "
        "`-P prefork -c 2`, defaults otherwise (acks before running, no result backend). "
        "The peers ran one after the other. Every start time is written by the task body "
        "itself (`bench/task_funcs.py:record`); lateness = start - due.",
        "",
        "## 1. Scheduling throughput",
        "",
        "| figure | raydelay | Celery | raydelay / Celery | bar (goal) |",
        "|---|---|---|---|---|",
    ]
    rw, cw = _get(rd, "window"), _get(ce, "window")
    lines.append(
        f"| {w} calls due over the next {plan.window_s} s: `schedule_many` (one numpy "
        f"deliver_at array) vs `apply_async(eta=...)` in a loop, tasks/s | "
        f"{_num(_get(rw, 'schedule_rate'))} | {_num(_get(cw, 'schedule_rate'))} | "
        f"{_ratio(_get(rw, 'schedule_rate'), _get(cw, 'schedule_rate'))} | >= 100,000 (300,000) |"
    )
    ob = _get(rd, "one_by_one")
    if ob:
        lines.append(
            f"| one call at a time: `schedule(deliver_after=3600)` ({ob['n']:,} calls; "
            f"{ob['p50_ms']:.1f} ms p50, {ob['p99_ms']:.1f} ms p99 each) vs the same "
            f"`apply_async` loop, tasks/s | {_num(ob['rate'])} | "
            f"{_num(_get(cw, 'schedule_rate'))} | {_ratio(ob['rate'], _get(cw, 'schedule_rate'))}"
            " | |"
        )
    rm, cm = _get(rd, "memory", "schedule_rate"), _get(ce, "memory", "schedule_rate")
    lines.append(
        f"| the memory scenario's calls, due 1-2 h ahead (raydelay: {plan.memory[-1]:,} in "
        f"`schedule_many` batches of {MEMORY_CHUNK:,}; Celery: {plan.celery_memory[-1]:,} "
        f"no-op `apply_async`), tasks/s | {_num(rm)} | {_num(cm)} | {_ratio(rm, cm)} | |"
    )
    if ob:
        lines += [
            "",
            f"The {ob['n']:,} calls scheduled one at a time were cancelled with one "
            f"`cancel_tasks` call: {ob['cancelled']:,} cancelled in {ob['cancel_s']:.2f} s.",
        ]
    lines += [
        "",
        "## 2. Start lateness (start - due), ms: p50 / p99 / max",
        "",
        "| case | raydelay | Celery | p99 raydelay / Celery | bar (goal) |",
        "|---|---|---|---|---|",
    ]
    rs, cs = _get(rd, "steady"), _get(ce, "steady")
    n_steady = plan.rate * plan.rate_s
    lines.append(
        f"| {plan.rate:,} tasks/s for {plan.rate_s} s ({n_steady:,} calls, all scheduled "
        f"before the first is due) | {_late_cell(rs)} | {_late_cell(cs)} | "
        f"{_ratio(_get(rs, 'lateness', 'p99'), _get(cs, 'lateness', 'p99'))} | p99 <= 50 (10) |"
    )
    lines.append(
        f"| the same {n_steady:,} as plain Ray tasks, each submitted by the driver at its due "
        f"time: the floor Ray sets (no peer) | {_late_cell(_get(rd, 'floor'))} | | | |"
    )
    rl, cl, fl = _get(rd, "steady_low"), _get(ce, "steady_low"), _get(rd, "floor_low")
    n_low = plan.low_rate * plan.rate_s
    lines.append(
        f"| {plan.low_rate:,} tasks/s for {plan.rate_s} s ({n_low:,} calls) | {_late_cell(rl)} | "
        f"{_late_cell(cl)} | {_ratio(_get(rl, 'lateness', 'p99'), _get(cl, 'lateness', 'p99'))} "
        "| p99 <= 50 (20) |"
    )
    lines.append(
        f"| the same {n_low:,} as plain Ray tasks submitted at their due time | "
        f"{_late_cell(fl)} | | | |"
    )
    for label, r, f, bar in (
        (f"{plan.rate:,}", rs, _get(rd, "floor"), "<= 1.0x (0.5x)"),
        (f"{plan.low_rate:,}", rl, fl, ""),
    ):
        ratio = _ratio(_get(r, "lateness", "p99"), _get(f, "lateness", "p99"))
        lines.append(f"| p99 raydelay / plain Ray at {label} tasks/s | {ratio} | | | {bar} |")
    lines.append(
        f"| {w} due within {plan.window_s} s ({plan.window / plan.window_s:,.0f} tasks/s; "
        f"section 1's calls) | {_late_cell(rw)} | {_late_cell(cw)} | "
        f"{_ratio(_get(rw, 'lateness', 'p99'), _get(cw, 'lateness', 'p99'))} | |"
    )
    cases = (("the 1k/s case", rs, _get(rd, "floor"), cs), (f"the {w} case", rw, None, cw))
    for label, r, f, c in cases:
        cells = [
            f"{name} {lt['late_seconds']} of {lt['seconds']}"
            for name, lt in (
                ("raydelay", _get(r, "lateness")),
                ("plain Ray", _get(f, "lateness")),
                ("Celery", _get(c, "lateness")),
            )
            if lt and lt.get("n")
        ]
        if cells:
            lines.append(
                f"\nSeconds of {label} (by due time) in which some call started more than "
                f"100 ms late: {', '.join(cells)}."
            )
    for name, t in (("raydelay", rw), ("Celery", cw)):
        span = _get(t, "lateness", "first_due_to_last_start_s")
        if span:
            lines.append(
                f"\n{name}: the {w} calls due over {plan.window_s} s started over "
                f"{span:.1f} s (first due to last start): {t['n'] / span:,.0f} tasks/s."
            )
    lines += [
        "",
        f"## 3. No-op calls started per second, one node: {plan.noop:,} due at one instant",
        "",
        "From the due instant until the runners saw every call succeed (and acknowledged "
        f"it; polled every 10 ms). Plain Ray: `ray.get([noop.remote() for _ in range("
        f"{plan.noop:,})])` of the same no-op from the driver, in the same Ray, before and "
        "after the four configurations; the ratio uses their mean.",
        "",
        "| runners | max_in_flight | due -> all submitted (s) | due -> all acked (s) | "
        "raydelay tasks/s | plain Ray tasks/s | raydelay / Ray | bar (goal) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    loops = [x["rate"] for x in rd.get("ray_loop", [])]
    ray_rate = float(np.mean(loops)) if loops else None
    for row in rd.get("noop_rate", []):
        if row.get("incomplete"):
            lines.append(f"| {row['runners']} | {row['cap']:,} | incomplete | | | | | |")
            continue
        lines.append(
            f"| {row['runners']} | {row['cap']:,} | {row['submitted_s']:.2f} | "
            f"{row['acked_s']:.2f} | {_num(row['rate'])} | {_num(ray_rate)} | "
            f"{_ratio(row['rate'], ray_rate)} | >= 0.50x (0.80x) |"
        )
    if loops:
        lines.append(
            "\nPlain Ray loop: "
            + ", ".join(f"{x:,.0f}" for x in loops)
            + " tasks/s (before, after)."
        )
    lines += cpu_table(rd)
    rb, cb = _get(rd, "burst"), _get(ce, "burst")
    n_b = f"{plan.burst // 1000}k"
    lines += [
        "",
        f"## 4. A burst of {n_b} due at one instant",
        "",
        "| figure | raydelay | Celery | raydelay / Celery |",
        "|---|---|---|---|",
    ]

    def last_start(t: dict | None) -> float | None:
        lt = _get(t, "lateness")
        return lt["max"] / 1000 if lt and lt.get("n") else None

    rl, cl = last_start(rb), last_start(cb)
    lines.append(
        f"| due -> last call started (s) | {_num(rl, ',.1f')} | {_num(cl, ',.1f')} | "
        f"{_ratio(rl, cl)} |"
    )
    r_rate = rb["started"] / rl if rb and rl else None
    c_rate = cb["started"] / cl if cb and cl else None
    lines.append(
        f"| started per second (started / that) | {_num(r_rate)} | {_num(c_rate)} | "
        f"{_ratio(r_rate, c_rate)} |"
    )
    p50r, p50c = _get(rb, "lateness", "p50"), _get(cb, "lateness", "p50")
    lines.append(
        f"| start lateness p50 (s) | {_num(p50r and p50r / 1000, ',.1f')} | "
        f"{_num(p50c and p50c / 1000, ',.1f')} | {_ratio(p50r, p50c)} |"
    )
    lines.append(
        f"| due -> all acknowledged (s) | {_num(_get(rb, 'due_to_all_acked_s'), ',.1f')} | "
        "(acked when the worker takes a task, before it runs) | |"
    )
    lines.append(
        f"| calls started (of {plan.burst:,}) | {_num(_get(rb, 'started'))} | "
        f"{_num(_get(cb, 'started'))} | |"
    )
    lines.append(
        f"| scheduling them, tasks/s | {_num(_get(rb, 'schedule_rate'))} | "
        f"{_num(_get(cb, 'schedule_rate'))} | "
        f"{_ratio(_get(rb, 'schedule_rate'), _get(cb, 'schedule_rate'))} |"
    )
    lines += memory_section(plan, rd, ce)
    if results.get("profile"):
        lines += ["", "## Where a runner's time goes (py-spy)", "", *results["profile"]]
    lines += ["", "## What the figures measure, and what they do not", "", *NOTES]
    return "\n".join(lines) + "\n"


def cpu_table(rd: dict) -> list[str]:
    """CPU ms per call, per process group, in each burst of section 3 and the Ray loops."""
    runs = [(f"{r['runners']} x {r['cap']:,}", r) for r in rd.get("noop_rate", []) if "cpu" in r]
    runs += [(f"plain Ray loop {i + 1}", r) for i, r in enumerate(rd.get("ray_loop", []))]
    if not runs:
        return []
    groups = [*dict.fromkeys([*CPU_GROUPS.values(), CPU_OTHER])]
    lines = [
        "",
        "CPU ms per call in those runs, per process (from the due instant, or the loop's "
        "start, until all were acknowledged / returned; the driver polls the runners every "
        "10 ms):",
        "",
        "| run | " + " | ".join(groups) + " | all | wall ms per call |",
        "|---|" + "---|" * (len(groups) + 2),
    ]
    for label, r in runs:
        n = r["n"]
        wall = r.get("acked_s", r.get("s"))
        cells = [f"{r['cpu'].get(g, 0.0) * 1000 / n:.3f}" for g in groups]
        total = sum(r["cpu"].values()) * 1000 / n
        wall_cell = f"{wall * 1000 / n:.3f}" if wall else "n/a"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {total:.3f} | {wall_cell} |")
    return lines


def memory_section(plan: Plan, rd: dict, ce: dict) -> list[str]:
    lines = ["", "## 5. Memory while tasks wait", ""]
    r_rows = _get(rd, "memory", "rows") or []
    c_rows = _get(ce, "memory", "rows") or []
    if r_rows:
        lines += [
            "raydelay, on a fresh cluster (its own Ray and store), calls due 1-2 h ahead; "
            "RSS / PSS per actor class (`cluster.placement()` pids):",
            "",
            "| actor class | n | " + " | ".join(f"{r['pending']:,} waiting" for r in r_rows) + " |",
            "|---|---|" + "---|" * len(r_rows),
        ]
        classes = sorted({c for r in r_rows for c in r["roles"]})
        for c in [*classes, "all"]:
            cells = []
            for r in r_rows:
                role = r["roles"].get(c) if c != "all" else None
                rss, pss = (role["rss"], role["pss"]) if role else _total(r["roles"])
                cells.append(f"{_mib(rss)} / {_mib(pss)}")
            n = r_rows[-1]["roles"].get(c, {}).get("n", "") if c != "all" else ""
            lines.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
        if any(not r.get("settled", True) for r in r_rows):
            lines.append("\n(not settled: the subscription had not indexed every call in 300 s)")
    if c_rows:
        lines += [
            "",
            "Celery, on a fresh worker, no-op ETA tasks 1-2 h ahead; RSS / PSS:",
            "",
            "| process | n | " + " | ".join(f"{r['pending']:,} waiting" for r in c_rows) + " |",
            "|---|---|" + "---|" * len(c_rows),
        ]
        for c in ["worker main process", "pool processes", "all"]:
            cells = []
            for r in c_rows:
                role = r["roles"].get(c) if c != "all" else None
                rss, pss = (role["rss"], role["pss"]) if role else _total(r["roles"])
                cells.append(f"{_mib(rss)} / {_mib(pss)}")
            n = c_rows[-1]["roles"].get(c, {}).get("n", "") if c != "all" else ""
            lines.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
    if not (r_rows and c_rows):
        return lines
    # growth per waiting task, and both at raydelay's largest count
    r0, r1 = _total(r_rows[0]["roles"])[0], _total(r_rows[-1]["roles"])[0]
    c0, c1 = _total(c_rows[0]["roles"])[0], _total(c_rows[-1]["roles"])[0]
    r_n, c_n = r_rows[-1]["pending"], c_rows[-1]["pending"]
    r_per, c_per = (r1 - r0) / r_n, (c1 - c0) / c_n
    at = r_n
    c_at = c0 + c_per * at
    measured = c_n == at
    lines += [
        "",
        "| figure | raydelay | Celery | raydelay / Celery | bar (goal) |",
        "|---|---|---|---|---|",
        f"| RSS growth per waiting task (bytes; raydelay over {r_n:,}, Celery over {c_n:,}) | "
        f"{r_per:,.0f} | {c_per:,.0f} | {_ratio(r_per, c_per) if c_per > 0 else 'n/a'} | flat |",
        f"| RSS with {at:,} waiting: all raydelay actors vs the Celery worker "
        f"({'measured' if measured else f'extrapolated linearly from {c_n:,}'}) | "
        f"{_mib(r1)} | {_mib(c_at)} | {_ratio(r1, c_at)} | (< 0.1x) |",
        f"| RSS growth from idle to {at:,} waiting | {_mib(r1 - r0)} | {_mib(c_at - c0)} | "
        f"{_ratio(r1 - r0, c_at - c0)} | |",
    ]
    return lines


NOTES = [
    "- Scheduling throughput is the caller's wall time for the scheduling call(s) only; the "
    "argument lists (and Celery's eta datetimes) are built before the clock starts. "
    "raydelay's calls are durable (fsynced to the local-dir store) when `schedule_many` "
    "returns; Celery's `apply_async` returns once Redis has the message, which its AOF "
    "fsyncs once a second. The Celery worker runs while the loop publishes (it takes ETA "
    "tasks off the queue as they come), as raydelay's runner and subscription do.",
    "- Lateness is measured by the task body (a `time.time()` at its first line) against "
    "the due time it was given. It includes the runner's receive, Ray's task submission and "
    "a Ray worker starting the task (raydelay), or the worker's ETA timer and the pool "
    "(Celery). It does not include the task's own run or its acknowledgement.",
    "- A p99 over 30 s is set by any stall of a few hundred ms, and plain Ray has such "
    "stalls here too (the floor row; Ray starting or handing over workers takes most of a "
    "second on this machine): p50 and the count of late seconds tell a steady cost from "
    "stalls. At 1k tasks/s raydelay's runner and its Ray tasks use most of the two cores "
    "(section 3's CPU table), so its lateness there is queueing as much as stalls.",
    "- Section 3 times from the due instant to the runners' count of succeeded (acknowledged) "
    "calls, polled every 10 ms; the plain Ray loop times submission plus `ray.get`. Ray's "
    "own rate on this 2-core machine is the ceiling: runners, subscription actors, hosts, "
    "Ray's raylet and the workers running the tasks share the two cores.",
    "- Section 4's 'last call started' for Celery is also when it finished (the body is one "
    "write); Celery acknowledges a task when the worker receives it (acks_late off), so it "
    "has no later acknowledgement to wait for.",
    "- Memory: RSS counts shared pages (Ray's and Python's libraries) in each process; PSS "
    "shares them out. raydelay's row 'all' is every raydelay actor (coordinator, partition "
    "hosts, subscription actors, runners), not Ray's own processes (raylet, GCS) nor the "
    "idle Ray workers that run tasks; Celery's is the worker and its pool processes, not "
    "redis-server. Celery holds ETA tasks in the worker's main process; raydelay keeps "
    "waiting calls in the store and indexes them in the subscription actors.",
    "- Not measured: tasks that take time to run, retries and dead letters, cron schedules, "
    "more than one node, the S3 store, Celery with another broker or pool.",
]


# --- the run ---------------------------------------------------------------------------------


def run_raydelay(plan: Plan, tmp: str | None, profile: bool) -> tuple[dict, list[str]]:
    out: dict[str, Any] = {}
    prof_lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-tasks-raydelay-", dir=tmp) as root:
        peer = RaydelayPeer(Path(root) / "main", plan.lead_ms)
        try:
            progress(f"raydelay: {plan.window:,} calls due over {plan.window_s} s")
            out["window"] = peer.window(plan.window, plan.window_s)
            progress(f"raydelay: schedule() one at a time, up to {plan.one_by_one:,}")
            out["one_by_one"] = peer.one_by_one(plan.one_by_one, plan.one_by_one_s)
            progress(f"raydelay: {plan.rate:,} tasks/s for {plan.rate_s} s")
            out["steady"] = peer.steady(plan.rate, plan.rate_s)
            progress(f"plain Ray: {plan.rate:,} tasks/s for {plan.rate_s} s, submitted when due")
            out["floor"] = peer.ray_floor(plan.rate, plan.rate_s)
            progress(f"raydelay: {plan.low_rate:,} tasks/s for {plan.rate_s} s")
            out["steady_low"] = peer.steady(plan.low_rate, plan.rate_s)
            progress(f"plain Ray: {plan.low_rate:,} tasks/s for {plan.rate_s} s, when due")
            out["floor_low"] = peer.ray_floor(plan.low_rate, plan.rate_s)
            out["ray_loop"] = [peer.ray_loop(plan.noop)]
            out["noop_rate"] = []
            for i, (runners, cap) in enumerate(plan.configs):
                progress(f"raydelay: {plan.noop:,} no-ops at once, {runners} runner(s) x {cap}")
                spy = Path(root) / "runner.spy" if profile and i == 0 else None
                out["noop_rate"].append(peer.noop_rate(plan.noop, runners, cap, spy))
                if spy is not None and spy.exists():
                    from bench.burst_profile import summarize

                    label = f"the runner, {plan.noop:,} no-ops due at once, 1 runner x {cap}"
                    prof_lines = summarize(spy, label, top=15)
            out["ray_loop"].append(peer.ray_loop(plan.noop))
            peer.set_runners(peer.cluster.config.tasks.runners, peer.default_cap)
            progress(f"raydelay: a burst of {plan.burst:,} due at once")
            out["burst"] = peer.burst(plan.burst)
        finally:
            peer.close()
        progress(f"raydelay: memory, {plan.memory[-1]:,} calls waiting (a fresh cluster)")
        peer = RaydelayPeer(Path(root) / "memory", plan.lead_ms)
        try:
            out["memory"] = peer.memory(plan.memory)
        finally:
            peer.close()
    return out, prof_lines


def run_celery(plan: Plan, tmp: str | None) -> dict:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tasks-celery-", dir=tmp) as root:
        peer = CeleryPeer(Path(root), concurrency=2, lead_ms=plan.lead_ms)
        try:
            out["celery_version"], out["redis_version"] = _celery_version(), peer.redis_version
            progress(f"celery: memory, {plan.celery_memory[-1]:,} ETA tasks waiting")
            out["memory"] = peer.memory(plan.celery_memory)
            peer.stop_worker()  # (it holds them; a fresh worker for the rest)
            peer.start_worker()
            progress(f"celery: {plan.window:,} tasks due over {plan.window_s} s")
            out["window"] = peer.window(plan.window, plan.window_s)
            progress(f"celery: {plan.rate:,} tasks/s for {plan.rate_s} s")
            out["steady"] = peer.steady(plan.rate, plan.rate_s)
            progress(f"celery: {plan.low_rate:,} tasks/s for {plan.rate_s} s")
            out["steady_low"] = peer.steady(plan.low_rate, plan.rate_s)
            progress(f"celery: a burst of {plan.burst:,} due at once")
            out["burst"] = peer.burst(plan.burst)
        finally:
            peer.close()
    return out


def _celery_version() -> str:
    import celery
    import kombu

    return f"{celery.__version__} (kombu {kombu.__version__})"


def machine() -> str:
    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)
        except OSError:
            return ""
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "raydelay"):
        commit += " with uncommitted changes under raydelay/"
    return (
        f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"Python {platform.python_version()}, Ray {ray.__version__}, commit {commit}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="every count and window / 10")
    ap.add_argument("--peers", nargs="+", choices=("raydelay", "celery"), default=None)
    ap.add_argument(
        "--celery-million",
        action="store_true",
        help="Celery's memory scenario up to 1M ETA tasks (about 10 more minutes here)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="py-spy the runner in scenario 3's first burst"
    )
    ap.add_argument("--tag", default="", help="appended to the report's name")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--tmp", default=None, help="where stores and outputs go (default $TMPDIR)")
    args = ap.parse_args()
    os.chdir(REPO)  # the runners' Ray workers import bench.task_funcs from the driver's cwd
    plan = Plan().smaller(10) if args.quick else Plan()
    if args.celery_million:
        plan = replace(plan, celery_memory=(*plan.celery_memory, plan.memory[-1]))
    peers = args.peers or ["raydelay", "celery"]
    date = datetime.date.today().isoformat()
    results: dict[str, Any] = {
        "plan": plan,
        "date": date,
        "command": "python bench/tasks_bench.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "load_start": os.getloadavg()[0],
    }
    t0 = time.monotonic()
    if "raydelay" in peers:
        progress("--- raydelay ---")
        t = time.monotonic()
        results["raydelay"], results["profile"] = run_raydelay(plan, args.tmp, args.profile)
        results["raydelay"]["elapsed_s"] = time.monotonic() - t
    if "celery" in peers:
        progress("--- celery ---")
        t = time.monotonic()
        results["celery"] = run_celery(plan, args.tmp)
        results["celery"]["elapsed_s"] = time.monotonic() - t
        results["celery_version"] = results["celery"]["celery_version"]
        results["redis_version"] = results["celery"]["redis_version"]
    results["elapsed_s"] = time.monotonic() - t0
    results["load_end"] = os.getloadavg()[0]
    text = report(results)
    print(text)
    name = f"{date}-tasks" + ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    path = Path(args.out) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    progress(f"wrote {path} in {results['elapsed_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
