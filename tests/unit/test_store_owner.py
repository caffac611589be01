"""One owner per store (the claim, the local-dir lock, the lease of other stores), and the
checks connect() makes before it starts anything."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from raydelay.cluster import owner
from raydelay.cluster.owner import StoreOwner, claim_is_live, current_claim
from raydelay.errors import StoreOwned
from raydelay.storage import LocalDirObjectStore, MemoryObjectStore


def test_a_local_store_has_one_owner_until_its_process_ends(tmp_path):
    store = LocalDirObjectStore(tmp_path / "s")
    first = StoreOwner(store, "10.0.0.1:6379")
    assert first.acquire().epoch == 1
    assert claim_is_live(store, current_claim(store))
    # a second owner, even in the same process, is refused and told who holds the store
    with pytest.raises(StoreOwned, match=r"10\.0\.0\.1:6379.*address=\"auto\"") as refused:
        StoreOwner(store, "10.0.0.2:6379").acquire()
    assert refused.value.owner["address"] == "10.0.0.1:6379"
    # once the holder lets go (its process ended), the next takes it with a higher epoch
    first.release()
    assert not claim_is_live(store, current_claim(store))
    second = StoreOwner(store, "10.0.0.2:6379")
    assert second.acquire().epoch == 2
    assert current_claim(store).address == "10.0.0.2:6379"
    second.release()


def test_a_restarted_coordinator_waits_for_its_old_life_to_let_go(tmp_path):
    import threading

    store = LocalDirObjectStore(tmp_path / "s")
    old = StoreOwner(store, "10.0.0.1:6379")
    old.acquire()
    # Ray restarts the coordinator while the old process is still exiting
    threading.Timer(0.5, old.release).start()
    assert StoreOwner(store, "10.0.0.1:6379").acquire().epoch == 2


def test_an_acquire_retried_after_a_store_failure_keeps_its_own_lock(tmp_path):
    from raydelay.errors import StorageError
    from raydelay.storage import FaultyObjectStore

    store = FaultyObjectStore(LocalDirObjectStore(tmp_path / "s"))
    owner_ = StoreOwner(store, "10.0.0.1:6379")
    store.fail_next("put")  # the claim's write fails once (an outage), after the lock
    with pytest.raises(StorageError):
        owner_.acquire()
    assert owner_.acquire().epoch == 1  # the retry does not wait on its own lock
    with pytest.raises(StoreOwned):
        StoreOwner(store, "10.0.0.2:6379").acquire()
    owner_.release()


def test_a_sigkilled_owner_process_frees_a_local_store_at_once(tmp_path):
    root = tmp_path / "s"
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from raydelay.cluster.owner import StoreOwner
        from raydelay.storage import LocalDirObjectStore
        StoreOwner(LocalDirObjectStore({str(root)!r}), "10.0.0.9:1").acquire()
        print("owned", flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "owned"
        store = LocalDirObjectStore(root)
        with pytest.raises(StoreOwned, match="10.0.0.9:1"):
            StoreOwner(store, "10.0.0.3:1").acquire()
    finally:
        child.kill()
        child.wait()
    assert StoreOwner(store, "10.0.0.3:1").acquire().epoch == 2


def test_other_stores_use_a_renewed_lease(monkeypatch):
    store = MemoryObjectStore()
    clock = [1_000_000]
    monkeypatch.setattr(owner, "_now_ms", lambda: clock[0])
    monkeypatch.setattr(StoreOwner, "_renewer", lambda self: None)  # renewals by hand here
    first = StoreOwner(store, "a:1", lease_s=30)
    first.acquire()
    clock[0] += 20_000
    with pytest.raises(StoreOwned, match="a:1"):
        StoreOwner(store, "b:1", lease_s=30).acquire()
    first._renew()
    clock[0] += 29_000  # renewed 29 s ago: still held
    with pytest.raises(StoreOwned):
        StoreOwner(store, "b:1", lease_s=30).acquire()
    # the same Ray cluster (a restarted coordinator) takes over its own claim at once
    again = StoreOwner(store, "a:1", lease_s=30)
    assert again.acquire().epoch == 2
    # a lease not renewed for lease_s lapses, and the old holder learns it lost the store
    clock[0] += 31_000
    third = StoreOwner(store, "b:1", lease_s=30)
    assert third.acquire().epoch == 3
    again._renew()
    with pytest.raises(StoreOwned, match="taken over by .*b:1"):
        again.check()
    assert json.loads(store.get("meta/owner/00000000000000000003"))["address"] == "b:1"
    assert store.list("meta/owner/") == [
        "meta/owner/00000000000000000002",
        "meta/owner/00000000000000000003",
    ]


def test_a_store_that_cannot_work_fails_at_once_naming_its_config_keys(s3_endpoint, tmp_path):
    from raydelay.client.bootstrap import _store_claim
    from raydelay.config import config_from_dict
    from raydelay.errors import StorageError

    missing = config_from_dict(
        {"storage": {"kind": "s3", "s3": {"bucket": "no-such-bucket", "endpoint_url": s3_endpoint}}}
    )
    with pytest.raises(
        StorageError, match=r"storage \(storage.s3.bucket = 'no-such-bucket'.*NoSuchBucket"
    ) as err:
        _store_claim(missing)
    assert not err.value.retriable and "\n" not in str(err.value)
    (tmp_path / "a-file").write_text("not a directory")
    local = config_from_dict(
        {"storage": {"kind": "local", "local": {"root": str(tmp_path / "a-file" / "x")}}}
    )
    with pytest.raises(StorageError, match=r"storage \(storage.local.root = .*a-file/x'\)"):
        _store_claim(local)


def test_an_unreachable_address_says_whether_anything_listens_there():
    import socket

    from raydelay.client.bootstrap import _unreachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        refused = _unreachable(f"127.0.0.1:{port}", ConnectionError("timed out"))
    assert "answers at" in refused and "RAY_AUTH_TOKEN" in refused and "RAY_AUTH_MODE" in refused
    nothing = _unreachable(f"127.0.0.1:{port}", ConnectionError("timed out"))
    assert nothing.startswith(f"address: no Ray cluster is running at '127.0.0.1:{port}'")


def test_down_stops_only_the_processes_of_the_ray_session_up_started():
    from raydelay.cluster.local import _stop_session as _stop_ray_session

    session = "session_2026-11-23_00-00-00_000000_424242"
    ours = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--session-dir=/tmp/ray/{session}"]
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--session-dir=/tmp/ray/session_x"]
    )
    try:
        assert _stop_ray_session(session) == 1
        assert ours.wait(timeout=15) is not None
        assert other.poll() is None  # another Ray's process is left alone
        assert _stop_ray_session("not-a-session") == 0
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_import_sends_rays_token_when_the_user_has_one_and_chose_no_mode(monkeypatch, tmp_path):
    import os

    from raydelay._auth import send_token_by_default

    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert not send_token_by_default()  # no token: nothing to send
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 64)
    assert send_token_by_default() and os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's choice stands
    assert not send_token_by_default() and os.environ["RAY_AUTH_MODE"] == "disabled"
