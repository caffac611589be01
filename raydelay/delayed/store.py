"""The store side of a partition's sealed buckets (see :mod:`raydelay.delayed.sealed`).

One bucket is three objects under ``topics/<topic>/<partition>/buckets/<key>/``: ``data``
(its segments back to back), ``index`` (each segment's position keys) then ``meta``,
written in that order; the topic registers the bucket in the coordinator only after all
three are durable. A bucket in the store but not in the registry is an orphan of a seal
that died half-way; the topic deletes it.

A merged bucket writes only its ``meta``: its runs' ``data`` and ``index`` objects stay
under the keys of the buckets that sealed them, and belong to it from the moment the
registry names it in place of its sources (see :func:`orphans`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import msgpack
import numpy as np

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.delayed.sealed import (
    RunInfo,
    SealedMeta,
    decode_index,
    decode_meta,
    decode_segment,
    encode_index,
    encode_meta,
    merge_metas,
    registry_name,
    segment_of,
)
from raydelay.errors import CodecError, NotFound
from raydelay.log.cache import LruCache
from raydelay.log.entries import Rows
from raydelay.log.reader import KeyRows
from raydelay.positions import SHIFT
from raydelay.storage.base import ObjectStore

log = logging.getLogger(__name__)

_INDEXES_KEPT = 16  # lookups of gone ledgers: cancels and key checks
_KEY_ROWS_KEPT = 500_000  # rows of segments whose keys are kept for key checks


class SealedStore:
    def __init__(
        self,
        store: ObjectStore,
        topic: str = "",
        partition: int = 0,
        meta_cache: int = 16,
        *,
        prefix: str | None = None,
    ) -> None:
        """The buckets of a topic's partition, or (``prefix``) those under another key
        prefix: a :class:`~raydelay.delayed.tracker.BucketDelayedDeliveryTracker`'s."""
        self._store = store
        self._prefix = prefix if prefix is not None else registry_name(topic, partition)
        self._metas: LruCache[str, SealedMeta] = LruCache(meta_cache)
        self._indexes: LruCache[str, tuple] = LruCache(_INDEXES_KEPT)
        # (run key, segment offset) -> its rows' keys (no payloads), for key checks
        self._key_rows: LruCache[tuple[str, int], KeyRows] = LruCache(
            _KEY_ROWS_KEPT, size_of=lambda r: len(r.positions)
        )
        self._lock = threading.Lock()  # the seal thread and readers share the caches

    def write(self, meta: SealedMeta, data: bytes, index: bytes) -> int:
        """Write a bucket's objects (data, index, then meta); returns the bytes written."""
        encoded = encode_meta(meta)
        self._store.put(self._key(meta.key, "data"), data)
        self._store.put(self._key(meta.key, "index"), index)
        self._store.put(self._key(meta.key, "meta"), encoded)
        return len(data) + len(index) + len(encoded)

    def meta(self, key: str) -> SealedMeta:
        with self._lock:
            found = self._metas.get(key)
        if found is not None:
            return found
        meta = decode_meta(self._store.get(self._key(key, "meta")), f"bucket {key} meta")
        with self._lock:
            self._metas.put(key, meta)
        return meta

    def segment_keys(self, meta: SealedMeta, run: int = 0) -> tuple:
        """Each segment's position keys, of one run of a bucket: from a format 1 meta, or
        the run's index object."""
        if meta.segment_keys is not None:
            return meta.segment_keys
        info = meta.runs[run]
        with self._lock:
            found = self._indexes.get(info.key)
        if found is not None:
            return found
        raw = self._store.get(self._key(info.key, "index"))
        found = decode_index(raw, f"bucket {info.key} index")
        if len(found) != len(info.segments):
            raise CodecError(
                f"bucket {info.key} index: {len(found)} segments, its meta has {len(info.segments)}"
            )
        with self._lock:
            self._indexes.put(info.key, found)
        return found

    def part_keys(self, meta: SealedMeta, parts) -> list[np.ndarray]:
        """The position keys of segments of ``meta`` (each part names its ``run`` and its
        ``segment`` in it, as a load's ``keys_only`` does), from their runs' indexes."""
        return [bitmap64_values(self.segment_keys(meta, p.run)[p.segment]) for p in parts]

    def write_merged(self, meta: SealedMeta, sources: list[SealedMeta]) -> int:
        """Write a merged bucket: its meta only (its runs stay where they are), after an
        index object for a source of format 1, which carried its segments' keys in its
        meta. Returns the bytes written."""
        written = 0
        for src in sources:
            if src.segment_keys is not None:
                raw = encode_index(src.segment_keys)
                self._store.put(self._key(src.key, "index"), raw)
                written += len(raw)
        encoded = encode_meta(meta)
        self._store.put(self._key(meta.key, "meta"), encoded)
        return written + len(encoded)

    def segment(self, key: str, offset: int, length: int) -> Rows:
        data = self._store.get_range(self._key(key, "data"), offset, offset + length)
        return decode_segment(data, f"bucket {key} segment at {offset}")

    def read_positions(self, keys: np.ndarray, buckets: list[tuple[int, int, str]]) -> Rows:
        """Rows of ``keys`` found in the buckets ``(start ledger, end ledger, key)`` whose range
        covers their ledger (for positions whose ledger is gone from the log)."""
        return Rows.concat(self._each_run(keys, buckets, self._read_run))

    def key_rows(self, keys: np.ndarray, buckets: list[tuple[int, int, str]]) -> KeyRows:
        """The keys and ``deliver_at`` of the rows of ``keys`` found in the buckets (what
        :meth:`read_positions` finds, without payloads): each segment's keys are kept once
        read (up to _KEY_ROWS_KEPT rows), since the checks of a key index come back to the
        same segments again and again."""
        parts = self._each_run(keys, buckets, self._key_run)
        if not parts:
            return KeyRows(np.zeros(0, np.int64), [], np.zeros(0, np.int64))
        return KeyRows(
            np.concatenate([p.positions for p in parts]),
            [k for p in parts for k in p.keys],
            np.concatenate([p.deliver_at_ms for p in parts]),
        )

    def _each_run(self, keys: np.ndarray, buckets: list[tuple[int, int, str]], read) -> list:
        """``read(meta, run no, run, its keys)`` of each bucket run holding some of ``keys``."""
        parts: list = []
        ledgers = keys >> SHIFT
        for start, end, bkey in buckets:
            inside = keys[(ledgers >= start) & (ledgers <= end)]
            if not len(inside):
                continue
            try:
                meta = self.meta(bkey)
                hit = meta.keys & bitmap64_of(inside)
                if not hit:
                    continue  # none of them is in this bucket: its index is not needed
                inside = bitmap64_values(hit).astype(np.int64)
                for no, run in enumerate(meta.runs):
                    lo, hi = run.ledgers
                    mine = inside[((inside >> SHIFT) >= lo) & ((inside >> SHIFT) <= hi)]
                    if len(mine):
                        parts += read(meta, no, run, mine)
            except NotFound:
                continue  # deleted meanwhile
        return parts

    def _read_run(self, meta: SealedMeta, no: int, run: RunInfo, keys: np.ndarray) -> list[Rows]:
        where = segment_of(self.segment_keys(meta, no), keys)
        out = []
        for seg_no in np.unique(where[where >= 0]).tolist():
            seg = run.segments[seg_no]
            rows = self.segment(run.key, seg.offset, seg.length)
            idx = np.flatnonzero(np.isin(rows.positions, keys[where == seg_no]))
            out.append(Rows(rows.positions[idx], rows.publish_time_ms[idx], rows.entries.take(idx)))
        return out

    def _key_run(self, meta: SealedMeta, no: int, run: RunInfo, keys: np.ndarray) -> list:
        where = segment_of(self.segment_keys(meta, no), keys)
        out = []
        for seg_no in np.unique(where[where >= 0]).tolist():
            seg = run.segments[seg_no]
            with self._lock:
                table = self._key_rows.get((run.key, seg.offset))
            if table is None:
                rows = self.segment(run.key, seg.offset, seg.length)
                order = np.argsort(rows.positions, kind="stable")  # (by position: searchable)
                texts = rows.entries.batch.column(2).to_pylist()  # (own objects: no bytes kept)
                table = KeyRows(
                    rows.positions[order],
                    [texts[i] for i in order.tolist()],
                    rows.entries.deliver_at_ms[order],
                )
                with self._lock:
                    self._key_rows.put((run.key, seg.offset), table)
            if not len(table.positions):
                continue
            wanted = keys[where == seg_no]  # (every one is in the segment: its index says so)
            at = np.minimum(np.searchsorted(table.positions, wanted), len(table.positions) - 1)
            idx = at[table.positions[at] == wanted]
            keys_found = [table.keys[i] for i in idx.tolist()]
            out.append(KeyRows(table.positions[idx], keys_found, table.deliver_at_ms[idx]))
        return out

    def delete(self, key: str) -> int:
        """Delete a registered bucket: its runs' data and index objects, then its meta (a
        bucket left half-deleted keeps its meta, so a second try finds its runs). With no
        meta stored, only the objects under ``key`` go. Returns the objects deleted."""
        try:
            runs = [r.key for r in self.meta(key).runs]
        except NotFound:
            runs = [key]
        for run in runs:
            self._delete_run(run)
        self.delete_meta(key)
        return 2 * len(runs) + 1

    def delete_objects(self, key: str) -> int:
        """Delete the objects under ``key`` only (an orphan: a bucket the registry does not
        name; a merged one's runs belong to the buckets that are registered)."""
        self._delete_run(key)
        self.delete_meta(key)
        return 3

    def _delete_run(self, key: str) -> None:
        for what in ("data", "index"):
            self._store.delete(self._key(key, what))
        with self._lock:
            self._indexes.pop(key)

    def delete_meta(self, key: str) -> None:
        """Delete a bucket's meta only: a source of a merge, whose runs the merged bucket
        owns now."""
        self._store.delete(self._key(key, "meta"))
        with self._lock:
            self._metas.pop(key)

    def stored_keys(self) -> set[str]:
        """The bucket keys that have any object in the store."""
        prefix = self._prefix + "/"
        return {k[len(prefix) :].split("/", 1)[0] for k in self._store.list(prefix)}

    def _key(self, key: str, what: str) -> str:
        return f"{self._prefix}/{key}/{what}"


