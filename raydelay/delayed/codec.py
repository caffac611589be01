"""The snapshot formats of the bucket tracker: versioned msgpack, compact columns.

Three objects per bucket, plus one registry record:

- ``seg-<n>``: one segment, positions sorted by (deliver_at, ledger, entry) as
  columns. deliver_at is delta-encoded from ``d0``; ledgers are dictionary-encoded
  (distinct ledger ids + an index column); every column is stored little-endian
  in the narrowest unsigned width that fits (1, 2, 4 or 8 bytes).
- ``meta``: per segment its min/max deliver_at, count, and a roaring bitmap of
  entry ids per ledger (``BitMap.serialize()`` bytes), so recovery restores
  membership without reading segments.
- the registry record: the bucket's ledger range, id, segment count and size.

A decode failure raises CodecError naming the key, with the cause chained.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np
from pyroaring import BitMap

from raydelay.delayed.columns import I64, bitmap_of, ledger_groups
from raydelay.errors import CodecError

FORMAT_VERSION = 1
_WIDTHS = ((0xFF, "<u1"), (0xFFFF, "<u2"), (0xFFFFFFFF, "<u4"), (2**63 - 1, "<u8"))


@dataclass(frozen=True)
class SegmentMeta:
    """One segment's summary: deliver_at range (epoch ms), count, entry bitmaps by ledger."""

    min_deliver_at_ms: int
    max_deliver_at_ms: int
    count: int
    bitmaps: dict[int, BitMap]


@dataclass(frozen=True)
class BucketMeta:
    """An immutable bucket: the ledger range [start_ledger, end_ledger], its id and segments."""

    start_ledger: int
    end_ledger: int
    bucket_id: int
    segments: tuple[SegmentMeta, ...]

    @property
    def key(self) -> str:
        return bucket_key(self.start_ledger, self.end_ledger, self.bucket_id)

    @property
    def count(self) -> int:
        return sum(s.count for s in self.segments)


@dataclass(frozen=True)
class RegistryRecord:
    start_ledger: int
    end_ledger: int
    bucket_id: int
    segment_count: int
    count: int

    @property
    def key(self) -> str:
        return bucket_key(self.start_ledger, self.end_ledger, self.bucket_id)


def bucket_key(start_ledger: int, end_ledger: int, bucket_id: int) -> str:
    return f"{start_ledger}_{end_ledger}_{bucket_id}"


def _pack_uint(values: np.ndarray) -> tuple[str, bytes]:
    top = int(values.max()) if len(values) else 0
    for limit, dtype in _WIDTHS:
        if top <= limit:
            return dtype, values.astype(dtype).tobytes()
    raise ValueError("value out of range")  # pragma: no cover - int64 input cannot exceed u8


def _unpack_uint(dtype: str, raw: bytes, n: int) -> np.ndarray:
    if dtype not in {w for _, w in _WIDTHS}:
        raise ValueError(f"unknown column width {dtype!r}")
    arr = np.frombuffer(raw, dtype=dtype)
    if len(arr) != n:
        raise ValueError(f"column holds {len(arr)} values, expected {n}")
    return arr.astype(I64)


def encode_segment(d: np.ndarray, l: np.ndarray, e: np.ndarray) -> bytes:  # noqa: E741
    """Columns already sorted by (deliver_at, ledger, entry)."""
    n = len(d)
    d0 = int(d[0]) if n else 0
    dd_t, dd = _pack_uint(np.diff(d, prepend=d0) if n else d)
    ledgers, lidx = np.unique(l, return_inverse=True)
    li_t, li = _pack_uint(lidx.astype(I64))
    e_t, eb = _pack_uint(e)
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "n": n,
            "d0": d0,
            "dd": [dd_t, dd],
            "ledgers": ledgers.tolist(),
            "li": [li_t, li],
            "e": [e_t, eb],
        },
        use_bin_type=True,
    )


def decode_segment(raw: bytes, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        _check_version(obj)
        n = int(obj["n"])
        d = (
            np.cumsum(_unpack_uint(obj["dd"][0], obj["dd"][1], n)) + int(obj["d0"])
            if n
            else np.empty(0, I64)
        )
        ledgers = np.asarray(obj["ledgers"], dtype=I64)
        lidx = _unpack_uint(obj["li"][0], obj["li"][1], n)
        if n and (len(ledgers) == 0 or int(lidx.max()) >= len(ledgers)):
            raise ValueError("ledger index out of range")
        l = ledgers[lidx] if n else np.empty(0, I64)  # noqa: E741
        e = _unpack_uint(obj["e"][0], obj["e"][1], n)
        return d.astype(I64), l, e
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"cannot decode segment {key!r}: {exc}") from exc


def segment_meta(d: np.ndarray, l: np.ndarray, e: np.ndarray) -> SegmentMeta:  # noqa: E741
    bitmaps = {}
    for ledger, idx in ledger_groups(l):
        bm = bitmap_of(e[idx])
        bm.run_optimize()
        bitmaps[ledger] = bm
    return SegmentMeta(int(d[0]), int(d[-1]), len(d), bitmaps)


def encode_meta(meta: BucketMeta) -> bytes:
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "start": meta.start_ledger,
            "end": meta.end_ledger,
            "id": meta.bucket_id,
            "segments": [
                {
                    "min": s.min_deliver_at_ms,
                    "max": s.max_deliver_at_ms,
                    "n": s.count,
                    "bitmaps": [
                        [ledger, s.bitmaps[ledger].serialize()] for ledger in sorted(s.bitmaps)
                    ],
                }
                for s in meta.segments
            ],
        },
        use_bin_type=True,
    )


def decode_meta(raw: bytes, key: str) -> BucketMeta:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        _check_version(obj)
        segments = tuple(
            SegmentMeta(
                int(s["min"]),
                int(s["max"]),
                int(s["n"]),
                {int(ledger): BitMap.deserialize(bm) for ledger, bm in s["bitmaps"]},
            )
            for s in obj["segments"]
        )
        return BucketMeta(int(obj["start"]), int(obj["end"]), int(obj["id"]), segments)
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"cannot decode bucket meta {key!r}: {exc}") from exc


def encode_record(rec: RegistryRecord) -> bytes:
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "start": rec.start_ledger,
            "end": rec.end_ledger,
            "id": rec.bucket_id,
            "segments": rec.segment_count,
            "count": rec.count,
        },
        use_bin_type=True,
    )


def decode_record(raw: bytes, key: str) -> RegistryRecord:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        _check_version(obj)
        return RegistryRecord(
            int(obj["start"]),
            int(obj["end"]),
            int(obj["id"]),
            int(obj["segments"]),
            int(obj["count"]),
        )
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"cannot decode registry record {key!r}: {exc}") from exc


def encode_tombstones(bitmaps: dict[int, BitMap]) -> bytes:
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "bitmaps": [[ledger, bitmaps[ledger].serialize()] for ledger in sorted(bitmaps)],
        },
        use_bin_type=True,
    )


def decode_tombstones(raw: bytes, key: str) -> dict[int, BitMap]:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        _check_version(obj)
        return {int(ledger): BitMap.deserialize(bm) for ledger, bm in obj["bitmaps"]}
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"cannot decode tombstones {key!r}: {exc}") from exc


def _check_version(obj: object) -> None:
    if not isinstance(obj, dict) or "v" not in obj:
        raise ValueError("not a raydelay snapshot object")
    if obj["v"] != FORMAT_VERSION:
        raise ValueError(
            f"unsupported format version {obj['v']!r} (this build reads {FORMAT_VERSION})"
        )
