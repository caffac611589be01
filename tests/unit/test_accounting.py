"""raydelay.accounting: lost, early, cancelled-delivered, duplicates and lateness, each from
a hand-built run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from raydelay.accounting import Delivery, Early, Lateness, Ledger, account
from raydelay.errors import InvalidArgument
from tests.unit.test_purity import PKG, forbidden_paths


def got(*rows: tuple) -> list[Delivery]:
    """Deliveries from (id, received_at_ms[, redelivery_count]) rows."""
    return [Delivery(*row) for row in rows]


def test_a_run_where_everything_arrived_once_and_on_time_is_clean():
    # Given a delayed and an immediate message, each received once, the delayed one 5 ms late
    sent = {"a": 1_000, "b": None}
    result = account(sent, got(("b", 900), ("a", 1_005)))
    # Then nothing is wrong, and the lateness counts only the delayed one
    assert result.ok
    assert result.counts() == {
        "lost": 0,
        "early": 0,
        "cancelled_delivered": 0,
        "duplicates": 0,
        "unmarked_duplicates": 0,
        "silent_duplicates": 0,
        "unknown": 0,
        "received": 2,
    }
    assert result.sent == 2 and result.distinct == 2
    assert result.lateness_ms.tolist() == [5]


def test_a_message_never_received_is_lost():
    # Given three sent and one of them never received
    result = account({"a": None, "b": 10, "c": None}, got(("a", 1), ("c", 2)))
    # Then that one is lost, and only that one
    assert result.lost == {"b"}
    assert not result.ok


def test_a_delivery_before_its_deliver_at_is_early_even_by_one_millisecond():
    # Given one message received 1 ms before it was due and one exactly when due
    result = account({"a": 1_000, "b": 1_000}, got(("a", 999), ("b", 1_000)))
    # Then only the first is early, with its times
    assert result.early == (Early("a", 1_000, 999),)
    assert result.lateness.early == 1
    assert not result.ok


def test_an_immediate_message_is_never_early():
    result = account({"a": None}, got(("a", 0)))
    assert result.early == () and len(result.lateness_ms) == 0


def test_a_repeat_received_early_counts_as_early_too():
    # Given a message received on time, then again (a redelivery) before its deliver_at was
    # reached by the receiver's clock
    result = account({"a": 1_000}, got(("a", 1_001), ("a", 990, 1)))
    # Then the early one is reported (deliveries are taken in receive order)
    assert result.early == (Early("a", 1_000, 990),)


def test_a_delivered_message_whose_cancel_was_honoured_is_cancelled_delivered_not_lost():
    # Given two honoured cancels: one message stayed away, the other arrived anyway
    sent = {"kept": None, "gone": 5_000, "leaked": 5_000}
    result = account(sent, got(("kept", 1), ("leaked", 5_001)), cancelled={"gone", "leaked"})
    # Then the one that arrived is cancelled-delivered, and the missing one is not lost
    assert result.cancelled_delivered == {"leaked"}
    assert result.lost == frozenset()
    assert not result.ok


def test_an_excused_message_may_be_missing_but_an_unexcused_refused_one_is_lost():
    # Given two messages whose cancels were refused, neither received
    sent = {"a": 5_000, "b": 5_000}
    # Then excused, a missing message is not lost; not excused, it is
    assert account(sent, [], excused={"a", "b"}).lost == frozenset()
    assert account(sent, [], excused={"a"}).lost == {"b"}


def test_repeats_are_duplicates_and_those_without_a_raised_count_are_unmarked():
    # Given "a" delivered three times, its count raised each time, and "b" delivered twice
    # with the same count
    deliveries = got(("a", 10, 0), ("b", 11, 0), ("a", 20, 1), ("b", 21, 0), ("a", 30, 2))
    result = account({"a": None, "b": None}, deliveries)
    # Then there are three duplicates, one of them unmarked, and silent (at count 0)
    assert result.duplicates == 3
    assert result.unmarked_duplicates == 1 and result.silent_duplicates == 1
    assert result.distinct == 2 and result.received == 5


def test_a_repeat_is_marked_only_above_the_count_of_the_first_delivery_seen():
    # Given a first delivery already counted 1 (an earlier one never reached the consumer)
    # and a repeat with the same count
    result = account({"a": None}, got(("a", 10, 1), ("a", 20, 1)))
    # Then the repeat is unmarked: the consumer could not tell it from the first; but it is
    # not silent, its count saying it may be a repeat
    assert result.unmarked_duplicates == 1 and result.silent_duplicates == 0


def test_the_first_delivery_is_the_earliest_received_whatever_the_order_given():
    # Given deliveries recorded out of receive order
    result = account({"a": 100}, got(("a", 300, 1), ("a", 150, 0)))
    # Then the lateness is that of the earliest, and the later one is a marked repeat
    assert result.lateness_ms.tolist() == [50]
    assert (result.duplicates, result.unmarked_duplicates) == (1, 0)


def test_a_message_never_sent_is_unknown():
    result = account({"a": None}, got(("a", 1), ("stray", 2)))
    assert result.unknown == {"stray"}
    assert not result.ok


def test_lateness_summary_gives_percentiles_max_and_early():
    # Given lateness values from -2 to 97 ms
    values = list(range(-2, 98))
    summary = Lateness.of(values)
    # Then the summary agrees with a direct computation
    assert summary.n == 100
    assert summary.p50_ms == pytest.approx(np.percentile(values, 50))
    assert summary.p99_ms == pytest.approx(np.percentile(values, 99))
    assert summary.max_ms == 97 and summary.early == 2
    assert summary.as_dict() == {
        "p50": summary.p50_ms,
        "p99": summary.p99_ms,
        "max": 97,
        "early": 2,
        "n": 100,
    }


def test_lateness_summary_of_nothing_has_no_percentiles():
    empty = Lateness.of(np.zeros(0, dtype=np.int64))
    assert (empty.n, empty.p50_ms, empty.p99_ms, empty.max_ms, empty.early) == (
        0,
        None,
        None,
        None,
        0,
    )


def test_the_ledger_accounts_per_subscription():
    # Given a ledger of three sends, one honoured and one refused cancel
    ledger = Ledger()
    ledger.record_sent(["a", "b", "c"], [1_000, None, 2_000])
    ledger.record_cancels(["c", "b"], [True, False])
    # When one subscription gets a and b, another only b (twice, unmarked), early
    ledger.record_received(["a", "b"], 1_010, [0, 0], subscription="email")
    ledger.record_received(["b"], 500, subscription="push")
    ledger.record_received(["b"], 600, [0], subscription="push")
    email, push = ledger.result("email"), ledger.result("push")
    # Then each subscription's result is its own
    assert email.ok and email.lateness_ms.tolist() == [10]
    assert push.lost == {"a"} and push.duplicates == 1 and push.unmarked_duplicates == 1
    assert ledger.missing("email") == 0 and ledger.missing("push") == 1
    # and a refused cancel's message may be missing only when refusals are excused
    ledger.record_sent(["d"], 3_000)
    ledger.record_cancels(["d"], [False])
    assert ledger.result("email").lost == {"d"}
    assert ledger.result("email", excuse_refused=True).lost == frozenset()
    assert ledger.missing("email", excuse_refused=True) == 0


def test_the_ledger_live_lateness_counts_first_deliveries_of_known_sends():
    ledger = Ledger()
    ledger.record_sent(["a", "b"], 100)
    ledger.record_received(["a"], 130)
    ledger.record_received(["a", "b", "x"], 150, [1, 0, 0])  # a repeat, and an unknown id
    assert ledger.lateness_so_far().tolist() == [30, 50]
    assert ledger.distinct_received() == 3 and ledger.sent == 2


def test_the_ledger_checks_that_columns_line_up():
    ledger = Ledger()
    with pytest.raises(InvalidArgument, match="deliver_at_ms: 1 values for 2 ids"):
        ledger.record_sent(["a", "b"], [1])
    with pytest.raises(InvalidArgument, match="redelivery_counts:"):
        ledger.record_received(["a"], 1, [0, 0])


def test_the_ledger_takes_concurrent_records_without_losing_any():
    # Given 4 threads each recording 5,000 deliveries of their own messages
    ledger = Ledger()
    ids = [[(t, i) for i in range(5_000)] for t in range(4)]
    for chunk in ids:
        ledger.record_sent(chunk, None)

    def consume(chunk) -> None:
        for i in range(0, len(chunk), 100):
            ledger.record_received(chunk[i : i + 100], 1)

    threads = [threading.Thread(target=consume, args=(chunk,)) for chunk in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every one is accounted for, once
    result = ledger.result()
    assert result.ok and result.distinct == 20_000 and result.duplicates == 0


def test_accounting_does_not_reach_ray():
    assert forbidden_paths(PKG / "accounting.py") == []
