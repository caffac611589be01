"""A consumer's acks and nacks on their way to the subscription.

``ack`` and ``nack`` send one call per subscription actor with the positions as one
int64 array per partition, and do not wait for the reply: the calls stay outstanding,
and a later ``ack`` or ``nack`` confirms those that answered (any failure but an
unavailable partition is raised there). A down partition's calls are kept for the
retry thread (:mod:`raydelay.client.partition_health`). ``settle`` waits for every one.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from raydelay.client.message import Message, MessageBatch, MessageId
from raydelay.client.partition_health import Nack, PartitionHealth, Work
from raydelay.errors import InvalidArgument, StorageError, Unavailable
from raydelay.positions import LOW, MAX_LEDGER_ID, position_in_range, position_keys

if TYPE_CHECKING:
    from raydelay.client.links import SubscriptionLink

ACKS_IN_FLIGHT = 16  # ack calls left unconfirmed before an ack looks at the answers
ACKS_QUEUED = 256  # ... and past this many the oldest are waited for, briefly
SETTLE_WAIT_S = 0.5  # how long an ack waits for an old one before taking it back


class AckQueue:
    """The ack and nack calls sent and not confirmed yet, one consumer's."""

    def __init__(
        self,
        link: SubscriptionLink,
        consumer_id: str,
        subscription: str,
        groups: list[tuple[int, ...]],
        health: PartitionHealth,
    ) -> None:
        self._link = link
        self._consumer_id = consumer_id
        self._subscription = subscription
        self._groups = groups  # the partitions by the actor serving them
        self._health = health
        # (partition, keys, the nack or None for an ack, ref)
        self._acks: deque[tuple[int, np.ndarray, Nack | None, Any]] = deque()

    def submit(self, by_partition: dict[int, np.ndarray], nack: Nack | None) -> None:
        """Send acks (``nack`` None) or nacks, one call per actor; a down partition's are
        kept for the retry thread."""
        going = {}
        for p, keys in by_partition.items():
            if self._health.keeps(p):  # (keeps them in order)
                self._health.defer(p, keys, nack)
            else:
                going[p] = keys
        for group in self._groups:  # one call per actor
            acks = [(p, going[p]) for p in group if p in going]
            if len(acks) > 1:
                ref = self._link.ack_many(acks, self._consumer_id, nack)
            elif acks and nack is None:
                ref = self._link.ack(acks[0][0], self._consumer_id, acks[0][1])
            elif acks and nack is not None:
                ref = self._link.nack(acks[0][0], self._consumer_id, acks[0][1], *nack)
            for p, keys in acks:  # (the partitions of one call share its answer)
                self._acks.append((p, keys, nack, ref))
        if len(self._acks) > ACKS_IN_FLIGHT:
            self._reap()

    def replies(self) -> list[Any]:
        """The ack and nack calls sent and not confirmed yet (one each)."""
        return list(dict.fromkeys(a[3] for a in self._acks))

    def has_kept(self) -> bool:
        """Whether a down partition's acks or nacks wait for the retry thread."""
        return self._health.has_kept()

    def send(self, p: int, work: Work) -> list[Any]:
        """Ack and nack calls for ``work`` (acks merged into one), in their order."""
        link, cid = self._link, self._consumer_id
        refs, acks = [], []
        for keys, nack in work:
            if nack is None:
                acks.append(keys)
                continue
            if acks:
                refs.append(link.ack(p, cid, np.concatenate(acks)))
                acks = []
            refs.append(link.nack(p, cid, keys, *nack))
        if acks:
            refs.append(link.ack(p, cid, np.concatenate(acks)))
        return refs

    def _confirm(
        self,
        p: int,
        keys: np.ndarray,
        nack: Nack | None,
        ref: Any,
        timeout_s: float | None = None,
    ) -> None:
        """Take the answer of an ack or nack call: a partition that is down (or does not
        answer within ``timeout_s``) gets the call again later; any other failure is
        raised."""
        try:
            failed = self._link.get(ref, what=f"subscription {p}", timeout_s=timeout_s)
            if isinstance(failed, dict) and p in failed:  # (one call for several partitions)
                raise failed[p]
        except (Unavailable, StorageError) as exc:
            if isinstance(exc, StorageError) and not exc.retriable:
                raise
            self._health.failed(p, exc)
            self._health.defer(p, keys, nack)

    def _reap(self) -> None:
        """Confirm the calls that answered, without waiting; past ``ACKS_QUEUED`` still
        open, wait briefly for the oldest, and keep the calls of a partition that does not
        answer for the retry thread."""
        refs = list(dict.fromkeys(a[3] for a in self._acks))  # (one per call, as Ray wants)
        done = set(self._link.ready(refs, len(refs), 0))
        answered = [item for item in self._acks if item[3] in done]
        self._acks = deque(item for item in self._acks if item[3] not in done)
        for i, item in enumerate(answered):
            try:
                self._confirm(*item)
            except BaseException:  # raised once; the answers after it are still taken
                for later in answered[i + 1 :]:
                    self._acks.appendleft(later)
                raise
        while len(self._acks) > ACKS_QUEUED:
            p, keys, nack, ref = self._acks.popleft()
            if p not in self._health.down and self._link.ready([ref], 1, SETTLE_WAIT_S):
                self._confirm(p, keys, nack, ref)
            else:  # (sent again later: acks and nacks are idempotent)
                self._health.failed(p, Unavailable("no answer"))
                self._health.defer(p, keys, nack)

    def settle(self) -> None:
        """Confirm every ack and nack sent so far, waiting for the answers, and send the
        kept ones of down partitions (retried until ``client.retry_deadline_s``)."""
        give_up = time.monotonic() + self._link.deadline_s

        def left() -> float:
            return max(0.1, give_up - time.monotonic())

        while self._acks:
            self._confirm(*self._acks.popleft(), timeout_s=left())
        while True:
            deferred = self._health.take_kept(left())
            if not deferred:
                return
            pending = sorted(deferred.items())
            try:
                while pending:
                    p, work = pending[0]

                    def send(p: int = p, work: Work = work) -> list:
                        return self.send(p, work)

                    self._link.retried(
                        send,
                        f"subscription {self._subscription} partition {p}",
                        partition=p,
                        deadline_s=left(),
                        timeout_s=left(),
                    )
                    pending.pop(0)
                    self._health.up(p)
            finally:  # what did not go through is kept for the retry thread
                self._health.keep(pending)


def group_by_partition(
    messages: Any, field: str, topic: str, partitions: int
) -> dict[int, np.ndarray]:
    """partition -> int64 position keys of ``messages`` (a MessageBatch, a Message or
    MessageId, or an iterable of them) of ``topic``; anything else is an InvalidArgument
    naming ``field``."""
    if isinstance(messages, MessageBatch):
        if messages.topic != topic:
            raise InvalidArgument(f"{field}: a batch of topic {messages.topic!r}, not {topic!r}")
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
    if any(i[0] != topic for i in ids) or (n and (parts.min() < 0 or parts.max() >= partitions)):
        bad = next(i for i in ids if i[0] != topic or not 0 <= i[1] < partitions)
        raise InvalidArgument(f"{field}: {bad} is not a message of topic {topic!r}")
    if n and (
        ledgers.min() < 0
        or ledgers.max() > MAX_LEDGER_ID
        or entries.min() < 0
        or entries.max() > LOW
    ):
        bad = next(i for i in ids if not position_in_range(i[2], i[3]))
        raise InvalidArgument(f"{field}: {bad} is no message position (out of range)")
    keys = position_keys(ledgers, entries)
    return {int(p): keys[parts == p] for p in np.unique(parts)}
