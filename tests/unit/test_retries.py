"""The one retry policy (raydelay/retries.py): its waits, its budget, what it retries."""

from __future__ import annotations

import pytest

from raydelay.errors import InvalidArgument, StorageError, Unavailable
from raydelay.retries import STORE_WRITE, Backoff, retry


def test_waits_double_up_to_the_cap_with_jitter_and_stop_at_the_budget():
    waits = list(Backoff(first_s=0.1, max_s=0.4, attempts=5).delays_s())
    assert len(waits) == 4  # 5 tries, so 4 waits between them
    for wait, base in zip(waits, [0.1, 0.2, 0.4, 0.4], strict=True):
        assert 0.5 * base <= wait < 1.5 * base


def test_minus_one_means_no_limit_and_zero_attempts_is_refused():
    endless = Backoff(attempts=-1).delays_s()
    assert len([next(endless) for _ in range(1000)]) == 1000
    with pytest.raises(ValueError, match="attempts"):
        Backoff(attempts=0)


def test_retry_gets_past_transient_failures_and_reports_each():
    outcomes = [StorageError("slow down", retriable=True), Unavailable("restarting"), "done"]
    seen, slept = [], []

    def step():
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    assert retry(step, Backoff(), sleep=slept.append, on_failure=seen.append) == "done"
    assert [type(e) for e in seen] == [StorageError, Unavailable]
    assert len(slept) == 2


def test_retry_raises_the_last_failure_when_the_budget_is_spent():
    calls = []

    def always_failing():
        calls.append(1)
        raise StorageError("down", retriable=True)

    with pytest.raises(StorageError, match="down"):
        retry(always_failing, STORE_WRITE, sleep=None)
    assert len(calls) == STORE_WRITE.attempts


def test_retry_raises_a_non_transient_error_at_once():
    calls = []

    def bad_input():
        calls.append(1)
        raise InvalidArgument("x: bad")

    with pytest.raises(InvalidArgument):
        retry(bad_input, Backoff(), sleep=None)
    assert calls == [1]
