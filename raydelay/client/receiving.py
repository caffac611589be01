"""A consumer's receive calls and what they brought.

One long-poll call stands at each subscription actor (for all the partitions of this
consumer it serves) and, with ``prefetch``, is put back as soon as it answers (so at
most one round of replies waits here beyond what was asked for). What the calls return
(one Arrow record batch per partition) is buffered as it came and handed out in order of
arrival. A partition whose call fails, or hangs well past its timeout, is marked down
(:mod:`raydelay.client.partition_health`) and the others go on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raydelay.client.held import HeldRows
from raydelay.client.partition_health import PartitionHealth
from raydelay.clock import now_ms
from raydelay.dispatch.wire import unpack_delivery
from raydelay.errors import StorageError, Unavailable

if TYPE_CHECKING:
    from raydelay.client.links import SubscriptionLink

HUNG_S = 5.0  # a receive this long past its timeout: its partition is down
# How long a prefetch call stands at a partition (seconds) before it is renewed. It must
# not follow the caller's timeout: a call made with the few milliseconds a receive has
# left returns empty at once, and renewing it spins the subscription actors.
STANDING_S = 2.0


@dataclass(frozen=True)
class Poll:
    """One round of a receive (:meth:`Receiver.begin`): the calls under way, each
    partition's share, how long a call stands, and how long to wait for the first."""

    calls: list[Any]
    share: int
    call_s: float
    wait_s: float


