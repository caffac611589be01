"""Reading one partition's log: whole objects, scattered positions, cancel markers.

:class:`LogReader` owns what reading keeps in memory: each ledger's object list (the
first entry of each object), a byte-bounded tail cache of whole objects, a byte-bounded
cache of object indexes, and each object's cancel markers.

- A sequential reader gets whole ledger objects (bytes), from the tail cache or else the
  store, and picks its entries: the log never decodes on that path.
- A reader of scattered positions (due delayed messages, redeliveries) gets only the rows
  it asked for (:class:`~raydelay.log.entries.Rows`): the object's index (its offsets and
  columns) comes from the index cache or a ranged read of its head, then just the payload
  bytes those entries need come with ranged reads, and the rows are taken out.

It uses the log's thread only (the caches take no lock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from raydelay.log.cache import LruCache
from raydelay.log.entries import (
    INDEX_PROBE_BYTES,
    DelayedRun,
    Entries,
    LedgerObject,
    ObjectIndex,
    Rows,
    concat_entries,
    decode_index,
    decode_object,
    index_length,
    int64_values,
)
from raydelay.log.ledgers import LedgerTable, Position
from raydelay.positions import KEY_DTYPE, key_of, ledger_groups, position_keys, split_keys
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import ledger_entries_key

ObjectKey = tuple[int, int]  # (ledger_id, first entry of the object)

_RUN_GAP_ENTRIES = 32  # wanted entries this close share one run (the ones between ride along)
_SPAN_GAP_BYTES = 16 * 1024  # runs whose payloads are this close share one ranged read


@dataclass(frozen=True)
class KeyRows:
    """Entries' keys and ``deliver_at`` at their position keys, row for row."""

    positions: np.ndarray
    keys: list[str | None]
    deliver_at_ms: np.ndarray


@dataclass(frozen=True)
class ReadReply:
    """Ledger objects (encoded bytes) holding entries at or after the requested position,
    in log order; ``tail`` is the last committed position (None: the log is empty)."""

    objects: list[bytes | DelayedRun]
    tail: Position | None


def ledger_prefix(topic: str, partition: int, ledger_id: int) -> str:
    return ledger_entries_key(topic, partition, ledger_id, 0).rsplit("/", 1)[0] + "/"


def _index_bytes(index: ObjectIndex) -> int:
    return index.nbytes


