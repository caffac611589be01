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
array, whether they are given a MessageBatch, a list of messages or message ids. They
do not wait for the subscription's reply: the calls stay outstanding, and a later
``ack`` or ``nack`` confirms those that answered (any failure but an unavailable
partition is raised there). Calls from one process reach an actor in order, so a
later receive, nack or stats sees the acks; ``flush()`` and ``close()`` wait for every
one.

**Partitions are independent.** A partition whose actor fails (a restart, a lost node)
or stops answering is *down* for this consumer: ``receive`` returns what the other
partitions have, and its acks and nacks are kept and sent again in the background
(they are idempotent) once it answers, while those of the other partitions go out at
once. It is tried every 50 ms for 3 s, then with a growing backoff (0.1 s up to 0.5 s), its handle
re-resolved by name.

A consumer holds a lease on each subscription partition (``subscription.consumer_lease_s``):
its calls renew it, and a heartbeat thread renews it every third of the lease while the
consumer is open. A consumer whose process died stops renewing, and the subscription
removes it once the lease lapses: its unacknowledged messages go to the other consumers.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raydelay.actors.metrics import ConsumerMetrics
from raydelay.client.ack_queue import AckQueue, group_by_partition
from raydelay.client.message import (
    Message,
    MessageBatch,
    MessageId,
    check_number,
    load_arrow_conversions,
    messages_from_batch,
)
from raydelay.client.partition_health import PartitionHealth
from raydelay.client.reader import last_ids, only_id
from raydelay.client.receiving import HUNG_S, Receiver
from raydelay.clock import now_ms as _now_ms
from raydelay.dispatch import stages
from raydelay.errors import InvalidArgument, Unavailable

if TYPE_CHECKING:
    from raydelay.client.links import SubscriptionLink

log = logging.getLogger(__name__)


def consumer_metrics(topic: str, subscription: str) -> Any:
    """The ``returned`` stage's Ray metric for a consumer of this process, or False where
    Ray's metrics cannot be recorded (a process not connected to Ray)."""
    try:
        return ConsumerMetrics(topic, subscription)
    except Exception as exc:  # noqa: BLE001 - metrics must never stop a consumer
        log.debug("no Ray metrics for %s/%s: %s", topic, subscription, exc)
        return False


MAX_RECEIVE = 100_000


