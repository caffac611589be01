"""The web console in a real browser (Debian's chromium, driven by Playwright).

A console with writes allowed and a read-only one serve the session's cluster from this
process. The tests load every page, check that the due chart shows the counts that were
scheduled, follow a cancel from the checkbox to the store, and check that a read-only
console refuses actions. Under CI=true a missing browser fails; it never skips.

RAYDELAY_SCREENSHOTS=<dir> keeps a PNG of each page there (docs/img holds the ones the
docs show).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import now_ms, wait_until

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MIN = 60_000


def _chromium() -> str:
    path = os.environ.get("RAYDELAY_CHROMIUM") or shutil.which("chromium")
    if path is None:
        why = "Debian's chromium is not installed (`make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("playwright is not installed (it is in the dev extra)")
        pytest.skip("playwright is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class _Server:
    """The console app on a free 127.0.0.1 port, served by uvicorn on a thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        wait_until("the console serves", lambda: self.server.started)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture(scope="module")
def scene(ray_cluster):
    """A topic of 2 partitions with a shared subscription and messages due at known times,
    and the two consoles over it."""
    from raydelay.web import create_app

    cluster = ray_cluster
    topic = f"console-orders-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=2)
    cluster.subscribe(topic, "billing").close()  # the subscription stays; nobody consumes
    cluster.subscribe(topic, "audit", subscription_type="exclusive").close()
    base = now_ms()
    plan = {  # minutes from now -> how many, and their key
        0.5: (5, "soon"),
        7: (30, "k-cancel"),
        27: (20, "later"),
        150: (12, "tonight"),
    }
    producer = cluster.create_producer(topic)
    due: list[int] = []
    for minutes, (n, key) in plan.items():
        for i in range(n):
            at = base + int(minutes * MIN) + i
            producer.send(
                f'{{"order": "{key}-{i}"}}'.encode(), key=key, deliver_at=at, on_duplicate="allow"
            )
            due.append(at)
    producer.close()
    writes = _Server(create_app(cluster, allow_writes=True, sample_every_s=0.5))
    readonly = _Server(create_app(cluster, allow_writes=False, sample_every_s=0.5))
    try:
        yield {"cluster": cluster, "topic": topic, "due": due, "rw": writes, "ro": readonly}
    finally:
        writes.stop()
        readonly.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    # a page asks every partition of every topic of the session's cluster: on a busy
    # 2-core runner that may take longer than Playwright's 30 s default
    pg.set_default_timeout(120_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert errors == [], f"the page raised: {errors}"


def _shot(pg, name: str) -> None:
    where = os.environ.get("RAYDELAY_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(where) / f"console-{name}.png"), full_page=True)


def _goto(pg, url: str) -> int:
    response = pg.goto(url)
    assert response is not None
    return response.status


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def test_every_page_loads(scene, page):
    rw, topic = scene["rw"], scene["topic"]
    assert _goto(page, rw.url + "/") == 200
    assert page.url.endswith("/topics")
    row = page.locator(f'#topics tr[data-topic="{topic}"]')
    assert row.count() == 1
    cells = row.locator("td").all_inner_texts()
    assert cells[1:3] == ["2", "2"]  # partitions, subscriptions
    # every partition shows the host that serves it
    hosts = scene["cluster"].partition_hosts(topic)
    assert all(h.startswith("host/") for h in hosts)
    listed = page.locator("#partitions tr", has_text=topic).all_inner_texts()
    assert len(listed) == 2 and all(any(h in r for h in hosts) for r in listed)
    _shot(page, "topics")

    assert _goto(page, f"{rw.url}/topics/{_q(topic)}") == 200
    assert page.locator("h1").inner_text() == topic
    assert page.locator("#subscriptions tbody tr").count() == 2
    _shot(page, "topic")

    assert _goto(page, rw.url + "/subscriptions") == 200
    sub_row = page.locator(f'#subscriptions tr[data-subscription="{topic}/billing"]')
    assert sub_row.locator("td").nth(2).inner_text() == "shared"
    # backlog: every message not acknowledged; delayed: those not due yet (the first five
    # fall due 30 s after they were sent)
    delayed = int(sub_row.locator("td").nth(4).inner_text().replace(",", ""))
    backlog = int(sub_row.locator("td").nth(5).inner_text().replace(",", ""))
    assert backlog == len(scene["due"])
    assert len(scene["due"]) - 5 <= delayed <= len(scene["due"])
    _shot(page, "subscriptions")

    page.click(f'#subscriptions tr[data-subscription="{topic}/billing"] a >> nth=1')
    assert page.locator("h1").inner_text() == f"{topic} / billing"
    assert page.locator("#no-consumers").count() == 1
    assert page.locator("#lateness .bar").count() == 14
    _shot(page, "subscription")

    page.click("#browse")
    assert page.locator("h1").inner_text().startswith("Scheduled")
    assert page.locator("#scheduled tbody tr").count() == min(100, len(scene["due"]))
    _shot(page, "scheduled")

    # an exclusive subscription has no schedule: its page says so instead of a chart
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/audit") == 200
    assert page.locator("#due-hour, #due-day").count() == 0
    assert "ignores deliver_at" in page.locator("main").inner_text()


def test_the_chart_shows_the_scheduled_counts(scene, page):
    rw, topic = scene["rw"], scene["topic"]

    def expected(step_ms: int, bars: int, now: int) -> list[int]:
        counts = [0] * (bars + 1)
        for at in scene["due"]:
            if at <= now:  # due: the backlog, no longer a delayed message of the chart
                continue
            i = (at - now - 1) // step_ms  # bar i: due in (i*step, (i+1)*step]
            counts[min(i, bars)] += 1
        return counts

    def shown(chart: str) -> list[int]:
        bars = page.locator(f"#{chart} .bar")
        return [int(c) for c in bars.evaluate_all("els => els.map(e => e.dataset.count)")]

    # the page draws the bars as of its own instant, between these two: a load that
    # straddles a bar's edge is taken again
    for _ in range(3):
        before = now_ms()
        assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/billing") == 200
        after = now_ms()
        hour = expected(5 * MIN, 12, before)
        day = expected(60 * MIN, 24, before)
        if hour == expected(5 * MIN, 12, after) and day == expected(60 * MIN, 24, after):
            break
    assert shown("due-hour") == hour
    assert shown("due-day") == day
    # the count over a bar is the number in its tooltip
    busiest = max(range(12), key=lambda i: hour[i])
    bar = page.locator(f"#due-hour .bar >> nth={busiest}")
    label = "now-5m" if busiest == 0 else f"{busiest * 5}m-{busiest * 5 + 5}m"
    assert hour[busiest] >= 20
    assert bar.locator("title").text_content() == f"{label}: {hour[busiest]} due"
    assert bar.locator("text.count").text_content() == str(hour[busiest])


def test_a_cancel_end_to_end(scene, page):
    rw, topic, cluster = scene["rw"], scene["topic"], scene["cluster"]
    url = f"{rw.url}/topics/{_q(topic)}/subscriptions/billing/scheduled?key=k-cancel&limit=10"
    assert _goto(page, url) == 200
    rows = page.locator("#scheduled tbody tr")
    assert rows.count() == 10
    chosen = [rows.nth(i).get_attribute("data-id") for i in (0, 3)]
    for mid in chosen:
        page.check(f'input[name="id"][value="{mid}"]')
    page.click("#cancel-selected")
    # a confirmation first: nothing is cancelled yet
    assert "Cancel 2 scheduled messages?" in page.locator("#question").inner_text()
    assert sorted(page.locator("#details li").all_inner_texts()) == sorted(chosen)
    keys = [str(m.message_id) for m in cluster.peek(topic, "billing", limit=-1, key="k-cancel")]
    assert set(chosen) <= set(keys)
    _shot(page, "confirm")
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == "2 of 2 cancelled"
    _shot(page, "cancelled")
    left = [str(m.message_id) for m in cluster.peek(topic, "billing", limit=-1, key="k-cancel")]
    assert len(left) == len(keys) - 2 and not set(chosen) & set(left)
    page.click("#back")
    assert "key=k-cancel" in page.url
    shown = page.locator("#scheduled tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert not set(chosen) & set(shown)
    # the same ids again: nothing left to cancel, and the page says so before any
    # confirmation
    page.goto(url)
    page.fill('#cancel-ids-form textarea[name="ids"]', "\n".join(chosen))
    page.click('#cancel-ids-form button[type="submit"]')
    assert page.locator("#question").inner_text() == "None of the 2 messages can be cancelled."
    assert page.locator("#confirm").count() == 0
    refused = page.locator("#refused li").evaluate_all("els => els.map(e => e.dataset.id)")
    assert sorted(refused) == sorted(chosen)


def _post(url: str, fields: dict, headers: dict | None = None) -> tuple[int, str]:
    body = urllib.parse.urlencode(fields, doseq=True).encode()
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _get(url: str, headers: dict | None = None) -> tuple[int, Any, str]:
    """(status, headers (case-insensitive), body) of a GET."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=60
        ) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def _token(url: str, victim: str) -> str:
    """The form token of a console, read off the confirmation page of a cancel."""
    status, text = _post(url + "/actions/cancel", {"id": victim})
    assert status == 200
    found = re.search(r'name="token" value="([^"]+)"', text)
    assert found is not None
    return found.group(1)


def test_no_page_of_the_console_can_be_framed(scene, browser):
    # Given a page of another origin that frames the console's confirmation page
    rw, topic = scene["rw"], scene["topic"]
    status, headers, _ = _get(f"{rw.url}/topics/{_q(topic)}")
    assert status == 200
    assert headers["Content-Security-Policy"] == "frame-ancestors 'none'"
    assert headers["X-Frame-Options"] == "DENY"
    context = browser.new_context()
    try:
        evil = context.new_page()
        # (set_content returns once the page and its frame have loaded, or failed to)
        evil.set_content(f'<iframe id="f" src="{rw.url}/topics/{_q(topic)}"></iframe>')
        # Then the browser refuses to show it: the frame holds its error page, not the console
        child = [f for f in evil.frames if f != evil.main_frame]
        assert len(child) == 1 and child[0].url.startswith("chrome-error://")
    finally:
        context.close()


def test_a_foreign_host_is_refused(scene):
    # DNS rebinding: another site's name pointed at 127.0.0.1 reaches the console as that name
    rw, topic = scene["rw"], scene["topic"]
    status, _, text = _get(f"{rw.url}/topics/{_q(topic)}", {"Host": "evil.example"})
    assert status == 403 and "evil.example" in text and topic not in text
    port = rw.url.rsplit(":", 1)[1]
    assert _get(f"{rw.url}/topics", {"Host": f"localhost:{port}"})[0] == 200


def test_a_form_posted_from_another_origin_is_refused(scene):
    rw, topic, cluster = scene["rw"], scene["topic"], scene["cluster"]
    victim = str(cluster.peek(topic, "billing", limit=1, key="later")[0].message_id)
    token = _token(rw.url, victim)
    fields = {"id": victim, "token": token}
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Referer": "http://evil.example/page.html"},
    ):
        status, text = _post(rw.url + "/actions/cancel/confirm", fields, headers)
        assert status == 403 and "this console" in text and "posted from" in text
    assert victim in [str(m.message_id) for m in cluster.peek(topic, "billing", key="later")]
    # and its own origin passes the check (the confirmation page, not a cancel)
    status, text = _post(rw.url + "/actions/cancel", {"id": victim}, {"Origin": rw.url})
    assert status == 200 and "Cancel" in text


def test_an_unknown_page_is_the_consoles_own_404(scene, page):
    rw = scene["rw"]
    assert _goto(page, f"{rw.url}/no-such-page") == 404
    assert "There is no page '/no-such-page'" in page.locator("#error").inner_text()
    assert page.title().startswith("Not found")


def test_a_read_only_console_has_no_actions(scene, page):
    ro, topic, cluster = scene["ro"], scene["topic"], scene["cluster"]
    assert _goto(page, f"{ro.url}/topics/{_q(topic)}/subscriptions/billing/scheduled") == 200
    assert page.locator("#scheduled tbody tr").count() > 0
    assert page.locator('input[type="checkbox"], form[method="post"]').count() == 0
    assert page.locator(".mode").inner_text() == "read-only"
    assert _goto(page, f"{ro.url}/topics/{_q(topic)}/subscriptions/billing") == 200
    assert page.locator("#reset-form").count() == 0
    victim = str(cluster.peek(topic, "billing", limit=1, key="later")[0].message_id)
    status, text = _post(ro.url + "/actions/cancel/confirm", {"id": victim, "token": "x"})
    assert status == 403 and "--allow-writes" in text
    assert victim in [str(m.message_id) for m in cluster.peek(topic, "billing", key="later")]


def test_a_confirmation_needs_this_consoles_token(scene):
    rw, topic, cluster = scene["rw"], scene["topic"], scene["cluster"]
    victim = str(cluster.peek(topic, "billing", limit=1, key="later")[0].message_id)
    for token in ("", "forged"):
        status, text = _post(rw.url + "/actions/cancel/confirm", {"id": victim, "token": token})
        assert status == 400 and "token" in text
    assert victim in [str(m.message_id) for m in cluster.peek(topic, "billing", key="later")]


def test_bad_input_is_a_clear_error_page(scene, page):
    rw, topic = scene["rw"], scene["topic"]
    base = f"{rw.url}/topics/{_q(topic)}/subscriptions/billing/scheduled"
    assert _goto(page, base + "?due_after=yesterday-ish") == 400
    assert page.locator("#error").inner_text().startswith("due_after: expected an ISO-8601")
    assert _goto(page, base + "?limit=1000000") == 400
    assert "limit: expected 1 to 1000" in page.locator("#error").inner_text()
    assert _goto(page, base + "?due_after=2026-01-02T00:00&due_before=2026-01-01T00:00") == 400
    assert "due_before" in page.locator("#error").inner_text()
    assert _goto(page, f"{rw.url}/topics/no-such-topic-{uuid.uuid4().hex[:6]}") == 404
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/nobody") == 404
    status, text = _post(rw.url + "/actions/cancel", {"id": "not-a-message-id"})
    assert status == 400 and "message_id: &#39;not-a-message-id&#39; is not" in text


def test_reset_and_redrive_from_the_console(scene, page):
    rw, cluster = scene["rw"], scene["cluster"]
    topic = f"console-reset-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic)
    cluster.subscribe(topic, "replay").close()
    producer = cluster.create_producer(topic)
    ids = producer.send_many([b"a", b"b", b"c"])
    producer.close()
    wait_until("backlog 3", lambda: cluster.stats(topic, "replay")["backlog"] == 3)
    # reset to latest: the three are skipped
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/replay") == 200
    page.fill('#reset-form input[name="to"]', "latest")
    page.click('#reset-form button[type="submit"]')
    assert "to latest?" in page.locator("#question").inner_text()
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == f"{topic} / replay reset to latest"
    wait_until("backlog 0", lambda: cluster.stats(topic, "replay")["backlog"] == 0)
    # and back to the second message: it and the third are delivered again
    page.goto(f"{rw.url}/topics/{_q(topic)}/subscriptions/replay")
    page.fill('#reset-form input[name="to"]', str(ids[1]))
    page.click('#reset-form button[type="submit"]')
    page.click("#confirm")
    wait_until("backlog 2", lambda: cluster.stats(topic, "replay")["backlog"] == 2)

    # a dead-letter topic redriven into another topic, from its topic page
    dlq, target = f"{topic}-replay-DLQ", f"{topic}-target"
    cluster.create_topic(dlq)
    cluster.create_topic(target)
    cluster.subscribe(target, "check").close()
    producer = cluster.create_producer(dlq)
    producer.send_many([b"x", b"y", b"z"])
    producer.close()
    page.goto(f"{rw.url}/topics/{_q(topic)}/subscriptions/replay")
    assert page.locator("#redrive-form").count() == 1  # its dead-letter topic exists
    page.goto(f"{rw.url}/topics/{_q(dlq)}")
    page.fill('#redrive-form input[name="to_topic"]', target)
    page.click('#redrive-form button[type="submit"]')
    assert page.locator("#question").inner_text() == f"Send 3 messages from {dlq} to {target}?"
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == f"3 messages sent back from {dlq}"
    wait_until("backlog 3", lambda: cluster.stats(target, "check")["backlog"] == 3)


def test_the_console_command(scene, ray_cluster):
    import ray

    raydelay = str(Path(sys.executable).with_name("raydelay"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a port that cannot be used: one line, before attaching to anything
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        out = subprocess.run(
            [raydelay, "console", "--port", str(busy)], capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 2 and out.stderr.startswith("raydelay: error: port: cannot listen")
    out = subprocess.run(
        [raydelay, "console", "--port", "70000"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "port: expected 1 to 65535" in out.stderr

    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [raydelay, "--address", address, "console", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"raydelay console on http://127.0.0.1:{port} (read-only")

        # (the scene's own topic page: /topics asks every topic this session's tests made,
        # which on a loaded machine can outlast a request's timeout)
        page = f"http://127.0.0.1:{port}/topics/{scene['topic']}"
        failures: list[str] = []

        def serves() -> bool:
            try:
                with urllib.request.urlopen(page, timeout=30) as r:
                    return scene["topic"] in r.read().decode()
            except OSError as exc:
                failures.append(repr(exc))
                return False

        try:
            wait_until("the console command serves", serves, timeout_s=90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last failures: {failures[-3:]}") from None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stderr.read()


def test_the_lateness_chart_counts_first_deliveries(scene, page):
    rw, cluster = scene["rw"], scene["cluster"]
    topic = f"console-late-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic)
    consumer = cluster.subscribe(topic, "workers")
    producer = cluster.create_producer(topic)
    producer.send_many([b"1", b"2", b"3"], deliver_after=0.5)
    producer.send(b"now")  # immediate: not a delayed message, not counted
    producer.close()
    got = []
    wait_until("4 received", lambda: got.extend(consumer.receive(10, timeout_s=1)) or len(got) == 4)
    consumer.ack(got)
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/workers") == 200
    counts = page.locator("#lateness .bar").evaluate_all("els => els.map(e => +e.dataset.count)")
    assert sum(counts) == 3
    assert page.locator("#lateness-empty").count() == 0  # (measured: no "why empty" note)
    # and where it went, stage by stage (the consumer's own stage is measured in its process)
    rows = page.locator("#stages tbody tr").evaluate_all("els => els.map(e => e.id)")
    assert rows == ["stage-written", "stage-reached", "stage-waited"]
    shares = page.locator("#stages tbody tr td:last-child").all_inner_texts()
    assert all(s.endswith("%") or s == "-" for s in shares), shares
    assert page.locator("#consumers tbody tr").count() == 1
    consumer.close()


def _cells(pg, row: str) -> dict[str, str]:
    """A row of a table: header -> cell text."""
    heads = pg.locator("#subscriptions thead th").all_inner_texts()
    return dict(zip(heads, pg.locator(row).locator("td").all_inner_texts(), strict=True))


def test_dead_letters_in_plain_sight(scene, page):
    rw, cluster = scene["rw"], scene["cluster"]
    topic = f"console-dead-{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-billing-DLQ"
    cluster.create_topic(topic)
    consumer = cluster.subscribe(topic, "billing", max_redeliveries=1)
    producer = cluster.create_producer(topic)
    producer.send_many([b"poison-%d" % i for i in range(5)])
    producer.close()

    def dead_lettered() -> bool:  # every delivery nacked: each dead after its second
        got = consumer.receive(10, timeout_s=0.5)
        if got:
            consumer.nack(got)
        stats = cluster.stats(topic, "billing")
        return stats["backlog"] == 0 and dlq in cluster.topics()

    wait_until("5 messages dead-lettered", dead_lettered, timeout_s=60)
    consumer.close()
    # every page that concerns the subscription shows the 5 and links to the topic
    row = f'#subscriptions tr[data-subscription="{topic}/billing"]'
    for where in ("/subscriptions", f"/topics/{_q(topic)}"):
        assert _goto(page, rw.url + where) == 200
        assert _cells(page, row)["in its DLQ"] == "5"
        link = page.locator(f"{row} td.dead-letters a")
        assert link.get_attribute("href") == f"/topics/{_q(dlq)}"
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/billing") == 200
    assert page.locator("#dlq-summary").inner_text() == f"Dead letters: 5 in {dlq}"
    assert page.locator("#dlq-count").inner_text() == "5"
    _shot(page, "dead-letters")
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/billing/scheduled") == 200
    assert page.locator("#dlq-link").inner_text() == f"5 in {dlq}"
    page.click("#dlq-link")
    assert page.locator("h1").inner_text() == dlq
    assert "holding 5 dead letters" in page.locator("#dead-letters").inner_text()
    # redrive's confirmation gives the count: all five, or two of them
    page.goto(f"{rw.url}/topics/{_q(topic)}/subscriptions/billing")
    page.click('#redrive-form button[type="submit"]')
    assert page.locator("#question").inner_text() == (
        f"Send 5 messages from {dlq} back to the topic and partition each came from?"
    )
    page.goto(f"{rw.url}/topics/{_q(topic)}/subscriptions/billing")
    page.fill('#redrive-form input[name="limit"]', "2")
    page.click('#redrive-form button[type="submit"]')
    assert page.locator("#question").inner_text().startswith(f"Send 2 of the 5 messages from {dlq}")
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == f"2 messages sent back from {dlq}"
    # the three left, once a redrive has run (its subscription holds them)
    assert _goto(page, rw.url + "/subscriptions") == 200
    assert _cells(page, row)["in its DLQ"] == "3"


def test_ids_are_checked_before_the_confirmation(scene, page):
    rw, topic, cluster = scene["rw"], scene["topic"], scene["cluster"]
    live, gone = [str(m.message_id) for m in cluster.peek(topic, "billing", limit=2, key="later")]
    assert cluster.cancel([gone]) == [True]
    # a partition that does not exist, a topic that does not, a position that cannot be:
    # refused on the first post, no confirmation
    no_partition = f"{topic}/7/{live.rsplit('/', 1)[1]}"
    for ids, why in (
        ([live, no_partition], f"id {no_partition}: partition 7 does not exist ({topic} has 2)"),
        ([f"no-such-{topic}/0/1:1"], f"id no-such-{topic}/0/1:1: there is no topic"),
        ([f"{topic}/0/{1 << 62}:1"], "is no message position"),
        (["nothing-here"], "is not"),
    ):
        status, text = _post(rw.url + "/actions/cancel", {"ids": "\n".join(ids)})
        assert status == 400 and why.replace("'", "&#39;") in text, text
        assert 'id="confirm"' not in text
    # one cancelled already and one scheduled: only the second is asked about
    url = f"{rw.url}/topics/{_q(topic)}/subscriptions/billing/scheduled?key=later"
    assert _goto(page, url) == 200
    page.fill('#cancel-ids-form textarea[name="ids"]', f"{gone}, {live}")
    page.click('#cancel-ids-form button[type="submit"]')
    assert page.locator("#question").inner_text() == "Cancel 1 scheduled message?"
    assert page.locator("#details li").all_inner_texts() == [live]
    refused = page.locator("#refused li")
    assert refused.count() == 1 and refused.get_attribute("data-id") == gone
    assert "cancelled already" in refused.inner_text()
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == "1 of 1 cancelled"
    left = {str(m.message_id) for m in cluster.peek(topic, "billing", limit=-1, key="later")}
    assert live not in left


def test_a_redrive_is_checked_before_the_confirmation(scene):
    rw, topic, cluster = scene["rw"], scene["topic"], scene["cluster"]
    dlq = f"{topic}-checks-DLQ"
    cluster.create_topic(dlq)
    for fields, status, why in (
        (
            {"dead_letter_topic": dlq, "to_topic": f"no-such-{topic}"},
            404,
            "to_topic: there is no topic",
        ),
        ({"dead_letter_topic": dlq, "to_topic": dlq}, 400, "is the dead-letter topic itself"),
        ({"dead_letter_topic": f"no-such-{dlq}"}, 404, "dead_letter_topic: there is no topic"),
    ):
        got, text = _post(rw.url + "/actions/redrive", fields)
        assert got == status and why in text, text
        assert 'id="confirm"' not in text
    # a topic not named like a dead-letter topic is asked about with a warning
    got, text = _post(rw.url + "/actions/redrive", {"dead_letter_topic": topic})
    assert got == 200 and "is not named like a dead-letter topic" in text


def test_paging_past_the_first_thousand(scene, page):
    rw, cluster = scene["rw"], scene["cluster"]
    topic = f"console-pages-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=2)
    cluster.subscribe(topic, "many").close()
    producer = cluster.create_producer(topic)
    producer.send_many([b"%d" % i for i in range(1_050)], deliver_after=3600)
    producer.close()
    everything = [str(m.message_id) for m in cluster.peek(topic, "many", limit=-1)]
    assert len(everything) == 1_050
    base = f"{rw.url}/topics/{_q(topic)}/subscriptions/many/scheduled"

    def follow(link: str) -> None:  # (a page of 1,000 rows: read once it has all loaded)
        with page.expect_navigation():
            page.click(link)

    def shown() -> list[str]:
        rows = page.locator("#scheduled tbody tr")
        return rows.evaluate_all("rows => rows.map(r => r.dataset.id)")

    assert _goto(page, base + "?limit=1000") == 200
    first = shown()
    assert first == everything[:1000] and page.locator("#previous").count() == 0
    assert page.locator("#count").inner_text().startswith("Scheduled messages 1 to 1,000")
    follow("#next")
    assert shown() == everything[1000:] and page.locator("#next").count() == 0
    assert page.locator("#count").inner_text().startswith("Scheduled messages 1,001 to 1,050")
    follow("#previous")
    assert shown() == first
    # smaller pages walk the same order with nothing left out or shown twice
    walked: list[str] = []
    assert _goto(page, base + "?limit=300") == 200
    while True:
        walked.extend(shown())
        if page.locator("#next").count() == 0:
            break
        follow("#next")
    assert walked == everything
    _refused(
        base,
        "offset",
        {
            "-1": "offset: expected 0 to 100000",
            "100000000": "offset: expected 0 to 100000",
            "two": "offset: expected a whole number, got &#39;two&#39;",
        },
    )


def test_the_small_things(scene, page):
    rw, topic = scene["rw"], scene["topic"]
    # the article of an exclusive subscription
    assert _goto(page, f"{rw.url}/topics/{_q(topic)}/subscriptions/audit") == 200
    assert "An exclusive subscription delivers in log order" in page.locator("main").inner_text()
    # an empty lateness chart says why
    sub = f"{rw.url}/topics/{_q(topic)}/subscriptions/billing"
    before = now_ms() // 1000
    assert _goto(page, sub) == 200
    after = now_ms() // 1000
    bars = page.locator("#lateness .bar").evaluate_all("els => els.map(e => +e.dataset.count)")
    assert sum(bars) == 0
    assert "no lateness has been measured yet" in page.locator("#lateness-empty").inner_text()
    # every chart and count table says when it was read
    stamps = page.locator(".as-of").all_inner_texts()
    assert len(stamps) == 4  # numbers, the two due charts, lateness (consumers: none)
    read_at = {
        "as of " + datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S") + " UTC"
        for t in range(before, after + 1)
    }
    assert set(stamps) <= read_at, (stamps, read_at)
    assert _goto(page, rw.url + "/topics") == 200
    assert page.locator("#topics caption.as-of, #partitions caption.as-of").count() == 2
    # the favicon
    with urllib.request.urlopen(rw.url + "/favicon.ico", timeout=60) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "image/x-icon"
        assert r.read()[:4] == b"\x00\x00\x01\x00"  # an icon file
    assert page.locator('link[rel="icon"]').get_attribute("href") == "/favicon.ico"
    # error pages are titled plainly, not with the exception's name
    assert _goto(page, sub + "/scheduled?limit=ten") == 400
    assert page.title().startswith("Bad request")
    assert "InvalidArgument" not in page.content()
    # a POST to a page (or a GET of an action) is not allowed, and says how it is used
    status, text = _post(rw.url + "/topics", {"x": "1"})
    assert status == 405 and "<title>Not allowed" in text and "read with GET" in text


def test_auto_refresh_is_off_until_asked_for(scene, page):
    rw, topic = scene["rw"], scene["topic"]
    sub = f"{rw.url}/topics/{_q(topic)}/subscriptions/billing"
    assert _goto(page, sub) == 200
    refresh = page.locator('meta[http-equiv="refresh"]')
    assert refresh.count() == 0
    page.click("#refresh-on")
    assert page.url == sub + "?refresh=10"
    assert refresh.get_attribute("content") == "10"
    assert page.locator("#refresh").inner_text().startswith("reloads every 10 s")
    page.click("#refresh-off")
    assert page.url == sub and refresh.count() == 0
    # the filter of the browser is kept when it is turned on
    assert _goto(page, sub + "/scheduled?key=later") == 200
    page.click("#refresh-on")
    assert page.url == sub + "/scheduled?key=later&refresh=10"
    _refused(
        sub,
        "refresh",
        {
            "soon": "refresh: expected a whole number, got &#39;soon&#39;",
            "1": "refresh: expected 5 to 3600 seconds, got 1",
            "-10": "refresh: expected 5 to 3600 seconds, got -10",
        },
    )


def _refused(url: str, field: str, why: dict[str, str]) -> None:
    """Each value of ``field`` in ``why`` gets a 400 page saying why."""
    for bad, reason in why.items():
        status, _, text = _get(f"{url}?{field}={urllib.parse.quote(bad)}")
        assert status == 400 and reason in text, text


def test_the_tasks_page_shows_schedules_runs_and_calls_and_acts_on_schedules(scene, page):
    from tests.integration import task_jobs

    rw, ro, cluster = scene["rw"], scene["ro"], scene["cluster"]
    tasks_topic = cluster.config.tasks.topic
    # Given a schedule that ran twice and ended, a nightly one, and a call due in an hour
    tag = uuid.uuid4().hex[:6]
    brief, nightly = f"brief-{tag}", f"nightly-{tag}"
    cluster.start_runners(1)  # (up before the times below are taken)
    start = (now_ms() // 1000 + 3) * 1000
    cluster.schedule_cron(
        "* * * * * *", task_jobs.noop, name=brief, start_at=start, end_at=start + 1_000
    )
    cluster.schedule_cron("0 3 * * *", task_jobs.noop, name=nightly, overlap="skip")
    later = cluster.schedule(task_jobs.square, 4, deliver_after=3600)
    wait_until(
        "two runs recorded",
        lambda: len(cluster._tasks.schedules.last_runs(brief)) == 2,
        timeout_s=60,
    )
    # When the tasks page is opened
    assert _goto(page, rw.url + "/tasks") == 200
    assert page.locator("header nav a", has_text="Tasks").count() == 1
    row = page.locator(f'#schedules tr[data-schedule="{brief}"]')
    assert row.locator(".next").inner_text() == "ended"
    runs = row.locator(".runs .run").all_inner_texts()
    assert len(runs) == 2 and all(r.endswith(": succeeded") for r in runs)
    night = page.locator(f'#schedules tr[data-schedule="{nightly}"]')
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:00:00", night.locator(".next").inner_text())
    assert "skip" in night.inner_text() and "none yet" in night.inner_text()
    # ... the call due later shows what it calls, not pickled bytes
    call = page.locator(f'#next-calls tr[data-id="{later}"]')
    assert "tests.integration.task_jobs:square" in call.inner_text()
    _shot(page, "tasks")
    # Then the nightly schedule is paused, resumed and run now, each after a confirmation
    night.locator('button[data-action="pause"]').click()
    assert page.locator("#question").inner_text().startswith(f"Pause schedule {nightly}?")
    assert not [s for s in cluster.list_schedules() if s["name"] == nightly][0]["paused"]
    page.click("#confirm")
    assert page.locator("#summary").inner_text() == f"{nightly}: paused"
    assert [s for s in cluster.list_schedules() if s["name"] == nightly][0]["paused"]
    page.click("#back")
    night = page.locator(f'#schedules tr[data-schedule="{nightly}"]')
    assert night.locator(".next").inner_text() == "paused"
    night.locator('button[data-action="resume"]').click()
    page.click("#confirm")
    assert page.locator("#summary").inner_text().startswith(f"{nightly}: resumed; next at ")
    page.click("#back")
    page.locator(f'#schedules tr[data-schedule="{nightly}"] button[data-action="trigger"]').click()
    page.click("#confirm")
    summary = page.locator("#summary").inner_text()
    tid = summary.rsplit(" ", 1)[1]
    assert summary == f"{nightly}: triggered; task {tid}"
    wait_until("the triggered call ran", lambda: cluster.task_status(tid)["status"] == "succeeded")
    # ... the scheduled page of the tasks topic says what a call is, and refuses to cancel
    # the nightly schedule's armed occurrence
    assert (
        _goto(
            page, f"{rw.url}/topics/{_q(tasks_topic)}/subscriptions/runners/scheduled?key={nightly}"
        )
        == 200
    )
    (armed,) = page.locator("#scheduled tbody tr").all()
    assert "a call of tests.integration.task_jobs:noop (schedule " in armed.inner_text()
    occurrence = armed.get_attribute("data-id")
    status, text = _post(
        rw.url + "/actions/cancel/confirm", {"id": occurrence, "token": _token(rw.url, occurrence)}
    )
    assert status == 400 and f"the next occurrence of schedule &#39;{nightly}&#39;" in text
    # A read-only console shows the page without actions; bad actions are clear errors
    assert _goto(page, ro.url + "/tasks") == 200
    assert page.locator("#schedules form").count() == 0
    status, text = _post(rw.url + "/actions/schedule", {"name": nightly, "do": "explode"})
    assert status == 400 and "do: expected one of pause, resume, trigger" in text
    status, text = _post(rw.url + "/actions/schedule", {"name": "no-such", "do": "pause"})
    assert status == 404 and "no schedule called" in text
    for name in (brief, nightly):
        cluster.delete_schedule(name)
    assert cluster.cancel_task(later)
