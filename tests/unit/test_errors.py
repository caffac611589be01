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
