"""Counts that are true everywhere, on a real cluster: cancelled messages leave ``delayed``,
the backlog and the due chart; dead letters are counted per subscription (across a restart
of its actor) and held by the dead-letter topic; a topic shows what it holds. Checked in
``stats()``, the CLI's ``stats`` and the console's topic and subscription pages."""

from __future__ import annotations

import html
import re

from raydelay.cli import main
from raydelay.clock import now_ms
from tests.integration.helpers import (
    receive_all,
    restart_subscription,
    wait_cursor_recorded,
    wait_until,
)
from tests.integration.test_console import _get, _Server

HOUR_MS = 3_600_000


def _stats_until(cluster, topic: str, sub: str, want: dict) -> dict:
    """Wait until the subscription's stats show ``want`` (the cancel markers and the dead
    letters are applied by its actors as they read the log); returns the stats."""
    seen: dict = {}

    def shows() -> dict | None:
        seen.clear()
        seen.update(cluster.stats(topic, sub))
        return seen if all(seen[k] == v for k, v in want.items()) else None

    return wait_until(
        f"{topic}/{sub} to show {want}", shows, 60, got=lambda: {k: seen.get(k) for k in want}
    )


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _row(out: str, label: str) -> int:
    """The number after ``label`` in a two-column table the CLI printed."""
    for line in out.splitlines():
        if line.strip().startswith(label):
            return int(line.split()[-1].replace(",", ""))
    raise AssertionError(f"no {label!r} row in:\n{out}")


def _cells(page: str, attr: str, value: str) -> list[str]:
    """The text of each cell of the table row whose ``attr`` is ``value``."""
    found = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', page, re.S)
    assert found, f"no row {attr}={value!r}"
    return [
        html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)
    ]


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def test_cancelled_and_dead_lettered_messages_are_counted_true_everywhere(
    cluster, topic_name, capsys
):
    from raydelay.web import create_app

    # Given a topic of 2 partitions with two subscriptions, 4 messages due in an hour and
    # one due now, which a consumer of "checkout" holds unacknowledged
    cluster.create_topic(topic_name, partitions=2)
    cluster.subscribe(topic_name, "billing").close()
    checkout = cluster.subscribe(topic_name, "checkout")
    producer = cluster.create_producer(topic_name)
    later = now_ms() + HOUR_MS
    delayed = [producer.send(b"d%d" % i, key=f"k{i}", deliver_at=later + i) for i in range(4)]
    producer.send(b"now", key="k0")
    assert len(receive_all(checkout, 1, ack=False)) == 1
    # When 2 of the delayed ones are cancelled
    assert cluster.cancel(delayed[:2]) == [True, True]
    # Then they leave delayed and the backlog of both subscriptions, and the due chart
    billing = _stats_until(cluster, topic_name, "billing", {"delayed": 2, "backlog": 3})
    assert billing["cancelled"] == 2
    held = _stats_until(cluster, topic_name, "checkout", {"delayed": 2, "backlog": 3})
    assert held["pending_ack"] == 1 and held["delayed"] <= held["backlog"]
    assert sum(n for _, n in cluster.due_histogram(topic_name, "billing")) == 2

    # Given a second topic whose subscription sends 3 messages to its dead-letter topic
    source = f"{topic_name}-src"
    dlq = f"{topic_name}-src-s-DLQ"
    cluster.create_topic(source)
    worker = cluster.subscribe(source, "s", max_redeliveries=1)
    cluster.create_producer(source).send_many([b"p0", b"p1", b"p2"])
    for _ in range(2):  # delivered 1 + max_redeliveries times, nacked every time
        for m, _ in receive_all(worker, 3, ack=False):
            worker.nack(m)
    # Then the subscription counts them, and the dead-letter topic holds them
    _stats_until(cluster, source, "s", {"dead_lettered": 3, "backlog": 0})
    wait_until(f"{dlq} to hold 3", lambda: cluster.stats(dlq)["held"] == 3, 60)
    # and the count survives a restart of the subscription's actor (it is in its cursor)
    worker.close()
    wait_cursor_recorded(cluster, source, "s")
    restart_subscription(source, "s")
    assert cluster.stats(source, "s")["dead_lettered"] == 3
    # (the subscription host restarted serves billing too: its units recover on their
    # next call, and count the delayed ones again once they have read the topic's index)
    _stats_until(cluster, topic_name, "billing", {"delayed": 2, "backlog": 3})

    # The CLI shows the same numbers
    out = _cli(capsys, "stats", topic_name, "billing")
    assert (_row(out, "delayed"), _row(out, "backlog")) == (2, 3)
    assert _row(out, "dead-lettered (over its life)") == 0
    assert _row(_cli(capsys, "stats", source, "s"), "dead-lettered (over its life)") == 3
    assert f"{dlq} holds 3 messages" in _cli(capsys, "stats", dlq)
    # the topic holds 5 messages and 2 cancel markers, whatever its subscriptions
    assert f"{topic_name} holds 7 messages" in _cli(capsys, "stats", topic_name)

    # And so does the console: per subscription on its rows, what it holds for a topic
    server = _Server(create_app(cluster, allow_writes=False, sample_every_s=60))
    try:
        status, _, page = _get(f"{server.url}/topics")
        assert status == 200
        row = _cells(page, "data-topic", topic_name)
        assert (_n(row[4]), _n(row[5])) == (7, 2)  # messages held, delayed (the most of one)
        assert _n(_cells(page, "data-topic", dlq)[4]) == 3
        status, _, page = _get(f"{server.url}/topics/{topic_name}")
        assert status == 200
        for sub in ("billing", "checkout"):
            cells = _cells(page, "data-subscription", f"{topic_name}/{sub}")
            assert (_n(cells[4]), _n(cells[5])) == (2, 3), (sub, cells)  # delayed, backlog
        status, _, page = _get(f"{server.url}/topics/{source}/subscriptions/s")
        assert status == 200
        found = re.search(
            r"dead-lettered \(moved to the dead-letter topic, over its life\)"
            r"</th><td class=\"n\">([\d,]+)<",
            page,
        )
        assert found and _n(found.group(1)) == 3
        status, _, page = _get(f"{server.url}/topics/{topic_name}/subscriptions/billing")
        assert status == 200
        for chart in ("due-hour", "due-day"):  # the 2 left, not the 2 cancelled
            svg = re.search(rf'id="{chart}"(.*?)</svg>', page, re.S)
            assert svg, chart
            assert sum(int(n) for n in re.findall(r'data-count="(\d+)"', svg.group(1))) == 2
    finally:
        server.stop()
