"""Delayed messages handed to a consumer ahead of their due time, held until it comes.

A consumer's receive calls ask the subscription to hand out delayed messages due within
``subscription.handout_ahead_ms`` (:class:`raydelay.client.receiving.Receiver`). The reply
then makes its trip before the due instant, not after it, and the client returns each
message at its instant: the lateness a consumer sees is its own thread's wake-up, not a
round trip through the subscription's actor.

Never early. The due time is the subscription's clock, and this process's clock may
differ. Each reply says when it was made on the subscription's clock (``made_ms``); that
time minus this process's clock when the reply is taken in is at most the clocks' true
offset (the reply took some time to come). The largest of the last few is the estimate,
so a held message is released when this process's clock, plus that estimate, reaches its
due time: never before the subscription's clock does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from raydelay.clock import now_ms as _now_ms

# replies whose made_ms - taken-in time make the clock offset's estimate (the more, the
# likelier one among them came back at once: the estimate is the best of them)
OFFSETS_KEPT = 256


class HeldRows:
    """Rows not due yet, by partition, each block sorted by due time (see the module)."""

    def __init__(self, clock: Callable[[], int] = _now_ms) -> None:
        self._clock = clock
        # (partition, rows sorted by deliver_at, their deliver_at, when their reply was made)
        self._blocks: list[tuple[int, pa.RecordBatch, np.ndarray, int]] = []
        self._offsets: deque[int] = deque(maxlen=OFFSETS_KEPT)
        self.offset_ms: int | None = None  # the subscription's clock minus this one's (<=)

    def __len__(self) -> int:
        return sum(len(d) for _, _, d, _ in self._blocks)

    def _now(self) -> int:
        """The subscription's clock, as far as this process can tell (never ahead of it)."""
        return self._clock() + (self.offset_ms or 0)

    def came(self, made_ms: int, taken_ms: int) -> None:
        """A reply made at ``made_ms`` (the subscription's clock) was there at ``taken_ms``
        (this process's clock): the offset's estimate takes it in."""
        if made_ms > 0:
            self._offsets.append(made_ms - taken_ms)
            self.offset_ms = max(self._offsets)

    def split(self, partition: int, rows: pa.RecordBatch, made_ms: int) -> pa.RecordBatch | None:
        """Take in a reply's rows of ``partition`` (made at ``made_ms``, the subscription's
        clock; :meth:`came` was told when the reply was there): returns those due now
        (None: none), and holds the others."""
        d = rows.column("deliver_at_ms").to_numpy()
        early = d > self._now()
        if not early.any():
            return rows
        if early.all() and (len(d) < 2 or bool((d[1:] >= d[:-1]).all())):
            # (a burst's rows come due together, in order: held as they are, no copy)
            self._hold(partition, rows, d, made_ms)
            return None
        later = np.flatnonzero(early)
        order = later[np.argsort(d[later], kind="stable")]
        self._hold(partition, rows.take(pa.array(order)), d[order], made_ms)
        if len(later) == len(d):
            return None
        return rows.filter(pa.array(~early))

    def _hold(self, partition: int, rows: pa.RecordBatch, d: np.ndarray, made_ms: int) -> None:
        self._blocks.append((partition, rows, d, made_ms))
        self._blocks.sort(key=lambda b: int(b[2][0]))

    def release(self) -> list[tuple[int, pa.RecordBatch, int]]:
        """The held rows due now, as (partition, rows, due time): the time a consumer's
        ``returned`` stage starts from (their reply came before it)."""
        if not self._blocks:
            return []
        now = self._now()
        out: list[tuple[int, pa.RecordBatch, int]] = []
        kept = []
        for p, rows, d, made_ms in self._blocks:
            n = int(np.searchsorted(d, now, side="right"))
            if n:
                out.append((p, rows.slice(0, n), max(made_ms, int(d[n - 1]))))
            if n < len(d):
                kept.append((p, rows.slice(n), d[n:], made_ms))
        self._blocks = kept
        return out

    def wait_s(self) -> float | None:
        """Seconds until the first held row is due (0: one is; None: none is held)."""
        if not self._blocks:
            return None
        return max(0.0, (int(self._blocks[0][2][0]) - self._now()) / 1000)

    def clear(self) -> None:
        self._blocks.clear()
