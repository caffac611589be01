"""Rows to messages: validate one Arrow record batch and route its rows (no Ray, no Spark).

A row becomes a message when it has a payload within ``topic.max_message_bytes`` and,
when a time column is named, a usable due time. Every other row is rejected with one of
a few fixed reasons (the row's own columns show the bad value), so reasons can be
counted. Rows are routed by key hash, the same hash the producer uses, so one key's
messages stay in one partition; keyless rows of one chunk all go to the partition the
caller picks (deterministically, so a retried chunk lands where the first try did).

Time columns are parsed a whole column at a time with ``pyarrow.compute`` casts; only
text Arrow does not read as Python does (naive or sub-millisecond times, garbage, ``1_000``)
goes row by row, through :func:`parse_time` and ``float()``, which define what is accepted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydelay.dispatch.keys import key_hash
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY, Entries, int64_array

# The fixed reject reasons (the ``reject_reason`` column holds one of these).
PAYLOAD_MISSING = "payload: missing"
PAYLOAD_TOO_BIG = "payload: over topic.max_message_bytes"
AT_MISSING = "deliver_at: missing"
AT_UNPARSEABLE = "deliver_at: not a time"
AT_NAIVE = "deliver_at: no time zone"
AT_NEGATIVE = "deliver_at: before 1970"
DELAY_MISSING = "delay: missing"
DELAY_UNPARSEABLE = "delay: not a number of seconds"
DELAY_NEGATIVE = "delay: negative"
BEYOND_MAX = "deliver_at: beyond delayed.max_delay_ms"

_REASONS = (
    PAYLOAD_MISSING,
    PAYLOAD_TOO_BIG,
    AT_MISSING,
    AT_UNPARSEABLE,
    AT_NAIVE,
    AT_NEGATIVE,
    DELAY_MISSING,
    DELAY_UNPARSEABLE,
    DELAY_NEGATIVE,
    BEYOND_MAX,
)

# the common shapes of the text in a column with rows Arrow refuses: these rows are cast
# (Arrow reads them as Python does), the others parsed one by one
_ISO_AWARE = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,3})?)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_DECIMAL = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
# delays past this many seconds do not fit an int64 of epoch ms
_MAX_DELAY_S = 9e12


@dataclass(frozen=True)
class RowSpec:
    """Which columns hold what. At most one of ``deliver_at_col`` (epoch ms, an aware
    timestamp, or an ISO-8601 string with an offset) and ``delay_col`` (seconds from the
    time the row is ingested) may be given; with neither, messages are immediate."""

    payload_col: str
    deliver_at_col: str | None = None
    delay_col: str | None = None
    key_col: str | None = None
    property_cols: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("payload_col", "deliver_at_col", "delay_col", "key_col"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgument(f"{name}: expected a column name, got {value!r}")
        if self.payload_col is None:
            raise InvalidArgument("payload_col: a payload column is required")
        if self.deliver_at_col is not None and self.delay_col is not None:
            raise InvalidArgument("deliver_at_col: give deliver_at_col or delay_col, not both")
        if isinstance(self.property_cols, str) or not all(
            isinstance(c, str) and c for c in self.property_cols
        ):
            raise InvalidArgument(
                f"property_cols: expected a sequence of column names, got {self.property_cols!r}"
            )
        object.__setattr__(self, "property_cols", tuple(self.property_cols))
        if self.payload_col in self.property_cols:
            raise InvalidArgument(
                f"property_cols: {self.payload_col!r} is the payload column already"
            )

    def columns(self) -> list[str]:
        named = [self.payload_col, self.deliver_at_col, self.delay_col, self.key_col]
        return [c for c in named if c is not None] + list(self.property_cols)

    def check_columns(self, available: Sequence[str]) -> None:
        missing = [c for c in self.columns() if c not in available]
        if missing:
            raise InvalidArgument(
                f"columns: {', '.join(repr(c) for c in missing)} not in the input "
                f"(it has {', '.join(available)})"
            )


@dataclass
class Prepared:
    """One batch's messages grouped by partition, and its rejected rows."""

    by_partition: dict[int, Entries] = field(default_factory=dict)
    rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reasons: list[str] = field(default_factory=list)  # one per rejected row

    # partition -> the batch rows its Entries hold, in the same order
    rows: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def accepted(self) -> int:
        return sum(len(e) for e in self.by_partition.values())


