"""Helpers for tests that run against the session's Ray cluster."""

from __future__ import annotations

import itertools
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Sequence

import ray

from raydelay import Consumer, Message, MessageId, Producer
from raydelay.actors.handles import (  # noqa: F401 - re-exported for the tests
    HostPartition,
    host_of,
    subscription_partition,
    topic_partition,
    unit_host_of,
)
from raydelay.clock import now_ms
from raydelay.dispatch.keys import key_hash


def receive_all(
    consumer: Consumer,
    count: int,
    *,
    timeout_s: float = 20.0,
    ack: bool = True,
    max_messages: int = 1_000,
) -> list[tuple[Message, int]]:
    """Receive until ``count`` messages arrived (or ``timeout_s`` passed); each with the time
    (epoch ms) it was received. Acks each batch unless ``ack`` is False."""
    return _receive(consumer, lambda got: len(got) >= count, timeout_s, ack, max_messages)


# What receive_until waits for: a number of messages, every one of a set of ids, or a
# condition on the messages received so far (in arrival order).
Until = int | Collection[MessageId] | Callable[[list[Message]], bool]


def receive_until(
    consumer: Consumer,
    until: Until,
    *,
    what: str = "",
    timeout_s: float = 60.0,
    ack: bool = True,
    max_messages: int = 2_000,
) -> list[tuple[Message, int]]:
    """Receive (and ack, unless ``ack`` is False) until ``until`` holds; each message with
    the time (epoch ms) it was received, in arrival order. Fails after ``timeout_s``
    naming ``what`` it waited for and what it got instead."""
    done = _until(until)
    got = _receive(consumer, lambda got: done([m for m, _ in got]), timeout_s, ack, max_messages)
    messages = [m for m, _ in got]
    if not done(messages):
        missing = ""
        if isinstance(until, Collection):
            left = set(until) - {m.message_id for m in messages}
            missing = f", {len(left)} of the {len(until)} expected not (e.g. {min(left)})"
        raise AssertionError(
            f"timed out after {timeout_s} s waiting for {what or _describe(until)}: "
            f"received {len(messages)} messages{missing}"
        )
    return got


def join_subscription(
    cluster, topic: str, subscription: str, *, timeout_s: float = 60.0, meanwhile=None
) -> dict:
    """Wait until the subscription has nothing left: every entry up to the tail acknowledged
    (delayed ones included), none held by a consumer, read ahead or waiting for
    redelivery, as dramatiq's ``StubBroker.join`` waits for a queue. ``meanwhile()``, if
    given, runs before each look (a consumer taking what still comes). Returns its stats;
    fails after ``timeout_s`` with the numbers that were not 0."""
    last: dict = {}

    def idle() -> dict | None:
        if meanwhile is not None:
            meanwhile()
        last.clear()
        last.update(cluster.stats(topic, subscription))
        return last if not any(last[k] for k in _BUSY) else None

    return wait_until(
        f"{topic}/{subscription} to have nothing left",
        idle,
        timeout_s,
        got=lambda: {k: last.get(k) for k in _BUSY},
    )


# A subscription's numbers that are all 0 once it has nothing left to hand out or to have
# acknowledged.
_BUSY = ("backlog", "pending_ack", "read_ahead", "redelivery")


def wait_cursor_recorded(cluster, topic: str, subscription: str, *, timeout_s: float = 30.0):
    """Wait until every partition's mark-delete the coordinator has recorded for the
    subscription is the one its actor holds: its cursor is written and reported (what a
    restarted actor starts from), so acknowledgements made so far survive a kill."""
    coordinator = ray.get_actor("coordinator", namespace="raydelay")
    seen: dict = {}

    def recorded() -> bool:
        seen["held"] = cluster.stats(topic, subscription)["mark_delete"]
        refs = [
            coordinator.mark_delete.remote(topic, p, subscription) for p in range(len(seen["held"]))
        ]
        seen["recorded"] = [list(x) for x in ray.get(refs)]
        return seen["recorded"] == [list(x) for x in seen["held"]]

    wait_until(
        f"the cursor of {topic}/{subscription} recorded", recorded, timeout_s, got=lambda: seen
    )


def receive_and_join(
    cluster, consumer: Consumer, until: Until, *, what: str = "", timeout_s: float = 60.0
) -> list[tuple[Message, int]]:
    """What a subscription delivers when it is expected to deliver ``until``: receive and
    ack until ``until`` holds, then join the subscription (:func:`join_subscription`)
    while taking, without waiting, whatever else it hands out, and once more after.
    Returns all of it, in arrival order, anything past ``until`` included, for the test's
    assertions to judge (a duplicate, a cancelled message)."""
    got = receive_until(consumer, until, what=what, timeout_s=timeout_s)

    def take_more() -> None:
        more = consumer.receive(max_messages=10_000, timeout_s=0)
        t = now_ms()
        got.extend((m, t) for m in more)
        if more:
            consumer.ack(more)
        consumer.flush()

    join_subscription(
        cluster, consumer.topic, consumer.subscription, timeout_s=timeout_s, meanwhile=take_more
    )
    take_more()
    return got


