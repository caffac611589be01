"""Recurring schedules on a cluster: what ``Cluster.schedule_cron``, ``list_schedules``,
``pause_schedule``, ``resume_schedule``, ``delete_schedule``, ``trigger_schedule`` and
``backfill_schedule`` do (see :mod:`raydelay.tasks.cron` for the chain of occurrences).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from raydelay.client.armed import armed
from raydelay.client.message import time_ms_of
from raydelay.client.runner import arm_occurrence
from raydelay.errors import Conflict, InvalidArgument, NotFound
from raydelay.tasks import cron
from raydelay.tasks import status as st
from raydelay.tasks.context import TaskId
from raydelay.tasks.spec import (
    PROP_SCHEDULE,
    TaskSpec,
    decode_payload,
    flag,
    kwargs_of,
    pickle_args,
    task_payload,
)

if TYPE_CHECKING:
    from raydelay.client.tasks import Tasks

MAX_BACKFILL = 10_000  # occurrences one backfill_schedule runs
MAX_JITTER_S = 86_400.0
_NOW_SLACK_MS = 1_000  # a backfill's end up to this far ahead is taken as now


class Schedules:
    """The recurring schedules of one client's :class:`~raydelay.client.tasks.Tasks`."""

    def __init__(self, tasks: Tasks) -> None:
        self._tasks = tasks

    def create(
        self,
        expr: Any,
        spec: TaskSpec,
        args: tuple,
        kwargs: Any,
        *,
        name: Any,
        timezone: Any,
        catch_up: Any,
        replace: bool,
        start_at: Any = None,
        end_at: Any = None,
        jitter_s: Any = 0,
        overlap: Any = "allow_all",
    ) -> dict:
        """See :meth:`Cluster.schedule_cron`."""
        name = cron.check_name(name)
        expr = cron.check_cron(expr)
        tz = cron.check_timezone(timezone)
        policy = cron.check_catch_up(catch_up)
        start_ms = None if start_at is None else time_ms_of("start_at", start_at)
        end_ms = None if end_at is None else time_ms_of("end_at", end_at)
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise InvalidArgument(
                f"end_at: must not be before start_at ({start_ms}), got {end_ms}: no occurrence"
            )
        jitter_ms = _jitter_ms(jitter_s)
        overlap = cron.check_overlap(overlap)
        args_blob = pickle_args(args, kwargs_of(kwargs))
        replace = flag("replace", replace)
        generation = uuid.uuid4().hex[:12]
        spec.schedule, spec.generation = name, generation
        tasks = self._tasks
        tasks.ready()  # (the runners up first: the first occurrence is one after that)
        now = int(time.time() * 1000)
        record = cron.Schedule(
            name=name,
            expr=expr,
            timezone=tz,
            catch_up=policy,
            spec=tasks.signer().sign(task_payload(spec.encode(), args_blob)),
            target=spec.target,
            generation=generation,
            created_ms=now,
            start_ms=start_ms,
            end_ms=end_ms,
            jitter_ms=jitter_ms,
            overlap=overlap,
        )
        first = record.next_after(now)
        if first is None:
            raise InvalidArgument(
                f"end_at: {end_ms} leaves {expr!r} no occurrence after now; nothing would run"
            )
        store = tasks.store()
        key = cron.schedule_key(name)
        if replace:
            store.put(key, record.to_bytes())
        else:
            try:
                store.put_new(key, record.to_bytes())
            except Conflict:
                raise InvalidArgument(
                    f"name: a schedule called {name!r} exists; delete it first, or pass "
                    "replace=True"
                ) from None
        try:
            arm_occurrence(tasks.topics, tasks.topic, record, first, tasks.signer())
        except BaseException:
            store.delete(key)  # no record without its first occurrence
            raise
        return describe(record, now)

    def load(self, name: Any) -> cron.Schedule:
        name = cron.check_name(name)
        try:
            return cron.Schedule.from_bytes(self._tasks.store().get(cron.schedule_key(name)))
        except NotFound:
            raise NotFound(f"schedule: no schedule called {name!r}") from None

    def listed(self) -> list[dict]:
        store = self._tasks.store()
        now = int(time.time() * 1000)
        out = []
        for key in sorted(store.list(cron.SCHEDULE_PREFIX)):
            try:
                record = cron.Schedule.from_bytes(store.get(key))
            except NotFound:  # (deleted since the listing)
                continue
            out.append(describe(record, now))
        topic = self._tasks.topic
        if out and topic in self._tasks.topics.topics():
            found = armed(self._tasks.topics.peers, topic, [d["name"] for d in out])
            for d in out:  # (a schedule past its end_at has nothing to arm: not flagged)
                d["armed"] = found[d["name"]] or d["next_ms"] is None and not d["paused"]
        return out

    def last_runs(self, name: str, limit: int = 5) -> list[dict]:
        """How the schedule's latest occurrences ended, newest first: ``occurrence_ms``,
        ``status`` (succeeded, dead, skipped), ``task_id``, ``attempts``, ``error``,
        ``ended_ms`` (kept ``tasks.result_ttl_s``)."""
        store = self._tasks.store()
        out = []
        for key in sorted(store.list(f"{st.RUNS_PREFIX}{name}/"), reverse=True)[:limit]:
            try:
                doc = json.loads(store.get(key))
            except NotFound:  # (swept since the listing)
                continue
            out.append({"occurrence_ms": int(key.rpartition("/")[2]), **doc})
        return out

    def set_paused(self, name: Any, paused: bool) -> dict:
        record = self.load(name)
        record.paused = paused
        self._tasks.store().put(cron.schedule_key(record.name), record.to_bytes())
        return describe(record, int(time.time() * 1000))

    def delete(self, name: Any) -> None:
        record = self.load(name)
        store = self._tasks.store()
        store.delete(cron.schedule_key(record.name))
        # what its occurrences left: done and overlap markers, how each ended (a schedule
        # made again under the name starts with none of them)
        for prefix in (cron.DONE_PREFIX, cron.RUNNING_PREFIX, cron.BUFFERED_PREFIX, st.RUNS_PREFIX):
            for key in store.list(f"{prefix}{record.name}/"):
                store.delete(key)

    # --- occurrences by hand -----------------------------------------------------------------

    def trigger(self, name: Any) -> TaskId:
        """See :meth:`Cluster.trigger_schedule`."""
        record = self.load(name)
        now = int(time.time() * 1000)
        return self._manual(record, [now])[0]

    def backfill(self, name: Any, start: Any, end: Any) -> list[TaskId]:
        """See :meth:`Cluster.backfill_schedule`."""
        record = self.load(name)
        start_ms = time_ms_of("start", start)
        end_ms = time_ms_of("end", end)
        now = int(time.time() * 1000)
        if end_ms < start_ms:
            raise InvalidArgument(f"end: must not be before start ({start_ms}), got {end_ms}")
        if end_ms > now + _NOW_SLACK_MS:
            raise InvalidArgument(
                f"end: {end_ms} is in the future; a backfill runs occurrences that have passed "
                "(the schedule runs the ones to come)"
            )
        end_ms = min(end_ms, now)  # ("now" as the caller read it may be a moment ahead)
        # (the window is the caller's: it may reach before start_at or after end_at)
        grid = dataclasses.replace(record, start_ms=None, end_ms=None)
        occurrences = grid.occurrences(start_ms, end_ms, MAX_BACKFILL)
        if not occurrences:
            return []
        return self._manual(record, occurrences)

    def _manual(self, record: cron.Schedule, occurrences: list[int]) -> list[TaskId]:
        """Calls of ``record``'s call, one per occurrence, due now, outside its chain: each
        sees its occurrence's idempotency key (``name@occurrence``), arms nothing, and
        leaves no done marker."""
        tasks = self._tasks
        signer = tasks.signer()
        spec, args = decode_payload(signer.open(record.spec))
        payloads = []
        for t in occurrences:
            spec.occurrence_ms, spec.manual = int(t), True
            payloads.append(signer.sign(task_payload(spec.encode(), args)))
        props = {**spec.properties(), PROP_SCHEDULE: record.name}
        ids = tasks.ready().send_many(payloads, properties=props)
        return [TaskId(str(i)) for i in ids]


def describe(record: cron.Schedule, now_ms: int) -> dict:
    """A schedule as ``list_schedules`` shows it."""
    return {
        "name": record.name,
        "cron": record.expr,
        "timezone": record.timezone,
        "catch_up": record.catch_up,
        "target": record.target,
        "paused": record.paused,
        "next_ms": None if record.paused else record.next_after(now_ms),
        "created_ms": record.created_ms,
        "start_ms": record.start_ms,
        "end_ms": record.end_ms,
        "jitter_s": record.jitter_ms / 1000,
        "overlap": record.overlap,
    }


def _jitter_ms(jitter_s: Any) -> int:
    if isinstance(jitter_s, timedelta):
        jitter_s = jitter_s.total_seconds()
    if isinstance(jitter_s, bool) or not isinstance(jitter_s, (int, float)):
        raise InvalidArgument(
            f"jitter_s: expected seconds or a timedelta, got {type(jitter_s).__name__}"
        )
    if not math.isfinite(jitter_s) or not 0 <= jitter_s <= MAX_JITTER_S:
        raise InvalidArgument(f"jitter_s: expected 0 to {MAX_JITTER_S:g} seconds, got {jitter_s}")
    return int(jitter_s * 1000)