def prepare(
    batch: pa.RecordBatch,
    spec: RowSpec,
    *,
    now_ms: int,
    max_delay_ms: int,
    max_bytes: int,
    partitions: int,
    keyless_partition: int,
) -> Prepared:
    """Validate ``batch`` and group its good rows into one Entries per partition, in row
    order. ``now_ms`` (epoch ms) is the time delays count from. Raises InvalidArgument for
    a column whose type cannot mean what it is used for."""
    n = batch.num_rows
    rejects = _Rejects(n)
    payloads = _payloads(batch.column(spec.payload_col), max_bytes, rejects)
    if spec.deliver_at_col is not None:
        due = _deliver_at(batch.column(spec.deliver_at_col), rejects)
    elif spec.delay_col is not None:
        due = _delay(batch.column(spec.delay_col), now_ms, rejects)
    else:
        due = np.full(n, NO_DELAY, dtype=np.int64)
    if max_delay_ms and (spec.deliver_at_col or spec.delay_col):
        rejects.mark((due != NO_DELAY) & (due - now_ms > max_delay_ms), BEYOND_MAX)
    keys = _strings(batch.column(spec.key_col)) if spec.key_col else None
    props = _properties(batch, spec.property_cols) if spec.property_cols else None

    bad = rejects.code != 0
    good = np.flatnonzero(~bad)
    keyless = keyless_partition % partitions
    if keys is None:
        parts = np.full(len(good), keyless, dtype=np.int64)
    else:
        parts = np.fromiter(
            (_partition(keys[i], partitions, keyless) for i in good),
            dtype=np.int64,
            count=len(good),
        )
    out = Prepared(rejected=np.flatnonzero(bad), reasons=rejects.reasons(bad))
    for p in np.unique(parts):
        idx = good[parts == p]
        out.rows[int(p)] = idx
        out.by_partition[int(p)] = Entries.build(
            payloads=payloads.take(int64_array(idx)),
            deliver_at_ms=due[idx],
            keys=[keys[i] for i in idx] if keys is not None else None,
            properties=[props[i] for i in idx] if props is not None else None,
        )
    return out


class _Rejects:
    """The first reject reason of each row of a batch (a code: 0 while the row is good)."""

    def __init__(self, n: int) -> None:
        self.code = np.zeros(n, dtype=np.int8)

    def mark(self, where: np.ndarray, why: str) -> None:
        """Give the rows ``where`` is true for the reason ``why``, unless they have one."""
        self.code[where & (self.code == 0)] = _REASONS.index(why) + 1

    def mark_row(self, row: int, why: str) -> None:
        if self.code[row] == 0:
            self.code[row] = _REASONS.index(why) + 1

    def reasons(self, rows: np.ndarray) -> list[str]:
        return [_REASONS[c - 1] for c in self.code[rows].tolist()]


def _partition(key: str | None, partitions: int, keyless: int) -> int:
    return keyless if key is None else key_hash(key) % partitions


def _payloads(col: pa.Array, max_bytes: int, rejects: _Rejects) -> pa.Array:
    """The payload column as Arrow binary (rows are taken from it, never turned into
    Python bytes); marks missing and oversized payloads."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise InvalidArgument(f"payload_col: expected binary or string values, got {col.type}")
    sizes = pc.fill_null(pc.binary_length(col), -1).to_numpy(zero_copy_only=False)
    rejects.mark(sizes < 0, PAYLOAD_MISSING)
    rejects.mark(sizes > max_bytes, PAYLOAD_TOO_BIG)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if col.type == pa.binary() else col.cast(pa.binary())


def _deliver_at(col: pa.Array, rejects: _Rejects) -> np.ndarray:
    """Epoch ms of each row (NO_DELAY where there is none); marks the rows without a
    usable time."""
    t = col.type
    out = np.full(len(col), NO_DELAY, dtype=np.int64)
    valid = _valid(col)
    if pa.types.is_timestamp(t):
        if t.tz is None:  # a wall-clock time in no particular zone
            rejects.mark(valid, AT_NAIVE)
            rejects.mark(~valid, AT_MISSING)
            return out
        raw = _int64s(pc.cast(col, pa.int64()))  # in the column's unit, since the epoch
        per_ms = {"s": 1, "ms": 1, "us": 1_000, "ns": 1_000_000}[t.unit]
        ms = raw * 1000 if t.unit == "s" else -(-raw // per_ms)  # rounded up: never early
        out[valid] = ms[valid]
    elif pa.types.is_integer(t):
        out[valid] = _int64s(col)[valid]
    elif pa.types.is_date(t):
        rejects.mark(valid, AT_NAIVE)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        _parse_times(col, valid, out, rejects)
    else:
        raise InvalidArgument(
            f"deliver_at_col: expected an aware timestamp, epoch milliseconds or ISO-8601 "
            f"strings, got {t}"
        )
    rejects.mark(~valid, AT_MISSING)
    rejects.mark(valid & (out < 0) & (out != NO_DELAY), AT_NEGATIVE)
    return out


def _parse_times(col: pa.Array, valid: np.ndarray, out: np.ndarray, rejects: _Rejects) -> None:
    """Text times into ``out`` (epoch ms): digits, then ISO-8601 times by casts over the
    column; rows Arrow refuses (naive, garbage, finer than ms) go to :func:`parse_time`."""
    text = pc.utf8_trim_whitespace(col)
    digits = _true(pc.ascii_is_decimal(text)) & (_int64s(pc.binary_length(text)) <= 18)
    out[digits] = _int64s(pc.cast(text.filter(digits), pa.int64()))
    rest = valid & ~digits
    if _cast_times(text, rest, out):
        return
    shaped = rest & _true(pc.match_substring_regex(text, _ISO_AWARE))
    if _cast_times(text, shaped, out):
        rest &= ~shaped
    for i, one in zip(np.flatnonzero(rest).tolist(), col.filter(rest).to_pylist(), strict=True):
        ms = parse_time(one)
        if isinstance(ms, str):
            rejects.mark_row(i, ms)
        else:
            out[i] = ms


def _cast_times(text: pa.Array, rows: np.ndarray, out: np.ndarray) -> bool:
    """The ``rows`` of ``text`` as aware ISO-8601 times into ``out`` (epoch ms); False,
    with ``out`` untouched, when Arrow refuses one of them."""
    try:
        stamps = pc.cast(text.filter(rows), pa.timestamp("ms", tz="UTC"))
    except pa.ArrowInvalid:
        return False
    out[rows] = _int64s(pc.cast(stamps, pa.int64()))
    return True


def parse_time(text: str) -> int | str:
    """Epoch ms of an ISO-8601 time with an offset (or of a string of digits: epoch ms);
    else the reject reason."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return AT_UNPARSEABLE
    if when.tzinfo is None or when.utcoffset() is None:
        return AT_NAIVE
    return int(round(when.timestamp() * 1000))


