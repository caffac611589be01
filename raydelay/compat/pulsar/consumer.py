"""Pulsar's consumer over a raydelay subscription: a receiver queue filled by asks of
raydelay, Pulsar's acknowledgements (single, cumulative, negative), seek, and a message
listener thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydelay.client.message import MessageId as _CoreId
from raydelay.client.multi import MultiTopicConsumer as _CoreMulti
from raydelay.compat.pulsar._checks import check_type
from raydelay.compat.pulsar._endpoint import Endpoint, last_id, seek_target, wrap_message
from raydelay.compat.pulsar._topics import TopicMap
from raydelay.compat.pulsar.enums import ConsumerType
from raydelay.compat.pulsar.exceptions import (
    AlreadyClosed,
    CumulativeAcknowledgementNotAllowedError,
    OperationNotSupported,
    PulsarException,
    Timeout,
)
from raydelay.compat.pulsar.message import Message, MessageId
from raydelay.compat.pulsar.policies import ConsumerBatchReceivePolicy
from raydelay.compat.pulsar.schema import Schema
from raydelay.errors import InvalidArgument

log = logging.getLogger(__name__)

_FILL_MAX = 1_000  # messages a consumer asks for at a time at most (its receiver queue)
_STEP_S = 0.25  # a receive asks in steps of at most this long


@dataclass(frozen=True)
class ConsumerSettings:
    """What a ``subscribe`` call asked of its consumer, beyond the topic."""

    subscription: str
    name: str
    kind: ConsumerType
    schema: Schema
    queue_size: int  # receiver_queue_size
    nack_delay_ms: int  # negative_ack_redelivery_delay_ms
    batch_policy: ConsumerBatchReceivePolicy
    inclusive: bool = False  # start_message_id_inclusive: what a seek by id means


class Consumer(Endpoint):
    """Receives from one subscription. It asks raydelay for up to ``receiver_queue_size``
    messages at a time (at least 1) and hands them out one by one: those it holds count as
    delivered to it, as in Pulsar's receiver queue."""

    def __init__(
        self,
        topics: TopicMap,
        core: Any,
        topic_name: str,
        partitions: int,
        settings: ConsumerSettings,
    ) -> None:
        self._topics, self._core, self._topic_name = topics, core, topic_name
        self._several = isinstance(core, _CoreMulti)  # several topics (a list, a pattern)
        self._inclusive = settings.inclusive
        self._partitions, self._subscription = partitions, settings.subscription
        self._name, self._kind, self._schema = settings.name, settings.kind, settings.schema
        self._fill = max(1, min(settings.queue_size, _FILL_MAX))
        self._nack_delay_s = settings.nack_delay_ms / 1000
        self._batch_policy = settings.batch_policy
        self._buffer: deque[Any] = deque()
        # FIFO types: what it handed out and no ack covered yet, per (topic, partition)
        # (what a cumulative ack acknowledges)
        self._handed: dict[tuple[str, int], set[tuple[int, int]]] | None = (
            {} if self._kind in (ConsumerType.Exclusive, ConsumerType.Failover) else None
        )
        self._lock = threading.RLock()
        self._closed = False
        self._listener: threading.Thread | None = None
        self._paused = threading.Event()

    _what = "consumer"

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._name

    def _wrap(self, m: Any) -> Message:
        return wrap_message(self._topics, m, self._schema, self._topic_name, self._partitions)

    def _take(self, want: int, timeout_s: float | None) -> list[Any]:
        """Up to ``want`` raydelay messages: buffered ones first, else one ask of at most the
        receiver queue, waiting up to ``timeout_s`` (None: until one comes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        asked = False
        while True:
            # the lock is held one step at a time (at most _STEP_S), so that an ack or a
            # redelivery from another thread never waits for a long receive
            with self._lock:
                out = self._pop(want)
                if out:
                    return out
                left = _STEP_S if deadline is None else deadline - time.monotonic()
                if left <= 0 and asked:
                    return []
                # (a timeout of 0 still asks once: what is ready now comes back)
                got = self._core.receive(
                    max_messages=max(self._fill, want), timeout_s=min(max(left, 0.0), _STEP_S)
                )
                asked = True
                self._buffer.extend(got)

    def _pop(self, want: int) -> list[Any]:
        """Up to ``want`` buffered raydelay messages, now counted as handed out."""
        with self._lock:
            self._check_open()
            out = [self._buffer.popleft() for _ in range(min(want, len(self._buffer)))]
            if self._handed is not None:
                for m in out:
                    mid = m.message_id
                    self._handed.setdefault((mid.topic, mid.partition), set()).add(
                        (mid.ledger_id, mid.entry_id)
                    )
            return out

    def _refill(self, got: list[Any], *, first: bool = False) -> None:
        """Add raydelay messages to the receiver queue (``first``: before what it holds,
        for messages an asyncio receive took and was cancelled before it could hand out)."""
        with self._lock:
            if first:
                self._buffer.extendleft(reversed(got))
            else:
                self._buffer.extend(got)

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits up to ``timeout_millis`` (None: until one comes) and
        raises :class:`Timeout` when none came."""
        if timeout_millis is not None:
            check_type(int, timeout_millis, "timeout_millis")
            if timeout_millis < 0:
                raise ValueError(f"timeout_millis: must be >= 0, got {timeout_millis}")
        if self._listener is not None:
            raise PulsarException("receive: this consumer has a message listener")
        got = self._take(1, None if timeout_millis is None else timeout_millis / 1000)
        if not got:
            raise Timeout(f"no message within {timeout_millis} ms")
        return self._wrap(got[0])

    def batch_receive(self) -> list[Message]:
        """Messages until the batch receive policy's count, bytes or timeout is reached
        (whichever first; an empty list when the timeout passed with none)."""
        pol = self._batch_policy
        max_n = pol.max_num_message if pol.max_num_message > 0 else None
        max_b = pol.max_num_bytes if pol.max_num_bytes > 0 else None
        deadline = time.monotonic() + pol.timeout_ms / 1000 if pol.timeout_ms > 0 else None
        out: list[Any] = []
        size = 0
        while True:
            want = _FILL_MAX if max_n is None else max_n - len(out)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            got = self._take(want, left)
            for m in got:
                out.append(m)
                size += len(m.payload)
            if (
                (max_n is not None and len(out) >= max_n)
                or (max_b is not None and size >= max_b)
                or (deadline is not None and time.monotonic() >= deadline)
            ):
                break
        return [self._wrap(m) for m in out]

    def _ids(self, message: Any, what: str) -> list[_CoreId]:
        items = message if isinstance(message, list) else [message]
        out = []
        for m in items:
            if isinstance(m, Message):
                out.append(m._m.message_id)
            elif isinstance(m, MessageId):
                if m._ledger < 0 or m._entry < 0:
                    raise ValueError(f"{what}: {m} names no message")
                if m._topic is None and self._several:
                    raise OperationNotSupported(
                        f"{what}: {m} has no topic name, and this consumer reads several "
                        "topics (acknowledge the Message, or an id deserialized with its topic)"
                    )
                topic = m._topic or self._core.topic
                out.append(_CoreId(topic, max(m._partition, 0), m._ledger, m._entry))
            else:
                raise ValueError(
                    f"{what}: expected a Message or a MessageId, got {type(m).__name__}"
                )
        return out

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (or its id)."""
        self._check_open()
        ids = self._ids(message, "acknowledge")
        mine = set(self._core.topics) if self._several else {self._core.topic}
        if any(i.topic not in mine for i in ids):
            raise OperationNotSupported(f"acknowledge: {message} is not of {self._topic_name}")
        with self._lock:
            self._core.ack(ids)
            if self._handed is not None:
                for i in ids:
                    self._handed.get((i.topic, i.partition), set()).discard(
                        (i.ledger_id, i.entry_id)
                    )

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge a message and every message before it in its partition that this
        consumer received (Exclusive and Failover subscriptions only)."""
        self._check_open()
        if self._kind in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                "acknowledge_cumulative: not allowed on a Shared or KeyShared subscription"
            )
        (mid,) = self._ids(message, "acknowledge_cumulative")
        assert self._handed is not None
        with self._lock:
            held = self._handed.get((mid.topic, mid.partition), set())
            upto = (mid.ledger_id, mid.entry_id)
            done = {pos for pos in held if pos <= upto} | {upto}
            held -= done
            self._core.ack([_CoreId(mid.topic, mid.partition, lg, e) for lg, e in sorted(done)])

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Give a message back: it is redelivered after ``negative_ack_redelivery_delay_ms``."""
        self._check_open()
        ids = self._ids(message, "negative_acknowledge")
        with self._lock:
            self._core.nack(ids, delay_s=self._nack_delay_s)

    def redeliver_unacknowledged_messages(self) -> None:
        """Everything this consumer holds unacknowledged goes out again now."""
        self._check_open()
        with self._lock:
            self._buffer.clear()
            if self._handed is not None:
                self._handed.clear()
            self._core.redeliver_unacknowledged()

    def unsubscribe(self) -> None:
        """Delete the subscription (its cursor with it), then close."""
        self._check_open()
        topics = self._core.topics if self._several else [self._core.topic]
        self.close()
        for topic in topics:
            self._topics.cluster.delete_subscription(topic, self._subscription)

    def close(self) -> None:
        """Leave the subscription: what this consumer holds unacknowledged is redelivered."""
        if self._closed:
            return
        self._closed = True
        self._paused.clear()
        with self._lock:
            self._buffer.clear()
            self._core.close()

    def pause_message_listener(self) -> None:
        self._paused.set()

    def resume_message_listener(self) -> None:
        self._paused.clear()

    def _start_listener(self, listener: Callable[[Consumer, Message], None]) -> None:
        def run() -> None:
            while not self._closed:
                if self._paused.is_set():
                    time.sleep(0.05)
                    continue
                try:
                    got = self._take(1, 0.5)
                except AlreadyClosed:
                    return
                for m in got:
                    try:
                        listener(self, self._wrap(m))
                    except Exception:  # noqa: BLE001 - a user's listener must not stop it
                        log.exception("message listener failed")

        self._listener = threading.Thread(target=run, name="pulsar-listener", daemon=True)
        self._listener.start()

    def seek(self, messageid: Any) -> None:
        """Move the subscription's cursor: to a message id (delivery goes on after it, or
        from it with ``start_message_id_inclusive``), ``MessageId.earliest`` /
        ``MessageId.latest``, or a publish time (epoch ms: the first message published at
        or after it). What this consumer holds unacknowledged is delivered again if it
        comes after the new position."""
        self._check_open()
        local = None if self._several else self._core.topic
        target = seek_target(local, messageid)
        with self._lock:
            self._buffer.clear()
            if self._handed is not None:
                self._handed.clear()
            try:
                self._core.seek(target, inclusive=self._inclusive)
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None

    def get_last_message_id(self) -> MessageId:
        """The id of the topic's last message (a topic of one partition; several topics:
        ``OperationNotSupported``)."""
        self._check_open()
        if self._several:
            raise OperationNotSupported("get_last_message_id: this consumer reads several topics")
        return last_id(self._core)
