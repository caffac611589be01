"""One behaviour suite, run against every ObjectStore backend: memory, local dir, and S3 on
moto (a model of S3) and on SeaweedFS (a real S3-compatible server)."""

from __future__ import annotations

import threading

import pytest

from raydelay.errors import Conflict, InvalidArgument, NotFound
from raydelay.storage import LocalDirObjectStore, MemoryObjectStore


@pytest.fixture(params=["memory", "local", "s3", "seaweed"])
def store(request, tmp_path):
    if request.param == "memory":
        return MemoryObjectStore()
    if request.param == "local":
        return LocalDirObjectStore(tmp_path / "store")
    if request.param == "seaweed":
        return request.getfixturevalue("seaweed_store_factory")(prefix="contract")
    return request.getfixturevalue("s3_store_factory")(prefix="contract")


def test_put_then_get_returns_the_same_bytes(store):
    store.put("a/b/c", b"hello \x00 world")
    assert store.get("a/b/c") == b"hello \x00 world"
    assert store.exists("a/b/c")


def test_empty_value_round_trips(store):
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.exists("empty")


def test_put_accepts_bytearray_and_rejects_text(store):
    store.put("ba", bytearray(b"xyz"))
    assert store.get("ba") == b"xyz"
    with pytest.raises(InvalidArgument, match="data: expected bytes"):
        store.put("txt", "not bytes")  # type: ignore[arg-type]
    assert not store.exists("txt")


def test_overwrite_replaces_the_whole_value(store):
    store.put("k", b"a much longer first value")
    store.put("k", b"short")
    assert store.get("k") == b"short"
    assert store.list("") == ["k"]


def test_put_new_creates_once_and_refuses_other_bytes(store):
    store.put_new("led/1", b"first")
    store.put_new("led/1", b"first")  # a retried write whose answer was lost: fine
    with pytest.raises(Conflict, match="led/1"):
        store.put_new("led/1", b"second")
    assert store.get("led/1") == b"first"
    assert store.list("") == ["led/1"]  # and no temp file is left behind


def test_concurrent_put_new_of_one_key_lets_exactly_one_writer_win(store):
    outcomes: list[str] = []

    def write(i: int) -> None:
        try:
            store.put_new("race", b"writer %d" % i)
            outcomes.append("won")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 5 + ["won"]
    assert store.get("race").startswith(b"writer ")


def test_get_range_is_end_exclusive_and_clipped(store):
    store.put("r", b"0123456789")
    assert store.get_range("r", 0, 3) == b"012"
    assert store.get_range("r", 3, 7) == b"3456"
    assert store.get_range("r", 8, 100) == b"89"
    assert store.get_range("r", 4, 4) == b""
    assert store.get_range("r", 10, 20) == b""


def test_get_range_rejects_bad_ranges(store):
    store.put("r", b"0123")
    with pytest.raises(InvalidArgument, match="end: 1 is before start 2"):
        store.get_range("r", 2, 1)
    with pytest.raises(InvalidArgument, match="start: must be >= 0"):
        store.get_range("r", -1, 2)


def test_missing_keys_raise_not_found(store):
    with pytest.raises(NotFound):
        store.get("nope")
    with pytest.raises(NotFound):
        store.get_range("nope", 0, 4)
    with pytest.raises(NotFound):
        store.get_range("nope", 0, 0)
    assert store.exists("nope") is False


def test_delete_removes_and_is_idempotent(store):
    store.put("d/x", b"1")
    store.delete("d/x")
    assert not store.exists("d/x")
    store.delete("d/x")
    store.delete("never/was")
    with pytest.raises(NotFound):
        store.get("d/x")


def test_list_filters_by_prefix_and_sorts(store):
    for key in ["t/b/2", "t/a/1", "t/a/10", "u/a", "t/ab"]:
        store.put(key, key.encode())
    assert store.list("t/a/") == ["t/a/1", "t/a/10"]
    assert store.list("t/a") == ["t/a/1", "t/a/10", "t/ab"]
    assert store.list("t/") == ["t/a/1", "t/a/10", "t/ab", "t/b/2"]
    assert store.list("") == ["t/a/1", "t/a/10", "t/ab", "t/b/2", "u/a"]
    assert store.list("zzz/") == []


def test_list_pages_past_a_thousand_keys(store):
    keys = [f"many/{i:05d}" for i in range(1_203)]
    for k in keys:
        store.put(k, b"")
    store.put("other/x", b"")
    listed = store.list("many/")
    assert len(listed) == 1_203
    assert listed == keys


def test_concurrent_puts_from_threads_all_land(store):
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(25):
                store.put(f"conc/{t:02d}/{i:03d}", f"{t}:{i}".encode() * 50)
                store.put("conc/shared", f"{t}:{i}".encode() * 50)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    listed = store.list("conc/")
    assert len(listed) == 8 * 25 + 1
    assert store.get("conc/03/007") == b"3:7" * 50
    # the shared key holds one writer's value whole, never a mix
    value = store.get("conc/shared")
    written = {f"{t}:{i}".encode() * 50 for t in range(8) for i in range(25)}
    assert value in written
