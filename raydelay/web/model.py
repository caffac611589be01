"""What the console's pages show, gathered from a :class:`~raydelay.client.connection.Cluster`
into plain dicts and lists: no HTML here.

Every call into the cluster goes through one lock: the pages run on a thread pool, the
rate sampler on its own thread, and one client serves them all.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from raydelay.client.cancels import check_cancel_target
from raydelay.client.message import MessageId
from raydelay.client.redrive import SUBSCRIPTION as REDRIVE_SUBSCRIPTION
from raydelay.client.redrive import check_redrive_target
from raydelay.dispatch import counts, stages
from raydelay.errors import InvalidArgument, NotFound
from raydelay.subscription_types import spreads
from raydelay.tasks.spec import PROP_SCHEDULE, PROP_TASK

if TYPE_CHECKING:
    from raydelay.client.connection import Cluster

HOUR_BIN_S = 300  # the next hour, in 5-minute bars
DAY_BIN_S = 3600  # the next day, in hourly bars
PAYLOAD_PREVIEW = 120  # characters of a payload shown in the browser
MAX_PAGE = 1000  # messages on one page of the scheduled-messages browser
# how far the browser pages (the messages before a page are read to find it: past this,
# narrow the range with "due after"), and how many scheduled messages a cancel's
# confirmation looks through to find the ids it names
MAX_OFFSET = 100_000
CHECK_SCAN = MAX_OFFSET + MAX_PAGE
MIN_REFRESH_S = 5  # auto-refresh: every page asks every partition, so not more often
MAX_REFRESH_S = 3600
READ_DEADLINE_S = 2.0  # how long a page's read retries an actor that does not answer


@dataclass(frozen=True)
class Bin:
    """One bar of a due chart: messages due up to ``end_s`` seconds from now (and after
    the previous bar's end; the first bar also holds the overdue ones)."""

    label: str
    end_s: int | None  # None: the bar of everything later
    count: int


class RateSampler:
    """Append rates per partition: the topics' appended-entry counters read every
    ``every_s`` seconds on a thread of its own, a rate being the change between the last two
    reads. A counter that went back (its host restarted) gives no rate until the next read."""

    def __init__(self, source: ConsoleData, every_s: float = 5.0) -> None:
        self._source = source
        self._every_s = every_s
        self._last: dict[tuple[str, int], tuple[float, int]] = {}
        self._rates: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-rates", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a cluster restarting: the next read tries again
                pass
            self._stop.wait(self._every_s)

    def sample(self) -> None:
        """Read every partition's appended-entry counter once."""
        now = time.monotonic()
        counts = self._source.appended_counts()
        with self._guard:
            for part, n in counts.items():
                before = self._last.get(part)
                self._last[part] = (now, n)
                if before is None or n < before[1] or now <= before[0]:
                    self._rates.pop(part, None)
                else:
                    self._rates[part] = (n - before[1]) / (now - before[0])

    def rate(self, topic: str, partition: int) -> float | None:
        """Entries appended a second, or None before two reads."""
        with self._guard:
            return self._rates.get((topic, partition))


class ConsoleData:
    """The console's reads and actions on one cluster client."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.RLock()
        self.lock = self._lock  # (the tasks page reads under it too)
        # the pages read through a view of the client that gives up on an unreachable
        # actor after READ_DEADLINE_S (its row says so), not after the client's 30 s: a
        # page over many topics must not wait that long per dead subscription; the actions
        # use the client itself
        self._reads = cluster.with_retry_deadline(READ_DEADLINE_S)

    def _stats(self, topic: str, subscription: str | None = None) -> dict:
        with self._lock:
            return self._reads.stats(topic, subscription)

    def subscription_options(self, topic: str, name: str) -> dict:
        """A subscription's options (its type, dead-letter topic...); NotFound without it."""
        with self._lock:
            return self._reads._subscription_options(topic, name)

    # --- dead letters -------------------------------------------------------------------------

    def dead_letter_topic(self, topic: str, name: str, known: set[str]) -> str | None:
        """The subscription's dead-letter topic (its option, else ``<topic>-<name>-DLQ``) when
        it is among ``known`` (the topics that exist), else None."""
        options = self.subscription_options(topic, name)
        dlq = options.get("dead_letter_topic") or f"{topic}-{name}-DLQ"
        return dlq if dlq in known else None

    def check_redrive(self, dlq: str, to_topic: str | None) -> None:
        """What the redrive itself checks first (the topics exist, and differ), before a
        confirmation is asked for."""
        with self._lock:
            partitions = self._reads.topics()

        def partitions_of(topic: str) -> int:
            if topic not in partitions:
                raise NotFound(f"there is no topic {topic!r}")
            return partitions[topic]

        check_redrive_target(partitions_of, dlq, to_topic)

    def dead_letters(self, dlq: str) -> int:
        """The dead letters ``dlq`` holds, waiting for a redrive: once a redrive has run,
        what its subscription has not taken yet (its backlog); before, every entry of the
        topic's ledgers (a topic without subscriptions deletes none)."""
        info = self._stats(dlq)
        if REDRIVE_SUBSCRIPTION in info["subscriptions"]:
            return int(self._stats(dlq, REDRIVE_SUBSCRIPTION)["backlog"])
        return sum(
            counts.partition_entries(s["ledgers"], s.get("tail")) for s in info["partitions"]
        )

    def dead_letter_link(self, topic: str, name: str, known: set[str]) -> dict | None:
        """{name, count} of the subscription's dead-letter topic, or None without one; a
        count that cannot be read now is None."""
        dlq = self.dead_letter_topic(topic, name, known)
        if dlq is None:
            return None
        try:
            count: int | None = self.dead_letters(dlq)
        except Exception:  # noqa: BLE001 - deleted meanwhile, unreachable: the link stays
            count = None
        return {"name": dlq, "count": count}

    def with_dead_letters(self, rows: list[dict]) -> list[dict]:
        """Subscription rows, each given ``dlq`` (:meth:`dead_letter_link`; None where it has
        no dead-letter topic or cannot be read)."""
        known = set(self.topic_names())
        for row in rows:
            try:
                row["dlq"] = self.dead_letter_link(row["topic"], row["name"], known)
            except Exception:  # noqa: BLE001 - the row's own error says why
                row["dlq"] = None
        return rows

    # --- topics -----------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        with self._lock:
            return sorted(self._reads.topics())

    def appended_counts(self) -> dict[tuple[str, int], int]:
        out = {}
        for topic in self.topic_names():
            info = self._stats(topic)
            for p, s in enumerate(info["partitions"]):
                out[(topic, p)] = int(s["entries"])
        return out

    def topics(self, rates: RateSampler | None) -> list[dict]:
        """Each topic: partitions (host, ledgers, entries appended, tail, append rate), its
        subscriptions and their backlogs."""
        out = []
        for topic in self.topic_names():
            try:
                out.append(self.topic(topic, rates))
            except Exception as exc:  # noqa: BLE001 - deleted since the listing, unreachable
                out.append({"name": topic, "error": str(exc).splitlines()[0][:200]})
        return out

    def topic(self, topic: str, rates: RateSampler | None) -> dict:
        info = self._stats(topic)
        with self._lock:
            hosts = self._reads.partition_hosts(topic)
        parts = []
        for p, s in enumerate(info["partitions"]):
            tail = s.get("tail")
            parts.append(
                {
                    "partition": p,
                    "host": hosts[p] if p < len(hosts) else "",
                    "ledgers": len(s["ledgers"]),
                    "entries": int(s["entries"]),
                    "tail": f"{tail[0]}:{tail[1]}" if tail else "",
                    "rate": None if rates is None else rates.rate(topic, p),
                }
            )
        subs = self.with_dead_letters(
            [self.subscription_row(topic, name) for name in info["subscriptions"]]
        )
        known = [p["rate"] for p in parts if p["rate"] is not None]
        # what the topic itself holds, not a sum over its subscriptions (their own figures
        # are on their rows): see raydelay.dispatch.counts.topic_counts
        own = counts.topic_counts(info["partitions"], subs)
        return {
            "name": topic,
            "partitions": parts,
            "subscriptions": subs,
            "rate": sum(known) if known else None,
            "held": own["entries"],
            "delayed": own["delayed"],
        }

    def subscription_row(self, topic: str, name: str) -> dict:
        """A subscription's summary, or its row saying why it cannot be read now (an actor
        restarting, say): one subscription does not take a whole page down."""
        try:
            return self.subscription_summary(topic, name)
        except Exception as exc:  # noqa: BLE001 - Ray's own errors too: the row says so
            return {
                "topic": topic,
                "name": name,
                "type": "",
                "consumers": None,
                "delayed": None,
                "backlog": None,
                "pending_ack": None,
                "buckets": None,
                "dead_lettered": None,
                "error": str(exc).splitlines()[0][:200],
            }

    # --- subscriptions ------------------------------------------------------------------------

    def subscription_summary(self, topic: str, name: str) -> dict:
        s = self._stats(topic, name)
        return {
            "topic": topic,
            "name": name,
            "type": s["type"],
            "consumers": len(s["consumers"]),
            "delayed": int(s["delayed"]),
            "counting": list(s.get("counting", [])),
            "backlog": int(s["backlog"]),
            "pending_ack": int(s["pending_ack"]),
            "buckets": int(s["buckets"]),
            "dead_lettered": int(s["dead_lettered"]),
        }

    def subscriptions(self) -> list[dict]:
        out = []
        for topic in self.topic_names():
            try:
                names = self._stats(topic)["subscriptions"]
            except Exception:  # noqa: BLE001 - the topics page says why
                continue
            for name in names:
                out.append(self.subscription_row(topic, name))
        return self.with_dead_letters(out)

    def subscription(self, topic: str, name: str) -> dict:
        """A subscription's numbers, its consumers (in flight, last heard from) and its
        lateness histogram."""
        s = self._stats(topic, name)
        lease_s = self.cluster.config.subscription.consumer_lease_s
        consumers = [
            {
                "id": cid,
                "in_flight": int(c["unacked"]),
                "last_heard_s": float(c["lease_age_s"]),
                "lease_s": float(lease_s),
            }
            for cid, c in sorted(s["consumers"].items())
        ]
        edges = s["lateness"]["edges_ms"]
        counts = s["lateness"]["counts"]
        labels = [f"<={_ms(e)}" for e in edges] + [f">{_ms(edges[-1])}"]
        return {
            "topic": topic,
            "name": name,
            "type": s["type"],
            "delayed": int(s["delayed"]),
            "counting": list(s.get("counting", [])),
            "partitions": len(s.get("partitions", ())),
            "backlog": int(s["backlog"]),
            "pending_ack": int(s["pending_ack"]),
            "buckets": int(s["buckets"]),
            "redelivery": int(s["redelivery"]),
            "dead_letter_pending": int(s["dead_letter_pending"]),
            "dead_lettered": int(s["dead_lettered"]),
            "delivered": int(s["delivered"]),
            "acked": int(s["acked"]),
            "cancelled": int(s["cancelled"]),
            "consumers": consumers,
            "lateness": [
                {"label": label, "count": int(n)} for label, n in zip(labels, counts, strict=True)
            ],
            "stages": [
                row
                | {"p50": stages.edge_label(row["p50_ms"]), "p99": stages.edge_label(row["p99_ms"])}
                for row in stages.summary(s["lateness"].get("stages", {}))
                if row["measured"]
            ],
            "schedulable": spreads(s["type"]),
        }

    def due_bins(self, topic: str, name: str, span_s: int, step_s: int) -> list[Bin]:
        """Pending delayed messages due in each ``step_s`` of the next ``span_s`` seconds
        (the first bar also holds the overdue ones), then one bar for everything later."""
        windows = tuple(range(step_s, span_s + 1, step_s))
        with self._lock:
            hist = self._reads.due_histogram(topic, name, windows_s=windows)
        bins = []
        for (_, n), end in zip(hist, [*windows, None], strict=True):
            if end is None:
                label = "later"
            elif end == step_s:  # (the overdue ones too)
                label = f"now-{_span(end)}"
            else:
                label = f"{_span(end - step_s)}-{_span(end)}"
            bins.append(Bin(label, end, int(n)))
        return bins

    # --- scheduled messages ---------------------------------------------------------------------

    def scheduled(
        self,
        topic: str,
        name: str,
        limit: int,
        due_after: int | None,
        due_before: int | None,
        key: str | None,
        offset: int = 0,
    ) -> tuple[list[dict], bool]:
        """A page of the scheduled messages: ``limit`` of them after the first ``offset``,
        in delivery order, and whether more follow. The messages before the page are read
        to find it (peek has no cursor), which is why ``offset`` is bounded (MAX_OFFSET)."""
        with self._lock:
            found = self._reads.peek(
                topic,
                name,
                limit=offset + limit + 1,
                due_after=due_after,
                due_before=due_before,
                key=key,
            )
        now = time.time() * 1000
        rows = [
            {
                "id": str(m.message_id),
                "deliver_at": _iso(m.deliver_at_ms),
                "due_in": _due_in(m.deliver_at_ms, now),
                "key": m.key,
                "properties": m.properties,
                "redelivery_count": m.redelivery_count,
                "size": len(m.payload),
                "preview": _task_preview(m.properties) or _preview(m.payload),
            }
            for m in found[offset : offset + limit]
        ]
        return rows, len(found) > offset + limit

    def uncancellable(self, ids: list[str], topic: str | None, name: str | None) -> dict[str, str]:
        """Why some of ``ids`` cannot be cancelled, checked before a cancel is confirmed.

        Each id must name a topic that exists, a partition it has and a message position
        (InvalidArgument otherwise, the same check a cancel makes). Given the subscription
        the ids were chosen from (``topic``/``name``), an id of that topic that is not
        among its first CHECK_SCAN scheduled messages is returned with the reason: it was
        delivered, acknowledged or cancelled already (or never delayed). Past CHECK_SCAN,
        or for ids of other topics, the cancel itself says."""
        parsed = [MessageId.parse(i) for i in ids]
        with self._lock:
            partitions = self._reads.topics()  # topic -> its partition count
        for mid in parsed:
            if mid.topic not in partitions:
                raise InvalidArgument(f"id {mid}: there is no topic {mid.topic!r}")
            check_cancel_target(f"id {mid}", mid, mid.topic, partitions[mid.topic])
        if not topic or not name or not any(m.topic == topic for m in parsed):
            return {}
        if not spreads(self.subscription_options(topic, name)["type"]):
            return {}  # (nothing of it is scheduled: peek refuses it)
        with self._lock:
            found = self._reads.peek(topic, name, limit=CHECK_SCAN)
        if len(found) >= CHECK_SCAN:
            return {}
        scheduled = {str(m.message_id) for m in found}
        why = (
            f"not scheduled in {topic} / {name}: delivered, acknowledged or cancelled "
            "already (or never delayed)"
        )
        return {str(m): why for m in parsed if m.topic == topic and str(m) not in scheduled}

    # --- actions ------------------------------------------------------------------------------

    def cancel(self, ids: list[str]) -> list[tuple[str, bool]]:
        with self._lock:
            outcome = self.cluster.cancel(ids)
        return list(zip(ids, outcome, strict=True))

    def reset_cursor(self, topic: str, name: str, to: Any) -> dict[int, list[int]]:
        with self._lock:
            return self.cluster.reset_cursor(topic, name, to)

    def redrive(self, dlq: str, to_topic: str | None, limit: int) -> int:
        with self._lock:
            return int(self.cluster.redrive(dlq, to_topic, limit))


# --- input -------------------------------------------------------------------------------------


def parse_time(field: str, text: str | None) -> int | None:
    """A time from a form: epoch ms, or ISO-8601 (a time without a zone is UTC, as the
    console shows times). None for an empty field."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        value = int(text)
        if not 0 <= value < 2**53:
            raise InvalidArgument(f"{field}: epoch ms out of range, got {text}")
        return value
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            f"{field}: expected an ISO-8601 time (2026-11-25T20:00, UTC unless it has a zone) "
            f"or epoch ms, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def parse_limit(text: str | None, default: int = 100) -> int:
    """The page size of the scheduled-messages browser: 1 to MAX_PAGE."""
    return _whole("limit", text, default, 1, MAX_PAGE, "messages a page")


def parse_offset(text: str | None) -> int:
    """Where a page of the scheduled-messages browser starts: 0 to MAX_OFFSET messages in."""
    return _whole("offset", text, 0, 0, MAX_OFFSET, "messages in (narrow with due after)")


def parse_refresh(text: str | None) -> int | None:
    """A page's auto-refresh period: None (off, the default) or MIN_REFRESH_S to
    MAX_REFRESH_S seconds."""
    if text is None or not text.strip():
        return None
    return _whole("refresh", text, 0, MIN_REFRESH_S, MAX_REFRESH_S, "seconds")


def _whole(field: str, text: str | None, default: int, lo: int, hi: int, unit: str) -> int:
    """A whole number from a query string, ``lo`` to ``hi``; ``default`` when empty."""
    if text is None or not text.strip():
        return default
    try:
        n = int(text)
    except ValueError:
        raise InvalidArgument(f"{field}: expected a whole number, got {text!r}") from None
    if not lo <= n <= hi:
        raise InvalidArgument(f"{field}: expected {lo} to {hi} {unit}, got {n}")
    return n


# --- formatting --------------------------------------------------------------------------------


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _due_in(ms: int | None, now_ms: float) -> str:
    if ms is None:
        return "now"
    delta_s = (ms - now_ms) / 1000
    if delta_s <= 0:
        return "due"
    return "in " + _span(delta_s)


def _span(seconds: float) -> str:
    """12s, 5m, 1h30m, 2d: the shortest exact-enough form of a duration."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, r = divmod(s, 60)
        return f"{m}m" if r == 0 or m >= 10 else f"{m}m{r}s"
    if s < 86400:
        h, r = divmod(s, 3600)
        return f"{h}h" if r < 60 else f"{h}h{r // 60}m"
    d, r = divmod(s, 86400)
    return f"{d}d" if r < 3600 else f"{d}d{r // 3600}h"


def _ms(ms: int) -> str:
    return f"{ms // 1000}s" if ms >= 1000 else f"{ms}ms"


def _task_preview(properties: dict[str, str]) -> str | None:
    """A scheduled call's payload, said in words: what it calls (its arguments are
    pickled, and the console unpickles nothing)."""
    target = properties.get(PROP_TASK)
    if target is None:
        return None
    schedule = properties.get(PROP_SCHEDULE)
    return f"a call of {target}" + (f" (schedule {schedule})" if schedule else "")


def _preview(payload: bytes) -> str:
    """The start of a payload as text where it is UTF-8 text, else as hex."""
    head = payload[: PAYLOAD_PREVIEW * 4]
    text: str | None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut_in_a_character = len(head) < len(payload) and exc.start >= len(head) - 3
        text = head[: exc.start].decode("utf-8") if cut_in_a_character else None
    if text is None or any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return payload[: PAYLOAD_PREVIEW // 2].hex() + ("..." if len(payload) > 60 else "")
    if len(text) > PAYLOAD_PREVIEW or len(head) < len(payload):
        return text[:PAYLOAD_PREVIEW] + "..."
    return text
