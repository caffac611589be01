"""The cursor's I/O for one subscription partition: its versions in the store, and the
progress reported to the coordinator (mark-delete, the log mark, sealed-bucket progress).

:class:`CursorIO` loads the newest usable cursor at recovery, is the ``write_cursor`` the
pure ``Subscription`` writes through (the next version, on a thread, older ones deleted),
reports progress when it changed, and writes what a reset of the cursor needs.

**Fencing.** Versions are written create-only (``put_new``). Two hosts serving the
partition at once (one whose node was taken for lost, and the one its unit moved to) meet
on a version number: the one that finds it taken asks its :class:`Fence` (the
coordinator's assignment) whether it still serves the partition. The new host takes the
next free number; the old one is fenced: it writes no cursor from then on, a receive that
needs a cursor write first (one handing out delayed messages) fails, so it stops
delivering them, and ``Fence.dropped()`` tells its host to drop it. Only versions older
than the one written are deleted, never a newer one another host wrote.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.actors.subscription.shared_calls import progress_reports
from raydelay.cluster.handles import Peer
from raydelay.delayed.sealed import parse_bucket_key
from raydelay.dispatch.cursor import Cursor, Position
from raydelay.dispatch.subscription import Subscription
from raydelay.errors import CodecError, Conflict, NotFound, PartitionMoved
from raydelay.storage import ObjectStore
from raydelay.storage.keys import cursor_key, subscription_prefix

log = logging.getLogger(__name__)

# (mark-delete, log mark, (bucket, progress) pairs): what retention goes by
ProgressReport = tuple[Position, Position, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class Fence:
    """How a host learns that another one serves its partitions now (both are called on
    a thread, and may block)."""

    owns: Callable[[], bool]  # whether this host still serves them (the coordinator says)
    dropped: Callable[[], None]  # this host must drop them: it was fenced


class CursorIO:
    """The versions of one partition's cursor in the store, and its reports to the
    coordinator."""

    def __init__(
        self,
        ref: PartitionRef,
        store: ObjectStore,
        coordinator: Peer[CoordinatorActor],
        fence: Fence | None = None,
    ) -> None:
        self._ref = ref
        self._store = store
        self._coordinator = coordinator
        self.prefix = subscription_prefix(ref.topic, ref.partition, ref.subscription)
        self.version = 0  # the cursor version last written (or loaded)
        self._reported_progress: ProgressReport | None = None
        self._fence = fence  # None: nobody else can serve it (tools, tests)
        self.fenced = False  # another host serves it now: nothing more is written

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
        await asyncio.to_thread(self._put_next, data)

    def _put_next(self, data: bytes) -> None:
        """Write ``data`` as the next version (create-only; see the module's docstring on
        fencing), then delete the older ones. PartitionMoved when fenced."""
        self._check_fenced()
        r = self._ref
        version = self.version + 1
        while True:
            try:
                self._store.put_new(cursor_key(r.topic, r.partition, r.subscription, version), data)
                break
            except Conflict:
                if self._fence is not None and not self._fence.owns():
                    self.fenced = True
                    log.warning(
                        "%s: another host serves it now; this one writes and delivers no more",
                        r.name,
                    )
                    self._fence.dropped()
                    self._check_fenced()
                # still ours (our own write retried, or one of a fenced host): the next free
                version = max(version, self._newest_version()) + 1
        self.version = version
        for key in self._store.list(f"{self.prefix}/cursor/"):
            if int(key.rsplit("/", 1)[1]) < version:
                self._store.delete(key)

    def _newest_version(self) -> int:
        keys = self._store.list(f"{self.prefix}/cursor/")
        return max((int(k.rsplit("/", 1)[1]) for k in keys), default=0)

    def _check_fenced(self) -> None:
        if self.fenced:
            raise PartitionMoved(f"{self._ref.name}: served by another host now")

    @staticmethod
    def progress_report(sub: Subscription) -> ProgressReport:
        """Mark-delete, the log mark and the progress through each sealed bucket, as they
        stand now. Take it *before* the cursor write that is to cover it, and report it
        after: retention goes by it (it deletes the ledgers before mark-delete and the
        buckets every subscription is done with, and with them the cancel markers they
        hold), so it must never run ahead of what the persisted cursor says was
        acknowledged. A restart would find neither the ack of a cancelled message nor
        the marker that cancels it."""
        sub.advance_buckets()
        progress = sub.buckets.progress() if sub.buckets is not None else {}
        md, lm = sub.cursor.mark_delete, sub.marks.log_cursor.mark_delete
        return (md, lm, tuple(sorted(progress.items())))

    def to_report(self, report: ProgressReport) -> bool:
        """Whether ``report`` tells the coordinator anything new."""
        return report != self._reported_progress

    async def report_progress(self, report: ProgressReport) -> bool:
        """Tell the coordinator a :meth:`progress_report` (taken before the cursor write
        that covers it), when it changed."""
        if not self.to_report(report):
            return False
        md, lm, progress = report
        r = self._ref
        # (with the other partitions' of this process, in one call: see ProgressReports)
        entry = [r.topic, r.partition, r.subscription, list(md), list(lm), dict(progress)]
        await progress_reports().report(self._coordinator, entry)
        self._reported_progress = report
        return True

    def write_reset(self, sub: Subscription, md: Position) -> None:
        """What a start from mark-delete ``md`` needs (blocking: run on a thread): the
        progress through the sealed buckets from ``md``'s ledger on starts again, then the
        cursor says ``md``, with no individual acks."""
        self._check_fenced()  # (PartitionMoved: nothing of it is written)
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
        self._put_next(cursor.encode(max(sub.marks.dispatch_mark, md)))
        log.info("%s: cursor reset to mark-delete %s", sub.name, md)
