"""The partition log's two wire formats: an append batch and a ledger object.

- An **append batch** is what a producer sends to a partition in one call: its
  name, a ``sequence_id`` (for dedup), and columns of messages. Cancel markers
  travel in the same shape with ``cancels`` set.
- A **ledger object** (``topics/<t>/<p>/ledgers/<ledger>/<first_entry>.entries``)
  holds the entries of one group commit: ``n`` consecutive entries of one ledger,
  the publish time, the columns, and the dedup records of the batches it ends.

An append batch is a versioned msgpack map. A ledger object has a binary prefix and
an offset table before its msgpack header, so that a reader can fetch single entries
with ranged reads (see encode_object). ``deliver_at`` is an int64 column stored as
raw little-endian bytes; -1 marks an immediate message or a cancel marker. A decode
failure raises CodecError naming what was decoded, with the cause chained.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cached_property

import msgpack
import numpy as np

from raydelay.errors import CodecError, InvalidArgument

FORMAT_VERSION = 1
NO_DELAY = -1  # deliver_at of an immediate message or a cancel marker
I64 = np.dtype("<i8")
OBJECT_MAGIC = b"RDL\x02"  # ledger object format 2
_PREFIX = struct.Struct("<4sIII")
_U32 = np.dtype("<u4")
_MAX_BODY = 2**32 - 1
INDEX_PROBE_BYTES = 64 * 1024  # a first ranged read that holds most objects' whole index


@dataclass
class Entries:
    """A column block of log entries (an append batch, or a decoded ledger object).

    ``cancels`` maps an index within the block to the (ledger, entry) it cancels;
    those entries are control markers with an empty payload, never delivered.
    """

    payloads: list[bytes]
    deliver_at_ms: np.ndarray  # int64, NO_DELAY for immediate
    keys: list[str | None] | None = None
    properties: list[dict[str, str] | None] | None = None
    cancels: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.payloads)

    def nbytes(self) -> int:
        return sum(map(len, self.payloads)) + 8 * len(self.payloads)

    def key(self, i: int) -> str | None:
        return None if self.keys is None else self.keys[i]

    def props(self, i: int) -> dict[str, str] | None:
        return None if self.properties is None else self.properties[i]

    def take(self, index: np.ndarray | list[int]) -> Entries:
        """The sub-block at ``index`` (positions within this block), in that order."""
        idx = [int(i) for i in index]
        where = {old: new for new, old in enumerate(idx)}
        return Entries(
            payloads=[self.payloads[i] for i in idx],
            deliver_at_ms=self.deliver_at_ms[np.asarray(idx, dtype=np.int64)],
            keys=None if self.keys is None else [self.keys[i] for i in idx],
            properties=None if self.properties is None else [self.properties[i] for i in idx],
            cancels={where[i]: t for i, t in self.cancels.items() if i in where},
        )


@dataclass(frozen=True)
class AppendBatch:
    """One producer call to one partition. ``producer`` may be "" (no dedup)."""

    producer: str
    sequence_id: int
    entries: Entries


@dataclass(frozen=True)
class LedgerObject:
    """A decoded ledger object: entries ``first_entry .. first_entry + n - 1`` of ``ledger_id``."""

    ledger_id: int
    first_entry: int
    publish_time_ms: int
    entries: Entries
    dedup: dict[str, tuple[int, list[tuple[int, int, int]]]]  # producer -> (seq, ranges)

    @property
    def count(self) -> int:
        return len(self.entries)


def _columns(entries: Entries) -> dict:
    return {
        "p": entries.payloads,
        "d": np.ascontiguousarray(entries.deliver_at_ms, dtype=I64).tobytes(),
        "k": entries.keys,
        "pr": entries.properties,
        "c": [[i, t[0], t[1]] for i, t in sorted(entries.cancels.items())] or None,
    }


def _entries_from(raw: dict, what: str) -> Entries:
    payloads = raw["p"]
    d = np.frombuffer(raw["d"], dtype=I64)
    if len(d) != len(payloads):
        raise CodecError(f"{what}: {len(payloads)} payloads but {len(d)} deliver_at values")
    for name in ("k", "pr"):
        if raw[name] is not None and len(raw[name]) != len(payloads):
            raise CodecError(f"{what}: column {name!r} has the wrong length")
    cancels = {int(i): (int(tl), int(te)) for i, tl, te in raw["c"] or ()}
    return Entries(payloads, d, raw["k"], raw["pr"], cancels)


def encode_batch(batch: AppendBatch) -> bytes:
    return msgpack.packb(
        {"v": FORMAT_VERSION, "producer": batch.producer, "seq": batch.sequence_id}
        | _columns(batch.entries),
        use_bin_type=True,
    )


def decode_batch(data: bytes) -> AppendBatch:
    """Decode and check an append batch from a caller (never trusted)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"batch: expected bytes, got {type(data).__name__}")
    try:
        raw = msgpack.unpackb(data, raw=False)
        if raw.get("v") != FORMAT_VERSION:
            raise CodecError(f"append batch: unknown format version {raw.get('v')!r}")
        entries = _entries_from(raw, "append batch")
        producer, seq = raw["producer"], raw["seq"]
    except (CodecError, InvalidArgument):
        raise
    except Exception as exc:
        raise InvalidArgument(f"batch: not a valid append batch ({exc})") from exc
    if not isinstance(producer, str) or not isinstance(seq, int):
        raise InvalidArgument("batch: producer must be a str and seq an int")
    if not all(isinstance(p, bytes) for p in entries.payloads):
        raise InvalidArgument("batch: every payload must be bytes")
    return AppendBatch(producer, seq, entries)