class Receiver:
    """The receive calls under way at a consumer's partitions and the buffer they fill."""

    def __init__(
        self,
        link: SubscriptionLink,
        consumer_id: str,
        groups: list[tuple[int, ...]],
        health: PartitionHealth,
        *,
        partitions: int,
        prefetch: bool,
        rewinds: Callable[[], int],
        returned: Callable[[list[tuple[pa.RecordBatch, int]]], None] | None = None,
        ahead_ms: int = 0,
    ) -> None:
        """``returned`` is told of the record batches :meth:`take_buffered` hands out, each
        with the time its reply was made (epoch ms; 0: not known), or for rows held until
        they were due, their due time. ``ahead_ms``: the calls ask for delayed messages
        due that soon too, and they are held here until they are due
        (:mod:`raydelay.client.held`)."""
        self._link = link
        self._consumer_id = consumer_id
        self._groups = groups  # the partitions by the actor serving them
        self._partitions = partitions
        self._health = health
        self.prefetch = prefetch
        self._rewinds = rewinds  # the consumer's redeliver-all calls so far
        self._returned = returned
        # (partition, rows, when their reply was made)
        self._buffer: deque[tuple[int, pa.RecordBatch, int]] = deque()
        self._inflight: dict[Any, tuple[int, ...]] = {}  # receive ref -> partitions
        self._asked: dict[Any, float] = {}  # receive ref -> when it is overdue (monotonic)
        self.ahead_ms = ahead_ms
        self._held = HeldRows()

    def take(self, max_messages: int, timeout_s: float) -> list[tuple[int, pa.RecordBatch]]:
        """Up to ``max_messages`` rows, waiting up to ``timeout_s`` for the first."""
        deadline = time.monotonic() + timeout_s
        while not self.has_buffered():
            remaining = deadline - time.monotonic()
            self._poll(max_messages, max(remaining, 0.0))
            if self.has_buffered() or remaining <= 0:
                break
        return self.take_buffered(max_messages)

    def drop_all(self, wait_s: float) -> None:
        """Forget the calls under way (waiting up to ``wait_s`` for them to answer: what
        they carry is redelivered) and what the buffer holds."""
        try:
            if self._inflight and wait_s > 0:
                self._link.ready(list(self._inflight), len(self._inflight), wait_s)
        finally:
            self._inflight.clear()
            self._asked.clear()
            self._buffer.clear()
            self._held.clear()

    def has_buffered(self) -> bool:
        """Whether rows wait to be taken (held rows that came due now among them)."""
        self._buffer.extend(self._held.release())
        return bool(self._buffer)

    def held(self) -> int:
        """How many rows are held until they are due."""
        return len(self._held)

    def calls(self) -> list[Any]:
        """The receive calls under way (Ray object refs)."""
        return list(self._inflight)

    def take_buffered(self, max_messages: int) -> list[tuple[int, pa.RecordBatch]]:
        """Up to ``max_messages`` of what the buffer holds, in order of arrival (held rows
        as they fall due)."""
        self._buffer.extend(self._held.release())
        out: list[tuple[int, pa.RecordBatch]] = []
        made: list[tuple[pa.RecordBatch, int]] = []
        room = max_messages
        while self._buffer and room > 0:
            p, rb, made_ms = self._buffer[0]
            if rb.num_rows > room:
                self._buffer[0] = (p, rb.slice(room), made_ms)
                rb = rb.slice(0, room)
            else:
                self._buffer.popleft()
            out.append((p, rb))
            made.append((rb, made_ms))
            room -= rb.num_rows
        if made and self._returned is not None:
            self._returned(made)
        return out

    def _poll(self, max_messages: int, timeout_s: float) -> None:
        step = self.begin(max_messages, timeout_s)
        if not step.calls:  # every partition is down: wait for the first retry
            time.sleep(self.retry_wait_s(timeout_s))
            return
        self.end(step, self._link.ready(step.calls, 1, step.wait_s))

    def begin(self, max_messages: int, timeout_s: float) -> Poll:
        """One round of a receive: a call standing at every partition that is up. The
        caller waits (up to ``wait_s``) for the first of ``calls`` to answer, then
        :meth:`end` takes in what came (the asyncio consumer awaits instead of waiting)."""
        share, call_s, wait_s = self.plan(max_messages, timeout_s)
        self.ask(share, call_s)
        return Poll(list(self._inflight), share, call_s, wait_s)

    def end(self, step: Poll, ready: list) -> None:
        """Take in the replies of a round, ``ready`` those that answered."""
        if ready and len(ready) < len(step.calls):  # every other reply already there too
            more = self._link.ready(step.calls, len(step.calls), 0)
            ready = list(dict.fromkeys(ready + more))
        self.collect(ready)
        # With prefetch, a call stands at every partition again at once, while the caller
        # works on what arrived: a message falling due meanwhile is answered the moment it is
        # due, not when the next receive reaches the partition (as Pulsar's consumer
        # prefetches).
        if self.prefetch:
            self.ask(step.share, step.call_s)

    def retry_wait_s(self, timeout_s: float) -> float:
        """How long to wait, with every partition down, for the first retry (or a held
        row to fall due)."""
        return self._until_held(self._health.next_retry_s(timeout_s))

    def _until_held(self, wait_s: float) -> float:
        """``wait_s``, cut to the time until the first held row is due."""
        held_s = self._held.wait_s()
        return wait_s if held_s is None else min(wait_s, held_s)

    def plan(self, max_messages: int, timeout_s: float) -> tuple[int, float, float]:
        """(each partition's share, how long a receive call stands, how long to wait for
        the first answer). Each partition is asked for its share, so that about
        ``max_messages`` wait here (assigned to this consumer, their ack deadlines
        running) per round of replies."""
        share = -(-max_messages // self._partitions)
        if self.prefetch:  # calls outlive this receive: wait only for this one's timeout
            return share, max(timeout_s, STANDING_S), self._until_held(timeout_s)
        # calls end with this receive's timeout; the margin covers the trip back (a wait
        # ends when a held row falls due, the call stays for the next receive)
        return share, timeout_s, self._until_held(timeout_s + 5.0)

    def collect(self, ready: list) -> None:
        """Take in the receive calls of ``ready`` that are this consumer's (and mark the
        partitions of calls long overdue down)."""
        taken_ms = now_ms()  # (before the gets: their time is not the reply's trip)
        for ref in ready:
            parts = self._inflight.pop(ref, None)
            if parts is None:
                continue
            self._asked.pop(ref, None)  # (both maps change together)
            try:
                reply = self._link.get(ref, what=f"subscription {list(parts)}")
            except (StorageError, Unavailable) as exc:
                for p in parts:
                    self._receive_failed(p, exc)
                continue
            if self.ahead_ms and reply.got:
                self._held.came(reply.made_ms, taken_ms)
            for p, got in reply.got:
                rb = unpack_delivery(got)
                if rb.num_rows and self.ahead_ms:  # (rows not due yet are held)
                    rb = self._held.split(p, rb, reply.made_ms)
                if rb is not None and rb.num_rows:
                    self._buffer.append((p, rb, reply.made_ms))
            failed = reply.failed
            for p in set(parts) - {p for p, _ in failed}:
                self._health.up(p)
            for p, err in failed:  # (after what the others brought is taken in)
                self._receive_failed(p, err)
        now = time.monotonic()
        for ref, overdue in list(self._asked.items()):
            if now > overdue:  # no answer long after its timeout: the actor hangs
                self._asked.pop(ref)  # (its reply, if one comes, is still taken)
                for p in self._inflight.get(ref, ()):
                    self._health.failed(p, Unavailable("no answer"))

    def _receive_failed(self, p: int, exc: BaseException) -> None:
        """A receive at ``p`` failed: down, when the actor is unavailable or the store
        failed retriably; any other error is raised."""
        if isinstance(exc, Unavailable) or (isinstance(exc, StorageError) and exc.retriable):
            self._health.failed(p, exc)
        else:
            raise exc

    def ask(self, share: int, timeout_s: float) -> None:
        """A receive call outstanding at every partition that has none and is not down
        (one that is down is asked again once its backoff ran out): one call for the
        partitions of one actor."""
        busy = {p for parts in self._inflight.values() for p in parts}
        now = time.monotonic()
        down = self._health.down
        for group in self._groups:
            # a down partition is looked up again by the retry thread (it may be re-created:
            # slow, and never on this thread); it is asked once that is done (retry_at 0)
            parts = tuple(p for p in group if p not in busy and not down.get(p, 0) > 0)
            if not parts:
                continue
            # (one partition too: its reply says when it was made, a bare batch would not)
            call = self._link.receive_many(
                list(parts),
                self._consumer_id,
                share,
                timeout_s,
                self._rewinds(),
                packed=True,
                ahead_ms=self.ahead_ms,
            )
            self._inflight[call] = parts
            self._asked[call] = now + timeout_s + HUNG_S
