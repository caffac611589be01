"""Cancel markers as one subscription applies them (pure: no Ray).

A cancel appends a durable marker to the log; each subscription applies it as an ack of
its target, once, whether it is applied at the producer's request first or read from the
log first, and both report the same outcome. A target the log read has not reached yet
is kept *ahead* of the read and acknowledged when the read passes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.cursor import Position
from raydelay.dispatch.marks import CursorMarks
from raydelay.dispatch.ports import Tracker
from raydelay.dispatch.redelivery import AckKeys, Redelivery
from raydelay.positions import key_of, position_of

MARKER_MEMORY = 100_000  # outcomes of recent cancel markers, for the caller who asks


class Cancels:
    """The outcomes of recent markers, and the targets cancelled ahead of the read."""

    def __init__(
        self,
        *,
        marks: CursorMarks,
        consumers: ConsumerTable,
        redelivery: Redelivery,
        tracker: Tracker,
        counters: dict[str, int],
        read_position: Callable[[], Position],
        ack_keys: AckKeys,
        settle: Callable[[int], None] = lambda key: None,
    ) -> None:
        """``settle``: called with a target read already that the tracker did not hold,
        before it is acknowledged (a delayed store may still count it: see
        :mod:`raydelay.dispatch.settled`)."""
        self._marks = marks
        self._consumers = consumers
        self._redelivery = redelivery
        self._tracker = tracker
        self._counters = counters
        self._read_position = read_position
        self._ack_keys = ack_keys
        self._settle = settle
        self.ahead = BitMap64()  # cancel targets not read from the log yet
        self._results: OrderedDict[int, bool] = OrderedDict()  # marker -> outcome

    def cancel(self, ledger_id: int, entry_id: int, marker: Position) -> bool:
        """Apply the cancel marker at ``marker`` of the position (ledger_id, entry_id). True if
        it kept the message from being delivered; False if it was delivered (or acknowledged)
        already."""
        return self.apply(key_of(*marker), key_of(ledger_id, entry_id))

    def states(self, positions: Iterable[tuple[int, int]]) -> list[str]:
        """Where each position stands in this subscription, changing nothing:
        ``"acked"`` (acknowledged: consumed, or cancelled once read), ``"cancelled"``
        (cancelled ahead of the read), ``"dead"`` (dead-lettered), ``"held"`` (delivered
        to a consumer and not acknowledged), or ``"waiting"`` (not delivered yet, or back
        for a redelivery)."""
        out = []
        for lg, e in positions:
            k = key_of(int(lg), int(e))
            if k in self._redelivery.dead:
                out.append("dead")
            elif self._marks.cursor.is_acked(lg, e):
                out.append("acked")
            elif k in self.ahead:
                out.append("cancelled")
            elif self._consumers.in_flight(k):
                out.append("held")
            else:
                out.append("waiting")
        return out

    def learn(self, pairs: Iterable[tuple[Position, Position]], start: Position) -> int:
        """Take in the log's (marker, target) pairs from ``start`` on (at startup, before
        anything is delivered): their targets will never be delivered. Returns how many."""
        n = 0
        for marker, target in pairs:
            if tuple(marker) >= start:
                self.apply(key_of(*marker), key_of(*target))
                n += 1
        return n

    def apply(self, marker_key: int, target_key: int) -> bool:
        known = self._results.get(marker_key)
        if known is not None:
            return known
        result = self._apply(target_key)
        self._results[marker_key] = result
        while len(self._results) > MARKER_MEMORY:
            self._results.popitem(last=False)
        return result

    def _apply(self, k: int) -> bool:
        lg, e = position_of(k)
        if (
            self._marks.cursor.is_acked(lg, e)
            or self._consumers.in_flight(k)
            or k in self._redelivery.dead
        ):
            return False
        if self._redelivery.delivered_before(k):
            return False  # delivered before and waiting for a redelivery
        if (lg, e) >= self._read_position():
            if k in self.ahead:
                return False  # a second cancel, as for one already applied: counted once
            self.ahead.add(k)
            self._counters["cancelled"] += 1
            return True
        self._counters["cancelled"] += 1
        if not self._tracker.remove_message(lg, e):
            self._settle(k)
        self._ack_keys(np.array([k], dtype=np.int64))  # out of the redelivery set, read-ahead
        return True

    def read_jumped(self, before: Position, after: Position) -> None:
        """At startup the read jumped from ``before`` to ``after``, past the buckets. The
        markers they carry, applied on adoption, left their targets cancelled ahead of a
        read that will never pass them: they are acknowledged now (else they hold
        mark-delete and, unacknowledged in the cursor, the buckets of their markers: see
        ``BucketAdoption.progress``)."""
        if after > before and self.ahead:
            skipped = BitMap64()
            skipped.add_range(max(0, key_of(*before)), key_of(*after))  # (-1: none read)
            self.passed(skipped)

    def passed(self, keys: np.ndarray | BitMap64) -> None:
        """The read passed ``keys`` (sorted keys, or their bitmap): those cancelled ahead
        of it are acknowledged now."""
        if not self.ahead:
            return
        bm = keys if isinstance(keys, BitMap64) else bitmap64_of(keys)
        done = bm & self.ahead
        if done:
            self.ahead -= done
            self._ack_keys(bitmap64_values(done))  # (counted as acked, as any cancel is)
