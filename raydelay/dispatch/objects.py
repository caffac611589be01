"""Decoded ledger objects a subscription keeps, to find payloads by position (pure).

Due delayed messages and redeliveries need their payloads back; many of them were
read moments ago, so a bounded cache of decoded objects (by entry count) answers
without another call to the partition's host. Lookups are vectorized over position keys.

Cached objects may overlap: whole ledger objects from the sequential read, and runs
cut out of them by the host for scattered positions. A position is found in
any cached object that holds it.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import numpy as np

from raydelay.log.entries import LedgerObject
from raydelay.positions import LOW, ledger_groups, split_keys

Group = tuple[LedgerObject, np.ndarray, np.ndarray]  # (object, indexes in it, position keys)


class ObjectCache:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._objects: OrderedDict[tuple[int, int], LedgerObject] = OrderedDict()
        self._firsts: dict[int, list[int]] = {}  # ledger -> sorted first entries
        self._entries = 0

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def entries(self) -> int:
        return self._entries

    def add(self, obj: LedgerObject) -> None:
        key = (obj.ledger_id, obj.first_entry)
        old = self._objects.get(key)
        if old is not None and old.count >= obj.count:
            self._objects.move_to_end(key)
            return
        if old is not None:  # a longer run from the same first entry replaces it
            del self._objects[key]
            self._entries -= old.count
            self._firsts[obj.ledger_id].remove(obj.first_entry)
        self._objects[key] = obj
        self._entries += obj.count
        bisect.insort(self._firsts.setdefault(obj.ledger_id, []), obj.first_entry)
        while self._entries > self.max_entries and len(self._objects) > 1:
            (ledger_id, first), old = self._objects.popitem(last=False)
            self._entries -= old.count
            firsts = self._firsts[ledger_id]
            firsts.remove(first)
            if not firsts:
                del self._firsts[ledger_id]

    def lookup(self, keys: np.ndarray) -> tuple[list[Group], np.ndarray]:
        """Group ``keys`` by the cached object holding each; also the keys none holds."""
        keys = np.asarray(keys, dtype=np.int64)
        groups: list[Group] = []
        missing: list[np.ndarray] = []
        ledgers, all_entries = split_keys(keys)
        for ledger_id, same in ledger_groups(ledgers):
            ks = keys[same]
            firsts = self._firsts.get(ledger_id)
            if not firsts:
                missing.append(ks)
                continue
            entries = all_entries[same]
            starts = np.asarray(firsts, dtype=np.int64)
            slot = np.searchsorted(starts, entries, side="right") - 1
            # reach[i]: the end of the longest of objects 0..i, so that a position past it
            # is known missing without scanning the earlier objects one by one
            reach = np.maximum.accumulate([f + self._objects[(ledger_id, f)].count for f in firsts])
            for j in np.unique(slot).tolist():
                sel = slot == j
                if j < 0:
                    missing.append(ks[sel])
                    continue
                obj = self._objects[(ledger_id, firsts[j])]
                idx = entries[sel] - obj.first_entry
                inside = idx < obj.count
                if inside.any():
                    groups.append((obj, idx[inside], ks[sel][inside]))
                outside = ks[sel][~inside]
                if not len(outside):
                    continue
                maybe = entries[sel][~inside] < (reach[j - 1] if j > 0 else 0)
                missing.append(outside[~maybe])
                for k in outside[maybe].tolist():  # maybe in an earlier, longer object
                    found = self._holder(ledger_id, firsts, j - 1, k & LOW)
                    if found is None:
                        missing.append(np.array([k], dtype=np.int64))
                    else:
                        groups.append(
                            (found, np.array([(k & LOW) - found.first_entry]), np.array([k]))
                        )
        gone = np.concatenate(missing) if missing else np.zeros(0, dtype=np.int64)
        return groups, gone

    def _holder(self, ledger_id: int, firsts: list[int], j: int, entry: int) -> LedgerObject | None:
        for first in reversed(firsts[max(0, j - _OVERLAP_SCAN) : j + 1]):
            obj = self._objects[(ledger_id, first)]
            if entry < obj.first_entry + obj.count:
                return obj
        return None


_OVERLAP_SCAN = 64  # cached objects looked at backwards for a position a later one lacks
