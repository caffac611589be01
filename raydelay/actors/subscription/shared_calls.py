"""Calls that many subscription units of one process would make alike, made once.

A subscription host serves many subscriptions of the same topics. Caught up at a
partition's tail, they read it from the same position with the same bounds, and ask its
unsealed index the same due query. Each such call is made once between them
(:data:`SHARED`): a reader asking what another asks already waits for that call's answer
instead of making its own. The answer is read-only (log objects are views of shared
memory), so it goes to each of them alike. A call also ends for all its askers alike: a
failure is each one's to retry, and an asker that stops waiting (its unit closed) does not
end the call for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SharedCalls:
    """The shared calls under way in this process, by key (see the module docstring)."""

    def __init__(self) -> None:
        self._calls: dict[tuple, asyncio.Future[Any]] = {}
        self.joined = 0  # calls answered by another's call (for the tests and stats)

    async def call(self, key: tuple, make: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await make(*args)``, unless a call of ``key`` is under way on this event loop:
        then its answer (or its error)."""
        key = (id(asyncio.get_running_loop()), *key)
        call = self._calls.get(key)
        if call is None:
            call = asyncio.ensure_future(make(*args))
            self._calls[key] = call
            call.add_done_callback(lambda done: self._forget(key, done))
        else:
            self.joined += 1
        return await asyncio.shield(call)

    def _forget(self, key: tuple, call: asyncio.Future[Any]) -> None:
        if self._calls.get(key) is call:
            del self._calls[key]
        if not call.cancelled():
            call.exception()  # (retrieved: a failure no asker waited for is not logged)

    def __len__(self) -> int:
        return len(self._calls)


SHARED = SharedCalls()


class ProgressReports:
    """The progress reports of this process's subscription partitions, sent to the
    coordinator together: one call and one journal record for all that came within
    ``BATCH_S`` of each other (a bulk load adopting a bucket in a hundred subscriptions
    of a host is one record, not a hundred). A report is sent only after the cursor write
    that covers it (its caller awaits that first), later reports of a partition replace
    its earlier ones not sent yet, and batches go one at a time, in order: retention
    never sees a partition's progress go back. A failed batch fails each of its callers,
    whose next cursor write reports again."""

    BATCH_S = 0.02

    def __init__(self) -> None:
        # (topic, partition, subscription) -> the report to send, and its callers' futures
        self._pending: dict[tuple, tuple[list, list[asyncio.Future[None]]]] = {}
        self._sender: asyncio.Task[None] | None = None

    async def report(self, coordinator: Any, report: list) -> None:
        """Send ``report`` (``[topic, partition, subscription, mark-delete, log mark,
        progress]``) with the others of this moment; returns once it is journaled."""
        done = asyncio.get_running_loop().create_future()
        key = tuple(report[:3])
        _, waiting = self._pending.get(key, (None, []))
        self._pending[key] = (report, [*waiting, done])
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send(coordinator))
        await done

    async def _send(self, coordinator: Any) -> None:
        from raydelay.actors.coordinator import CoordinatorActor

        while self._pending:
            await asyncio.sleep(self.BATCH_S)
            batch, self._pending = self._pending, {}
            try:
                reports = [report for report, _ in batch.values()]
                await coordinator.once(CoordinatorActor.set_progress_many, reports)
            except BaseException as exc:  # noqa: BLE001 - each caller's to retry
                for _, waiting in batch.values():
                    for done in waiting:
                        if not done.done():
                            done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                for _, waiting in batch.values():
                    for done in waiting:
                        if not done.done():
                            done.set_result(None)


_PROGRESS: dict[int, ProgressReports] = {}


def progress_reports() -> ProgressReports:
    """This event loop's :class:`ProgressReports`."""
    loop = asyncio.get_running_loop()
    found = _PROGRESS.get(id(loop))
    if found is None or found._sender is not None and found._sender.get_loop() is not loop:
        found = _PROGRESS[id(loop)] = ProgressReports()
    return found
