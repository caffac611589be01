"""The partition log's formats, all columnar (Arrow): an append batch, a ledger object, rows.

- **Entries** are a block of log entries as one Arrow record batch of
  :data:`ENTRY_SCHEMA`: payload (binary), deliver_at_ms (int64; -1 = immediate),
  key (string), properties (map<string, string>) and cancel_target (int64 position
  key ``ledger << 32 | entry`` of the message a cancel marker cancels; -1 = not a
  marker). Taking a set of entries is one Arrow ``take``, never a Python loop.
- An **append batch** is what a producer sends to a partition in one call: a small
  prefix with the format, the producer's name and its ``sequence_id`` (for dedup), then
  the entries as one Arrow IPC record-batch message (:func:`encode_batch`).
- A **ledger object** (``topics/<t>/<p>/ledgers/<ledger>/<first_entry>.entries``)
  holds the entries of one group commit: ``n`` consecutive entries of one ledger,
  their publish time, and the dedup records of the batches it ends (format 3, see
  :func:`encode_object`). Entry ids and the publish time are the decoded rows'
  columns, stored as (first entry, count) and one time per object.
- **Rows** are entries taken out of the log at scattered positions, with their
  position keys and publish times: what a point read returns.

Format 2 ledger objects (msgpack header, written before format 3) are still read.
A decode failure raises CodecError naming what was decoded, with the cause chained.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import msgpack
import numpy as np
import pyarrow as pa

from raydelay.errors import CodecError, InvalidArgument
from raydelay.positions import key_of, position_of

BATCH_MAGIC = b"RDB\x03"  # append batches, format 3 (2 was an Arrow IPC stream, 1 msgpack)
NO_DELAY = -1  # deliver_at of an immediate message or a cancel marker
NO_CANCEL = -1  # cancel_target of an entry that is not a cancel marker
I64 = np.dtype("<i8")
OBJECT_MAGIC = b"RDL\x03"  # ledger object format 3 (Arrow)
LEGACY_MAGIC = b"RDL\x02"  # format 2 (msgpack header), read only
_PREFIX = struct.Struct("<4sIII")
_BATCH_PREFIX = struct.Struct("<4sIQ")  # magic, producer name length, sequence id
_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")
MAX_BODY_BYTES = 2**31 - 1  # Arrow binary offsets are int32
INDEX_PROBE_BYTES = 64 * 1024  # a first ranged read that holds most objects' whole index

PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
ENTRY_SCHEMA = pa.schema(
    [
        ("payload", pa.binary()),
        ("deliver_at_ms", pa.int64()),
        ("key", pa.string()),
        ("properties", PROPERTIES_TYPE),
        ("cancel_target", pa.int64()),
    ]
)
META_SCHEMA = pa.schema(list(ENTRY_SCHEMA)[1:])  # every column but the payload
# Rows taken at scattered positions: the position key and publish time, then the entry.
ROWS_SCHEMA = pa.schema([("position", pa.int64()), ("publish_time_ms", pa.int64()), *ENTRY_SCHEMA])


def binary_column(payloads: list[bytes]) -> pa.Array:
    """An Arrow binary array of ``payloads`` (bytes), built from one join and one length
    column: much cheaper than converting element by element."""
    n = len(payloads)
    offsets = np.zeros(n + 1, dtype=np.int64)
    if n:
        np.cumsum(np.fromiter(map(len, payloads), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > MAX_BODY_BYTES:
        raise InvalidArgument(f"payloads: {int(offsets[-1])} bytes in one batch, over 2 GiB")
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(offsets.astype(_I32)), pa.py_buffer(b"".join(payloads))],
    )


# Columns move between numpy and Arrow through their buffers: ``pa.array(ndarray)`` and
# ``Array.toint64_values()`` import pandas on first use (a quarter of a second or more in every
# fresh actor process, a restarted one included), and these need nothing of it.


def int64_array(values: np.ndarray) -> pa.Array:
    """An Arrow int64 array over ``values`` (no copy when already contiguous int64)."""
    arr = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(arr), [None, pa.py_buffer(arr)])


def int64_values(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 column without nulls as a numpy array (a view of one chunk's buffer)."""
    if isinstance(col, pa.ChunkedArray):
        parts = [int64_values(c) for c in col.chunks]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(col) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.frombuffer(col.buffers()[1], dtype=I64, count=len(col), offset=8 * col.offset)


