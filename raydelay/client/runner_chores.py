"""What a task runner does beside running calls: the status records it writes (see
:mod:`raydelay.tasks.status`), and runner 0's two watches: the sweep of records past
``tasks.result_ttl_s``, and the look for schedules whose chain is lost (see
:mod:`raydelay.client.armed`)."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raydelay.actors.metrics import RunnerMetrics
from raydelay.client.armed import armed
from raydelay.client.peers import ClusterPeers
from raydelay.tasks import cron
from raydelay.tasks import status as st
from raydelay.tasks.context import kept_result
from raydelay.tasks.spec import TaskSpec

log = logging.getLogger(__name__)

SCHEDULE_LOOK_S = 30.0  # runner 0 looks for schedules that lost their chain this often


class TaskRecords:
    """The status records of one runner's calls."""

    def __init__(self, store: Any, index: int, ttl_ms: int, max_result: int) -> None:
        self._store = store
        self._index = index
        self.ttl_ms = ttl_ms
        self._max_result = max_result
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="task-records")

    def write(self, m: Any, record: st.TaskRecord) -> None:
        """Write ``record`` of ``m``'s call (raises when the store fails)."""
        record.written_ms = int(time.time() * 1000)
        self._store.put(st.record_key(str(m.message_id), record.written_ms), record.to_bytes())

    def write_many(self, records: list[tuple[Any, st.TaskRecord]]) -> list[bool]:
        """Write records side by side; whether each was."""
        return list(self._pool.map(lambda r: self._try(*r), records))

    def success(self, spec: TaskSpec, value: Any, attempts: int) -> st.TaskRecord:
        """The record of a call that succeeded, with its result when it is kept (``value``
        is what the call's task returned: ``kept_result``'s pair, or an actor method's
        value as it is, pickled here)."""
        record = st.TaskRecord(st.SUCCEEDED, attempts)
        if not spec.keep_result:
            return record
        if spec.kind == "actor":
            value = kept_result(value, self._max_result)
        record.result, record.result_error = value if value is not None else (None, None)
        return record

    def ran(self, spec: TaskSpec, m: Any, status: str, error: str | None = None) -> None:
        """How an occurrence of a schedule ended (what the console's last runs show):
        best effort, a store failure is logged."""
        if spec.schedule is None or spec.occurrence_ms is None or spec.manual:
            return
        doc = {
            "status": status,
            "task_id": str(m.message_id),
            "attempts": m.redelivery_count + 1,
            "error": error[-500:] if error else None,
            "ended_ms": int(time.time() * 1000),
        }
        try:
            self._store.put(st.run_key(spec.schedule, spec.occurrence_ms), json.dumps(doc).encode())
        except Exception as exc:  # noqa: BLE001 - a listing's line, not the call's state
            log.warning("task runner %d: run of %s: %s", self._index, spec.schedule, exc)

    def sweep(self, stop: threading.Event) -> None:
        """Runner 0's thread: every tenth of the TTL (a minute to an hour), delete the
        records older than it."""
        every_s = min(max(self.ttl_ms / 10_000, 60.0), 3600.0)
        while not stop.wait(every_s):
            try:
                keys = self._store.list(st.STATUS_PREFIX) + self._store.list(st.RUNS_PREFIX)
                doomed = st.expired(keys, int(time.time() * 1000), self.ttl_ms)
                list(self._pool.map(self._store.delete, doomed))
                if doomed:
                    log.info("task runner 0: %d expired task records deleted", len(doomed))
            except Exception as exc:  # noqa: BLE001 - the next sweep deletes them
                log.warning("task runner 0: sweeping task records: %s", exc)

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _try(self, m: Any, record: st.TaskRecord) -> bool:
        try:
            self.write(m, record)
            return True
        except Exception as exc:  # noqa: BLE001 - the caller hands the call back
            log.warning("task runner %d: record of %s: %s", self._index, m.message_id, exc)
            return False


def watch_schedules(
    stop: threading.Event,
    store: Any,
    load: Any,
    peers: ClusterPeers,
    topic: str,
    metrics: RunnerMetrics,
) -> None:
    """Runner 0's thread: every 30 s, the schedules whose chain is lost (no occurrence
    waits in the topic, at this look and the one before): logged by name, and counted in
    ``raydelay_schedules_unarmed``. ``load(name)``: a schedule's record, or None."""
    before: set[str] = set()
    while not stop.wait(SCHEDULE_LOOK_S):
        try:
            names = []
            for key in store.list(cron.SCHEDULE_PREFIX):
                record = load(key[len(cron.SCHEDULE_PREFIX) :])
                if record is not None and record.next_after(int(time.time() * 1000)):
                    names.append(record.name)  # (one past its end_at arms nothing)
            found = armed(peers, topic, names)
            now = {name for name, ok in found.items() if not ok}
            lost = sorted(now & before)
            before = now
            metrics.unarmed(len(lost))
            if lost:
                log.warning(
                    "schedules with no next occurrence armed: nothing of them will run: %s "
                    "(replace them: schedule_cron(..., replace=True))",
                    ", ".join(lost),
                )
        except Exception as exc:  # noqa: BLE001 - the next look
            log.debug("task runner 0: looking at schedules: %s", exc)
