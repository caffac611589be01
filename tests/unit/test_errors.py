import pickle

import pytest

from raydelay.errors import (
    CodecError,
    InvalidArgument,
    NotFound,
    RaydelayError,
    StorageError,
)


def test_the_error_tree_has_one_root_and_the_builtin_bases():
    assert issubclass(InvalidArgument, RaydelayError) and issubclass(InvalidArgument, ValueError)
    assert issubclass(NotFound, RaydelayError) and issubclass(NotFound, KeyError)
    assert issubclass(StorageError, RaydelayError)
    assert issubclass(CodecError, RaydelayError)


def test_storage_error_keeps_retriable_across_pickling():
    err = pickle.loads(pickle.dumps(StorageError("disk on fire", retriable=True)))
    assert err.retriable is True
    assert str(err) == "disk on fire"


def test_not_found_prints_plain_text():
    assert str(NotFound("no object at key 'a'")) == "no object at key 'a'"


def test_actor_recovery_rides_out_transient_errors_and_raises_the_others():
    from raydelay.cluster import rpc
    from raydelay.errors import InvalidArgument, StorageError, Unavailable

    failures = [
        StorageError("outage", retriable=True),
        Unavailable("coordinator restarting"),
        ValueError("Failed to look up actor with name 'coordinator'"),
    ]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "up"

    slept: list[float] = []
    assert rpc.recover(flaky, what="test", sleep=slept.append) == "up"
    assert len(slept) == 3 and not failures

    def broken() -> None:
        raise StorageError("access denied", retriable=False)

    with pytest.raises(StorageError, match="access denied"):
        rpc.recover(broken, what="test", sleep=slept.append)
    with pytest.raises(InvalidArgument):
        rpc.recover(
            lambda: (_ for _ in ()).throw(InvalidArgument("bad")), what="t", sleep=slept.append
        )


def test_new_errors_keep_their_details_across_pickling():
    from raydelay.errors import Conflict, StoreOwned

    conflict = pickle.loads(pickle.dumps(Conflict("put 'k': another object is already there")))
    assert isinstance(conflict, StorageError) and conflict.retriable is False
    owned = pickle.loads(pickle.dumps(StoreOwned("owned", {"address": "a:1"})))
    assert owned.owner == {"address": "a:1"} and str(owned) == "owned"


def test_a_bout_of_retried_failures_is_one_line_then_one_when_it_works_again(caplog, monkeypatch):
    import logging

    from raydelay import retries
    from raydelay.retries import Retries

    clock = [100.0]
    monkeypatch.setattr(retries.time, "monotonic", lambda: clock[0])
    r = Retries(logging.getLogger("t"), "reading the log")
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(50):  # a 10 s outage, tried every 0.2 s
            r.failed(StorageError("injected outage: get failed\nmore detail", retriable=True))
            clock[0] += 0.2
        r.ok()
        r.ok()  # nothing to say the second time
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [
        "reading the log failed (StorageError: injected outage: get failed); retrying "
        "(1 failed attempts so far)",
        "reading the log works again, after 50 failed attempts in 10.0 s",
    ]
    assert all(rec.exc_info is None for rec in caplog.records)  # no traceback per attempt
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="t"):
        r.failed(KeyError("a bug"))
    assert caplog.records[0].exc_info is not None  # a bug keeps its traceback