def _delay(col: pa.Array, now_ms: int, rejects: _Rejects) -> np.ndarray:
    """``now_ms`` plus each row's delay in seconds, as epoch ms; marks the rows without a
    usable delay."""
    t = col.type
    out = np.full(len(col), NO_DELAY, dtype=np.int64)
    valid = _valid(col)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        # unsafe: a huge int becomes the nearest float, as float() makes it
        seconds = _floats(pc.cast(col, pa.float64(), safe=False))
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        seconds = _parse_seconds(col, valid)
    else:
        raise InvalidArgument(f"delay_col: expected seconds as numbers or strings, got {t}")
    usable = np.isfinite(seconds) & (seconds < _MAX_DELAY_S)
    rejects.mark(~valid, DELAY_MISSING)
    rejects.mark(~usable, DELAY_UNPARSEABLE)
    rejects.mark(seconds < 0, DELAY_NEGATIVE)
    ok = usable & (seconds >= 0)
    out[ok] = now_ms + np.round(seconds[ok] * 1000).astype(np.int64)
    return out


def _parse_seconds(col: pa.Array, valid: np.ndarray) -> np.ndarray:
    """Text delays as float seconds (NaN where there is no number) by a cast over the
    column; when Arrow refuses a row, plain decimals are cast and the other rows go to
    ``float()`` (underscores, garbage)."""
    text = pc.utf8_trim_whitespace(col)
    try:
        return _floats(pc.cast(text, pa.float64()))
    except pa.ArrowInvalid:
        pass
    plain = _true(pc.match_substring_regex(text, _DECIMAL))
    seconds = np.full(len(col), math.nan)
    seconds[plain] = _floats(pc.cast(text.filter(plain), pa.float64()))
    rest = valid & ~plain
    seconds[rest] = [_float(v) for v in col.filter(rest).to_pylist()]
    return seconds


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # not a number: the caller rejects it


def _valid(col: pa.Array) -> np.ndarray:
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)


def _true(flags: pa.Array) -> np.ndarray:
    """A boolean column as numpy, null as False."""
    return np.asarray(pc.fill_null(flags, False).to_numpy(zero_copy_only=False), dtype=bool)


def _int64s(values: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(values, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(values: pa.Array) -> np.ndarray:
    """Float64 values as numpy, NaN for nulls."""
    return np.asarray(pc.fill_null(values, math.nan).to_numpy(zero_copy_only=False))


def _strings(col: pa.Array) -> list[str | None]:
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        try:
            col = pc.cast(col, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgument(f"column of type {col.type}: cannot be read as text") from exc
    return col.to_pylist()


def _properties(batch: pa.RecordBatch, cols: tuple[str, ...]) -> list[dict[str, str] | None]:
    values = [_strings(batch.column(c)) for c in cols]
    out: list[dict[str, str] | None] = []
    for row in zip(*values, strict=True):
        props = {c: v for c, v in zip(cols, row, strict=True) if v is not None}
        out.append(props or None)
    return out
