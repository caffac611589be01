"""The console's pure parts: form input, formatting and the SVG chart (no Ray, no browser)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from raydelay.client.cancels import check_cancel_target
from raydelay.client.message import MessageId
from raydelay.errors import InvalidArgument
from raydelay.web.chart import Bar, bar_chart
from raydelay.web.model import (
    MAX_OFFSET,
    MAX_PAGE,
    MAX_REFRESH_S,
    MIN_REFRESH_S,
    _preview,
    _span,
    parse_limit,
    parse_offset,
    parse_refresh,
    parse_time,
)


def test_times_from_a_form():
    assert parse_time("due_after", None) is None
    assert parse_time("due_after", "  ") is None
    assert parse_time("due_after", "1795600000000") == 1795600000000
    # no zone: UTC, as the console shows times
    utc = datetime(2026, 11, 25, 20, 0, tzinfo=UTC)
    assert parse_time("due_after", "2026-11-25T20:00") == int(utc.timestamp() * 1000)
    assert parse_time("due_after", "2026-11-25T21:00+01:00") == int(utc.timestamp() * 1000)
    with pytest.raises(InvalidArgument, match=r"^due_before: expected an ISO-8601"):
        parse_time("due_before", "tomorrow")
    with pytest.raises(InvalidArgument, match=r"^due_after: epoch ms out of range"):
        parse_time("due_after", "9" * 30)
    with pytest.raises(InvalidArgument, match=r"^to: epoch ms out of range"):
        parse_time("to", "-5")


def test_page_sizes():
    assert parse_limit(None) == 100
    assert parse_limit("") == 100
    assert parse_limit("7") == 7
    assert parse_limit(str(MAX_PAGE)) == MAX_PAGE
    for bad in ("0", "-1", str(MAX_PAGE + 1)):
        with pytest.raises(InvalidArgument, match=r"^limit: expected 1 to"):
            parse_limit(bad)
    with pytest.raises(InvalidArgument, match=r"^limit: expected a whole number"):
        parse_limit("ten")


def test_page_offsets():
    assert parse_offset(None) == 0
    assert parse_offset("") == 0
    assert parse_offset("1000") == 1000
    assert parse_offset(str(MAX_OFFSET)) == MAX_OFFSET
    for bad in ("-1", str(MAX_OFFSET + 1), "9" * 40):
        with pytest.raises(InvalidArgument, match=r"^offset: expected 0 to 100000 messages in"):
            parse_offset(bad)
    for junk in ("ten", "1.5", "9" * 5000):
        with pytest.raises(InvalidArgument, match=r"^offset: expected a whole number"):
            parse_offset(junk)


def test_refresh_periods():
    assert parse_refresh(None) is None  # off unless asked for
    assert parse_refresh(" ") is None
    assert parse_refresh(str(MIN_REFRESH_S)) == MIN_REFRESH_S
    assert parse_refresh(str(MAX_REFRESH_S)) == MAX_REFRESH_S
    for bad in ("0", "-5", str(MIN_REFRESH_S - 1), str(MAX_REFRESH_S + 1)):
        with pytest.raises(InvalidArgument, match=rf"^refresh: expected {MIN_REFRESH_S} to"):
            parse_refresh(bad)
    with pytest.raises(InvalidArgument, match=r"^refresh: expected a whole number, got 'soon'"):
        parse_refresh("soon")


def test_the_ids_a_cancel_takes():
    # what a cancel checks of each id before it sends any, the console before it asks
    check_cancel_target("id", MessageId("orders", 1, 3, 7), "orders", 2)
    bad = [
        (MessageId("orders", 2, 3, 7), r"^id: partition 2 does not exist \(orders has 2\)"),
        (MessageId("orders", -1, 3, 7), r"^id: partition -1 does not exist"),
        (MessageId("audit", 0, 3, 7), r"^id: belongs to topic 'audit', not 'orders'"),
        (MessageId("orders", 0, -4, 7), r"^id: orders/0/-4:7 is no message position"),
        ("orders/0/3:7", r"^id: expected a MessageId, got str"),
    ]
    for mid, why in bad:
        with pytest.raises(InvalidArgument, match=why):
            check_cancel_target("id", mid, "orders", 2)


def test_payload_previews():
    assert _preview(b'{"order": 1}') == '{"order": 1}'
    assert _preview(b"") == ""
    long = ("é" * 200).encode()
    shown = _preview(long)
    assert shown.endswith("...") and shown[:-3] == "é" * 120
    # cut inside a multi-byte character: still text
    assert _preview(("a" * 479 + "é" + "b" * 10).encode()).startswith("a" * 120)
    # binary: hex, shortened
    blob = bytes(range(256))
    assert _preview(blob) == blob[:60].hex() + "..."
    assert _preview(b"\x00\x01") == "0001"


def test_spans():
    assert [_span(s) for s in (0, 59, 60, 300, 330, 3600, 5400, 86400, 90000)] == [
        "0s",
        "59s",
        "1m",
        "5m",
        "5m30s",
        "1h",
        "1h30m",
        "1d",
        "1d1h",
    ]


def test_the_chart_draws_each_count():
    bars = [Bar("now-5m", 5), Bar("5m-10m", 30), Bar("<b>", 0), Bar("later", 60)]
    svg = bar_chart(bars, title="Due <soon>", chart_id="due-hour", unit="due")
    assert re.findall(r'data-count="(\d+)"', svg) == ["5", "30", "0", "60"]
    assert "<title>5m-10m: 30 due</title>" in svg
    assert ">30</text>" in svg
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "Due &lt;soon&gt;" in svg
    heights = [float(h) for h in re.findall(r'height="([\d.]+)"/>', svg)]
    assert heights[2] == 0.0
    assert heights[1] / heights[3] == pytest.approx(0.5, abs=0.01)
    assert heights[0] / heights[3] == pytest.approx(5 / 60, abs=0.01)
    # one message among millions still shows, and big counts are shortened over the bar
    svg = bar_chart([Bar("a", 1), Bar("b", 2_500_000)], title="t", chart_id="c")
    tiny, big = (float(h) for h in re.findall(r'height="([\d.]+)"/>', svg))
    assert 0 < tiny < big and ">2.5M</text>" in svg
    # nothing scheduled: bars of height 0, no division by zero
    empty = bar_chart([Bar("a", 0), Bar("b", 0)], title="t", chart_id="c")
    assert re.findall(r'height="([\d.]+)"/>', empty) == ["0.0", "0.0"]
