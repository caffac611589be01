"""The cursor: mark-delete plus individual acks, checked against a trivially correct model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raydelay.dispatch.cursor import Cursor
from raydelay.errors import CodecError
from raydelay.positions import key_of

LEDGERS = [(3, 5), (7, 4), (9, None)]  # two closed ledgers and an open one


def ack(cursor: Cursor, positions: list[tuple[int, int]]) -> int:
    arr = np.array(positions, dtype=np.int64).reshape(-1, 2)
    return cursor.ack(arr[:, 0], arr[:, 1])


def test_mark_delete_follows_contiguous_acks_across_closed_ledgers():
    c = Cursor()
    c.learn_ledgers(LEDGERS)
    assert c.mark_delete == (3, -1)
    ack(c, [(3, 1), (3, 0)])
    assert c.mark_delete == (3, 1)
    ack(c, [(3, 3), (3, 4), (7, 0)])  # a gap at (3, 2)
    assert c.mark_delete == (3, 1) and c.is_acked(3, 3) and not c.is_acked(3, 2)
    ack(c, [(3, 2)])
    assert c.mark_delete == (7, 0)  # ledger 3 complete, then into ledger 7
    assert c.individually_acked() == 0


def test_acks_at_or_before_mark_delete_are_not_counted_twice():
    c = Cursor()
    c.learn_ledgers(LEDGERS)
    assert ack(c, [(3, 0), (3, 1)]) == 2
    assert ack(c, [(3, 0), (3, 1), (3, 2)]) == 1


def test_a_deleted_ledger_below_the_first_known_one_counts_as_acknowledged():
    c = Cursor((1, 4))  # ledger 1 was deleted by retention meanwhile
    c.learn_ledgers([(7, 4), (9, None)])
    assert c.mark_delete == (7, -1)


def test_ledgers_learnt_from_a_bucket_do_not_move_mark_delete_past_unknown_ledgers():
    # Given a new cursor that learns ledgers 3 and 7 from a bucket, before the log's list
    c = Cursor()
    c.learn_ledgers([(3, 2), (7, 2)], whole_log=False)
    # Then it does not take ledger 1 (not learnt yet) as deleted
    assert c.mark_delete == (-1, -1) and not c.is_acked(1, 0)
    # When the log's list names ledgers 1, 3 and 7 and an open 9, and 3 and 7 are acked
    c.learn_ledgers([(1, 2), (3, 2), (7, 2), (9, None)])
    ack(c, [(3, 0), (3, 1), (7, 0), (7, 1)])
    # Then mark-delete waits at ledger 1, and crosses the rest once ledger 1 is acked
    assert c.mark_delete == (1, -1) and not c.is_acked(1, 1)
    ack(c, [(1, 0), (1, 1)])
    assert c.mark_delete == (9, -1)


def test_mark_delete_does_not_cross_an_id_above_the_logs_last_list():
    # Given the log's list up to ledger 3, then a bucket's ledgers 7 and 9 (ledger 5 held
    # no delayed entry, so no bucket names it)
    c = Cursor()
    c.learn_ledgers([(1, 1), (3, 1)])
    c.learn_ledgers([(7, 1), (9, 1)], whole_log=False)
    ack(c, [(1, 0), (3, 0), (7, 0), (9, 0)])
    # Then mark-delete stops after ledger 3: ledger 5 may exist
    assert c.mark_delete == (3, 0) and not c.is_acked(5, 0)
    # and goes on once the log's list names ledger 5 and it is acked
    c.learn_ledgers([(1, 1), (3, 1), (5, 1), (7, 1), (9, 1), (11, None)])
    assert c.mark_delete == (5, -1)
    ack(c, [(5, 0)])
    assert c.mark_delete == (11, -1)


def test_unacked_between_counts_entries_after_mark_delete_up_to_the_tail():
    c = Cursor()
    c.learn_ledgers(LEDGERS)
    ack(c, [(3, 0), (3, 4), (7, 1)])
    assert c.unacked_between((9, 2)) == (5 - 2) + (4 - 1) + 3
    assert c.unacked_between(None) == 0


def test_encode_and_decode_round_trip_with_the_read_position():
    c = Cursor()
    c.learn_ledgers(LEDGERS)
    ack(c, [(3, 0), (3, 2), (7, 3)])
    back, read = Cursor.decode(c.encode((9, 1)))
    assert read == (9, 1)
    assert back.mark_delete == c.mark_delete
    assert {k: list(v) for k, v in back.acked.items()} == {3: [2], 7: [3]}
    assert back.known_ledgers() == c.known_ledgers()
    with pytest.raises(CodecError):
        Cursor.decode(b"\x00\x01")


positions = st.lists(
    st.sampled_from([(lg, e) for lg, n in ((3, 5), (7, 4), (9, 6)) for e in range(n)]),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(positions, max_size=6), close_last=st.booleans())
def test_mark_delete_is_always_the_end_of_the_acknowledged_prefix(batches, close_last):
    ledgers = [(3, 5), (7, 4), (9, 6 if close_last else None)]
    order = [(lg, e) for lg, n in ((3, 5), (7, 4), (9, 6)) for e in range(n)]
    c = Cursor()
    c.learn_ledgers(ledgers)
    acked: set[tuple[int, int]] = set()
    for b in batches:
        if b:
            assert ack(c, b) == len(set(b) - acked)
            acked |= set(b)
        prefix = 0
        while prefix < len(order) and order[prefix] in acked:
            prefix += 1
        # the model: the last position of the acknowledged prefix (or the start of the next
        # ledger once a closed ledger is complete)
        if prefix == 0:
            expected = (3, -1)
        elif prefix < len(order) and order[prefix][1] == 0:
            expected = (order[prefix][0], -1)
        else:
            expected = order[prefix - 1]
        assert c.mark_delete == expected
        back, _ = Cursor.decode(c.encode((9, 0)))
        for cursor in (c, back, c.copy()):
            for p in order:
                assert cursor.is_acked(*p) == (p in acked)
                # the key bitmap (one step to check a column of keys): every position
                # acknowledged after mark-delete, and none not acknowledged
                if p not in acked:
                    assert key_of(*p) not in cursor.acked_keys
                elif p > cursor.mark_delete:
                    assert key_of(*p) in cursor.acked_keys