def encode_object(obj: LedgerObject) -> bytes:
    """Layout (all little-endian): the 16-byte prefix (magic ``RDL\\x02``, entry count n,
    header length, reserved 0), n + 1 uint32 payload offsets into the body, the msgpack
    header (ledger, first entry, publish time, dedup, and every column but payloads),
    then the body: the payloads back to back. A reader of a few entries fetches the
    prefix, offsets and header, then only the payload bytes it needs (see ObjectIndex)."""
    ents = obj.entries
    n = len(ents)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ents.payloads), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > _MAX_BODY:
        raise InvalidArgument(f"ledger object: {int(offsets[-1])} payload bytes, over {_MAX_BODY}")
    header = msgpack.packb(
        {
            "l": obj.ledger_id,
            "f": obj.first_entry,
            "t": obj.publish_time_ms,
            "dd": {p: [s, [list(r) for r in ranges]] for p, (s, ranges) in obj.dedup.items()},
        }
        | {k: v for k, v in _columns(ents).items() if k != "p"},
        use_bin_type=True,
    )
    return b"".join(
        [
            _PREFIX.pack(OBJECT_MAGIC, n, len(header), 0),
            offsets.astype(_U32).tobytes(),
            header,
            *ents.payloads,
        ]
    )


@dataclass(frozen=True)
class ObjectIndex:
    """Everything of a ledger object but its payloads: enough to cut out any entries."""

    ledger_id: int
    first_entry: int
    publish_time_ms: int
    count: int
    offsets: np.ndarray  # int64, n + 1 payload offsets relative to ``body_start``
    body_start: int  # byte offset of the body in the object
    columns: dict  # the header's raw columns: d, k, pr, c
    dedup: dict[str, tuple[int, list[tuple[int, int, int]]]]

    @property
    def nbytes(self) -> int:
        """Memory held, roughly: the index bytes, offsets widened to int64."""
        return self.body_start + 4 * (self.count + 1)

    @cached_property  # parsed once, not once per run cut out of the object
    def cancels(self) -> dict[int, tuple[int, int]]:
        return {int(i): (int(tl), int(te)) for i, tl, te in self.columns["c"] or ()}

    def byte_range(self, lo: int, hi: int) -> tuple[int, int]:
        """Where entries ``lo .. hi - 1`` (indexes in the object) lie in the object."""
        return self.body_start + int(self.offsets[lo]), self.body_start + int(self.offsets[hi])

    def run(self, lo: int, hi: int, body: bytes, body_at: int) -> LedgerObject:
        """Entries ``lo .. hi - 1`` as a LedgerObject of their own; ``body`` holds the object's
        bytes from offset ``body_at`` on, covering at least their payloads."""
        base = self.body_start - body_at
        o = self.offsets
        payloads = [body[base + int(o[i]) : base + int(o[i + 1])] for i in range(lo, hi)]
        c = self.columns
        d = np.frombuffer(c["d"], dtype=I64)[lo:hi]
        cancels = {i - lo: t for i, t in self.cancels.items() if lo <= i < hi}
        entries = Entries(
            payloads,
            d,
            None if c["k"] is None else c["k"][lo:hi],
            None if c["pr"] is None else c["pr"][lo:hi],
            cancels,
        )
        return LedgerObject(
            self.ledger_id, self.first_entry + lo, self.publish_time_ms, entries, {}
        )


