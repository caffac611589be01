"""pulsar-client's asyncio API (``pulsar.asyncio``, since 3.5) over raydelay: a program
written for it runs with its import changed to ``raydelay.compat.pulsar.asyncio``.

The objects are the sync compat's (:mod:`raydelay.compat.pulsar`), so every behaviour and
check is the same; what differs is how a call waits:

- ``Consumer.receive`` (one topic) awaits the receive calls' Ray object refs in the event
  loop (:mod:`raydelay.aio`): nothing blocks a thread while no message is due.
- ``Producer.send`` queues on the compat producer, whose carrier thread sends a batch per
  partition, and its callback resolves the awaited future in the loop (as pulsar-client's
  asyncio API resolves its futures from its C++ client's threads).
- Readers, multi-topic consumers and the calls made once (create, subscribe, seek,
  unsubscribe, close) run the sync call in a worker thread. A receive or a read cancelled
  while its thread still waits does not lose what the thread then takes: it goes back to
  the front of the consumer's (or reader's) queue.

Errors are :class:`PulsarException` with the :class:`~raydelay.compat.pulsar.Result` of
the failure (``e.error()``), as in pulsar-client; argument errors stay ``ValueError`` /
``TypeError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from raydelay.aio import Consumer as _AioConsumer
from raydelay.client.consumer import Consumer as _CoreConsumer
from raydelay.compat.pulsar import client as _client
from raydelay.compat.pulsar import consumer as _consumer
from raydelay.compat.pulsar import exceptions as _exc
from raydelay.compat.pulsar import producer as _producer
from raydelay.compat.pulsar import reader as _reader
from raydelay.compat.pulsar._endpoint import wrap_message
from raydelay.compat.pulsar.enums import Result
from raydelay.compat.pulsar.message import Message, MessageId
from raydelay.compat.pulsar.schema import BytesSchema
from raydelay.errors import InvalidArgument, NotFound

__all__ = ["Client", "Consumer", "Producer", "PulsarException", "Reader"]

_STEP_S = 0.25  # how long one blocking step of a reader (or multi-topic receive) waits

# the compat's own errors, by the result code pulsar-client gives them
_RESULTS: tuple[tuple[type[BaseException], Result], ...] = (
    (_exc.AlreadyClosed, Result.AlreadyClosed),
    (_exc.Timeout, Result.Timeout),
    (_exc.ConsumerBusy, Result.ConsumerBusy),
    (_exc.TopicNotFound, Result.TopicNotFound),
    (
        _exc.CumulativeAcknowledgementNotAllowedError,
        Result.CumulativeAcknowledgementNotAllowedError,
    ),
    (_exc.OperationNotSupported, Result.OperationNotSupported),
    (_exc.ConnectError, Result.ConnectError),
    (NotFound, Result.TopicNotFound),
)


class PulsarException(Exception):
    """A failed call, with its result code (:meth:`error`) and what happened."""

    def __init__(self, result: Result, msg: str | None = None) -> None:
        super().__init__(result, msg)
        self._result = result
        self._msg = msg

    def error(self) -> Result:
        return self._result

    def __str__(self) -> str:
        head = f"{self._result.value} {self._result.name}"
        return f"{head}: {self._msg}" if self._msg else head


def _as_pulsar(exc: Exception) -> Exception:
    """``exc`` as pulsar-client's asyncio API raises it."""
    if isinstance(exc, PulsarException):
        return exc
    for kind, result in _RESULTS:
        if isinstance(exc, kind):
            return PulsarException(result, str(exc))
    if isinstance(exc, InvalidArgument) and "max_message_bytes" in str(exc):
        return PulsarException(Result.MessageTooBig, str(exc))
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return exc  # argument errors and unsupported features, as in pulsar-client
    return PulsarException(Result.UnknownError, str(exc))


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The sync compat call ``fn`` in a worker thread, its errors as pulsar's."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - translated, with the original chained
        raise _as_pulsar(exc) from exc