def _receive(
    consumer: Consumer,
    enough: Callable[[list[tuple[Message, int]]], bool],
    timeout_s: float,
    ack: bool,
    max_messages: int,
) -> list[tuple[Message, int]]:
    got: list[tuple[Message, int]] = []
    deadline = time.monotonic() + timeout_s
    while not enough(got) and time.monotonic() < deadline:
        msgs = consumer.receive(max_messages=max_messages, timeout_s=0.5)
        t = now_ms()
        got.extend((m, t) for m in msgs)
        if msgs and ack:
            consumer.ack(msgs)
    return got


def _until(until: Until) -> Callable[[list[Message]], bool]:
    if isinstance(until, int):
        return lambda messages: len(messages) >= until
    if isinstance(until, Collection):
        wanted = set(until)
        return lambda messages: wanted <= {m.message_id for m in messages}
    return until


def _describe(until: Until) -> str:
    if isinstance(until, int):
        return f"{until} messages"
    if isinstance(until, Collection):
        return f"{len(until)} messages by id"
    return getattr(until, "__name__", "the condition")


def key_on(partition: int, partitions: int) -> str:
    """A message key that the producer routes to ``partition`` (of ``partitions``)."""
    for i in itertools.count():
        key = f"marker-{i}"
        if key_hash(key) % partitions == partition:
            return key
    raise AssertionError("unreachable")


def send_markers(
    producer: Producer, deliver_at_ms: Sequence[int | None] = (None,)
) -> dict[MessageId, int | None]:
    """Marker messages, sent now: one on every partition for each deliver_at (epoch ms;
    None: immediate). Returns their ids, each with its deliver_at.

    A marker is the positive event a test waits for instead of sleeping: a partition hands
    out what is due earliest first (and what is waiting for redelivery before that), and
    what it reads in log order, so a message that must not arrive would arrive on its
    partition no later than a marker sent after it and due after it."""
    n = producer.partitions
    keys = [key_on(p, n) for p in range(n)] * len(deliver_at_ms)
    ats = [at for at in deliver_at_ms for _ in range(n)]
    # (keys route each to its partition; "allow": markers of one partition share a key)
    ids = producer.send_many(
        [b"marker"] * len(keys), deliver_at=ats, keys=keys, on_duplicate="allow"
    )
    return dict(zip(ids, ats, strict=True))


def received_before(
    consumer: Consumer, markers: Collection[MessageId], *, timeout_s: float = 60.0
) -> list[Message]:
    """Receive (and ack) until every one of ``markers`` arrived; returns the other messages
    received meanwhile. Fails if the markers have not all arrived within ``timeout_s``."""
    waiting = set(markers)
    others: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while waiting:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(waiting)} of {len(markers)} markers not received")
        msgs = consumer.receive(max_messages=1_000, timeout_s=0.5)
        if msgs:
            consumer.ack(msgs)
        for m in msgs:
            if m.message_id in waiting:
                waiting.discard(m.message_id)
            else:
                others.append(m)
    return others


def restart(name: str):
    """Kill the named raydelay actor (Ray restarts it) and wait until its new process
    answers; returns its handle."""
    actor = ray.get_actor(name, namespace="raydelay")
    pid = ray.get(actor.pid.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            if ray.get(actor.pid.remote(), timeout=5) != pid:
                return actor
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def restart_partition(topic: str, partition: int) -> HostPartition:
    """Kill the host of the partition (and every other partition on it); Ray restarts it."""
    restart(host_of(topic, partition))
    return topic_partition(topic, partition)


def unit_assignments() -> dict[str, str]:
    """Every assigned subscription unit (``topic/subscription/group``) -> its host."""
    from raydelay.actors.coordinator import CoordinatorActor
    from raydelay.actors.handles import coordinator_handle

    return ray.get(coordinator_handle().submit(CoordinatorActor.unit_assignments))


def restart_subscription(topic: str, subscription: str, group: int = 0) -> str:
    """Kill the subscription host serving a unit of the subscription (and every other unit
    on it); Ray restarts it. Returns the host's name."""
    name = unit_host_of(topic, subscription, group)
    restart(name)
    return name


def run_child(script: str, cwd, *args: str, timeout_s: float = 400) -> dict:
    """Run ``script`` in a Python process of its own (with its own Ray: no RAY_ADDRESS) and
    return the JSON of its last ``RESULT <json>`` line; fails with its output if none."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYDELAY_ADDRESS")}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def wait_until(what: str, cond, timeout_s: float = 30.0, *, got=None):
    """Poll ``cond()`` every 0.2 s until it returns something truthy (returned), or fail
    the test after ``timeout_s`` naming ``what`` (and ``got()``, what there was instead)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            instead = f": {got()}" if got is not None else ""
            raise AssertionError(f"timed out waiting for {what}{instead}")
        time.sleep(0.2)


def http_status(url: str, timeout_s: float = 10.0) -> int | None:
    """The HTTP status of a GET of ``url`` (None: nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None