def index_length(data: bytes, what: str = "ledger object") -> int:
    """How many leading bytes of an object its index needs (``data``: at least 16 of them)."""
    if len(data) < _PREFIX.size:
        raise CodecError(f"{what}: {len(data)} bytes is too short for a ledger object")
    magic, n, head_len, _ = _PREFIX.unpack_from(data)
    if magic != OBJECT_MAGIC:
        raise CodecError(f"{what}: unknown format (magic {magic!r})")
    return _PREFIX.size + 4 * (n + 1) + head_len


def decode_index(data: bytes, what: str = "ledger object") -> ObjectIndex:
    """The index of an object from its first ``index_length`` bytes (or more)."""
    need = index_length(data, what)
    if len(data) < need:
        raise CodecError(f"{what}: the index needs {need} bytes, got {len(data)}")
    try:
        _, n, head_len, _ = _PREFIX.unpack_from(data)
        offsets = np.frombuffer(data, dtype=_U32, count=n + 1, offset=_PREFIX.size)
        raw = msgpack.unpackb(data[need - head_len : need], raw=False)
        d = np.frombuffer(raw["d"], dtype=I64)
        if len(d) != n:
            raise CodecError(f"{what}: {n} entries but {len(d)} deliver_at values")
        for name in ("k", "pr"):
            if raw[name] is not None and len(raw[name]) != n:
                raise CodecError(f"{what}: column {name!r} has the wrong length")
        dedup = {
            p: (int(s), [(int(a), int(b), int(c)) for a, b, c in ranges])
            for p, (s, ranges) in raw["dd"].items()
        }
        columns = {k: raw[k] for k in ("d", "k", "pr", "c")}
        return ObjectIndex(
            int(raw["l"]),
            int(raw["f"]),
            int(raw["t"]),
            n,
            offsets.astype(np.int64),
            need,
            columns,
            dedup,
        )
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"{what}: cannot decode its index ({exc})") from exc


def decode_object(data: bytes, what: str = "ledger object") -> LedgerObject:
    index = decode_index(data, what)
    if len(data) < index.body_start + int(index.offsets[-1]):
        raise CodecError(f"{what}: truncated ({len(data)} bytes)")
    obj = index.run(0, index.count, data, 0)
    return LedgerObject(
        obj.ledger_id, obj.first_entry, obj.publish_time_ms, obj.entries, index.dedup
    )


def concat_entries(blocks: list[Entries]) -> Entries:
    """One block holding ``blocks`` in order (cancel indexes shifted)."""
    if len(blocks) == 1:
        return blocks[0]
    payloads: list[bytes] = []
    any_keys = any(b.keys is not None for b in blocks)
    any_props = any(b.properties is not None for b in blocks)
    keys: list[str | None] = []
    props: list[dict[str, str] | None] = []
    cancels: dict[int, tuple[int, int]] = {}
    for b in blocks:
        base = len(payloads)
        payloads.extend(b.payloads)
        if any_keys:
            keys.extend(b.keys if b.keys is not None else [None] * len(b))
        if any_props:
            props.extend(b.properties if b.properties is not None else [None] * len(b))
        cancels.update({base + i: t for i, t in b.cancels.items()})
    d = np.concatenate([b.deliver_at_ms for b in blocks]) if blocks else np.zeros(0, I64)
    return Entries(
        payloads,
        d.astype(I64, copy=False),
        keys if any_keys else None,
        props if any_props else None,
        cancels,
    )
