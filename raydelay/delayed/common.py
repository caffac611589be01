"""What both trackers share: argument checks, the cutoff, the rules of adding, and how a
pop is returned (positions or keys)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pyroaring import BitMap64

from raydelay.clock import Clock
from raydelay.delayed.columns import check_deliver_at, check_position, superseded
from raydelay.delayed.index import Membership, RunQueue, sorted_keys, sorted_positions
from raydelay.errors import InvalidArgument

Cols = tuple[np.ndarray, np.ndarray, np.ndarray]


def check_clock(clock: object) -> Clock:
    if not callable(getattr(clock, "now_ms", None)):
        raise InvalidArgument("clock: expected an object with now_ms() (a raydelay.clock.Clock)")
    return clock  # type: ignore[return-value]


def check_positive_int(field: str, value: object, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field}: expected an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgument(f"{field}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def check_max_messages(value: object) -> int:
    return check_positive_int("max_messages", value, allow_zero=True)


class TrackerBase:
    """cutoff = now + tick (default) or now (strict); the add rules both trackers follow."""

    _clock: Clock
    _tick_time_ms: int
    _strict: bool
    _members: Membership
    _queue: RunQueue
    # each tracker's pop: up to max_messages due positions, as (ledger ids, entry ids) parts
    _take_due: Callable[[int], tuple[list[np.ndarray], list[np.ndarray]]]

    def _cutoff(self) -> int:
        now = self._clock.now_ms()
        return now if self._strict else now + self._tick_time_ms

    def reset_tick_time(self, tick_time_ms: int) -> None:
        """Change the tick (milliseconds): the cutoff margin in non-strict mode."""
        self._tick_time_ms = check_positive_int("tick_time_ms", tick_time_ms)

    @property
    def tick_time_ms(self) -> int:
        return self._tick_time_ms

    def add_message(self, ledger_id: int, entry_id: int, deliver_at_ms: int) -> bool:
        """Track a position until ``deliver_at_ms`` (epoch ms). False means: deliver it now."""
        ledger_id, entry_id = check_position(ledger_id, entry_id)
        d = check_deliver_at(deliver_at_ms)
        return bool(self.add_messages([ledger_id], [entry_id], [d])[0])  # type: ignore[attr-defined]

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        ledger_id, entry_id = check_position(ledger_id, entry_id)
        return self._members.contains(ledger_id, entry_id)

    def number_of_delayed_messages(self) -> int:
        return self._members.count

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        return sorted_positions(*self._take_due(max_messages))

    def get_scheduled_keys(self, max_messages: int) -> np.ndarray:
        """:meth:`get_scheduled_messages` as one sorted int64 column of position keys
        (``ledger << 32 | entry``), for callers that work on columns."""
        return sorted_keys(*self._take_due(max_messages))

    def persisted_through(self) -> int:
        """The last ledger whose delayed positions are all in persisted buckets (-1: none).
        Only a store-backed tracker has any; see BucketDelayedDeliveryTracker."""
        return -1

    def tracked_among(self, keys: BitMap64) -> BitMap64:
        """The position keys (``ledger << 32 | entry``) of ``keys`` that are tracked."""
        return self._members.members & keys

    def _pop(
        self, cutoff: int, n: int, refill: Callable[[int], bool] | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Up to ``n`` live due positions from the queue, earliest first; when it runs dry,
        ``refill(room)`` may bring more (True: look again)."""
        out_l: list[np.ndarray] = []
        out_e: list[np.ndarray] = []
        while n > 0:
            got = self._queue.take(cutoff, n)
            if got is None:
                if refill is not None and refill(n):
                    continue
                break
            (d, l, e), _ = got  # noqa: E741
            live_l, live_e = self._members.take(d, l, e)
            out_l.append(live_l)
            out_e.append(live_e)
            n -= len(live_l)
        return out_l, out_e

    def _split_due(
        self, ls: np.ndarray, es: np.ndarray, ds: np.ndarray, result: np.ndarray
    ) -> tuple[Cols, Cols]:
        """Apply the due rule to a batch: due positions (deliver_at < 0 or <= cutoff) are
        marked False in ``result`` and untracked (expiry before dedup); a not-due add that a
        later due add of the same position cancels is dropped, as one-by-one adds would.
        Returns the columns still to add and the (ledger, entry) columns untracked here."""
        due = (ds < 0) | (ds <= self._cutoff())
        if not due.any():
            return (ls, es, ds), (ls[:0], es[:0], ds[:0])
        result[due] = False
        removed = self._members.remove_many(ls[due], es[due])
        untracked = (ls[due][removed], es[due][removed], ds[due][removed])
        keep = ~due & ~superseded(ls, es, due)
        return (ls[keep], es[keep], ds[keep]), untracked


def due_window_counts(
    edges: np.ndarray, exact: list[Cols], members: Membership, spans: list[tuple[int, int, int]]
) -> list[int]:
    """Pending messages per due window: ``len(edges) + 1`` counts, window i holding the
    deliver_at values below ``edges[i]`` (and at or above ``edges[i - 1]``), the last one
    everything later. ``exact`` columns count their live copies; each (min, max, count)
    of ``spans`` (a segment not loaded yet) is spread evenly over [min, max]."""
    out = np.zeros(len(edges) + 1, dtype=np.int64)
    for d, l, e in exact:  # noqa: E741
        if len(d):
            live = d[members.member_mask(d, l, e)]
            out += np.bincount(np.searchsorted(edges, live, side="right"), minlength=len(out))
    for lo, hi, count in spans:
        if count <= 0:
            continue
        bounds = np.concatenate(([lo], np.clip(edges, lo, hi), [hi])).astype(np.float64)
        width = max(hi - lo, 0)
        if width == 0:
            out[int(np.searchsorted(edges, lo, side="right"))] += count
            continue
        shares = np.diff(bounds) / width * count
        whole = np.floor(shares).astype(np.int64)
        rest = count - int(whole.sum())  # hand out what rounding left to the largest shares
        for i in np.argsort(-(shares - whole))[:rest]:
            whole[i] += 1
        out += whole
    return [int(x) for x in out]
