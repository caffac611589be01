"""Payloads for positions about to go out, and the dead letters' flush (pure: no Ray).

A position's payload is found where it is cheapest: staged (due rows of the host's index
came with theirs), in a ledger object read from the log and cached, else read through the
driver's :class:`~raydelay.dispatch.ports.Fetch`. A position the log no longer has can
never be delivered: it is acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import numpy as np

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.dispatch.objects import ObjectCache
from raydelay.dispatch.ports import DeadLetterPublisher, Fetch, Group, first_keys, keys_of
from raydelay.dispatch.redelivery import AckKeys, Redelivery
from raydelay.dispatch.staging import Staging
from raydelay.log.entries import concat_entries
from raydelay.positions import position_of

log = logging.getLogger(__name__)

DEAD_LETTER_BATCH = 1_000  # dead letters published per flush


class Payloads:
    """Finds payloads (staged, cached, fetched) and publishes dead letters with theirs."""

    def __init__(
        self,
        *,
        name: str,
        staging: Staging,
        objects: ObjectCache,
        redelivery: Redelivery,
        ack_keys: AckKeys,
        dead_lettered: AckKeys,
        publish_dead_letters: DeadLetterPublisher | None,
    ) -> None:
        self.name = name
        self._staging = staging
        self._objects = objects
        self._redelivery = redelivery
        self._ack_keys = ack_keys
        self._dead_lettered = dead_lettered
        self._publish = publish_dead_letters
        self.flush_lock = asyncio.Lock()  # one flush at a time: none is published twice

    async def fetch(
        self, fetch: Fetch, keys: np.ndarray, max_reads: int | None = None
    ) -> list[Group]:
        """Payloads for positions, grouped by source: the staged rows, the cached objects,
        else rows read through ``fetch`` (positions the log no longer has are acked:
        nothing can deliver them). With ``max_reads``, at most that many (the lowest) are
        read through ``fetch``; the others are left out of the result."""
        if not len(keys):
            return []
        groups, need = self._staging.lookup(np.asarray(keys, dtype=np.int64))
        if len(need):
            cached, need = self._objects.lookup(need)
            groups.extend(cached)
        if max_reads is not None and len(need) > max_reads:
            need = np.sort(need)[:max_reads]
        if len(need):
            rows = await fetch(need)
            found = np.isin(need, rows.positions)
            if found.any():
                got = need[found]
                groups.append((rows, np.searchsorted(rows.positions, got), got))
            if not found.all():
                self.drop_missing(need[~found])
        return groups

    def drop_missing(self, keys: Iterable[int] | np.ndarray) -> int:
        """Positions the log no longer has (deleted): nothing can deliver them; ack them."""
        bm = bitmap64_of(keys_of(keys))
        gone = (bm & self._redelivery.redeliver) | (bm & self._redelivery.dead)
        if not gone:
            return 0
        log.error(
            "subscription %s: %d positions are gone from the log, first %s",
            self.name,
            len(gone),
            position_of(gone.min()),
        )
        self._ack_keys(bitmap64_values(gone))
        return len(gone)

    def flush_due(self) -> bool:
        """Whether dead letters wait for a flush (and none is under way)."""
        return bool(self._redelivery.dead) and not self.flush_lock.locked()

    async def flush_dead_letters(self, fetch: Fetch) -> int:
        """Publish waiting dead letters (up to :data:`DEAD_LETTER_BATCH`, payloads read
        through ``fetch``), then ack them; returns how many. One flush at a time: a second
        one while the first awaits its publish returns 0 (the first takes what waits)."""
        dead = self._redelivery.dead
        if not dead or self._publish is None or self.flush_lock.locked():
            return 0
        async with self.flush_lock:
            groups = await self.fetch(fetch, first_keys(dead, DEAD_LETTER_BATCH))
            if not groups:
                return 0
            entries = concat_entries([src.entries.take(idx) for src, idx, _ in groups])
            keys = np.concatenate([ks for _, _, ks in groups])
            await self._publish(keys, entries)
            self._dead_lettered(keys)
            log.info("subscription %s: %d messages dead-lettered", self.name, len(keys))
            return len(keys)
