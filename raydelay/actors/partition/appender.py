"""Appender: a partition's appends and cancels, written in group commits.

``append`` calls wait in a queue. A group commit starts at once when none is in flight;
what arrives while one is in flight joins the next (the journal pattern of BookKeeper and
PostgreSQL): alone, a send pays one durable write; under load the commits grow, each up to
``topic.group_commit_max_bytes``. ``topic.group_commit_ms`` > 0 adds a linger before each
commit. Commits run on the partition's log thread, in order, so the event loop never
blocks on the store; each one wakes the log's readers
(:meth:`~raydelay.actors.partition.reads.LogReads.committed`).
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from raydelay.actors.partition.context import PartitionContext
from raydelay.actors.partition.keyed import KeyedAppends, KeyedReply
from raydelay.actors.partition.reads import LogReads
from raydelay.clock import now_ms
from raydelay.errors import InvalidArgument, NotFound, Unavailable
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries, decode_batch
from raydelay.log.keys import check_on_duplicate

log = logging.getLogger(__name__)


class Appender:
    """The append queue of one partition on its host and its committer task (started by
    the first call, on the event loop)."""

    def __init__(self, ctx: PartitionContext, reads: LogReads) -> None:
        self._ctx = ctx
        self._topic, self._partition = ctx.topic, ctx.partition
        self._config = ctx.config
        self._log = ctx.log
        self._reads = reads
        self._published = 0  # the log's entry count last reported
        self._queue: list[tuple[AppendBatch, asyncio.Future]] = []
        self._queued_bytes = 0
        self._started = False
        # (asyncio's primitives bind to the event loop on first use, not here)
        self._work = asyncio.Event()
        self._full = asyncio.Event()
        self._keyed = KeyedAppends(ctx, reads, self._queue_batch)

    @property
    def queued(self) -> int:
        """Batches waiting for a commit."""
        return len(self._queue)

    def start(self) -> None:
        """Start the committer, once (on the event loop)."""
        if self._started:
            return
        self._started = True
        self._committer_task = asyncio.get_running_loop().create_task(self._committer())

    def close(self) -> None:
        """Stop the committer; appends waiting in the queue fail as Unavailable."""
        if self._started:
            self._committer_task.cancel()
        for _, fut in self._queue:
            if not fut.done():
                fut.set_exception(Unavailable(f"topic {self._topic}/{self._partition} closed"))
        self._queue = []

    async def append(self, batch: bytes | list[bytes]) -> list:
        """Append one batch (see :func:`raydelay.log.entries.encode_batch`), or a list of
        batches appended in that order; returns the position ranges [(ledger, first_entry,
        count)] of the batch (of each batch, for a list) once they are durable. Every batch
        is checked before any is queued."""
        many = isinstance(batch, list)
        decoded = [self._check(b) for b in (batch if isinstance(batch, list) else [batch])]
        futures = [self._queue_batch(b) for b in decoded]
        results = await asyncio.gather(*futures)
        return list(results) if many else results[0]

    async def append_keyed(self, batch: bytes, on_duplicate: str) -> KeyedReply:
        """Append one batch whose keys are its messages' identities (see
        :mod:`raydelay.actors.partition.keyed`)."""
        check_on_duplicate(on_duplicate)
        return await self._keyed.append(self._check(batch), on_duplicate)

    async def cancel_keys(self, keys: list[str], producer: str, sequence_id: int) -> list[list]:
        """Cancel markers for the messages pending under ``keys`` (see
        :meth:`KeyedAppends.cancel`)."""
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InvalidArgument("keys: expected a list of str")
        return await self._keyed.cancel(keys, producer, sequence_id)

    async def pending_keys(self, keys: list[str]) -> dict[str, list[int]]:
        """The positions of the messages pending under each of ``keys``."""
        return await self._keyed.pending(keys, now_ms())

    def _check(self, data: bytes) -> AppendBatch:
        decoded = decode_batch(data)
        limit = self._config.topic.max_message_bytes
        too_big = np.flatnonzero(decoded.entries.payload_lengths() > limit)
        if len(too_big):
            raise InvalidArgument(
                f"payload: message {int(too_big[0])} of the batch is over "
                f"topic.max_message_bytes ({limit} bytes)"
            )
        return decoded

    def _queue_batch(self, batch: AppendBatch) -> asyncio.Future:
        """Queue ``batch`` for the next group commit (in call order); the future is its
        position ranges."""
        fut = asyncio.get_running_loop().create_future()
        self._reads.stopping = False  # (appends go on after a graceful stop: so do long polls)
        self._queue.append((batch, fut))
        self._queued_bytes += batch.entries.nbytes()
        self._work.set()
        if self._queued_bytes >= self._config.topic.group_commit_max_bytes:
            self._full.set()
        return fut

    async def cancel(
        self, positions: list[tuple[int, int]], producer: str = "", sequence_id: int = 0
    ) -> list[tuple[int, int]]:
        """Append one durable cancel marker per target position; returns the markers'
        positions. With a producer name and sequence id the markers are deduplicated like
        any batch: a retried cancel gets the same markers back, also when its targets have
        left the log since (delivered, acknowledged and trimmed while the reply was lost).
        Raises NotFound for a position that is not in this partition's log and not in a
        ledger it deleted."""
        targets = [(int(lg), int(en)) for lg, en in positions]
        if not targets:
            return []
        if producer and sequence_id:
            known = await self._ctx.threads.run(self._log.recorded, producer, int(sequence_id))
            if known is not None:
                return positions_of(known)
        self.check_targets(targets)
        n = len(targets)
        entries = Entries.build(
            [b""] * n, np.full(n, NO_DELAY, dtype=np.int64), cancels=dict(enumerate(targets))
        )
        return positions_of(await self._queue_batch(AppendBatch(producer, sequence_id, entries)))

    def check_targets(self, positions: list[tuple[int, int]]) -> None:
        """NotFound naming the first of ``positions`` that is not in this partition's log
        and not in a ledger it deleted (nothing is written). A position that passes stays
        good: it can only leave the log by retention, whose ledgers a cancel takes too.

        A target in a ledger retention deleted is taken: the ledger went once every
        subscription had acknowledged it or held its delayed rest in a sealed bucket, so
        the subscriptions answer whether it was kept from delivery (a cancel held up by a
        host restart may well arrive after its message was delivered and trimmed)."""
        first = self._log.ledgers[0].ledger_id if self._log.ledgers else 0
        for lg, en in positions:
            if int(lg) >= first and not self._log.contains(int(lg), int(en)):
                raise NotFound(
                    f"message {self._topic}/{self._partition}/{int(lg)}:{int(en)} is not in the log"
                )

    async def last_sequence(self, producer: str) -> int:
        """The last sequence id the log recorded of ``producer`` (its sends resume after)."""
        return await self._ctx.threads.run(self._log.last_sequence, producer)

    async def _committer(self) -> None:
        """One commit in flight at a time; each takes what queued while the last was written
        (no timer: with ``topic.group_commit_ms`` = 0, the default, a lone append is
        written at once)."""
        linger_s = self._config.topic.group_commit_ms / 1000
        while True:
            await self._work.wait()
            if linger_s > 0 and not self._full.is_set():
                try:
                    await asyncio.wait_for(self._full.wait(), timeout=linger_s)
                except TimeoutError:
                    pass
            batch = self._take()
            self._full.clear()
            if not self._queue:
                self._work.clear()
            try:
                results = await self._ctx.threads.run(self._log.commit, [b for b, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every caller gets the failure
                log.exception("group commit failed")
                results = [exc] * len(batch)
            for (_, fut), result in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
            entries = self._log.stats_counters["entries"]  # re-sent batches are not counted
            self._ctx.metrics.published(entries - self._published)
            self._published = entries
            await self._reads.committed()

    def _take(self) -> list[tuple[AppendBatch, asyncio.Future]]:
        """The queued batches up to group_commit_max_bytes (at least one)."""
        limit = self._config.topic.group_commit_max_bytes
        taken, size = 0, 0
        for batch, _ in self._queue:
            size += batch.entries.nbytes()
            taken += 1
            if size >= limit:
                break
        out, self._queue = self._queue[:taken], self._queue[taken:]
        self._queued_bytes -= size
        return out


def positions_of(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The positions of (ledger, first entry, count) ranges, in order."""
    return [(lg, first + i) for lg, first, count in ranges for i in range(count)]
