"""A subscription's cursor and the marks written ahead of delivery (pure: no Ray).

- **cursor**: mark-delete plus individual acks (:mod:`raydelay.dispatch.cursor`), and
  the **log cursor**: the log as this subscription still needs it (acknowledged, or held
  by a sealed bucket); its mark-delete is how far the partition's ledgers may go.
- **dispatch mark**: new entries are delivered only below it, and it is persisted (with
  the cursor) before it moves, so a restarted subscription knows which entries it re-reads
  may have gone out already and raises their redelivery_count.
- **delayed mark**: delayed rows due at or before it may have been delivered; it is
  persisted before rows due past the persisted one go out.

Write ahead, then apply: :meth:`CursorMarks.persist` writes a mark before it is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.ports import CursorWriter

DISPATCH_MARK_STEP = 10_000  # entries the dispatch mark moves ahead at a time
DELAYED_MARK_STEP_MS = 5_000  # how far ahead the persisted delayed mark moves
# The periodic write looks again this long after one that found nothing changed, while
# nothing it covers changes (an idle subscription does not wake once an interval for it).
QUIET_WRITE_MS = 30_000


class CursorMarks:
    """The cursor, the log cursor, the dispatch and delayed marks, and their writes."""

    def __init__(
        self,
        *,
        cursor: Cursor,
        dispatched_before: Position,
        read_position: Position,
        write_cursor: CursorWriter | None,
        persist_interval_ms: int,
    ) -> None:
        self.cursor = cursor
        self.log_cursor = cursor.copy()
        # Delayed rows due at or before it may have been delivered by an earlier life.
        self.delayed_before = cursor.delayed_mark
        # Entries before this were read by an earlier life and may have been delivered.
        self.dispatched_before = dispatched_before
        self.dispatch_mark: Position = max(dispatched_before, read_position)
        self.write_cursor = write_cursor
        self.persist_interval_ms = persist_interval_ms
        # what was last written: (mark-delete, individual acks, dispatch mark, delayed mark,
        # settled delayed rows, dead letters)
        self._persisted: tuple[Position, int, Position, int, int, int, int] | None = None
        # the delayed mark the store holds: delayed rows due after it wait for a write
        self._delayed_durable = cursor.delayed_mark
        self.lock = asyncio.Lock()  # one cursor write at a time, in order
        self._due_ms: int | None = None  # the next periodic write (None: at once)
        self._checked_ms: int | None = None  # the last periodic write's start
        # what the subscription's state was when a periodic write found nothing to write
        # (see :meth:`quiet`; None: it changed since, or no such write yet)
        self._quiet_state: tuple | None = None
        self._watched: list[Callable[[], tuple]] = []  # more state the periodic write reports

    # --- acknowledgements -------------------------------------------------------------------

    def ack(self, keys: np.ndarray, bm: BitMap64 | None = None) -> int:
        """Acknowledge ``keys`` (``bm``: their bitmap, when the caller has it) in the cursor
        and the log's cursor; returns how many the cursor had not acknowledged."""
        if bm is None:
            bm = bitmap64_of(np.sort(keys))
        self.log_cursor.ack_keys(bm)
        return self.cursor.ack_keys(bm)

    def learn_ledgers(
        self, ledgers: Iterable[tuple[int, int | None]], *, whole_log: bool = True
    ) -> None:
        """See :meth:`Cursor.learn_ledgers`."""
        known = list(ledgers)
        self.cursor.learn_ledgers(known, whole_log=whole_log)
        self.log_cursor.learn_ledgers(known, whole_log=whole_log)

    def unseen(self, keys: np.ndarray, ahead: BitMap64, bm: BitMap64 | None = None) -> np.ndarray:
        """Which positions are neither acknowledged nor in ``ahead`` (cancelled ahead of the
        read); ``bm``: the bitmap of ``keys``, when the caller has it."""
        keep = np.ones(len(keys), dtype=bool)
        if not len(keys):
            return keep
        keep &= keys > self.cursor.floor_key()
        acked = self.cursor.acked_keys
        if acked or ahead:
            bm = bitmap64_of(keys) if bm is None else bm
            hit = (bm & acked) | (bm & ahead)
            if hit:
                keep &= ~np.isin(keys, bitmap64_values(hit))
        return keep

    def all_acked(self, keys: np.ndarray, ahead: BitMap64) -> bool:
        """Whether every position of ``keys`` is acknowledged (or in ``ahead``): below
        mark-delete, or in the individual acks. Asked per sealed run at every progress
        report, so it answers without building more than one bitmap."""
        floor = self.cursor.floor_key()
        above = keys[keys > floor]
        if not len(above):
            return True
        rest = bitmap64_of(np.sort(above)) - self.cursor.acked_keys
        if rest and ahead:
            rest -= ahead
        return not rest

    # --- writes -------------------------------------------------------------------------------

    def needs_delayed_mark(self, now_ms: int) -> bool:
        """Whether the delayed mark must move (be persisted) before delayed rows due up to
        ``now_ms`` may go out."""
        return now_ms > self._delayed_durable

    def write_due(self, now_ms: int, soon_ms: int | None) -> bool:
        """Whether the background step writes the cursor at ``now_ms`` (epoch ms): its
        periodic write, or the delayed mark moved ahead because delayed rows fall due at
        ``soon_ms`` (before receive would have to: a write on the delivery path, at their
        instant). After a write that found nothing to do, the periodic one waits longer
        (see :meth:`quiet`)."""
        persist = False
        interval = self.persist_interval_ms
        if self._quiet_state is not None:
            if self._quiet_state == self.state():
                interval = max(interval, QUIET_WRITE_MS)
            else:
                self._quiet_state = None
        self._due_ms = None if self._checked_ms is None else self._checked_ms + interval
        if not self.lock.locked() and (self._due_ms is None or now_ms >= self._due_ms):
            persist = True
            self._checked_ms = now_ms
            self._due_ms = now_ms + interval
        if (
            soon_ms is not None
            and not self.lock.locked()
            and soon_ms <= now_ms + DELAYED_MARK_STEP_MS // 2
            and max(now_ms, soon_ms) + DELAYED_MARK_STEP_MS // 2 > self.cursor.delayed_mark
        ):
            self.cursor.delayed_mark = max(now_ms, soon_ms) + DELAYED_MARK_STEP_MS
            persist = True
        return persist

    def watch(self, state: Callable[[], tuple]) -> None:
        """The periodic write reports more than the cursor (the progress through sealed
        buckets): ``state()`` sums that up, for :meth:`state`."""
        self._watched.append(state)

    def state(self) -> tuple:
        """A cheap summary of everything a periodic write writes or reports: equal
        summaries, nothing new to write. (Acknowledgements only add positions until
        mark-delete passes them, so a count and mark-delete tell whether any came.)"""
        c, log = self.cursor, self.log_cursor
        return (
            c.mark_delete,
            len(c.acked_keys),
            self.dispatch_mark,
            c.delayed_mark,
            len(c.settled),
            len(c.settled_due),
            c.dead_lettered,
            log.mark_delete,
            len(log.acked_keys),
            *(each() for each in self._watched),
        )

    def quiet(self, state: tuple) -> None:
        """A periodic write found nothing to write or report, the subscription's state
        summed up as ``state`` (:meth:`state`, taken before it): the next one comes after
        QUIET_WRITE_MS instead of the interval, unless that state changes first."""
        self._quiet_state = state

    def next_write_ms(self) -> int | None:
        return self._due_ms

    async def move_delayed_mark(self, now_ms: int) -> None:
        """Delayed rows due by ``now_ms`` may go out: a restart must know they may have (the
        step moves the mark ahead in the background, so this write is rare)."""
        self.cursor.delayed_mark = max(self.cursor.delayed_mark, now_ms + DELAYED_MARK_STEP_MS)
        await self.persist(force=True)

    async def persist(self, *, force: bool = False, mark: Position | None = None) -> bool:
        """Write the cursor with the dispatch mark when it changed since the last write (or
        with ``force``); with ``mark``, write it with that mark and then move the dispatch
        mark there (write ahead, then apply). Returns whether it wrote."""
        async with self.lock:
            if mark is not None and mark <= self.dispatch_mark:
                return False  # another call moved it meanwhile
            target = mark or self.dispatch_mark
            delayed_mark = self.cursor.delayed_mark
            state = (
                self.cursor.mark_delete,
                self.cursor.individually_acked(),
                target,
                delayed_mark,
                len(self.cursor.settled),
                len(self.cursor.settled_due),
                self.cursor.dead_lettered,
            )
            wrote = False
            if state != self._persisted or force:
                if self.write_cursor is not None:
                    await self.write_cursor(self.cursor.encode(target))
                    wrote = True
                self._persisted = state
            self._delayed_durable = max(self._delayed_durable, delayed_mark)
            if mark is not None:
                self.dispatch_mark = mark
            return wrote
