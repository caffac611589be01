"""A consumer of several topics (Pulsar's multi-topic and pattern subscriptions).

``Cluster.subscribe(["a", "b"], "sub")`` subscribes ``sub`` on each topic and returns a
:class:`MultiTopicConsumer`: one :class:`~raydelay.client.consumer.Consumer` per topic
underneath, whose receive calls stand together, so one ``receive`` (or
``receive_batch``) waits on all of them at once and takes what any of them has. Each
message says its topic (``message.message_id.topic``). ``ack``, ``nack`` and
``redeliver_unacknowledged`` take messages of any of the topics and send each to its own.

``Cluster.subscribe(re.compile("orders-.*"), "sub")`` subscribes every topic whose whole
name matches the pattern, and looks for new ones at most every
``pattern_refresh_s`` (inside ``receive``); a topic created later is subscribed from its
earliest entry (with ``initial_position="earliest"``, the default), so nothing sent to it
before it was found is missed. A topic deleted is dropped.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import ray

from raydelay.client.consumer import Consumer, check_receive
from raydelay.client.message import Message, MessageBatch, MessageId
from raydelay.errors import InvalidArgument, NotFound

log = logging.getLogger(__name__)

PATTERN_REFRESH_S = 1.0  # how often a pattern consumer looks for new topics


class MultiTopicBatch:
    """The messages of one :meth:`MultiTopicConsumer.receive_batch`: a
    :class:`MessageBatch` per topic they came from (:attr:`batches`)."""

    def __init__(self, batches: list[MessageBatch]) -> None:
        self.batches = [b for b in batches if len(b)]

    def __len__(self) -> int:
        return sum(len(b) for b in self.batches)

    def __bool__(self) -> bool:
        return bool(self.batches)

    def __iter__(self) -> Iterator[Message]:
        for b in self.batches:
            yield from b

    def __repr__(self) -> str:
        return f"MultiTopicBatch(messages={len(self)}, topics={[b.topic for b in self.batches]})"

    @property
    def message_ids(self) -> list[MessageId]:
        return [i for b in self.batches for i in b.message_ids]

    def to_arrow(self) -> pa.Table:
        """One table of every message, with a ``topic`` column first."""
        tables = []
        for b in self.batches:
            t = b.to_arrow().replace_schema_metadata(None)
            tables.append(t.add_column(0, "topic", pa.array([b.topic] * t.num_rows, pa.string())))
        if not tables:
            empty = MessageBatch("", []).to_arrow().replace_schema_metadata(None)
            return empty.add_column(0, "topic", pa.array([], pa.string()))
        return pa.concat_tables(tables)


class MultiTopicConsumer:
    """A consumer of subscription ``subscription`` on several topics (see the module).
    ``join(topic)`` subscribes one topic and returns its consumer; ``topics_now()``
    lists the topics a pattern matches now (None: a fixed list)."""

    def __init__(
        self,
        subscription: str,
        consumers: dict[str, Consumer],
        *,
        join: Callable[[str], Consumer],
        topics_now: Callable[[], list[str]] | None = None,
        pattern: re.Pattern | None = None,
        pattern_refresh_s: float = PATTERN_REFRESH_S,
    ) -> None:
        self.subscription = subscription
        self.pattern = pattern
        self._consumers = dict(consumers)
        self._join = join
        self._topics_now = topics_now
        self._refresh_s = pattern_refresh_s
        self._refreshed = time.monotonic()
        self._next = 0  # the topic whose buffer is drained first next time (round robin)
        self._closed = False

    @property
    def topics(self) -> list[str]:
        """The topics consumed now."""
        return sorted(self._consumers)

    # --- receiving ------------------------------------------------------------------------

    def receive(self, max_messages: int = 100, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages of any of the topics; waits up to ``timeout_s``
        seconds for the first. Each says its topic in its ``message_id``."""
        return [m for b in self._take(max_messages, timeout_s) for m in b]

    def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 1.0) -> MultiTopicBatch:
        """Up to ``max_messages`` messages as a :class:`MultiTopicBatch` (a
        :class:`MessageBatch` per topic); waits up to ``timeout_s`` seconds for the first."""
        return MultiTopicBatch(self._take(max_messages, timeout_s))

    def _take(self, max_messages: int, timeout_s: float) -> list[MessageBatch]:
        self._check_open()
        self._refresh()
        timeout_s = check_receive(max_messages, timeout_s)
        if not self._consumers:  # (a pattern that matches nothing yet)
            time.sleep(min(timeout_s, self._refresh_s))
            return []
        children = list(self._consumers.values())
        deadline = time.monotonic() + timeout_s
        while not any(c.receiver.has_buffered() for c in children):
            remaining = max(deadline - time.monotonic(), 0.0)
            self._poll(children, max_messages, remaining)
            if remaining <= 0:
                break
        out, room = [], max_messages
        order = children[self._next % len(children) :] + children[: self._next % len(children)]
        self._next += 1
        for c in order:  # (each topic in turn drains first: none starves the others)
            if room <= 0:
                break
            parts = c.receiver.take_buffered(room)
            if parts:
                batch = MessageBatch(c.topic, parts)
                out.append(batch)
                room -= len(batch)
        return out

    def _poll(self, children: list[Consumer], max_messages: int, timeout_s: float) -> None:
        """One round over every topic: their receive calls stand together, and what any
        of them answers within ``timeout_s`` is taken in."""
        share = -(-max_messages // len(children))
        waits = []
        for c in children:
            c_share, call_s, c_wait_s = c.receiver.plan(share, timeout_s)
            c.receiver.ask(c_share, call_s)
            waits.append(c_wait_s)
        wait_s = min(waits, default=timeout_s)  # (one child's held rows may fall due first)
        refs = [r for c in children for r in c.receiver.calls()]
        if not refs:  # every partition of every topic is down
            time.sleep(min(max(timeout_s, 0.01), 0.25))
            return
        ready = ray.wait(refs, num_returns=1, timeout=wait_s)[0]
        if ready:
            ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        for c in children:
            calls = set(c.receiver.calls())
            c.receiver.collect([r for r in ready if r in calls])

    def _refresh(self) -> None:
        """A pattern consumer: join topics that match now, drop those deleted."""
        if self._topics_now is None or time.monotonic() - self._refreshed < self._refresh_s:
            return
        self._refreshed = time.monotonic()
        now = set(self._topics_now())
        for topic in sorted(now - set(self._consumers)):
            try:
                self._consumers[topic] = self._join(topic)
                log.info("%s: subscribed new topic %s", self._what(), topic)
            except NotFound:  # (deleted again meanwhile)
                continue
        for topic in sorted(set(self._consumers) - now):
            consumer = self._consumers.pop(topic)
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - the topic is gone: nothing to hand back
                log.info("%s: topic %s gone (%s)", self._what(), topic, exc)

    def _what(self) -> str:
        return f"pattern {self.pattern.pattern}" if self.pattern is not None else "topics"

    # --- acknowledging ----------------------------------------------------------------------

    def ack(self, messages: Any) -> None:
        """Acknowledge messages of any of the topics (what :meth:`receive` or
        :meth:`receive_batch` returned, Messages or MessageIds)."""
        for consumer, part in self._by_topic(messages, "messages"):
            consumer.ack(part)

    def nack(self, messages: Any, delay_s: float = 0.0) -> None:
        """Give messages back for redelivery after ``delay_s`` seconds (see
        :meth:`Consumer.nack`)."""
        for consumer, part in self._by_topic(messages, "messages"):
            consumer.nack(part, delay_s)

    def redeliver_unacknowledged(self, msgs: Any = None) -> int:
        """Redeliver now what this consumer holds (all of it, or ``msgs``), on every topic."""
        self._check_open()
        if msgs is None:
            return sum(c.redeliver_unacknowledged() for c in self._consumers.values())
        return sum(c.redeliver_unacknowledged(part) for c, part in self._by_topic(msgs, "msgs"))

    def seek(self, to: Any, *, inclusive: bool = False) -> None:
        """Move the subscription's cursor on every topic: ``"earliest"``, ``"latest"`` or
        a time (see :meth:`Consumer.seek`), or a :class:`MessageId` (its topic only)."""
        self._check_open()
        if isinstance(to, MessageId):
            self._consumer_of(to.topic, "to").seek(to, inclusive=inclusive)
            return
        for c in self._consumers.values():
            c.seek(to, inclusive=inclusive)

    def flush(self) -> None:
        for c in self._consumers.values():
            c.flush()

    def close(self) -> None:
        """Leave the subscription on every topic (what it holds is redelivered)."""
        if self._closed:
            return
        self._closed = True
        for c in self._consumers.values():
            c.close()

    def _by_topic(self, messages: Any, field: str) -> list[tuple[Consumer, Any]]:
        self._check_open()
        if isinstance(messages, MultiTopicBatch):
            return [(self._consumer_of(b.topic, field), b) for b in messages.batches]
        if isinstance(messages, MessageBatch):
            return [(self._consumer_of(messages.topic, field), messages)]
        if isinstance(messages, (Message, MessageId)):
            messages = [messages]
        if not isinstance(messages, Iterable) or isinstance(messages, (str, bytes)):
            raise InvalidArgument(
                f"{field}: expected a MultiTopicBatch, a MessageBatch, a Message, a MessageId "
                "or an iterable of them"
            )
        groups: dict[str, list] = {}
        for m in messages:
            mid = m.message_id if isinstance(m, Message) else m
            if not isinstance(mid, MessageId):
                raise InvalidArgument(
                    f"{field}: expected Message or MessageId, got {type(m).__name__}"
                )
            groups.setdefault(mid.topic, []).append(mid)
        return [(self._consumer_of(t, field), ids) for t, ids in groups.items()]

    def _consumer_of(self, topic: str, field: str) -> Consumer:
        c = self._consumers.get(topic)
        if c is None:
            raise InvalidArgument(
                f"{field}: topic {topic!r} is not one this consumer reads ({', '.join(self.topics)})"
            )
        return c

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("consumer: it is closed")

    def __enter__(self) -> MultiTopicConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
