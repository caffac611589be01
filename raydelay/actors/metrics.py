"""raydelay's metrics on Ray's Prometheus endpoint and dashboard (``ray.util.metrics``).

Ray prefixes every name with ``ray_``; Ray 2.60's Prometheus export adds ``_total`` to a
counter's name and exports a histogram as ``_bucket``, ``_sum`` and ``_count`` series.
Tags: ``topic`` and ``partition``, and ``subscription`` for a subscription's series (Ray
adds its own, ``WorkerId`` among them: sum over it). :data:`METRICS` is the registry of
every metric raydelay makes; this table says the same for readers.

| metric | kind | what |
|---|---|---|
| raydelay_published_messages | counter | messages appended to a partition |
| raydelay_dispatched_messages | counter | messages handed to consumers (redeliveries too) |
| raydelay_redeliveries | counter | redeliveries (nack, ack timeout, restart) |
| raydelay_dead_lettered | counter | messages moved to the dead-letter topic (since the actor started) |
| raydelay_dead_letters | gauge | messages the subscription moved to its dead-letter topic over its life (kept with its cursor) |
| raydelay_delayed_messages | gauge | messages not due yet, cancelled ones left out (``delayed`` of ``stats``) |
| raydelay_immutable_buckets | gauge | sealed buckets of the index |
| raydelay_loaded_indexes | gauge | index entries held in memory |
| raydelay_backlog | gauge | entries up to the log's tail the subscription has not acknowledged (delayed ones included, cancelled ones not) |
| raydelay_consumers | gauge | consumers connected to the subscription's partition |
| raydelay_bucket_snapshot_bytes | counter | bytes of sealed buckets the topic wrote |
| raydelay_bucket_ops | counter | bucket operations by ``op``: create and delete (the topic's, with an empty ``subscription`` tag), load (a subscription's segment loads) |
| raydelay_bucket_op_seconds | histogram | their latency, by ``op`` |
| raydelay_dispatch_lateness_ms | histogram | dispatch time minus deliver_at, first deliveries of delayed messages (0 for those handed out ahead of their due time, see ``subscription.handout_ahead_ms``) |
| raydelay_task_runs | counter | scheduled calls a runner finished, by ``outcome``: succeeded, failed (a try that will be retried), dead, timed_out (a try cancelled past its timeout_s), skipped (a cron occurrence passed over) |
| raydelay_tasks_in_flight | gauge | calls a runner has started and not seen finish |
| raydelay_task_start_lateness_ms | histogram | when a runner started a call minus when it was due (its deliver_at, or its cron occurrence) |
| raydelay_schedules_unarmed | gauge | recurring schedules with no next occurrence waiting in the tasks topic (runner 0 looks every 30 s): 0 is healthy |
| raydelay_lateness_stage_ms | histogram | the part of that lateness spent in each ``stage`` (written, reached, waited: the subscription's; returned: the consumer's, from its process), see :mod:`raydelay.dispatch.stages` |

The lateness histogram observes at most ``LATENESS_SAMPLES_PER_S`` dispatches a second per
subscription partition (a uniform sample beyond that; the stage histogram observes the
stages of the same sample, and a consumer its ``returned`` stage once per reply): one
observation costs about 1.4 us here, plus the work of Ray's metrics agent to aggregate it. At 20k a second, a burst spent
17% of the subscription actor's time and a core's fifth in the agent on it; a thousand
samples a second keep the percentiles and cost neither. They are recorded on a thread, off
the event loop, once a second. ``raydelay_dispatched_messages``
is exact.

The gauges are the counts of ``raydelay.dispatch.counts.subscription_stats``, as ``stats``
reports them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from ray.util import metrics

from raydelay.dispatch.stages import (
    CONSUMER_STAGE,
    LATENESS_EDGES_MS,
    SUBSCRIPTION_STAGES,
    Handed,
)

LATENESS_BOUNDARIES_MS = list(LATENESS_EDGES_MS)
OP_BOUNDARIES_S = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
LATENESS_SAMPLES_PER_S = 1_000
_PART = ("topic", "partition")
_SUB = ("topic", "partition", "subscription")
_RUNNER = ("runner",)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its kind, its description and its tag keys (``boundaries``: a
    histogram's bucket bounds)."""

    kind: Literal["counter", "gauge", "histogram"]
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