# register(sources, merged meta, its registry record, each source's run count) -> whether
# the merged bucket is registered in place of the sources (False: a source is gone)
Register = Callable[[list[str], SealedMeta, bytes, list[int]], bool]


def record_of(meta: SealedMeta) -> bytes:
    """A bucket's registry record: its rows and groups, and a merged one's run keys."""
    if not meta.merged_runs:
        return msgpack.packb([meta.count, len(meta.segments)])
    return msgpack.packb([meta.count, len(meta.groups), [r.key for r in meta.merged_runs]])


def runs_of(records: dict[str, bytes]) -> dict[str, list[str]]:
    """Per registered bucket, the keys of the runs it owns (from its registry record: a
    merged bucket's names them; any other owns only its own)."""
    out = {}
    for key, raw in records.items():
        rec = msgpack.unpackb(raw)
        out[key] = [str(k) for k in rec[2]] if len(rec) > 2 else [key]
    return out


def merge(
    sealed: SealedStore,
    keys: list[str],
    *,
    bucket_id: int,
    group_rows: int,
    register: Register,
) -> tuple[SealedMeta, int] | None:
    """Merge the adjacent buckets ``keys``: write the merged meta, have ``register`` put it
    in the registry in place of them (one step, which carries the subscriptions' progress
    over), then drop their metas, whose runs it owns now. Returns the merged meta and the
    bytes written, or None when a source was gone (its meta is deleted again).

    A crash between any two steps leaves the sources valid: before ``register`` the
    merged meta is an orphan, after it the sources' metas are (:func:`clean`)."""
    metas = [sealed.meta(k) for k in keys]
    merged = merge_metas(metas, bucket_id=bucket_id, group_rows=group_rows)
    written = sealed.write_merged(merged, metas)
    if not register(keys, merged, record_of(merged), [len(m.runs) for m in metas]):
        sealed.delete_meta(merged.key)
        return None
    for k in keys:
        sealed.delete_meta(k)
    return merged, written


