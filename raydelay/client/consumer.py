"""Consumer: receives across every partition of a topic for one subscription.

``receive_batch`` and ``receive`` keep one long-poll call outstanding per partition
and, with ``prefetch``, put it back as soon as it answers (so at most one
round of replies waits here beyond what was asked for). Whatever those calls return (one
Arrow record batch each) is buffered here as it came and handed out in order of
arrival: by ``receive_batch`` as a :class:`MessageBatch` of columns, by ``receive`` as
a list of :class:`Message`. Messages in the buffer are already assigned to this
consumer (unacknowledged); closing the consumer hands them back to the subscription
for redelivery.

``ack`` and ``nack`` send one call per partition with the positions as one int64
array, whether they are given a MessageBatch, a list of messages or message ids.
``ack`` does not wait for the subscription's reply: up to ``_ACKS_IN_FLIGHT`` ack
calls stay outstanding; past that a later ``ack`` confirms the older half (a partition
that restarted meanwhile gets its acks sent again; any other failure is raised there).
Calls from one process reach an actor in order, so a later receive, nack or stats
sees the acks; ``flush()`` and ``close()`` wait for every one.

A consumer holds a lease on each subscription partition (``subscription.consumer_lease_s``):
its calls renew it, and a heartbeat thread renews it every third of the lease while the
consumer is open. A consumer whose process died stops renewing, and the subscription
removes it once the lease lapses: its unacknowledged messages go to the other consumers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import ray

from raydelay.client.message import (
    Message,
    MessageBatch,
    MessageId,
    check_number,
    messages_from_batch,
)
from raydelay.cluster import rpc
from raydelay.dispatch.keys import LOW, MAX_LEDGER_ID, join_keys, position_in_range
from raydelay.errors import InvalidArgument, StorageError, Unavailable

if TYPE_CHECKING:
    from raydelay.client.cluster import Cluster

log = logging.getLogger(__name__)

MAX_RECEIVE = 100_000
_ACKS_IN_FLIGHT = 16  # ack calls sent and not yet confirmed, at most
# How long a prefetch call stands at a partition (seconds) before it is renewed. It must
# not follow the caller's timeout: a call made with the few milliseconds a receive has
# left returns empty at once, and renewing it spins the subscription actors.
_STANDING_S = 2.0


class Consumer:
    def __init__(
        self,
        cluster: Cluster,
        topic: str,
        subscription: str,
        partitions: int,
        handles: list[Any],
        *,
        prefetch: bool = False,
    ) -> None:
        self._cluster = cluster
        self.topic = topic
        self.subscription = subscription
        self.partitions = partitions
        self._handles = handles
        self.consumer_id = uuid.uuid4().hex
        self.prefetch = prefetch
        self._buffer: deque[tuple[int, pa.RecordBatch]] = deque()  # (partition, rows)
        self._inflight: dict[Any, int] = {}  # receive ref -> partition
        self._acks: deque[tuple[int, np.ndarray, Any]] = deque()  # (partition, keys, ref)
        self._closed = False
        self._rewinds = 0  # redeliver_unacknowledged() calls without messages so far
        added = []
        try:
            for p in range(partitions):
                self._register(p)
                added.append(p)
        except BaseException:
            for p in added:  # nothing half-registered
                handles[p].remove_consumer.remote(self.consumer_id)
            raise
        self._stop = threading.Event()
        lease_s = cluster.config.subscription.consumer_lease_s
        self._heartbeats = threading.Thread(
            target=self._heartbeat,
            args=(lease_s / 3,),
            name=f"raydelay-heartbeat-{self.consumer_id[:8]}",
            daemon=True,
        )
        self._heartbeats.start()

    def _heartbeat(self, every_s: float) -> None:
        """Renew the lease at every partition until the consumer closes. A heartbeat still
        unanswered (its actor is restarting) is not sent again on top of itself."""
        sent: dict[int, Any] = {}
        refused: set[int] = set()
        while not self._stop.wait(every_s):
            try:
                for p, handle in enumerate(list(self._handles)):
                    ref = sent.get(p)
                    if ref is not None:
                        done, _ = ray.wait([ref], timeout=0)
                        if not done:
                            continue
                        try:
                            kept = ray.get(ref)
                        except Exception:  # noqa: BLE001 - the actor is down: try again later
                            kept = True
                        if kept:
                            refused.discard(p)
                        elif p not in refused:
                            refused.add(p)
                            log.warning(
                                "%s/%s partition %d: this consumer lost its place (its lease "
                                "lapsed and another consumer holds the exclusive subscription)",
                                self.topic,
                                self.subscription,
                                p,
                            )
                    sent[p] = handle.heartbeat.remote(self.consumer_id)
            except Exception as exc:  # noqa: BLE001 - Ray went away (shutdown): stop quietly
                if self._stop.is_set() or not ray.is_initialized():
                    return
                log.warning("%s/%s: heartbeat failed: %s", self.topic, self.subscription, exc)

    def receive(self, max_messages: int = 100, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout_s`` seconds for the first.
        Returns an empty list when none arrived in time."""
        out: list[Message] = []
        for p, rb in self._take(max_messages, timeout_s):
            out.extend(messages_from_batch(self.topic, p, rb))
        return out

    def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 1.0) -> MessageBatch:
        """Up to ``max_messages`` messages as one :class:`MessageBatch` of Arrow columns (one
        record batch per partition they came from); waits up to ``timeout_s`` seconds for
        the first. The batch is empty (``len() == 0``) when none arrived in time."""
        return MessageBatch(self.topic, self._take(max_messages, timeout_s))

    def _take(self, max_messages: int, timeout_s: float) -> list[tuple[int, pa.RecordBatch]]:
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
        out: list[tuple[int, pa.RecordBatch]] = []
        room = max_messages
        while self._buffer and room > 0:
            p, rb = self._buffer[0]
            if rb.num_rows <= room:
                self._buffer.popleft()
                out.append((p, rb))
                room -= rb.num_rows
            else:
                out.append((p, rb.slice(0, room)))
                self._buffer[0] = (p, rb.slice(room))
                room = 0
        return out

    def _poll(self, max_messages: int, timeout_s: float) -> None:
        # Ask each partition for its share, so that about max_messages wait here (assigned
        # to this consumer, their ack deadlines running) per round of replies.
        share = -(-max_messages // self.partitions)
        if self.prefetch:  # calls outlive this receive: wait only for this one's timeout
            call_s, wait_s = max(timeout_s, _STANDING_S), timeout_s
        else:  # calls end with this receive's timeout; the margin covers the trip back
            call_s, wait_s = timeout_s, timeout_s + 5.0
        self._ask(share, call_s)
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
        if ready:  # take every other reply that is already there too
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list(dict.fromkeys(ready + more))
        for ref in ready:
            p = self._inflight.pop(ref)
            try:
                rb = rpc.get(ref, what=f"subscription {p}")
                if rb.num_rows:
                    self._buffer.append((p, rb))
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
        # With prefetch, a call stands at every partition again at once, while the caller
        # works on what arrived: a message falling due meanwhile is answered the moment it is
        # due, not when the next receive reaches the partition (as Pulsar's consumer
        # prefetches).
        if self.prefetch:
            self._ask(share, call_s)

    def _ask(self, share: int, timeout_s: float) -> None:
        """A receive call outstanding at every partition that has none."""
        busy = set(self._inflight.values())
        for p, h in enumerate(self._handles):
            if p not in busy:
                call = h.receive.remote(self.consumer_id, share, timeout_s, self._rewinds)
                self._inflight[call] = p

    def _register(self, p: int) -> None:
        """Join partition ``p`` (idempotent; also after its actor restarted and forgot us)."""

        def submit():
            self._handles[p] = self._cluster._subscription_handle(self.topic, p, self.subscription)
            return self._handles[p].add_consumer.remote(self.consumer_id)

        self._cluster._call(submit, f"subscription {self.subscription} partition {p}")

    def ack(
        self, messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId]
    ) -> None:
        """Acknowledge messages: a MessageBatch, a Message or MessageId, or an iterable of
        them (one call per partition)."""
        self._check_open()
        by_partition = self._group(messages, "messages")
        for p, keys in by_partition.items():
            self._acks.append((p, keys, self._handles[p].ack.remote(self.consumer_id, keys)))
        if len(self._acks) > _ACKS_IN_FLIGHT:  # confirm the older half (long answered, mostly)
            self._settle_acks(keep=_ACKS_IN_FLIGHT // 2)

    def flush(self) -> None:
        """Wait until every ack sent so far is applied by its subscription."""
        self._check_open()
        self._settle_acks(keep=0)

    def _settle_acks(self, keep: int = 0) -> None:
        """Confirm the acks sent so far but the newest ``keep``, waiting for their answers.
        An ack a restart interrupted is sent again (acks are idempotent); any other
        failure is raised."""
        while len(self._acks) > keep:
            p, keys, ref = self._acks.popleft()
            try:
                rpc.get(ref, what=f"subscription {p}")
            except (Unavailable, StorageError) as exc:
                if isinstance(exc, StorageError) and not exc.retriable:
                    raise
                log.warning("%s/%s partition %d: ack %s; sending it again",
                            self.topic, self.subscription, p, exc)  # fmt: skip
                self._cluster._call(
                    lambda p=p, keys=keys: self._handles[p].ack.remote(self.consumer_id, keys),
                    f"subscription {self.subscription} partition {p}",
                )

    def nack(
        self,
        messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId],
        delay_s: float = 0.0,
    ) -> None:
        """Give messages back for redelivery after ``delay_s`` seconds (0: as soon as
        possible). Takes what :meth:`ack` takes."""
        self._check_open()
        delay_s = check_number("delay_s", delay_s)
        by_partition = self._group(messages, "messages")
        self._cluster._call(
            lambda: [
                self._handles[p].nack.remote(self.consumer_id, keys, delay_s)
                for p, keys in by_partition.items()
            ],
            "subscription",
        )

    def redeliver_unacknowledged(
        self,
        msgs: MessageBatch | Message | MessageId | Iterable[Message | MessageId] | None = None,
    ) -> int:
        """Redeliver now messages this consumer holds unacknowledged, with
        ``redelivery_count`` raised (Pulsar's ``redeliverUnacknowledgedMessages``). Returns
        how many go back.

        - No argument: everything it holds, including what it received and has not handed
          to the caller yet. On a shared subscription they go to any consumer; on an
          exclusive or failover one delivery rewinds to the first of them and goes on in
          log order.
        - ``msgs`` (what :meth:`ack` takes): a shared subscription takes back only those;
          exclusive and failover rewind as above. A message this consumer does not hold
          (acknowledged, or held by another consumer) is an :class:`InvalidArgument`
          naming it, and then nothing goes back. Messages a restarted subscription forgot
          it had handed out are accepted: they are on their way again already."""
        self._check_open()
        if msgs is None:
            self._rewinds += 1
            n = sum(
                self._cluster._call(
                    lambda: [
                        h.redeliver.remote(self.consumer_id, None, self._rewinds)
                        for h in self._handles
                    ],
                    "subscription",
                )
            )
            # receive calls sent before answer empty, or with messages that just went back:
            # what they and the buffer hold is dropped, or it would arrive twice
            if self._inflight:
                ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=10)
            self._inflight.clear()
            self._buffer.clear()
            return n
        by_partition = self._group(msgs, "msgs")
        for p, keys in by_partition.items():  # check every partition before any goes back
            try:
                self._cluster._call(
                    lambda p=p, keys=keys: [
                        self._handles[p].redeliver.remote(self.consumer_id, keys, 0, True)
                    ],
                    "subscription",
                )
            except InvalidArgument as exc:
                raise InvalidArgument(f"{exc} (in {self.topic}/{p})") from None
        return sum(
            self._cluster._call(
                lambda: [
                    self._handles[p].redeliver.remote(self.consumer_id, keys)
                    for p, keys in by_partition.items()
                ],
                "subscription",
            )
        )

    def _group(self, messages: Any, field: str) -> dict[int, np.ndarray]:
        """partition -> int64 position keys of ``messages``."""
        if isinstance(messages, MessageBatch):
            if messages.topic != self.topic:
                raise InvalidArgument(
                    f"{field}: a batch of topic {messages.topic!r}, not {self.topic!r}"
                )
            return messages.position_keys()
        if isinstance(messages, (Message, MessageId)):
            messages = [messages]
        try:
            items = list(messages)
        except TypeError:
            raise InvalidArgument(
                f"{field}: expected a MessageBatch, a Message, a MessageId or an iterable of them"
            ) from None
        if items and all(type(m) is Message for m in items):
            ids = [m[0] for m in items]  # fast path: what receive() returned
        else:
            ids = []
            for m in items:
                mid = m.message_id if isinstance(m, Message) else m
                if not isinstance(mid, MessageId):
                    raise InvalidArgument(
                        f"{field}: expected Message or MessageId, got {type(m).__name__}"
                    )
                ids.append(mid)
        n = len(ids)
        try:
            parts, ledgers, entries = (
                np.fromiter((i[c] for i in ids), dtype=np.int64, count=n) for c in (1, 2, 3)
            )
        except (OverflowError, TypeError, ValueError):
            parts = ledgers = entries = np.full(n, -1, np.int64)  # named just below
        if any(i[0] != self.topic for i in ids) or (
            n and (parts.min() < 0 or parts.max() >= self.partitions)
        ):
            bad = next(i for i in ids if i[0] != self.topic or not 0 <= i[1] < self.partitions)
            raise InvalidArgument(f"{field}: {bad} is not a message of topic {self.topic!r}")
        if n and (
            ledgers.min() < 0
            or ledgers.max() > MAX_LEDGER_ID
            or entries.min() < 0
            or entries.max() > LOW
        ):
            bad = next(i for i in ids if not position_in_range(i[2], i[3]))
            raise InvalidArgument(f"{field}: {bad} is no message position (out of range)")
        keys = join_keys(ledgers, entries)
        return {int(p): keys[parts == p] for p in np.unique(parts)}

    def close(self) -> None:
        """Leave the subscription: unacknowledged messages (buffered ones too) are redelivered
        to the other consumers."""
        if self._closed:
            return
        try:
            self._settle_acks(keep=0)  # what was acked stays acked, not redelivered
        except Exception as exc:  # noqa: BLE001 - closing: report; unconfirmed acks redeliver
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        self._closed = True
        self._stop.set()
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