class Entries:
    """A column block of log entries: one Arrow record batch of :data:`ENTRY_SCHEMA`."""

    __slots__ = ("batch", "__dict__")

    def __init__(self, batch: pa.RecordBatch) -> None:
        if batch.schema != ENTRY_SCHEMA:
            batch = conform(batch, "entries")
        self.batch = batch

    @classmethod
    def build(
        cls,
        payloads: list[bytes] | pa.Array,
        deliver_at_ms: np.ndarray,
        keys: list[str | None] | pa.Array | None = None,
        properties: list[dict[str, str] | None] | pa.Array | None = None,
        cancels: dict[int, tuple[int, int]] | None = None,
    ) -> Entries:
        """Entries from Python columns (checked by the caller). ``cancels`` maps an index
        to the (ledger, entry) its marker cancels."""
        pay = payloads if isinstance(payloads, pa.Array) else binary_column(list(payloads))
        if pay.type != pa.binary():
            pay = pay.cast(pa.binary())
        n = len(pay)
        d = np.asarray(deliver_at_ms, dtype=np.int64)
        if len(d) != n:
            raise InvalidArgument(f"entries: {n} payloads but {len(d)} deliver_at values")
        if keys is None:
            k = pa.nulls(n, pa.string())
        else:
            k = keys if isinstance(keys, pa.Array) else pa.array(keys, type=pa.string())
        if properties is None:
            pr = pa.nulls(n, PROPERTIES_TYPE)
        elif isinstance(properties, pa.Array):
            pr = properties
        else:
            pr = pa.array([p or None for p in properties], type=PROPERTIES_TYPE)
        c = np.full(n, NO_CANCEL, dtype=np.int64)
        for i, (tl, te) in (cancels or {}).items():
            c[i] = key_of(int(tl), int(te))
        return cls(
            pa.RecordBatch.from_arrays(
                [pay, int64_array(d), k, pr, int64_array(c)], schema=ENTRY_SCHEMA
            )
        )

    def __len__(self) -> int:
        return self.batch.num_rows

    def nbytes(self) -> int:
        return int(self.batch.nbytes)

    # --- columns (numpy views, or Python lists where the caller wants objects) ---------

    @cached_property
    def deliver_at_ms(self) -> np.ndarray:
        return int64_values(self.batch.column(1))

    @cached_property
    def cancel_targets(self) -> np.ndarray:
        return int64_values(self.batch.column(4))

    @cached_property
    def cancels(self) -> dict[int, tuple[int, int]]:
        """index -> (ledger, entry) cancelled, for the cancel markers of this block."""
        return cancels_of(self.cancel_targets)

    def payload_lengths(self) -> np.ndarray:
        offsets = _offsets(self.batch.column(0))
        return np.diff(offsets)

    @property
    def payloads(self) -> list[bytes]:
        return self.batch.column(0).to_pylist()

    @property
    def keys(self) -> list[str | None] | None:
        col = self.batch.column(2)
        return None if col.null_count == len(col) else col.to_pylist()

    @property
    def properties(self) -> list[dict[str, str] | None] | None:
        col = self.batch.column(3)
        if col.null_count == len(col):
            return None
        return [None if p is None else dict(p) for p in col.to_pylist()]

    def key(self, i: int) -> str | None:
        return self.batch.column(2)[i].as_py()

    def props(self, i: int) -> dict[str, str] | None:
        p = self.batch.column(3)[i].as_py()
        return None if p is None else dict(p)

    def take(self, index: np.ndarray | list[int]) -> Entries:
        """The sub-block at ``index`` (positions within this block), in that order."""
        return Entries(self.batch.take(int64_array(np.asarray(index, dtype=np.int64))))

    def slice(self, lo: int, hi: int) -> Entries:
        return Entries(self.batch.slice(lo, hi - lo))

    def at(self, index: np.ndarray) -> Entries:
        """:meth:`take`, as a slice (a view, no copy) when ``index`` is a run."""
        if is_run(index):
            return self.slice(int(index[0]), int(index[0]) + len(index))
        return self.take(index)


