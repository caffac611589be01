"""One partition's append-only log over an ObjectStore (pure: no Ray).

:class:`PartitionLog` is what a partition holds on its host. It composes the parts, each in its
own module, and owns what spans them: recovery from the store and retention.

- :mod:`raydelay.log.ledgers`: the ledgers and their entry counts (which positions exist);
- :mod:`raydelay.log.commit`: group commits and ledger rolls;
- :mod:`raydelay.log.dedup`: producer deduplication and its snapshots;
- :mod:`raydelay.log.keys`: the index of pending keyed messages, and its deltas;
- :mod:`raydelay.log.reader`: reads of whole objects, scattered positions and cancel
  markers, with their caches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np

from raydelay.clock import Clock
from raydelay.log.commit import CommitResult, Committer, RollFn
from raydelay.log.dedup import ProducerDedup, Range, StaleSequence
from raydelay.log.entries import AppendBatch, DelayedRun, Entries, LedgerObject, Rows
from raydelay.log.keys import KeyIndex, KeyStore, ledger_through
from raydelay.log.ledgers import LedgerInfo, LedgerTable, Position
from raydelay.log.reader import KeyRows, LogReader, ReadReply, ledger_prefix
from raydelay.positions import key_of
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import validate_name

log = logging.getLogger(__name__)


class PartitionLog:
    def __init__(
        self,
        *,
        store: ObjectStore,
        topic: str,
        partition: int,
        ledgers: list[LedgerInfo],
        roll: RollFn,
        clock: Clock,
        max_entries_per_ledger: int,
        cache_bytes: int,
        index_cache_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        """``ledgers`` as the coordinator knows them; ``roll(closed or None, its count)``
        returns a new ledger id; ``cache_bytes`` bounds the tail cache of whole objects and
        ``index_cache_bytes`` the cache of object indexes."""
        self._store = store
        self._topic = validate_name("topic", topic)
        self._partition = partition
        self._roll_fn = roll
        self._ledgers = LedgerTable(ledgers)
        self._dedup = ProducerDedup(store, topic, partition)
        self._clock = clock
        self.keys = KeyIndex()  # pending keyed messages (observed as objects are written)
        self._key_store = KeyStore(store, topic, partition)
        self._reader = LogReader(
            store=store,
            topic=topic,
            partition=partition,
            ledgers=self._ledgers,
            cache_bytes=cache_bytes,
            index_cache_bytes=index_cache_bytes,
        )
        self._committer = Committer(
            store=store,
            topic=topic,
            partition=partition,
            ledgers=self._ledgers,
            dedup=self._dedup,
            roll=roll,
            clock=clock,
            max_entries_per_ledger=max_entries_per_ledger,
            on_written=self._written,
            on_rolled=self._rolled,
        )
        # Called on the log's thread: each committed object, and each closed ledger's id.
        self.on_object: Callable[[LedgerObject], None] | None = None
        self.on_roll: Callable[[int], None] | None = None
        self._recover()

    # --- state ------------------------------------------------------------------------

    @property
    def current_ledger(self) -> int:
        return self._ledgers.current

    @property
    def ledgers(self) -> list[LedgerInfo]:
        return self._ledgers.infos

    def tail(self) -> Position | None:
        """The last committed position, or None when nothing was ever committed."""
        return self._ledgers.tail()

    def count_of(self, ledger_id: int) -> int | None:
        """Entries in ``ledger_id`` (committed so far, when open); None: not a ledger of
        this log."""
        return self._ledgers.count_of(ledger_id)

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether (ledger_id, entry_id) is a committed position of this log."""
        return self._ledgers.contains(ledger_id, entry_id)

    @property
    def stats_counters(self) -> dict[str, int]:
        """Commits, objects, entries and bytes written, re-sent batches recognised, and
        entries read at scattered positions, since the start."""
        return {**self._committer.counters, "point_reads": self._reader.point_reads}

    @property
    def cached_bytes(self) -> int:
        return self._reader.cached_bytes

    # --- appending ----------------------------------------------------------------------

    def commit(self, batches: list[AppendBatch]) -> list[CommitResult]:
        """See :meth:`raydelay.log.commit.Committer.commit`."""
        return self._committer.commit(batches)

    def close_ledger(self) -> bool:
        """Close the open ledger at its size (a clean stop: a restart has nothing to fence).
        An empty open ledger stays as it is. Returns whether one was closed."""
        if self._ledgers.open_count == 0:
            return False
        self._committer.roll()
        return True

    def recorded(self, producer: str, sequence_id: int) -> list[Range] | None:
        """The positions of ``producer``'s batch ``sequence_id`` if this log holds it and
        still remembers them, else None (call on the log's thread, like :meth:`commit`)."""
        return self._dedup.recorded(producer, sequence_id)

    def last_sequence(self, producer: str) -> int:
        """The largest sequence id this log holds for ``producer`` (0 when none), so that a
        producer re-created under the same name continues after it."""
        return self._dedup.last_sequence(producer)

    def _written(self, obj: LedgerObject, data: bytes) -> None:
        self._reader.added(obj, data)
        self.keys.observe(obj)
        if self.on_object is not None:
            self.on_object(obj)

    def _rolled(self, closed: int) -> None:
        try:  # (a failed write leaves its changes for the next roll's)
            self._key_store.cut(self.keys, self._clock.now_ms())
        except Exception as exc:  # noqa: BLE001 - retention keeps the ledgers it misses
            log.warning("%s/%d: key index delta not written (%s)", self._topic,
                        self._partition, exc)  # fmt: skip
        if self.on_roll is not None:
            self.on_roll(closed)

    @property
    def keys_ledger_through(self) -> int:
        """The last ledger whose keyed entries the key index has in the store (-1: none):
        retention deletes no ledger after it."""
        return ledger_through(self.keys)

    # --- reading -----------------------------------------------------------------------

    def read(
        self,
        from_position: Position,
        max_entries: int,
        stand_in: Callable[[int, int], DelayedRun | None] | None = None,
    ) -> ReadReply:
        """See :meth:`raydelay.log.reader.LogReader.read`."""
        return self._reader.read(from_position, max_entries, stand_in)

    def objects_of(self, ledger_id: int) -> Iterator[LedgerObject]:
        """The decoded objects of one ledger, in order (recovery of the topic's index)."""
        return self._reader.objects_of(ledger_id)

    def position_at(self, time_ms: int) -> Position | None:
        """The first position published at or after ``time_ms`` (epoch ms); None: every
        entry of the log is older (see :meth:`raydelay.log.reader.LogReader.position_at`)."""
        return self._reader.position_at(time_ms, [x.ledger_id for x in self._ledgers.infos])

    def cancel_markers(self, from_position: Position) -> list[tuple[Position, Position]]:
        """Every cancel marker at or after ``from_position``: (marker, target) pairs, in log
        order. A restarted subscription learns them all before it delivers anything, so a
        cancel it had applied before dying cannot slip out while it re-reads the log."""
        return self._reader.cancel_markers(from_position)

    def key_rows(self, positions: np.ndarray) -> KeyRows:
        """See :meth:`raydelay.log.reader.LogReader.key_rows`."""
        return self._reader.key_rows(positions)

    def read_positions(self, positions: list[Position] | np.ndarray) -> Rows:
        """See :meth:`raydelay.log.reader.LogReader.read_positions`."""
        return self._reader.read_positions(positions)

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the dedup table (the newest snapshot, then the records in the objects of
        the ledgers after it) and open a ledger to append to: never one another life of
        this log wrote to."""
        snapshot_ledger = self._dedup.load_snapshot()
        for info in self._ledgers.infos:
            if info.ledger_id <= snapshot_ledger and info.count is not None:
                continue
            for first in self._reader.firsts(info.ledger_id):
                index = self._reader.object_index(info.ledger_id, first)[0]
                for producer, (seq, ranges) in index.dedup.items():
                    self._dedup.record(producer, seq, ranges, index.publish_time_ms)
        self._recover_keys()
        if not self._ledgers.has_open:
            self._ledgers.open(self._roll_fn(None, 0))
            return
        count = self._reader.entries_end(self._ledgers.current)
        self._ledgers.set_open_count(count)
        if count > 0:
            self._committer.roll()

    def _recover_keys(self) -> None:
        """The key index: the newest base and the deltas after it from the store, then
        the entries of the ledgers they do not cover yet."""
        through = self._key_store.load(self.keys)
        for info in self._ledgers.infos:
            if info.count is not None and key_of(info.ledger_id, info.count - 1) <= through:
                continue  # (every entry of the ledger is in what was loaded)
            for obj in self._reader.objects_of(info.ledger_id):
                self.keys.observe(obj, through)

    # --- retention ------------------------------------------------------------------------

    def delete_ledgers(self, ledger_ids: list[int]) -> int:
        """Delete closed ledgers' objects (never the open one); returns objects deleted."""
        doomed = {i for i in ledger_ids if i != self.current_ledger}
        deleted = 0
        for ledger_id in sorted(doomed):
            for key in self._store.list(ledger_prefix(self._topic, self._partition, ledger_id)):
                self._store.delete(key)
                deleted += 1
            self._reader.forget(ledger_id)
        self._ledgers.drop(doomed)
        return deleted


__all__ = [
    "PartitionLog",
    "LedgerInfo",
    "ReadReply",
    "StaleSequence",
    "Entries",
]
