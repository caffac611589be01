"""raydelay for asyncio: ``await producer.send(...)``, ``await consumer.receive(...)``,
``async for message in consumer``.

The asyncio client is the same client underneath: the same checks, the same batches, the
same ids, acks and guarantees. What differs is how it waits. Where the sync client blocks
a thread in ``ray.wait`` or ``ray.get``, this one awaits the Ray object refs of the same
calls in the event loop (``asyncio.wrap_future(ref.future())``), so that sends, receives,
acks and flushes never hold a thread:

- :meth:`Producer.send` queues in the event loop; one task carries what is queued as one
  append call per partition, as the sync producer's flusher thread does for
  ``send_async``, and each send's awaitable resolves once its message is durable.
- :meth:`Consumer.receive` keeps the sync consumer's receive calls standing at the
  partitions and awaits the first reply.

Setting up and tearing down (``create_producer``, ``subscribe``, closing a consumer, the
admin calls) run the sync client's calls in a worker thread (``asyncio.to_thread``): they
are made once, and some of them join threads of their own (a consumer's heartbeats). So do
the rare retries of an append whose partition is down. :func:`connect` runs in the event
loop's thread (see there).

    cluster = await raydelay.aio.connect()
    async with await cluster.create_producer("reminders") as producer:
        await producer.send(b"water the plants", deliver_after=1.0)
    async with await cluster.subscribe("reminders", "mailer") as consumer:
        async for message in consumer:
            ...
            await consumer.ack(message)
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from raydelay.client.appends import Appends
from raydelay.client.connection import Cluster as SyncCluster
from raydelay.client.connection import connect as sync_connect
from raydelay.client.consumer import Consumer as SyncConsumer
from raydelay.client.consumer import check_receive
from raydelay.client.message import (
    Message,
    MessageBatch,
    MessageId,
    MessageIds,
    messages_from_batch,
)
from raydelay.client.producer import Producer as SyncProducer
from raydelay.client.producer import queue_full
from raydelay.clock import now_ms
from raydelay.config import Config
from raydelay.errors import InvalidArgument
from raydelay.log.keys import check_on_duplicate

__all__ = ["Cluster", "Consumer", "Producer", "connect"]

ITERATE_BATCH = 100  # messages one ``async for`` step asks for at most
ITERATE_WAIT_S = 1.0  # ... and how long each of its receives waits


async def connect(
    config: str | os.PathLike | Config | dict | None = None, address: str | None = None
) -> Cluster:
    """:func:`raydelay.connect` for asyncio. It runs in the event loop's own thread and
    holds the loop while it starts or joins Ray (once, at start-up): Ray's processes that
    it may start are tied to the thread that started them, and a worker thread of the
    loop's executor ends when the loop does."""
    return Cluster(sync_connect(config, address))


def _seen(future: asyncio.Future) -> None:
    """A done-callback that takes a future's error, so that one nobody awaits again is
    not reported as never retrieved (the call's error is taken from its reply)."""
    if not future.cancelled():
        future.exception()


def _future_of(link: Any, reply: Any) -> asyncio.Future:
    future = asyncio.wrap_future(link.future(reply))
    future.add_done_callback(_seen)
    return future


