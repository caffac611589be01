"""The cursor's I/O for one subscription partition: its versions in the store, and the
progress reported to the coordinator (mark-delete, the log mark, sealed-bucket progress).

:class:`CursorIO` loads the newest usable cursor at recovery, is the ``write_cursor`` the
pure ``Subscription`` writes through (the next version, on a thread, older ones deleted),
reports progress when it changed, and writes what a reset of the cursor needs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.cluster.handles import Peer
from raydelay.delayed.sealed import parse_bucket_key
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.subscription import Subscription
from raydelay.errors import CodecError, NotFound
from raydelay.storage import ObjectStore
from raydelay.storage.keys import cursor_key, subscription_prefix

log = logging.getLogger(__name__)


class CursorIO:
    """The versions of one partition's cursor in the store, and its reports to the
    coordinator."""

    def __init__(
        self, ref: PartitionRef, store: ObjectStore, coordinator: Peer[CoordinatorActor]
    ) -> None:
        self._ref = ref
        self._store = store
        self._coordinator = coordinator
        self.prefix = subscription_prefix(ref.topic, ref.partition, ref.subscription)
        self.version = 0  # the cursor version last written (or loaded)
        self._reported_progress: tuple[Any, ...] | None = None

    def load(self) -> tuple[Cursor, Position]:
        """The newest cursor that decodes, and the dispatch mark it was written with; with
        none, a cursor at the coordinator's mark-delete."""
        keys = self._store.list(f"{self.prefix}/cursor/")
        for key in reversed(keys):
            try:
                cursor, read = Cursor.decode(self._store.get(key), key)
            except (CodecError, NotFound) as exc:
                log.error("cursor %s unusable, trying an older one: %s", key, exc)
                continue
            self.version = int(key.rsplit("/", 1)[1])
            return cursor, read
        r = self._ref
        md = self._coordinator.call_from_thread(
            CoordinatorActor.mark_delete, r.topic, r.partition, r.subscription
        )
        return Cursor((md[0], md[1])), (-1, -1)

    async def write(self, data: bytes) -> None:
        """The subscription's cursor writer: the next cursor version, written on a thread."""
        version = self.version + 1
        r = self._ref
        key = cursor_key(r.topic, r.partition, r.subscription, version)
        await asyncio.to_thread(self._put, key, data)
        self.version = version

    def _put(self, key: str, data: bytes) -> None:
        self._store.put(key, data)
        for old in self._store.list(f"{self.prefix}/cursor/"):
            if old != key:
                self._store.delete(old)

    async def persist_and_report(self, sub: Subscription) -> bool:
        """The periodic cursor write, then the progress report to the coordinator; whether
        either wrote anything."""
        wrote = await sub.persist()
        return await self.report_progress(sub) or wrote

    async def report_progress(self, sub: Subscription) -> bool:
        """Tell the coordinator mark-delete, the log mark and the progress through each
        sealed bucket (what retention goes by), when they changed."""
        sub.advance_buckets()
        sealed = sub.sealed
        progress = sealed.progress() if sealed is not None else {}
        md, lm = sub.cursor.mark_delete, sub.marks.log_cursor.mark_delete
        report = (md, lm, tuple(sorted(progress.items())))
        if report == self._reported_progress:
            return False
        r = self._ref
        await self._coordinator.once(
            CoordinatorActor.set_progress,
            r.topic,
            r.partition,
            r.subscription,
            list(md),
            list(lm),
            progress,
        )
        self._reported_progress = report
        return True

    def write_reset(self, sub: Subscription, md: Position) -> None:
        """What a start from mark-delete ``md`` needs (blocking: run on a thread): the
        progress through the sealed buckets from ``md``'s ledger on starts again, then the
        cursor says ``md``, with no individual acks."""
        r = self._ref
        progress = self._coordinator.call_from_thread(
            CoordinatorActor.progress, r.topic, r.partition, r.subscription
        )
        progress = {
            k: v for k, v in progress.items() if parse_bucket_key(k)[1] < md[0]
        }  # (a bucket not listed starts from its first segment)
        self._coordinator.call_from_thread(
            CoordinatorActor.set_progress,
            r.topic,
            r.partition,
            r.subscription,
            list(md),
            list(md),
            progress,
        )
        cursor = Cursor(md)
        cursor.delayed_mark = sub.cursor.delayed_mark  # (what may have gone out: counted)
        cursor.dead_lettered = sub.cursor.dead_lettered  # (published: they stay counted)
        key = cursor_key(r.topic, r.partition, r.subscription, self.version + 1)
        self._put(key, cursor.encode(max(sub.marks.dispatch_mark, md)))
        log.info("%s: cursor reset to mark-delete %s", sub.name, md)
