"""The consumers of one subscription on one partition: who they are, their leases, what
each holds unacknowledged, and when it is due back (pure: no Ray).

What a consumer holds is one 64-bit roaring bitmap per consumer (the one record of who
holds what); ack deadlines are bitmaps of the positions handed out together, in deadline
order. Hand-out, ack, nack and expiry are bitmap operations over whole batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64

from raydelay.clock import Clock
from raydelay.delayed.index import bitmap64_values
from raydelay.dispatch.keyshared import SLOTS
from raydelay.errors import ConsumerBusy


@dataclass
class ConsumerState:
    consumer_id: str
    pending: BitMap64  # positions handed to it and not yet acked, nacked or expired
    seen_ms: int = 0  # its last call or heartbeat (its lease runs from there)
    held: np.ndarray | None = None  # key_shared: per hash slot, how many of pending


class ConsumerTable:
    """The consumers, in the order they came (a FIFO subscription's active one is the
    oldest), and the ack deadlines of what they hold."""

    def __init__(
        self,
        *,
        name: str,
        clock: Clock,
        exclusive: bool,
        spread: bool,
        keyed: bool,
        ack_timeout_ms: int | None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._exclusive, self._spread, self._keyed = exclusive, spread, keyed
        self.ack_timeout_ms = ack_timeout_ms
        self._consumers: dict[str, ConsumerState] = {}
        # [deadline_ms, positions handed out with it], ascending; a position is in at most
        # one (it leaves when it stops being in flight other than by an ack)
        self._deadlines: list[list] = []
        self.version = 0  # moves when a consumer comes or goes (key_shared's ring follows)
        # key_shared: the hash slots of positions (set by the key pool)
        self.slots_known: Callable[[np.ndarray], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._consumers)

    def add(self, consumer_id: str, now_ms: int | None = None) -> None:
        if consumer_id in self._consumers:
            self.touch(consumer_id, now_ms)
            return
        if self._exclusive and self._consumers:
            raise ConsumerBusy(
                f"subscription {self.name!r} is exclusive and already has a consumer"
            )
        seen = self._clock.now_ms() if now_ms is None else now_ms
        held = np.zeros(SLOTS, dtype=np.int32) if self._keyed else None
        self._consumers[consumer_id] = ConsumerState(consumer_id, BitMap64(), seen, held)
        self.version += 1

    def touch(self, consumer_id: str, now_ms: int | None = None) -> bool:
        """The consumer called or sent a heartbeat: its lease starts again. False if it is
        not a consumer here (never added, or removed)."""
        c = self._consumers.get(consumer_id)
        if c is None:
            return False
        c.seen_ms = max(c.seen_ms, self._clock.now_ms() if now_ms is None else now_ms)
        return True

    def lapsed(self, now_ms: int, lease_ms: int) -> list[str]:
        """The consumers not heard from for ``lease_ms`` at ``now_ms`` (epoch ms)."""
        return [c.consumer_id for c in self._consumers.values() if now_ms - c.seen_ms > lease_ms]

    def leases(self, now_ms: int) -> dict[str, dict]:
        """Per consumer: messages it holds unacked and ms since it was last heard from."""
        return {
            cid: {"unacked": len(c.pending), "lease_age_ms": max(0, now_ms - c.seen_ms)}
            for cid, c in self._consumers.items()
        }

    def lease_end_ms(self, lease_ms: int | None) -> int | None:
        """When the first lease lapses (epoch ms; None: no lease, or no consumer)."""
        if lease_ms is None or not self._consumers:
            return None
        return min(c.seen_ms for c in self._consumers.values()) + lease_ms + 1

    def pop(self, consumer_id: str) -> ConsumerState | None:
        """Forget a consumer; returns it (what it held is the caller's to hand back)."""
        c = self._consumers.pop(consumer_id, None)
        self.version += 1
        return c

    def get(self, consumer_id: str) -> ConsumerState | None:
        return self._consumers.get(consumer_id)

    def ids(self) -> list[str]:
        return list(self._consumers)

    def active(self) -> str | None:
        """The consumer a FIFO subscription delivers to (the oldest one)."""
        return next(iter(self._consumers), None)

    def can_receive(self, consumer_id: str) -> bool:
        if consumer_id not in self._consumers:
            return False
        return self._spread or consumer_id == self.active()

    # --- what they hold -------------------------------------------------------------------

    def hold(self, consumer_id: str, keys: np.ndarray, bm: BitMap64, now_ms: int) -> None:
        """``keys`` (``bm``, their bitmap) go to ``consumer_id`` at ``now_ms``: it holds them
        until an ack, a nack, its leaving or their ack deadline."""
        c = self._consumers[consumer_id]
        c.pending |= bm
        if c.held is not None:
            slots = self._slots(keys)
            np.add.at(c.held, slots[slots >= 0], 1)
        if self.ack_timeout_ms:
            deadline = now_ms + self.ack_timeout_ms
            if self._deadlines and self._deadlines[-1][0] == deadline:
                self._deadlines[-1][1] |= bm
            elif not self._deadlines or self._deadlines[-1][0] < deadline:
                self._deadlines.append([deadline, bm])
            else:  # the clock stepped back: keep the list in deadline order
                bisect.insort(self._deadlines, [deadline, bm], key=lambda x: x[0])

    def take_back(self, c: ConsumerState, bm: BitMap64) -> BitMap64:
        """Remove ``bm`` from what ``c`` holds; returns what it held of it."""
        hit = c.pending & bm
        if hit:
            c.pending -= hit
            if c.held is not None:
                slots = self._slots(bitmap64_values(hit))
                np.subtract.at(c.held, slots[slots >= 0], 1)
        return hit

    def release(self, bm: BitMap64) -> None:
        """``bm`` was acknowledged: no consumer holds it any more."""
        for c in self._consumers.values():
            if c.pending:
                self.take_back(c, bm)

    def expire(self, now_ms: int) -> list[BitMap64]:
        """Ack timeouts at ``now_ms`` (epoch ms): takes back the deliveries past their
        deadline and returns them, a bitmap per consumer and deadline, in deadline order."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, bm = self._deadlines.pop(0)
            for c in self._consumers.values():
                hit = self.take_back(c, bm)
                if hit:
                    out.append(hit)
        return out

    def forget_deadlines(self, bm: BitMap64) -> None:
        """``bm`` is no longer in flight (nacked, consumer gone): drop it from the deadlines,
        so that an expiry cannot take back a later delivery of the same positions."""
        for entry in self._deadlines:
            entry[1] -= bm
        self._deadlines = [e for e in self._deadlines if e[1]]

    def next_deadline_ms(self) -> int | None:
        return self._deadlines[0][0] if self._deadlines else None

    def in_flight(self, key: int) -> bool:
        return any(key in c.pending for c in self._consumers.values())

    def held_by_another(self, key: int, consumer_id: str) -> bool:
        return any(cid != consumer_id and key in c.pending for cid, c in self._consumers.items())

    def all_held(self) -> BitMap64:
        """Every position some consumer holds."""
        out = BitMap64()
        for c in self._consumers.values():
            out |= c.pending
        return out

    def pending_count(self) -> int:
        return sum(len(c.pending) for c in self._consumers.values())

    def blocked_slots(self, consumer_id: str) -> np.ndarray | None:
        """key_shared: the hash slots other consumers hold messages of unacknowledged (a
        bool per slot; None: none)."""
        others = [
            c.held
            for cid, c in self._consumers.items()
            if cid != consumer_id and c.pending and c.held is not None
        ]
        if not others:
            return None
        blocked = np.zeros(SLOTS, dtype=bool)
        for held in others:
            blocked |= held > 0
        return blocked

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        assert self.slots_known is not None, "key_shared without a key pool"
        return self.slots_known(keys)
