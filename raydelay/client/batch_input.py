"""A ``send_many`` batch's arguments checked, whole, before anything is sent: payloads as
bytes or an Arrow binary column, due times as one value or one per message (lists, numpy
or Arrow columns, a fast numpy path when they allow), keys and properties. Every error
names the field and the first bad message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydelay.client.message import (
    MAX_DELIVER_AT_MS,
    check_key,
    check_payload,
    check_properties,
    deliver_at_of,
)
from raydelay.clock import now_ms as _now_ms
from raydelay.errors import InvalidArgument


@dataclass(frozen=True)
class CheckedBatch:
    """A batch checked: payloads (a list of bytes, or an Arrow binary array), a key and
    properties per message (None where it has none), deliver_at epoch ms, and whether
    keys were given at all (keyless batches take the sticky partitions)."""

    payloads: Any
    keys: list[str | None]
    properties: list[dict[str, str] | None]
    deliver_at: np.ndarray
    keyed: bool


def check_batch(
    payloads: Sequence[bytes] | pa.Array | pa.ChunkedArray,
    deliver_after: Any,
    deliver_at: Any,
    keys: Sequence[str | None] | pa.Array | pa.ChunkedArray | None,
    properties: Sequence[dict[str, str] | None] | dict[str, str] | None,
    *,
    max_bytes: int,
    max_delay_ms: int,
) -> CheckedBatch:
    """The arguments of ``Producer.send_many``, checked (see the module docstring)."""
    arrow = isinstance(payloads, pa.Array | pa.ChunkedArray)
    if arrow:
        payloads = _arrow_payloads(payloads, max_bytes)
    elif isinstance(payloads, (bytes, bytearray, str)) or not isinstance(payloads, Sequence):
        raise InvalidArgument("payloads: expected a sequence of bytes (or an Arrow array)")
    n = len(payloads)
    deliver_at = _from_arrow("deliver_at", deliver_at)
    deliver_after = _from_arrow("deliver_after", deliver_after)
    if isinstance(keys, pa.Array | pa.ChunkedArray):
        keys = keys.to_pylist()
    if isinstance(deliver_at, np.ndarray):
        deliver_at = _from_numpy("deliver_at", deliver_at)
    if isinstance(deliver_after, np.ndarray):
        deliver_after = _from_numpy("deliver_after", deliver_after)
    ats = _per_message("deliver_at", deliver_at, n, scalar_ok=lambda v: not _is_seq(v))
    afters = _per_message("deliver_after", deliver_after, n, scalar_ok=lambda v: not _is_seq(v))
    ks = _per_message("keys", keys, n, scalar_ok=lambda v: False) if keys is not None else None
    props = (
        _per_message("properties", properties, n, scalar_ok=lambda v: isinstance(v, dict))
        if properties is not None
        else None
    )
    now = _now_ms()
    checked_payloads: Any = payloads if arrow else _check_payloads(payloads, max_bytes)
    key_list: list[str | None] = (
        [check_key(k, f"keys[{i}]") for i, k in enumerate(ks)] if ks else [None] * n
    )
    prop_list: list[dict[str, str] | None] = (
        [check_properties(p, f"properties[{i}]") for i, p in enumerate(props)]
        if props
        else [None] * n
    )
    if not _is_seq(deliver_at) and not _is_seq(deliver_after):  # one due time for all
        d = np.full(n, deliver_at_of(deliver_at, deliver_after, now, max_delay_ms), dtype=np.int64)
    else:
        column = _due_column(deliver_at, deliver_after, n, now, max_delay_ms)
        if column is not None:
            d = column
        else:  # mixed: None, datetimes or floats among them; one by one
            d = np.fromiter(
                (
                    deliver_at_of(ats[i], afters[i], now, max_delay_ms, f"message {i}")
                    for i in range(n)
                ),
                dtype=np.int64,
                count=n,
            )
    return CheckedBatch(checked_payloads, key_list, prop_list, d, ks is not None)


def _check_payloads(payloads: Sequence[object], max_bytes: int) -> list[bytes]:
    if all(type(p) is bytes and len(p) <= max_bytes for p in payloads):
        return list(payloads)  # type: ignore[arg-type]
    return [check_payload(p, max_bytes, f"payloads[{i}]") for i, p in enumerate(payloads)]


def _arrow_payloads(values: pa.Array | pa.ChunkedArray, max_bytes: int) -> pa.Array:
    """An Arrow column of payloads, checked whole: binary values, none null, none over
    ``max_bytes``; kept as Arrow (no Python bytes per message)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise InvalidArgument(f"payloads: expected an Arrow binary array, got {values.type}")
    sizes = pc.binary_length(values).to_numpy(zero_copy_only=False)
    if values.null_count:
        first = int(np.flatnonzero(~pc.is_valid(values).to_numpy(zero_copy_only=False))[0])
        raise InvalidArgument(f"payloads[{first}]: expected bytes, got None")
    over = np.flatnonzero(sizes > max_bytes)
    if len(over):
        i = int(over[0])
        raise InvalidArgument(
            f"payloads[{i}]: {int(sizes[i])} bytes is over topic.max_message_bytes ({max_bytes})"
        )
    return values if values.type == pa.binary() else values.cast(pa.binary())