def merge_window(rows: list[int], excess: int) -> list[int]:
    """Which adjacent buckets to merge next, given each one's rows (in ledger order) and
    how many buckets too many there are: the window of up to 4 (fewer when fewer would do)
    with the fewest rows, the earliest on a tie."""
    width = max(2, min(4, excess + 1, len(rows)))
    best = min(range(len(rows) - width + 1), key=lambda i: (sum(rows[i : i + width]), i))
    return list(range(best, best + width))


def clean(sealed: SealedStore, records: dict[str, bytes]) -> list[str]:
    """A partition's recovery: delete what a seal or a merge that died half-way left in
    the store, given the registry's records; returns the keys touched."""
    strays, sources = orphans(sealed.stored_keys(), runs_of(records))
    for key in strays:
        log.warning("deleting orphan bucket %s", key)
        sealed.delete_objects(key)
    for key in sources:  # a merge that registered its bucket, then died
        sealed.delete_meta(key)
    return strays + sources


def orphans(stored: set[str], owned: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """What a partition's recovery deletes, given the bucket keys with objects in the store
    and, per registered bucket, the run keys it owns: (keys whose every object goes, keys
    whose meta only goes: a merge's sources, whose runs a registered bucket owns)."""
    runs = {r for rs in owned.values() for r in rs}
    strays = sorted(k for k in stored if k not in owned)
    return [k for k in strays if k not in runs], [k for k in strays if k in runs]