# Every metric raydelay registers, by name (without Ray's ``ray_`` prefix); a metric is
# made only from here, so dashboards/raydelay.json is checked against it.
METRICS: dict[str, MetricSpec] = {
    "raydelay_published_messages": MetricSpec("counter", "messages appended", _PART),
    "raydelay_dispatched_messages": MetricSpec("counter", "messages dispatched", _SUB),
    "raydelay_redeliveries": MetricSpec("counter", "redeliveries", _SUB),
    "raydelay_dead_lettered": MetricSpec("counter", "messages dead-lettered", _SUB),
    "raydelay_dead_letters": MetricSpec("gauge", "messages dead-lettered over its life", _SUB),
    "raydelay_delayed_messages": MetricSpec("gauge", "delayed messages", _SUB),
    "raydelay_immutable_buckets": MetricSpec("gauge", "sealed buckets", _SUB),
    "raydelay_loaded_indexes": MetricSpec("gauge", "index entries in memory", _SUB),
    "raydelay_backlog": MetricSpec("gauge", "entries not acknowledged yet", _SUB),
    "raydelay_consumers": MetricSpec("gauge", "consumers connected", _SUB),
    "raydelay_bucket_snapshot_bytes": MetricSpec("counter", "sealed bucket bytes written", _SUB),
    "raydelay_bucket_ops": MetricSpec("counter", "bucket operations", (*_SUB, "op")),
    "raydelay_bucket_op_seconds": MetricSpec(
        "histogram", "bucket operation latency (s)", (*_SUB, "op"), tuple(OP_BOUNDARIES_S)
    ),
    "raydelay_dispatch_lateness_ms": MetricSpec(
        "histogram",
        "dispatch lateness of delayed messages (ms)",
        _SUB,
        tuple(LATENESS_BOUNDARIES_MS),
    ),
    "raydelay_lateness_stage_ms": MetricSpec(
        "histogram",
        "the part of a delayed message's lateness spent in one stage (ms)",
        (*_SUB, "stage"),
        tuple(LATENESS_BOUNDARIES_MS),
    ),
    "raydelay_task_runs": MetricSpec(
        "counter", "scheduled calls finished, by outcome", (*_RUNNER, "outcome")
    ),
    "raydelay_tasks_in_flight": MetricSpec("gauge", "scheduled calls running", _RUNNER),
    "raydelay_task_start_lateness_ms": MetricSpec(
        "histogram",
        "start of a scheduled call minus its due time (ms)",
        _RUNNER,
        tuple(LATENESS_BOUNDARIES_MS),
    ),
    "raydelay_schedules_unarmed": MetricSpec(
        "gauge", "recurring schedules with no next occurrence armed", ()
    ),
}

_KINDS = {"counter": metrics.Counter, "gauge": metrics.Gauge, "histogram": metrics.Histogram}
_made: dict[str, Any] = {}


def _metric(name: str) -> Any:
    """One metric object per process and name (Ray rejects a second registration)."""
    m = _made.get(name)
    if m is None:
        spec = METRICS[name]
        kw = {"boundaries": list(spec.boundaries)} if spec.kind == "histogram" else {}
        m = _KINDS[spec.kind](name, description=spec.description, tag_keys=spec.tags, **kw)
        _made[name] = m
    return m


def _bucket_ops() -> tuple[Any, Any]:
    return _metric("raydelay_bucket_ops"), _metric("raydelay_bucket_op_seconds")


