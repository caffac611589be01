"""The key index of one partition's log: which keyed messages are still scheduled (pure:
no Ray).

A message sent with a key and a ``deliver_at`` in the future is *pending* under its key
until it falls due (or is cancelled). The index answers "which positions may hold a
pending message with this key?" without a dict of every key: each entry is 16 bytes in
two sorted numpy columns,

- ``packed``: the key's 32-bit fingerprint (a hash of its UTF-8 bytes, computed over a
  whole key column at once: :func:`fingerprints`) in the high half and the second it
  falls due (``deliver_at_ms // 1000``) in the low half, sorted;
- ``pos``: the position key of the message.

A fingerprint is only a hint: two keys can share one. The caller reads the rows at the
candidate positions and compares their keys and ``deliver_at`` (the host does, see
``raydelay.actors.partition.keyed``), so a collision costs a read, never a wrong answer.
New entries go into two small sorted columns of their own, which merge into the big ones
once they hold ``MERGE_AT`` entries (so a commit never copies the big ones). Cancelled
positions are kept in a roaring bitmap until the next compaction drops them with the
entries that fell due.

The index is a function of the log alone: :meth:`KeyIndex.observe` takes each committed
object (its keyed delayed entries, and the targets of its cancel markers). So it is
durable the way the dedup table is (``raydelay.log.dedup``): at each ledger roll the
changes since the last cut are written as a *delta* under ``topics/<t>/<p>/keys/``; now and
then the whole index is written as a *base* and the deltas before it go. A restarted log
loads the newest base, the deltas after it, and observes the objects of the ledgers past
the last one written (:meth:`KeyStore.load`). Retention keeps every ledger past that point
(:attr:`KeyIndex.persisted_through`).

Format (msgpack, version 1): ``{"v", "kind": "base"|"delta", "through": position key,
"packed": <u8 bytes>, "pos": <i8 bytes>, "gone": roaring bytes}``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from raydelay.errors import CodecError, InvalidArgument, NotFound
from raydelay.log.entries import NO_CANCEL, LedgerObject
from raydelay.positions import SHIFT, key_of
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import validate_name

log = logging.getLogger(__name__)

KEYS_VERSION = 1
MERGE_AT = 1 << 18  # new entries held in small columns of their own before they merge
BASE_AFTER_DELTAS = 64  # a base is written once this many deltas pile up ...
_U32 = (1 << 32) - 1
_U8 = np.dtype("<u8")
_I8 = np.dtype("<i8")


# what a keyed send scheduled for later does about a message pending under its key
# ("allow": nothing, the key only routes: the messages of one key are not one identity)
ON_DUPLICATE = ("ignore", "replace", "error", "allow")


def check_on_duplicate(value: object) -> str:
    """``on_duplicate`` checked: one of :data:`ON_DUPLICATE`."""
    if not isinstance(value, str) or value not in ON_DUPLICATE:
        raise InvalidArgument(
            f"on_duplicate: expected one of {', '.join(ON_DUPLICATE)}, got {value!r}"
        )
    return value


_MUL = np.uint64(0x9E3779B97F4A7C15)  # the fingerprint's multiplier (odd; 2**64 / golden ratio)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_POWERS = np.ones(1, dtype=np.uint64)  # _MUL ** i (mod 2**64), grown as longer keys come


def _powers(n: int) -> np.ndarray:
    global _POWERS
    if len(_POWERS) < n:
        grown = np.empty(max(n, 2 * len(_POWERS)), dtype=np.uint64)
        grown[0] = 1
        with np.errstate(over="ignore"):
            for i in range(1, len(grown)):
                grown[i] = grown[i - 1] * _MUL
        _POWERS = grown
    return _POWERS


def fingerprints(keys: pa.Array) -> np.ndarray:
    """The 32-bit fingerprints (uint64 values < 2**32) of a string column without nulls,
    computed over its UTF-8 bytes as columns, with no Python call per key: a polynomial
    hash of the bytes (mod 2**64), mixed with the length. A hint: keys can share one."""
    keys = keys.cast(pa.string()) if keys.type != pa.string() else keys
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * keys.offset)
    lo, hi = int(offsets[0]), int(offsets[-1])
    body = keys.buffers()[2]  # (None when every key is empty)
    data = (
        np.frombuffer(body, dtype=np.uint8)[lo:hi].astype(np.uint64)
        if body
        else np.zeros(0, np.uint64)
    )
    lengths = np.diff(offsets).astype(np.int64)
    starts = offsets[:-1].astype(np.int64) - lo
    h = np.zeros(n, dtype=np.uint64)
    if hi > lo:
        at = np.arange(hi - lo, dtype=np.int64) - np.repeat(starts, lengths)
        with np.errstate(over="ignore"):
            terms = (data + np.uint64(1)) * _powers(int(lengths.max()))[at]
            nonempty = lengths > 0
            h[nonempty] = np.add.reduceat(terms, starts[nonempty])
    with np.errstate(over="ignore"):
        h ^= lengths.astype(np.uint64) * _MUL
        h ^= h >> np.uint64(31)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return h >> np.uint64(32)


_M64 = (1 << 64) - 1


def fingerprint(key: str) -> int:
    """The fingerprint of one key: what :func:`fingerprints` gives it in a column, in
    Python's own integers (cheaper than the columns for one key)."""
    data = key.encode("utf-8")
    mul = int(_MUL)
    h, power = 0, 1
    for byte in data:
        h = (h + (byte + 1) * power) & _M64
        power = (power * mul) & _M64
    h ^= (len(data) * mul) & _M64
    h ^= h >> 31
    h = (h * int(_MIX)) & _M64
    h ^= h >> 29
    return h >> 32