def is_run(idx: np.ndarray) -> bool:
    """Whether ``idx`` is a run of consecutive indexes, ascending (not merely a shuffle of
    one: both ends are checked first, then every step)."""
    if not len(idx) or int(idx[-1]) - int(idx[0]) != len(idx) - 1:
        return False
    return len(idx) == 1 or bool((np.diff(idx) == 1).all())


def compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as it should leave the process: when it is a slice of larger buffers, a
    copy of just its rows. Pickling a sliced Arrow array ships its whole buffers (Arrow's
    ARROW-10739, as pyarrow 26 still does): a delivery of 10k rows sliced out of a 50k-row
    window went to the consumer as 7 MB, not 1.2 MB, and a 40k-message reply took 28 ms
    to reach it instead of a few. A batch that owns its buffers is returned as it is."""
    if batch.num_rows and batch.get_total_buffer_size() > 2 * batch.nbytes + 4096:
        return pa.concat_batches([batch])
    return batch


def cancels_of(targets: np.ndarray) -> dict[int, tuple[int, int]]:
    """index -> (ledger, entry) of the cancel markers in a cancel_target column."""
    idx = np.flatnonzero(targets != NO_CANCEL)
    return {int(i): position_of(int(targets[i])) for i in idx}


def _offsets(col: pa.Array) -> np.ndarray:
    """A binary column's n + 1 offsets (int64, relative to its data buffer)."""
    buf = col.buffers()[1]
    return np.frombuffer(buf, dtype=_I32, count=len(col) + 1, offset=4 * col.offset).astype(
        np.int64
    )


def conform(batch: pa.RecordBatch, what: str, schema: pa.Schema = ENTRY_SCHEMA) -> pa.RecordBatch:
    """``batch`` in ``schema``: columns in order, absent optional ones as nulls (-1 for
    cancel_target). Raises CodecError for a missing payload/deliver_at or a wrong type."""
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    for field in schema:
        if field.name in names:
            col = batch.column(names.index(field.name))
            if col.type != field.type:
                raise CodecError(f"{what}: column {field.name!r} is {col.type}, not {field.type}")
            if field.name in ("deliver_at_ms", "cancel_target", "payload") and col.null_count:
                raise CodecError(f"{what}: column {field.name!r} has nulls")
            arrays.append(col)
        elif field.name == "cancel_target":
            arrays.append(int64_array(np.full(n, NO_CANCEL, dtype=np.int64)))
        elif field.name in ("key", "properties"):
            arrays.append(pa.nulls(n, field.type))
        else:
            raise CodecError(f"{what}: column {field.name!r} is missing")
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
    # when a subscription's process received it (epoch ms; 0: not noted): note_arrival
    arrived_ms: int = dataclasses.field(default=0, compare=False, repr=False)

    @property
    def count(self) -> int:
        return len(self.entries)

    def publish_times(self, idx: np.ndarray) -> np.ndarray:
        return np.full(len(idx), self.publish_time_ms, dtype=np.int64)


def note_arrival(sources: Iterable[object], now_ms: int) -> None:
    """Note ``now_ms`` as the time this process received each ledger object or rows of
    ``sources`` that has none yet (a subscription's lateness stages start from it; a shared
    read's objects keep the first)."""
    for source in sources:
        if getattr(source, "arrived_ms", None) == 0:
            object.__setattr__(source, "arrived_ms", now_ms)  # (frozen: set once, here)


