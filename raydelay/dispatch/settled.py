"""Delayed rows settled before they fall due (pure: no Ray).

With sealed buckets a shared subscription does not hold its delayed rows: the host's
unsealed index and the sealed buckets do, for every subscription at once, and count them
until they fall due and are popped (:mod:`raydelay.dispatch.tail`,
:class:`~raydelay.delayed.reader.SealedReader`). A row cancelled (or otherwise
acknowledged) before that is still in those counts and in their due histograms, though it
will never go out. :class:`SettledDelayed` keeps those rows, so that the counts
(:mod:`raydelay.dispatch.counts`) leave them out: a bitmap of their positions, and the
deliver_at of the ones known, for the due histogram. Both are persisted with the cursor:
a restarted subscription's stores count the rows again, and retention may have deleted
the ledgers their deliver_at would be read from. So the deliver_at of a row settled
without it (a cancel ahead of a read of delayed rows only) is read from the log before
the next cursor write (:meth:`SettledDelayed.learn_unknown`). A row leaves it when a store
pops it (it falls due and is dropped as acknowledged).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.log.entries import Rows

# the most settled rows whose deliver_at one cursor write reads from the log first
LEARN_AT_ONCE = 65_536


class SettledDelayed:
    """Positions acknowledged while a delayed store still counts them (:attr:`keys`, the
    cursor's own bitmap), and their deliver_at where known (``due_ms``, the cursor's own
    dict; both persisted with it)."""

    def __init__(self, keys: BitMap64, due_ms: dict[int, int | None] | None = None) -> None:
        self.keys = keys
        # key -> deliver_at (epoch ms), where known (None: not in the log any more)
        self._due_ms: dict[int, int | None] = {} if due_ms is None else due_ms
        self.rows_read = 0  # rows whose deliver_at was read from the log (since the start)

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

    async def learn_unknown(
        self, read_rows: Callable[[np.ndarray], Awaitable[Rows]], limit: int = LEARN_AT_ONCE
    ) -> bool:
        """Read from the log the deliver_at of up to ``limit`` settled rows not known yet
        (the cursor then persists it); whether there were any."""
        if len(self._due_ms) >= len(self.keys):  # (every settled key's is known: no scan)
            return False
        unknown = self.unknown_due()[:limit]
        if not len(unknown):
            return False
        rows = await read_rows(unknown)
        self.rows_read += len(unknown)
        self.learn_due(unknown, rows.positions, rows.entries.deliver_at_ms)
        return True

    def due_histogram(self, edges: np.ndarray) -> np.ndarray:
        """The settled rows of known deliver_at per due window, as the trackers count them
        (``len(edges) + 1`` counts)."""
        out = np.zeros(len(edges) + 1, dtype=np.int64)
        known = [d for d in self._due_ms.values() if d is not None]
        if known:
            d = np.asarray(known, dtype=np.int64)
            out += np.bincount(np.searchsorted(edges, d, side="right"), minlength=len(out))
        return out
