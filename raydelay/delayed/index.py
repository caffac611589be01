"""The in-memory index shared by both trackers.

:class:`Membership` is the single truth of *which positions are tracked*: one 64-bit roaring
bitmap of position keys (ledger << 32 | entry). Physical copies of a position (in a run, the
mutable bucket, or a persisted segment) are only candidates: a popped copy is
delivered only if the position is still a member. That makes cancel, expiry and
stale copies (after merges or restarts) cheap and exact, with no per-message
Python objects. ``ghosts`` remembers positions untracked while a copy may still
exist, so a later re-add records the authoritative deliver_at in ``overrides``.

:class:`RunQueue` is the shared priority queue: sorted runs plus a loose buffer
of unsorted chunks, popped by a vectorised k-way selection.

Position keys themselves are defined in :mod:`raydelay.positions`.
"""

from __future__ import annotations

import heapq
from array import array

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.columns import EMPTY, Run, concat
from raydelay.positions import KEY_DTYPE, key_of, position_keys

_MAX_LOOSE_RUNS = 8

# --- bitmaps of position keys -------------------------------------------------------------


# bitmap64_of: a column of at least _RUNS_FROM keys, in runs averaging more than
# _KEYS_PER_RUN keys, is added a run at a time
_RUNS_FROM = 32
_KEYS_PER_RUN = 16


def bitmap64_of(keys: np.ndarray) -> BitMap64:
    """A 64-bit roaring bitmap of a key column. Keys that come in a few runs of
    consecutive positions (a ledger's entries, as they mostly do) are added a run at a
    time: about ten times faster than key by key for 10,000 keys."""
    u = np.asarray(keys).astype(np.uint64, copy=False)
    n = len(u)
    if n >= _RUNS_FROM:
        breaks = np.flatnonzero(np.diff(u) != 1)
        if len(breaks) * _KEYS_PER_RUN < n:
            firsts = u[np.concatenate(([0], breaks + 1))].tolist()
            lasts = u[np.concatenate((breaks, [n - 1]))].tolist()
            bm = BitMap64()
            for lo, hi in zip(firsts, lasts, strict=True):
                if hi < lo:  # (wrapped past 2**64: not a run)
                    return BitMap64(array("Q", u.tobytes()))
                bm.add_range(lo, hi + 1)
            return bm
    return BitMap64(array("Q", u.tobytes()))


def bitmap64_values(bm: BitMap64) -> np.ndarray:
    """The keys of a 64-bit roaring bitmap, ascending, as a :data:`KEY_DTYPE` column."""
    return np.frombuffer(bm.to_array(), dtype=np.uint64).astype(KEY_DTYPE)


