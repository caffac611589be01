"""Operations on one client's subscriptions and messages: cancel messages, look at what
is scheduled (peek, the due histogram), move a cursor, read a topic, redrive dead
letters. What ``Cluster.cancel``, ``peek``, ``reset_cursor`` and the rest do; their
docstrings are on :class:`~raydelay.client.connection.Cluster`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.message import (
    Message,
    MessageId,
    check_key,
    messages_from_batch,
    time_ms_of,
)
from raydelay.client.peers import ClusterPeers, Session
from raydelay.client.reader import Reader
from raydelay.client.redrive import redrive
from raydelay.client.topics import Topics
from raydelay.errors import InvalidArgument
from raydelay.limits import NO_LIMIT, check_limit
from raydelay.storage.keys import validate_name
from raydelay.subscription_types import spreads


class Operations:
    """The operations side of one client, over its topics side."""

    def __init__(self, peers: ClusterPeers, session: Session, topics: Topics) -> None:
        self._peers = peers
        self._session = session
        self._topics = topics
        self._cursors = topics.cursors

    def cancel(self, message_ids: Any) -> list[bool]:
        """See :meth:`Cluster.cancel`."""
        if isinstance(message_ids, (str, MessageId)) or not hasattr(message_ids, "__iter__"):
            raise InvalidArgument(
                f"message_ids: expected a list of message ids, got {type(message_ids).__name__}"
            )
        ids = [m if isinstance(m, MessageId) else MessageId.parse(m) for m in message_ids]
        by_topic: dict[str, list[int]] = {}
        for i, mid in enumerate(ids):
            by_topic.setdefault(mid.topic, []).append(i)
        outcome = [False] * len(ids)
        producers: dict[str, Any] = {}
        try:
            for topic in by_topic:  # (NotFound for an unknown topic: nothing is written)
                producers[topic] = self._topics.create_producer(topic)
            if len(by_topic) > 1:  # all or nothing: every topic's targets checked first
                for topic, where in by_topic.items():
                    producers[topic].check_cancel([ids[i] for i in where])
            for topic, where in by_topic.items():
                done = producers[topic].cancel_many([ids[i] for i in where])
                for i, ok in zip(where, done, strict=True):
                    outcome[i] = bool(ok)
        finally:
            for producer in producers.values():
                producer.close()
        return outcome

    def cancel_keys(self, topic: Any, key: Any, keys: Any) -> bool | list[bool]:
        """See :meth:`Cluster.cancel` (by key)."""
        if not isinstance(topic, str):
            raise InvalidArgument(
                f"topic: a cancel by key names its topic first, got {type(topic).__name__}"
            )
        if key is not None and keys is not None:
            raise InvalidArgument("key: give key or keys, not both")
        one = key is not None
        if one and not isinstance(key, str):
            raise InvalidArgument(f"key: expected a str, got {type(key).__name__}")
        wanted = [key] if one else keys
        if isinstance(wanted, str) or not isinstance(wanted, (list, tuple)):
            raise InvalidArgument(f"keys: expected a list of str, got {type(wanted).__name__}")
        producer = self._topics.create_producer(topic)  # (NotFound for an unknown topic)
        try:
            out = producer.cancel_keys(list(wanted)) if wanted else []
        finally:
            producer.close()
        return out[0] if one else out

    def due_histogram(
        self, topic: str, subscription: str, windows_s: tuple[float, ...] = (60, 3600, 86400)
    ) -> list[tuple[str, int]]:
        """See :meth:`Cluster.due_histogram`."""
        if not windows_s or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0 for w in windows_s
        ):
            raise InvalidArgument(f"windows_s: expected positive seconds, got {windows_s!r}")
        if list(windows_s) != sorted(windows_s):
            raise InvalidArgument(f"windows_s: must increase, got {windows_s!r}")
        n = self._peers.partitions(topic)
        self._peers.subscription_options(topic, subscription)
        now = time.time_ns() // 1_000_000
        edges = [now + int(w * 1000) + 1 for w in windows_s]  # window i: due <= now + w
        parts = self._peers.call(
            lambda: [
                self._peers.on_subscription(
                    topic, p, subscription, SubscriptionHost.due_histogram, edges
                )
                for p in range(n)
            ],
            "subscription",
        )
        totals = [sum(col) for col in zip(*parts, strict=True)]
        labels = [f"<= {_span(w)}" for w in windows_s] + ["later"]
        return list(zip(labels, totals, strict=True))

    # --- operations ---------------------------------------------------------------------------

    def peek(
        self,
        topic: str,
        subscription: str,
        limit: int,
        due_after: int | datetime | None,
        due_before: int | datetime | None,
        key: str | None,
    ) -> list[Message]:
        """See :meth:`Cluster.peek`."""
        lim = check_limit("limit", limit)
        lim = NO_LIMIT if lim == sys.maxsize else lim
        after = None if due_after is None else time_ms_of("due_after", due_after)
        before = None if due_before is None else time_ms_of("due_before", due_before)
        if after is not None and before is not None and before <= after:
            raise InvalidArgument(
                f"due_before: must be after due_after ({after}), got {before}: the range is empty"
            )
        check_key(key)
        n = self._peers.partitions(topic)
        options = self._peers.subscription_options(topic, subscription)
        if not spreads(options["type"]):
            raise InvalidArgument(
                f"subscription: {topic}/{subscription} is {options['type']}: it delivers in log "
                "order and ignores deliver_at, so nothing of it waits for a due time"
            )
        self._session.flush_acks(topic)
        batches = self._peers.call(
            lambda: [
                self._peers.on_subscription(
                    topic, p, subscription, SubscriptionHost.peek, lim, after, before, key
                )
                for p in range(n)
            ],
            "subscription",
        )
        found = [m for p, b in enumerate(batches) for m in messages_from_batch(topic, p, b)]
        found.sort(
            key=lambda m: (
                -1 if m.deliver_at_ms is None else m.deliver_at_ms,
                m.message_id.partition,
                m.message_id.ledger_id,
                m.message_id.entry_id,
            )
        )
        return found if lim == NO_LIMIT else found[:lim]

    def reset_cursor(self, topic: str, subscription: str, to: Any) -> dict[int, list[int]]:
        """See :meth:`Cluster.reset_cursor`."""
        n = self._peers.partitions(topic)
        self._peers.subscription_options(topic, subscription)  # NotFound
        self._session.flush_acks(topic)
        holders = self._topics.stats(topic, subscription)["consumers"]
        if holders:
            raise InvalidArgument(
                f"subscription: {topic}/{subscription} has {len(holders)} consumer(s) "
                f"({', '.join(sorted(holders))}); close them first (a consumer killed holds its "
                "lease for subscription.consumer_lease_s), or call Consumer.seek on one"
            )
        return self._cursors.reset(topic, subscription, n, to)

    def create_reader(
        self, topic: str, start: Any = "earliest", *, inclusive: bool = False
    ) -> Reader:
        """See :meth:`Cluster.create_reader`."""
        if not isinstance(inclusive, bool):
            raise InvalidArgument(f"inclusive: expected True or False, got {inclusive!r}")
        n = self._peers.partitions(topic)
        peers = [self._peers.topic_peer(topic, p) for p in range(n)]
        starts = self._cursors.read_from(topic, n, start, inclusive, "start")
        if len(starts) < n:
            starts = {p: (-1, 0) for p in range(n)} | starts
        return Reader(
            topic,
            peers,
            starts,
            resolve=lambda to, inclusive: self._cursors.read_from(topic, n, to, inclusive, "to"),
            tails=lambda: self._peers.on_partitions(topic, n, HostActor.tail),
        )

    def redrive(
        self,
        dead_letter_topic: str,
        to_topic: str | None = None,
        limit: int | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """See :meth:`Cluster.redrive`."""
        lim = -1 if limit is None else check_limit("limit", limit)
        lim = NO_LIMIT if lim == sys.maxsize else lim
        if to_topic is not None:
            validate_name("to_topic", to_topic)
        self._peers.partitions(dead_letter_topic)  # NotFound
        return redrive(self._topics, dead_letter_topic, to_topic, lim, progress)


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
