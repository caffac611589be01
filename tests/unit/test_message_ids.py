"""MessageIds: send_many's ids kept as columns, behaving as a sequence of MessageId."""

from __future__ import annotations

import numpy as np
import pytest

from raydelay.client.message import MessageId, MessageIds


def ids() -> MessageIds:
    return MessageIds("t", np.array([1, 0, 1]), np.array([7, 7, 8]), np.array([0, 1, 2]))


def test_message_ids_index_slice_iterate_and_compare_like_a_list():
    m = ids()
    expected = [MessageId("t", 1, 7, 0), MessageId("t", 0, 7, 1), MessageId("t", 1, 8, 2)]
    assert len(m) == 3 and m[0] == expected[0] and m[-1] == expected[-1]
    assert m[1:] == expected[1:] and list(m) == expected and m == expected
    assert sorted(m) == sorted(expected) and set(m) == set(expected)
    first, *rest = m
    assert first == expected[0] and rest == expected[1:]
    assert all(type(x) is MessageId and type(x.ledger_id) is int for x in m)
    with pytest.raises(IndexError):
        m[3]
    assert m != [expected[0]] and "n=3" in repr(m)


def test_a_message_id_parses_back_from_its_text():
    from raydelay.client.message import MessageId

    mid = MessageId("orders/eu", 3, 12, 40_000)  # a topic name may hold "/"
    assert MessageId.parse(str(mid)) == mid


def test_a_malformed_message_id_text_is_refused_naming_the_field():
    import pytest

    from raydelay.client.message import MessageId
    from raydelay.errors import InvalidArgument

    for bad in ("orders/3/12", "orders/x/12:4", "/3/12:4", "orders/3/-1:4", "", 17):
        with pytest.raises(InvalidArgument, match="message_id"):
            MessageId.parse(bad)
