"""InMemoryDelayedDeliveryTracker: every tracked position in memory, as numpy runs.

The reference tracker (Pulsar's original design, without its per-message
objects): positions live in the shared RunQueue, membership in roaring bitmaps.
It also implements Pulsar's fixed-delay detection: when every message so far
came with a non-decreasing deliver_at (within one tick) and enough are tracked,
``should_pause_all_deliveries`` tells the dispatcher to stop reading the log,
since anything read next would be due later still.
"""

from __future__ import annotations

import numpy as np

from raydelay.clock import Clock
from raydelay.delayed.columns import check_position, check_positions
from raydelay.delayed.common import (
    TrackerBase,
    check_clock,
    check_max_messages,
    check_positive_int,
    due_window_counts,
)
from raydelay.delayed.index import Membership, RunQueue
from raydelay.positions import position_keys


class InMemoryDelayedDeliveryTracker(TrackerBase):
    def __init__(
        self,
        *,
        clock: Clock,
        tick_time_ms: int = 1000,
        strict: bool = False,
        fixed_delay_lookahead: int = 50_000,
    ) -> None:
        self._clock = check_clock(clock)
        self._tick_time_ms = check_positive_int("tick_time_ms", tick_time_ms)
        self._strict = bool(strict)
        self._lookahead = check_positive_int(
            "fixed_delay_lookahead", fixed_delay_lookahead, allow_zero=True
        )
        self._members = Membership()
        self._queue = RunQueue()
        self._highest_deliver_at = -1
        self._fixed_delay = True

    # -- adding ----------------------------------------------------------------------

    def add_messages(self, ledger_ids, entry_ids, deliver_ats) -> np.ndarray:
        ls, es, ds = check_positions(ledger_ids, entry_ids, deliver_ats)
        result = np.ones(len(ls), dtype=bool)
        if len(ls) == 0:
            return result
        (ls, es, ds), _ = self._split_due(ls, es, ds, result)
        if not result.all():
            self._fixed_delay = False  # an immediate message ends the fixed-delay state
        if len(ls):
            self._track_fixed_delay(ds)
            new = self._members.add(ds, ls, es)
            if new.all():
                self._queue.add_loose(ds, ls, es)
            elif new.any():
                self._queue.add_loose(ds[new], ls[new], es[new])
        return result

    def _track_fixed_delay(self, ds: np.ndarray) -> None:
        # Each deliver_at must be no lower than the highest seen before it, within one tick.
        running = np.maximum.accumulate(np.concatenate(([self._highest_deliver_at], ds)))
        if (ds < running[:-1] - self._tick_time_ms).any():
            self._fixed_delay = False
        self._highest_deliver_at = int(running[-1])

    def due_histogram(self, edges: np.ndarray) -> list[int]:
        """Pending messages per due window (see :func:`due_window_counts`)."""
        return due_window_counts(
            np.asarray(edges, dtype=np.int64), self._queue.columns(), self._members, []
        )

    def waiting(
        self, due_after: int | None = None, due_before: int | None = None, limit: int = -1
    ) -> tuple[np.ndarray, np.ndarray]:
        """The tracked positions (int64 keys) and their deliver_at (epoch ms), earliest
        first, due at or after ``due_after`` and before ``due_before`` (None: open), at
        most ``limit`` of them (-1: all). Nothing changes (a peek)."""
        ks, ds = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        for d, l, e in self._queue.columns():  # noqa: E741
            if not len(d):
                continue
            keep = self._members.member_mask(d, l, e)
            if due_after is not None:
                keep &= d >= due_after
            if due_before is not None:
                keep &= d < due_before
            ks.append(position_keys(l[keep], e[keep]))
            ds.append(np.asarray(d[keep], dtype=np.int64))
        keys, d = np.concatenate(ks), np.concatenate(ds)
        order = np.lexsort((keys, d))
        _, first = np.unique(keys[order], return_index=True)
        order = order[np.sort(first)]
        if limit != -1:
            order = order[:limit]
        return keys[order], d[order]

    # -- popping ---------------------------------------------------------------------

    def _take_due(self, max_messages: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        n = check_max_messages(max_messages)
        cutoff = self._cutoff()
        out_l, out_e = self._pop(cutoff, n)
        if self._members.count == 0:
            self._queue.clear()  # only stale copies can remain
            self._highest_deliver_at = -1
            self._fixed_delay = True
        return out_l, out_e

    def has_message_available(self) -> bool:
        return self._queue.has_live_due(self._cutoff(), self._members)

    # -- queries ---------------------------------------------------------------------

    def buffer_memory_usage(self) -> int:
        return self._queue.nbytes() + self._members.nbytes()

    def should_pause_all_deliveries(self) -> bool:
        return (
            self._lookahead > 0
            and self._fixed_delay
            and self._members.count >= self._lookahead
            and not self.has_message_available()
        )

    def next_delivery_time(self) -> int | None:
        if self._members.count == 0:
            return None
        return self._queue.min_d()

    def remove_message(self, ledger_id: int, entry_id: int) -> bool:
        ledger_id, entry_id = check_position(ledger_id, entry_id)
        return self._members.remove(ledger_id, entry_id)

    def clear(self) -> None:
        self._members.clear()
        self._queue.clear()
        self._highest_deliver_at = -1
        self._fixed_delay = True

    def flush(self) -> None:
        """Nothing runs in the background here."""

    def close(self) -> None:
        self.clear()

    def __repr__(self) -> str:
        return (
            f"InMemoryDelayedDeliveryTracker(delayed={self._members.count}, strict={self._strict})"
        )
