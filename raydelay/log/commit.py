"""Group commits and ledger rolls of one partition's log.

:class:`Committer` owns the write path:

- **Group commits.** :meth:`Committer.commit` takes every batch gathered during one
  group-commit window and writes them as **one** ledger object (two when the ledger fills
  up in between). Positions exist only after that write succeeded.
- **Ledger rolls.** A batch never spans ledgers: when it does not fit in the rest of the
  current ledger, the ledger is closed and a new one is opened first. New ledger ids come
  from ``roll`` (the coordinator in production); the dedup table is snapshotted before.
- **Retried commits.** The callers retry a failed commit. A write whose answer was lost
  may have landed, so its key is remembered and the next attempt overwrites it; any other
  object already at a key is another writer's, and the write fails with ``Conflict``.
  Failures are reported through :class:`raydelay.retries.Retries`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from raydelay.clock import Clock
from raydelay.errors import Conflict, InvalidArgument
from raydelay.log.dedup import ProducerDedup, Range
from raydelay.log.entries import AppendBatch, LedgerObject, concat_entries, encode_object
from raydelay.log.ledgers import LedgerTable
from raydelay.retries import Retries
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import ledger_entries_key

log = logging.getLogger(__name__)

RollFn = Callable[[int | None, int], int]  # (closed ledger or None, its entry count) -> new id
CommitResult = list[Range] | BaseException


class Committer:
    def __init__(
        self,
        *,
        store: ObjectStore,
        topic: str,
        partition: int,
        ledgers: LedgerTable,
        dedup: ProducerDedup,
        roll: RollFn,
        clock: Clock,
        max_entries_per_ledger: int,
        on_written: Callable[[LedgerObject, bytes], None],
        on_rolled: Callable[[int], None],
    ) -> None:
        """``on_written(object, its bytes)`` is called once an object is durable, and
        ``on_rolled(ledger_id)`` once a ledger is closed, both on the log's thread."""
        self._store = store
        self._topic, self._partition = topic, partition
        self._ledgers = ledgers
        self._dedup = dedup
        self._roll_fn = roll
        self._clock = clock
        self._max_entries = max_entries_per_ledger
        self._on_written = on_written
        self._on_rolled = on_rolled
        self._unsure: set[str] = set()  # object keys whose write failed and may have landed
        self._closing: tuple[int, int] | None = None  # (ledger, count) of a close not done yet
        # (the callers retry a failed commit: one line per bout of failures, not per try)
        self._retries = Retries(log, f"commit to {topic}/{partition}")
        self.counters = {
            "commits": 0,
            "objects": 0,
            "entries": 0,
            "duplicates": 0,
            "bytes_written": 0,
        }

    def commit(self, batches: list[AppendBatch]) -> list[CommitResult]:
        """Append ``batches`` in one group commit. Returns, per batch, its position ranges or
        the error that kept it from being written. Nothing is visible to readers before
        the object holding it is in the store."""
        results: list[CommitResult | None] = [None] * len(batches)
        now_ms = self._clock.now_ms()
        group: list[int] = []  # indexes of the batches in the object being built
        placed = 0  # entries placed in that object
        staged: dict[str, set[int]] = {}  # producer -> sequence ids placed in this commit
        try:
            if self._closing is not None:  # a close that failed: finished before any write
                self.roll()
            for i, batch in enumerate(batches):
                n = len(batch.entries)
                known = self._dedup.known(batch, staged)
                if known is not None:
                    results[i] = known
                    self.counters["duplicates"] += isinstance(known, list)
                    continue
                if n == 0 or n > self._max_entries:
                    results[i] = InvalidArgument(
                        f"batch: holds {n} entries; must be 1..{self._max_entries} "
                        "(topic.max_entries_per_ledger)"
                    )
                    continue
                if self._ledgers.open_count + placed + n > self._max_entries:
                    self._write_group(batches, group, results, now_ms)
                    group, placed, staged = [], 0, {}
                    self.roll()
                group.append(i)
                placed += n
                if batch.producer:
                    staged.setdefault(batch.producer, set()).add(batch.sequence_id)
            self._write_group(batches, group, results, now_ms)
            if self._ledgers.open_count >= self._max_entries:
                self.roll()
        except Exception as exc:  # noqa: BLE001 - every unwritten batch gets the error
            self._retries.failed(exc)
            results = [exc if r is None else r for r in results]
        else:
            self._retries.ok()
        self.counters["commits"] += 1
        return cast(list[CommitResult], results)  # every batch has its outcome now

    def _write_group(
        self,
        batches: list[AppendBatch],
        group: list[int],
        results: list[CommitResult | None],
        now_ms: int,
    ) -> None:
        """Write the batches at ``group`` as one object, filling in their ``results``."""
        if not group:
            return
        ledger, first = self._ledgers.current, self._ledgers.open_count
        dedup: dict[str, tuple[int, list[Range]]] = {}
        offset = first
        for i in group:
            n = len(batches[i].entries)
            results[i] = [(ledger, offset, n)]
            if batches[i].producer:
                dedup[batches[i].producer] = (batches[i].sequence_id, [(ledger, offset, n)])
            offset += n
        entries = concat_entries([batches[i].entries for i in group])
        obj = LedgerObject(ledger, first, now_ms, entries, dedup)
        data = encode_object(obj)
        key = ledger_entries_key(self._topic, self._partition, ledger, first)
        try:
            # create-only: an object already there means another writer (a second cluster
            # on this store), unless it is this actor's own earlier attempt whose answer
            # was lost, which the next group (maybe larger) replaces
            if key in self._unsure:
                self._store.put(key, data)
            else:
                self._store.put_new(key, data)
        except BaseException as exc:
            for i in group:
                results[i] = None  # the caller's handler fills in the error
            if not isinstance(exc, Conflict):
                self._unsure.add(key)
            raise
        self._unsure.discard(key)
        # Durable: make it visible.
        self._ledgers.set_open_count(offset)
        for producer, (seq, ranges) in dedup.items():
            self._dedup.record(producer, seq, ranges, now_ms)
        self.counters["objects"] += 1
        self.counters["entries"] += len(entries)
        self.counters["bytes_written"] += len(data)
        self._on_written(obj, data)

    def roll(self) -> None:
        """Close the current ledger (snapshotting the dedup table first) and open a new one.

        Once a close has been asked for, the ledger takes no more entries, and a close that
        failed is asked again, at the same count, before anything else is written (see
        :meth:`commit`). The coordinator may have recorded the close although its answer
        was lost: entries written to the ledger after that would be past its recorded end,
        where readers after a restart never look (and a close asked at a larger count would
        be refused)."""
        if self._closing is None:
            self._closing = (self._ledgers.current, self._ledgers.open_count)
        closing, count = self._closing
        self._dedup.write_snapshot(closing, self._clock.now_ms())
        new_id = self._roll_fn(closing, count)
        self._ledgers.roll(new_id)
        self._closing = None
        self._on_rolled(closing)
        log.info(
            "%s/%d: ledger %d closed at %d entries; ledger %d open",
            self._topic,
            self._partition,
            closing,
            count,
            new_id,
        )
