"""The in-memory index shared by both trackers.

:class:`Membership` is the single truth of *which positions are tracked*: roaring
bitmaps of entry ids per ledger. Physical copies of a position (in a run, the
mutable bucket, or a persisted segment) are only candidates: a popped copy is
delivered only if the position is still a member. That makes cancel, expiry and
stale copies (after merges or restarts) cheap and exact, with no per-message
Python objects. ``ghosts`` remembers positions untracked while a copy may still
exist, so a later re-add records the authoritative deliver_at in ``overrides``.

:class:`RunQueue` is the shared priority queue: sorted runs plus a loose buffer
of unsorted chunks, popped by a vectorised k-way selection.
"""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap

from raydelay.delayed.columns import (
    EMPTY,
    Run,
    bitmap_of,
    bitmap_values,
    concat,
    ledger_groups,
)

_MAX_LOOSE_RUNS = 8


class Membership:
    def __init__(self) -> None:
        self.members: dict[int, BitMap] = {}
        self.ghosts: dict[int, BitMap] = {}
        self.overrides: dict[tuple[int, int], int] = {}
        self._override_ledgers: dict[int, int] = {}
        self.count = 0

    # -- queries ---------------------------------------------------------------------

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        m = self.members.get(ledger_id)
        return m is not None and entry_id in m

    def member_mask(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Which physical copies are live (member, and matching any override); no changes."""
        mask = np.zeros(len(l), dtype=bool)
        for ledger, idx in ledger_groups(l):
            m = self.members.get(ledger)
            if m is None:
                continue
            es = e[idx]
            inter = m & bitmap_of(es)
            if len(inter) == len(es):
                mask[idx] = True
            elif len(inter):
                mask[idx] = np.isin(es, bitmap_values(inter))
            if ledger in self._override_ledgers:
                for i in idx[mask[idx]].tolist():
                    want = self.overrides.get((ledger, int(e[i])))
                    if want is not None and want != int(d[i]):
                        mask[i] = False
        return mask

    # -- changes ---------------------------------------------------------------------

    def add(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Track the positions; returns a mask of the newly tracked ones (first copy in the batch)."""
        new = np.zeros(len(l), dtype=bool)
        for ledger, idx in ledger_groups(l):
            es = e[idx]
            bm = bitmap_of(es)
            m = self.members.get(ledger)
            if m is None:
                m = self.members[ledger] = BitMap()
            existing = m & bm
            if len(existing) == 0 and len(bm) == len(es):
                fresh = np.ones(len(es), dtype=bool)
            else:
                fresh = _first_occurrence(es)
                if len(existing):
                    fresh &= ~np.isin(es, bitmap_values(existing))
            new[idx] = fresh
            added = len(bm) - len(existing)
            m |= bm
            self.count += added
            g = self.ghosts.get(ledger)
            if g is not None and added:
                revived = g & bm
                revived -= existing
                if len(revived):
                    pick = idx[fresh]
                    for i in pick[np.isin(e[pick], bitmap_values(revived))].tolist():
                        self._set_override(ledger, int(e[i]), int(d[i]))
                    g -= revived
                    if not g:
                        del self.ghosts[ledger]
        return new

    def restore(self, ledger_id: int, bm: BitMap) -> None:
        """Recovery: track every entry of ``bm`` (a persisted bucket's bitmap)."""
        m = self.members.get(ledger_id)
        if m is None:
            m = self.members[ledger_id] = BitMap()
        before = len(m)
        m |= bm
        self.count += len(m) - before

    def remove(self, ledger_id: int, entry_id: int) -> bool:
        m = self.members.get(ledger_id)
        if m is None or entry_id not in m:
            return False
        m.discard(entry_id)
        if not m:
            del self.members[ledger_id]
        self.count -= 1
        self.ghosts.setdefault(ledger_id, BitMap()).add(entry_id)
        self._drop_override(ledger_id, entry_id)
        return True

    def remove_many(self, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Untrack the positions that are members; returns the mask of those removed."""
        removed = np.zeros(len(l), dtype=bool)
        for ledger, idx in ledger_groups(l):
            m = self.members.get(ledger)
            if m is None:
                continue
            es = e[idx]
            inter = m & bitmap_of(es)
            if not inter:
                continue
            hit = np.isin(es, bitmap_values(inter)) & _first_occurrence(es)
            removed[idx] = hit
            m -= inter
            if not m:
                del self.members[ledger]
            self.count -= len(inter)
            self.ghosts.setdefault(ledger, BitMap()).update(inter)
            if ledger in self._override_ledgers:
                for entry in inter:
                    self._drop_override(ledger, entry)
        return removed

    def take(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> np.ndarray:  # noqa: E741
        """Pop candidates: returns the mask of live copies and untracks them.

        Of several copies of one position, the earliest by deliver_at wins.
        """
        live = np.zeros(len(l), dtype=bool)
        for ledger, idx in ledger_groups(l):
            m = self.members.get(ledger)
            if m is None:
                continue
            es = e[idx]
            sub = np.lexsort((d[idx], es))  # by entry, then deliver_at: first copy = earliest
            idx = idx[sub]
            es = es[sub]
            first = _first_occurrence_sorted(es)
            inter = m & bitmap_of(es)
            if len(inter) == 0:
                continue
            ok = (
                first
                if len(inter) == int(first.sum())
                else first & np.isin(es, bitmap_values(inter))
            )
            if ledger in self._override_ledgers:
                ok = self._apply_overrides(ledger, d, e, idx, es, ok, m)
            chosen = idx[ok]
            live[chosen] = True
            taken = bitmap_of(e[chosen])
            m -= taken
            if not m:
                del self.members[ledger]
            self.count -= len(taken)
            if ledger in self._override_ledgers:
                for entry in e[chosen].tolist():
                    self._drop_override(ledger, entry)
        return live

    def _apply_overrides(self, ledger, d, e, idx, es, ok, m) -> np.ndarray:
        # Slow path, only for ledgers with a re-added ghost: the copy whose
        # deliver_at matches the override is the live one.
        ok = ok.copy()
        for j, i in enumerate(idx.tolist()):
            entry = int(e[i])
            want = self.overrides.get((ledger, entry))
            if want is None:
                continue
            ok[j] = entry in m and int(d[i]) == want and not _seen_before(es, ok, j)
        return ok

    def drop_below(self, ledger_id: int) -> int:
        """Untrack everything in ledgers below ``ledger_id``; returns how many were tracked."""
        dropped = 0
        for ledger in [x for x in self.members if x < ledger_id]:
            dropped += len(self.members.pop(ledger))
        for ledger in [x for x in self.ghosts if x < ledger_id]:
            del self.ghosts[ledger]
        if self._override_ledgers:
            for key in [k for k in self.overrides if k[0] < ledger_id]:
                self._drop_override(*key)
        self.count -= dropped
        return dropped

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def nbytes(self) -> int:
        total = 0
        for group in (self.members, self.ghosts):
            for bm in group.values():
                s = bm.get_statistics()
                total += (
                    64
                    + s["n_bytes_array_containers"]
                    + s["n_bytes_run_containers"]
                    + s["n_bytes_bitset_containers"]
                )
        return total + 120 * len(self.overrides)

    def _set_override(self, ledger: int, entry: int, deliver_at: int) -> None:
        if (ledger, entry) not in self.overrides:
            self._override_ledgers[ledger] = self._override_ledgers.get(ledger, 0) + 1
        self.overrides[(ledger, entry)] = deliver_at

    def _drop_override(self, ledger: int, entry: int) -> None:
        if self.overrides.pop((ledger, entry), None) is not None:
            left = self._override_ledgers[ledger] - 1
            if left:
                self._override_ledgers[ledger] = left
            else:
                del self._override_ledgers[ledger]


def _first_occurrence(es: np.ndarray) -> np.ndarray:
    mask = np.zeros(len(es), dtype=bool)
    _, first = np.unique(es, return_index=True)
    mask[first] = True
    return mask


def _first_occurrence_sorted(es: np.ndarray) -> np.ndarray:
    mask = np.ones(len(es), dtype=bool)
    if len(es) > 1:
        mask[1:] = es[1:] != es[:-1]
    return mask


def _seen_before(es: np.ndarray, ok: np.ndarray, j: int) -> bool:
    k = j - 1
    while k >= 0 and es[k] == es[j]:
        if ok[k]:
            return True
        k -= 1
    return False


class RunQueue:
    """Sorted runs plus unsorted loose chunks; pops the earliest due copies first."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._loose: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._loose_min = None  # type: int | None

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs) + sum(len(c[0]) for c in self._loose)

    def add_loose(self, d: np.ndarray, l: np.ndarray, e: np.ndarray) -> None:  # noqa: E741
        if len(d) == 0:
            return
        self._loose.append((d, l, e))
        m = int(d.min())
        self._loose_min = m if self._loose_min is None else min(self._loose_min, m)

    def add_run(self, run: Run) -> None:
        if len(run):
            self.runs.append(run)

    def remove_runs(self, doomed: list[Run]) -> None:
        ids = {id(r) for r in doomed}
        self.runs = [r for r in self.runs if id(r) not in ids]

    def min_d(self) -> int | None:
        best = self._loose_min
        for r in self.runs:
            if len(r):
                v = r.first_d()
                best = v if best is None or v < best else best
        return best

    def _absorb_loose(self) -> None:
        if self._loose:
            d, l, e = concat(self._loose)  # noqa: E741
            self._loose = []
            self._loose_min = None
            self.runs.append(Run.from_unsorted(d, l, e))
        loose_runs = [r for r in self.runs if r.owner is None]
        if len(loose_runs) > _MAX_LOOSE_RUNS:
            d, l, e = concat([r.remaining() for r in loose_runs])  # noqa: E741
            self.remove_runs(loose_runs)
            self.runs.append(Run.from_unsorted(d, l, e))

    def take(
        self, cutoff: int, max_n: int
    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], list[Run]] | None:
        """Remove up to ``max_n`` copies with deliver_at <= cutoff, earliest first.

        Returns the copies and the runs this emptied, or None when nothing is due.
        """
        self._absorb_loose()
        picks = []
        for r in self.runs:
            k = r.due_count(cutoff)
            if k > 0:
                picks.append((r, min(k, max_n)))
        if not picks:
            return None
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
            d, l, e = concat(parts)  # noqa: E741
            if len(d) > max_n:
                tag = np.repeat(np.arange(len(picks)), [k for _, k in picks])
                order = np.lexsort((e, l, d))[:max_n]
                counts = np.bincount(tag[order], minlength=len(picks))
                out = (d[order], l[order], e[order])
                for (r, _), c in zip(picks, counts.tolist()):
                    r.head += c
            else:
                out = (d, l, e)
                for r, k in picks:
                    r.head += k
        emptied = [r for r, _ in picks if len(r) == 0]
        if emptied:
            self.remove_runs(emptied)
        return out, emptied

    def has_live_due(self, cutoff: int, members: Membership) -> bool:
        """Is a live copy due? Stale heads (cancelled copies) met on the way are dropped."""
        self._absorb_loose()
        found = False
        for r in self.runs:
            while r.due_count(cutoff) > 0:
                h = r.head
                if members.member_mask(r.d[h : h + 1], r.l[h : h + 1], r.e[h : h + 1])[0]:
                    found = True
                    break
                r.head += 1
            if found:
                break
        self.runs = [r for r in self.runs if len(r)]
        return found

    def drain_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [r.remaining() for r in self.runs] + self._loose
        self.clear()
        return concat(parts)

    def clear(self) -> None:
        self.runs = []
        self._loose = []
        self._loose_min = None

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self.runs) + sum(c[0].nbytes * 3 for c in self._loose)


def sorted_positions(l: np.ndarray, e: np.ndarray) -> list[tuple[int, int]]:  # noqa: E741
    """Positions as (ledger, entry) tuples sorted by position: the tracker's return shape."""
    if len(l) == 0:
        return []
    order = np.lexsort((e, l))
    return list(zip(l[order].tolist(), e[order].tolist()))


__all__ = ["Membership", "RunQueue", "sorted_positions", "EMPTY"]
