"""Helpers for tests that run against the session's Ray cluster."""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection, Sequence

import ray

from raydelay import Consumer, Message, MessageId, Producer
from raydelay.actors.handles import (  # noqa: F401 - re-exported for the tests
    HostPartition,
    host_of,
    subscription_partition,
    topic_partition,
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
    got: list[tuple[Message, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        msgs = consumer.receive(max_messages=max_messages, timeout_s=0.5)
        t = now_ms()
        got.extend((m, t) for m in msgs)
        if msgs and ack:
            consumer.ack(msgs)
    return got


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
    ids = producer.send_many([b"marker"] * len(keys), deliver_at=ats, keys=keys)
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


def wait_until(what: str, cond, timeout_s: float = 30.0):
    """Poll ``cond()`` every 0.2 s until it returns something truthy (returned), or fail
    the test after ``timeout_s`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
