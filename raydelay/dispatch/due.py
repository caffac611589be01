"""Due messages, moved into the redelivery set as they fall due (pure: no Ray).

Three places hold messages not due yet: the tracker (positions only: nacks, and delayed
messages without sealed buckets), the sealed buckets' loaded segments and the rows the
unsealed index answered ahead (both with payloads, staged when due). :class:`DueRows`
collects from all three, never early.
"""

from __future__ import annotations

import numpy as np

from raydelay.delayed.index import bitmap64_of
from raydelay.delayed.reader import SealedReader
from raydelay.dispatch.cancels import Cancels
from raydelay.dispatch.keypool import KeyPool
from raydelay.dispatch.marks import CursorMarks
from raydelay.dispatch.ports import Group, Tracker
from raydelay.dispatch.redelivery import Redelivery
from raydelay.dispatch.settled import SettledDelayed
from raydelay.dispatch.staging import Staging
from raydelay.dispatch.tail import UnsealedTail
from raydelay.log.entries import Rows
from raydelay.positions import KEY_DTYPE

# a backlog of due sealed-bucket rows is taken this many at a time (see DueRows.collect)
SEALED_WINDOW = 50_000


class DueRows:
    """Collects due delayed messages and stages the ones that come with payloads."""

    def __init__(
        self,
        *,
        tracker: Tracker,
        sealed: SealedReader | None,
        tail: UnsealedTail,
        staging: Staging,
        redelivery: Redelivery,
        marks: CursorMarks,
        cancels: Cancels,
        settled: SettledDelayed,
        keys: KeyPool | None,
    ) -> None:
        self._tracker = tracker
        self._sealed = sealed
        self._tail = tail
        self._staging = staging
        self._redelivery = redelivery
        self._marks = marks
        self._cancels = cancels
        self._settled = settled
        self._keys = keys  # key_shared only

    def collect(self, now_ms: int, max_messages: int) -> None:
        """Move due delayed positions into the redelivery set, up to ``max_messages``
        waiting there (key_shared: up to the pool's cap). Due rows of the host's index
        come with their payloads: they are staged for a receive to find."""
        waiting = len(self._redelivery.redeliver)
        if self._keys is not None:
            # (the redelivery set also holds rows waiting for other consumers)
            room = min(max_messages, self._keys.cap - waiting)
        else:
            room = max_messages - waiting
        if self._tail.holds() and room > 0:
            room -= self._tail.release(now_ms, room, self.stage)
        if self._sealed is not None and room > 0:
            # a backlog of due sealed rows is taken a window of SEALED_WINDOW rows at a time,
            # staged for the receives that follow: a take costs about the same for 10k rows
            # as for 50k. A window is whole loaded groups, the one due first first (not the
            # earliest rows over all of them: a merged bucket's groups overlap in time, and
            # a few rows off every one of them would leave hundreds of loaded heads behind,
            # each a slice per take). The next window is taken once this one went out (a
            # receive's top-up takes no more than it hands out).
            want = room
            if not self._redelivery.redeliver and self._keys is None:
                want = max(room, SEALED_WINDOW)
            groups = self._sealed.take_due(now_ms, want, earliest_first=False)
            if len(groups) > 1:  # one staged block: a receive looks up one, not many
                groups = [coalesce(groups)]
            for rows, idx, keys in groups:
                room -= self.stage(rows, idx, keys)
        if room > 0 and self._tracker.has_message_available():
            due = np.asarray(self._tracker.get_scheduled_keys(room), dtype=KEY_DTYPE)
            if len(due):  # (one nacked with a delay may have been acked since)
                due = due[self._marks.unseen(due, self._cancels.ahead)]
                self._redelivery.redeliver |= bitmap64_of(due)

    def stage(self, rows: Rows, idx: np.ndarray, keys: np.ndarray) -> int:
        """Due delayed rows taken from the host's index: into the redelivery set, with
        their payloads staged. Rows acknowledged (or cancelled) are left out; rows an
        earlier life may have delivered get their redelivery_count raised."""
        order = np.argsort(keys)  # (a bitmap builds three times faster from sorted keys)
        idx, keys = idx[order], keys[order]
        bm = bitmap64_of(keys)
        self._settled.popped(bm)  # (the stores count them no more)
        keep = self._marks.unseen(keys, self._cancels.ahead, bm)
        if not keep.all():
            idx, keys = idx[keep], keys[keep]
            bm = bitmap64_of(keys)
        if not len(keys):
            return 0
        delayed_before = self._marks.delayed_before
        if delayed_before >= 0:
            old = rows.entries.deliver_at_ms[idx] <= delayed_before
            if old.any():
                self._redelivery.bump(keys[old], floor=1)
        self._redelivery.redeliver |= bm
        if self._keys is not None:
            self._keys.learn_slots(rows, idx, keys)
        self._staging.add((rows, idx, keys), bm)
        return len(keys)

    def delayed_due(self, now_ms: int) -> bool:
        """Whether a row of the host's index (held here or in a loaded segment) is due at
        ``now_ms``: what :meth:`collect` would stage, which the delayed mark covers."""
        return self._tail.held_due(now_ms) or (
            self._sealed is not None and self._sealed.has_due(now_ms)
        )

    def next_delayed_ms(self) -> int | None:
        """The earliest deliver_at of a row of the host's index not handed out yet (epoch
        ms), as far as this subscription knows; None without sealed buckets or rows."""
        if self._sealed is None:
            return None
        times = [t for t in (self._sealed.next_time(), self._tail.next_ms) if t is not None]
        times += self._tail.held_times()
        return min(times) if times else None

    def has_due(self, now_ms: int) -> bool:
        """Whether something here is due at ``now_ms`` (not counting the redelivery set)."""
        return (
            self._tracker.has_message_available()
            or (self._sealed is not None and self._sealed.has_due(now_ms))
            or (self._tail.holds() and self._tail.held_due(now_ms))
        )


def due_by(groups: list[Group], horizon_ms: int) -> tuple[list[Group], int | None]:
    """Of fetched groups (source, row indexes, position keys), the rows due by
    ``horizon_ms`` (immediate ones and redeliveries of rows due earlier among them), and
    the earliest deliver_at of those left out (None: none was)."""
    out, later = [], None
    for source, idx, keys in groups:
        d = source.entries.deliver_at_ms[idx]
        due = d <= horizon_ms
        if due.all():
            out.append((source, idx, keys))
            continue
        first = int(d[~due].min())
        later = first if later is None else min(later, first)
        if due.any():
            out.append((source, idx[due], keys[due]))
    return out, later


def coalesce(
    groups: list[tuple[Rows, np.ndarray, np.ndarray]],
) -> tuple[Rows, np.ndarray, np.ndarray]:
    """Groups of rows (rows, indexes, keys) as one: their rows copied once, in order (a
    group of consecutive indexes, as the sealed reader hands out, is sliced, not taken)."""
    rows = Rows.join([r.at(idx) for r, idx, _ in groups])
    keys = np.concatenate([k for _, _, k in groups])
    return rows, np.arange(len(keys), dtype=np.int64), keys
