"""A subscription's cursor: the mark-delete position plus individual acks (pure).

- ``mark_delete`` = (ledger, entry): every entry at or before it is acknowledged.
  (-1, -1) means nothing is; (L, -1) means everything before ledger L is.
- Acks beyond it are kept as one roaring bitmap of entry ids per ledger.
- The cursor learns the ledger sequence (ids and, once closed, sizes) from the
  log replies, so it can move mark-delete across ledger boundaries.

The persisted form is versioned msgpack with ``BitMap.serialize()`` bytes. It also
records the subscription's dispatch mark: entries before it may have been delivered
already, which a restarted subscription uses to mark re-deliveries.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import msgpack
import numpy as np
from pyroaring import BitMap

from raydelay.errors import CodecError
from raydelay.positions import Position, ledger_groups

FORMAT_VERSION = 1
NOTHING: Position = (-1, -1)


class Cursor:
    def __init__(self, mark_delete: Position = NOTHING) -> None:
        self.mark_delete: Position = (int(mark_delete[0]), int(mark_delete[1]))
        self.acked: dict[int, BitMap] = {}
        self._ledgers: dict[int, int | None] = {}  # ledger id -> size once closed
        self._order: list[int] = []  # known ledger ids, ascending
        # Delayed messages due at or before this (epoch ms) may have been delivered already
        # (persisted with the cursor; -1: none).
        self.delayed_mark = -1

    def copy(self) -> Cursor:
        out = Cursor(self.mark_delete)
        out.acked = {k: BitMap(v) for k, v in self.acked.items()}
        out._ledgers = dict(self._ledgers)
        out._order = list(self._order)
        return out

    # --- the ledger sequence -------------------------------------------------------------

    def learn_ledgers(self, ledgers: Iterable[tuple[int, int | None]]) -> None:
        """Record ledgers (id, size or None while open) seen in log replies."""
        changed = False
        for ledger_id, count in ledgers:
            if ledger_id not in self._ledgers:
                self._order.append(ledger_id)
            elif self._ledgers[ledger_id] == count:
                continue
            self._ledgers[ledger_id] = count
            changed = True
        if changed:
            self._order.sort()
            self._advance()

    def ledger_size(self, ledger_id: int) -> int | None:
        return self._ledgers.get(ledger_id)

    def known_ledgers(self) -> list[tuple[int, int | None]]:
        return [(i, self._ledgers[i]) for i in self._order]

    # --- acks -------------------------------------------------------------------------------

    def is_acked(self, ledger_id: int, entry_id: int) -> bool:
        if (ledger_id, entry_id) <= self.mark_delete:
            return True
        bm = self.acked.get(ledger_id)
        return bm is not None and entry_id in bm

    def ack(self, ledger_ids: np.ndarray, entry_ids: np.ndarray) -> int:
        """Acknowledge positions (columns); returns how many were not acknowledged before."""
        added = 0
        md_l, md_e = self.mark_delete
        ledger_ids = np.asarray(ledger_ids, dtype=np.int64)
        entry_ids = np.asarray(entry_ids, dtype=np.int64)
        for ledger_id, idx in ledger_groups(ledger_ids):
            if ledger_id < md_l:
                continue
            es = entry_ids[idx]
            if ledger_id == md_l:
                es = es[es > md_e]
            if len(es) == 0:
                continue
            bm = self.acked.get(ledger_id)
            if bm is None:
                bm = self.acked[ledger_id] = BitMap()
            before = len(bm)
            bm.update(array("I", es.astype(np.uint32).tobytes()))  # the buffer fast path
            added += len(bm) - before
        if added:
            self._advance()
        return added

    def _advance(self) -> None:
        """Move mark-delete over the contiguous acknowledged run, across closed ledgers."""
        md_l, md_e = self.mark_delete
        while True:
            if md_l not in self._ledgers:
                # Unknown: before the first ledger, or deleted by retention (which only
                # deletes ledgers every subscription has acknowledged in full).
                nxt = next((i for i in self._order if i > md_l), None)
                if nxt is None:
                    break
                md_l, md_e = nxt, -1
                continue
            bm = self.acked.get(md_l)
            if bm is not None and (md_e + 1) in bm:
                run = _run_length(bm, md_e + 1)
                bm.remove_range(md_e + 1, md_e + 1 + run)
                md_e += run
                if not bm:
                    del self.acked[md_l]
            size = self._ledgers[md_l]
            if size is not None and md_e >= size - 1:
                nxt = next((i for i in self._order if i > md_l), None)
                if nxt is None:
                    break
                self.acked.pop(md_l, None)
                md_l, md_e = nxt, -1
                continue
            break
        self.mark_delete = (md_l, md_e)
        for ledger_id in [i for i in self.acked if i < md_l]:
            del self.acked[ledger_id]

    def individually_acked(self) -> int:
        return sum(len(bm) for bm in self.acked.values())

    def unacked_between(self, tail: Position | None) -> int:
        """How many entries after mark-delete and up to ``tail`` are not acknowledged."""
        if tail is None:
            return 0
        md_l, md_e = self.mark_delete
        total = 0
        for ledger_id in self._order:
            if ledger_id < md_l or ledger_id > tail[0]:
                continue
            size = self._ledgers[ledger_id]
            end = tail[1] + 1 if ledger_id == tail[0] else (size or 0)
            start = md_e + 1 if ledger_id == md_l else 0
            if end > start:
                bm = self.acked.get(ledger_id)
                acked = 0 if bm is None else bm.range_cardinality(start, end)
                total += end - start - acked
        return total

    # --- persistence ------------------------------------------------------------------------

    def encode(self, dispatch_mark: Position) -> bytes:
        obj = {
            "v": FORMAT_VERSION,
            "md": list(self.mark_delete),
            "acked": {int(k): v.serialize() for k, v in self.acked.items() if v},
            "ledgers": [[i, c] for i, c in self.known_ledgers()],
            "read": list(dispatch_mark),
        }
        if self.delayed_mark >= 0:  # written only once set: older cursors read the same
            obj["dmark"] = int(self.delayed_mark)
        return msgpack.packb(obj, use_bin_type=True)

    @staticmethod
    def decode(data: bytes, what: str = "cursor") -> tuple[Cursor, Position]:
        """The cursor and the dispatch mark it was persisted with."""
        try:
            raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
            if not isinstance(raw, dict) or raw.get("v") != FORMAT_VERSION:
                version = raw.get("v") if isinstance(raw, dict) else None
                raise CodecError(f"{what}: unknown format version {version!r}")
            cursor = Cursor((raw["md"][0], raw["md"][1]))
            cursor.acked = {int(k): BitMap.deserialize(v) for k, v in raw["acked"].items()}
            cursor.learn_ledgers((int(i), c) for i, c in raw["ledgers"])
            cursor.delayed_mark = int(raw.get("dmark", -1))
            return cursor, (int(raw["read"][0]), int(raw["read"][1]))
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"{what}: cannot decode ({exc})") from exc


def _run_length(bm: BitMap, start: int) -> int:
    """How many consecutive values from ``start`` are in ``bm`` (``start`` is in it)."""
    base = bm.rank(start - 1) if start > 0 else 0
    lo, hi = 1, len(bm) - base  # the run is at least 1 and at most the values >= start
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bm.rank(start + mid - 1) - base == mid:
            lo = mid
        else:
            hi = mid - 1
    return lo
