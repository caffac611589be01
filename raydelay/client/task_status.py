"""What became of a scheduled call: ``Cluster.task_status`` and ``Cluster.task_result``.

A status is read from three places, newest knowledge first:

1. the call's newest record in the store (:mod:`raydelay.tasks.status`): a final one
   (succeeded with a kept result, dead, cancelled, skipped) is the answer;
2. the runners: one that runs it says "running";
3. the ``runners`` subscription of the tasks topic: acknowledged with no record is a
   call that succeeded; held by a consumer is a runner about to run it (or one that died,
   whose lease will hand it on); waiting is "scheduled", or "failed" when its last try
   failed and it waits for its backoff.
"""

from __future__ import annotations

import pickle
import time
from datetime import timedelta
from typing import Any

from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.message import MessageId
from raydelay.client.runner import RUNNERS_SUBSCRIPTION
from raydelay.cluster import rpc
from raydelay.errors import InvalidArgument, NotFound, TaskCancelled, TaskFailed
from raydelay.tasks import status as st

_POLL_S = (0.05, 0.5)  # task_result looks again after this, doubling up to the second


class TaskStatuses:
    """``task_status`` and ``task_result`` of one client's :class:`~raydelay.client.tasks.Tasks`."""

    def __init__(self, tasks: Any) -> None:
        self._tasks = tasks

    def status(self, task_id: Any) -> dict:
        """See :meth:`Cluster.task_status`."""
        mid = self._task_id(task_id)
        record = self._record(mid)
        if record is not None and record.status in st.FINAL:
            return _described(mid, record.status, record)
        if self._running(mid):
            return _described(mid, st.RUNNING, record)
        state = self._subscription_state(mid)
        if state == "acked":
            # a record is written before the call is acknowledged: one that came since
            # the first look (it died, or kept a result, meanwhile) is the answer
            record = self._record(mid)
            if record is not None and record.status in st.FINAL:
                return _described(mid, record.status, record)
            return _described(mid, st.SUCCEEDED, record)
        if state == "cancelled":
            return _described(mid, st.CANCELLED, record)
        if state == "dead":
            return _described(mid, st.DEAD, record)
        if state == "held":
            return _described(mid, st.RUNNING, record)
        if record is not None and record.status == st.FAILED:
            return _described(mid, st.FAILED, record)
        return _described(mid, st.SCHEDULED, record)

    def result(self, task_id: Any, timeout: Any) -> Any:
        """See :meth:`Cluster.task_result`."""
        mid = self._task_id(task_id)
        limit_s = _timeout_s(timeout)
        deadline = None if limit_s is None else time.monotonic() + limit_s
        wait_s = _POLL_S[0]
        while True:
            described = self.status(mid)
            if described["status"] in st.FINAL:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"task {mid}: still {described['status']} after {limit_s:g} s "
                    f"(attempts so far: {described['attempts']})"
                )
            pause = wait_s if deadline is None else min(wait_s, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
            wait_s = min(wait_s * 2, _POLL_S[1])
        return self._value(mid, described["status"], described)

    # --- the parts ----------------------------------------------------------------------------

    def _task_id(self, task_id: Any) -> MessageId:
        if isinstance(task_id, MessageId):
            mid = task_id
        elif isinstance(task_id, str):
            mid = MessageId.parse(task_id)
        else:
            raise InvalidArgument(
                f"task_id: expected a TaskId (or its string), got {type(task_id).__name__}"
            )
        topic = self._tasks.topic
        if mid.topic != topic:
            raise InvalidArgument(f"task_id: {mid} is not a task (not on topic {topic})")
        if topic not in self._tasks.topics.topics():
            raise NotFound(f"task_id: no call was ever scheduled here (no topic {topic})")
        return mid

    def _record(self, mid: MessageId) -> st.TaskRecord | None:
        store = self._tasks.store()
        key = st.newest(store.list(st.task_prefix(str(mid))))
        if key is None:
            return None
        try:
            return st.TaskRecord.from_bytes(store.get(key))
        except NotFound:  # (expired and swept since the listing)
            return None

    def _running(self, mid: MessageId) -> bool:
        runners = self._tasks.runners()
        if not runners:
            return False
        answers = rpc.get([h.running.remote([str(mid)]) for h in runners], what="task runner")
        return any(a[0] for a in answers)

    def _subscription_state(self, mid: MessageId) -> str:
        peers = self._tasks.topics.peers
        position = (mid.ledger_id, mid.entry_id)
        if mid.partition >= peers.partitions(mid.topic) or mid.partition < 0:
            raise NotFound(f"task_id: {mid}: the tasks topic has no partition {mid.partition}")
        peers.call(  # (an id that was never a call: NotFound)
            lambda: [
                peers.topic_peer(mid.topic, mid.partition).submit(
                    HostActor.check_cancel, mid.topic, mid.partition, [position]
                )
            ],
            "topic",
        )
        (state,) = peers.call(
            lambda: [
                peers.on_subscription(
                    mid.topic,
                    mid.partition,
                    RUNNERS_SUBSCRIPTION,
                    SubscriptionHost.states,
                    [position],
                )
            ],
            "subscription",
        )[0]
        return str(state)

    def _value(self, mid: MessageId, status: str, described: dict) -> Any:
        if status == st.DEAD:
            raise TaskFailed(
                f"task {mid}: dead after {described['attempts']} tries: {described['error']}"
            )
        if status in (st.CANCELLED, st.SKIPPED):
            raise TaskCancelled(f"task {mid}: {status}; it did not run")
        record = self._record(mid)
        if (
            record is None
            or record.status != st.SUCCEEDED
            or (record.result is None and record.result_error is None)
        ):
            raise NotFound(
                f"result: task {mid} succeeded, but no result of it is kept: it was scheduled "
                "without keep_result=True, or its record expired (tasks.result_ttl_s)"
            )
        if record.result is None:
            raise NotFound(f"result: task {mid} succeeded; {record.result_error}")
        return pickle.loads(record.result)


def _described(mid: MessageId, status: str, record: st.TaskRecord | None) -> dict:
    """What task_status returns."""
    own = record if record is not None and record.status == status else None  # (its own)
    attempts = record.attempts if record is not None else 0
    if status == st.SUCCEEDED:
        attempts = max(attempts, 1)
    return {
        "task_id": str(mid),
        "status": status,
        "attempts": attempts,
        "error": record.error if record is not None else None,
        "next_try_ms": own.next_try_ms if own is not None else None,
        "updated_ms": record.written_ms if record is not None else None,
        "result_kept": own is not None and own.result is not None,
        "result_error": own.result_error if own is not None else None,
    }


def _timeout_s(timeout: Any) -> float | None:
    if timeout is None or (
        isinstance(timeout, int) and not isinstance(timeout, bool) and timeout == -1
    ):
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgument(
            f"timeout: expected seconds, a timedelta, or None (wait as long as it takes), "
            f"got {type(timeout).__name__}"
        )
    if not timeout >= 0 or timeout == float("inf"):
        raise InvalidArgument(f"timeout: expected 0 or more seconds, or None, got {timeout}")
    return float(timeout)