class Cluster:
    """A raydelay cluster, for asyncio. ``sync`` is the :class:`raydelay.Cluster` under it,
    for any call not repeated here."""

    def __init__(self, sync: SyncCluster) -> None:
        self.sync = sync

    async def create_producer(
        self, topic: str, name: str | None = None, **options: Any
    ) -> Producer:
        """See :meth:`raydelay.Cluster.create_producer`."""
        producer = await asyncio.to_thread(self.sync.create_producer, topic, name, **options)
        return Producer(producer)

    async def subscribe(
        self, topic: str, subscription: str, subscription_type: str = "shared", **options: Any
    ) -> Consumer:
        """See :meth:`raydelay.Cluster.subscribe`; one topic (a name)."""
        if not isinstance(topic, str):
            raise InvalidArgument(
                f"topic: the asyncio client subscribes to one topic by name, got {topic!r}"
            )
        consumer = await asyncio.to_thread(
            self.sync.subscribe, topic, subscription, subscription_type, **options
        )
        assert isinstance(consumer, SyncConsumer)
        return Consumer(consumer)

    async def create_topic(self, topic: str, partitions: int = 1) -> None:
        await asyncio.to_thread(self.sync.create_topic, topic, partitions)

    async def delete_topic(self, topic: str, *, force: bool = False) -> int:
        return await asyncio.to_thread(self.sync.delete_topic, topic, force=force)

    async def topics(self) -> dict[str, int]:
        return await asyncio.to_thread(self.sync.topics)

    async def stats(self, topic: str, subscription: str | None = None) -> dict:
        return await asyncio.to_thread(self.sync.stats, topic, subscription)

    async def peek(self, topic: str, subscription: str, limit: int = 100, **options: Any) -> list:
        return await asyncio.to_thread(self.sync.peek, topic, subscription, limit, **options)

    async def cancel(
        self, message_ids: Any, /, key: str | None = None, *, keys: Sequence[str] | None = None
    ) -> Any:
        """See :meth:`raydelay.Cluster.cancel` (by id, or ``cancel(topic, key=...)``)."""
        return await asyncio.to_thread(self.sync.cancel, message_ids, key, keys=keys)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.sync.shutdown)

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


