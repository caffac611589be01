"""What goes out again, and what goes to the dead-letter topic instead (pure: no Ray).

- **the redelivery set**: positions the tracker popped, positions whose ack timed out,
  nacked positions whose delay elapsed, the pending positions of consumers that left,
  and due rows of the host's index. A position stays there until a consumer has it, so
  none is lost.
- **counts**: how many times each position was delivered before (only those above zero
  are kept).
- **dead letters**: a position due for its ``max_redeliveries + 1``-th redelivery goes
  to the dead-letter set instead; the subscription publishes it and then acks it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.cursor import Cursor
from raydelay.dispatch.ports import Tracker, keys_of
from raydelay.errors import InvalidArgument
from raydelay.positions import position_of, split_keys


class Redelivery:
    """The redelivery set (:attr:`redeliver`), the dead-letter set (:attr:`dead`) and the
    delivery counts, with the consumer calls that fill them: nack, redeliver, expiry."""

    def __init__(
        self,
        *,
        consumers: ConsumerTable,
        tracker: Tracker,
        cursor: Cursor,
        counters: dict[str, int],
        max_redeliveries: int | None,
        spread: bool,
    ) -> None:
        self._consumers = consumers
        self._tracker = tracker
        self._cursor = cursor
        self._counters = counters
        self.max_redeliveries = max_redeliveries
        self._spread = spread
        self.redeliver = BitMap64()
        self.dead = BitMap64()
        self._counts: dict[int, int] = {}  # key -> deliveries so far, once above zero
        self._counted = BitMap64()  # the keys of _counts, for batch lookups

    # --- counts ---------------------------------------------------------------------------

    def counts_of(self, keys: np.ndarray, bm: BitMap64 | None = None) -> np.ndarray:
        """How many times each position was delivered before (0 for most)."""
        counts = np.zeros(len(keys), dtype=np.int64)
        if self._counted:
            hit = (bm if bm is not None else bitmap64_of(keys)) & self._counted
            if hit:
                where = np.flatnonzero(np.isin(keys, bitmap64_values(hit)))
                counts[where] = [self._counts[k] for k in keys[where].tolist()]
        return counts

    def bump(self, keys: np.ndarray, floor: int | None = None) -> np.ndarray:
        """Raise the delivery counts of ``keys`` by one (or, with ``floor``, to at least
        that); returns the new counts."""
        new = self.counts_of(keys)
        new = np.maximum(new, floor) if floor is not None else new + 1
        self._counts.update(zip(keys.tolist(), new.tolist()))
        self._counted |= bitmap64_of(keys)
        return new

    def delivered_before(self, key: int) -> bool:
        return self._counts.get(key, 0) > 0

    def forget(self, bm: BitMap64) -> None:
        """``bm`` was acknowledged: out of the sets and the counts."""
        if self._counted:
            done = self._counted & bm
            if done:
                for k in done:
                    del self._counts[k]
                self._counted -= done
        if self.redeliver:
            self.redeliver -= bm
        if self.dead:
            self.dead -= bm

    # --- going out again --------------------------------------------------------------------

    def to_dead_letters(self, keys: np.ndarray) -> np.ndarray:
        """Move the positions that used up ``max_redeliveries`` to the dead-letter set;
        returns the others."""
        if self.max_redeliveries is None:
            return keys
        over = self.counts_of(keys) >= self.max_redeliveries
        if over.any():
            self.dead |= bitmap64_of(keys[over])
        return keys[~over]

    def schedule(self, bm: BitMap64) -> None:
        """``bm`` goes out again now (or to the dead letters), its counts raised."""
        ks = self.to_dead_letters(bitmap64_values(bm))
        if len(ks):
            self.bump(ks)
            self._counters["redelivered"] += len(ks)
            self.redeliver |= bitmap64_of(ks)

    def expire(self, now_ms: int) -> int:
        """Ack timeouts: unacked deliveries past their deadline go back for redelivery."""
        n = 0
        for hit in self._consumers.expire(now_ms):
            self.schedule(hit)
            n += len(hit)
        return n

    def hand_back(self, consumer_id: str) -> int:
        """Forget a consumer; its unacked messages go to the redelivery set."""
        c = self._consumers.pop(consumer_id)
        if c is None or not c.pending:
            return 0
        self._consumers.forget_deadlines(c.pending)
        self.schedule(c.pending)
        return len(c.pending)

    def nack(
        self, consumer_id: str, keys: Iterable[int] | np.ndarray, delay_ms: int, now_ms: int
    ) -> int:
        """Give positions back: redeliver after ``delay_ms`` (milliseconds), through the tracker.
        Only positions ``consumer_id`` holds are taken back."""
        c = self._consumers.get(consumer_id)
        if c is None:
            return 0
        held = self._consumers.take_back(c, bitmap64_of(keys_of(keys)))
        if not held:
            return 0
        self._consumers.forget_deadlines(held)
        if delay_ms <= 0:
            self.schedule(held)
            return len(held)
        later = self.to_dead_letters(bitmap64_values(held))
        if len(later):
            self.bump(later)
            tracked = self._tracker.add_messages(
                *split_keys(later), np.full(len(later), now_ms + delay_ms, np.int64)
            )
            if not tracked.all():
                self.redeliver |= bitmap64_of(later[~tracked])
        return len(held)

    def redeliver_unacked(
        self, consumer_id: str, keys: np.ndarray | None = None, dry_run: bool = False
    ) -> int:
        """Pulsar's ``redeliverUnacknowledgedMessages``: hand messages ``consumer_id`` holds
        unacked back for redelivery now, ``redelivery_count`` raised. ``keys`` None: all it
        holds. A shared subscription takes back only ``keys``; exclusive and failover rewind:
        everything the consumer holds goes out again first, in log order. A key held by
        another consumer or acknowledged already is an :class:`InvalidArgument` naming it,
        and nothing is handed back; a key unacknowledged and held by no consumer (a
        restarted subscription forgot who had it) is on its way again already. ``dry_run``:
        only check, and count what would go back."""
        c = self._consumers.get(consumer_id)
        held = c.pending if c is not None else BitMap64()
        if keys is not None:
            wanted = bitmap64_of(keys_of(keys))
            others = wanted - held
            bad = [
                (int(k), why)
                for k in bitmap64_values(others)
                if (why := self._not_redeliverable(int(k), consumer_id)) is not None
            ]
            if bad:
                shown = ", ".join(
                    f"{position_of(k)[0]}:{position_of(k)[1]} ({why})" for k, why in bad[:5]
                )
                more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
                raise InvalidArgument(
                    f"msgs: not held unacknowledged by this consumer: {shown}{more}"
                )
            if self._spread:
                held = wanted & held
        if c is None or not held or dry_run:
            return len(held) if c is not None else 0
        held = self._consumers.take_back(c, BitMap64(held))
        self._consumers.forget_deadlines(held)
        self.schedule(held)
        return len(held)

    def _not_redeliverable(self, key: int, consumer_id: str) -> str | None:
        """Why ``key`` cannot be redelivered on behalf of ``consumer_id`` (None: it can)."""
        ledger_id, entry_id = position_of(key)
        if self._cursor.is_acked(ledger_id, entry_id):
            return "acknowledged"
        if self._consumers.held_by_another(key, consumer_id):
            return "held by another consumer"
        return None

    def still_waiting(self, idx: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fetched rows still in the redelivery set (another receive, an ack or a
        cancel may have taken some while they were fetched)."""
        waiting = bitmap64_of(keys) & self.redeliver
        if len(waiting) < len(keys):
            keep = np.isin(keys, bitmap64_values(waiting))
            idx, keys = idx[keep], keys[keep]
        return idx, keys


AckKeys = Callable[[np.ndarray], int]  # acknowledges position keys everywhere; returns how many
