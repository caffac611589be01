"""Delayed rows settled before they fall due (pure: no Ray).

With sealed buckets a shared subscription does not hold its delayed rows: the host's
unsealed index and the sealed buckets do, for every subscription at once, and count them
until they fall due and are popped (:mod:`raydelay.dispatch.tail`,
:class:`~raydelay.delayed.reader.SealedReader`). A row cancelled (or otherwise
acknowledged) before that is still in those counts and in their due histograms, though it
will never go out. :class:`SettledDelayed` keeps those rows, so that the counts
(:mod:`raydelay.dispatch.counts`) leave them out: a bitmap of their positions (persisted
with the cursor: a restarted subscription's stores count them again), and the deliver_at
of the ones known, for the due histogram. A row leaves it when a store pops it (it falls
due and is dropped as acknowledged).
"""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values


class SettledDelayed:
    """Positions acknowledged while a delayed store still counts them (:attr:`keys`, the
    cursor's own bitmap, persisted with it), and their deliver_at where known."""

    def __init__(self, keys: BitMap64) -> None:
        self.keys = keys
        # key -> deliver_at (epoch ms), where known (None: not in the log any more)
        self._due_ms: dict[int, int | None] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, keys: np.ndarray, due_ms: np.ndarray | None = None) -> None:
        """``keys`` (int64 position keys) were acknowledged unpopped; ``due_ms``: their
        deliver_at, row for row, when the caller has it."""
        if not len(keys):
            return
        self.keys |= bitmap64_of(np.sort(keys))
        if due_ms is not None:
            self._due_ms.update(zip(keys.tolist(), due_ms.tolist()))

    def add_one(self, key: int, due_ms: int | None = None) -> None:
        self.keys.add(key)
        if due_ms is not None:
            self._due_ms[key] = due_ms

    def popped(self, bm: BitMap64) -> None:
        """A store popped the positions of ``bm`` (they fell due): no count holds them now."""
        if not self.keys:
            return
        done = self.keys & bm
        if done:
            self.keys -= done
            if self._due_ms:
                for k in done:
                    self._due_ms.pop(k, None)

    def among(self, keys: np.ndarray) -> np.ndarray:
        """A mask of ``keys`` (sorted) that are settled."""
        if not self.keys or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        hit = bitmap64_of(keys) & self.keys
        if not hit:
            return np.zeros(len(keys), dtype=bool)
        return np.isin(keys, bitmap64_values(hit))

    def unknown_due(self) -> np.ndarray:
        """The settled positions whose deliver_at is not known here (sorted keys)."""
        keys = bitmap64_values(self.keys)
        if not self._due_ms:
            return keys
        known = np.fromiter(self._due_ms, dtype=np.int64, count=len(self._due_ms))
        return np.setdiff1d(keys, known, assume_unique=True)

    def learn_due(self, asked: np.ndarray, keys: np.ndarray, due_ms: np.ndarray) -> None:
        """The deliver_at of settled positions read from the log: ``asked`` was read and
        ``keys`` came back with ``due_ms`` (one not back is gone from the log, retention
        deleted its ledger: it is not asked for again, nor charted)."""
        found = dict(zip(keys.tolist(), due_ms.tolist()))
        for k in asked.tolist():
            if k in self.keys:
                self._due_ms[k] = found.get(k)

    def due_histogram(self, edges: np.ndarray) -> np.ndarray:
        """The settled rows of known deliver_at per due window, as the trackers count them
        (``len(edges) + 1`` counts)."""
        out = np.zeros(len(edges) + 1, dtype=np.int64)
        known = [d for d in self._due_ms.values() if d is not None]
        if known:
            d = np.asarray(known, dtype=np.int64)
            out += np.bincount(np.searchsorted(edges, d, side="right"), minlength=len(out))
        return out
