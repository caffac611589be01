"""The store side of a partition's sealed buckets (see :mod:`raydelay.delayed.sealed`).

One bucket is three objects under ``topics/<topic>/<partition>/buckets/<key>/``: ``data``
(its segments back to back), ``index`` (each segment's position keys) then ``meta``,
written in that order; the topic registers the bucket in the coordinator only after all
three are durable. A bucket in the store but not
in the registry is an orphan of a seal that died half-way; the topic deletes it.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.delayed.sealed import (
    SealedMeta,
    bucket_object,
    decode_index,
    decode_meta,
    decode_segment,
    encode_meta,
    registry_name,
    segment_of,
)
from raydelay.errors import CodecError, NotFound
from raydelay.log.cache import LruCache
from raydelay.log.entries import Rows
from raydelay.positions import SHIFT
from raydelay.storage.base import ObjectStore

log = logging.getLogger(__name__)

_INDEXES_KEPT = 4  # a few: lookups of gone ledgers are rare


class SealedStore:
    def __init__(
        self, store: ObjectStore, topic: str, partition: int, meta_cache: int = 16
    ) -> None:
        self._store = store
        self._topic, self._partition = topic, partition
        self._metas: LruCache[str, SealedMeta] = LruCache(meta_cache)
        self._indexes: LruCache[str, tuple] = LruCache(_INDEXES_KEPT)
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

    def segment_keys(self, meta: SealedMeta) -> tuple:
        """Each segment's position keys: from a format 1 meta, or the bucket's index."""
        if meta.segment_keys is not None:
            return meta.segment_keys
        with self._lock:
            found = self._indexes.get(meta.key)
        if found is not None:
            return found
        raw = self._store.get(self._key(meta.key, "index"))
        found = decode_index(raw, f"bucket {meta.key} index")
        if len(found) != len(meta.segments):
            raise CodecError(
                f"bucket {meta.key} index: {len(found)} segments, its meta has {len(meta.segments)}"
            )
        with self._lock:
            self._indexes.put(meta.key, found)
        return found

    def segment(self, key: str, offset: int, length: int) -> Rows:
        data = self._store.get_range(self._key(key, "data"), offset, offset + length)
        return decode_segment(data, f"bucket {key} segment at {offset}")

    def read_positions(self, keys: np.ndarray, buckets: list[tuple[int, int, str]]) -> Rows:
        """Rows of ``keys`` found in the buckets ``(start ledger, end ledger, key)`` whose range
        covers their ledger (for positions whose ledger is gone from the log)."""
        parts: list[Rows] = []
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
                where = segment_of(self.segment_keys(meta), inside)
            except NotFound:
                continue  # deleted meanwhile
            for no in np.unique(where[where >= 0]).tolist():
                seg = meta.segments[no]
                rows = self.segment(bkey, seg.offset, seg.length)
                idx = np.flatnonzero(np.isin(rows.positions, inside[where == no]))
                parts.append(
                    Rows(rows.positions[idx], rows.publish_time_ms[idx], rows.entries.take(idx))
                )
        return Rows.concat(parts)

    def delete(self, key: str) -> int:
        """Delete a bucket's objects (meta first: a half-deleted bucket is an orphan)."""
        for what in ("meta", "index", "data"):
            self._store.delete(self._key(key, what))
        with self._lock:
            self._metas.pop(key)
            self._indexes.pop(key)
        return 3

    def stored_keys(self) -> set[str]:
        """The bucket keys that have any object in the store."""
        prefix = registry_name(self._topic, self._partition) + "/"
        return {k[len(prefix) :].split("/", 1)[0] for k in self._store.list(prefix)}

    def _key(self, key: str, what: str) -> str:
        return bucket_object(self._topic, self._partition, key, what)
