import os

import numpy as np
import pytest
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.errors import InvalidArgument
from raydelay.positions import (
    KEY_DTYPE,
    LOW,
    MAX_LEDGER_ID,
    key_of,
    position_in_range,
    position_keys,
    position_of,
    split_keys,
)
from raydelay.storage import LocalDirObjectStore, MemoryObjectStore, validate_key, validate_name
from raydelay.storage.keys import (
    cursor_key,
    ledger_entries_key,
    subscription_prefix,
)

BAD_KEYS = [
    ("", "may not be empty"),
    ("/etc/passwd", "absolute"),
    ("../escape", "'..' segment"),
    ("a/../../escape", "'..' segment"),
    ("a/./b", "'.' segment"),
    ("a//b", "empty segment"),
    ("a/b/", "empty segment"),
    ("a\\..\\b", "backslash"),
    ("a\x00b", "NUL"),
]


@pytest.mark.parametrize("key,reason", BAD_KEYS)
def test_bad_keys_are_invalid_arguments(key, reason):
    with pytest.raises(InvalidArgument, match=reason):
        validate_key(key)


def test_non_string_key_is_rejected():
    with pytest.raises(InvalidArgument, match="expected a str"):
        validate_key(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key", ["a", "topics/orders/0/ledgers/x.entries", "meta/journal/0001", "a-b_c.d/e"]
)
def test_good_keys_pass(key):
    assert validate_key(key) == key


@pytest.mark.parametrize("name", ["orders", "a.b-c_D9", "x" * 128])
def test_good_names(name):
    assert validate_name("topic", name) == name


@pytest.mark.parametrize("name", ["", "x" * 129, "a/b", "a b", "ü", "..", ".", "a\x00"])
def test_bad_names_name_the_field(name):
    with pytest.raises(InvalidArgument, match="^topic: "):
        validate_name("topic", name)


def test_layout_keys_follow_the_design():
    assert ledger_entries_key("orders", 3, 7, 100) == (
        "topics/orders/3/ledgers/00000000000000000007/00000000000000000100.entries"
    )
    assert (
        cursor_key("orders", 0, "billing", 5) == "subs/orders/0/billing/cursor/00000000000000000005"
    )
    assert subscription_prefix("orders", 1, "b") == "subs/orders/1/b"
    with pytest.raises(InvalidArgument, match="topic"):
        ledger_entries_key("../x", 0, 1, 0)
    with pytest.raises(InvalidArgument, match="partition"):
        subscription_prefix("orders", -1, "b")


@pytest.mark.parametrize("make", [MemoryObjectStore, None], ids=["memory", "local"])
@pytest.mark.parametrize("key,reason", BAD_KEYS)
def test_every_store_op_rejects_bad_keys(tmp_path, make, key, reason):
    store = make() if make else LocalDirObjectStore(tmp_path / "root")
    for op in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.get_range(key, 0, 1),
        lambda: store.delete(key),
        lambda: store.exists(key),
    ):
        with pytest.raises(InvalidArgument):
            op()


def test_local_store_never_writes_outside_its_root(tmp_path):
    root = tmp_path / "root"
    store = LocalDirObjectStore(root)
    for key in ("../outside", "a/../../outside", "/tmp/outside"):
        with pytest.raises(InvalidArgument):
            store.put(key, b"x")
    assert sorted(os.listdir(tmp_path)) == ["root"]


def test_local_store_refuses_a_symlink_that_leads_out_of_the_root(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s3cr3t")
    store = LocalDirObjectStore(root)
    os.symlink(outside, root / "link")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.put("link/evil", b"x")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.get("link/secret")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.get_range("link/secret", 0, 3)
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.delete("link/secret")
    assert store.list("") == []  # listing does not follow the link either
    assert not (outside / "evil").exists()
    assert (outside / "secret").read_bytes() == b"s3cr3t"


def test_local_store_refuses_a_symlinked_file_leading_out(tmp_path):
    root = tmp_path / "root"
    (tmp_path / "target").write_bytes(b"t")
    store = LocalDirObjectStore(root)
    os.symlink(tmp_path / "target", root / "f")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.get("f")
    with pytest.raises(InvalidArgument, match="outside the store root"):
        store.get_range("f", 0, 1)
    # while a symlink that stays inside the root reads through
    store.put("real", b"inside")
    os.symlink(root / "real", root / "alias")
    assert store.get("alias") == b"inside" and store.get_range("alias", 1, 3) == b"ns"


EDGE_POSITIONS = [
    (0, 0),
    (0, 1),
    (0, LOW),
    (1, 0),
    (1, LOW),
    (2**31 - 2, 7),
    (MAX_LEDGER_ID, 0),
    (MAX_LEDGER_ID, LOW),
]


@pytest.mark.parametrize("position", EDGE_POSITIONS)
def test_a_position_key_round_trips_on_edge_values(position):
    key = key_of(*position)
    assert 0 <= key <= np.iinfo(KEY_DTYPE).max
    assert position_of(key) == position
    assert position_in_range(*position)


def test_the_key_column_matches_the_scalar_key_and_round_trips_through_a_bitmap():
    # Given the edge positions as columns
    ls = np.array([p[0] for p in EDGE_POSITIONS])
    es = np.array([p[1] for p in EDGE_POSITIONS], dtype=np.uint32)
    # When they become a key column
    keys = position_keys(ls, es)
    # Then it has the one dtype, the scalar keys, and order by position
    assert keys.dtype == KEY_DTYPE
    assert keys.tolist() == [key_of(*p) for p in EDGE_POSITIONS]
    assert keys.tolist() == sorted(keys.tolist())
    back_l, back_e = split_keys(keys)
    assert list(zip(back_l.tolist(), back_e.tolist(), strict=True)) == EDGE_POSITIONS
    # and a 64-bit bitmap gives back the same keys in the same dtype
    values = bitmap64_values(bitmap64_of(keys))
    assert values.dtype == KEY_DTYPE and values.tolist() == keys.tolist()
    assert max(BitMap64(values.astype(np.uint64))) == key_of(MAX_LEDGER_ID, LOW)


def test_a_bitmap_of_keys_holds_exactly_the_keys_whether_they_come_in_runs_or_not():
    rng = np.random.default_rng(7)
    ledger = np.int64(5) << 32
    cases = [
        ledger + np.arange(10_000, dtype=np.int64),  # one run: added as a range
        # runs of several ledgers, in any order, one of them at the top of its ledger
        np.concatenate([key_of(9, LOW - 40) + np.arange(41), ledger + np.arange(3, 900)]),
        np.concatenate([ledger + np.arange(100), ledger + np.arange(50, 150)]),  # overlap
        np.sort(rng.integers(0, 1 << 40, 5_000)),  # scattered: key by key
        ledger + np.arange(100)[::-1],  # descending: not runs
        np.array([key_of(MAX_LEDGER_ID, LOW - 31) + i for i in range(32)]),  # the last keys
        np.array([3, 9, 10]),
        np.zeros(0, dtype=np.int64),
    ]
    for keys in cases:
        bm = bitmap64_of(keys)
        assert bm == BitMap64(int(k) for k in keys)
        assert bitmap64_values(bm).tolist() == sorted(set(keys.tolist()))


@pytest.mark.parametrize(
    "ledger_id,entry_id",
    [(-1, 0), (0, -1), (MAX_LEDGER_ID + 1, 0), (0, LOW + 1), (1.0, 0), ("1", 0)],
)
def test_a_position_outside_the_key_is_out_of_range(ledger_id, entry_id):
    assert not position_in_range(ledger_id, entry_id)
