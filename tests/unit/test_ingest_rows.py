"""Rows to messages (raydelay.ingest.rows): validation, reject reasons and routing."""

from __future__ import annotations

import itertools
import zlib
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from raydelay.client.producer import partition_of
from raydelay.errors import InvalidArgument
from raydelay.ingest import rows as R
from raydelay.log.entries import NO_DELAY

NOW = 1_800_000_000_000
HOUR = 3_600_000


def prep(batch, spec, *, partitions=4, keyless=0, max_delay_ms=HOUR, max_bytes=100):
    return R.prepare(
        batch,
        spec,
        now_ms=NOW,
        max_delay_ms=max_delay_ms,
        max_bytes=max_bytes,
        partitions=partitions,
        keyless_partition=keyless,
    )


def reasons_by_row(batch, prepared) -> dict[int, str]:
    return dict(zip(prepared.rejected.tolist(), prepared.reasons, strict=True))


def all_entries(prepared):
    return {p: e for p, e in sorted(prepared.by_partition.items())}


def test_iso_strings_with_offsets_become_epoch_ms_and_bad_ones_are_rejected_with_a_reason():
    # Given ISO-8601 times: good ones with offsets, a naive one, garbage and a null
    batch = pa.record_batch(
        {
            "p": [b"a", b"b", b"c", b"d", b"e", b"f"],
            "at": [
                "2027-01-15T08:00:00+00:00",
                "2027-01-15T09:00:00+01:00",
                "2027-01-15T08:00:00",
                "tomorrow",
                None,
                str(NOW + 5),
            ],
        }
    )
    # When it is prepared (no max delay)
    out = prep(batch, R.RowSpec("p", deliver_at_col="at"), partitions=1, max_delay_ms=0)
    # Then the aware times agree (same instant), the digits are epoch ms, and each bad row
    # has its reason
    expected = int(datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() * 1000)
    e = out.by_partition[0]
    assert e.payloads == [b"a", b"b", b"f"]
    assert e.deliver_at_ms.tolist() == [expected, expected, NOW + 5]
    assert reasons_by_row(batch, out) == {2: R.AT_NAIVE, 3: R.AT_UNPARSEABLE, 4: R.AT_MISSING}


def test_payload_problems_come_first_and_oversize_names_the_limit():
    batch = pa.record_batch({"p": [None, "x" * 101, "ok", "text"], "d": ["-1", "1", "2.5", "bad"]})
    # (a string payload column is sent as its UTF-8 bytes)
    out = prep(batch, R.RowSpec("p", delay_col="d"), partitions=1)
    assert reasons_by_row(batch, out) == {
        0: R.PAYLOAD_MISSING,
        1: R.PAYLOAD_TOO_BIG,
        3: R.DELAY_UNPARSEABLE,
    }
    assert out.by_partition[0].deliver_at_ms.tolist() == [NOW + 2500]


def test_delays_negative_missing_and_beyond_the_maximum_are_rejected():
    batch = pa.record_batch({"p": [b"1", b"2", b"3", b"4", b"5"], "d": [0, -3, None, 3601, 3600]})
    out = prep(batch, R.RowSpec("p", delay_col="d"), partitions=1)
    assert reasons_by_row(batch, out) == {1: R.DELAY_NEGATIVE, 2: R.DELAY_MISSING, 3: R.BEYOND_MAX}
    assert out.by_partition[0].deliver_at_ms.tolist() == [NOW, NOW + HOUR]


def test_timestamp_columns_aware_are_used_and_naive_ones_are_rejected():
    aware = pa.array([NOW * 1000, None], type=pa.timestamp("us", tz="UTC"))
    naive = pa.array([NOW * 1000, NOW * 1000], type=pa.timestamp("us"))
    out = prep(
        pa.record_batch({"p": [b"a", b"b"], "at": aware}), R.RowSpec("p", deliver_at_col="at")
    )
    assert [e.deliver_at_ms.tolist() for e in out.by_partition.values()] == [[NOW]]
    assert out.reasons == [R.AT_MISSING]
    out = prep(
        pa.record_batch({"p": [b"a", b"b"], "at": naive}), R.RowSpec("p", deliver_at_col="at")
    )
    assert out.accepted == 0 and out.reasons == [R.AT_NAIVE, R.AT_NAIVE]