@dataclass(frozen=True)
class DelayedRun:
    """Stands for a ledger object every entry of which is delayed (not due when
    committed), or for consecutive ones, in a log read for a reader that takes delayed
    entries from the topic's index instead: just where they lie, and their earliest
    deliver_at."""

    ledger_id: int
    first_entry: int
    count: int
    min_deliver_at_ms: int


@dataclass(frozen=True)
class Rows:
    """Entries taken at scattered positions: ``positions`` (int64 keys, ascending) and
    their publish times, row for row with ``entries``."""

    positions: np.ndarray
    publish_time_ms: np.ndarray
    entries: Entries
    arrived_ms: int = dataclasses.field(default=0, compare=False, repr=False)  # as LedgerObject's

    def __len__(self) -> int:
        return len(self.positions)

    def publish_times(self, idx: np.ndarray) -> np.ndarray:
        return self.publish_time_ms[idx]

    def to_batch(self) -> pa.RecordBatch:
        """One record batch of ROWS_SCHEMA (what travels between actors, :func:`compact`
        first, and what a sealed segment holds)."""
        b = self.entries.batch
        return pa.RecordBatch.from_arrays(
            [int64_array(self.positions), int64_array(self.publish_time_ms), *b.columns],
            schema=ROWS_SCHEMA,
        )

    @classmethod
    def from_batch(cls, batch: pa.RecordBatch) -> Rows:
        if batch.schema != ROWS_SCHEMA:
            raise CodecError(f"rows: unexpected schema {batch.schema}")
        return cls(
            int64_values(batch.column(0)),
            int64_values(batch.column(1)),
            Entries(pa.RecordBatch.from_arrays(batch.columns[2:], schema=ENTRY_SCHEMA)),
        )

    @classmethod
    def join(cls, parts: list[Rows]) -> Rows:
        """The rows of ``parts`` one after the other (not re-sorted)."""
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), empty_entries())
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.publish_time_ms for p in parts]),
            Entries(pa.concat_batches([p.entries.batch for p in parts])),
        )

    def take(self, idx: np.ndarray) -> Rows:
        """The rows at ``idx``, in that order."""
        return Rows(self.positions[idx], self.publish_time_ms[idx], self.entries.take(idx))

    def at(self, idx: np.ndarray) -> Rows:
        """:meth:`take`, as a slice (views, no copy) when ``idx`` is a run."""
        if is_run(idx):
            return self.slice(int(idx[0]), int(idx[0]) + len(idx))
        return self.take(idx)

    def slice(self, lo: int, hi: int) -> Rows:
        """Rows ``lo`` .. ``hi`` (views, no copy)."""
        return Rows(self.positions[lo:hi], self.publish_time_ms[lo:hi], self.entries.slice(lo, hi))

    @classmethod
    def concat(cls, parts: list[Rows]) -> Rows:
        """One block of ``parts``, sorted by position."""
        rows = cls.join(parts)
        order = np.argsort(rows.positions, kind="stable")
        if len(order) and np.any(order != np.arange(len(order))):
            rows = cls(rows.positions[order], rows.publish_time_ms[order], rows.entries.take(order))
        return rows


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def empty_entries() -> Entries:
    return Entries(empty_batch(ENTRY_SCHEMA))


# --- append batches ---------------------------------------------------------------------


_IPC_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an IPC stream's end-of-stream marker


def _ipc(batch: pa.RecordBatch, metadata: dict[bytes, bytes]) -> bytes:
    """An Arrow IPC stream of ``batch`` with ``metadata`` on its schema: the schema message,
    the batch message and the end marker, the bytes a stream writer makes (the golden-bytes
    test pins them) in a third of its time."""
    batch = batch.replace_schema_metadata(metadata)
    return b"".join(
        [batch.schema.serialize().to_pybytes(), batch.serialize().to_pybytes(), _IPC_END]
    )


def _read_ipc(data, what: str) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    if len(batches) != 1:
        raise CodecError(f"{what}: holds {len(batches)} record batches, expected 1")
    return batches[0]


