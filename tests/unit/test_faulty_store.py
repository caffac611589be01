import time

import pytest

from raydelay.errors import InvalidArgument, NotFound, StorageError
from raydelay.storage import FaultyObjectStore, MemoryObjectStore


def test_fail_next_fails_exactly_the_next_calls_of_that_op():
    store = FaultyObjectStore(MemoryObjectStore())
    store.fail_next("put", times=2)
    for _ in range(2):
        with pytest.raises(StorageError) as info:
            store.put("k", b"v")
        assert info.value.retriable is True
    assert not store.inner.exists("k")  # a failed put never reached the inner store
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert store.failed["put"] == 2 and store.calls["put"] == 1


def test_failures_are_per_operation():
    store = FaultyObjectStore(MemoryObjectStore())
    store.put("k", b"v")
    store.fail_next("get")
    assert store.exists("k")
    assert store.list("") == ["k"]
    assert store.get_range("k", 0, 1) == b"v"
    with pytest.raises(StorageError):
        store.get("k")
    assert store.get("k") == b"v"


def test_a_custom_error_is_raised_as_given():
    store = FaultyObjectStore(MemoryObjectStore())
    store.fail_next("delete", error=StorageError("denied", retriable=False))
    with pytest.raises(StorageError, match="denied") as info:
        store.delete("k")
    assert info.value.retriable is False
    store.fail_next("list", error=NotFound("gone"))
    with pytest.raises(NotFound):
        store.list("")


def test_latency_is_added_to_each_call():
    store = FaultyObjectStore(MemoryObjectStore())
    store.add_latency("exists", 0.05)
    started = time.monotonic()
    store.exists("k")
    # a floor, not a speed assertion: the sleep must have happened
    assert time.monotonic() - started >= 0.05
    store.reset()
    assert store.pending_failures("exists") == 0


def test_bad_arguments_are_named():
    store = FaultyObjectStore(MemoryObjectStore())
    with pytest.raises(InvalidArgument, match="op: must be one of"):
        store.fail_next("write")
    with pytest.raises(InvalidArgument, match="times"):
        store.fail_next("put", times=0)
    with pytest.raises(InvalidArgument, match="seconds"):
        store.add_latency("get", -1)


def test_a_failure_rate_fails_calls_at_random_and_reproducibly():
    from raydelay.errors import StorageError
    from raydelay.storage import FaultyObjectStore, MemoryObjectStore

    def outcomes(seed):
        store = FaultyObjectStore(MemoryObjectStore())
        store.set_failure_rate(0.3, seed=seed)
        out = []
        for i in range(200):
            try:
                store.put(f"k{i}", b"x")
                out.append(True)
            except StorageError as exc:
                assert exc.retriable
                out.append(False)
        return out

    first = outcomes(5)
    assert first == outcomes(5)
    assert 30 < first.count(False) < 90


def test_an_outage_file_fails_every_call_while_it_exists(tmp_path):
    import pytest

    from raydelay.errors import StorageError
    from raydelay.storage import FaultyObjectStore, MemoryObjectStore

    flag = tmp_path / "OUTAGE"
    store = FaultyObjectStore(MemoryObjectStore())
    store.set_outage_file(str(flag))
    store.put("a", b"1")
    flag.touch()
    with pytest.raises(StorageError, match="outage"):
        store.get("a")
    flag.unlink()
    assert store.get("a") == b"1"


def test_the_config_wraps_every_store_in_faults_only_when_asked(tmp_path):
    from raydelay.config import config_from_dict
    from raydelay.storage import FaultyObjectStore, LocalDirObjectStore, make_store

    plain = make_store(config_from_dict({"storage": {"local": {"root": str(tmp_path)}}}))
    assert isinstance(plain, LocalDirObjectStore)
    faulty = make_store(
        config_from_dict(
            {
                "storage": {
                    "local": {"root": str(tmp_path)},
                    "faults": {"failure_rate": 0.5, "seed": 3},
                }
            }
        )
    )
    assert isinstance(faulty, FaultyObjectStore)
