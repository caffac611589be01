"""Producer deduplication for one partition's log.

:class:`ProducerDedup` owns the table of producers: each one's latest ``sequence_id``\\s
and the positions those batches got, so that a re-sent batch gets its original positions
back and is not appended twice. The records travel inside the ledger objects (the log
replays them on recovery); a snapshot of the whole table, written at each ledger roll
under ``topics/<t>/<p>/dedup/<ledger>``, lets a restarted log start from the latest
snapshot plus the objects of the ledgers after it. The snapshot's format (msgpack,
version 1) is pinned by a golden-bytes test.
"""

from __future__ import annotations

import logging

import msgpack

from raydelay.errors import CodecError, NotFound, RaydelayError
from raydelay.log.entries import AppendBatch
from raydelay.retries import is_transient
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import validate_name

log = logging.getLogger(__name__)

Range = tuple[int, int, int]  # (ledger_id, first_entry, count)

PRODUCER_IDLE_MS = 6 * 3600 * 1000  # dedup records of producers idle this long are dropped
HISTORY = 16  # recent batches per producer whose positions a retry gets back
_DEDUP_VERSION = 1
_SNAPSHOTS_KEPT = 2


class StaleSequence(RaydelayError):
    """A batch re-sent with a sequence id older than the recent history: it was already
    appended, but its positions are no longer known."""


class ProducerRecord:
    """One producer's dedup record: the positions of its latest batches (by sequence id),
    and ``floor``, the largest id forgotten. An id above the floor that is not in the
    history never landed; an id at or below it is too old to tell."""

    __slots__ = ("floor", "history", "last_used_ms")

    def __init__(self, floor: int, last_used_ms: int) -> None:
        self.floor = floor
        self.history: dict[int, list[Range]] = {}
        self.last_used_ms = last_used_ms

    def record(self, seq: int, ranges: list[Range], now_ms: int) -> None:
        if seq <= self.floor:
            return
        self.history[seq] = ranges
        while len(self.history) > HISTORY:  # keep the largest sequence ids
            oldest = min(self.history)
            del self.history[oldest]
            self.floor = max(self.floor, oldest)
        self.last_used_ms = max(self.last_used_ms, now_ms)


def dedup_prefix(topic: str, partition: int) -> str:
    validate_name("topic", topic)
    return f"topics/{topic}/{partition}/dedup/"


class ProducerDedup:
    def __init__(self, store: ObjectStore, topic: str, partition: int) -> None:
        self._store = store
        self._prefix = dedup_prefix(topic, partition)
        self._producers: dict[str, ProducerRecord] = {}

    def known(
        self, batch: AppendBatch, staged: dict[str, set[int]]
    ) -> list[Range] | StaleSequence | None:
        """Positions of an already-appended batch, None when it is new, or the error of a
        re-send whose positions are no longer known. ``staged`` holds the sequence ids
        placed so far in the group commit being built (per producer)."""
        if not batch.producer:
            return None
        seq = batch.sequence_id
        if seq in staged.get(batch.producer, ()):
            return StaleSequence(
                f"producer {batch.producer!r}: sequence {seq} was sent twice in one group commit"
            )
        p = self._producers.get(batch.producer)
        if p is None:
            return None
        if seq in p.history:
            return p.history[seq]
        if seq > p.floor:
            return None  # never landed (batches may arrive out of order): append it
        return StaleSequence(
            f"producer {batch.producer!r}: sequence {seq} is older than the last "
            f"{HISTORY} batches this partition remembers; it was appended already"
        )

    def recorded(self, producer: str, seq: int) -> list[Range] | None:
        """The positions ``producer``'s batch ``seq`` got, when this log still remembers
        them (None: never landed, or too old to tell)."""
        p = self._producers.get(producer)
        return None if p is None else p.history.get(seq)

    def record(self, producer: str, seq: int, ranges: list[Range], now_ms: int) -> None:
        """``producer``'s batch ``seq`` is durable at ``ranges`` (as of ``now_ms``)."""
        p = self._producers.get(producer)
        if p is None:
            p = self._producers[producer] = ProducerRecord(0, now_ms)
        p.record(seq, ranges, now_ms)

    def last_sequence(self, producer: str) -> int:
        """The largest sequence id held for ``producer`` (0 when none)."""
        p = self._producers.get(producer)
        if p is None:
            return 0
        return max([p.floor, *p.history])

    # --- snapshots ------------------------------------------------------------------------------

    def write_snapshot(self, ledger_id: int, now_ms: int) -> None:
        """Snapshot the table as of the close of ``ledger_id`` (at ``now_ms``), dropping the
        producers idle for PRODUCER_IDLE_MS, and delete all but the newest snapshots."""
        live = {
            name: [
                p.floor,
                p.last_used_ms,
                [[s, [list(r) for r in rs]] for s, rs in p.history.items()],
            ]
            for name, p in self._producers.items()
            if now_ms - p.last_used_ms < PRODUCER_IDLE_MS
        }
        self._producers = {k: v for k, v in self._producers.items() if k in live}
        data = msgpack.packb({"v": _DEDUP_VERSION, "ledger": ledger_id, "producers": live})
        self._store.put(f"{self._prefix}{ledger_id:020d}", data)
        for old in self._store.list(self._prefix)[:-_SNAPSHOTS_KEPT]:
            self._store.delete(old)

    def load_snapshot(self) -> int:
        """Load the newest readable snapshot; returns the ledger it was taken at (-1: none).
        A snapshot that does not decode is skipped for an older one; a transient store
        failure is raised, for the caller's retry (``retries.RECOVERY`` in the actor)."""
        for key in reversed(self._store.list(self._prefix)):
            try:
                raw = msgpack.unpackb(self._store.get(key), raw=False)
                if raw.get("v") != _DEDUP_VERSION:
                    raise CodecError(f"{key}: unknown dedup snapshot version {raw.get('v')!r}")
            except NotFound:
                continue
            except Exception as exc:
                if is_transient(exc):
                    raise  # an older snapshot would lose the records of deleted ledgers
                log.error("dedup snapshot %s unreadable, trying an older one: %s", key, exc)
                continue
            for name, (floor, used, history) in raw["producers"].items():
                p = self._producers[name] = ProducerRecord(int(floor), int(used))
                for s, rs in history:
                    p.history[int(s)] = [(int(r[0]), int(r[1]), int(r[2])) for r in rs]
            return int(raw["ledger"])
        return -1