def encode_batch(batch: AppendBatch) -> bytes:
    """Format 3, little-endian: a 16-byte prefix (magic ``RDB\\x03``, the producer name's
    length, the sequence id), the name (UTF-8, padded to 8 bytes), then the entries as one
    Arrow IPC record-batch message of :data:`ENTRY_SCHEMA` (no schema message: both sides
    know it). A one-message batch encodes in a sixth of the time an IPC stream took, and
    decodes in a tenth."""
    name = batch.producer.encode("utf-8")
    head = _BATCH_PREFIX.pack(BATCH_MAGIC, len(name), int(batch.sequence_id))
    rb = batch.entries.batch
    if rb.schema.metadata:
        rb = rb.replace_schema_metadata(None)
    return b"".join([head, name, b"\0" * (-len(name) % 8), rb.serialize().to_pybytes()])


def decode_batch(data: bytes) -> AppendBatch:
    """Decode and check an append batch from a caller (never trusted): format 3, or the
    IPC stream of format 2 that earlier clients send."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"batch: expected bytes, got {type(data).__name__}")
    if bytes(data[:4]) != BATCH_MAGIC:
        return _decode_batch_v2(data)
    try:
        if len(data) < _BATCH_PREFIX.size:
            raise InvalidArgument(f"batch: {len(data)} bytes is too short for an append batch")
        _, name_len, seq = _BATCH_PREFIX.unpack_from(data)
        at = _BATCH_PREFIX.size + name_len + (-name_len % 8)
        if at > len(data):
            raise InvalidArgument("batch: its producer name runs past its end")
        producer = bytes(data[_BATCH_PREFIX.size : _BATCH_PREFIX.size + name_len]).decode("utf-8")
        rb = pa.ipc.read_record_batch(pa.py_buffer(data).slice(at), ENTRY_SCHEMA)
        rb.validate(full=True)
        for i in (0, 1, 4):  # payload, deliver_at_ms, cancel_target
            if rb.column(i).null_count:
                raise InvalidArgument(f"batch: column {ENTRY_SCHEMA[i].name!r} has nulls")
        entries = Entries(rb)
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"batch: not a valid append batch ({exc})") from exc
    return AppendBatch(producer, seq, entries)


def _decode_batch_v2(data) -> AppendBatch:
    """Format 2: an Arrow IPC stream of one entries batch; its schema metadata carries the
    format (``raydelay.v`` 2), ``producer`` and ``seq``."""
    try:
        rb = _read_ipc(data, "append batch")
        meta = rb.schema.metadata or {}
        if meta.get(b"raydelay.v") != b"2":
            raise InvalidArgument(f"batch: unknown append batch format {meta.get(b'raydelay.v')!r}")
        producer = meta[b"producer"].decode("utf-8")
        seq = int(meta[b"seq"])
        entries = Entries(conform(rb.replace_schema_metadata(None), "batch"))
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"batch: not a valid append batch ({exc})") from exc
    return AppendBatch(producer, seq, entries)


# --- ledger objects -----------------------------------------------------------------------


def encode_object(obj: LedgerObject) -> bytes:
    """Format 3, all little-endian:

    - a 16-byte prefix: magic ``RDL\\x03``, entry count n, meta length, reserved 0;
    - n + 1 int32 payload offsets into the body (Arrow's binary offsets), padded to 8;
    - the meta: an Arrow IPC stream of one record batch holding every column but the
      payload (deliver_at_ms always; key, properties, cancel_target only when some
      entry has one), whose schema metadata holds the ledger id, first entry, publish
      time and the dedup records (msgpack);
    - the body: the payloads back to back.

    A reader of a few entries fetches the prefix, offsets and meta, then only the
    payload bytes it needs; the payload column is the body and offsets as they lie."""
    b = obj.entries.batch
    n = b.num_rows
    pay = b.column(0)
    offsets = _offsets(pay)
    body_lo, body_hi = int(offsets[0]), int(offsets[-1])
    if body_hi - body_lo > MAX_BODY_BYTES:
        raise InvalidArgument(f"ledger object: {body_hi - body_lo} payload bytes, over 2 GiB")
    cols, names = [b.column(1)], ["deliver_at_ms"]
    if b.column(2).null_count < n:
        cols.append(b.column(2))
        names.append("key")
    if b.column(3).null_count < n:
        cols.append(b.column(3))
        names.append("properties")
    if n and np.any(int64_values(b.column(4)) != NO_CANCEL):
        cols.append(b.column(4))
        names.append("cancel_target")
    dedup = {p: [s, [list(r) for r in ranges]] for p, (s, ranges) in obj.dedup.items()}
    meta = _ipc(
        pa.RecordBatch.from_arrays(cols, names=names),
        {
            b"l": str(obj.ledger_id).encode(),
            b"f": str(obj.first_entry).encode(),
            b"t": str(obj.publish_time_ms).encode(),
            b"dd": msgpack.packb(dedup, use_bin_type=True),
        },
    )
    head = _PREFIX.size + 4 * (n + 1)
    pad = b"\0" * (-head % 8)
    data_buf = pay.buffers()[2]
    body = b"" if data_buf is None else memoryview(data_buf)[body_lo:body_hi]
    return b"".join(
        [
            _PREFIX.pack(OBJECT_MAGIC, n, len(meta), 0),
            (offsets - body_lo).astype(_I32).tobytes(),
            pad,
            meta,
            body,
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
    meta: (
        pa.RecordBatch
    )  # ENTRY_SCHEMA minus the payload: deliver_at_ms, key, properties, cancel_target
    dedup: dict[str, tuple[int, list[tuple[int, int, int]]]]

    @property
    def nbytes(self) -> int:
        """Memory held, roughly: the meta columns and the offsets."""
        return int(self.meta.nbytes) + 8 * (self.count + 1)

    @cached_property  # parsed once, not once per run cut out of the object
    def cancels(self) -> dict[int, tuple[int, int]]:
        return cancels_of(int64_values(self.meta.column(3)))

    def byte_range(self, lo: int, hi: int) -> tuple[int, int]:
        """Where entries ``lo .. hi - 1`` (indexes in the object) lie in the object."""
        return self.body_start + int(self.offsets[lo]), self.body_start + int(self.offsets[hi])

    def entries(self, lo: int, hi: int, body, body_at: int) -> Entries:
        """Entries ``lo .. hi - 1`` (a view, no copy of payloads); ``body`` holds the object's
        bytes from offset ``body_at`` on, covering at least their payloads."""
        start = self.body_start - body_at + int(self.offsets[lo])
        end = self.body_start - body_at + int(self.offsets[hi])
        if start < 0 or end > len(body):
            raise CodecError(
                f"ledger object {self.ledger_id}:{self.first_entry}: the body given does not "
                f"hold entries {lo}..{hi - 1}"
            )
        rel = (self.offsets[lo : hi + 1] - self.offsets[lo]).astype(_I32)
        buf = pa.py_buffer(body)
        if start or end != len(body):
            buf = buf.slice(start, end - start)
        pay = pa.Array.from_buffers(pa.binary(), hi - lo, [None, pa.py_buffer(rel), buf])
        m = self.meta.slice(lo, hi - lo)
        return Entries(pa.RecordBatch.from_arrays([pay, *m.columns], schema=ENTRY_SCHEMA))

    def run(self, lo: int, hi: int, body, body_at: int) -> LedgerObject:
        """Entries ``lo .. hi - 1`` as a LedgerObject of their own (see :meth:`entries`)."""
        return LedgerObject(
            self.ledger_id,
            self.first_entry + lo,
            self.publish_time_ms,
            self.entries(lo, hi, body, body_at),
            {},
        )


def index_length(data: bytes, what: str = "ledger object") -> int:
    """How many leading bytes of an object its index needs (``data``: at least 16 of them)."""
    if len(data) < _PREFIX.size:
        raise CodecError(f"{what}: {len(data)} bytes is too short for a ledger object")
    magic, n, meta_len, _ = _PREFIX.unpack_from(data)
    if magic == OBJECT_MAGIC:
        head = _PREFIX.size + 4 * (n + 1)
        return head + (-head % 8) + meta_len
    if magic == LEGACY_MAGIC:
        return _PREFIX.size + 4 * (n + 1) + meta_len
    raise CodecError(f"{what}: unknown format (magic {bytes(magic)!r})")


def decode_index(data, what: str = "ledger object") -> ObjectIndex:
    """The index of an object from its first ``index_length`` bytes (or more)."""
    need = index_length(data, what)
    if len(data) < need:
        raise CodecError(f"{what}: the index needs {need} bytes, got {len(data)}")
    magic, n, meta_len, _ = _PREFIX.unpack_from(data)
    try:
        if magic == LEGACY_MAGIC:
            return _decode_legacy_index(data, n, meta_len, need, what)
        offsets = np.frombuffer(data, dtype=_I32, count=n + 1, offset=_PREFIX.size)
        meta = _read_ipc(memoryview(data)[need - meta_len : need], what)
        md = meta.schema.metadata or {}
        if meta.num_rows != n:
            raise CodecError(f"{what}: {n} entries but {meta.num_rows} rows of columns")
        columns = conform(meta.replace_schema_metadata(None), what, META_SCHEMA)
        dedup_raw = msgpack.unpackb(md[b"dd"], raw=False)
        return ObjectIndex(
            int(md[b"l"]),
            int(md[b"f"]),
            int(md[b"t"]),
            n,
            offsets.astype(np.int64),
            need,
            columns,
            _dedup_from(dedup_raw),
        )
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"{what}: cannot decode its index ({exc})") from exc


def _dedup_from(raw: dict) -> dict[str, tuple[int, list[tuple[int, int, int]]]]:
    return {
        p: (int(s), [(int(a), int(b), int(c)) for a, b, c in ranges])
        for p, (s, ranges) in raw.items()
    }


def _decode_legacy_index(data, n: int, head_len: int, need: int, what: str) -> ObjectIndex:
    """Format 2: n + 1 uint32 offsets, then a msgpack header with the columns d (raw int64),
    k (list or nil), pr (list or nil) and c ([[index, ledger, entry], ...] or nil)."""
    offsets = np.frombuffer(data, dtype=_U32, count=n + 1, offset=_PREFIX.size)
    raw = msgpack.unpackb(bytes(data[need - head_len : need]), raw=False)
    d = np.frombuffer(raw["d"], dtype=I64)
    if len(d) != n:
        raise CodecError(f"{what}: {n} entries but {len(d)} deliver_at values")
    for name in ("k", "pr"):
        if raw[name] is not None and len(raw[name]) != n:
            raise CodecError(f"{what}: column {name!r} has the wrong length")
    cancels = {int(i): (int(tl), int(te)) for i, tl, te in raw["c"] or ()}
    shell = Entries.build(pa.nulls(n, pa.binary()).fill_null(b""), d, raw["k"], raw["pr"], cancels)
    return ObjectIndex(
        int(raw["l"]),
        int(raw["f"]),
        int(raw["t"]),
        n,
        offsets.astype(np.int64),
        need,
        pa.RecordBatch.from_arrays(shell.batch.columns[1:], schema=META_SCHEMA),
        _dedup_from(raw["dd"]),
    )


def decode_object(data, what: str = "ledger object") -> LedgerObject:
    """A whole ledger object; its payload column is a view of ``data`` (no copy)."""
    index = decode_index(data, what)
    if len(data) < index.body_start + int(index.offsets[-1]):
        raise CodecError(f"{what}: truncated ({len(data)} bytes)")
    obj = index.run(0, index.count, data, 0)
    return LedgerObject(
        obj.ledger_id, obj.first_entry, obj.publish_time_ms, obj.entries, index.dedup
    )


def concat_entries(blocks: list[Entries]) -> Entries:
    """One block holding ``blocks`` in order."""
    if len(blocks) == 1:
        return blocks[0]
    if not blocks:
        return empty_entries()
    return Entries(pa.concat_batches([b.batch for b in blocks]))
