"""Tombstones: positions untracked or re-added while a persisted copy of them may exist
(a cancel, an expired re-add, a nack-style re-add into a sealed ledger). They are noted
as they happen, written as one object per batch (``<name>/tombs/<seq>``, compacted into
one past :data:`MAX_TOMB_OBJECTS`), and applied when a tracker recovers, so a restart
never resurrects a stale copy."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap

from raydelay.delayed import codec
from raydelay.delayed.bucket.state import Exclusions
from raydelay.delayed.bucket.writer import Sleep, store_write
from raydelay.delayed.columns import I64, bitmap_of, bitmap_values, ledger_groups
from raydelay.delayed.index import Membership
from raydelay.storage.base import ObjectStore

log = logging.getLogger(__name__)

MAX_TOMB_OBJECTS = 32  # past this many tombstone objects, the next write compacts them


def tombs_prefix(name: str) -> str:
    return f"{name}/tombs/"


@dataclass(frozen=True)
class TombWrite:
    """One tombstone object to write, and the older objects it makes redundant."""

    key: str
    data: bytes
    doomed: list[str]  # deleted once ``key`` is durable (a compaction)
    pending: Exclusions  # the tombstones it carries that were not written before
    compact: bool


class Tombstones:
    """A tracker's tombstones: those noted and not written yet, every one written (kept
    for compaction), and the objects that hold them."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.pending: Exclusions = {}
        self._all: Exclusions = {}  # every tombstone written, for compaction
        self.keys: list[str] = []
        self._seq = 1  # never reset: a new object never reuses a key
        self.writing = False  # one write at a time

    def clear(self) -> None:
        """Forget every tombstone (their objects are deleted by the caller)."""
        self.pending, self._all, self.keys = {}, {}, []

    def note(self, l: np.ndarray, e: np.ndarray, sealed_end: int) -> None:  # noqa: E741
        """Positions whose persisted copies (if any: only ledgers up to ``sealed_end`` have
        them) must stay dead after a restart."""
        mask = l <= sealed_end
        if not mask.any():
            return
        l, e = l[mask], e[mask]  # noqa: E741
        for ledger, idx in ledger_groups(l):
            self.pending.setdefault(ledger, BitMap()).update(bitmap_of(e[idx]))

    def note_one(self, ledger_id: int, entry_id: int) -> None:
        self.pending.setdefault(ledger_id, BitMap()).add(entry_id)

    def next_write(self, bucket_ranges: list[tuple[int, int]]) -> TombWrite | None:
        """The next object to write, if any (one at a time). A compaction keeps only the
        tombstones of ledgers that ``bucket_ranges`` (start, end ledger) still cover."""
        if self.writing or not (self.pending or len(self.keys) > MAX_TOMB_OBJECTS):
            return None
        pending, self.pending = self.pending, {}
        for ledger, bm in pending.items():
            self._all.setdefault(ledger, BitMap()).update(bm)
        compact = len(self.keys) >= MAX_TOMB_OBJECTS
        if compact:
            self._all = {
                lg: bm
                for lg, bm in self._all.items()
                if any(a <= lg <= z for a, z in bucket_ranges)
            }
            data, doomed = codec.encode_tombstones(self._all), list(self.keys)
        else:
            data, doomed = codec.encode_tombstones(pending), []
        key = f"{tombs_prefix(self._name)}{self._seq:020d}"
        self._seq += 1
        self.writing = True
        return TombWrite(key, data, doomed, pending, compact)

    def written(self, w: TombWrite) -> None:
        """``w`` is durable (and the objects it compacted are gone)."""
        self.writing = False
        self.keys = [w.key] if w.compact else self.keys + [w.key]

    def failed(self, w: TombWrite, error: BaseException) -> None:
        """The write failed after its retries: its tombstones wait for the next one."""
        self.writing = False
        log.warning(
            "tracker %s: writing cancel tombstones failed, will retry: %s", self._name, error
        )
        for ledger, bm in w.pending.items():
            self.pending.setdefault(ledger, BitMap()).update(bm)

    def recover(self, store: ObjectStore, members: Membership) -> None:
        """Read every tombstone object and untrack what they name; later writes continue
        their numbering, so they get compacted."""
        keys = store.list(tombs_prefix(self._name))
        if not keys:
            return
        merged: Exclusions = {}
        for key in keys:
            for ledger, bm in codec.decode_tombstones(store.get(key), key).items():
                merged.setdefault(ledger, BitMap()).update(bm)
        self._seq = int(keys[-1].rsplit("/", 1)[1]) + 1
        self.keys = list(keys)
        self._all = merged
        for ledger, bm in merged.items():
            members.remove_many(np.full(len(bm), ledger, dtype=I64), bitmap_values(bm))


def write_tombstones(store: ObjectStore, w: TombWrite, sleep: Sleep) -> None:
    """The job: write ``w``, then delete the objects it compacted (it is durable first)."""
    store_write(f"put {w.key}", lambda: store.put(w.key, w.data), sleep)
    for old in w.doomed:
        store.delete(old)