class TopicMetrics:
    def __init__(self, topic: str, partition: int) -> None:
        self._tags = {"topic": topic, "partition": str(partition)}
        self._published = _metric("raydelay_published_messages")
        self._sealed_bytes = _metric("raydelay_bucket_snapshot_bytes")
        self._ops, self._op_s = _bucket_ops()

    def published(self, n: int) -> None:
        if n:
            self._published.inc(n, self._tags)

    def bucket_op(self, op: str, seconds: float, nbytes: int = 0) -> None:
        """A bucket operation of the topic (``create``, ``merge``, ``delete``); may run on any
        thread."""
        tags = {**self._tags, "subscription": ""}
        self._ops.inc(1, {**tags, "op": op})
        self._op_s.observe(seconds, {**tags, "op": op})
        if nbytes:
            self._sealed_bytes.inc(nbytes, tags)


class SubscriptionMetrics:
    """Counters fed as things happen; gauges and bucket operations from ``report``."""

    def __init__(self, topic: str, partition: int, subscription: str) -> None:
        self._tags = {"topic": topic, "partition": str(partition), "subscription": subscription}
        self._dispatched = _metric("raydelay_dispatched_messages")
        self._redelivered = _metric("raydelay_redeliveries")
        self._dead = _metric("raydelay_dead_lettered")
        self._dead_total = _metric("raydelay_dead_letters")
        self._delayed = _metric("raydelay_delayed_messages")
        self._buckets = _metric("raydelay_immutable_buckets")
        self._loaded = _metric("raydelay_loaded_indexes")
        self._backlog = _metric("raydelay_backlog")
        self._consumers = _metric("raydelay_consumers")
        self._ops, self._op_s = _bucket_ops()
        self._lateness = _metric("raydelay_dispatch_lateness_ms")
        self._stage = _metric("raydelay_lateness_stage_ms")
        self._stage_tags = [{**self._tags, "stage": s} for s in SUBSCRIPTION_STAGES]
        self._late: list[np.ndarray] = []
        self._last: dict[str, int] = {}
        self._sample = Sampler(LATENESS_SAMPLES_PER_S)

    def dispatched(self, n: int, handed: Handed) -> None:
        """``n`` messages went out; ``handed``, the lateness and stages of the delayed first
        deliveries among them: the sample of them this second still has room for is kept
        until ``report`` observes it, off the delivery path."""
        if n:
            self._dispatched.inc(n, self._tags)
        pick = self._sample.pick(len(handed.lateness_ms), handed.weights)
        if pick is not None:
            self._late.append(np.vstack([handed.lateness_ms[pick], handed.stages_ms[:, pick]]))

    def report(self, stats: dict, op_times: list[tuple[str, float]]) -> None:
        tags = self._tags
        self._delayed.set(stats.get("delayed", 0), tags)
        self._buckets.set(stats.get("buckets", 0), tags)
        self._loaded.set(stats.get("loaded_indexes", stats.get("delayed", 0)), tags)
        self._backlog.set(stats.get("backlog", 0), tags)
        self._consumers.set(stats.get("consumers", 0), tags)
        self._dead_total.set(stats.get("dead_lettered", 0), tags)
        for key, metric in (
            ("redelivered", self._redelivered),
            ("dead_lettered_since_start", self._dead),  # (a counter of this process)
        ):
            now = int(stats.get(key, 0))
            delta = now - self._last.get(key, 0)
            if delta > 0:
                metric.inc(delta, tags)
            self._last[key] = now
        for op, seconds in op_times:
            op_tags = {**tags, "op": op}
            self._ops.inc(1, op_tags)
            self._op_s.observe(seconds, op_tags)
        self._observe_lateness()

    def _observe_lateness(self) -> None:
        if not self._late:
            return
        late, self._late = self._late, []  # (dispatched() appends on the event loop)
        values = np.concatenate(late, axis=1)
        for v in values[0].tolist():
            self._lateness.observe(v, self._tags)
        for row, tags in zip(values[1:], self._stage_tags, strict=True):
            for v in row.tolist():
                self._stage.observe(v, tags)


