"""What became of a scheduled call: the records runners (and cancels) leave in the store,
and how a status is read from them.

A call leaves a record only when there is something the topic cannot tell: a failed try
(its error and the attempts so far), its death, a result it was asked to keep
(``keep_result=True``), an occurrence a schedule passed over, or a cancel. A call that
simply succeeded leaves none: its subscription acknowledged it, and that says enough.

Records live under ``tasks/status/<task id>/<written ms>``, one object each, never
rewritten: the newest one of a task is its state. They expire ``tasks.result_ttl_s`` after
they were written (the key's time says when, so the sweep needs no reads).
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack

log = logging.getLogger(__name__)

STATUS_PREFIX = "tasks/status/"
RUNS_PREFIX = "tasks/runs/"  # <schedule>/<occurrence ms>: how each occurrence ended

SCHEDULED = "scheduled"  # waiting for its time, or for a runner
RUNNING = "running"  # a runner holds it (it runs, or is about to)
SUCCEEDED = "succeeded"
FAILED = "failed"  # a try failed; it runs again after its backoff
DEAD = "dead"  # out of retries (or not a call a runner may run): in the dead-letter topic
CANCELLED = "cancelled"
SKIPPED = "skipped"  # a cron occurrence its schedule passed over (paused, missed, deleted)
STATUSES = (SCHEDULED, RUNNING, SUCCEEDED, FAILED, DEAD, CANCELLED, SKIPPED)
FINAL = frozenset((SUCCEEDED, DEAD, CANCELLED, SKIPPED))

_TIME_DIGITS = 15  # written ms, zero-padded: the newest record sorts last


@dataclass
class TaskRecord:
    """One record of a call: its status then, the tries so far, the last error, and the
    result (pickled) when it was kept. ``result_error`` says why a result was not kept
    (over ``tasks.max_result_bytes``, or not picklable); the call succeeded all the same."""

    status: str
    attempts: int = 0
    error: str | None = None
    written_ms: int = 0
    result: bytes | None = None
    result_error: str | None = None
    next_try_ms: int | None = None  # FAILED: when it runs again

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {
                "status": self.status,
                "attempts": self.attempts,
                "error": self.error,
                "written": self.written_ms,
                "result": self.result,
                "result_error": self.result_error,
                "next": self.next_try_ms,
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskRecord:
        d = msgpack.unpackb(data, raw=False)
        return cls(
            status=d["status"],
            attempts=int(d["attempts"]),
            error=d["error"],
            written_ms=int(d["written"]),
            result=d["result"],
            result_error=d["result_error"],
            next_try_ms=d["next"],
        )


def task_prefix(task_id: str) -> str:
    """Where the records of ``task_id`` live (the id made safe for a key)."""
    return f"{STATUS_PREFIX}{urllib.parse.quote(task_id, safe='')}/"


def record_key(task_id: str, written_ms: int) -> str:
    return f"{task_prefix(task_id)}{int(written_ms):0{_TIME_DIGITS}d}"


def newest(keys: list[str]) -> str | None:
    """The key of the newest record among a task's ``keys`` (None: none)."""
    return max(keys) if keys else None


def expired(keys: list[str], now_ms: int, ttl_ms: int) -> list[str]:
    """The record keys written more than ``ttl_ms`` before ``now_ms`` (keys that are not
    records are left alone)."""
    out = []
    for key in keys:
        written = key.rpartition("/")[2]
        if written.isdigit() and int(written) + ttl_ms < now_ms:
            out.append(key)
    return out


def write_cancelled(store: Any, task_ids: list[str]) -> None:
    """The CANCELLED records of ``task_ids`` (calls a cancel kept from running). The cancel
    has happened whatever becomes of them: a record that cannot be written is logged, and
    that call's status reads "succeeded" (acknowledged, no record) until it expires."""
    now = int(time.time() * 1000)
    data = TaskRecord(CANCELLED, written_ms=now).to_bytes()

    def put(task_id: str) -> str | None:
        try:
            store.put(record_key(task_id, now), data)
            return None
        except Exception as exc:  # noqa: BLE001 - said below, once for all
            return f"{task_id}: {exc}"

    with ThreadPoolExecutor(min(8, len(task_ids))) as pool:
        failed = [f for f in pool.map(put, task_ids) if f is not None]
    if failed:
        log.warning(
            "%d cancelled calls have no record of it (task_status may say succeeded): %s",
            len(failed),
            "; ".join(failed[:3]),
        )


def run_key(schedule: str, occurrence_ms: int) -> str:
    """Where the outcome of a schedule's occurrence is kept (the occurrence's time last:
    the sweep reads it as the record's age)."""
    return f"{RUNS_PREFIX}{schedule}/{int(occurrence_ms):0{_TIME_DIGITS}d}"
