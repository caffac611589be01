"""The snapshot formats are pinned: a change to these bytes is a format change (bump the version)."""

from __future__ import annotations

import numpy as np
import pytest
from pyroaring import BitMap

from raydelay.delayed import codec
from raydelay.errors import CodecError

D = np.array([1_700_000_000_000, 1_700_000_000_005, 1_700_000_000_300])
L = np.array([7, 9, 7])
E = np.array([3, 0, 70_000])

GOLDEN_SEGMENT = bytes.fromhex(
    "87a17601a16e03a26430cf0000018bcfe56800a2646492a33c7532c406000005002701a76c656467657273920709"
    "a26c6992a33c7531c403000100a16592a33c7534c40c030000000000000070110100"
)
GOLDEN_META = bytes.fromhex(
    "85a17601a5737461727407a3656e6409a269642aa87365676d656e74739184a36d696ecf0000018bcfe56800a36d"
    "6178cf0000018bcfe5692ca16e03a76269746d617073929207c41c3a300000020000000000000001000000180000"
    "001a000000030070119209c4123a3000000100000000000000100000000000"
)
GOLDEN_RECORD = bytes.fromhex(
    "86a17601a5737461727407a3656e6409a269642aa87365676d656e747301a5636f756e7403"
)
GOLDEN_TOMBS = bytes.fromhex(
    "82a17601a76269746d617073919207c4163a300000010000000000020010000000010002000300"
)


def test_segment_bytes_are_pinned_and_round_trip():
    assert codec.encode_segment(D, L, E) == GOLDEN_SEGMENT
    d, l, e = codec.decode_segment(GOLDEN_SEGMENT, "k")  # noqa: E741
    assert d.tolist() == D.tolist() and l.tolist() == L.tolist() and e.tolist() == E.tolist()
    assert d.dtype == np.int64


def test_segment_columns_are_compact():
    n = 5_000
    d = np.sort(np.random.default_rng(1).integers(0, 300_000, n)) + 1_700_000_000_000
    l = np.full(n, 123_456)  # noqa: E741
    e = np.arange(n) * 3
    raw = codec.encode_segment(d, l, e)
    assert len(raw) < n * 8  # 2-byte deltas, 1-byte ledger index, 2-byte entries: far below 24 B
    got = codec.decode_segment(raw, "k")
    assert [c.tolist() for c in got] == [d.tolist(), l.tolist(), e.tolist()]


def test_meta_record_and_tombstones_are_pinned():
    meta = codec.BucketMeta(7, 9, 42, (codec.segment_meta(D, L, E),))
    assert codec.encode_meta(meta) == GOLDEN_META
    back = codec.decode_meta(GOLDEN_META, "k")
    assert (back.start_ledger, back.end_ledger, back.bucket_id, back.key) == (7, 9, 42, "7_9_42")
    seg = back.segments[0]
    assert (seg.min_deliver_at_ms, seg.max_deliver_at_ms, seg.count) == (D[0], D[-1], 3)
    assert sorted(seg.bitmaps[7]) == [3, 70_000] and sorted(seg.bitmaps[9]) == [0]
    assert codec.encode_record(codec.RegistryRecord(7, 9, 42, 1, 3)) == GOLDEN_RECORD
    assert codec.decode_record(GOLDEN_RECORD, "k") == codec.RegistryRecord(7, 9, 42, 1, 3)
    assert codec.encode_tombstones({7: BitMap([1, 2, 3])}) == GOLDEN_TOMBS
    assert codec.decode_tombstones(GOLDEN_TOMBS, "k") == {7: BitMap([1, 2, 3])}


@pytest.mark.parametrize(
    "decode",
    [codec.decode_segment, codec.decode_meta, codec.decode_record, codec.decode_tombstones],
)
@pytest.mark.parametrize(
    "raw", [b"", b"\xc1", b"\x80", GOLDEN_SEGMENT[:-5], b"\x82\xa1v\x02\xa1n\x00"]
)
def test_corrupt_objects_raise_codec_error_naming_the_key(decode, raw):
    with pytest.raises(CodecError, match="some/key") as info:
        decode(raw, "some/key")
    assert info.value.__cause__ is not None


def test_an_unknown_version_is_refused():
    raw = GOLDEN_RECORD.replace(b"\xa1v\x01", b"\xa1v\x09")
    with pytest.raises(CodecError, match="unsupported format version 9"):
        codec.decode_record(raw, "k")
