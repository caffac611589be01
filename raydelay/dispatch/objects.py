"""Decoded ledger objects a subscription keeps, to find payloads by position (pure).

Due delayed messages and redeliveries need their payloads back; most of them were
read moments ago, so a bounded cache of decoded objects (by entry count) answers
without another call to the topic actor. Lookups are vectorized over position keys.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import numpy as np

from raydelay.dispatch.keys import split_keys
from raydelay.log.entries import LedgerObject

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
        if key in self._objects:
            self._objects.move_to_end(key)
            return
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
        for ledger_id in np.unique(ledgers).tolist():
            same = ledgers == ledger_id
            ks = keys[same]
            firsts = self._firsts.get(ledger_id)
            if not firsts:
                missing.append(ks)
                continue
            entries = all_entries[same]
            starts = np.asarray(firsts, dtype=np.int64)
            slot = np.searchsorted(starts, entries, side="right") - 1
            for j in np.unique(slot).tolist():
                sel = slot == j
                if j < 0:
                    missing.append(ks[sel])
                    continue
                obj = self._objects[(ledger_id, firsts[j])]
                idx = entries[sel] - obj.first_entry
                inside = idx < obj.count
                if not inside.all():
                    missing.append(ks[sel][~inside])
                if inside.any():
                    groups.append((obj, idx[inside], ks[sel][inside]))
        gone = np.concatenate(missing) if missing else np.zeros(0, dtype=np.int64)
        return groups, gone