class Producer:
    """A producer for asyncio (:meth:`Cluster.create_producer`)."""

    def __init__(self, sync: SyncProducer) -> None:
        self.sync = sync
        self.topic = sync.topic
        self._link = sync.link
        # (partition, payload, key, properties, deliver_at ms, its future)
        self._queue: list[tuple[int, bytes, str | None, dict | None, int, asyncio.Future]] = []
        self._pending = 0  # sends queued or in flight
        self._changed = asyncio.Event()  # set when sends were queued or resolved
        self._task: asyncio.Task | None = None
        self._closed = False

    async def send(
        self,
        payload: bytes,
        *,
        deliver_after: float | timedelta | None = None,
        deliver_at: Any = None,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        on_duplicate: str = "ignore",
    ) -> MessageId:
        """Send one message; returns its MessageId once it is durable. Takes what
        :meth:`raydelay.Producer.send` takes, checked at the call. Sends made while a batch
        is on its way go in the next one (one append call per partition). With
        ``max_pending_messages`` unresolved, it waits for room, or raises
        ``ProducerQueueIsFull`` for a producer made with ``block_if_queue_full=False``.
        A keyed message scheduled for later goes on its own, in a worker thread (its key is
        checked on the partition's host: see ``on_duplicate``)."""
        self._check_open()
        partition, payload, key, properties, at = self.sync.checked_one(
            payload, deliver_after, deliver_at, key, properties
        )
        check_on_duplicate(on_duplicate)
        if key is not None and on_duplicate != "allow" and at > now_ms():
            ids = await asyncio.to_thread(
                self.sync.send_keyed,
                np.array([partition], dtype=np.int64),
                [payload],
                [key],
                None if properties is None else [properties],
                np.array([at], dtype=np.int64),
                on_duplicate,
            )
            return ids[0]
        while self._pending >= self.sync.pending_limit:
            if not self.sync.block_if_queue_full:
                raise queue_full(self._pending, self.sync.max_pending_messages)
            await self._wait_change()
            self._check_open()
        if partition < 0:
            partition = self.sync.next_sticky()
        future = asyncio.get_running_loop().create_future()
        self._queue.append((partition, payload, key, properties, at, future))
        self._pending += 1
        if self._task is None:
            self._task = asyncio.create_task(self._carry(), name=f"raydelay-send-{self.topic}")
        self._changed.set()
        return await future

    async def send_many(
        self,
        payloads: Any,
        *,
        deliver_after: Any = None,
        deliver_at: Any = None,
        keys: Any = None,
        properties: Any = None,
        on_duplicate: str = "ignore",
    ) -> MessageIds:
        """Send a batch (what :meth:`raydelay.Producer.send_many` takes); returns the
        MessageIds in input order once all are durable."""
        self._check_open()
        check_on_duplicate(on_duplicate)
        checked = self.sync.checked_many(payloads, deliver_after, deliver_at, keys, properties)
        if (
            checked[2] is not None
            and on_duplicate != "allow"
            and bool(np.any(checked[4] > now_ms()))
        ):
            return await asyncio.to_thread(self.sync.send_keyed, *checked, on_duplicate)
        ids, failed = await self._append(*checked)
        if failed:
            raise next(iter(failed.values()))
        return ids

    async def _append(
        self, parts: np.ndarray, payloads: Any, keys: list, props: list, d: np.ndarray
    ) -> tuple[MessageIds, dict[int, BaseException]]:
        """The sync producer's append, awaited: submit one call per partition, await every
        reply, then take the answers (a partition that failed is sent the same batches
        again, in a worker thread, as the sync producer does)."""
        appends: Appends = self.sync.submit(parts, payloads, keys, props, d)
        futures = [_future_of(self._link, reply) for reply in appends.replies()]
        if futures:
            await asyncio.wait(futures)
        answers: dict[int, Any] = {}
        for (p, _, datas, reply), future in zip(appends.calls, futures, strict=True):
            if future.exception() is None:
                answers[p] = self.sync.await_append(p, datas, reply)  # answered: no wait
                continue
            try:
                answers[p] = await asyncio.to_thread(self.sync.await_append, p, datas, reply)
            except Exception as exc:  # noqa: BLE001 - this partition's senders get it
                answers[p] = exc

        def answer(p: int, _datas: list[bytes], _reply: Any) -> list:
            found = answers[p]
            if isinstance(found, BaseException):
                raise found
            return found

        return self.sync.finish(appends, answer)

    async def _carry(self) -> None:
        """The task that sends what is queued, a batch at a time, and resolves each send."""
        while True:
            while not self._queue:
                if self._closed:
                    return
                await self._wait_change()
            batch, self._queue = self._queue, []
            futures = [b[5] for b in batch]
            parts = np.fromiter((b[0] for b in batch), dtype=np.int64, count=len(batch))
            try:
                ids, failed = await self._append(
                    parts,
                    [b[1] for b in batch],
                    [b[2] for b in batch],
                    [b[3] for b in batch],
                    np.fromiter((b[4] for b in batch), dtype=np.int64, count=len(batch)),
                )
            except BaseException as exc:  # noqa: BLE001 - nothing was appended: all get it
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for i, future in enumerate(futures):
                    if future.done():  # (its sender was cancelled: the message was sent)
                        continue
                    error = failed.get(int(parts[i]))
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(ids[i])
            finally:
                self._pending -= len(batch)
                self._changed.set()

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def flush(self) -> None:
        """Wait until every send made so far is resolved."""
        while self._pending:
            await self._wait_change()

    async def cancel(self, message_id: MessageId) -> bool:
        """See :meth:`raydelay.Producer.cancel`."""
        return await asyncio.to_thread(self.sync.cancel, message_id)

    async def cancel_keys(self, keys: Sequence[str]) -> list[bool]:
        """See :meth:`raydelay.Producer.cancel_keys`."""
        return await asyncio.to_thread(self.sync.cancel_keys, keys)

    async def close(self) -> None:
        """Send what is queued, then close the producer."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        self._changed.set()
        if self._task is not None:
            await self._task
        self.sync.close()

    def _check_open(self) -> None:
        if self._closed or self.sync.closed:
            raise InvalidArgument("producer: it is closed")

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Consumer:
    """A consumer for asyncio (:meth:`Cluster.subscribe`); ``async for message in
    consumer`` receives until the consumer is closed."""

    def __init__(self, sync: SyncConsumer) -> None:
        self.sync = sync
        self.topic = sync.topic
        self.subscription = sync.subscription
        self._link = sync.link
        self._receiver = sync.receiver
        self._waiting: dict[Any, asyncio.Future] = {}  # receive call -> its future
        self._iterated: deque[Message] = deque()

    async def receive(self, max_messages: int = 100, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout_s`` seconds for the first,
        and returns an empty list when none arrived in time."""
        out: list[Message] = []
        for p, rb in await self._take(max_messages, timeout_s):
            out.extend(messages_from_batch(self.topic, p, rb))
        return out

    async def receive_batch(
        self, max_messages: int = 10_000, timeout_s: float = 1.0
    ) -> MessageBatch:
        """Up to ``max_messages`` messages as one :class:`MessageBatch` of Arrow columns."""
        return MessageBatch(self.topic, await self._take(max_messages, timeout_s))

    async def _take(self, max_messages: int, timeout_s: float) -> list:
        """The sync receiver's rounds (:meth:`Receiver.take`), each awaited."""
        self._check_open()
        timeout_s = check_receive(max_messages, timeout_s)
        receiver = self._receiver
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not receiver.has_buffered():
            remaining = deadline - loop.time()
            step = receiver.begin(max_messages, max(remaining, 0.0))
            if not step.calls:  # every partition is down: wait for the first retry
                await asyncio.sleep(receiver.retry_wait_s(max(remaining, 0.0)))
            else:
                receiver.end(step, await self._first(step.calls, step.wait_s))
            if receiver.has_buffered() or remaining <= 0:
                break
        return receiver.take_buffered(max_messages)

    async def _first(self, calls: list[Any], wait_s: float) -> list[Any]:
        """Those of ``calls`` that answered, once the first one has (or after ``wait_s``)."""
        for call in [c for c in self._waiting if c not in calls]:
            del self._waiting[call]  # (taken in, or dropped)
        futures = []
        for call in calls:
            future = self._waiting.get(call)
            if future is None:
                future = self._waiting[call] = _future_of(self._link, call)
            futures.append(future)
        await asyncio.wait(futures, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        return [call for call, future in zip(calls, futures, strict=True) if future.done()]

    async def ack(self, messages: Any) -> None:
        """Acknowledge messages (what :meth:`raydelay.Consumer.ack` takes). The acks are
        sent at once and confirmed later; :meth:`flush` waits for them."""
        self.sync.ack(messages)

    async def nack(self, messages: Any, delay_s: float = 0.0) -> None:
        """See :meth:`raydelay.Consumer.nack`."""
        self.sync.nack(messages, delay_s)

    async def flush(self) -> None:
        """Wait until every ack and nack sent so far is applied."""
        replies = self.sync.ack_replies()
        if replies:
            await asyncio.wait([_future_of(self._link, r) for r in replies])
        if self.sync.acks_kept():  # a down partition's: retried, up to the retry deadline
            await asyncio.to_thread(self.sync.flush)
        else:
            self.sync.flush()  # every reply is in: this takes them, without waiting

    async def close(self) -> None:
        """Leave the subscription (see :meth:`raydelay.Consumer.close`)."""
        if self.sync.closed:
            return
        await self.flush()
        await asyncio.to_thread(self.sync.close)

    def _check_open(self) -> None:
        if self.sync.closed:
            raise InvalidArgument("consumer: it is closed")

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        while not self._iterated:
            if self.sync.closed:
                raise StopAsyncIteration
            try:
                self._iterated.extend(await self.receive(ITERATE_BATCH, ITERATE_WAIT_S))
            except InvalidArgument:
                if self.sync.closed:  # closed by another task while this one waited
                    raise StopAsyncIteration from None
                raise
        return self._iterated.popleft()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
