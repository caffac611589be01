"""Rows staged for delivery with their payloads (pure: no Ray).

Due rows of the host's index (sealed buckets, the unsealed tail) come with their
payloads; they wait here, in the order they were staged, until a receive hands them out
(:meth:`Staging.lookup`), or until they no longer wait in the redelivery set
(:meth:`Staging.prune`). A key_shared subscription stages the read-ahead rows it moves
into its pool too.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of
from raydelay.dispatch.ports import Group


class Staging:
    """Groups of (source, row indexes, position keys), each group's keys ascending."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()
        self._bitmaps: dict[int, BitMap64] = {}  # id(keys of a staged group) -> bitmap
        self.rows = 0

    def add(self, group: Group, bm: BitMap64 | None = None) -> None:
        self._groups.append(group)
        if bm is not None:
            self._bitmaps[id(group[2])] = bm
        self.rows += len(group[2])

    def lookup(self, keys: np.ndarray) -> tuple[list[Group], np.ndarray]:
        """The staged rows of ``keys``, as (rows, indexes, keys) groups, and the keys not
        staged (to be read from the host)."""
        groups = []
        need = np.asarray(keys, dtype=np.int64)
        for rows, idx, ks in self._groups:
            if not len(need):
                break
            at = np.minimum(np.searchsorted(ks, need), len(ks) - 1)
            hit = ks[at] == need
            if hit.any():
                groups.append((rows, idx[at[hit]], need[hit]))
                need = need[~hit]
        return groups, need

    def prune(self, max_rows: int, waiting: BitMap64) -> None:
        """Drop staged rows no longer in ``waiting`` (the redelivery set), and the oldest
        beyond ``max_rows``: those are read from the host if they are wanted again."""
        kept: deque[Group] = deque()
        bitmaps: dict[int, BitMap64] = {}  # (each group's keys, built once: steps are often)
        self.rows = 0
        for group in self._groups:
            bm = self._bitmaps.get(id(group[2]))
            if bm is None:
                bm = bitmap64_of(group[2])
            if bm.intersect(waiting):
                kept.append(group)
                bitmaps[id(group[2])] = bm
                self.rows += len(group[2])
        while self.rows > max_rows and len(kept) > 1:
            dropped = kept.popleft()[2]
            bitmaps.pop(id(dropped), None)
            self.rows -= len(dropped)
        self._groups, self._bitmaps = kept, bitmaps