class Membership:
    """Tracked positions as one 64-bit roaring bitmap of position keys."""

    def __init__(self) -> None:
        self.members = BitMap64()
        self.ghosts = BitMap64()
        self.overrides: dict[int, int] = {}  # position key -> the deliver_at that counts
        self.count = 0

    # -- queries ---------------------------------------------------------------------

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        return key_of(ledger_id, entry_id) in self.members

    def member_mask(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Which physical copies are live (member, and matching any override); no changes."""
        if len(l) == 0:
            return np.zeros(0, dtype=bool)
        keys = position_keys(l, e)
        bm = bitmap64_of(keys)
        if self.members.intersection_cardinality(bm) == len(bm):
            mask = np.ones(len(keys), dtype=bool)  # every distinct position is tracked
        else:
            mask = np.isin(keys, bitmap64_values(self.members & bm))
        if self.overrides:
            for i in np.flatnonzero(mask).tolist():
                want = self.overrides.get(int(keys[i]))
                if want is not None and want != int(d[i]):
                    mask[i] = False
        return mask

    # -- changes ---------------------------------------------------------------------

    def add(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Track the positions; returns a mask of the newly tracked ones (first copy in the batch)."""
        keys = position_keys(l, e)
        bm = bitmap64_of(keys)
        existing = self.members & bm
        if len(existing) == 0 and len(bm) == len(keys):
            fresh = np.ones(len(keys), dtype=bool)
        else:
            fresh = _first_occurrence(keys)
            if len(existing):
                fresh &= ~np.isin(keys, bitmap64_values(existing))
        self.members |= bm
        self.count += len(bm) - len(existing)
        if self.ghosts and len(bm) > len(existing):
            revived = (self.ghosts & bm) - existing
            if revived:
                picks = np.flatnonzero(fresh)
                hit = picks[np.isin(keys[picks], bitmap64_values(revived))]
                for i in hit.tolist():  # stale copies of it exist: this deliver_at is the one
                    self.overrides[int(keys[i])] = int(d[i])
                self.ghosts -= revived
        return fresh

    def restore_keys(self, keys: BitMap64) -> None:
        """Recovery: track every position key of ``keys`` (a persisted bucket's)."""
        before = len(self.members)
        self.members |= keys
        self.count += len(self.members) - before

    def remove(self, ledger_id: int, entry_id: int) -> bool:
        key = key_of(ledger_id, entry_id)
        if key not in self.members:
            return False
        self.members.discard(key)
        self.count -= 1
        self.ghosts.add(key)
        self.overrides.pop(key, None)
        return True

    def remove_many(self, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Untrack the positions that are members; returns the mask of those removed."""
        if len(l) == 0:
            return np.zeros(0, dtype=bool)
        keys = position_keys(l, e)
        inter = self.members & bitmap64_of(keys)
        if not inter:
            return np.zeros(len(keys), dtype=bool)
        removed = np.isin(keys, bitmap64_values(inter)) & _first_occurrence(keys)
        self.members -= inter
        self.count -= len(inter)
        self.ghosts |= inter
        if self.overrides:
            for key in bitmap64_values(inter).tolist():
                self.overrides.pop(int(key), None)
        return removed

    def take(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # noqa: E741
        """Pop candidates: untrack the live copies and return their positions as
        (ledger_ids, entry_ids) sorted by position. Of several copies of one position,
        the earliest by deliver_at wins; copies of untracked positions are dropped."""
        if len(l) == 0:
            return EMPTY, EMPTY
        keys = position_keys(l, e)
        order = np.lexsort((d, keys))  # by position, then deliver_at
        keys, d, l, e = keys[order], d[order], l[order], e[order]  # noqa: E741
        first = np.ones(len(keys), dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        uniq = keys if first.all() else keys[first]
        bm = bitmap64_of(uniq)
        if not self.overrides and self.members.intersection_cardinality(bm) == len(uniq):
            ok = first  # the common case: every distinct position is live
            self.members -= bm
            self.count -= len(uniq)
            return l[ok], e[ok]
        inter = self.members & bm
        ok = (
            first & np.isin(keys, bitmap64_values(inter))
            if inter
            else np.zeros(len(keys), dtype=bool)
        )
        if self.overrides:
            ok = self._apply_overrides(keys, d, ok)
        taken = bitmap64_of(keys[ok])
        self.members -= taken
        self.count -= len(taken)
        if self.overrides:
            for key in keys[ok].tolist():
                if self.overrides.pop(int(key), None) is not None:
                    self.ghosts.add(int(key))  # other copies of it may remain
        return l[ok], e[ok]

    def _apply_overrides(self, keys: np.ndarray, d: np.ndarray, ok: np.ndarray) -> np.ndarray:
        # Slow path, only while a re-added ghost is tracked: the copy whose deliver_at
        # matches the override is the live one (copies are sorted by position, then deliver_at).
        ok = ok.copy()
        taken: set[int] = set()
        for j in np.flatnonzero(
            np.isin(keys, np.fromiter(self.overrides, dtype=KEY_DTYPE))
        ).tolist():
            key = int(keys[j])
            ok[j] = key in self.members and key not in taken and int(d[j]) == self.overrides[key]
            if ok[j]:
                taken.add(key)
        return ok

    def drop_below(self, ledger_id: int) -> int:
        """Untrack everything in ledgers below ``ledger_id``; returns how many were tracked."""
        if ledger_id <= 0:
            return 0
        end = key_of(ledger_id, 0)
        dropped = self.members.range_cardinality(0, end)
        if dropped:
            self.members.remove_range(0, end)
        self.ghosts.remove_range(0, end)
        for key in [k for k in self.overrides if k < end]:
            del self.overrides[key]
        self.count -= dropped
        return dropped

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def nbytes(self) -> int:
        total = 0
        for bm in (self.members, self.ghosts):
            st = bm.get_statistics()
            total += (
                64
                + st["n_bytes_array_containers"]
                + st["n_bytes_run_containers"]
                + st["n_bytes_bitset_containers"]
            )
            total += 16 * st["n_containers"]
        return total + 120 * len(self.overrides)


def _first_occurrence(keys: np.ndarray) -> np.ndarray:
    mask = np.zeros(len(keys), dtype=bool)
    _, first = np.unique(keys, return_index=True)
    mask[first] = True
    return mask


class RunQueue:
    """Sorted runs plus unsorted loose chunks; pops the earliest due copies first.

    Runs sit in a heap keyed by the deliver_at at their head, so a pop looks only at
    runs that have something due. Runs that empty are reported in ``emptied``.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._heap: list[tuple[int, int, Run]] = []
        self._live: dict[int, Run] = {}
        self._seq = 0
        self._dead = 0  # heap entries of removed runs not popped yet
        self._loose: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._loose_min: int | None = None
        self.emptied: list[Run] = []

    @property
    def runs(self) -> list[Run]:
        return [r for r in self._live.values() if len(r)]

    def columns(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """What is queued, as column blocks (runs from their heads, then loose chunks)."""
        return [r.remaining() for r in self.runs] + list(self._loose)

    def add_loose(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        if len(d) == 0:
            return
        self._loose.append((d, l, e))
        m = int(d.min())
        self._loose_min = m if self._loose_min is None else min(self._loose_min, m)

    def add_run(self, run: Run) -> None:
        if len(run):
            self._live[id(run)] = run
            self._push(run)

    def _push(self, run: Run) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (run.first_d(), self._seq, run))

    def remove_runs(self, doomed: list[Run]) -> None:
        for r in doomed:
            if self._live.pop(id(r), None) is not None:
                self._dead += 1  # its heap entry is skipped lazily...
        if self._dead > 32 and self._dead > len(self._live):
            # ...but a removed run whose head is far off would stay referenced (with its
            # arrays) until it surfaced: rebuild the heap from the live runs instead
            self._heap = [(r.first_d(), i, r) for i, r in enumerate(self._live.values()) if len(r)]
            heapq.heapify(self._heap)
            self._seq = len(self._heap)
            self._dead = 0

    def min_d(self) -> int | None:
        self._clean_top()
        best = self._heap[0][0] if self._heap else None
        if self._loose_min is not None and (best is None or self._loose_min < best):
            best = self._loose_min
        return best

    def _clean_top(self) -> None:
        heap = self._heap
        while heap:
            d, _, r = heap[0]
            if self._live.get(id(r)) is r and len(r) and r.first_d() == d:
                return
            heapq.heappop(heap)
            if self._live.get(id(r)) is r:
                if len(r):
                    self._push(r)  # its head moved: re-key it
                else:
                    self._retire(r)

    def _retire(self, run: Run) -> None:
        self._live.pop(id(run), None)
        self.emptied.append(run)

    def _absorb_loose(self) -> None:
        if self._loose:
            d, l, e = concat(self._loose)  # noqa: E741
            self._loose = []
            self._loose_min = None
            self.add_run(Run.from_unsorted(d, l, e))
        loose_runs = [r for r in self._live.values() if r.owner is None and len(r)]
        if len(loose_runs) > _MAX_LOOSE_RUNS:
            d, l, e = concat([r.remaining() for r in loose_runs])  # noqa: E741
            self.remove_runs(loose_runs)
            self.add_run(Run.from_unsorted(d, l, e))

    def _due_runs(self, cutoff: int) -> list[Run]:
        """Pop every run whose head is due off the heap (the caller pushes them back)."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= cutoff:
            d, _, r = heapq.heappop(heap)
            if self._live.get(id(r)) is not r:
                continue
            if not len(r):
                self._retire(r)
            elif r.first_d() != d:
                self._push(r)
            else:
                out.append(r)
        return out

    def take(
        self, cutoff: int, max_n: int
    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], list[Run]] | None:
        """Remove up to ``max_n`` copies with deliver_at <= cutoff, earliest first.

        Returns the copies and the runs this emptied, or None when nothing is due.
        """
        self._absorb_loose()
        due = self._due_runs(cutoff)
        if not due:
            return None
        picks = [(r, min(r.due_count(cutoff), max_n)) for r in due]
        if len(picks) == 1:
            r, k = picks[0]
            h = r.head
            out = (r.d[h : h + k], r.l[h : h + k], r.e[h : h + k])
            r.head += k
        else:
            parts = [
                (r.d[r.head : r.head + k], r.l[r.head : r.head + k], r.e[r.head : r.head + k])
                for r, k in picks
            ]
            if sum(k for _, k in picks) > max_n:
                # the max_n earliest by (deliver_at, ledger, entry): each run is sorted, so
                # how many each gives is found by binary search, not by sorting them all
                counts = smallest_counts(parts, max_n)
                d, l, e = concat(  # noqa: E741
                    [(pd[:c], pl[:c], pe[:c]) for (pd, pl, pe), c in zip(parts, counts)]
                )
                order = np.lexsort((e, l, d))
                out = (d[order], l[order], e[order])
                for (r, _), c in zip(picks, counts):
                    r.head += c
            else:
                d, l, e = concat(parts)  # noqa: E741
                out = (d, l, e)
                for r, k in picks:
                    r.head += k
        emptied = []
        for r, _ in picks:
            if len(r):
                self._push(r)
            else:
                self._retire(r)
                emptied.append(r)
        return out, emptied

    def has_live_due(self, cutoff: int, members: Membership) -> bool:
        """Is a live copy due? Stale heads (cancelled copies) met on the way are dropped."""
        self._absorb_loose()
        found = False
        for r in self._due_runs(cutoff):
            while not found and r.due_count(cutoff) > 0:
                h = r.head
                if members.member_mask(r.d[h : h + 1], r.l[h : h + 1], r.e[h : h + 1])[0]:
                    found = True
                    break
                r.head += 1
            if len(r):
                self._push(r)
            else:
                self._retire(r)
        return found

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self._live.values()) + sum(
            c[0].nbytes * 3 for c in self._loose
        )


def smallest_counts(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int) -> list[int]:
    """How many of each part's leading rows make up the ``n`` smallest (deliver_at, ledger,
    entry) of all parts, each part sorted by that triple (and holding ``n`` or more rows
    in all). Two selections, each linear in the rows looked at: the ``n``-th smallest
    deliver_at among the parts' first ``n`` rows (no part gives more), then, among the
    rows tied at it, the position key that completes the count. Copies of that boundary
    position go in part order."""
    ds = [p[0][:n] for p in parts]
    x = int(np.partition(np.concatenate(ds), n - 1)[n - 1])
    below = [int(np.searchsorted(d, x, "left")) for d in ds]
    tied_end = [int(np.searchsorted(d, x, "right")) for d in ds]
    need = n - sum(below)
    keys = [position_keys(p[1][b:t], p[2][b:t]) for p, b, t in zip(parts, below, tied_end)]
    k = int(np.partition(np.concatenate(keys), need - 1)[need - 1])
    counts = [int(np.searchsorted(ks, k, "left")) for ks in keys]
    need -= sum(counts)
    for i, ks in enumerate(keys):  # copies of the boundary position itself, in part order
        extra = min(need, int(np.searchsorted(ks, k, "right")) - counts[i])
        counts[i] += extra
        need -= extra
    return [b + c for b, c in zip(below, counts)]


def sorted_positions(ls: list[np.ndarray], es: list[np.ndarray]) -> list[tuple[int, int]]:
    """Positions as (ledger, entry) tuples sorted by position: the trackers' return shape.
    Each pair of arrays is sorted already; several are merged."""
    if not ls:
        return []
    if len(ls) == 1:
        l, e = ls[0], es[0]  # noqa: E741
    else:
        l, e = np.concatenate(ls), np.concatenate(es)  # noqa: E741
        order = np.lexsort((e, l))
        l, e = l[order], e[order]  # noqa: E741
    return list(zip(l.tolist(), e.tolist()))


def sorted_keys(ls: list[np.ndarray], es: list[np.ndarray]) -> np.ndarray:
    """Positions as one sorted column of their keys."""
    if not ls:
        return np.zeros(0, dtype=KEY_DTYPE)
    keys = position_keys(np.concatenate(ls), np.concatenate(es))
    return keys if len(ls) == 1 else np.sort(keys)


__all__ = [
    "EMPTY",
    "Membership",
    "RunQueue",
    "bitmap64_of",
    "bitmap64_values",
    "sorted_keys",
    "sorted_positions",
]