def due_second(deliver_at_ms: int) -> int:
    """The second a message falls due, as the index holds it (0 .. 2**32 - 1)."""
    return min(max(int(deliver_at_ms) // 1000, 0), _U32)


def keys_prefix(topic: str, partition: int) -> str:
    validate_name("topic", topic)
    return f"topics/{topic}/{partition}/keys/"


class KeyIndex:
    """The pending keyed messages of one partition (see the module docstring). Thread-safe:
    the log's thread observes, the host's event loop looks up."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._packed = np.zeros(0, dtype=_U8)
        self._pos = np.zeros(0, dtype=_I8)
        # the newest entries, in two small sorted columns of their own (merged into the big
        # ones past MERGE_AT, so that a commit never copies the big ones)
        self._rpacked = np.zeros(0, dtype=_U8)
        self._rpos = np.zeros(0, dtype=_I8)
        self._gone = BitMap64()  # cancelled positions (dropped at the next compaction)
        # changes since the last cut, for the next delta
        self._delta: list[tuple[np.ndarray, np.ndarray]] = []
        self._delta_gone = BitMap64()
        self.through = -1  # the last position key observed (or loaded)
        self.persisted_through = -1  # the last position key written to the store
        self.deltas_since_base = 0
        self.delta_bytes_since_base = 0
        self.base_bytes = 0

    # --- taking in the log ---------------------------------------------------------------

    def observe(self, obj: LedgerObject, after: int = -1) -> int:
        """Take in a committed object's entries at positions after ``after`` (a position
        key): its keyed entries that were delayed when committed, and its cancel markers'
        targets. Returns the keyed entries added."""
        entries = obj.entries
        n = len(entries)
        if n == 0:
            return 0
        first = key_of(obj.ledger_id, obj.first_entry)
        skip = max(0, after - first + 1)
        if skip >= n:
            return 0
        targets = entries.cancel_targets[skip:]
        keys_col = entries.batch.column(2).slice(skip)
        deliver = entries.deliver_at_ms[skip:]
        which = np.zeros(0, dtype=np.int64)
        if keys_col.null_count < len(keys_col):
            valid = np.asarray(pc.is_valid(keys_col).to_numpy(zero_copy_only=False))
            which = np.flatnonzero(valid & (deliver > obj.publish_time_ms) & (targets == NO_CANCEL))
        packed = pos = None
        if len(which):
            fps = fingerprints(keys_col.take(pa.array(which)))
            due = np.clip(deliver[which] // 1000, 0, _U32).astype(_U8)
            packed = (fps << np.uint64(32)) | due
            pos = (first + skip + which).astype(_I8)
        marked = targets[targets != NO_CANCEL].astype(np.uint64)
        with self.lock:
            if len(marked):
                self._gone.update(marked)
                self._delta_gone.update(marked)
            if packed is not None and pos is not None:
                self._rpacked, self._rpos = _merged(self._rpacked, self._rpos, packed, pos)
                self._delta.append((packed, pos))
            self.through = max(self.through, first + n - 1)
            if len(self._rpacked) >= MERGE_AT:
                self._merge()
        return len(which)

    def merge(self) -> None:
        """Move the recent entries into the big columns."""
        with self.lock:
            self._merge()

    def _merge(self) -> None:
        if len(self._rpacked):
            self._packed, self._pos = _merged(self._packed, self._pos, self._rpacked, self._rpos)
            self._rpacked, self._rpos = np.zeros(0, dtype=_U8), np.zeros(0, dtype=_I8)

    def _insert(self, packed: np.ndarray, pos: np.ndarray) -> None:
        self._packed, self._pos = _merged(self._packed, self._pos, packed, pos)

    # --- looking up --------------------------------------------------------------------

    def candidates(self, key: str, now_ms: int) -> list[int]:
        """The positions that may hold a message with ``key`` still pending at ``now_ms``
        (ascending; the caller checks the rows)."""
        return self.candidates_of([key], now_ms)[key]

    def candidates_of(self, keys: list[str], now_ms: int) -> dict[str, list[int]]:
        """:meth:`candidates` of many keys at once (their fingerprints as one column)."""
        if len(keys) <= 16:  # (a few keys: Python's integers beat building a column)
            fps = [fingerprint(k) for k in keys]
        else:
            fps = fingerprints(pa.array(keys, type=pa.string())).tolist()
        floor = int(now_ms) // 1000
        out: dict[str, list[int]] = {}
        with self.lock:
            for key, fp in zip(keys, fps, strict=True):
                found: list[int] = []
                for packed, pos in ((self._packed, self._pos), (self._rpacked, self._rpos)):
                    lo = int(np.searchsorted(packed, np.uint64(fp << 32)))
                    hi = int(np.searchsorted(packed, np.uint64((fp << 32) | _U32), side="right"))
                    if hi > lo:
                        due = packed[lo:hi] & np.uint64(_U32)
                        found += pos[lo:hi][due >= np.uint64(floor)].tolist()
                gone = self._gone
                out[key] = sorted(p for p in found if p not in gone)
        return out

    def __len__(self) -> int:
        """Entries held, cancelled and fallen-due ones included until the next compaction."""
        return len(self._packed) + len(self._rpacked)

    def nbytes(self) -> int:
        """Memory held: the columns, the changes not cut into a delta yet, and the bitmap
        of cancelled positions."""
        pending = sum(a.nbytes + b.nbytes for a, b in self._delta)
        gone = 8 * len(self._gone)  # (at most: roaring packs runs much tighter)
        columns = self._packed.nbytes + self._pos.nbytes + self._rpacked.nbytes + self._rpos.nbytes
        return int(columns) + pending + gone

    def compact(self, now_ms: int) -> None:
        """Drop the entries that fell due before ``now_ms`` and the cancelled ones."""
        with self.lock:
            self._merge()
            floor = int(now_ms) // 1000
            keep = (self._packed & np.uint64(_U32)) >= np.uint64(floor)
            if len(self._gone):
                gone = np.fromiter(self._gone, dtype=np.uint64, count=len(self._gone))
                keep &= ~np.isin(self._pos.astype(np.uint64), gone)
            self._packed, self._pos = self._packed[keep], self._pos[keep]
            self._gone = BitMap64()

    # --- deltas and bases ---------------------------------------------------------------

    def take_delta(self) -> bytes:
        """The changes since the last cut, encoded (and forgotten here)."""
        with self.lock:
            packed = np.concatenate([a for a, _ in self._delta] or [np.zeros(0, dtype=_U8)])
            pos = np.concatenate([b for _, b in self._delta] or [np.zeros(0, dtype=_I8)])
            data = encode_keys("delta", self.through, packed, pos, self._delta_gone)
            self._delta = []
            self._delta_gone = BitMap64()
            return data

    def restore_delta(self, data: bytes) -> None:
        """Put a cut delta back (its write failed): the next cut carries it too."""
        d = decode_keys(data)
        with self.lock:
            self._delta.insert(0, (d["packed"], d["pos"]))
            self._delta_gone |= d["gone"]

    def base(self, now_ms: int) -> bytes:
        """The whole index, compacted, encoded."""
        self.compact(now_ms)
        with self.lock:
            return encode_keys("base", self.through, self._packed, self._pos, BitMap64())

    def apply(self, data: bytes) -> int:
        """Take in a base or a delta read back from the store; returns its ``through``."""
        d = decode_keys(data)
        with self.lock:
            if len(d["packed"]):
                self._rpacked, self._rpos = _merged(
                    self._rpacked, self._rpos, d["packed"], d["pos"]
                )
                if len(self._rpacked) >= MERGE_AT:
                    self._merge()
            self._gone |= d["gone"]
            self.through = max(self.through, d["through"])
        return d["through"]


def _merged(
    packed: np.ndarray, pos: np.ndarray, more_packed: np.ndarray, more_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted columns with ``more`` put in (sorted first): one pass, new arrays."""
    order = np.argsort(more_packed, kind="stable")
    more_packed, more_pos = more_packed[order], more_pos[order]
    at = np.searchsorted(packed, more_packed)
    return np.insert(packed, at, more_packed), np.insert(pos, at, more_pos)


def encode_keys(
    kind: str, through: int, packed: np.ndarray, pos: np.ndarray, gone: BitMap64
) -> bytes:
    return msgpack.packb(
        {
            "v": KEYS_VERSION,
            "kind": kind,
            "through": int(through),
            "packed": packed.astype(_U8, copy=False).tobytes(),
            "pos": pos.astype(_I8, copy=False).tobytes(),
            "gone": gone.serialize(),
        },
        use_bin_type=True,
    )


def decode_keys(data: bytes) -> dict:
    try:
        raw = msgpack.unpackb(data, raw=False)
        if raw.get("v") != KEYS_VERSION:
            raise CodecError(f"key index: unknown version {raw.get('v')!r}")
        packed = np.frombuffer(raw["packed"], dtype=_U8).copy()
        pos = np.frombuffer(raw["pos"], dtype=_I8).copy()
        if len(packed) != len(pos):
            raise CodecError("key index: columns of different lengths")
        return {
            "kind": raw["kind"],
            "through": int(raw["through"]),
            "packed": packed,
            "pos": pos,
            "gone": BitMap64.deserialize(raw["gone"]),
        }
    except CodecError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed object is a codec error
        raise CodecError(f"key index: cannot decode ({exc})") from exc


def _object_key(prefix: str, through: int, kind: str) -> str:
    return f"{prefix}{max(through, 0):020d}.{kind}"


class KeyStore:
    """Where one partition's key index lives in the store (see the module docstring)."""

    def __init__(self, store: ObjectStore, topic: str, partition: int) -> None:
        self._store = store
        self._prefix = keys_prefix(topic, partition)

    def load(self, index: KeyIndex) -> int:
        """Take the newest base and the deltas after it into ``index``; returns the
        position key they cover through (-1: nothing written yet)."""
        listed = self._store.list(self._prefix)
        named = sorted(
            (int(k[len(self._prefix) :].split(".")[0]), k.rsplit(".", 1)[1], k) for k in listed
        )
        bases = [x for x in named if x[1] == "base"]
        start = bases[-1][0] if bases else -1
        through = -1
        for at, kind, key in named:
            if (kind == "base" and at == start) or (kind == "delta" and at > start):
                try:
                    through = max(through, index.apply(self._store.get(key)))
                except NotFound:  # (a compaction removed it meanwhile)
                    continue
        index.persisted_through = through
        return through

    def cut(self, index: KeyIndex, now_ms: int) -> None:
        """Write the changes since the last cut as a delta, and a base in place of the
        deltas when they have grown past the base (or past BASE_AFTER_DELTAS of them).
        A write that fails leaves the changes for the next cut."""
        through = index.through
        if through <= index.persisted_through:
            return
        data = index.take_delta()
        try:
            self._store.put(_object_key(self._prefix, through, "delta"), data)
        except Exception:
            index.restore_delta(data)
            raise
        index.persisted_through = through
        index.deltas_since_base += 1
        index.delta_bytes_since_base += len(data)
        if index.deltas_since_base >= BASE_AFTER_DELTAS or index.delta_bytes_since_base > max(
            index.base_bytes, 1 << 20
        ):
            self.write_base(index, now_ms)

    def write_base(self, index: KeyIndex, now_ms: int) -> None:
        """Write the whole index as a base, then delete the objects it replaces."""
        through = index.persisted_through
        data = index.base(now_ms)
        key = _object_key(self._prefix, through, "base")
        self._store.put(key, data)
        index.base_bytes = len(data)
        index.deltas_since_base = 0
        index.delta_bytes_since_base = 0
        for old in self._store.list(self._prefix):
            if old != key and int(old[len(self._prefix) :].split(".")[0]) <= through:
                self._store.delete(old)


def ledger_through(index: KeyIndex) -> int:
    """The last ledger whose keyed entries the store holds (-1: none): retention deletes
    no ledger after it."""
    return index.persisted_through >> SHIFT if index.persisted_through >= 0 else -1


def observe_all(index: KeyIndex, objects: Iterable[LedgerObject], after: int) -> int:
    """Observe objects (recovery), each from after ``after``; returns keyed entries added."""
    return sum(index.observe(obj, after) for obj in objects)
