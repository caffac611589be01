"""BucketDelayedDeliveryTracker: the §5.2 tracker (Pulsar's PIP-195 API), as a
single-process use of the engine every partition runs.

It holds positions only (no payloads), and uses the partition's code for everything else:

- the mutable bucket gathers new positions; once it holds ``min_index_count_per_bucket``
  and a position from a later ledger arrives, it is sealed by :func:`~raydelay.delayed.
  sealed.seal` (the same sort, segment cut and Arrow segment format as a topic's bucket,
  with empty payloads) and written by :class:`~raydelay.delayed.store.SealedStore`, then
  put in the registry;
- sealed buckets are read by a :class:`~raydelay.delayed.reader.SealedReader` (the one a
  subscription uses), one group of segments per run at a time, loaded when it comes due
  (``prefetch_ms`` ahead);
- above ``max_num_buckets`` adjacent buckets are merged by :func:`~raydelay.delayed.store.
  merge` (a meta over their runs, no segment rewritten), and the reader takes the merged
  bucket over where it stood;
- a new tracker over the same store and registry recovers the way a partition does: it
  deletes what a seal or merge that died half-way left, loads every meta, and skips the
  segments already due (the log replay from mark-delete delivers those).

What only the tracker needs: the membership of tracked positions (a cancel, a re-add with
another deliver_at), and a ``cancels`` object that keeps a restart from bringing back a
persisted copy of a position cancelled or re-added since (``<name>/cancels``).

Store I/O runs on the caller's thread. A write is tried by :data:`raydelay.retries.
STORE_WRITE`; a seal whose writes keep failing leaves its positions in memory (nothing is
lost) and counts a downgrade.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgpack
import numpy as np
from pyroaring import BitMap64

from raydelay.clock import Clock
from raydelay.delayed.columns import (
    Run,
    check_position,
    check_positions,
    concat,
    ledger_groups,
)
from raydelay.delayed.common import (
    Cols,
    TrackerBase,
    check_clock,
    check_max_messages,
    check_positive_int,
    due_window_counts,
)
from raydelay.delayed.index import Membership, RunQueue, bitmap64_of
from raydelay.delayed.reader import FINISHED, SealedReader
from raydelay.delayed.registry import BucketRegistry
from raydelay.delayed.sealed import SealedMeta, parse_bucket_key, seal
from raydelay.delayed.store import (
    SealedStore,
    clean,
    merge,
    merge_window,
    record_of,
    runs_of,
)
from raydelay.errors import CodecError, InvalidArgument, NotFound, RaydelayError
from raydelay.limits import check_limit
from raydelay.log.entries import Entries, Rows
from raydelay.positions import position_keys, split_keys
from raydelay.retries import STORE_WRITE, retry
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import validate_key

log = logging.getLogger(__name__)

CANCELS_VERSION = 1
_PULL = 4_096  # rows moved from loaded segments to the queue at a time, at least


class BucketDelayedDeliveryTracker(TrackerBase):
    def __init__(
        self,
        *,
        store: ObjectStore,
        registry: BucketRegistry,
        name: str,
        clock: Clock,
        tick_time_ms: int = 1000,
        strict: bool = False,
        min_index_count_per_bucket: int = 50_000,
        max_time_step_per_segment_ms: int = 300_000,
        max_indexes_per_segment: int = 5_000,
        max_num_buckets: int = 64,
        mark_delete: Callable[[], tuple[int, int]] | None = None,
        prefetch_ms: int = 0,
    ) -> None:
        """``prefetch_ms``: how long before a segment's first deliver_at it is loaded."""
        for method in ("put", "get", "get_range", "delete", "list"):
            if not callable(getattr(store, method, None)):
                raise InvalidArgument(f"store: expected an ObjectStore, it lacks {method}()")
        for method in ("list", "put", "remove"):
            if not callable(getattr(registry, method, None)):
                raise InvalidArgument(f"registry: expected a BucketRegistry, it lacks {method}()")
        if not isinstance(name, str):
            raise InvalidArgument(f"name: expected a str key prefix, got {type(name).__name__}")
        self._name = validate_key(name)
        self._store = store
        self._registry = registry
        self._clock = check_clock(clock)
        self._tick_time_ms = check_positive_int("tick_time_ms", tick_time_ms)
        self._strict = bool(strict)
        self._min_count = check_positive_int(
            "min_index_count_per_bucket", min_index_count_per_bucket
        )
        self._max_step_ms = check_positive_int(
            "max_time_step_per_segment_ms", max_time_step_per_segment_ms
        )
        self._max_per_segment = check_limit("max_indexes_per_segment", max_indexes_per_segment)
        self._max_buckets = check_limit("max_num_buckets", max_num_buckets)
        if mark_delete is not None and not callable(mark_delete):
            raise InvalidArgument(
                "mark_delete: expected a callable returning (ledger_id, entry_id)"
            )
        self._mark_delete = mark_delete
        self._prefetch_ms = check_positive_int("prefetch_ms", prefetch_ms, allow_zero=True)

        self._members = Membership()
        self._queue = RunQueue()
        self._mutable = MutableBucket()
        self._sealed = SealedStore(store, prefix=f"{self._name}/buckets", meta_cache=256)
        # one group of segments loaded per run at a time, when it comes due
        self._reader = SealedReader(
            lookahead_ms=self._prefetch_ms, max_loaded_rows=1, max_loaded_total=2**62
        )
        self._sealed_end = -1
        self._cancels = BitMap64()  # positions whose persisted copy must not come back
        self._cancels_dirty = False
        self._trimmed_below = -1
        self._next_id = 0
        self._closed = False
        self.counters = {
            "sealed": 0,
            "merged": 0,
            "deleted": 0,
            "downgraded": 0,
            "segments_loaded": 0,
            "bytes_written": 0,
        }
        self._recover()

    # == public API =====================================================================

    def add_messages(
        self, ledger_ids: object, entry_ids: object, deliver_ats: object
    ) -> np.ndarray:
        self._check_open()
        ls, es, ds = check_positions(ledger_ids, entry_ids, deliver_ats)
        result = np.ones(len(ls), dtype=bool)
        if len(ls) == 0:
            return result
        (ls, es, ds), untracked = self._split_due(ls, es, ds, result)
        self._cancel_persisted(untracked[0], untracked[1])
        md_ledger = self._mark_delete_ledger()
        if md_ledger is not None and len(ls) and int(ls.min()) < md_ledger:
            keep = ls >= md_ledger  # below mark-delete: acknowledged already, dropped
            ls, es, ds = ls[keep], es[keep], ds[keep]
        if len(ls):
            new = self._members.add(ds, ls, es)
            if not new.all():
                ls, es, ds = ls[new], es[new], ds[new]
            if len(ls):
                self._route(ds, ls, es)
        self._write_cancels()
        return result

    def _take_due(self, max_messages: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        self._check_open()
        n = check_max_messages(max_messages)
        cutoff = self._cutoff()
        self._trim()
        more = self._pull(cutoff, n)

        def refill(room: int) -> bool:  # (the sealed buckets may hold more due)
            nonlocal more
            if not more:
                return False
            more = self._pull(cutoff, room)
            return True

        out_l, out_e = self._pop(cutoff, n, refill)
        self._retire()
        self._write_cancels()
        return out_l, out_e

    def has_message_available(self) -> bool:
        self._check_open()
        cutoff = self._cutoff()
        self._trim()
        more = self._pull(cutoff, _PULL)
        while True:
            if self._queue.has_live_due(cutoff, self._members):
                return True
            if not more:
                return False
            more = self._pull(cutoff, _PULL)

    def buffer_memory_usage(self) -> int:
        memory = self._queue.nbytes() + self._mutable.nbytes() + self._members.nbytes()
        return memory + self._reader.nbytes() + len(self._cancels.serialize())

    def should_pause_all_deliveries(self) -> bool:
        return False

    def next_delivery_time(self) -> int | None:
        if self._members.count == 0:
            return None
        candidates = [self._queue.min_d(), self._mutable.min_d, self._reader.next_time()]
        known = [c for c in candidates if c is not None]
        return min(known) if known else None

    def remove_message(self, ledger_id: int, entry_id: int) -> bool:
        """Cancel a tracked position wherever it lives; True if it was tracked."""
        self._check_open()
        ledger_id, entry_id = check_position(ledger_id, entry_id)
        if not self._members.remove(ledger_id, entry_id):
            return False
        self._cancel_persisted(np.asarray([ledger_id]), np.asarray([entry_id]))
        self._write_cancels()
        return True

    def due_histogram(self, edges: np.ndarray) -> list[int]:
        """Pending messages per due window (see :func:`due_window_counts`): exact for what
        is in memory, spread over each unloaded segment's deliver_at range."""
        edges = np.asarray(edges, dtype=np.int64)
        exact = self._queue.columns() + self._mutable.parts()
        out = np.asarray(due_window_counts(edges, exact, self._members, []), dtype=np.int64)
        return (out + np.asarray(self._reader.due_histogram(edges), dtype=np.int64)).tolist()

    def persisted_through(self) -> int:
        """Every delayed position of the ledgers up to this one was sealed into a bucket
        (a restart finds it there), had fallen due, or was untracked. A restarted
        subscription re-reads only the log after it, plus the positions of these ledgers
        that are neither acknowledged nor tracked (see Subscription.resume_after_buckets)."""
        return self._sealed_end

    def immutable_bucket_count(self) -> int:
        return len(self._reader.buckets)

    def flush(self) -> None:
        """Write what is still pending (the cancels, when their last write failed); the
        store's error when it fails again."""
        self._check_open()
        self._write_cancels(raise_errors=True)

    def clear(self) -> None:
        """Forget everything and delete every bucket object and registry entry."""
        self._check_open()
        for key in self._registry.list(self._name):
            self._registry.remove(self._name, key)
        for key in self._store.list(f"{self._name}/buckets/"):
            self._store.delete(key)
        self._store.delete(self._cancels_key)
        self._members.clear()
        self._queue.clear()
        self._mutable.clear()
        self._reader = SealedReader(
            lookahead_ms=self._prefetch_ms, max_loaded_rows=1, max_loaded_total=2**62
        )
        self._sealed_end = -1
        self._cancels = BitMap64()
        self._cancels_dirty = False
        self._trimmed_below = -1

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True

    def stats(self) -> dict[str, int]:
        return {
            "delayed": self._members.count,
            "buckets": len(self._reader.buckets),
            "mutable": self._mutable.count,
            "loaded_indexes": sum(len(c[0]) for c in self._queue.columns())
            + self._mutable.count
            + self._reader.loaded_rows(),
            "memory_bytes": self.buffer_memory_usage(),
            **self.counters,
        }

    def __repr__(self) -> str:
        return (
            f"BucketDelayedDeliveryTracker(name={self._name!r}, "
            f"delayed={self._members.count}, buckets={len(self._reader.buckets)})"
        )

    # == adding and sealing =============================================================

    def _route(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        covered = l <= self._sealed_end
        if covered.any():
            # The ledger already belongs to a sealed bucket: straight to the shared queue.
            # A persisted copy with an older deliver_at may exist (a nack re-add): make sure
            # a restart does not bring that copy back.
            self._queue.add_loose(d[covered], l[covered], e[covered])
            self._cancel_persisted(l[covered], e[covered])
            rest = ~covered
            d, l, e = d[rest], l[rest], e[rest]  # noqa: E741
        for ledger, idx in ledger_groups(l):
            if self._mutable.count >= self._min_count and ledger > self._mutable.end:
                self._seal()
            self._mutable.append(d[idx], l[idx], e[idx], ledger)

    def _seal(self) -> None:
        """Seal the mutable bucket: its live positions become a bucket in the store (or,
        when the writes keep failing, stay in memory)."""
        d, l, e = self._mutable.columns()  # noqa: E741
        start, end = self._mutable.start, self._mutable.end
        self._mutable.clear()
        self._sealed_end = max(self._sealed_end, end)
        live = self._members.member_mask(d, l, e)  # cancelled copies are not persisted
        if not live.all():
            d, l, e = d[live], l[live], e[live]  # noqa: E741
        if not len(d):
            return
        keys = position_keys(l, e)
        rows = Rows(keys, np.zeros(len(keys), np.int64), Entries.build([b""] * len(keys), d))
        self._next_id += 1
        meta, data, index = seal(
            rows,
            start_ledger=start,
            end_ledger=end,
            bucket_id=self._next_id,
            max_indexes=self._max_per_segment,
            max_step_ms=self._max_step_ms,
        )
        try:
            written = _write(f"bucket {meta.key}", lambda: self._sealed.write(meta, data, index))
            _write(
                f"registry entry {meta.key}",
                lambda: self._registry.put(self._name, meta.key, record_of(meta)),
            )
        except Exception as exc:  # noqa: BLE001 - downgraded to memory: nothing is lost
            log.warning("%s: sealing %s failed, kept in memory: %s", self._name, meta.key, exc)
            self.counters["downgraded"] += 1
            self._queue.add_loose(d, l, e)
            self._forget_bucket(meta.key)
            return
        self.counters["sealed"] += 1
        self.counters["bytes_written"] += written
        self._reader.adopt(meta)
        self._merge()

    def _merge(self) -> None:
        """Merge adjacent buckets, the smallest first, while there are more than
        ``max_num_buckets``; a merge that fails leaves its sources as they were."""
        while 0 < self._max_buckets < len(self._reader.buckets):
            metas = sorted((b.meta for b in self._reader.buckets.values()),
                           key=lambda m: m.start_ledger)  # fmt: skip
            window = merge_window([m.count for m in metas], len(metas) - self._max_buckets)
            keys = [metas[i].key for i in window]
            self._next_id += 1
            try:
                done = merge(
                    self._sealed,
                    keys,
                    bucket_id=self._next_id,
                    group_rows=self._max_per_segment if self._max_per_segment > 0 else 5_000,
                    register=self._register_merge,
                )
            except Exception as exc:  # noqa: BLE001 - the sources stay valid
                log.warning("%s: merging %s failed: %s", self._name, keys, exc)
                return
            if done is None:
                return
            merged, written = done
            self._reader.adopt(merged)
            self.counters["merged"] += 1
            self.counters["bytes_written"] += written

    def _register_merge(
        self, keys: list[str], merged: SealedMeta, record: bytes, runs: list[int]
    ) -> bool:
        """The registry has no swap: the merged bucket goes in first, then its sources go
        (a recovery in between drops the sources, whose runs it owns)."""
        _write(f"registry entry {merged.key}",
               lambda: self._registry.put(self._name, merged.key, record))  # fmt: skip
        for key in keys:
            self._registry.remove(self._name, key)
        return True

    # == the sealed buckets' due rows ===================================================

    def _pull(self, cutoff: int, n: int) -> bool:
        """Move due positions to the queue: the mutable bucket's, and up to ``n`` (at least
        :data:`_PULL`) of the sealed buckets' (loading their next segments as they come
        due); whether the sealed buckets may hold more that are due (the room ran out)."""
        due = self._mutable.take_due(cutoff)
        if due is not None and len(due[0]):
            self._queue.add_loose(*due)
        room = max(n, _PULL)
        while room > 0:
            loads = self._load(cutoff)
            groups = self._reader.take_due(cutoff, room)
            for rows, idx, keys in groups:
                ls, es = split_keys(keys)
                self._queue.add_loose(rows.entries.deliver_at_ms[idx], ls, es)
                room -= len(keys)
            if not groups and not loads:
                return False
        return True

    def _load(self, cutoff: int) -> int:
        """Load the segments that came due; returns how many loads landed."""
        landed = 0
        for ld in self._reader.wanted(cutoff, max_loads=1 << 20):
            try:
                meta = self._reader.buckets[ld.key].meta
                rows = [self._sealed.segment(p.run_key, p.offset, p.length) for p in ld.reads]
                keys = self._sealed.part_keys(meta, ld.keys_only)
            except Exception as exc:  # noqa: BLE001 - tried again at the next call
                log.warning("%s: loading bucket %s failed: %s", self._name, ld.key, exc)
                self._reader.load_failed(ld.key, ld.no)
                continue
            self._reader.install(ld.key, ld.no, rows, keys)
            self.counters["segments_loaded"] += len(ld.reads)
            landed += 1
        return landed

    def _retire(self) -> None:
        """Delete the buckets every position of which went to the queue."""
        for key in self._reader.advance(lambda keys: True):
            self._forget_bucket(key)

    def _forget_bucket(self, key: str) -> None:
        """A bucket is done with (or its seal failed): out of the registry, then out of
        the store; its ledgers need no cancels any more."""
        meta = self._reader.buckets[key].meta if key in self._reader.buckets else None
        self._reader.forget(key)
        try:
            self._registry.remove(self._name, key)
            self._sealed.delete(key)
            self.counters["deleted"] += 1
        except Exception as exc:  # noqa: BLE001 - an orphan, swept at the next recovery
            log.warning("%s: deleting bucket %s failed: %s", self._name, key, exc)
        if meta is not None and self._cancels:
            self._cancels.remove_range(meta.start_ledger << 32, (meta.end_ledger + 1) << 32)
            self._cancels_dirty = True

    # == trimming and cancels ===========================================================

    def _mark_delete_ledger(self) -> int | None:
        if self._mark_delete is None:
            return None
        md = self._mark_delete()
        try:
            return int(md[0])
        except (TypeError, ValueError, IndexError):
            raise InvalidArgument(
                f"mark_delete: expected (ledger_id, entry_id), got {md!r}"
            ) from None

    def _trim(self) -> None:
        md_ledger = self._mark_delete_ledger()
        if md_ledger is None or md_ledger <= self._trimmed_below:
            return
        self._trimmed_below = md_ledger
        self._members.drop_below(md_ledger)
        self._mutable.drop_below(md_ledger)
        for key, b in list(self._reader.buckets.items()):
            if b.meta.end_ledger < md_ledger:
                self._forget_bucket(key)

    def _cancel_persisted(self, ls: np.ndarray, es: np.ndarray) -> None:
        """Positions untracked or re-added: where a sealed bucket may hold a copy, a
        restart must not bring it back."""
        covered = np.asarray(ls) <= self._sealed_end
        if covered.any():
            self._cancels |= bitmap64_of(position_keys(np.asarray(ls)[covered],
                                                       np.asarray(es)[covered]))  # fmt: skip
            self._cancels_dirty = True

    @property
    def _cancels_key(self) -> str:
        return f"{self._name}/cancels"

    def _write_cancels(self, raise_errors: bool = False) -> None:
        if not self._cancels_dirty:
            return
        raw = msgpack.packb(
            {"v": CANCELS_VERSION, "keys": self._cancels.serialize()}, use_bin_type=True
        )
        try:
            _write("cancels", lambda: self._store.put(self._cancels_key, raw))
        except Exception as exc:
            if raise_errors:
                raise
            log.warning("%s: writing its cancels failed (tried again later): %s", self._name, exc)
            return
        self._cancels_dirty = False

    # == recovery =======================================================================

    def _recover(self) -> None:
        """Take up the buckets of the registry: drop what a seal or merge that died
        half-way left, read every meta, and restore the positions of the segments not
        due yet (the log replay delivers the others)."""
        records = self._registry.list(self._name)
        for key, record in records.items():
            try:
                if not isinstance(msgpack.unpackb(record), list):
                    raise ValueError("not a list")
            except Exception as exc:
                raise CodecError(
                    f"registry entry {key} of {self._name!r}: not a bucket record of this "
                    f"version of raydelay ({exc}); a store of the tracker before its "
                    "buckets became the partition's format is not read: clear() it"
                ) from exc
        owned = runs_of(records)
        stale = {run for key, runs in owned.items() for run in runs if run != key}
        for key in [k for k in records if k in stale]:  # a merge that died before this
            self._registry.remove(self._name, key)
            del records[key]
        clean(self._sealed, records)
        cutoff = self._cutoff()
        metas = []
        for key in records:
            try:
                metas.append(self._sealed.meta(key))
            except NotFound:
                log.warning("%s: bucket %s is registered but gone: dropped", self._name, key)
                self._registry.remove(self._name, key)
        for meta in sorted(metas, key=lambda m: m.start_ledger):
            keys, done = BitMap64(meta.keys), []
            for no, run in enumerate(meta.runs):
                due = sum(1 for s in run.segments if s.max_d <= cutoff)
                done.append(FINISHED if due == len(run.segments) else due)
                for seg_keys in self._sealed.segment_keys(meta, no)[:due]:
                    keys -= seg_keys
            self._sealed_end = max(self._sealed_end, meta.end_ledger)
            self._next_id = max(self._next_id, parse_bucket_key(meta.key)[2])
            if all(x == FINISHED for x in done):  # wholly due: the log replay has it all
                self._forget_bucket(meta.key)
                continue
            self._members.restore_keys(keys)
            self._reader.adopt(meta, done=done)
        raw: bytes | None
        try:
            raw = self._store.get(self._cancels_key)
        except NotFound:
            raw = None
        if raw is not None:
            obj = msgpack.unpackb(raw, raw=False)
            if not isinstance(obj, dict) or obj.get("v") != CANCELS_VERSION:
                raise CodecError(f"{self._cancels_key}: unknown format")
            self._cancels = BitMap64.deserialize(obj["keys"])
            self._members.members -= self._cancels
            self._members.count = len(self._members.members)
            # their persisted copies are stale: a re-add of one must not revive them
            self._members.ghosts |= self._cancels

    def _check_open(self) -> None:
        if self._closed:
            raise RaydelayError(f"tracker {self._name!r} is closed")


def _write(what: str, call: Callable[[], int | None]):
    """``call()`` within the :data:`STORE_WRITE` budget (no wait between tries: the
    tracker runs on its caller's thread)."""

    def failed(exc: BaseException) -> None:
        log.info("%s: a write failed, retrying: %s", what, exc)

    return retry(call, STORE_WRITE, sleep=None, on_failure=failed)


class MutableBucket:
    """The last, mutable bucket: sorted runs consumed from their heads as they fall due,
    plus chunks of recent adds that are sorted only once something in them is due.
    Many small runs are merged into one, so a pop costs what is due, not the bucket's size."""

    _MAX_RUNS = 8

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.runs: list[Run] = []
        self.pending: list[Cols] = []
        self.pending_min: int | None = None
        self.count = 0
        self.start = -1
        self.end = -1

    @property
    def min_d(self) -> int | None:
        best = self.pending_min
        for r in self.runs:
            v = r.first_d()
            best = v if best is None or v < best else best
        return best

    def append(self, d: np.ndarray, l: np.ndarray, e: np.ndarray, ledger: int) -> None:  # noqa: E741
        self.pending.append((d, l, e))
        self.count += len(d)
        self.start = ledger if self.start < 0 else min(self.start, ledger)
        self.end = max(self.end, ledger)
        m = int(d.min())
        self.pending_min = m if self.pending_min is None else min(self.pending_min, m)

    def parts(self) -> list[Cols]:
        return [r.remaining() for r in self.runs] + list(self.pending)

    def columns(self) -> Cols:
        """Every position held, unsorted (for a seal or a trim)."""
        return concat(self.parts())

    def _sort_pending(self) -> None:
        if self.pending:
            self.runs.append(Run.from_unsorted(*concat(self.pending)))
            self.pending, self.pending_min = [], None
        if len(self.runs) > self._MAX_RUNS:
            self.runs = [Run.from_unsorted(*concat([r.remaining() for r in self.runs]))]

    def take_due(self, cutoff: int) -> Cols | None:
        m = self.min_d
        if m is None or m > cutoff:
            return None
        if self.pending_min is not None and self.pending_min <= cutoff:
            self._sort_pending()
        parts = []
        for r in self.runs:
            k = r.due_count(cutoff)
            if k:
                h = r.head
                parts.append((r.d[h : h + k], r.l[h : h + k], r.e[h : h + k]))
                r.head += k
        self.runs = [r for r in self.runs if len(r)]
        out = concat(parts)
        self.count -= len(out[0])
        return out

    def drop_below(self, ledger: int) -> None:
        if not self.count:
            return
        d, l, e = self.columns()  # noqa: E741
        keep = l >= ledger
        if not keep.all():
            start, end = self.start, self.end
            self.clear()
            if keep.any():
                self.append(d[keep], l[keep], e[keep], start)
                self.end = end

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self.runs) + sum(c[0].nbytes * 3 for c in self.pending)
