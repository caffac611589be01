"""What a :class:`Producer` and a :class:`Consumer` need from the partitions they talk
to, as two small protocols. The producer and the consumer hold no Ray code: the Ray
implementations are :class:`raydelay.actors.handles.TopicHandles` and
:class:`~raydelay.actors.handles.SubscriptionHandles` (built by
``raydelay.client.connection``), and unit tests pass fakes (``tests/unit/fakes.py``).

A call method *submits* and returns a reply at once (a Ray ObjectRef, for the Ray
implementation); :meth:`Link.ready` and :meth:`Link.get` wait for replies, so that one
consumer can keep a call standing at every partition and take whichever answers first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

Reply = Any  # a pending answer of one call


class Link(Protocol):
    """Calls to the partitions of one topic (on their hosts), or of one subscription."""

    partitions: int
    deadline_s: float  # how long a retried call goes on (``client.retry_deadline_s``)

    def ready(self, replies: Sequence[Reply], num: int, timeout_s: float) -> list[Reply]:
        """The replies among ``replies`` that have answered, waiting up to ``timeout_s``
        seconds until ``num`` of them have."""
        ...

    def future(self, reply: Reply) -> Future:
        """A ``concurrent.futures.Future`` done when ``reply`` has answered, for an asyncio
        caller to await (``asyncio.wrap_future``) where a thread would wait in
        :meth:`ready`. Its result is not translated: :meth:`get` then takes the answer."""
        ...

    def get(self, replies: Reply | list[Reply], what: str, timeout_s: float | None = None) -> Any:
        """The answer (or answers) of ``replies``; raises what the call raised, with
        ``Unavailable`` for an actor that is down (or did not answer in ``timeout_s``)."""
        ...

    def retried(
        self,
        submit: Callable[[], Reply | list[Reply]],
        what: str,
        *,
        partition: int | None = None,
        deadline_s: float | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Submit and wait, again while the actor is down or the store fails retriably,
        for up to ``deadline_s`` (default ``client.retry_deadline_s``); ``partition``'s
        actor is looked up again after each failure. Only for idempotent calls."""
        ...

    def reconnect(self, partition: int) -> None:
        """Look the partition's actor up again, re-creating it if it ended (raises if that
        fails; ``NotFound`` once its topic or subscription is deleted)."""
        ...

    def connected(self) -> bool:
        """False once this process left the cluster (its background threads then stop)."""
        ...


class TopicLink(Link, Protocol):
    """What a producer calls: a topic's partitions."""

    def append(self, partition: int, batches: list[bytes]) -> Reply:
        """Append encoded batches in order; the answer is each batch's position ranges."""
        ...

    def append_keyed(self, partition: int, batch: bytes, on_duplicate: str) -> Reply:
        """Append one encoded batch whose keys are its messages' identities; the answer
        is a ``KeyedReply`` (``raydelay.actors.partition.keyed``)."""
        ...

    def cancel_keys(
        self, partition: int, keys: list[str], producer: str, sequence_id: int
    ) -> Reply:
        """Cancel markers for the messages pending under ``keys``; the answer is, per key,
        its [(target, marker)]."""
        ...

    def guard_keys(self, keys: list[str]) -> None:
        """InvalidArgument for keys a cancel by key must not take (a schedule's, on the
        tasks topic); nothing is written."""
        ...

    def pending_keys(self, partition: int, keys: list[str]) -> Reply:
        """The answer maps each of ``keys`` that a message pending holds to its positions."""
        ...

    def apply(
        self,
        work: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]],
        subscriptions: Callable[[], list[str]] | None = None,
    ) -> dict[int, list[bool]]:
        """Have every subscription apply cancel markers already in the log ({partition:
        (targets, markers)}); per partition, whether each target was kept from delivery.
        ``subscriptions``: the getter :meth:`subscriptions_ahead` gave (None: looked up
        now)."""
        ...

    def subscriptions_ahead(self) -> Callable[[], list[str]]:
        """Start looking up the topic's subscriptions now, beside the markers' write; the
        getter waits for them (a cancel by id takes its list before it writes, too)."""
        ...

    def last_sequence(self, partition: int, producer: str) -> Reply:
        """The largest sequence id the partition holds from ``producer``."""
        ...

    def cancel(
        self, batches: dict[int, tuple[list[tuple[int, int]], int]], producer: str
    ) -> tuple[dict[int, list[bool]], int]:
        """Cancel markers for ``{partition: (positions, sequence id)}``, applied by every
        subscription; per partition whether each target was cancelled before delivery, and
        how many times the markers were sent again."""
        ...

    def check_cancel(self, targets: dict[int, list[tuple[int, int]]]) -> None:
        """NotFound for the first of ``{partition: positions}`` that a cancel would
        refuse; nothing is written."""
        ...


class SubscriptionLink(Link, Protocol):
    """What a consumer calls: a subscription's partitions."""

    def receive(
        self, partition: int, consumer: str, max_messages: int, timeout_s: float, rewinds: int
    ) -> Reply:
        """Up to ``max_messages`` messages for ``consumer``, as one Arrow record batch."""
        ...

    def receive_many(
        self, partitions: list[int], consumer: str, max_messages: int, timeout_s: float,
        rewinds: int, packed: bool = False, ahead_ms: int = 0,
    ) -> Reply:  # fmt: skip
        """One receive at ``partitions``, which one actor serves (a group of
        :meth:`heartbeat_groups`): up to ``max_messages`` from each. The answer comes when
        any has messages (or fails): a ``ReceiveReply`` (``raydelay.actors.protocol``), its
        ``got`` [(partition, record batch)] and ``failed`` [(partition, error)]; with
        ``packed``, each record batch as ``raydelay.dispatch.wire.pack_delivery`` makes
        it. With ``ahead_ms``, delayed messages due within that many ms come too: the
        caller holds each until its due time."""
        ...

    def ack(self, partition: int, consumer: str, keys: np.ndarray) -> Reply: ...

    def ack_many(
        self, acks: list[tuple[int, np.ndarray]], consumer: str, nack: tuple | None = None
    ) -> Reply:
        """Acks (or, with ``nack`` = (delay_s, nacked_at_ms), nacks) at partitions one actor
        serves, (partition, keys) each, in one call; the answer maps each partition whose
        ack failed to its error."""
        ...

    def nack(
        self, partition: int, consumer: str, keys: np.ndarray, delay_s: float, nacked_at_ms: int
    ) -> Reply: ...

    def heartbeat_groups(self) -> list[list[int]]:
        """The partitions, grouped by the actor that serves them (one heartbeat each)."""
        ...

    def actor_of(self, partition: int) -> str:
        """The name of the actor serving ``partition`` (cheap: no call)."""
        ...

    def node_of(self, partition: int) -> str | None:
        """The node of the actor serving ``partition`` now (None: not placed, or none);
        asks Ray's control service, so only off the receive path."""
        ...

    def heartbeat(self, partitions: list[int], consumer: str) -> Reply:
        """Renew the consumer's lease at ``partitions`` (one group); the answer is a bool per
        partition, False where it lost its place."""
        ...

    def add_consumer(self, partition: int, consumer: str) -> Reply: ...

    def remove_consumer(self, partition: int, consumer: str) -> Reply: ...

    def redeliver(
        self,
        partition: int,
        consumer: str,
        keys: np.ndarray | None,
        rewinds: int = 0,
        check_only: bool = False,
    ) -> Reply:
        """Give back ``keys`` (None: all the consumer holds); the answer is how many."""
        ...
