"""The ledgers of one partition's log and how many entries each holds.

:class:`LedgerTable` owns that list: the closed ledgers with their entry counts, and the
open one (the last) with the entries committed to it so far. It answers which positions
exist (:meth:`LedgerTable.count_of` is a binary search, not a scan) and changes only
when an object is committed, a ledger rolls or retention drops ledgers.

Thread-safety: the log's thread changes it, while the actor's event loop asks
:meth:`~LedgerTable.contains`, :meth:`~LedgerTable.tail` and the ledger list. So the
whole table is one frozen value, replaced (never changed in place) by each change: every
answer comes from one consistent state, without a lock.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from raydelay.errors import RaydelayError
from raydelay.positions import Position


@dataclass(frozen=True)
class LedgerInfo:
    """A ledger of the partition: its id and, once closed, how many entries it holds."""

    ledger_id: int
    count: int | None  # None while open


@dataclass(frozen=True)
class _State:
    """The closed ledgers (ids ascending, the entry count of each or None: not known),
    and the open ledger's id (None: none) and entries committed to it."""

    closed_ids: tuple[int, ...]
    closed_counts: tuple[int | None, ...]
    open_id: int | None
    open_count: int


class LedgerTable:
    def __init__(self, ledgers: list[LedgerInfo]) -> None:
        """``ledgers`` in any order; the last by id is open when its count is None (then
        with no entries yet: recovery counts them and calls :meth:`set_open_count`)."""
        infos = sorted(ledgers, key=lambda x: x.ledger_id)
        open_id = infos.pop().ledger_id if infos and infos[-1].count is None else None
        self._state = _State(
            tuple(x.ledger_id for x in infos), tuple(x.count for x in infos), open_id, 0
        )

    @property
    def has_open(self) -> bool:
        return self._state.open_id is not None

    @property
    def current(self) -> int:
        """The open ledger's id."""
        return _open_id(self._state)

    @property
    def open_count(self) -> int:
        """Entries committed to the open ledger."""
        return self._state.open_count

    @property
    def infos(self) -> list[LedgerInfo]:
        """Every ledger in id order, the open one last (count None)."""
        s = self._state
        out = [LedgerInfo(i, c) for i, c in zip(s.closed_ids, s.closed_counts, strict=True)]
        if s.open_id is not None:
            out.append(LedgerInfo(s.open_id, None))
        return out

    def count_of(self, ledger_id: int) -> int | None:
        """Entries in ``ledger_id`` (committed so far, when open); None when the ledger is
        not in the table or its count is not known."""
        s = self._state
        if ledger_id == s.open_id:
            return s.open_count
        i = bisect_left(s.closed_ids, ledger_id)
        if i < len(s.closed_ids) and s.closed_ids[i] == ledger_id:
            return s.closed_counts[i]
        return None

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether (ledger_id, entry_id) is a committed position."""
        count = self.count_of(ledger_id)
        return count is not None and 0 <= entry_id < count

    def tail(self) -> Position | None:
        """The last committed position, or None when nothing was ever committed."""
        s = self._state
        if s.open_id is not None and s.open_count > 0:
            return (s.open_id, s.open_count - 1)
        for i in range(len(s.closed_ids) - 1, -1, -1):
            count = s.closed_counts[i]
            if count:
                return (s.closed_ids[i], count - 1)
        return None

    # --- changes (on the log's thread) ---------------------------------------------------------

    def set_open_count(self, count: int) -> None:
        """The open ledger now holds ``count`` entries."""
        s = self._state
        self._state = _State(s.closed_ids, s.closed_counts, _open_id(s), count)

    def open(self, ledger_id: int) -> None:
        """Open ``ledger_id`` after the closed ledgers (there is no open one)."""
        s = self._state
        if s.open_id is not None:
            raise RaydelayError(f"open {ledger_id}: ledger {s.open_id} is open")
        if s.closed_ids and ledger_id <= s.closed_ids[-1]:
            raise RaydelayError(f"open: new ledger {ledger_id} is not above {s.closed_ids[-1]}")
        self._state = _State(s.closed_ids, s.closed_counts, ledger_id, 0)

    def roll(self, new_id: int) -> None:
        """Close the open ledger at its count and open ``new_id``."""
        s = self._state
        closing = _open_id(s)
        if new_id <= closing:
            raise RaydelayError(f"roll: new ledger {new_id} is not above {closing}")
        self._state = _State((*s.closed_ids, closing), (*s.closed_counts, s.open_count), new_id, 0)

    def drop(self, ledger_ids: set[int]) -> None:
        """Forget closed ledgers (the open one stays)."""
        s = self._state
        kept = [
            (i, c)
            for i, c in zip(s.closed_ids, s.closed_counts, strict=True)
            if i not in ledger_ids
        ]
        self._state = _State(
            tuple(i for i, _ in kept), tuple(c for _, c in kept), s.open_id, s.open_count
        )


def _open_id(state: _State) -> int:
    if state.open_id is None:
        raise RaydelayError("the log has no open ledger")
    return state.open_id
