"""A consumer's receives at the partitions of one unit, each on a task of its own.

A receive at several partitions (``SubscriptionUnit.receive_many``) used to ask each in
turn, so one partition that was slow to answer held back what the others had: a partition
whose own host was lost waits in its receive for the host to be found again (a payload
read, say), and in a SIGKILL of the coordinator's node the whole unit delivered nothing
until that partition was back, 1-2 s. Now each partition's receive runs as a task, and one
pass waits at most SLOW_RECEIVE_S for all of them: the call answers with those that are
done. A receive still running then is kept, and its answer goes to the same consumer in
its next call (or in a later pass of this one), so nothing it handed out is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raydelay.errors import Unavailable

SLOW_RECEIVE_S = 0.1  # how long one pass waits for every partition's receive
# A kept receive that is done and not taken this long after is dropped: its consumer is
# gone (what it handed out is redelivered when the consumer's lease lapses)
UNCLAIMED_S = 120.0

Answer = tuple[list[Any], bool]  # (what goes out, whether the call answers with it)


class PartitionReceives:
    """The receives at a unit's partitions, by consumer; see the module's docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._kept: dict[tuple[str, int], asyncio.Task[Answer]] = {}
        self._done_at: dict[asyncio.Task[Answer], float] = {}
        self._clock = clock

    async def collect(
        self,
        consumer_id: str,
        partitions: list[int],
        receive: Callable[[int], Awaitable[Answer]],
    ) -> tuple[dict[int, Answer], dict[int, BaseException], list[asyncio.Task[Answer]]]:
        """One pass at ``partitions`` for ``consumer_id``: each partition's receive (one
        kept from before, or ``receive(p)`` begun now), waited for up to SLOW_RECEIVE_S.
        Returns the answers of those done, the errors of those that failed, and the tasks
        still running (kept for the consumer's next pass)."""
        self._drop_unclaimed()
        tasks = {p: self._kept.pop((consumer_id, p), None) for p in partitions}
        for p, task in tasks.items():
            if task is None:
                tasks[p] = asyncio.ensure_future(receive(p))
        running = [t for t in tasks.values() if t is not None and not t.done()]
        if running:
            await asyncio.wait(running, timeout=SLOW_RECEIVE_S)
        answers: dict[int, Answer] = {}
        failed: dict[int, BaseException] = {}
        still: list[asyncio.Task[Answer]] = []
        for p, task in tasks.items():
            assert task is not None
            if not task.done():
                self._kept[(consumer_id, p)] = task
                still.append(task)
                continue
            self._done_at.pop(task, None)
            if task.cancelled():
                failed[p] = Unavailable(f"partition {p}: its receive was cancelled")
            elif task.exception() is not None:
                failed[p] = task.exception()  # type: ignore[assignment]
            else:
                answers[p] = task.result()
        return answers, failed, still

    def _drop_unclaimed(self) -> None:
        """Forget kept receives done and not taken for UNCLAIMED_S (first seen done now)."""
        now = self._clock()
        for key, task in list(self._kept.items()):
            if not task.done():
                continue
            at = self._done_at.setdefault(task, now)
            if now - at > UNCLAIMED_S:
                del self._kept[key]
                del self._done_at[task]

    def kept(self) -> int:
        """How many receives are kept for a next call."""
        return len(self._kept)

    def forget_all(self) -> None:
        """Drop every kept receive (the unit closes; not cancelled: one may be writing the
        cursor, and what it handed out is redelivered like any unacked message)."""
        self._kept.clear()
        self._done_at.clear()
