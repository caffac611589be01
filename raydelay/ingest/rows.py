"""Rows to messages: validate one Arrow record batch and route its rows (no Ray, no Spark).

A row becomes a message when it has a payload within ``topic.max_message_bytes`` and,
when a time column is named, a usable due time. Every other row is rejected with one of
a few fixed reasons (the row's own columns show the bad value), so reasons can be
counted. Rows are routed by key hash, the same hash the producer uses, so one key's
messages stay in one partition; keyless rows of one chunk all go to the partition the
caller picks (deterministically, so a retried chunk lands where the first try did).
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
    order. Raises InvalidArgument for a column whose type cannot mean what it is used for."""
    n = batch.num_rows
    reason: list[str | None] = [None] * n
    payloads = _payloads(batch.column(spec.payload_col), max_bytes, reason)
    if spec.deliver_at_col is not None:
        due = _deliver_at(batch.column(spec.deliver_at_col), reason)
    elif spec.delay_col is not None:
        due = _delay(batch.column(spec.delay_col), now_ms, reason)
    else:
        due = np.full(n, NO_DELAY, dtype=np.int64)
    if max_delay_ms and (spec.deliver_at_col or spec.delay_col):
        for i in np.flatnonzero((due != NO_DELAY) & (due - now_ms > max_delay_ms)):
            if reason[i] is None:
                reason[i] = BEYOND_MAX
    keys = _strings(batch.column(spec.key_col)) if spec.key_col else None
    props = _properties(batch, spec.property_cols) if spec.property_cols else None

    bad = np.fromiter((r is not None for r in reason), dtype=bool, count=n)
    good = np.flatnonzero(~bad)
    if keys is None:
        parts = np.full(len(good), keyless_partition % partitions, dtype=np.int64)
    else:
        parts = np.fromiter(
            (
                keyless_partition % partitions
                if keys[i] is None
                else key_hash(keys[i]) % partitions
                for i in good
            ),
            dtype=np.int64,
            count=len(good),
        )
    out = Prepared(rejected=np.flatnonzero(bad), reasons=[r for r in reason if r is not None])
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


def _payloads(col: pa.Array, max_bytes: int, reason: list) -> pa.Array:
    """The payload column as Arrow binary (rows are taken from it, never turned into
    Python bytes); marks missing and oversized payloads in ``reason``."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise InvalidArgument(f"payload_col: expected binary or string values, got {col.type}")
    sizes = pc.fill_null(pc.binary_length(col), -1).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(sizes < 0):
        reason[i] = PAYLOAD_MISSING
    for i in np.flatnonzero(sizes > max_bytes):
        reason[i] = PAYLOAD_TOO_BIG
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if col.type == pa.binary() else col.cast(pa.binary())


def _deliver_at(col: pa.Array, reason: list) -> np.ndarray:
    n = len(col)
    t = col.type
    out = np.full(n, NO_DELAY, dtype=np.int64)
    valid = ~col.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(t):
        if t.tz is None:  # a wall-clock time in no particular zone
            _mark(reason, valid, AT_NAIVE)
            _mark(reason, ~valid, AT_MISSING)
            return out
        ms = pc.cast(pc.cast(col, pa.timestamp("ms", tz=t.tz)), pa.int64())
        out[valid] = ms.to_numpy(zero_copy_only=False)[valid]
    elif pa.types.is_integer(t):
        out[valid] = col.to_numpy(zero_copy_only=False)[valid]
    elif pa.types.is_date(t):
        _mark(reason, valid, AT_NAIVE)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        for i, text in enumerate(col.to_pylist()):
            if text is not None:
                ms = parse_time(text)
                if isinstance(ms, str):
                    reason[i] = reason[i] or ms
                else:
                    out[i] = ms
    else:
        raise InvalidArgument(
            f"deliver_at_col: expected an aware timestamp, epoch milliseconds or ISO-8601 "
            f"strings, got {t}"
        )
    _mark(reason, ~valid, AT_MISSING)
    for i in np.flatnonzero(valid & (out < 0) & (out != NO_DELAY)):
        if reason[i] is None:
            reason[i] = AT_NEGATIVE
    return out


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


def _delay(col: pa.Array, now_ms: int, reason: list) -> np.ndarray:
    n = len(col)
    t = col.type
    out = np.full(n, NO_DELAY, dtype=np.int64)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        seconds = [None if v is None else float(v) for v in col.to_pylist()]
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        seconds = [_float(v) for v in col.to_pylist()]
    else:
        raise InvalidArgument(f"delay_col: expected seconds as numbers or strings, got {t}")
    for i, s in enumerate(seconds):
        if s is None:
            why = DELAY_MISSING
        elif isinstance(s, str) or not math.isfinite(s):
            why = DELAY_UNPARSEABLE
        elif s < 0:
            why = DELAY_NEGATIVE
        else:
            out[i] = now_ms + int(round(s * 1000))
            continue
        reason[i] = reason[i] or why
    return out


def _float(text: str | None) -> float | str | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text  # unparseable: the caller rejects it


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


def _mark(reason: list, where: np.ndarray, why: str) -> None:
    for i in np.flatnonzero(where):
        if reason[i] is None:
            reason[i] = why