class RunnerMetrics:
    """A task runner's series: ``report`` once a second with its counts since it started
    (turned into counter increments), what runs now, and the start lateness of the calls
    it started since the last report (a sample of at most LATENESS_SAMPLES_PER_S)."""

    OUTCOMES = {
        "succeeded": "succeeded",
        "retried": "failed",
        "dead": "dead",
        "timed_out": "timed_out",
        "skipped": "skipped",
    }

    def __init__(self, runner: int) -> None:
        self._tags = {"runner": str(runner)}
        self._runs = _metric("raydelay_task_runs")
        self._in_flight = _metric("raydelay_tasks_in_flight")
        self._lateness = _metric("raydelay_task_start_lateness_ms")
        self._last: dict[str, int] = {}
        self._sample = Sampler(LATENESS_SAMPLES_PER_S)

    def report(self, counts: dict, running: int, lateness_ms: list[int]) -> None:
        for key, outcome in self.OUTCOMES.items():
            now = int(counts.get(key, 0))
            delta = now - self._last.get(key, 0)
            if delta > 0:
                self._runs.inc(delta, {**self._tags, "outcome": outcome})
            self._last[key] = now
        self._in_flight.set(running, self._tags)
        if lateness_ms:
            pick = self._sample.pick(len(lateness_ms))
            if pick is not None:
                for v in np.asarray(lateness_ms)[pick].tolist():
                    self._lateness.observe(max(v, 0), self._tags)

    @staticmethod
    def unarmed(count: int) -> None:
        _metric("raydelay_schedules_unarmed").set(count, {})


class Sampler:
    """At most ``per_s`` columns a second of what it is given (a uniform sample of each
    lot beyond the room left in the second)."""

    def __init__(self, per_s: int) -> None:
        self._per_s = per_s
        self._rng = np.random.default_rng()
        self._window_start = time.monotonic()
        self._observed = 0

    def room(self, n: int) -> int:
        """How many of ``n`` new values may be observed now (counted as observed)."""
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._window_start, self._observed = now, 0
        k = min(n, max(0, self._per_s - self._observed))
        self._observed += k
        return k

    def pick(self, n: int, weights: np.ndarray | None = None) -> np.ndarray | slice | None:
        """Which of ``n`` new values to observe: all of them, or a uniform sample when there
        is room for fewer (indexes), or None for none. With ``weights``, value ``i`` stands
        for ``weights[i]`` values, each of which counts: it may be picked that many times."""
        if weights is None:
            k = self.room(n)
            if k == 0:
                return None
            if k == n:
                return slice(None)
            return np.sort(self._rng.choice(n, size=k, replace=False))
        total = int(weights.sum())
        k = self.room(total)
        if k == 0:
            return None
        every = np.repeat(np.arange(n), weights)  # (only while this second has room)
        if k == total:
            return every
        return every[np.sort(self._rng.choice(total, size=k, replace=False))]


class ConsumerMetrics:
    """A consumer's ``returned`` stage (see :mod:`raydelay.dispatch.stages`), observed
    from its own process once per reply (every message of a reply has the same), at most
    ``LATENESS_SAMPLES_PER_S`` times a second: an observation per message cost a burst's
    consumer a tenth of its time."""

    def __init__(self, topic: str, subscription: str) -> None:
        self._tags = {
            "topic": topic,
            "partition": "",
            "subscription": subscription,
            "stage": CONSUMER_STAGE,
        }
        self._stage = _metric("raydelay_lateness_stage_ms")
        self._sample = Sampler(LATENESS_SAMPLES_PER_S)

    def returned(self, value_ms: int) -> None:
        """A reply's first deliveries came back ``value_ms`` after it was made."""
        if self._sample.room(1):
            self._stage.observe(value_ms, self._tags)
