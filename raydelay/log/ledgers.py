"""The ledgers of one partition's log and how many entries each holds.

:class:`LedgerTable` owns that list: the closed ledgers with their entry counts, and the
open one (the last) with the entries committed to it so far. It answers which positions
exist (:meth:`LedgerTable.count_of` is a binary search, not a scan) and changes only
when an object is committed, a ledger rolls or retention drops ledgers.

Thread-safety: the log's thread changes it, while the actor's event loop asks
:meth:`~LedgerTable.contains` and :meth:`~LedgerTable.tail`. Each state is therefore
a value replaced whole (never changed in place), and a roll publishes the closed ledger
before the new open one, so a reader between the two still sees the right count.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from raydelay.errors import RaydelayError

Position = tuple[int, int]  # (ledger_id, entry_id)


@dataclass(frozen=True)
class LedgerInfo:
    """A ledger of the partition: its id and, once closed, how many entries it holds."""

    ledger_id: int
    count: int | None  # None while open


@dataclass(frozen=True)
class _Closed:
    """The closed ledgers: ids ascending, and the entry count of each (None: not known)."""

    ids: tuple[int, ...]
    counts: tuple[int | None, ...]


class LedgerTable:
    def __init__(self, ledgers: list[LedgerInfo]) -> None:
        """``ledgers`` in any order; the last by id is open when its count is None (then
        with no entries yet: recovery counts them and calls :meth:`set_open_count`)."""
        infos = sorted(ledgers, key=lambda x: x.ledger_id)
        self._open: tuple[int, int] | None = None  # (ledger_id, entries committed to it)
        if infos and infos[-1].count is None:
            self._open = (infos.pop().ledger_id, 0)
        self._closed = _Closed(tuple(x.ledger_id for x in infos), tuple(x.count for x in infos))

    @property
    def has_open(self) -> bool:
        return self._open is not None

    @property
    def current(self) -> int:
        """The open ledger's id."""
        return self._opened()[0]

    @property
    def open_count(self) -> int:
        """Entries committed to the open ledger."""
        return self._opened()[1]

    @property
    def infos(self) -> list[LedgerInfo]:
        """Every ledger in id order, the open one last (count None)."""
        closed, open_ = self._closed, self._open
        out = [LedgerInfo(i, c) for i, c in zip(closed.ids, closed.counts, strict=True)]
        if open_ is not None:
            out.append(LedgerInfo(open_[0], None))
        return out

    def count_of(self, ledger_id: int) -> int | None:
        """Entries in ``ledger_id`` (committed so far, when open); None when the ledger is
        not in the table or its count is not known."""
        open_ = self._open
        if open_ is not None and ledger_id == open_[0]:
            return open_[1]
        closed = self._closed
        i = bisect_left(closed.ids, ledger_id)
        if i < len(closed.ids) and closed.ids[i] == ledger_id:
            return closed.counts[i]
        return None

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether (ledger_id, entry_id) is a committed position."""
        count = self.count_of(ledger_id)
        return count is not None and 0 <= entry_id < count

    def tail(self) -> Position | None:
        """The last committed position, or None when nothing was ever committed."""
        open_, closed = self._open, self._closed
        if open_ is not None and open_[1] > 0:
            return (open_[0], open_[1] - 1)
        for ledger_id, count in zip(reversed(closed.ids), reversed(closed.counts), strict=True):
            if count:
                return (ledger_id, count - 1)
        return None

    # --- changes (on the log's thread) ---------------------------------------------------------

    def set_open_count(self, count: int) -> None:
        """The open ledger now holds ``count`` entries."""
        self._open = (self.current, count)

    def open(self, ledger_id: int) -> None:
        """Open ``ledger_id`` after the closed ledgers (there is no open one)."""
        if self._open is not None:
            raise RaydelayError(f"open {ledger_id}: ledger {self._open[0]} is open")
        ids = self._closed.ids
        if ids and ledger_id <= ids[-1]:
            raise RaydelayError(f"open: new ledger {ledger_id} is not above {ids[-1]}")
        self._open = (ledger_id, 0)

    def roll(self, new_id: int) -> None:
        """Close the open ledger at its count and open ``new_id``."""
        closing, count = self._opened()
        if new_id <= closing:
            raise RaydelayError(f"roll: new ledger {new_id} is not above {closing}")
        closed = self._closed
        self._closed = _Closed((*closed.ids, closing), (*closed.counts, count))
        self._open = (new_id, 0)

    def drop(self, ledger_ids: set[int]) -> None:
        """Forget closed ledgers (the open one stays)."""
        closed = self._closed
        kept = [
            (i, c) for i, c in zip(closed.ids, closed.counts, strict=True) if i not in ledger_ids
        ]
        self._closed = _Closed(tuple(i for i, _ in kept), tuple(c for _, c in kept))

    def _opened(self) -> tuple[int, int]:
        open_ = self._open
        if open_ is None:
            raise RaydelayError("the log has no open ledger")
        return open_
