"""A subscription's cursor: the mark-delete position plus individual acks (pure).

- ``mark_delete`` = (ledger, entry): every entry at or before it is acknowledged.
  (-1, -1) means nothing is; (L, -1) means everything before ledger L is.
- Acks beyond it are kept as one 64-bit roaring bitmap of position keys
  (``ledger << 32 | entry``): an ack, or a check of a column of keys, is one bitmap
  operation however many ledgers the keys span. It is persisted as one bitmap of entry
  ids per ledger (:attr:`Cursor.acked`), as before.
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
from pyroaring import BitMap, BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.errors import CodecError
from raydelay.positions import LOW, SHIFT, Position, key_of, ledger_groups, position_keys

FORMAT_VERSION = 1
NOTHING: Position = (-1, -1)


class Cursor:
    def __init__(self, mark_delete: Position = NOTHING) -> None:
        self.mark_delete: Position = (int(mark_delete[0]), int(mark_delete[1]))
        # the position keys acknowledged after mark-delete (``ledger << 32 | entry``)
        self.acked_keys = BitMap64()
        self._ledgers: dict[int, int | None] = {}  # ledger id -> size once closed
        self._order: list[int] = []  # known ledger ids, ascending
        # The highest ledger id a list of the log's ledgers named (-1: none seen yet). Such
        # a list names every ledger the log holds, so an id at or below it that is not
        # known is another partition's or deleted; above it, a ledger may exist unknown.
        self._listed_through = -1
        # Delayed messages due at or before this (epoch ms) may have been delivered already
        # (persisted with the cursor; -1: none).
        self.delayed_mark = -1
        # Position keys acknowledged while a delayed store still counts them (see
        # raydelay.dispatch.settled), and messages published to the dead-letter topic so
        # far: persisted with the cursor, so the counts survive a restart.
        self.settled = BitMap64()
        # the settled rows' deliver_at where known (None: gone from the log), persisted with
        # the bitmap: a restart after retention deleted their ledgers still charts them right
        self.settled_due: dict[int, int | None] = {}
        self.dead_lettered = 0

    def copy(self) -> Cursor:
        out = Cursor(self.mark_delete)
        out.acked_keys = BitMap64(self.acked_keys)
        out._ledgers = dict(self._ledgers)
        out._order = list(self._order)
        out._listed_through = self._listed_through
        return out

    @property
    def acked(self) -> dict[int, BitMap]:
        """The individual acks as one bitmap of entry ids per ledger (the persisted form)."""
        keys = bitmap64_values(self.acked_keys)
        if not len(keys):
            return {}
        return {
            ledger_id: BitMap(array("I", (keys[idx] & LOW).astype(np.uint32).tobytes()))
            for ledger_id, idx in ledger_groups(keys >> SHIFT)
        }

    def floor_key(self) -> int:
        """The largest position key mark-delete covers (-1: none)."""
        md_l, md_e = self.mark_delete
        if md_l < 0:
            return -1
        return key_of(md_l, md_e) if md_e >= 0 else key_of(md_l, 0) - 1

    # --- the ledger sequence -------------------------------------------------------------

    def learn_ledgers(
        self, ledgers: Iterable[tuple[int, int | None]], *, whole_log: bool = True
    ) -> None:
        """Record ledgers (id, size or None while open). ``whole_log``: they are a log
        reply's list of every ledger it holds; else some ledgers only (a bucket's, or a
        persisted cursor's), and mark-delete does not move past an unknown ledger id above
        the last whole list, which may be a ledger not learnt yet."""
        ledgers = list(ledgers)
        changed = False
        if whole_log and ledgers:
            top = max(i for i, _ in ledgers)
            if top > self._listed_through:
                self._listed_through = top
                changed = True
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
        return key_of(ledger_id, entry_id) in self.acked_keys

    def ack(self, ledger_ids: np.ndarray, entry_ids: np.ndarray) -> int:
        """Acknowledge positions (columns); returns how many were not acknowledged before."""
        keys = np.sort(position_keys(np.asarray(ledger_ids), np.asarray(entry_ids)))
        keys = keys[keys > self.floor_key()]
        if not len(keys):
            return 0
        return self.ack_keys(bitmap64_of(keys))  # (from sorted keys: the fast way)

    def ack_keys(self, keys: BitMap64) -> int:
        """Acknowledge the position keys of a bitmap (it is not changed); returns how many
        were not acknowledged before."""
        new = BitMap64(keys)
        floor = self.floor_key()
        if floor >= 0 and new and new.min() <= floor:
            new.remove_range(0, floor + 1)
        new -= self.acked_keys
        added = len(new)
        if added:
            self.acked_keys |= new
            self._advance()
        return added

    def _advance(self) -> None:
        """Move mark-delete over the contiguous acknowledged run, across closed ledgers."""
        md_l, md_e = self.mark_delete
        acked = self.acked_keys
        while True:
            if md_l not in self._ledgers:
                # Unknown: before the first ledger, another partition's id, or deleted by
                # retention (which only deletes ledgers every subscription has
                # acknowledged in full), once a whole list of the log's ledgers said so
                nxt = self._next_ledger(md_l)
                if nxt is None:
                    break
                md_l, md_e = nxt, -1
                continue
            first = key_of(md_l, md_e + 1)
            if first in acked:
                md_e += min(_run_length(acked, first), LOW - md_e)
            size = self._ledgers[md_l]
            if size is not None and md_e >= size - 1:
                nxt = self._next_ledger(md_l)
                if nxt is None:
                    break
                md_l, md_e = nxt, -1
                continue
            break
        self.mark_delete = (md_l, md_e)
        floor = self.floor_key()
        if floor >= 0 and acked and acked.min() <= floor:
            acked.remove_range(0, floor + 1)

    def _next_ledger(self, ledger_id: int) -> int | None:
        """The known ledger after ``ledger_id`` that mark-delete may move to: None if there
        is none, or if an id between them is above the last whole list of the log's
        ledgers (a ledger there may exist, not learnt yet, e.g. one a bucket's ledgers
        skipped because none of its entries were delayed)."""
        nxt = next((i for i in self._order if i > ledger_id), None)
        if nxt is None or nxt - 1 > max(ledger_id, self._listed_through):
            return None
        return nxt

    def individually_acked(self) -> int:
        return len(self.acked_keys)

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
                acked = self.acked_keys.range_cardinality(
                    key_of(ledger_id, start), key_of(ledger_id, end)
                )
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
        if self.settled:  # (likewise)
            obj["settled"] = self.settled.serialize()
        if self.settled_due:
            keys = np.fromiter(self.settled_due, dtype=np.int64, count=len(self.settled_due))
            dues = np.fromiter(
                (-1 if d is None else d for d in self.settled_due.values()),
                dtype=np.int64,
                count=len(keys),
            )
            obj["sdue"] = [keys.tobytes(), dues.tobytes()]
        if self.dead_lettered:
            obj["dl"] = int(self.dead_lettered)
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
            for ledger_id, data in raw["acked"].items():
                es = np.frombuffer(BitMap.deserialize(data).to_array(), dtype=np.uint32)
                keys = position_keys(np.full(len(es), int(ledger_id), dtype=np.int64), es)
                cursor.acked_keys |= bitmap64_of(keys)
            cursor.learn_ledgers(((int(i), c) for i, c in raw["ledgers"]), whole_log=False)
            cursor.delayed_mark = int(raw.get("dmark", -1))
            if "settled" in raw:
                cursor.settled = BitMap64.deserialize(raw["settled"])
            if "sdue" in raw:
                keys = np.frombuffer(raw["sdue"][0], dtype=np.int64)
                dues = np.frombuffer(raw["sdue"][1], dtype=np.int64)
                if len(keys) != len(dues):
                    raise CodecError(f"{what}: settled rows' deliver_at: lengths differ")
                cursor.settled_due = {
                    k: (None if d < 0 else d)
                    for k, d in zip(keys.tolist(), dues.tolist())
                    if k in cursor.settled
                }
            cursor.dead_lettered = int(raw.get("dl", 0))
            return cursor, (int(raw["read"][0]), int(raw["read"][1]))
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"{what}: cannot decode ({exc})") from exc


def _run_length(bm: BitMap64, start: int) -> int:
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
