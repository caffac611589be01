"""LogReads: a partition's log reads, and the long polls that wait for them.

- ``read`` answers with the ledger objects at or after a position (shared through Ray's
  object store, :mod:`raydelay.actors.partition.shared`); a reader that is caught up waits
  first, in a long poll that each commit looks at (``committed``) and wakes only when its
  reader has something to read.
- ``wait_for_entries`` is a long poll woken by each commit.
- ``stop`` (a graceful stop of the host) answers every standing long poll at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from raydelay.actors.partition.context import PartitionContext
from raydelay.actors.partition.index import PartitionIndex
from raydelay.actors.partition.shared import SHARED
from raydelay.actors.protocol import ReadReply
from raydelay.log.entries import Rows, compact
from raydelay.log.reader import KeyRows
from raydelay.positions import key_of

MAX_WAIT_S = 60.0  # the longest a long poll waits, whatever its caller asks
# a log read waiting for entries due soon also returns for entries due later, but no sooner
# than this after it began (the reader learns of them, and of new buckets, that often)
TRICKLE_S = 1.0


@dataclasses.dataclass(eq=False)
class _Waiter:
    """A standing long poll of a log read (see ``LogReads._wait_urgent``): where its
    reader reads from, its horizon (ms, None: any entry), when it began (monotonic s), the
    future that ends it, and its timer (the next moment it may become ready without a
    commit)."""

    position: tuple[int, int]
    within_ms: int | None
    started: float
    future: asyncio.Future
    timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def arm(self, delay_s: float) -> None:
        """Wake in ``delay_s`` seconds, unless an earlier timer is set already."""
        loop = self.future.get_loop()
        at = loop.time() + delay_s
        if self.timer is not None and not self.timer.cancelled():
            if self.timer.when() <= at:
                return
            self.timer.cancel()
        self.timer = loop.call_at(at, self.wake)


class LogReads:
    """The reads of one partition's log on its host (see the module docstring)."""

    def __init__(self, ctx: PartitionContext, index: PartitionIndex) -> None:
        self._ctx = ctx
        self._log = ctx.log
        self._index = index
        self.stopping = False  # graceful stop: long polls are answered at once
        # (asyncio's primitives bind to the event loop on first use, not here)
        self._tail_changed = asyncio.Condition()
        self._waiters: set[_Waiter] = set()  # standing long polls of reads (_wait_urgent)

    async def committed(self) -> None:
        """After a commit (on the event loop): wake the long polls it answers."""
        self._wake_waiters()
        async with self._tail_changed:
            self._tail_changed.notify_all()

    async def stop(self) -> None:
        """Answer every standing long poll now (the host is about to stop); the next
        append ends this."""
        self.stopping = True
        await self.committed()

    async def read(
        self,
        from_position: tuple[int, int],
        max_entries: int,
        wait_s: float = 0.0,
        skip_delayed: bool = False,
        due_within_ms: int | None = None,
    ) -> ReadReply:
        """Ledger objects with entries at or after ``from_position`` (see ReadReply), the tail,
        and the ledger list. With ``wait_s`` (seconds), a reader that is caught up waits
        that long for new entries first (one call instead of a poll plus a read). With
        ``skip_delayed``, an object of delayed entries only (this partition indexed them)
        comes as a :class:`~raydelay.log.entries.DelayedRun`; and with ``due_within_ms``
        too, the wait ends at once only for an entry due at once or within that many ms, or
        when one it passed over comes that close to its time; entries due later end it
        after TRICKLE_S: a reader that takes delayed rows from this partition's index wakes
        once a second in a steady stream of messages due later, and an idle one not at
        all."""
        position = (int(from_position[0]), int(from_position[1]))
        if not (skip_delayed and self._index.enabled):
            due_within_ms = None
        if wait_s > 0:
            await self._wait_urgent(position, due_within_ms, float(wait_s))
        runs = None
        if skip_delayed and self._index.enabled:
            delayed_runs = self._index.delayed_runs
            runs = lambda ledger_id, first: delayed_runs.get((ledger_id, first))  # noqa: E731
        reply = await self._ctx.threads.run(
            self._log.read, (int(from_position[0]), int(from_position[1])), int(max_entries), runs
        )
        return ReadReply(
            SHARED.share(reply.objects),
            reply.tail,
            [(x.ledger_id, x.count) for x in self._log.ledgers],
            self._ctx.buckets.version,
        )

    async def _wait_urgent(
        self, position: tuple[int, int], within_ms: int | None, wait_s: float
    ) -> None:
        """Wait (up to ``wait_s``) until the log holds an entry at or after ``position`` due
        at once or within ``within_ms`` from the moment it is looked at (None: any entry).
        Entries due later end the wait too, but no sooner than TRICKLE_S after it began: a
        steady stream of them wakes a reader once a TRICKLE_S, and an idle log never.

        A waiter is a future that each commit looks at where it is made (``_wake_waiters``)
        and sets only when its reader has something to read: a commit does not wake every
        standing long poll of the partition (32 subscriptions would be 32 task switches a
        commit, to look and sleep again)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(position, within_ms, time.monotonic(), loop.create_future())
        if self.stopping or self._ready_to_read(waiter, tuple(self._index.marks)):
            return
        self._waiters.add(waiter)
        deadline = loop.call_later(min(max(wait_s, 0.0), MAX_WAIT_S), waiter.wake)
        try:
            await waiter.future
        finally:
            self._waiters.discard(waiter)
            deadline.cancel()
            if waiter.timer is not None:
                waiter.timer.cancel()

    def _wake_waiters(self) -> None:
        """After a commit (on the event loop): wake each standing long poll whose reader
        now has something to read; arm the timer of one that has entries due later only."""
        marks = tuple(self._index.marks)  # (appended on the log's thread; one copy for all)
        for waiter in list(self._waiters):
            if self.stopping or self._ready_to_read(waiter, marks):
                waiter.wake()

    def _ready_to_read(self, waiter: _Waiter, marks: tuple[tuple[int, int], ...]) -> bool:
        """Whether ``waiter``'s read should happen now: the log holds an entry for it due
        at once or within its horizon, or entries due later for TRICKLE_S already. When it
        should not, its timer is set for the earliest moment that changes without a commit:
        TRICKLE_S after it began, or an entry it passed over coming within its horizon.
        ``marks``: a copy of the recent commits' marks."""
        horizon = (
            None if waiter.within_ms is None else time.time_ns() // 1_000_000 + waiter.within_ms
        )
        if self._has_urgent_at(waiter.position, horizon, marks):
            return True
        if not self._has_entries_at(waiter.position):
            return False
        left = waiter.started + TRICKLE_S - time.monotonic()
        if left <= 0:
            return True
        nxt = None if horizon is None else next_due_at(waiter.position, marks)
        if nxt is not None:  # an entry passed over comes within the horizon then
            left = min(left, max(0.001, (nxt - horizon) / 1000))  # type: ignore[operator]
        waiter.arm(left)
        return False

    def _has_entries_at(self, position: tuple[int, int]) -> bool:
        tail = self._log.tail()
        return tail is not None and tail >= position

    def _has_urgent_at(
        self,
        position: tuple[int, int],
        due_before_ms: int | None,
        marks: tuple[tuple[int, int], ...],
    ) -> bool:
        """Whether the log holds an entry at or after ``position`` that is due at once or
        before ``due_before_ms`` (None: any entry), as ``marks`` tell."""
        if not self._has_entries_at(position):
            return False
        return due_before_ms is None or urgent_in_marks(position, due_before_ms, marks)

    async def read_positions(self, keys) -> pa.RecordBatch:
        """The entries at ``keys`` (int64 position keys ``ledger << 32 | entry``, one array) as
        one record batch of rows (:data:`raydelay.log.entries.ROWS_SCHEMA`), sorted by
        position; positions not in the log are left out."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = await self._ctx.threads.run(self._log.read_positions, keys)
        buckets = self._ctx.buckets.entries
        if len(rows) < len(keys) and buckets:
            # Positions whose ledger is gone: their delayed entries live on in a bucket.
            missing = np.setdiff1d(keys, rows.positions)
            extra = await asyncio.to_thread(self._ctx.sealed.read_positions, missing, buckets)
            if len(extra):
                rows = Rows.concat([rows, extra])
        return compact(rows.to_batch())

    async def key_rows(self, keys: np.ndarray) -> KeyRows:
        """The keys and ``deliver_at`` of the entries at ``keys`` (position keys): from the
        log's object indexes, no payload read; a position whose ledger is gone from its
        sealed bucket. Positions in neither are left out."""
        keys = np.unique(np.asarray(keys, dtype=np.int64))
        found = await self._ctx.threads.run(self._log.key_rows, keys)
        buckets = self._ctx.buckets.entries
        if len(found.positions) < len(keys) and buckets:
            missing = np.setdiff1d(keys, found.positions)
            extra = await asyncio.to_thread(self._ctx.sealed.key_rows, missing, buckets)
            if len(extra.positions):
                found = KeyRows(
                    np.concatenate([found.positions, extra.positions]),
                    found.keys + extra.keys,
                    np.concatenate([found.deliver_at_ms, extra.deliver_at_ms]),
                )
        return found

    async def wait_for_entries(self, after_position, timeout_s: float):
        """Return the tail position once it is past ``after_position`` (or None was given
        and any entry exists), or at ``timeout_s`` (seconds) with the tail as it is."""
        after = None if after_position is None else (int(after_position[0]), int(after_position[1]))

        def moved() -> bool:
            tail = self._log.tail()
            return tail is not None and (after is None or tail > after)

        await self._wait_until(moved, timeout_s)
        return self._log.tail()

    async def _wait_until(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``ready()`` holds after a commit, or ``timeout_s`` (seconds) passed (or
        the partition is stopping)."""
        timeout_s = min(max(float(timeout_s), 0.0), MAX_WAIT_S)
        async with self._tail_changed:
            try:
                await asyncio.wait_for(
                    self._tail_changed.wait_for(lambda: self.stopping or ready()),
                    timeout=timeout_s,
                )
            except TimeoutError:
                pass

    async def cancel_markers(self, from_position: tuple[int, int]) -> list:
        """(marker, target) positions of every cancel marker at or after ``from_position``."""
        position = (int(from_position[0]), int(from_position[1]))
        return await self._ctx.threads.run(self._log.cancel_markers, position)

    async def position_at(self, time_ms: int):
        """The first position published at or after ``time_ms`` (epoch ms), or None."""
        return await self._ctx.threads.run(self._log.position_at, int(time_ms))


def urgent_in_marks(
    position: tuple[int, int], due_before_ms: int, marks: tuple[tuple[int, int], ...]
) -> bool:
    """Whether ``marks`` (recent commits' (last position key, earliest deliver_at or 0))
    tell of an entry at or after ``position`` due at once or before ``due_before_ms``; an
    entry older than the marks remember counts (it must be read to know)."""
    start = key_of(*position)
    if not marks or marks[0][0] >= start:
        return True  # older objects than the marks remember: read them
    for last, d in reversed(marks):
        if last < start:
            return False
        if d < due_before_ms:
            return True
    return False


def next_due_at(position: tuple[int, int], marks: tuple[tuple[int, int], ...]) -> int | None:
    """The earliest deliver_at of the delayed-only objects at or after ``position`` that
    ``marks`` remember (None: none)."""
    start = key_of(*position)
    out = None
    for last, d in reversed(marks):
        if last < start:
            break
        if d and (out is None or d < out):
            out = d
    return out
