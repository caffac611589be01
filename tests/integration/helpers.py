"""Helpers for tests that run against the session's Ray cluster."""

from __future__ import annotations

import time

import ray

from raydelay import Consumer, Message
from raydelay.clock import now_ms


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


def quiet(consumer: Consumer, seconds: float) -> list[Message]:
    """Everything received during ``seconds`` (expected to be nothing, usually)."""
    out: list[Message] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out.extend(consumer.receive(max_messages=1_000, timeout_s=0.2))
    return out


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