def _from_arrow(field: str, value: Any) -> Any:
    """An Arrow column of due times as numpy (epoch ms as int64 for integers and aware
    timestamps, seconds as float64 for numbers); any other value as it is."""
    if not isinstance(value, pa.Array | pa.ChunkedArray):
        return value
    if value.null_count:
        return value.to_pylist()  # None among them: checked message by message
    t = value.type
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise InvalidArgument(f"{field}: expected aware timestamps, got {t} (no time zone)")
        raw = value.cast(pa.int64()).to_numpy(zero_copy_only=False)
        per_ms = {"s": 1, "ms": 1, "us": 1_000, "ns": 1_000_000}[t.unit]
        return raw * 1000 if t.unit == "s" else -(-raw // per_ms)  # rounded up: never early
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return value.to_numpy(zero_copy_only=False)
    raise InvalidArgument(f"{field}: expected an Arrow array of numbers or timestamps, got {t}")


def _from_numpy(field: str, value: np.ndarray) -> list:
    if value.ndim != 1:
        raise InvalidArgument(f"{field}: expected a 1-d array, got {value.ndim} dimensions")
    return value.tolist()


def _due_column(
    deliver_at: Any, deliver_after: Any, n: int, now_ms: int, max_delay_ms: int
) -> np.ndarray | None:
    """Due times (epoch ms) of a whole batch in a few numpy operations, when only one of
    ``deliver_at`` (ints) and ``deliver_after`` (numbers) is a per-message list without
    None; None when the batch needs checking message by message (which also finds and
    names the first bad message, so the error is the same)."""
    if (deliver_at is None) == (deliver_after is None):
        return None
    value = deliver_at if deliver_at is not None else deliver_after
    if not _is_seq(value) or len(value) != n or n == 0:
        return None
    if bool in set(map(type, value)):
        return None  # True is not a time; the per-message check says so
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if deliver_at is not None:
        if arr.dtype.kind not in "iu":
            return None
        if (arr < 0).any() or (arr > MAX_DELIVER_AT_MS).any():
            return None
        d = arr.astype(np.int64)
    else:
        if arr.dtype.kind not in "iuf":
            return None
        if not np.isfinite(arr).all() or (arr < 0).any():
            return None
        if (arr > (MAX_DELIVER_AT_MS - now_ms) / 1000).any():
            return None
        d = now_ms + np.round(arr.astype(np.float64) * 1000).astype(np.int64)
    if max_delay_ms and (d - now_ms > max_delay_ms).any():
        return None
    return d


def _is_seq(v: object) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, (str, bytes, bytearray))


def _per_message(field: str, value: Any, n: int, *, scalar_ok) -> list:
    if value is None:
        return [None] * n
    if scalar_ok(value):
        return [value] * n
    if not _is_seq(value):
        raise InvalidArgument(f"{field}: expected one value or a sequence of {n}")
    if len(value) != n:
        raise InvalidArgument(f"{field}: has {len(value)} values for {n} payloads")
    return list(value)