class LogReader:
    def __init__(
        self,
        *,
        store: ObjectStore,
        topic: str,
        partition: int,
        ledgers: LedgerTable,
        cache_bytes: int,
        index_cache_bytes: int,
    ) -> None:
        self._store = store
        self._topic, self._partition = topic, partition
        self._ledgers = ledgers
        self._objects: LruCache[ObjectKey, bytes] = LruCache(cache_bytes, len)
        self._indexes: LruCache[ObjectKey, ObjectIndex] = LruCache(index_cache_bytes, _index_bytes)
        self._firsts: dict[int, list[int]] = {}  # ledger -> first entries of its objects
        # the objects' cancel markers as (index in the object, target); small, and kept
        self._markers: dict[ObjectKey, list[tuple[int, Position]]] = {}
        self.point_reads = 0  # entries read at scattered positions

    @property
    def cached_bytes(self) -> int:
        """Bytes of whole objects in the tail cache."""
        return self._objects.size

    # --- what the log tells it ----------------------------------------------------------------

    def added(self, obj: LedgerObject, data: bytes) -> None:
        """A committed object (``data``: its bytes) is durable: readable from now on."""
        key = (obj.ledger_id, obj.first_entry)
        self._firsts.setdefault(obj.ledger_id, []).append(obj.first_entry)
        self._objects.put(key, data)
        self._markers[key] = sorted(obj.entries.cancels.items())

    def forget(self, ledger_id: int) -> None:
        """Drop what is kept of a deleted ledger."""
        self._firsts.pop(ledger_id, None)
        for key in [k for k in self._markers if k[0] == ledger_id]:
            del self._markers[key]
        self._indexes.discard(lambda key: key[0] == ledger_id)
        self._objects.discard(lambda key: key[0] == ledger_id)

    # --- objects --------------------------------------------------------------------------------

    def firsts(self, ledger_id: int) -> list[int]:
        """First entries of the ledger's objects (listed from the store once, then kept)."""
        firsts = self._firsts.get(ledger_id)
        if firsts is None:
            keys = self._store.list(ledger_prefix(self._topic, self._partition, ledger_id))
            firsts = sorted(
                int(k.rsplit("/", 1)[1].split(".")[0]) for k in keys if k.endswith(".entries")
            )
            self._firsts[ledger_id] = firsts
        return firsts

    def entries_end(self, ledger_id: int) -> int:
        """The entry after the last one in the ledger's objects in the store (0: none)."""
        firsts = self.firsts(ledger_id)
        if not firsts:
            return 0
        index = self.object_index(ledger_id, firsts[-1])[0]
        return index.first_entry + index.count

    def object_index(
        self, ledger_id: int, first: int, data: bytes | None = None
    ) -> tuple[ObjectIndex, bytes]:
        """The object's index, and the leading bytes of it read along (b"" if none were).
        ``data``, when given, is the whole object."""
        index = self._indexes.get((ledger_id, first))
        if index is not None:
            return index, data or b""
        store_key = self._key(ledger_id, first)
        head = data
        if head is None:
            head = self._store.get_range(store_key, 0, INDEX_PROBE_BYTES)
            need = index_length(head, store_key)
            if len(head) < need:
                head += self._store.get_range(store_key, len(head), need)
        index = decode_index(head, store_key)
        self._indexes.put((ledger_id, first), index)
        return index, head

    def position_at(self, time_ms: int, ledger_ids: list[int]) -> Position | None:
        """The first position of ``ledger_ids`` (ascending) published at or after
        ``time_ms`` (epoch ms), or None when every entry is older. Publish times only grow
        along the log, so this reads the last object's index of each ledger before the
        one that holds it, and a few in that one (a binary search)."""
        for ledger_id in ledger_ids:
            firsts = self.firsts(ledger_id)
            if not firsts or self._published(ledger_id, firsts[-1]) < time_ms:
                continue
            lo, hi = 0, len(firsts) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if self._published(ledger_id, firsts[mid]) >= time_ms:
                    hi = mid
                else:
                    lo = mid + 1
            return (ledger_id, firsts[lo])
        return None

    def _published(self, ledger_id: int, first: int) -> int:
        return self.object_index(ledger_id, first)[0].publish_time_ms

    def objects_of(self, ledger_id: int) -> Iterator[LedgerObject]:
        """The decoded objects of one ledger, in order (recovery of the topic's index)."""
        for first in self.firsts(ledger_id):
            yield decode_object(self._get(ledger_id, first))

    # --- reads ----------------------------------------------------------------------------------

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
        out: list[bytes | DelayedRun] = []
        taken = 0
        for info in self._ledgers.infos:
            if info.ledger_id < from_ledger:
                continue
            start = from_entry if info.ledger_id == from_ledger else 0
            end = self._ledgers.count_of(info.ledger_id) or 0
            if start >= end:
                continue
            firsts = self.firsts(info.ledger_id)
            for j, first in enumerate(firsts):
                upper = firsts[j + 1] if j + 1 < len(firsts) else end
                if upper <= start:
                    continue
                run = stand_in(info.ledger_id, first) if stand_in is not None else None
                last = out[-1] if out else None
                if (
                    run is not None
                    and isinstance(last, DelayedRun)
                    and (last.ledger_id, last.first_entry + last.count) == (run.ledger_id, first)
                ):  # consecutive stand-ins travel as one
                    out[-1] = DelayedRun(
                        run.ledger_id,
                        last.first_entry,
                        last.count + run.count,
                        min(last.min_deliver_at_ms, run.min_deliver_at_ms),
                    )
                else:
                    out.append(run if run is not None else self._get(info.ledger_id, first))
                # a stand-in carries no entries: it counts as one, not as its size
                taken += 1 if run is not None else upper - max(first, start)
                if taken >= max_entries:
                    return ReadReply(out, self._ledgers.tail())
        return ReadReply(out, self._ledgers.tail())

    def cancel_markers(self, from_position: Position) -> list[tuple[Position, Position]]:
        """Every cancel marker at or after ``from_position``: (marker, target) pairs, in log
        order."""
        from_ledger, from_entry = from_position
        out: list[tuple[Position, Position]] = []
        for info in self._ledgers.infos:
            if info.ledger_id < from_ledger:
                continue
            start = from_entry if info.ledger_id == from_ledger else 0
            for first in self.firsts(info.ledger_id):
                for index, target in self._markers_of(info.ledger_id, first):
                    if first + index >= start:
                        out.append(((info.ledger_id, first + index), target))
        return out

    def read_positions(self, positions: list[Position] | np.ndarray) -> Rows:
        """The entries at ``positions`` ((ledger, entry) pairs, or int64 position keys
        ``ledger << 32 | entry``), taken out of their objects as rows sorted by position
        (positions not in the log are skipped). Payloads come with ranged reads of just the
        runs they lie in (close positions share a read), or from the whole object when
        most of it is wanted or it is cached."""
        if isinstance(positions, np.ndarray):
            keys = positions.astype(np.int64, copy=False)
        else:
            keys = np.array([key_of(int(lg), int(e)) for lg, e in positions], dtype=KEY_DTYPE)
        parts = [self._take(lg, first, idx) for lg, first, idx in self._by_object(keys)]
        return Rows.concat(parts)

    def _by_object(self, keys: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """The log's positions among ``keys`` (position keys), by the object holding them:
        (ledger, the object's first entry, their indexes in it), in position order."""
        ledgers, entries = split_keys(np.unique(keys))
        for ledger_id, same in ledger_groups(ledgers):
            es = entries[same]
            count = self._ledgers.count_of(ledger_id)
            if count is None:
                continue
            es = es[es < count]
            firsts = np.asarray(self.firsts(ledger_id), dtype=np.int64)
            slot = np.searchsorted(firsts, es, side="right") - 1
            for j in np.unique(slot[slot >= 0]).tolist():
                first = int(firsts[j])
                yield ledger_id, first, es[slot == j] - first

    def key_rows(self, positions: np.ndarray) -> KeyRows:
        """The keys and ``deliver_at`` of the entries at ``positions`` (int64 position keys),
        from their objects' indexes alone: no payload is read (a key check needs no more).
        Positions not in the log are left out."""
        found, texts, due = [], [], []
        for ledger_id, first, idx in self._by_object(np.asarray(positions, dtype=np.int64)):
            index, _ = self.object_index(ledger_id, first, self._objects.get((ledger_id, first)))
            found.append(key_of(ledger_id, first) + idx)
            due.append(int64_values(index.meta.column(0))[idx])
            texts += index.meta.column(1).take(pa.array(idx)).to_pylist()
        if not found:
            return KeyRows(np.zeros(0, np.int64), [], np.zeros(0, np.int64))
        return KeyRows(np.concatenate(found), texts, np.concatenate(due))

    # --- inside -------------------------------------------------------------------------------

    def _markers_of(self, ledger_id: int, first: int) -> list[tuple[int, Position]]:
        """(index in the object, target) of an object's cancel markers, decoded once."""
        found = self._markers.get((ledger_id, first))
        if found is None:
            index = self.object_index(ledger_id, first)[0]
            found = self._markers[(ledger_id, first)] = sorted(index.cancels.items())
        return found

    def _take(self, ledger_id: int, first: int, indexes: np.ndarray) -> Rows:
        data = self._objects.get((ledger_id, first))
        index, head = self.object_index(ledger_id, first, data)
        self.point_reads += len(indexes)
        if data is None and len(indexes) * 2 >= index.count:
            data = self._get(ledger_id, first)
        parts: list[Entries] = []
        if data is not None:
            parts.append(index.entries(0, index.count, data, 0).take(indexes))
        else:
            for span in _spans(index, _runs(indexes.tolist(), _RUN_GAP_ENTRIES)):
                a, b = span[0][0], span[-1][1]
                lo, hi = index.byte_range(a, b)
                if hi <= len(head):
                    body, at = head, 0
                else:
                    body, at = self._store.get_range(self._key(ledger_id, first), lo, hi), lo
                inside = indexes[(indexes >= a) & (indexes < b)]
                parts.append(index.entries(a, b, body, at).take(inside - a))
        keys = position_keys(np.full(len(indexes), ledger_id), first + indexes)
        return Rows(
            keys,
            np.full(len(indexes), index.publish_time_ms, dtype=np.int64),
            concat_entries(parts),
        )

    def _get(self, ledger_id: int, first: int) -> bytes:
        data = self._objects.get((ledger_id, first))
        if data is None:
            data = self._store.get(self._key(ledger_id, first))
            self._objects.put((ledger_id, first), data)
        return data

    def _key(self, ledger_id: int, first: int) -> str:
        return ledger_entries_key(self._topic, self._partition, ledger_id, first)


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
