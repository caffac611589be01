"""key_shared dispatch: one key's messages go to one consumer at a time, in order (pure:
no Ray).

Every deliverable row waits in the redelivery set (its payload staged) until its key's
consumer asks. The pool is that set as sorted columns (position keys and their hash
slots, -1 while not known), kept in step with it; at most ``cap`` rows wait there, so
that a consumer that stops asking holds up only its own keys until then. Slot owners
come from a consistent-hash ring of the consumers (:mod:`raydelay.dispatch.keyshared`).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.keyshared import SLOTS, Ring, slots_of
from raydelay.dispatch.ports import Delivery, Group, Source
from raydelay.dispatch.redelivery import Redelivery
from raydelay.dispatch.staging import Staging
from raydelay.log.entries import is_run

KEY_SLOT_CACHE = 1_000_000  # message keys whose hash slot is kept

TakeReady = Callable[[int], list[Group]]  # up to n read-ahead rows below the dispatch mark
HandOut = Callable[[str, Source, np.ndarray, np.ndarray, int], Delivery]


class KeyPool:
    """The hash slot of each position waiting or in flight, the slot owners, and the
    pool of waiting rows a key_shared receive chooses from."""

    def __init__(
        self,
        *,
        consumers: ConsumerTable,
        redelivery: Redelivery,
        staging: Staging,
        take_ready: TakeReady,
        cap: int,
    ) -> None:
        self._consumers = consumers
        self._redelivery = redelivery
        self._staging = staging
        self._take_ready = take_ready
        self.cap = cap
        self.slot: dict[int, int] = {}  # position key -> hash slot
        self._key_slots: dict[str, int] = {}  # message key -> slot, for keys seen lately
        self._ring: Ring | None = None
        self._ring_version = -1  # the consumer table's version the ring was made at
        self._keys = np.zeros(0, dtype=np.int64)
        self._slots = np.zeros(0, dtype=np.int64)
        self._indexed = BitMap64()

    def learn_slots(self, source: Source, idx: np.ndarray, keys: np.ndarray) -> np.ndarray:
        col = source.entries.batch.column(2)
        if is_run(idx):  # no copy
            col = col.slice(int(idx[0]), len(idx))
        else:
            col = col.take(pa.array(idx, type=pa.int64()))
        if len(self._key_slots) > KEY_SLOT_CACHE:
            self._key_slots.clear()
        slots = slots_of(col, self._key_slots)
        self.slot.update(zip(keys.tolist(), slots.tolist()))
        return slots

    def slots_known(self, keys: np.ndarray) -> np.ndarray:
        """The hash slot of each position, -1 where not known yet."""
        ks = keys.tolist()
        if len(ks) > 1:
            try:  # every one known (the usual case): one C-level lookup
                return np.array(itemgetter(*ks)(self.slot), dtype=np.int64)
            except KeyError:
                pass
        get = self.slot.get
        return np.fromiter((get(k, -1) for k in ks), dtype=np.int64, count=len(ks))

    def forget(self, keys: np.ndarray) -> None:
        """``keys`` were acknowledged."""
        if self.slot:
            for k in keys.tolist():
                self.slot.pop(k, None)

    def eligible(self, consumer_id: str, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` ``consumer_id`` may take messages of now: it owns them, and no
        other consumer holds messages of them unacknowledged."""
        if self._ring is None or self._ring_version != self._consumers.version:
            self._ring = Ring(self._consumers.ids())
            self._ring_version = self._consumers.version
        ok = self._ring.owned(consumer_id, slots)
        if ok.any():
            blocked = self._consumers.blocked_slots(consumer_id)
            if blocked is not None:
                ok &= ~blocked[slots]
        return ok

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """The redelivery set's keys (ascending) and their hash slots (-1: not known)."""
        waiting = self._redelivery.redeliver
        gone = self._indexed - waiting
        if gone:
            keep = ~np.isin(self._keys, bitmap64_values(gone))
            self._keys, self._slots = self._keys[keep], self._slots[keep]
            self._indexed -= gone
        new = waiting - self._indexed
        if new:
            keys = bitmap64_values(new)
            keys = np.concatenate([self._keys, keys])
            slots = np.concatenate([self._slots, self.slots_known(bitmap64_values(new))])
            order = np.argsort(keys, kind="stable")
            self._keys, self._slots = keys[order], slots[order]
            self._indexed |= new
        unknown = self._slots < 0
        if unknown.any():  # learned since they came in
            self._slots[unknown] = self.slots_known(self._keys[unknown])
        return self._keys, self._slots

    def fill(self, budget: int) -> int:
        """Move read-ahead rows (below the dispatch mark) into the redelivery set, their
        payloads staged and their slots noted, until it holds ``budget``. Returns how many
        moved."""
        room = budget - len(self._redelivery.redeliver)
        if room <= 0:
            return 0
        moved = 0
        for source, idx, keys in self._take_ready(room):
            self.learn_slots(source, idx, keys)
            self._redelivery.redeliver |= bitmap64_of(keys)
            self._staging.add((source, idx, keys))
            moved += len(keys)
        return moved

    def keys_for(self, consumer_id: str, max_messages: int, read_ahead: int) -> np.ndarray:
        """The positions of ``consumer_id``'s keys (and positions whose key it does not
        know yet) to hand out next, lowest first, after moving read-ahead rows in."""
        self.fill(max(read_ahead, max_messages))
        while True:
            keys, slots = self.index()
            ok = slots < 0
            known = ~ok
            ok[known] = self.eligible(consumer_id, slots[known])
            if int(ok.sum()) >= max_messages:
                break
            # too few for this consumer in what waits (the rest wait for others): read on,
            # as far as the dispatch mark and the pool's cap let
            budget = min(self.cap, len(self._redelivery.redeliver) + read_ahead)
            if not self.fill(budget):
                break
        return keys[ok][:max_messages]

    def deliver(
        self,
        consumer_id: str,
        fetched: list[Group],
        room: int,
        now_ms: int,
        hand_out: HandOut,
    ) -> list[Delivery]:
        """Hand out the fetched rows of ``consumer_id``'s keys, lowest position first. A
        key with a lower position waiting that was not fetched waits (its order first);
        rows left for other consumers stay staged."""
        parts = []
        for g, (source, idx, keys) in enumerate(fetched):
            idx, keys = self._redelivery.still_waiting(idx, keys)
            if not len(keys):
                continue
            slots = self.slots_known(keys)
            if (slots < 0).any():
                slots = self.learn_slots(source, idx, keys)
            parts.append((np.full(len(keys), g), idx, keys, slots))
        if not parts:
            return []
        group, idx, keys, slots = (np.concatenate(c) for c in zip(*parts))
        order = np.argsort(keys, kind="stable")
        group, idx, keys, slots = group[order], idx[order], keys[order], slots[order]
        ok = self.eligible(consumer_id, slots)
        # a key goes out only ahead of its positions still waiting that were not fetched
        # (cut by the fetch, or back in the redelivery set while it was fetched)
        pool_keys, pool_slots = self.index()
        behind = ~np.isin(pool_keys, keys)
        if behind.any():
            b_keys, b_slots = pool_keys[behind], pool_slots[behind]
            unknown = b_slots < 0
            if unknown.any():  # its key could be any: nothing after it may go
                ok &= keys < int(b_keys[unknown].min())
            if not unknown.all():
                first = np.full(SLOTS, np.iinfo(np.int64).max, dtype=np.int64)
                np.minimum.at(first, b_slots[~unknown], b_keys[~unknown])
                ok &= keys < first[slots]
        chosen = np.flatnonzero(ok)[:room]
        # left for others: keep their rows staged, so that their consumer need not read them
        left = np.flatnonzero(~ok)
        if len(left):
            _, need = self._staging.lookup(keys[left])
            if len(need):
                for g in np.unique(group[left]).tolist():
                    sel = left[(group[left] == g) & np.isin(keys[left], need)]
                    if len(sel):
                        self._staging.add((fetched[g][0], idx[sel], keys[sel]))
        if not len(chosen):
            return []
        self._redelivery.redeliver -= bitmap64_of(keys[chosen])
        out = []
        # runs of one source in position order: one Delivery each, so that order holds
        cuts = np.flatnonzero(np.diff(group[chosen])) + 1
        for run in np.split(chosen, cuts):
            source = fetched[int(group[run[0]])][0]
            out.append(hand_out(consumer_id, source, idx[run], keys[run], now_ms))
        return out
