"""A shared subscription's view of the host's unsealed index (pure: no Ray).

With sealed buckets, entries not due when committed are the host's to index: the
subscription reads only stand-ins for them from the log, and takes the due rows, with
their payloads, from the host's unsealed index by a due query (:class:`TailQuery`). This
module decides when to ask, keeps what the answers said (what was taken, what is still
waiting, the earliest deliver_at to come), and holds the rows an answer brought before
they fall due (the lookahead) until their instant, never before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from raydelay.dispatch.ports import TailQuery
from raydelay.log.entries import Rows
from raydelay.positions import SHIFT

# How soon the host's unsealed index is asked after new delayed rows were read (for the
# counts and new buckets; a due row is asked for at its deliver_at, whatever this is).
TAIL_POLL_MS = 1_000
# ... unless nothing read there falls due within a lookahead and no bucket was sealed since
# the last answer: the counts are kept from the reads meanwhile, and a row coming due is
# asked for at its time anyway. A steady stream of messages due later then costs each
# subscription a log read a second, not a read and a query.
TAIL_IDLE_POLL_MS = 10_000

# stages rows (rows, their indexes, their position keys); returns how many it took
Stage = Callable[[Rows, np.ndarray, np.ndarray], int]


class _Early:
    """Rows an answer brought before they fall due (the lookahead), held with their
    payloads: ``order`` sorts them by deliver_at (``d``); from ``pos`` on they are held."""

    __slots__ = ("rows", "order", "d", "pos")

    def __init__(self, rows: Rows) -> None:
        d = rows.entries.deliver_at_ms
        self.order = np.argsort(d, kind="stable")
        self.rows, self.d, self.pos = rows, d[self.order], 0

    def __len__(self) -> int:
        return len(self.d) - self.pos


class UnsealedTail:
    """What a subscription took from the host's unsealed index, and what waits there."""

    def __init__(self, *, lookahead_ms: int) -> None:
        # Every row below taken[0] due at or before taken[1] was taken. next_ms: the
        # earliest deliver_at still to come there (None: unknown); dirty: delayed rows
        # were read from the log since the last query.
        self.taken: tuple[int, int] = (0, -1)
        self.next_ms: int | None = None
        self.dirty = True
        self.waiting = 0
        # Delayed rows read from the log that the last answer did not cover (at or past
        # its taken_below, in ledgers not adopted as sealed): (first position key, the key
        # after the last, rows), in log order, and their sum. They count as delayed at
        # once: the next answer's ``waiting`` takes them over.
        self._unasked: deque[tuple[int, int, int]] = deque()
        self.unasked_rows = 0
        self.buckets_stale = False  # the host's bucket list changed since the last query
        self.lookahead_ms = lookahead_ms
        self._early: deque[_Early] = deque()
        # the earliest deliver_at read from the log since the last query was asked: its
        # answer may not cover those rows, so it must not hide them (next_ms)
        self._seen: int | None = None
        self._asked_ms: int | None = None  # the last due query
        self._in_flight = False
        # whether the host answered a due query yet: until then ``waiting`` is not known
        # (after a restart, the host may still be rebuilding its index from the log)
        self.answered = False

    # --- what the log reader saw --------------------------------------------------------------

    def read(self, soonest: int, first_key: int = -1, end_key: int = -1, count: int = 0) -> None:
        """Delayed rows the host indexed were read from the log, the soonest due at
        ``soonest`` (epoch ms): the unsealed index holds something to ask for. ``count``
        of them lie from position key ``first_key`` to before ``end_key``, read in
        sequence (counted as delayed until an answer covers them)."""
        if count > 0:
            self._unasked.append((first_key, end_key, count))
            self.unasked_rows += count
            # (rows below the last answer's taken_below are in its ``waiting`` already: the
            # host indexes what is committed, the read may come after the answer)
            self.forget_unasked(below=self.taken[0])
        self.next_ms = soonest if self.next_ms is None else min(self.next_ms, soonest)
        self._seen = soonest if self._seen is None else min(self._seen, soonest)
        self.dirty = True

    def forget_unasked(self, below: int = -1, through_ledger: int = -1) -> None:
        """Stop counting the delayed rows read that another count holds now: those below
        position key ``below`` (an answer's ``waiting`` covers them) or in a ledger up to
        ``through_ledger`` (an adopted bucket holds them). A stand-in for consecutive
        objects may straddle ``below``: its rows from there on stay counted."""
        q = self._unasked
        while q:
            first, end, count = q[0]
            whole = end - first == count  # (entries one after another, not one object's)
            if first >> SHIFT <= through_ledger or end <= below or (first < below and not whole):
                q.popleft()
                self.unasked_rows -= count
            elif first < below:
                q[0] = (below, end, end - below)
                self.unasked_rows -= below - first
                break
            else:
                break

    # --- asking -------------------------------------------------------------------------------

    def refill_ms(self) -> int | None:
        """When to ask next (epoch ms): half a lookahead before the earliest deliver_at
        there, so that each query brings about half a lookahead of rows, before they fall
        due."""
        if self.next_ms is None:
            return None
        return self.next_ms - self.lookahead_ms // 2

    def poll_ms(self) -> int | None:
        """When delayed rows read since the last query make it worth asking again (epoch
        ms; None: nothing read since, or never asked)."""
        if not self.dirty or self._asked_ms is None:
            return None
        stale = self.buckets_stale or self.refill_ms() is None
        return self._asked_ms + (TAIL_POLL_MS if stale else TAIL_IDLE_POLL_MS)

    def query(self, now_ms: int) -> TailQuery | None:
        """The due query to send now, if one is due: half a lookahead before the earliest
        deliver_at there, or a while after delayed rows were read. It asks for every row
        due within the lookahead."""
        if self._in_flight:
            return None
        refill = self.refill_ms()
        due = refill is not None and refill <= now_ms
        since = None if self._asked_ms is None else now_ms - self._asked_ms
        poll_ms = TAIL_POLL_MS if self.buckets_stale or refill is None else TAIL_IDLE_POLL_MS
        polled = since is None or since >= poll_ms
        if not due and not (self.dirty and polled):
            return None
        self.dirty = self.buckets_stale = False
        self._seen = None
        self._asked_ms = now_ms
        self._in_flight = True
        below, through = self.taken
        return TailQuery(below, through, now_ms + self.lookahead_ms)

    def failed(self) -> None:
        """The due query failed: ask again at the next poll."""
        self._in_flight = False
        self.dirty = True

    def answer(self, rows: Rows, below: int, through_ms: int, next_d: int, waiting: int) -> int:
        """Take in the host's answer to a due query (see ``TopicIndex.due``) for the rows
        due by ``through_ms`` (the query's ``now_ms``); returns the rows taken. They are
        held until they are due (:meth:`release`)."""
        self._in_flight = False
        self.answered = True
        self.taken = (max(self.taken[0], int(below)), max(self.taken[1], int(through_ms)))
        nxt = [t for t in (None if next_d < 0 else int(next_d), self._seen) if t is not None]
        self.next_ms = min(nxt) if nxt else None
        self._seen = None
        self.waiting = int(waiting)
        self.forget_unasked(below=self.taken[0])
        if not len(rows):
            return 0
        self._early.append(_Early(rows))
        return len(rows)

    # --- the rows held ------------------------------------------------------------------------

    def release(self, now_ms: int, room: int, stage: Stage) -> int:
        """Stage up to ``room`` held rows due at ``now_ms`` (deliver_at <= now: never
        early); returns how many were staged."""
        staged = 0
        for early in list(self._early):
            if room <= 0:
                break
            n = min(int(np.searchsorted(early.d, now_ms, "right")) - early.pos, room)
            if n <= 0:
                continue
            idx = early.order[early.pos : early.pos + n]
            early.pos += n
            room -= n
            staged += stage(early.rows, idx, early.rows.positions[idx])
            if not len(early):
                self._early.remove(early)
        return staged

    def holds(self) -> bool:
        return bool(self._early)

    def held_due(self, now_ms: int) -> bool:
        return any(int(e.d[e.pos]) <= now_ms for e in self._early)

    def held_times(self) -> list[int]:
        """The earliest deliver_at of each block of rows held."""
        return [int(e.d[e.pos]) for e in self._early]

    def held_due_ms(self, key: int) -> int | None:
        """The deliver_at of the position ``key`` if a row of it is held here, else None."""
        for e in self._early:
            keys = e.rows.positions[e.order[e.pos :]]
            hit = np.flatnonzero(keys == key)
            if len(hit):
                return int(e.d[e.pos + int(hit[0])])
        return None

    def held_rows(self) -> list[Rows]:
        """The rows held, a copy taken at one moment (a peek)."""
        return [e.rows.take(e.order[e.pos :]) for e in self._early if len(e)]

    def held_counts(
        self, now_ms: int, settled: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[int, int]:
        """Of the rows held here: how many are not due at ``now_ms`` and not settled, and
        how many are settled (``settled`` masks the settled ones of a key column)."""
        waiting = gone = 0
        for e in self._early:
            keys = e.rows.positions[e.order[e.pos :]]
            out = settled(keys)
            gone += int(out.sum())
            waiting += int(((e.d[e.pos :] > now_ms) & ~out).sum())
        return waiting, gone
