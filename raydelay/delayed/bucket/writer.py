"""Writing an immutable bucket: how a seal cuts sorted columns into segments
(:func:`cut_segments`), the write order that keeps a crash harmless (segments, then
meta, then the registry entry: :class:`BucketWriter`), a whole seal as one job
(:func:`sort_and_write`), and the retry budget of every store write the tracker makes
(:func:`store_write`, :data:`raydelay.retries.STORE_WRITE`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

import numpy as np

from raydelay.delayed import codec
from raydelay.delayed.columns import sort_order
from raydelay.delayed.common import Cols
from raydelay.delayed.registry import BucketRegistry
from raydelay.retries import STORE_WRITE, retry
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import bucket_prefix

log = logging.getLogger(__name__)

T = TypeVar("T")

Sleep = Callable[[float], None] | None  # how a retry waits (seconds); None: it does not


def segment_key(name: str, bucket_key: str, index: int) -> str:
    """The store key of segment ``index`` (0-based) of a tracker's bucket."""
    return f"{bucket_prefix(name, bucket_key)}/seg-{index + 1:06d}"


def store_write(what: str, call: Callable[[], T], sleep: Sleep) -> T:
    """``call()`` within the :data:`STORE_WRITE` budget: a transient failure is tried
    again (after a backoff when ``sleep`` is given), the last one is raised."""
    failures = 0

    def failed(exc: BaseException) -> None:
        nonlocal failures
        failures += 1
        log.info(
            "%s failed (try %d of %d), retrying: %s", what, failures, STORE_WRITE.attempts, exc
        )

    return retry(call, STORE_WRITE, sleep=sleep, on_failure=failed)


def cut_segments(d: np.ndarray, max_indexes: int, max_step_ms: int) -> list[tuple[int, int]]:
    """Segment bounds over sorted deliver_ats: a segment ends when it holds ``max_indexes``
    positions or when the next position would stretch its span beyond ``max_step_ms``."""
    bounds = []
    i, n = 0, len(d)
    while i < n:
        j = int(np.searchsorted(d, d[i] + max_step_ms, side="right"))
        j = max(i + 1, min(j, i + max_indexes, n))
        bounds.append((i, j))
        i = j
    return bounds


class BucketWriter:
    """Writes a bucket segment by segment, then its meta, then its registry entry (last).
    Leaving the ``with`` block on an error deletes what was written (best effort)."""

    def __init__(
        self,
        store: ObjectStore,
        registry: BucketRegistry,
        name: str,
        start: int,
        end: int,
        bucket_id: int,
        sleep: Sleep,
    ) -> None:
        self._store, self._registry, self._name = store, registry, name
        self._start, self._end, self._id = start, end, bucket_id
        self._sleep = sleep
        self._key = codec.bucket_key(start, end, bucket_id)
        self._metas: list[codec.SegmentMeta] = []
        self._written: list[str] = []
        self._registering: str | None = None  # the key of a registry put under way
        self.nbytes = 0

    def add_segment(self, cols: Cols) -> None:
        key = segment_key(self._name, self._key, len(self._metas))
        self._put(key, codec.encode_segment(*cols))
        self._metas.append(codec.segment_meta(*cols))

    def finish(self) -> tuple[codec.BucketMeta, int]:
        """Write the meta and the registry entry; returns the meta and the bytes written."""
        meta = codec.BucketMeta(self._start, self._end, self._id, tuple(self._metas))
        self._put(f"{bucket_prefix(self._name, self._key)}/meta", codec.encode_meta(meta))
        record = codec.encode_record(
            codec.RegistryRecord(self._start, self._end, self._id, len(self._metas), meta.count)
        )
        self._registering = meta.key
        store_write(
            f"registry put {meta.key}",
            lambda: self._registry.put(self._name, meta.key, record),
            self._sleep,
        )
        self._registering = None
        self._written = []
        return meta, self.nbytes

    def _put(self, key: str, data: bytes) -> None:
        store_write(f"put {key}", lambda: self._store.put(key, data), self._sleep)
        self._written.append(key)
        self.nbytes += len(data)

    def __enter__(self) -> BucketWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            return
        if self._registering is not None:  # the put may have landed and only its reply was lost
            try:
                self._registry.remove(self._name, self._registering)
            except Exception:  # noqa: BLE001 - recovery drops an entry whose meta is gone
                log.warning("registry entry %s may remain; recovery drops it", self._registering)
        for key in reversed(self._written):  # meta first: a meta never outlives a segment
            try:
                self._store.delete(key)
            except Exception:  # noqa: BLE001 - swept on recovery; the original error matters
                log.warning("cleanup of %s failed; it will be swept on recovery", key)


def sort_and_write(
    store: ObjectStore,
    registry: BucketRegistry,
    name: str,
    bucket: tuple[int, int, int],
    cols: Cols,
    max_per_segment: int,
    max_step_ms: int,
    sleep: Sleep,
) -> tuple[codec.BucketMeta, int, Cols]:
    """A seal of ``bucket`` (start ledger, end ledger, id): sort by (deliver_at, ledger,
    entry), cut into segments, write. Returns the meta, the bytes written and segment 1's
    columns."""
    d, l, e = cols  # noqa: E741
    order = sort_order(d, l, e)
    d, l, e = d[order], l[order], e[order]  # noqa: E741
    bounds = cut_segments(d, max_per_segment, max_step_ms)
    with BucketWriter(store, registry, name, *bucket, sleep) as writer:
        for a, b in bounds:
            writer.add_segment((d[a:b], l[a:b], e[a:b]))
        meta, nbytes = writer.finish()
    a, b = bounds[0]
    return meta, nbytes, (d[a:b].copy(), l[a:b].copy(), e[a:b].copy())
