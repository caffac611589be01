"""The partition log's ledger table (pure): counts, positions, tail, rolls and drops."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raydelay.errors import RaydelayError
from raydelay.log.ledgers import LedgerInfo, LedgerTable


class ScanModel:
    """The bookkeeping LedgerTable replaced, as partition.py had it: a list of LedgerInfo
    (the open ledger last) scanned per lookup, and the open ledger's entry count."""

    def __init__(self, infos: list[LedgerInfo]) -> None:
        self.infos = sorted(infos, key=lambda x: x.ledger_id)
        self.next_entry = 0

    @property
    def current(self) -> int:
        return self.infos[-1].ledger_id

    def count_of(self, ledger_id: int) -> int | None:
        if ledger_id == self.current:
            return self.next_entry
        for info in self.infos:
            if info.ledger_id == ledger_id:
                return info.count
        return None

    def tail(self) -> tuple[int, int] | None:
        if self.next_entry > 0:
            return (self.current, self.next_entry - 1)
        for info in reversed(self.infos[:-1]):
            if info.count:
                return (info.ledger_id, info.count - 1)
        return None

    def roll(self, new_id: int) -> None:
        self.infos[-1] = LedgerInfo(self.current, self.next_entry)
        self.infos.append(LedgerInfo(new_id, None))
        self.next_entry = 0

    def drop(self, ledger_ids: set[int]) -> None:
        self.infos = [x for x in self.infos if x.ledger_id not in ledger_ids]


# A starting table: closed ledgers as (id gap, count or None), then the open ledger's gap.
closed_ledgers = st.lists(st.tuples(st.integers(1, 5), st.none() | st.integers(0, 50)), max_size=30)
# Then changes: ("count", n) commits to the open ledger, ("roll", gap) closes it, and
# ("drop", seed) drops some closed ledgers (the seed picks which).
changes = st.lists(
    st.tuples(st.sampled_from(["count", "roll", "drop"]), st.integers(0, 1_000)), max_size=40
)


def starting_ledgers(closed: list[tuple[int, int | None]], open_gap: int) -> list[LedgerInfo]:
    infos, ledger_id = [], 0
    for gap, count in closed:
        ledger_id += gap
        infos.append(LedgerInfo(ledger_id, count))
    infos.append(LedgerInfo(ledger_id + open_gap, None))
    return infos[::-1]  # in any order


def agree(table: LedgerTable, model: ScanModel) -> None:
    top = model.current + 3
    for ledger_id in range(-1, top):
        assert table.count_of(ledger_id) == model.count_of(ledger_id), ledger_id
        count = model.count_of(ledger_id) or 0
        for entry_id in (-1, 0, count - 1, count, count + 1):
            expected = model.count_of(ledger_id) is not None and 0 <= entry_id < count
            assert table.contains(ledger_id, entry_id) == expected
    assert table.tail() == model.tail()
    assert table.infos == model.infos
    assert (table.current, table.open_count) == (model.current, model.next_entry)


@settings(max_examples=200, deadline=None)
@given(closed_ledgers, st.integers(1, 5), changes)
def test_counts_positions_and_tail_agree_with_the_scan_they_replaced(closed, open_gap, steps):
    # Given a table and the old scanned list built from the same ledgers
    infos = starting_ledgers(closed, open_gap)
    table, model = LedgerTable(infos), ScanModel(infos)
    agree(table, model)
    # When entries are committed, ledgers roll and closed ones are dropped
    for what, n in steps:
        if what == "count":
            table.set_open_count(model.next_entry + n % 20)
            model.next_entry += n % 20
        elif what == "roll":
            new_id = model.current + 1 + n % 3
            table.roll(new_id)
            model.roll(new_id)
        else:
            closed_ids = [x.ledger_id for x in model.infos[:-1]]
            doomed = {i for k, i in enumerate(closed_ids) if (n >> (k % 10)) & 1}
            table.drop(doomed)
            model.drop(doomed)
        # Then every lookup answers as the scan did
        agree(table, model)


def test_a_roll_closes_the_open_ledger_at_its_count_and_opens_the_next():
    # Given ledger 1 closed at 5 and ledger 3 open with 2 entries
    table = LedgerTable([LedgerInfo(3, None), LedgerInfo(1, 5)])
    table.set_open_count(2)
    # When it rolls to ledger 4
    table.roll(4)
    # Then ledger 3 holds its 2 entries and 4 is open and empty
    assert table.infos == [LedgerInfo(1, 5), LedgerInfo(3, 2), LedgerInfo(4, None)]
    assert (table.count_of(3), table.count_of(4), table.count_of(2)) == (2, 0, None)
    assert table.tail() == (3, 1)


def test_a_new_ledger_must_be_above_the_ones_before_it():
    # Given a table whose last ledger, 5, is closed
    table = LedgerTable([LedgerInfo(5, 3)])
    assert not table.has_open
    # When a ledger at or below it would open, then that is refused
    with pytest.raises(RaydelayError, match="not above 5"):
        table.open(5)
    # and one above it opens, and a roll cannot go back either
    table.open(6)
    with pytest.raises(RaydelayError, match="not above 6"):
        table.roll(6)
    assert table.infos == [LedgerInfo(5, 3), LedgerInfo(6, None)]
