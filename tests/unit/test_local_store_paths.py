"""The local-dir store's path safety and its checked directories: a key never writes or
reads outside the root, through a symlinked directory or at a symlinked name, and a
directory pruned after it was checked is made again."""

from __future__ import annotations

import os

import pytest

from raydelay.errors import InvalidArgument, NotFound
from raydelay.storage import LocalDirObjectStore


@pytest.fixture
def layout(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    return LocalDirObjectStore(root), root, outside


def test_a_key_through_a_symlinked_directory_is_refused_and_writes_nothing_outside(layout):
    store, root, outside = layout
    os.symlink(outside, root / "escape")
    for write in (store.put, store.put_new):
        with pytest.raises(InvalidArgument, match="outside the store root"):
            write("escape/x", b"data")
    assert list(outside.iterdir()) == []
    (outside / "x").write_bytes(b"secret")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.get("escape/x")


def test_a_symlink_at_the_keys_own_name_is_replaced_or_refused_never_written_through(layout):
    store, root, outside = layout
    target = outside / "victim"
    target.write_bytes(b"keep me")
    store.put("d/seed", b"s")  # (the directory is checked once, here)
    os.symlink(target, root / "d" / "k")
    with pytest.raises(Exception):  # noqa: B017 - a conflict: another object is at the key
        store.put_new("d/k", b"new")
    assert target.read_bytes() == b"keep me"
    store.put("d/k", b"new")  # replaces the link itself
    assert target.read_bytes() == b"keep me"
    assert not (root / "d" / "k").is_symlink() and store.get("d/k") == b"new"


def test_a_directory_pruned_after_it_was_checked_is_made_again(layout):
    store, root, _ = layout
    store.put_new("a/b/one", b"1")
    store.delete("a/b/one")  # the last object: its directories are pruned
    assert not (root / "a").exists()
    store.put_new("a/b/two", b"2")  # the cache still names a/b: made again, not an error
    assert store.get("a/b/two") == b"2"
    with pytest.raises(NotFound):
        store.get("a/b/one")
