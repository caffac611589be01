"""A peek at what one subscription will deliver next (pure: no Ray).

The scheduled messages not delivered yet, in delivery order, from every place they wait
(see :mod:`raydelay.dispatch.peek` for the range and the order): held here (rows answered
ahead, staged rows, nacks in the tracker), in the host's unsealed index, and in sealed
segments not loaded. Nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.delayed.reader import SealedReader
from raydelay.delayed.sealed import SealedMeta
from raydelay.dispatch.cancels import Cancels
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.marks import CursorMarks
from raydelay.dispatch.peek import NO_LIMIT, PeekRange, SegmentRef, first_rows, with_deliver_at
from raydelay.dispatch.ports import Fetch, ReadSegments, ReadUnsealed, Tracker, first_keys
from raydelay.dispatch.redelivery import Redelivery
from raydelay.dispatch.staging import Staging
from raydelay.dispatch.tail import UnsealedTail
from raydelay.errors import InvalidArgument
from raydelay.log.entries import Rows

PEEK_READS = 8  # sealed segments a peek reads at once
PEEK_PAGE = 50_000  # rows a peek asks of the host's unsealed index at a time, without a limit


class Peek:
    """Answers peeks over a subscription's parts."""

    def __init__(
        self,
        *,
        tracker: Tracker,
        sealed: SealedReader | None,
        tail: UnsealedTail,
        staging: Staging,
        redelivery: Redelivery,
        consumers: ConsumerTable,
        marks: CursorMarks,
        cancels: Cancels,
    ) -> None:
        self._tracker = tracker
        self._sealed = sealed
        self._tail = tail
        self._staging = staging
        self._redelivery = redelivery
        self._consumers = consumers
        self._marks = marks
        self._cancels = cancels

    async def peek(
        self,
        q: PeekRange,
        fetch: Fetch,
        read_segments: ReadSegments,
        read_unsealed: ReadUnsealed | None = None,
        unknown: Sequence[SealedMeta] = (),
    ) -> tuple[Rows, np.ndarray]:
        """The next scheduled messages not delivered yet, in delivery order, and how many
        times each was delivered before. ``fetch`` reads payloads of positions from the
        log; ``read_segments`` reads sealed segments not loaded; ``read_unsealed`` asks the
        host's unsealed index (None: not asked). ``unknown``: buckets the host lists that
        are not adopted here yet (their rows are in neither place the subscription looks)."""
        waiting = getattr(self._tracker, "waiting", None)
        if waiting is None:
            raise InvalidArgument(f"peek: the tracker {type(self._tracker).__name__} cannot list")
        # what is held here, taken at one moment (nothing awaits before the last line)
        held: list[Rows] = self._tail.held_rows()
        refs: list[SegmentRef] = []
        if self._sealed is not None:
            loaded, raw = self._sealed.peek_parts(unknown, self._tail.taken)
            held += loaded
            refs = sorted(SegmentRef(*r) for r in raw if q.admits_span(r[0], r[1]))
        ready = self._redelivery.redeliver - self._redelivery.dead
        cap = len(ready) if q.limit == NO_LIMIT else min(len(ready), max(q.limit, 1_000))
        groups, need = self._staging.lookup(first_keys(ready, cap))
        held += [cast(Rows, rows).take(idx) for rows, idx, _ in groups]  # (staged: Rows)
        nacked, nacked_d = waiting(q.due_after, q.due_before, q.limit)
        taken = self._tail.taken
        # held by a consumer or waiting for the dead-letter topic: not shown
        taken_out = BitMap64(self._redelivery.dead) | self._consumers.all_held()
        found = self._select(held, q, taken_out)
        # then the reads: positions without payloads, the host's index, sealed segments
        if len(need) or len(nacked):
            rows = await fetch(np.unique(np.concatenate([need, nacked])))
            parts = [found, rows.take(np.flatnonzero(np.isin(rows.positions, need)))]
            hit = np.isin(nacked, rows.positions)
            if hit.any():  # (a nacked one goes out at its nack's time, not its deliver_at)
                at = np.searchsorted(rows.positions, nacked[hit])
                parts.append(with_deliver_at(rows.take(at), nacked_d[hit]))
            found = self._select(parts, q, taken_out)
        if read_unsealed is not None and self._sealed is not None:
            found = await self._unsealed(found, q, read_unsealed, taken, taken_out)
        i, every = 0, []  # (without a limit, every row read is kept and sorted once)
        while i < len(refs):
            bar = q.bar(found)
            batch: list[SegmentRef] = []
            while (
                i < len(refs) and len(batch) < PEEK_READS and (bar is None or refs[i].min_d <= bar)
            ):
                batch.append(refs[i])
                i += 1
            if not batch:
                break  # (every segment left starts after the answer's last row)
            got = await read_segments(batch)
            parts = [
                self._filter(rows.take(np.flatnonzero(ref.untaken(rows))), q, taken_out)
                for ref, rows in zip(batch, got, strict=True)
            ]
            if q.limit == NO_LIMIT:
                every += parts
            else:
                found = first_rows([found, *parts], q.limit)
        if every:
            found = first_rows([found, *every], q.limit)
        return found, self._redelivery.counts_of(found.positions)

    async def _unsealed(
        self,
        found: Rows,
        q: PeekRange,
        read_unsealed: ReadUnsealed,
        taken: tuple[int, int],
        taken_out: BitMap64,
    ) -> Rows:
        """``found`` with the host's unsealed rows, asked a page at a time until the answer
        is full and the pages pass its last row (rows acknowledged here are left out after
        the host answered, so one page may not be enough)."""
        page = PEEK_PAGE if q.limit == NO_LIMIT else max(q.limit, 1_000)
        start: tuple[int, int] | None = None
        while True:
            rows = await read_unsealed(taken[0], taken[1], q, start, page)
            found = self._select([found, rows], q, taken_out)
            if len(rows) < page:
                return found
            last = (int(rows.entries.deliver_at_ms[-1]), int(rows.positions[-1]))
            bar = q.bar(found)
            if bar is not None and last[0] > bar:
                return found
            start = last

    def _select(self, parts: list[Rows], q: PeekRange, taken_out: BitMap64) -> Rows:
        """The rows of ``parts`` a peek shows (see :meth:`_filter`), sorted, at most its
        limit."""
        return first_rows([self._filter(rows, q, taken_out) for rows in parts], q.limit)

    def _filter(self, rows: Rows, q: PeekRange, taken_out: BitMap64) -> Rows:
        """The rows a peek shows: scheduled (with a deliver_at), in ``q``'s range, neither
        acknowledged nor cancelled, and not in ``taken_out`` (held by a consumer, or
        waiting for the dead-letter topic)."""
        if not len(rows):
            return rows
        # (an immediate message waiting for a consumer is backlog, not schedule; one nacked
        # with a delay comes here with the nack's time)
        keep = q.mask(rows) & (rows.entries.deliver_at_ms >= 0)
        if keep.any():
            keep &= self._marks.unseen(rows.positions, self._cancels.ahead)
        if keep.any() and taken_out:
            hit = taken_out & bitmap64_of(np.sort(rows.positions))
            if hit:
                keep &= ~np.isin(rows.positions, bitmap64_values(hit))
        return rows if keep.all() else rows.take(np.flatnonzero(keep))
