"""One partition's append-only log over an ObjectStore (pure: no Ray).

What it owns:

- **Group commits.** :meth:`PartitionLog.commit` takes every batch gathered during
  one group-commit window and writes them as **one** ledger object (two when the
  ledger fills up in between). Positions exist only after that write succeeded.
- **Ledgers.** A batch never spans ledgers: when it does not fit in the rest of the
  current ledger, the ledger is closed and a new one is opened first. New ledger
  ids come from ``roll`` (the coordinator in production).
- **Producer dedup.** Each producer's last ``sequence_id`` and the positions it got
  are kept; a re-sent batch gets its original positions back and is not appended
  twice. The records travel inside the ledger objects, and a snapshot of the whole
  table is written at each rollover, so a restarted log rebuilds the table from the
  latest snapshot plus the objects of the ledgers after it.
- **Reads.** A sequential reader gets whole ledger objects (bytes), from a
  byte-bounded tail cache or else the store, and picks its entries: the log never
  decodes on that path. A reader of scattered positions (due delayed messages,
  redeliveries) gets only the rows it asked for (:class:`Rows`): the log reads an
  object's index (its offsets and columns, kept in a byte-bounded cache) and then just
  the payload bytes those entries need, with ranged reads, and takes the rows out.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import numpy as np

from raydelay.clock import Clock
from raydelay.errors import CodecError, Conflict, InvalidArgument, NotFound, RaydelayError
from raydelay.log.entries import (
    INDEX_PROBE_BYTES,
    AppendBatch,
    DelayedRun,
    Entries,
    LedgerObject,
    ObjectIndex,
    Rows,
    concat_entries,
    decode_index,
    decode_object,
    encode_object,
    index_length,
)
from raydelay.retries import Retries
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import ledger_entries_key, validate_name

log = logging.getLogger(__name__)

Range = tuple[int, int, int]  # (ledger_id, first_entry, count)
Position = tuple[int, int]  # (ledger_id, entry_id)
RollFn = Callable[[int | None, int], int]  # (closed ledger or None, its entry count) -> new id

PRODUCER_IDLE_MS = 6 * 3600 * 1000  # dedup records of producers idle this long are dropped
_HISTORY = 16  # recent batches per producer whose positions a retry gets back
_DEDUP_VERSION = 1


class StaleSequence(RaydelayError):
    """A batch re-sent with a sequence id older than the recent history: it was already
    appended, but its positions are no longer known."""


@dataclass(frozen=True)
class LedgerInfo:
    """A ledger of the partition: its id and, once closed, how many entries it holds."""

    ledger_id: int
    count: int | None  # None while open


@dataclass(frozen=True)
class ReadReply:
    """Ledger objects (encoded bytes) holding entries at or after the requested position,
    in log order; ``tail`` is the last committed position (None: the log is empty)."""

    objects: list[bytes | DelayedRun]
    tail: Position | None


class _Producer:
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
        while len(self.history) > _HISTORY:  # keep the largest sequence ids
            oldest = min(self.history)
            del self.history[oldest]
            self.floor = max(self.floor, oldest)
        self.last_used_ms = max(self.last_used_ms, now_ms)


def ledger_prefix(topic: str, partition: int, ledger_id: int) -> str:
    return ledger_entries_key(topic, partition, ledger_id, 0).rsplit("/", 1)[0] + "/"


def dedup_prefix(topic: str, partition: int) -> str:
    validate_name("topic", topic)
    return f"topics/{topic}/{partition}/dedup/"


def partition_prefix(topic: str, partition: int) -> str:
    validate_name("topic", topic)
    return f"topics/{topic}/{partition}/"


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
        self._store = store
        self._topic = validate_name("topic", topic)
        self._partition = partition
        self._roll_fn = roll
        self._clock = clock
        self._max_entries = max_entries_per_ledger
        self._cache_bytes = cache_bytes
        self._cache: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._cached_bytes = 0
        self._indexes: OrderedDict[tuple[int, int], ObjectIndex] = OrderedDict()
        self._index_bytes = 0
        self._index_cache_bytes = index_cache_bytes
        self._ledgers: list[LedgerInfo] = sorted(ledgers, key=lambda x: x.ledger_id)
        self._firsts: dict[int, list[int]] = {}  # ledger -> first entries of its objects
        self._unsure: set[str] = set()  # object keys whose write failed and may have landed
        # (the callers retry a failed commit: one line per bout of failures, not per try)
        self._commit_retries = Retries(log, f"commit to {topic}/{partition}")
        # (ledger, first) -> the object's cancel markers as (index, target); small, and kept
        self._marker_index: dict[tuple[int, int], list[tuple[int, Position]]] = {}
        self._producers: dict[str, _Producer] = {}
        self._next_entry = 0
        # Called on the log's thread: each committed object, and each closed ledger's id.
        self.on_object: Callable[[LedgerObject], None] | None = None
        self.on_roll: Callable[[int], None] | None = None
        self.stats_counters = {
            "commits": 0,
            "objects": 0,
            "entries": 0,
            "duplicates": 0,
            "point_reads": 0,
            "bytes_written": 0,
        }
        self._recover()

    # --- state ------------------------------------------------------------------------

    @property
    def current_ledger(self) -> int:
        return self._ledgers[-1].ledger_id

    @property
    def ledgers(self) -> list[LedgerInfo]:
        return list(self._ledgers)

    def tail(self) -> Position | None:
        """The last committed position, or None when nothing was ever committed."""
        if self._next_entry > 0:
            return (self.current_ledger, self._next_entry - 1)
        for info in reversed(self._ledgers[:-1]):
            if info.count:
                return (info.ledger_id, info.count - 1)
        return None

    def count_of(self, ledger_id: int) -> int | None:
        if ledger_id == self.current_ledger:
            return self._next_entry
        for info in self._ledgers:
            if info.ledger_id == ledger_id:
                return info.count
        return None

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether (ledger_id, entry_id) is a committed position of this log."""
        count = self.count_of(ledger_id)
        return count is not None and 0 <= entry_id < count

    # --- appending ----------------------------------------------------------------------

    def commit(self, batches: list[AppendBatch]) -> list[list[Range] | BaseException]:
        """Append ``batches`` in one group commit. Returns, per batch, its position ranges or
        the error that kept it from being written. Nothing is visible to readers before
        the object holding it is in the store."""
        results: list[list[Range] | BaseException | None] = [None] * len(batches)
        now = self._clock.now_ms()
        group: list[int] = []  # indexes of the batches in the object being built
        placed = 0  # entries placed in that object
        staged: dict[str, set[int]] = {}  # producer -> sequence ids placed in this commit
        try:
            for i, batch in enumerate(batches):
                n = len(batch.entries)
                known = self._known(batch, staged)
                if known is not None:
                    results[i] = known
                    self.stats_counters["duplicates"] += isinstance(known, list)
                    continue
                if n == 0 or n > self._max_entries:
                    results[i] = InvalidArgument(
                        f"batch: holds {n} entries; must be 1..{self._max_entries} "
                        "(topic.max_entries_per_ledger)"
                    )
                    continue
                if self._next_entry + placed + n > self._max_entries:
                    self._write_group(batches, group, results, now)
                    group, placed, staged = [], 0, {}
                    self._roll()
                group.append(i)
                placed += n
                if batch.producer:
                    staged.setdefault(batch.producer, set()).add(batch.sequence_id)
            self._write_group(batches, group, results, now)
            if self._next_entry >= self._max_entries:
                self._roll()
        except Exception as exc:  # noqa: BLE001 - every unwritten batch gets the error
            self._commit_retries.failed(exc)
            for i, r in enumerate(results):
                if r is None:
                    results[i] = exc
        else:
            self._commit_retries.ok()
        self.stats_counters["commits"] += 1
        return results  # type: ignore[return-value]

    def _known(
        self, batch: AppendBatch, staged: dict[str, set[int]]
    ) -> list[Range] | StaleSequence | None:
        """Positions of an already-appended batch, None when it is new, or the error of a
        re-send whose positions are no longer known."""
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
            f"{_HISTORY} batches this partition remembers; it was appended already"
        )

    def _write_group(self, batches, group: list[int], results: list, now_ms: int) -> None:
        if not group:
            return
        ledger, first = self.current_ledger, self._next_entry
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
        self._next_entry = offset
        self._firsts.setdefault(ledger, []).append(first)
        self._remember(ledger, first, data)
        self._marker_index[(ledger, first)] = sorted(entries.cancels.items())
        for producer, (seq, ranges) in dedup.items():
            self._record(producer, seq, ranges, now_ms)
        self.stats_counters["objects"] += 1
        self.stats_counters["entries"] += len(entries)
        self.stats_counters["bytes_written"] += len(data)
        if self.on_object is not None:
            self.on_object(obj)

    def _record(self, producer: str, seq: int, ranges: list[Range], now_ms: int) -> None:
        p = self._producers.get(producer)
        if p is None:
            p = self._producers[producer] = _Producer(0, now_ms)
        p.record(seq, ranges, now_ms)

    def _roll(self) -> None:
        """Close the current ledger (snapshotting the dedup table first) and open a new one."""
        closing, count = self.current_ledger, self._next_entry
        self._write_dedup_snapshot(closing)
        new_id = self._roll_fn(closing, count)
        if new_id <= closing:
            raise RaydelayError(f"roll: new ledger {new_id} is not above {closing}")
        self._ledgers[-1] = LedgerInfo(closing, count)
        self._ledgers.append(LedgerInfo(new_id, None))
        self._next_entry = 0
        if self.on_roll is not None:
            self.on_roll(closing)
        log.info(
            "%s/%d: ledger %d closed at %d entries; ledger %d open",
            self._topic,
            self._partition,
            closing,
            count,
            new_id,
        )

    def close_ledger(self) -> bool:
        """Close the open ledger at its size (a clean stop: a restart has nothing to fence).
        An empty open ledger stays as it is. Returns whether one was closed."""
        if self._next_entry == 0:
            return False
        self._roll()
        return True

    def last_sequence(self, producer: str) -> int:
        """The largest sequence id this log holds for ``producer`` (0 when none), so that a
        producer re-created under the same name continues after it."""
        p = self._producers.get(producer)
        if p is None:
            return 0
        return max([p.floor, *p.history])

    # --- dedup persistence ----------------------------------------------------------------

    def _write_dedup_snapshot(self, ledger_id: int) -> None:
        now = self._clock.now_ms()
        live = {
            name: [
                p.floor,
                p.last_used_ms,
                [[s, [list(r) for r in rs]] for s, rs in p.history.items()],
            ]
            for name, p in self._producers.items()
            if now - p.last_used_ms < PRODUCER_IDLE_MS
        }
        self._producers = {k: v for k, v in self._producers.items() if k in live}
        data = msgpack.packb({"v": _DEDUP_VERSION, "ledger": ledger_id, "producers": live})
        prefix = dedup_prefix(self._topic, self._partition)
        self._store.put(f"{prefix}{ledger_id:020d}", data)
        for old in self._store.list(prefix)[:-2]:  # keep the two newest
            self._store.delete(old)

    def _load_dedup_snapshot(self) -> int:
        """Load the newest dedup snapshot; returns the ledger it was taken at (-1: none)."""
        keys = self._store.list(dedup_prefix(self._topic, self._partition))
        for key in reversed(keys):
            try:
                raw = msgpack.unpackb(self._store.get(key), raw=False)
                if raw.get("v") != _DEDUP_VERSION:
                    raise CodecError(f"{key}: unknown dedup snapshot version {raw.get('v')!r}")
            except NotFound:
                continue
            except Exception as exc:
                log.error("dedup snapshot %s unreadable, trying an older one: %s", key, exc)
                continue
            for name, (floor, used, history) in raw["producers"].items():
                p = self._producers[name] = _Producer(int(floor), int(used))
                for s, rs in history:
                    p.history[int(s)] = [tuple(r) for r in rs]  # type: ignore[misc]
            return int(raw["ledger"])
        return -1

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        snapshot_ledger = self._load_dedup_snapshot()
        for info in self._ledgers:
            if info.ledger_id <= snapshot_ledger and info.count is not None:
                continue
            for first in self._index(info.ledger_id):
                index = self._object_index(info.ledger_id, first)[0]  # the dedup is in there
                for producer, (seq, ranges) in index.dedup.items():
                    self._record(producer, seq, ranges, index.publish_time_ms)
        if not self._ledgers:
            self._ledgers.append(LedgerInfo(self._roll_fn(None, 0), None))
            return
        last = self._ledgers[-1]
        if last.count is None:
            count = self._object_entries_end(last.ledger_id)
            self._next_entry = count
            if count > 0:  # never append after a restart to a ledger another life wrote
                self._roll()
        else:
            self._ledgers.append(LedgerInfo(self._roll_fn(None, 0), None))

    def _object_entries_end(self, ledger_id: int) -> int:
        firsts = self._index(ledger_id)
        if not firsts:
            return 0
        index = self._object_index(ledger_id, firsts[-1])[0]
        return index.first_entry + index.count

    def _index(self, ledger_id: int) -> list[int]:
        """First entries of the ledger's objects (listed from the store once, then kept)."""
        firsts = self._firsts.get(ledger_id)
        if firsts is None:
            keys = self._store.list(ledger_prefix(self._topic, self._partition, ledger_id))
            firsts = sorted(
                int(k.rsplit("/", 1)[1].split(".")[0]) for k in keys if k.endswith(".entries")
            )
            self._firsts[ledger_id] = firsts
        return firsts

    # --- reading -----------------------------------------------------------------------

    def read(
        self,
        from_position: Position,
        max_entries: int,
        stand_in: Callable[[int, int], DelayedRun | None] | None = None,
    ) -> ReadReply:
        """Objects holding entries at or after ``from_position``, about ``max_entries`` of them
        (whole objects, at least one when any exists). ``stand_in(ledger, first)`` may give
        a :class:`DelayedRun` to send instead of an object (it is then not read)."""
        from_ledger, from_entry = from_position
        out: list[bytes] = []
        taken = 0
        for info in self._ledgers:
            if info.ledger_id < from_ledger:
                continue
            start = from_entry if info.ledger_id == from_ledger else 0
            end = self.count_of(info.ledger_id) or 0
            if start >= end:
                continue
            firsts = self._index(info.ledger_id)
            for j, first in enumerate(firsts):
                upper = firsts[j + 1] if j + 1 < len(firsts) else end
                if upper <= start:
                    continue
                run = stand_in(info.ledger_id, first) if stand_in is not None else None
                out.append(run if run is not None else self._get(info.ledger_id, first))
                # a stand-in carries no entries: it counts as one, not as its size
                taken += 1 if run is not None else upper - max(first, start)
                if taken >= max_entries:
                    return ReadReply(out, self.tail())
        return ReadReply(out, self.tail())

    def objects_of(self, ledger_id: int):
        """The decoded objects of one ledger, in order (recovery of the topic's index)."""
        for first in self._index(ledger_id):
            yield decode_object(self._get(ledger_id, first))

    def cancel_markers(self, from_position: Position) -> list[tuple[Position, Position]]:
        """Every cancel marker at or after ``from_position``: (marker, target) pairs, in log
        order. A restarted subscription learns them all before it delivers anything, so a
        cancel it had applied before dying cannot slip out while it re-reads the log."""
        from_ledger, from_entry = from_position
        out: list[tuple[Position, Position]] = []
        for info in self._ledgers:
            if info.ledger_id < from_ledger:
                continue
            start = from_entry if info.ledger_id == from_ledger else 0
            for first in self._index(info.ledger_id):
                for index, target in self._markers_of(info.ledger_id, first):
                    if first + index >= start:
                        out.append(((info.ledger_id, first + index), target))
        return out

    def _markers_of(self, ledger_id: int, first: int) -> list[tuple[int, Position]]:
        """(index in the object, target) of an object's cancel markers, decoded once."""
        found = self._marker_index.get((ledger_id, first))
        if found is None:
            index = self._object_index(ledger_id, first)[0]
            found = self._marker_index[(ledger_id, first)] = sorted(index.cancels.items())
        return found

    def read_positions(self, positions: list[Position] | np.ndarray) -> Rows:
        """The entries at ``positions`` ((ledger, entry) pairs, or int64 position keys
        ``ledger << 32 | entry``), taken out of their objects as rows sorted by position
        (positions not in the log are skipped). Payloads come with ranged reads of just the
        runs they lie in (close positions share a read), or from the whole object when
        most of it is wanted or it is cached."""
        if isinstance(positions, np.ndarray):
            keys = positions.astype(np.int64, copy=False)
        else:
            keys = np.array([(int(lg) << 32) | int(e) for lg, e in positions], dtype=np.int64)
        keys = np.unique(keys)
        ledgers, entries = keys >> 32, keys & 0xFFFFFFFF
        parts = []
        for ledger_id in np.unique(ledgers).tolist():
            es = entries[ledgers == ledger_id]
            count = self.count_of(ledger_id)
            if count is None:
                continue
            es = es[es < count]
            firsts = np.asarray(self._index(ledger_id), dtype=np.int64)
            slot = np.searchsorted(firsts, es, side="right") - 1
            for j in np.unique(slot[slot >= 0]).tolist():
                first = int(firsts[j])
                parts.append(self._take(ledger_id, first, es[slot == j] - first))
        return Rows.concat(parts)

    def _take(self, ledger_id: int, first: int, indexes: np.ndarray) -> Rows:
        data = self._cache.get((ledger_id, first))
        index, head = self._object_index(ledger_id, first, data)
        self.stats_counters["point_reads"] += len(indexes)
        if data is None and len(indexes) * 2 >= index.count:
            data = self._get(ledger_id, first)
        parts: list[Entries] = []
        if data is not None:
            parts.append(index.entries(0, index.count, data, 0).take(indexes))
        else:
            runs = _runs(indexes.tolist(), _RUN_GAP_ENTRIES)
            for span in _spans(index, runs):
                a, b = span[0][0], span[-1][1]
                lo, hi = index.byte_range(a, b)
                if hi <= len(head):
                    body, at = head, 0
                else:
                    key = ledger_entries_key(self._topic, self._partition, ledger_id, first)
                    body, at = self._store.get_range(key, lo, hi), lo
                inside = indexes[(indexes >= a) & (indexes < b)]
                parts.append(index.entries(a, b, body, at).take(inside - a))
        keys = (np.int64(ledger_id) << 32) | (first + indexes)
        return Rows(
            keys,
            np.full(len(indexes), index.publish_time_ms, dtype=np.int64),
            concat_entries(parts),
        )

    def _object_index(
        self, ledger_id: int, first: int, data: bytes | None = None
    ) -> tuple[ObjectIndex, bytes]:
        """The object's index, and the leading bytes of it read along (b"" if none were)."""
        key = (ledger_id, first)
        index = self._indexes.get(key)
        if index is not None:
            self._indexes.move_to_end(key)
            return index, data or b""
        store_key = ledger_entries_key(self._topic, self._partition, ledger_id, first)
        head = data
        if head is None:
            head = self._store.get_range(store_key, 0, INDEX_PROBE_BYTES)
            need = index_length(head, store_key)
            if len(head) < need:
                head += self._store.get_range(store_key, len(head), need)
        index = decode_index(head, store_key)
        self._indexes[key] = index
        self._index_bytes += index.nbytes
        while self._index_bytes > self._index_cache_bytes and len(self._indexes) > 1:
            _, old = self._indexes.popitem(last=False)
            self._index_bytes -= old.nbytes
        return index, head

    def _get(self, ledger_id: int, first: int) -> bytes:
        data = self._cache.get((ledger_id, first))
        if data is not None:
            self._cache.move_to_end((ledger_id, first))
            return data
        data = self._store.get(ledger_entries_key(self._topic, self._partition, ledger_id, first))
        self._remember(ledger_id, first, data)
        return data

    def _remember(self, ledger_id: int, first: int, data: bytes) -> None:
        if len(data) > self._cache_bytes:
            return
        old = self._cache.pop((ledger_id, first), None)
        if old is not None:
            self._cached_bytes -= len(old)
        self._cache[(ledger_id, first)] = data
        self._cached_bytes += len(data)
        while self._cached_bytes > self._cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= len(evicted)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    # --- retention ------------------------------------------------------------------------

    def delete_ledgers(self, ledger_ids: list[int]) -> int:
        """Delete closed ledgers' objects (never the open one); returns objects deleted."""
        doomed = {i for i in ledger_ids if i != self.current_ledger}
        deleted = 0
        for ledger_id in sorted(doomed):
            for key in self._store.list(ledger_prefix(self._topic, self._partition, ledger_id)):
                self._store.delete(key)
                deleted += 1
            self._firsts.pop(ledger_id, None)
            for k in [k for k in self._marker_index if k[0] == ledger_id]:
                del self._marker_index[k]
            for k in [k for k in self._indexes if k[0] == ledger_id]:
                self._index_bytes -= self._indexes.pop(k).nbytes
            for k in [k for k in self._cache if k[0] == ledger_id]:
                self._cached_bytes -= len(self._cache.pop(k))
        self._ledgers = [x for x in self._ledgers if x.ledger_id not in doomed]
        return deleted


__all__ = [
    "PartitionLog",
    "LedgerInfo",
    "ReadReply",
    "StaleSequence",
    "Entries",
    "partition_prefix",
]


_RUN_GAP_ENTRIES = 32  # wanted entries this close share one run (the ones between ride along)
_SPAN_GAP_BYTES = 16 * 1024  # runs whose payloads are this close share one ranged read


def _runs(indexes: list[int], gap: int) -> list[tuple[int, int]]:
    """Sorted indexes as [lo, hi) runs, joining neighbours at most ``gap`` apart."""
    runs: list[tuple[int, int]] = []
    lo = prev = indexes[0]
    for i in indexes[1:]:
        if i - prev > gap:
            runs.append((lo, prev + 1))
            lo = i
        prev = i
    runs.append((lo, prev + 1))
    return runs


def _spans(index: ObjectIndex, runs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Runs grouped so that each group's payloads come with one ranged read."""
    spans: list[list[tuple[int, int]]] = [[runs[0]]]
    for run in runs[1:]:
        gap = index.byte_range(spans[-1][-1][1], run[0])
        if gap[1] - gap[0] <= _SPAN_GAP_BYTES:
            spans[-1].append(run)
        else:
            spans.append([run])
    return spans
