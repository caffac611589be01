"""Functions the task tests schedule: importable by the runners' Ray workers, each leaving
a line in a file so the test can see what ran, when, and with which idempotency key."""

from __future__ import annotations

import os
import time

import ray

from raydelay.tasks import current_task


def lines(path: str) -> list[list[str]]:
    """The lines the calls left in ``path``, split into their fields (none yet: [])."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines() if line]


def _line(path: str, *fields: object) -> None:
    with open(path, "a") as f:
        f.write(" ".join(str(x) for x in fields) + "\n")


def record(path: str, label: str) -> str:
    ctx = current_task()
    key = ctx.idempotency_key if ctx else "-"
    _line(path, label, key, int(time.time() * 1000), ctx.attempt if ctx else -1)
    return label


@ray.remote
def record_remote(path: str, label: str) -> str:
    return record(path, label)


def fail(path: str, message: str) -> None:
    _line(path, "try", int(time.time() * 1000), current_task().attempt)
    raise RuntimeError(message)


def slow(path: str, seconds: float) -> None:
    key = current_task().idempotency_key
    _line(path, "start", key, int(time.time() * 1000))
    time.sleep(seconds)
    _line(path, "end", key, int(time.time() * 1000))


def with_context(path: str, raydelay_task=None) -> None:
    _line(path, "ctx", raydelay_task.idempotency_key if raydelay_task else "none")


def noop() -> None:
    return None


@ray.remote
class Ledger:
    """A named actor a scheduled call can call."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    def get(self) -> list[str]:
        return self.items


def square(x: int) -> int:
    return x * x


def blob(n: int) -> bytes:
    return b"x" * n


def fail_then_return(path: str, fails: int) -> str:
    """Fails its first ``fails`` tries, then returns which try succeeded."""
    attempt = current_task().attempt
    _line(path, "try", int(time.time() * 1000), attempt)
    if attempt < fails:
        raise ValueError(f"try {attempt} fails")
    return f"succeeded on try {attempt}"


@ray.remote
class Sleeper:
    """An actor with an async method a timeout can stop."""

    async def nap(self, path: str, seconds: float) -> str:
        import asyncio

        _line(path, "start", int(time.time() * 1000))
        await asyncio.sleep(seconds)
        _line(path, "end", int(time.time() * 1000))
        return "rested"