def check_receive(max_messages: object, timeout_s: object) -> float:
    """Check a receive's arguments; returns the timeout in seconds."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, int):
        raise InvalidArgument(f"max_messages: expected an int, got {type(max_messages).__name__}")
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidArgument(f"max_messages: must be 1..{MAX_RECEIVE}, got {max_messages}")
    return check_number("timeout_s", timeout_s)


class Consumer:
    """One consumer of a subscription (``Cluster.subscribe``). ``link`` carries its calls
    to the subscription's partitions (:class:`raydelay.client.links.SubscriptionLink`);
    ``lease_s`` is ``subscription.consumer_lease_s``; ``ahead_ms``, its
    ``handout_ahead_ms`` (delayed messages handed to this client that much ahead of their
    due time, and held here until it comes)."""

    def __init__(
        self,
        link: SubscriptionLink,
        topic: str,
        subscription: str,
        *,
        lease_s: float,
        ahead_ms: int = 0,
        prefetch: bool = False,
        seek: Callable[[Any, bool], Any] | None = None,
        tails: Callable[[], list] | None = None,
    ) -> None:
        load_arrow_conversions()  # (not on the first delivery: see there)
        self._link = link
        self._seek = seek  # resets the subscription's cursor (Cluster._reset)
        self._tails = tails  # each partition's last position
        self.topic = topic
        self.subscription = subscription
        self.partitions = partitions = link.partitions
        self.consumer_id = uuid.uuid4().hex
        self.prefetch = prefetch
        # the partitions by the actor serving them: one receive call (and heartbeat) each
        self._groups = [tuple(g) for g in link.heartbeat_groups()]
        self._closed = False
        self._rewinds = 0  # redeliver_unacknowledged() calls without messages so far
        self._stages = stages.StageCounts((stages.CONSUMER_STAGE,))
        self._stage_lock = threading.Lock()
        # (made now, not on the first delivery; False: this process has no Ray metrics)
        self._metrics: Any = consumer_metrics(topic, subscription)
        self._stop = threading.Event()
        self._health = PartitionHealth(
            link, f"{topic}/{subscription}", lambda p, work: self._acks.send(p, work), self._stop
        )
        self._acks = AckQueue(link, self.consumer_id, subscription, self._groups, self._health)
        self.receiver = Receiver(
            link,
            self.consumer_id,
            self._groups,
            self._health,
            partitions=partitions,
            prefetch=prefetch,
            rewinds=lambda: self._rewinds,
            returned=self._returned,
            ahead_ms=ahead_ms,
        )
        added = []
        try:
            for p in range(partitions):
                self._register(p)
                added.append(p)
        except BaseException:
            for p in added:  # nothing half-registered
                link.remove_consumer(p, self.consumer_id)
            raise
        self._heartbeats = threading.Thread(
            target=self._heartbeat,
            args=(lease_s / 3,),
            name=f"raydelay-heartbeat-{self.consumer_id[:8]}",
            daemon=True,
        )
        self._heartbeats.start()
        self._retrier = threading.Thread(
            target=self._health.retry_loop,
            name=f"raydelay-retry-{self.consumer_id[:8]}",
            daemon=True,
        )
        self._retrier.start()

    def _heartbeat(self, every_s: float) -> None:
        """Renew the lease at every partition until the consumer closes. A heartbeat still
        unanswered (its actor is restarting) is not sent again on top of itself."""
        sent: dict[tuple[int, ...], Any] = {}
        refused: set[int] = set()
        groups = self._groups
        while not self._stop.wait(every_s):
            try:
                for group in groups:
                    ref = sent.get(group)
                    if ref is not None:
                        if not self._link.ready([ref], 1, 0):
                            continue
                        try:
                            kept = self._link.get(ref, what=f"subscription {list(group)}")
                        except Exception:  # noqa: BLE001 - the actor is down: try again later
                            kept = [True] * len(group)
                        for p, ok in zip(group, kept, strict=True):
                            if ok:
                                refused.discard(p)
                            elif p not in refused:
                                refused.add(p)
                                log.warning(
                                    "%s/%s partition %d: this consumer lost its place (its "
                                    "lease lapsed and another consumer holds the exclusive "
                                    "subscription)",
                                    self.topic,
                                    self.subscription,
                                    p,
                                )
                    sent[group] = self._link.heartbeat(list(group), self.consumer_id)
            except Exception as exc:  # noqa: BLE001 - Ray went away (shutdown): stop quietly
                if self._stop.is_set() or not self._link.connected():
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
        return self.receiver.take(max_messages, check_receive(max_messages, timeout_s))

    def _returned(self, got: list[tuple[pa.RecordBatch, int]]) -> None:
        """Count the ``returned`` stage of the first deliveries of delayed messages among
        the record batches handed out now, each with when its reply was made (see
        :mod:`raydelay.dispatch.stages`)."""
        for rb, made_ms in got:
            if not made_ms:
                continue
            d = rb.column("deliver_at_ms").to_numpy()
            redelivered = rb.column("redelivery_count").to_numpy()
            value, n = stages.returned(d, redelivered, made_ms, _now_ms())
            if not n:
                continue
            with self._stage_lock:
                self._stages.add_one(0, value, n)
            if self._metrics:
                self._metrics.returned(value)

    def lateness_stages(self) -> dict[str, dict]:
        """The ``returned`` stage of the delayed messages this consumer received the first
        time (see :mod:`raydelay.dispatch.stages`): ``{"returned": {"counts": [...],
        "sum_ms": n}}``, counts per ``stats()["lateness"]["edges_ms"]`` bucket. The other
        stages are the subscription's: ``Cluster.stats(topic, subscription)["lateness"]
        ["stages"]``."""
        with self._stage_lock:
            return self._stages.as_dict()

    def _register(self, p: int) -> None:
        """Join partition ``p`` (idempotent; also after its actor restarted and forgot us)."""

        self._link.retried(
            lambda: self._link.add_consumer(p, self.consumer_id),
            f"subscription {self.subscription} partition {p}",
            partition=p,
        )

    def ack(
        self, messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId]
    ) -> None:
        """Acknowledge messages: a MessageBatch, a Message or MessageId, or an iterable of
        them (one call per partition)."""
        self._check_open()
        self._acks.submit(self._group(messages, "messages"), None)

    def flush(self) -> None:
        """Wait until every ack and nack sent so far is applied by its subscription (those
        of a down partition too, retried until ``client.retry_deadline_s``)."""
        self._check_open()
        self._acks.settle()

    def nack(
        self,
        messages: MessageBatch | Message | MessageId | Iterable[Message | MessageId],
        delay_s: float = 0.0,
    ) -> None:
        """Give messages back for redelivery after ``delay_s`` seconds (0: as soon as
        possible), counted from this call: nacks made in a row come back in that order,
        however their calls are scheduled (or retried) on the way. Takes what :meth:`ack`
        takes."""
        self._check_open()
        delay_s = check_number("delay_s", delay_s)
        self._acks.submit(self._group(messages, "messages"), (delay_s, _now_ms()))

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
                self._link.retried(
                    lambda: [
                        self._link.redeliver(p, self.consumer_id, None, self._rewinds)
                        for p in range(self.partitions)
                    ],
                    "subscription",
                )
            )
            # receive calls sent before answer empty, or with messages that just went back:
            # what they and the buffer hold is dropped, or it would arrive twice
            self.receiver.drop_all(10)
            return n
        by_partition = self._group(msgs, "msgs")
        for p, keys in by_partition.items():  # check every partition before any goes back

            def check(p: int = p, keys: np.ndarray = keys) -> list:
                return [self._link.redeliver(p, self.consumer_id, keys, 0, True)]

            try:
                self._link.retried(check, "subscription")
            except InvalidArgument as exc:
                raise InvalidArgument(f"{exc} (in {self.topic}/{p})") from None
        return sum(
            self._link.retried(
                lambda: [
                    self._link.redeliver(p, self.consumer_id, keys)
                    for p, keys in by_partition.items()
                ],
                "subscription",
            )
        )

    def seek(self, to: Any, *, inclusive: bool = False) -> None:
        """Move the subscription's cursor (Pulsar's ``Consumer.seek``), for every consumer
        of it: ``to`` is ``"earliest"``, ``"latest"``, a :class:`MessageId` (delivery goes
        on after that message on its partition, or from it with ``inclusive``, as Pulsar's
        ``start_message_id_inclusive``), or a time (epoch ms or an aware datetime: the
        first entry published at or after it, on every partition). See
        :meth:`raydelay.Cluster.reset_cursor`. The acks sent before go first; what this
        consumer holds but has not acked is given back (the reset delivers it again if it
        comes after the new position), and what it had received and not handed out is
        dropped."""
        self._check_open()
        if self._seek is None:
            raise InvalidArgument("seek: this consumer was not made by Cluster.subscribe")
        if not isinstance(inclusive, bool):
            raise InvalidArgument(f"inclusive: expected True or False, got {inclusive!r}")
        self.flush()
        self._seek(to, inclusive)
        self.redeliver_unacknowledged()  # (and drops what the buffer and calls under way hold)

    def last_message_ids(self) -> list[MessageId | None]:
        """The id of each partition's last entry (None: the partition is empty)."""
        self._check_open()
        if self._tails is None:
            raise InvalidArgument(
                "last_message_ids: this consumer was not made by Cluster.subscribe"
            )
        return last_ids(self.topic, self._tails())

    def get_last_message_id(self) -> MessageId | None:
        """The id of the topic's last entry (Pulsar's ``get_last_message_id``); a topic of
        one partition only (see :meth:`last_message_ids`)."""
        return only_id(self.topic, self.last_message_ids())

    def _group(self, messages: Any, field: str) -> dict[int, np.ndarray]:
        """partition -> int64 position keys of ``messages``."""
        return group_by_partition(messages, field, self.topic, self.partitions)

    def close(self) -> None:
        """Leave the subscription: unacknowledged messages (buffered ones too) are redelivered
        to the other consumers."""
        if self._closed:
            return
        try:
            self._acks.settle()  # what was acked stays acked, not redelivered
        except Exception as exc:  # noqa: BLE001 - closing: report; unconfirmed acks redeliver
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        self._closed = True
        self._stop.set()
        self._health.retry_now.set()
        # (a heartbeat sent after the removal would add this consumer back, its lease
        # then holding the subscription until it lapsed: the heartbeats end first)
        if self._heartbeats is not threading.current_thread():
            self._heartbeats.join(timeout=HUNG_S)
        refs = [self._link.remove_consumer(p, self.consumer_id) for p in range(self.partitions)]
        wait_s = 0.0
        try:
            # (a partition that does not answer lets this consumer's lease lapse instead)
            answered = self._link.ready(refs, len(refs), HUNG_S)
            self._link.get(answered, what="subscription")
            wait_s = 10.0  # the calls under way are woken by the removal: redelivered
        except Unavailable as exc:  # its topic was deleted: nothing is left to hand back
            log.warning("closing consumer of %s/%s: %s", self.topic, self.subscription, exc)
        finally:
            self.receiver.drop_all(wait_s)

    @property
    def link(self) -> SubscriptionLink:
        """The calls to the subscription's partitions (the asyncio consumer awaits them)."""
        return self._link

    @property
    def closed(self) -> bool:
        return self._closed

    def ack_replies(self) -> list[Any]:
        """The ack and nack calls sent and not confirmed yet."""
        return self._acks.replies()

    def acks_kept(self) -> bool:
        """Whether acks or nacks wait for a down partition (then :meth:`flush` may wait)."""
        return self._acks.has_kept()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("consumer: it is closed")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
