"""Consumer: receives across every partition of a topic for one subscription.

``receive`` keeps one long-poll call outstanding per partition; whatever those
calls return is buffered here and handed out in order of arrival. Messages in the
buffer are already assigned to this consumer (unacknowledged); closing the
consumer hands them back to the subscription for redelivery.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ray

from raydelay.client.message import Message, MessageId, check_number, messages_from_wire
from raydelay.cluster import rpc
from raydelay.errors import InvalidArgument, StorageError, Unavailable

if TYPE_CHECKING:
    from raydelay.client.cluster import Cluster

log = logging.getLogger(__name__)

MAX_RECEIVE = 100_000


class Consumer:
    def __init__(
        self, cluster: Cluster, topic: str, subscription: str, partitions: int, handles: list[Any]
    ) -> None:
        self._cluster = cluster
        self.topic = topic
        self.subscription = subscription
        self.partitions = partitions
        self._handles = handles
        self.consumer_id = uuid.uuid4().hex
        self._buffer: deque[Message] = deque()
        self._inflight: dict[Any, int] = {}  # receive ref -> partition
        self._closed = False
        added = []
        try:
            for p in range(partitions):
                self._register(p)
                added.append(p)
        except BaseException:
            for p in added:  # nothing half-registered
                handles[p].remove_consumer.remote(self.consumer_id)
            raise

    def receive(self, max_messages: int = 100, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout_s`` seconds for the first.
        Returns an empty list when none arrived in time."""
        self._check_open()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise InvalidArgument(
                f"max_messages: expected an int, got {type(max_messages).__name__}"
            )
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise InvalidArgument(f"max_messages: must be 1..{MAX_RECEIVE}, got {max_messages}")
        timeout_s = check_number("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        while not self._buffer:
            remaining = deadline - time.monotonic()
            self._poll(max_messages, max(remaining, 0.0))
            if self._buffer or remaining <= 0:
                break
        n = min(max_messages, len(self._buffer))
        return [self._buffer.popleft() for _ in range(n)]

    def _poll(self, max_messages: int, timeout_s: float) -> None:
        busy = set(self._inflight.values())
        # Ask each partition for its share, so that at most about max_messages wait here
        # (assigned to this consumer, their ack deadlines running) when all are busy.
        share = -(-max_messages // self.partitions)
        for p, h in enumerate(self._handles):
            if p not in busy:
                ref = h.receive.remote(self.consumer_id, share, timeout_s)
                self._inflight[ref] = p
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s + 5.0)
        if ready:  # take every other reply that is already there too
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list(dict.fromkeys(ready + more))
        for ref in ready:
            p = self._inflight.pop(ref)
            try:
                self._buffer.extend(messages_from_wire(rpc.get(ref, what=f"subscription {p}")))
            except StorageError as exc:
                if not exc.retriable:
                    raise
                log.warning(
                    "%s/%s partition %d: %s; trying again", self.topic, self.subscription, p, exc
                )
            except Unavailable as exc:
                log.warning(
                    "%s/%s partition %d: %s; re-attaching", self.topic, self.subscription, p, exc
                )
                self._register(p)

    def _register(self, p: int) -> None:
        """Join partition ``p`` (idempotent; also after its actor restarted and forgot us)."""

        def submit():
            self._handles[p] = self._cluster._subscription_handle(self.topic, p, self.subscription)
            return self._handles[p].add_consumer.remote(self.consumer_id)

        self._cluster._call(submit, f"subscription {self.subscription} partition {p}")

    def ack(self, messages: Message | MessageId | Iterable[Message | MessageId]) -> None:
        """Acknowledge messages (one, or many in one call per partition)."""
        self._check_open()
        by_partition = self._group(messages, "messages")
        self._cluster._call(
            lambda: [
                self._handles[p].ack.remote(self.consumer_id, pos)
                for p, pos in by_partition.items()
            ],
            "subscription",
        )

    def nack(
        self, messages: Message | MessageId | Iterable[Message | MessageId], delay_s: float = 0.0
    ) -> None:
        """Give messages back for redelivery after ``delay_s`` seconds (0: as soon as possible)."""
        self._check_open()
        delay_s = check_number("delay_s", delay_s)
        by_partition = self._group(messages, "messages")
        self._cluster._call(
            lambda: [
                self._handles[p].nack.remote(self.consumer_id, pos, delay_s)
                for p, pos in by_partition.items()
            ],
            "subscription",
        )

    def _group(self, messages: Any, field: str) -> dict[int, list[tuple[int, int]]]:
        if isinstance(messages, (Message, MessageId)):
            messages = [messages]
        if isinstance(messages, list) and messages and all(type(m) is Message for m in messages):
            ids = [m[0] for m in messages]  # fast path: what receive() returned
            if all(mid[0] == self.topic for mid in ids):
                out: dict[int, list[tuple[int, int]]] = {}
                for mid in ids:
                    out.setdefault(mid[1], []).append((mid[2], mid[3]))
                if all(0 <= p < self.partitions for p in out):
                    return out
        try:
            items = list(messages)
        except TypeError:
            raise InvalidArgument(
                f"{field}: expected a Message, a MessageId or an iterable of them"
            ) from None
        out: dict[int, list[tuple[int, int]]] = {}
        for m in items:
            mid = m.message_id if isinstance(m, Message) else m
            if not isinstance(mid, MessageId):
                raise InvalidArgument(
                    f"{field}: expected Message or MessageId, got {type(m).__name__}"
                )
            if mid.topic != self.topic or not 0 <= mid.partition < self.partitions:
                raise InvalidArgument(f"{field}: {mid} is not a message of topic {self.topic!r}")
            out.setdefault(mid.partition, []).append((mid.ledger_id, mid.entry_id))
        return out

    def close(self) -> None:
        """Leave the subscription: unacknowledged messages (buffered ones too) are redelivered
        to the other consumers."""
        if self._closed:
            return
        self._closed = True
        refs = [h.remove_consumer.remote(self.consumer_id) for h in self._handles]
        try:
            rpc.get(refs, what="subscription")
            if self._inflight:  # woken by the removal; what they carry is redelivered
                ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=10)
        except Unavailable as exc:  # its topic was deleted: nothing is left to hand back
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        finally:
            self._inflight.clear()
            self._buffer.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("consumer: it is closed")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