def _now(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The sync compat call ``fn``, which does not wait, its errors as pulsar's."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - translated, with the original chained
        raise _as_pulsar(exc) from exc


class _Fetches:
    """The blocking fetches of one reader or consumer, in worker threads, one at a time.
    A read cancelled (``asyncio.wait_for``) while its thread still waits leaves that
    thread running; what it then brings is put back at the front of the queue. The next
    read waits for it first, so that no later message is taken before it."""

    def __init__(self) -> None:
        self._running: asyncio.Future | None = None

    async def until_some(
        self, fetch: Callable[[float], list], put_back: Callable[[list], None]
    ) -> list:
        """Call the blocking ``fetch(step_s)`` until it returns something."""
        loop = asyncio.get_running_loop()
        while True:
            left = self._running
            if left is not None and not left.done():
                # (its put_back was registered first: it runs before this wakes)
                await asyncio.wait([left])
            step = self._running = loop.run_in_executor(None, fetch, _STEP_S)
            try:
                got = await asyncio.shield(step)
            except asyncio.CancelledError:

                def keep(done: asyncio.Future) -> None:
                    if not done.cancelled() and done.exception() is None and done.result():
                        put_back(done.result())

                step.add_done_callback(keep)
                raise
            except Exception as exc:  # noqa: BLE001 - translated
                raise _as_pulsar(exc) from exc
            if got:
                return got


async def _seek(sync: Any, messageid: Any) -> None:
    if not isinstance(messageid, MessageId | int) or isinstance(messageid, bool):
        raise ValueError(f"invalid messageid type {type(messageid)}")
    await _call(sync.seek, messageid)


def _set_future(future: asyncio.Future, result: Result, value: Any) -> None:
    """Resolve ``future`` from any thread: with ``value`` when ``result`` is Ok, else with
    a :class:`PulsarException`; nothing when it is done already (cancelled, say)."""

    def complete() -> None:
        if future.done():
            return
        if result == Result.Ok:
            future.set_result(value)
        else:
            future.set_exception(PulsarException(result))

    future.get_loop().call_soon_threadsafe(complete)


class Producer:
    """Publishes to one topic (:meth:`Client.create_producer`)."""

    def __init__(self, sync: _producer.Producer) -> None:
        self._sync = sync

    async def send(
        self,
        content: Any,
        properties: dict | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list | None = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send one message; returns its id once it is durable."""
        future = asyncio.get_running_loop().create_future()

        def done(result: Result, message_id: MessageId | None) -> None:
            _set_future(future, result, message_id)

        _now(
            self._sync.send_async,
            content,
            done,
            properties=properties,
            partition_key=partition_key,
            ordering_key=ordering_key,
            sequence_id=sequence_id,
            replication_clusters=replication_clusters,
            disable_replication=disable_replication,
            event_timestamp=event_timestamp,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )
        return await future

    async def flush(self) -> None:
        """Wait until every message sent so far is durable (or failed)."""
        await _call(self._sync.flush)

    async def close(self) -> None:
        """Flush, then close; closing a closed producer is ``AlreadyClosed``."""
        if not self._sync.is_connected():
            raise PulsarException(Result.AlreadyClosed, "the producer is closed")
        await _call(self._sync.close)

    def topic(self) -> str:
        return self._sync.topic()

    def producer_name(self) -> str:
        return self._sync.producer_name()

    def last_sequence_id(self) -> int:
        return self._sync.last_sequence_id()

    def is_connected(self) -> bool:
        return self._sync.is_connected()


class Consumer:
    """Receives from a subscription (:meth:`Client.subscribe`)."""

    def __init__(self, sync: _consumer.Consumer) -> None:
        self._sync = sync
        core = sync._core
        # one topic: the receive calls' refs are awaited; several: a thread steps
        self._aio = _AioConsumer(core) if isinstance(core, _CoreConsumer) else None
        self._fetches = _Fetches()

    async def receive(self) -> Message:
        """The next message, once one is there (``asyncio.wait_for`` bounds the wait)."""
        sync = self._sync
        if sync._listener is not None:
            raise PulsarException(
                Result.InvalidConfiguration, "receive: this consumer has a message listener"
            )
        while True:
            got = _now(sync._pop, 1)
            if got:
                return sync._wrap(got[0])
            if self._aio is not None:
                try:
                    more = await self._aio.receive(max_messages=sync._fill, timeout_s=_STEP_S)
                except InvalidArgument as exc:  # closed meanwhile
                    raise PulsarException(Result.AlreadyClosed, str(exc)) from exc
            else:
                more = await self._fetches.until_some(self._receive_step, self._give_back)
            sync._refill(more)

    def _receive_step(self, step_s: float) -> list:
        return self._sync._core.receive(max_messages=self._sync._fill, timeout_s=step_s)

    def _give_back(self, messages: list) -> None:
        self._sync._refill(messages, first=True)

    async def acknowledge(self, message: Message | MessageId) -> None:
        _now(self._sync.acknowledge, message)

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        _now(self._sync.acknowledge_cumulative, message)

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        _now(self._sync.negative_acknowledge, message)

    def redeliver_unacknowledged_messages(self) -> None:
        _now(self._sync.redeliver_unacknowledged_messages)

    async def unsubscribe(self) -> None:
        await _call(self._sync.unsubscribe)

    async def seek(self, messageid: MessageId | int) -> None:
        """Move the subscription's cursor to a message id or a publish time (epoch ms)."""
        await _seek(self._sync, messageid)

    async def close(self) -> None:
        await _call(self._sync.close)

    async def get_last_message_id(self) -> MessageId:
        return await _call(self._sync.get_last_message_id)

    def topic(self) -> str:
        return self._sync.topic()

    def subscription_name(self) -> str:
        return self._sync.subscription_name()

    def consumer_name(self) -> str:
        return self._sync.consumer_name()


class Reader:
    """Reads a topic in log order (:meth:`Client.create_reader`)."""

    def __init__(self, sync: _reader.Reader) -> None:
        self._sync = sync
        self._fetches = _Fetches()

    async def read_next(self) -> Message:
        """The next message, once one is there (``asyncio.wait_for`` bounds the wait)."""
        sync = self._sync
        core = sync._core

        def fetch(step_s: float) -> list:
            m = core.read_next(step_s)
            return [] if m is None else [m]

        sync._check_open()
        (m,) = await self._fetches.until_some(fetch, core.unread)
        return wrap_message(sync._topics, m, BytesSchema(), sync._topic_name, sync._partitions)

    async def has_message_available(self) -> bool:
        return await _call(self._sync.has_message_available)

    async def seek(self, messageid: MessageId | int) -> None:
        """Read from a message id or a publish time (epoch ms) on."""
        await _seek(self._sync, messageid)

    async def close(self) -> None:
        await _call(self._sync.close)

    def topic(self) -> str:
        return self._sync.topic()

    def is_connected(self) -> bool:
        return self._sync.is_connected()


class Client:
    """pulsar-client's asyncio ``Client``: takes what :class:`raydelay.compat.pulsar.Client`
    takes (``cluster``, ``config`` and ``address`` among them)."""

    def __init__(self, service_url: Any, **kwargs: Any) -> None:
        self._sync = _client.Client(service_url, **kwargs)
        # Connected here, in the caller's thread (the event loop's), not in a worker
        # thread later: the Ray this may start is tied to the thread that starts it
        self._sync._cluster  # noqa: B018

    async def create_producer(self, topic: str, **kwargs: Any) -> Producer:
        return Producer(await _call(self._sync.create_producer, topic, **kwargs))

    async def subscribe(self, topic: Any, subscription_name: str, **kwargs: Any) -> Consumer:
        return Consumer(await _call(self._sync.subscribe, topic, subscription_name, **kwargs))

    async def create_reader(self, topic: str, start_message_id: MessageId, **kwargs: Any) -> Reader:
        return Reader(await _call(self._sync.create_reader, topic, start_message_id, **kwargs))

    async def get_topic_partitions(self, topic: str) -> list[str]:
        return await _call(self._sync.get_topic_partitions, topic)

    def shutdown(self) -> None:
        """Close every producer, consumer and reader of this client at once."""
        self._sync.shutdown()

    async def close(self) -> None:
        await _call(self._sync.close)
