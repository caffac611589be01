"""What a subscription reads from the log, and its read-ahead queue (pure: no Ray).

The log reader's answers are applied in order by the next step (:meth:`LogReading.offer_read`).
Entries read that are due now wait in a bounded read-ahead queue with their payloads,
and go out below the dispatch mark only. Entries not due go to the tracker, or, with
sealed buckets, are the host's to index (stand-ins count them as delayed). After a
restart, positions the persisted buckets cover are skipped, and the loose ones among them
are re-read one by one (:meth:`LogReading.resume_after_buckets`).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.delayed.reader import SealedReader
from raydelay.dispatch.cancels import Cancels
from raydelay.dispatch.cursor import Position
from raydelay.dispatch.marks import DISPATCH_MARK_STEP, CursorMarks
from raydelay.dispatch.objects import ObjectCache
from raydelay.dispatch.ports import Group, Source, Tracker, keys_of
from raydelay.dispatch.redelivery import Redelivery
from raydelay.dispatch.settled import SettledDelayed
from raydelay.dispatch.tail import UnsealedTail
from raydelay.log.entries import NO_CANCEL, NO_DELAY, DelayedRun, LedgerObject, Rows
from raydelay.positions import key_of, position_of, split_keys

log = logging.getLogger(__name__)


class _Run:
    """Entries of one source waiting in the read-ahead queue (from ``pos`` on)."""

    __slots__ = ("source", "indexes", "keys", "pos")

    def __init__(self, source: Source, indexes: np.ndarray, keys: np.ndarray) -> None:
        self.source, self.indexes, self.keys, self.pos = source, indexes, keys, 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos


class LogReading:
    """The read position, the read-ahead queue, and the loose positions to re-read."""

    def __init__(
        self,
        *,
        name: str,
        marks: CursorMarks,
        tracker: Tracker,
        sealed: SealedReader | None,
        tail: UnsealedTail,
        redelivery: Redelivery,
        settled: SettledDelayed,
        spread: bool,
        read_ahead_entries: int,
        cached_entries: int,
    ) -> None:
        self.name = name
        self._marks = marks
        self._tracker = tracker
        self._sealed = sealed
        self._tail = tail
        self._redelivery = redelivery
        self._spread = spread
        self.cancels: Cancels | None = None  # wired by the owner (they need each other)
        self.settled = settled
        self.read_ahead_entries = read_ahead_entries
        md_l, md_e = marks.cursor.mark_delete
        self.read_position: Position = (md_l, md_e + 1)
        # After a restart: positions before read_position still to be re-read one by one
        # (see resume_after_buckets), and the first unacknowledged position at the start.
        self.unread = BitMap64()
        self.start_position: Position = self.read_position
        self.tail: Position | None = None
        # the last position known to exist (the log's tail at the last read, or a row the
        # host's index answered): acks past it name no message (None: nothing read yet)
        self.end_key: int | None = None
        self._ready: deque[_Run] = deque()
        self.ready_count = 0
        # decoded ledger objects read from the log: payloads found without another read
        self.objects = ObjectCache(cached_entries)
        # what the log reader brought and the next step applies, in order
        self._inbox: deque[Callable[[], int]] = deque()

    def see_end(self, key: int) -> None:
        self.end_key = key if self.end_key is None else max(self.end_key, key)

    def wants_read(self) -> bool:
        """Whether the log reader may read on: the read-ahead has room and what it read
        last was applied (the next read starts where that one ended)."""
        return not self._inbox and self.ready_count < self.read_ahead_entries

    def offer_read(
        self,
        objects: list[LedgerObject | DelayedRun],
        ledgers: list[tuple[int, int | None]],
        tail: Position | None,
    ) -> None:
        """The log reader's answer (see :meth:`on_read`), for the next step to apply."""
        self._inbox.append(functools.partial(self.on_read, objects, ledgers, tail))

    def offer_reread(self, rows: Rows, keys: np.ndarray) -> None:
        """Rows the log returned for loose positions (see :meth:`on_reread`), for the next
        step to apply."""
        self._inbox.append(functools.partial(self.on_reread, rows, keys))

    def apply_offers(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    def on_read(
        self,
        objects: Iterable[LedgerObject | DelayedRun],
        ledgers: Iterable[tuple[int, int | None]],
        tail: Position | None,
    ) -> int:
        """Take in ledger objects from the log (in log order); a :class:`DelayedRun` stands
        for an object of delayed entries only, which the host's index delivers. The
        objects are kept (bounded) to find payloads in; with sealed buckets only those
        with an immediate entry (delayed rows come with theirs from the host's index).
        Returns entries taken in."""
        self._marks.learn_ledgers(ledgers)
        self.tail = tail
        if tail is not None:
            self.see_end(key_of(*tail))
        cursor = self._marks.cursor
        taken = 0
        for obj in objects:
            first_key = key_of(obj.ledger_id, obj.first_entry)
            read_key = key_of(*self.read_position)
            start = max(0, read_key - first_key) if obj.ledger_id == self.read_position[0] else 0
            if obj.ledger_id < self.read_position[0] or start >= obj.count:
                continue
            if isinstance(obj, DelayedRun):
                self._tail.read(
                    obj.min_deliver_at_ms,
                    first_key + start,
                    first_key + obj.count,
                    obj.count - start,
                )
                span = BitMap64()
                span.add_range(first_key + start, first_key + obj.count)
                # acknowledged already (cancelled ahead of the read, or before a restart):
                # the host's index counts them till they fall due
                gone = (span & self._cancels().ahead) | (span & cursor.acked_keys)
                if gone:
                    self.settled.add(bitmap64_values(gone))
                if self._cancels().ahead:  # cancelled before the read passed them: ack them
                    self._cancels().passed(span)
            else:
                if self._sealed is None or (obj.entries.deliver_at_ms <= obj.publish_time_ms).any():
                    self.objects.add(obj)
                idx = np.arange(start, obj.count, dtype=np.int64)
                taken += self.take_in(obj, idx, first_key + idx, read=True)
            last = obj.first_entry + obj.count
            self.read_position = (obj.ledger_id, last)
            size = cursor.ledger_size(obj.ledger_id)
            if size is not None and last >= size:
                nxt = next((i for i, _ in cursor.known_ledgers() if i > obj.ledger_id), None)
                if nxt is not None:
                    self.read_position = (nxt, 0)
        return taken

    def resume_after_buckets(self, ledgers: list[tuple[int, int | None]]) -> int:
        """At startup, before any read: skip the part of the log the persisted buckets
        cover, so recovery costs the log tail, not the backlog.

        Every entry of a ledger up to the tracker's ``persisted_through()`` is
        acknowledged, in a bucket (brought back when due), or *loose*: immediate, due when
        it was read, delivered and unacknowledged, nacked. The loose ones are the ledger's
        range minus the acknowledged and the tracked positions; they go to :attr:`unread`
        (re-read one by one through :meth:`on_reread`) and the sequential read starts
        after that ledger. ``ledgers`` is the log's (id, size or None while open) list.
        Returns how many positions are loose."""
        through = self._tracker.persisted_through()
        if self._sealed is not None:
            through = max(through, self._sealed.sealed_through)
        start_l, start_e = self.read_position
        if through < start_l:
            return 0
        loose = BitMap64()
        resume: Position = (through + 1, 0)
        for ledger_id, size in ledgers:
            if ledger_id < start_l or ledger_id > through:
                continue
            if size is None:  # still open (cannot be, once a later ledger exists): read it
                resume = (ledger_id, start_e if ledger_id == start_l else 0)
                break
            lo = start_e if ledger_id == start_l else 0
            if size <= lo:
                continue
            loose.add_range(key_of(ledger_id, lo), key_of(ledger_id, size))
        if loose:
            loose -= self._marks.cursor.acked_keys
            loose -= self._tracker.tracked_among(loose)
            if self._sealed is not None:
                loose -= self._sealed.covered & loose
        self.unread = loose
        self.read_position = max(resume, self.read_position)
        return len(loose)

    def next_unread(self, max_positions: int) -> list[int]:
        """The lowest loose positions still to re-read (see resume_after_buckets)."""
        return list(itertools.islice(self.unread, max_positions))

    def on_reread(self, rows: Rows, keys: Iterable[int] | np.ndarray) -> int:
        """Take in the loose positions ``keys`` from the rows the log returned for them (a
        position the log no longer has is dropped). Returns entries taken in."""
        chunk = bitmap64_of(keys_of(keys)) & self.unread
        self.unread -= chunk
        wanted = bitmap64_values(chunk)
        idx = np.flatnonzero(np.isin(rows.positions, wanted))
        taken = self.take_in(rows, idx, rows.positions[idx]) if len(idx) else 0
        gone = np.setdiff1d(wanted, rows.positions)
        if len(gone):
            log.error(
                "subscription %s: %d positions are gone from the log, first %s",
                self.name,
                len(gone),
                position_of(int(gone[0])),
            )
        return taken

    def take_in(self, source: Source, idx: np.ndarray, keys: np.ndarray, read: bool = False) -> int:
        """Rows ``idx`` of ``source`` at positions ``keys`` (both ascending), from the log:
        apply cancel markers, put not-yet-due delayed messages in the tracker, queue the
        rest. ``read``: by the sequential read (not a re-read of loose positions)."""
        cancels = self._cancels()
        ents = source.entries
        targets = ents.cancel_targets[idx]
        is_marker = targets != NO_CANCEL
        if is_marker.any():
            for marker, target in zip(keys[is_marker].tolist(), targets[is_marker].tolist()):
                cancels.apply(marker, target)  # markers first
            self._marks.ack(keys[is_marker])
            idx, keys = idx[~is_marker], keys[~is_marker]
        keep = self._marks.unseen(keys, cancels.ahead)
        if not keep.all():  # cancelled before they were read: ack them now
            cancels.passed(keys[~keep])
        ds = ents.deliver_at_ms[idx]
        if self._sealed is not None and len(idx):
            # not due when committed: the host indexed it (its unsealed index or a bucket),
            # and counts it till it falls due, acknowledged or not
            later = ds > source.publish_times(idx)
            if later.any():
                soonest = int(ds[later].min())
                if read:  # (one object: in the index whole, or not yet)
                    span = keys[later]
                    self._tail.read(soonest, int(span[0]), int(span[-1]) + 1, len(span))
                else:
                    self._tail.read(soonest)
                gone = later & ~keep
                if gone.any():
                    self.settled.add(keys[gone], ds[gone])
                keep &= ~later
        idx, keys, ds = idx[keep], keys[keep], ds[keep]
        now_due = np.ones(len(idx), dtype=bool)
        if self._spread and len(idx):
            delayed = ds != NO_DELAY
            if delayed.any():
                tracked = self._tracker.add_messages(*split_keys(keys[delayed]), ds[delayed])
                now_due[np.flatnonzero(delayed)[tracked]] = False
        if now_due.any():
            run_keys = keys[now_due]
            before_l, before_e = self._marks.dispatched_before
            before = key_of(before_l, before_e) if before_e >= 0 else -1
            if run_keys[0] < before:  # only right after a restart
                self._redelivery.bump(run_keys[run_keys < before], floor=1)
            self._ready.append(_Run(source, idx[now_due], run_keys))
            self.ready_count += len(run_keys)
        return len(idx)

    def take_ready(self, room: int) -> list[Group]:
        """Up to ``room`` rows off the read-ahead queue, below the dispatch mark, left out
        the ones acknowledged since they were read (cancels)."""
        out = []
        mark = key_of(*self._marks.dispatch_mark)
        ahead = self._cancels().ahead
        while self._ready and room > 0:
            run = self._ready[0]
            below = int(np.searchsorted(run.keys, mark)) if run.keys[-1] >= mark else len(run.keys)
            end = min(below, run.pos + room)
            if end <= run.pos:
                break  # past the dispatch mark: wanted_mark() says where to move it
            idx, keys = run.indexes[run.pos : end], run.keys[run.pos : end]
            self.ready_count -= end - run.pos
            run.pos = end
            if run.pos >= len(run.keys):
                self._ready.popleft()
            keep = self._marks.unseen(keys, ahead)
            if not keep.all():
                idx, keys = idx[keep], keys[keep]
            if len(keys):
                out.append((run.source, idx, keys))
                room -= len(keys)
        return out

    def queued(self, key: int) -> bool:
        """Whether the position ``key`` waits in the read-ahead queue."""
        for run in self._ready:
            if run.keys[run.pos] <= key <= run.keys[-1]:
                i = int(np.searchsorted(run.keys, key))
                if i < len(run.keys) and int(run.keys[i]) == key:
                    return True
        return False

    def has_ready(self) -> bool:
        return bool(self._ready)

    def wanted_mark(self) -> Position | None:
        """Where the dispatch mark must move before the read-ahead queue can go on (None:
        it need not move). The owner persists it first, then sets the dispatch mark."""
        if not self._ready:
            return None
        run = self._ready[0]
        head = int(run.keys[run.pos])
        if head < key_of(*self._marks.dispatch_mark):
            return None
        ledger_id, entry_id = position_of(head)
        return (ledger_id, entry_id + DISPATCH_MARK_STEP)

    def _cancels(self) -> Cancels:
        assert self.cancels is not None, "LogReading used before its owner wired it"
        return self.cancels