def test_keys_route_by_the_producer_hash_and_keyless_rows_go_to_the_chosen_partition():
    keys = ["order-1", None, "order-2", "order-1", "order-9"]
    batch = pa.record_batch({"p": [b"%d" % i for i in range(5)], "k": keys})
    out = prep(batch, R.RowSpec("p", key_col="k"), partitions=3, keyless=7)
    placed = {payload: p for p, e in out.by_partition.items() for payload in e.payloads}
    for i, k in enumerate(keys):
        want = 7 % 3 if k is None else zlib.crc32(k.encode()) % 3
        assert placed[b"%d" % i] == want
    # rows keep their input order inside a partition, with their keys
    for e in out.by_partition.values():
        assert e.payloads == sorted(e.payloads)
        assert [keys[int(p)] for p in e.payloads] == e.keys
    # immediate messages without a time column
    assert all((e.deliver_at_ms == NO_DELAY).all() for e in out.by_partition.values())


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16, 64])
def test_ingestion_and_the_producer_route_every_key_to_the_same_partition(partitions):
    # Given 2,000 keys, plain and odd (unicode, empty, long, look-alike numbers)
    keys = [f"order-{i}" for i in range(1_500)] + [str(i) for i in range(300)]
    keys += ["", " ", "é", "ключ", "🙂", "a" * 10_000, "order-1 ", "ORDER-1"] * 25
    batch = pa.record_batch({"p": [b"%d" % i for i in range(len(keys))], "k": keys})
    # When ingestion places them, and the producer routes them
    out = prep(batch, R.RowSpec("p", key_col="k"), partitions=partitions, max_bytes=10**6)
    placed = {payload: p for p, e in out.by_partition.items() for payload in e.payloads}
    counter = itertools.count()
    # Then each key lands where the producer would send it
    assert len(placed) == len(keys)
    for i, k in enumerate(keys):
        assert placed[b"%d" % i] == partition_of(k, partitions, counter), k[:20]


def test_property_columns_become_text_properties_without_nulls():
    batch = pa.record_batch({"p": [b"a", b"b"], "region": ["eu", None], "amount": [12, None]})
    out = prep(batch, R.RowSpec("p", property_cols=("region", "amount")), partitions=1)
    assert out.by_partition[0].properties == [{"region": "eu", "amount": "12"}, None]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"deliver_at_col": "a", "delay_col": "b"}, "deliver_at_col"),
        ({"key_col": ""}, "key_col"),
        ({"property_cols": "region"}, "property_cols"),
        ({"property_cols": ("p",)}, "property_cols"),
    ],
)
def test_a_bad_spec_names_its_field(kwargs, field):
    with pytest.raises(InvalidArgument, match=f"^{field}:"):
        R.RowSpec("p", **kwargs)


def test_missing_columns_and_unusable_types_are_named():
    spec = R.RowSpec("p", deliver_at_col="when", key_col="k")
    with pytest.raises(InvalidArgument, match="'when', 'k' not in the input"):
        spec.check_columns(["p", "x"])
    batch = pa.record_batch({"p": [1, 2]})
    with pytest.raises(InvalidArgument, match="^payload_col: expected binary or string"):
        prep(batch, R.RowSpec("p"))
    batch = pa.record_batch({"p": [b"a"], "at": [1.5]})
    with pytest.raises(InvalidArgument, match="^deliver_at_col:"):
        prep(batch, R.RowSpec("p", deliver_at_col="at"))


def test_a_large_batch_splits_exactly_into_accepted_and_rejected():
    rng = np.random.default_rng(3)
    n = 20_000
    delays = rng.integers(-100, 4_000, n)  # some negative, some beyond the hour
    batch = pa.record_batch(
        {"p": [b"m%d" % i for i in range(n)], "d": delays, "k": [f"k{i % 97}" for i in range(n)]}
    )
    out = prep(batch, R.RowSpec("p", delay_col="d", key_col="k"), partitions=5)
    assert out.accepted + len(out.rejected) == n
    assert out.accepted == int(((delays >= 0) & (delays <= 3600)).sum())
    got = sorted(int(d) for e in out.by_partition.values() for d in e.deliver_at_ms)
    assert got == sorted(NOW + int(d) * 1000 for d in delays if 0 <= d <= 3600)


