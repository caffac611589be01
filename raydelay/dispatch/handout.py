"""Handing messages to a consumer, in delivery order (pure: no Ray).

Redeliveries first (which include due delayed messages), then the read-ahead queue. A
key_shared subscription chooses from its key pool instead
(:class:`~raydelay.dispatch.keypool.KeyPool`). Nothing goes to a FIFO subscription's
standby consumer.
"""

from __future__ import annotations

import numpy as np

from raydelay.delayed.index import bitmap64_of
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.keypool import KeyPool
from raydelay.dispatch.ports import Delivery, Group, Source, first_keys
from raydelay.dispatch.reading import LogReading
from raydelay.dispatch.redelivery import Redelivery


class HandOut:
    """Chooses what a receive hands out and records who holds it."""

    def __init__(
        self,
        *,
        consumers: ConsumerTable,
        redelivery: Redelivery,
        reading: LogReading,
        keys: KeyPool | None,
        counters: dict[str, int],
    ) -> None:
        self._consumers = consumers
        self._redelivery = redelivery
        self._reading = reading
        self._keys = keys  # key_shared only
        self._counters = counters

    def keys_to_fetch(self, max_messages: int, consumer_id: str | None = None) -> np.ndarray:
        """The redelivery-set positions to hand out next (lowest first); the caller fetches
        their payloads, then calls :meth:`deliver` with them. A key_shared subscription
        first moves read-ahead rows into the redelivery set, then picks the positions of
        ``consumer_id``'s keys (and positions whose key it does not know yet)."""
        if self._keys is None or consumer_id is None:
            return first_keys(self._redelivery.redeliver, max_messages)
        return self._keys.keys_for(consumer_id, max_messages, self._reading.read_ahead_entries)

    def deliver(
        self,
        consumer_id: str,
        fetched: list[Group],
        max_messages: int,
        now_ms: int,
    ) -> list[Delivery]:
        """Hand up to ``max_messages`` to ``consumer_id``: fetched redeliveries first (groups
        of (source, row indexes, position keys)), then the read-ahead queue. Returns
        nothing for a FIFO subscription's standby consumer."""
        if not self._consumers.can_receive(consumer_id):
            return []
        if self._keys is not None:
            return self._keys.deliver(consumer_id, fetched, max_messages, now_ms, self.hand_out)
        out: list[Delivery] = []
        room = max_messages
        for source, idx, keys in sorted(fetched, key=lambda g: int(g[2][0]) if len(g[2]) else 0):
            if room <= 0:
                break
            # only what is still waiting: another receive, an ack or a cancel may have won
            idx, keys = self._redelivery.still_waiting(idx, keys)
            idx, keys = idx[:room], keys[:room]
            if len(keys):
                self._redelivery.redeliver -= bitmap64_of(keys)
                out.append(self.hand_out(consumer_id, source, idx, keys, now_ms))
                room -= len(keys)
        for source, idx, keys in self._reading.take_ready(room):
            out.append(self.hand_out(consumer_id, source, idx, keys, now_ms))
        return out

    def hand_out(
        self, consumer_id: str, source: Source, idx: np.ndarray, keys: np.ndarray, now_ms: int
    ) -> Delivery:
        bm = bitmap64_of(keys)
        self._consumers.hold(consumer_id, keys, bm, now_ms)
        self._counters["delivered"] += len(keys)
        return Delivery(source, idx, keys, self._redelivery.counts_of(keys, bm))
