"""The parts of a scheduled call's life that need no cluster: the retry waits and their
jitter, the spec's new fields (and a spec stored before them), the status records' keys,
their expiry, and the result a call keeps."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest

from raydelay.errors import InvalidArgument
from raydelay.tasks import status as st
from raydelay.tasks.context import kept_result
from raydelay.tasks.spec import (
    DEFAULT_JITTER,
    RetryPolicy,
    TaskSpec,
    check_timeout,
    decode_payload,
    retry_policy,
    task_payload,
)


def test_a_retry_waits_at_least_its_backoff_and_at_most_the_jitter_more():
    policy = retry_policy(5, (1.0, 8.0))
    assert policy.jitter == DEFAULT_JITTER == 0.5
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0)):
        assert policy.base_delay_s(attempt) == base
        assert policy.delay_s(attempt, draw=lambda: 0.0) == base
        assert policy.delay_s(attempt, draw=lambda: 0.999999) == pytest.approx(base * 1.5)
    # a thousand calls that failed together come back spread over the window, not at once
    waits = [policy.delay_s(1) for _ in range(1000)]
    assert min(waits) >= 1.0 and max(waits) <= 1.5
    assert len({round(w, 3) for w in waits}) > 300
    # jitter 0 is the plain backoff; a RetryPolicy passed as backoff keeps its own
    none = retry_policy(1, RetryPolicy(first_s=2.0, jitter=0.0))
    assert {none.delay_s(1) for _ in range(50)} == {2.0}


@pytest.mark.parametrize(
    ("jitter", "match"),
    [(-0.1, "expected 0"), (11, "expected 0"), (float("nan"), "expected 0"), ("1", "got str"),
     (True, "got bool")],
)  # fmt: skip
def test_bad_jitter_is_refused(jitter, match):
    with pytest.raises(InvalidArgument, match=f"jitter: .*{match}"):
        retry_policy(1, 1.0, jitter)


def test_timeouts_are_checked():
    assert check_timeout(None) is None and check_timeout(-1) is None
    assert check_timeout(2) == 2.0 and check_timeout(timedelta(minutes=1)) == 60.0
    for bad, match in ((0, "more than 0"), (-3, "0 to 365 days"), ("5", "seconds or a"),
                       (float("inf"), "0 to 365 days"), (10**9, "0 to 365 days")):  # fmt: skip
        with pytest.raises(InvalidArgument, match=f"timeout_s: .*{match}"):
            check_timeout(bad)


def test_a_spec_keeps_its_result_timeout_and_jitter_and_an_older_one_reads_with_defaults():
    spec = TaskSpec(
        "fn", "m:f", retry=RetryPolicy(2, 1.0, 10.0, 2.0, 0.25), keep_result=True, timeout_s=3.5
    )
    back, args = decode_payload(task_payload(spec.encode(), b"args"))
    assert (back.keep_result, back.timeout_s, back.retry.jitter, args) == (True, 3.5, 0.25, b"args")
    # a call stored before these fields: no result kept, no timeout, the default jitter
    import msgpack

    old = msgpack.unpackb(TaskSpec("fn", "m:g").encode(), raw=False)
    del old["keep"], old["timeout"]
    old["retry"] = old["retry"][:4]
    back, _ = decode_payload(task_payload(msgpack.packb(old, use_bin_type=True), b""))
    assert (back.keep_result, back.timeout_s, back.retry.jitter) == (False, None, DEFAULT_JITTER)


def test_record_keys_sort_by_time_and_expire_by_the_time_in_them():
    tid = "raydelay-tasks/3/17:42"
    keys = [st.record_key(tid, t) for t in (9_000, 100_000, 10_000)]
    assert all(k.startswith(st.task_prefix(tid)) for k in keys)
    assert "/" not in st.task_prefix(tid)[len(st.STATUS_PREFIX) : -1]  # one level per task
    assert st.newest(keys) == st.record_key(tid, 100_000) and st.newest([]) is None
    assert st.expired(keys + ["tasks/status/x/not-a-record"], now_ms=60_000, ttl_ms=50_000) == [
        st.record_key(tid, 9_000)
    ]
    record = st.TaskRecord(st.FAILED, 2, "boom", 123, None, None, 456)
    assert st.TaskRecord.from_bytes(record.to_bytes()) == record


def test_a_kept_result_is_pickled_within_its_bound_or_refused_with_the_reason():
    data, why = kept_result({"total": 12}, 1_000)
    assert why is None and pickle.loads(data) == {"total": 12}
    data, why = kept_result(b"x" * 2_000, 1_000)
    assert data is None and "over tasks.max_result_bytes (1,000)" in why
    data, why = kept_result(lambda: 1, 1_000)  # cloudpickle takes what pickle cannot
    assert why is None and data is not None

    class Unpicklable:  # (a lock is no test: a Ray session may register a reducer for it)
        def __reduce__(self):
            raise TypeError("not this one")

    data, why = kept_result(Unpicklable(), 1_000)
    assert data is None and "cannot be pickled: not this one" in why
