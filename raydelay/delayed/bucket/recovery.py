"""Recovery from the store: which buckets a restarted tracker takes up (the registry's
entries whose meta exists and that no merged bucket supersedes), where each one resumes
(its first segment not wholly due), and the sweep of objects no entry names (left by a
crash mid-write or mid-delete)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from raydelay.delayed import codec
from raydelay.delayed.registry import BucketRegistry
from raydelay.errors import NotFound
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import bucket_prefix

log = logging.getLogger(__name__)

A = TypeVar("A")
B = TypeVar("B")

_MAX_READ_THREADS = 16


def parallel_map(fn: Callable[[A], B], items: Sequence[A], *, threads: bool) -> list[B]:
    """``[fn(x) for x in items]``, on up to 16 threads when ``threads`` (store reads)."""
    if not threads or len(items) <= 1:
        return [fn(x) for x in items]
    workers = min(_MAX_READ_THREADS, len(items))
    with ThreadPoolExecutor(workers, thread_name_prefix="raydelay-recover") as pool:
        return list(pool.map(fn, items))


def read_live_metas(
    store: ObjectStore, registry: BucketRegistry, name: str, *, threads: bool
) -> tuple[list[codec.BucketMeta], int]:
    """The metas of the buckets to take up, and the next bucket id to use (1 when there is
    no bucket). Registry entries without a meta, or superseded by a merged
    bucket, are removed."""
    records = registry.list(name)
    recs = [codec.decode_record(raw, f"registry {name}/{key}") for key, raw in records.items()]

    def read_meta(rec: codec.RegistryRecord) -> codec.BucketMeta | None:
        key = f"{bucket_prefix(name, rec.key)}/meta"
        try:
            return codec.decode_meta(store.get(key), key)
        except NotFound:
            return None

    found = parallel_map(read_meta, recs, threads=threads)
    for rec, meta in zip(recs, found):
        if meta is None:  # a seal that failed after its registry put landed: nothing to load
            log.warning("tracker %s: bucket %s has no meta; dropping it", name, rec.key)
            registry.remove(name, rec.key)
    metas = [m for m in found if m is not None]
    # A crash between a merge's registry write and the removal of its sources leaves
    # both: the newer bucket whose range contains an older one supersedes it.
    live: list[codec.BucketMeta] = []
    for m in sorted(metas, key=lambda m: (m.start_ledger, -m.end_ledger, -m.bucket_id)):
        if any(
            o.start_ledger <= m.start_ledger
            and m.end_ledger <= o.end_ledger
            and o.bucket_id > m.bucket_id
            for o in metas
            if o is not m
        ):
            registry.remove(name, m.key)
            continue
        live.append(m)
    next_id = max((m.bucket_id for m in metas), default=0) + 1
    return live, next_id


def first_pending_segment(meta: codec.BucketMeta, cutoff: int) -> int | None:
    """The index of the bucket's first segment with a position due after ``cutoff``
    (epoch ms); None when all of it is due (the log replay delivers it)."""
    return next((i for i, s in enumerate(meta.segments) if s.max_deliver_at_ms > cutoff), None)


def sweep_orphans(store: ObjectStore, name: str, live_keys: set[str]) -> int:
    """Delete the bucket objects of ``name`` that belong to no bucket in ``live_keys``;
    returns how many."""
    prefix = f"{name}/buckets/"
    doomed = [k for k in store.list(prefix) if k[len(prefix) :].split("/", 1)[0] not in live_keys]
    for k in doomed:
        store.delete(k)
    return len(doomed)