def test_ingestion_routes_every_key_to_the_partition_the_producer_picks():
    # Given keys of many shapes (ASCII, non-ASCII, empty, long)
    import itertools

    from raydelay.client.producer import partition_of

    keys = [f"user-{i}" for i in range(500)] + ["", "ключ", "鍵" * 40, "a" * 1000]
    batch = pa.record_batch({"p": [b"x"] * len(keys), "k": keys})
    for partitions in (1, 3, 7, 64):
        # When ingestion prepares them
        out = prep(batch, R.RowSpec("p", key_col="k"), partitions=partitions, max_delay_ms=0)
        routed = {int(r): p for p, rows in out.rows.items() for r in rows}
        # Then each lands where a producer sends that key
        counter = itertools.count()
        assert routed == {i: partition_of(k, partitions, counter) for i, k in enumerate(keys)}


TEXT_TIMES = [
    "2027-01-15T08:00:00+00:00",
    " 2027-01-15 09:00:00.5+01:00 ",
    "2027-01-15T08:00Z",
    "2027-01-15T08+01:00",
    "2027-01-15T08:00:00+0100",
    "1969-12-31T23:59:59.999-00:30",
    str(NOW),
    "007",
    "١٢٣",  # non-ASCII digits: epoch ms to Python too
    "2027-01-15T08:00:00.1235+00:00",  # finer than ms
    "20270115T080000Z",
    "2027-W03-5T08:00:00Z",
    "2027-02-30T08:00:00+00:00",  # well formed, no such day
    "2027-01-15T08:00:00",
    "2027-01-15",
    "tomorrow",
    "",
]


def expected_time(text):
    ms = R.parse_time(text)
    if isinstance(ms, str):
        return ms
    return R.AT_NEGATIVE if ms < 0 and ms != NO_DELAY else ms


@pytest.mark.parametrize("texts", [TEXT_TIMES, TEXT_TIMES[:6] * 3])
def test_text_times_parsed_over_the_column_agree_with_parse_time_row_by_row(texts):
    # Given a column of text times (one with rows Arrow refuses, one Arrow reads whole)
    batch = pa.record_batch({"p": [b"x"] * len(texts), "at": texts})
    # When it is prepared
    out = prep(batch, R.RowSpec("p", deliver_at_col="at"), partitions=1, max_delay_ms=0)
    # Then each row is what parse_time makes of it: a time or the same reason
    got = reasons_by_row(batch, out)
    accepted = iter(out.by_partition[0].deliver_at_ms.tolist())
    for i in range(len(texts)):
        if i not in got:
            got[i] = next(accepted)
    assert got == {i: expected_time(t) for i, t in enumerate(texts)}


def test_text_delays_parsed_over_the_column_agree_with_float_row_by_row():
    texts = ["2.5", " 1e3 ", "+2", ".5", "1_000", "inf", "nan", "-1", "0x10", "", "ten", None]
    batch = pa.record_batch({"p": [b"x"] * len(texts), "d": texts})
    out = prep(batch, R.RowSpec("p", delay_col="d"), partitions=1, max_delay_ms=0)
    assert reasons_by_row(batch, out) == {
        5: R.DELAY_UNPARSEABLE,
        6: R.DELAY_UNPARSEABLE,
        7: R.DELAY_NEGATIVE,
        8: R.DELAY_UNPARSEABLE,
        9: R.DELAY_UNPARSEABLE,
        10: R.DELAY_UNPARSEABLE,
        11: R.DELAY_MISSING,
    }
    seconds = [2.5, 1000.0, 2.0, 0.5, 1000.0]
    assert out.by_partition[0].deliver_at_ms.tolist() == [NOW + round(s * 1000) for s in seconds]


def test_a_microsecond_timestamp_is_rounded_up_to_the_next_millisecond():
    # Given Spark's unit, microseconds, with a part finer than a millisecond
    at = pa.array([NOW * 1000 + 1, NOW * 1000], type=pa.timestamp("us", tz="UTC"))
    out = prep(pa.record_batch({"p": [b"a", b"b"], "at": at}), R.RowSpec("p", deliver_at_col="at"))
    # Then it is due at the next millisecond: never before the time it names
    assert sorted(d for e in out.by_partition.values() for d in e.deliver_at_ms.tolist()) == [
        NOW,
        NOW + 1,
    ]


def test_a_delay_too_large_for_epoch_milliseconds_is_not_a_number_of_seconds():
    batch = pa.record_batch({"p": [b"a", b"b"], "d": [1e300, 1.0]})
    out = prep(batch, R.RowSpec("p", delay_col="d"), partitions=1, max_delay_ms=0)
    assert reasons_by_row(batch, out) == {0: R.DELAY_UNPARSEABLE}
