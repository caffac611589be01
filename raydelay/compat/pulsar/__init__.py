"""A Pulsar-compatible client: the names and behaviour of the ``pulsar`` package, over
raydelay. A Pulsar program moves by changing its import::

    import raydelay.compat.pulsar as pulsar

    client = pulsar.Client("pulsar://localhost:6650")
    producer = client.create_producer("orders")
    producer.send(b"cancel order 17", deliver_after=timedelta(minutes=30))

What it maps, and how:

- **The service URL.** Any ``pulsar://`` URL means "the raydelay of this Ray": the
  cluster of ``address=`` (a raydelay extension), else ``$RAYDELAY_ADDRESS``, else the
  embedded default (a local Ray and a local-dir store). One raydelay connection is
  shared by every :class:`Client` of the process. ``Client.close()`` closes that
  client's producers and consumers, never the cluster.
- **Topics.** ``persistent://public/default/orders``, ``public/default/orders`` and
  ``orders`` all name the raydelay topic ``orders``; another tenant or namespace maps
  to ``tenant.namespace.topic``; a ``non-persistent://`` topic is a topic of its own
  (``non-persistent.<name>``), stored durably like every raydelay topic (nothing is
  dropped, which Pulsar's non-persistent topics may do). A topic is created (one partition) on first use, as
  Pulsar's auto-creation does; a raydelay topic of N partitions is a partitioned topic.
- **Subscription types.** Exclusive, Failover, Shared and KeyShared are raydelay's
  ``exclusive``, ``failover``, ``shared`` and ``key_shared``. As in Pulsar, only Shared
  and KeyShared honour ``deliver_at`` / ``deliver_after``.
- **Keys.** The partition key (else the ordering key) is the raydelay message key: it
  picks the partition and, on a KeyShared subscription, the consumer. The ordering key,
  the producer name, the event time and a null value travel as message properties
  whose names start with ``__pulsar.`` (hidden from :meth:`Message.properties`).
- **Sequence ids** are per producer. A send that repeats one the topic holds from a
  producer of the same name is not stored again (Pulsar's deduplication, always on).

- **Readers, seek and several topics.** ``create_reader``, ``Consumer.seek`` and
  ``Reader.seek`` (a message id, ``MessageId.earliest`` / ``latest``, or a publish time in
  epoch ms), ``get_last_message_id``, and ``subscribe`` with a list of topics or a
  compiled pattern (matched against the full Pulsar names, looked for again every
  ``pattern_auto_discovery_period`` seconds) map onto raydelay's own (see
  ``raydelay.Cluster.create_reader``, ``Consumer.seek`` and ``subscribe``).

What is not supported raises ``NotImplementedError`` naming the feature: TLS,
authentication plugins, encryption, compression, chunking, producer access modes,
compacted reads, table views, sticky key ranges and structured schemas.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from enum import Enum, IntEnum
from typing import Any

import msgpack
import numpy as np

from raydelay.client.message import (
    MessageId as _CoreId,
)
from raydelay.client.message import (
    check_key,
    check_payload,
    check_properties,
    deliver_at_of,
)
from raydelay.client.multi import MultiTopicConsumer as _CoreMulti
from raydelay.client.producer import partition_of
from raydelay.compat.pulsar import schema
from raydelay.errors import ConsumerBusy as _CoreBusy
from raydelay.errors import InvalidArgument, NotFound
from raydelay.log.entries import Entries, concat_entries
from raydelay.log.partition import StaleSequence

log = logging.getLogger(__name__)
schema_module = schema  # (``schema`` is also an argument name below, as in Pulsar)

__all__ = [
    "AlreadyClosed",
    "Authentication",
    "AuthenticationBasic",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AutoClusterFailover",
    "Client",
    "CompressionType",
    "ConnectError",
    "Consumer",
    "ConsumerBatchReceivePolicy",
    "ConsumerBusy",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "ConsumerType",
    "CryptoKeyReader",
    "CumulativeAcknowledgementNotAllowedError",
    "InitialPosition",
    "KeySharedMode",
    "Message",
    "MessageId",
    "PartitionsRoutingMode",
    "Producer",
    "Reader",
    "ProducerAccessMode",
    "PulsarException",
    "RegexSubscriptionMode",
    "Result",
    "ServiceInfo",
    "ServiceInfoProvider",
    "Timeout",
    "schema",
]

_RESERVED = "__pulsar."
_ORDERING_KEY = _RESERVED + "ordering_key"
_KEY_IS_ORDERING = _RESERVED + "key_is_ordering_key"
_PRODUCER = _RESERVED + "producer"
_EVENT_TIME = _RESERVED + "event_timestamp"
_NULL = _RESERVED + "null_value"
_FILL_MAX = 1_000  # messages a consumer asks for at a time at most (its receiver queue)
_SEND_BATCH = 1_000  # queued sends carried by one append call at most
_BATCHES_PER_CALL = 16  # log batches per partition in one call (the log's dedup memory)
_STEP_S = 0.25  # a receive asks in steps of at most this long


# --- enums and errors (Pulsar's names) ---------------------------------------------------


class Result(IntEnum):
    Ok = 0
    UnknownError = 1
    Timeout = 5
    ConnectError = 3
    AlreadyClosed = 21
    ConsumerBusy = 8


class ConsumerType(Enum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(Enum):
    Latest = 0
    Earliest = 1


class CompressionType(Enum):
    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class PartitionsRoutingMode(Enum):
    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


class ProducerAccessMode(Enum):
    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class KeySharedMode(Enum):
    AutoSplit = 0
    Sticky = 1


class RegexSubscriptionMode(Enum):
    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class BatchingType(Enum):
    Default = 0
    KeyBased = 1


class PulsarException(Exception):
    """The root of the Pulsar-compatible client's own errors (argument errors are
    ``ValueError`` / ``TypeError``, as in Pulsar)."""


class Timeout(PulsarException):
    """No message arrived within the receive timeout."""


class ConnectError(PulsarException):
    pass


class AlreadyClosed(PulsarException):
    pass


class ConsumerBusy(PulsarException):
    """An exclusive subscription already has a consumer."""


class CumulativeAcknowledgementNotAllowedError(PulsarException):
    pass


class OperationNotSupported(PulsarException):
    pass


class TopicNotFound(PulsarException):
    pass


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(f"raydelay.compat.pulsar: {feature} is not supported")


def _check_type(kind: type | tuple, value: Any, name: str) -> None:
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ValueError(f"Argument {name} is expected to be of type 'int', not 'bool'")
    if not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(
            f"Argument {name} is expected to be of type '{want}' and not '{type(value).__name__}'"
        )


def _check_type_or_none(kind: type | tuple, value: Any, name: str) -> None:
    if value is not None:
        _check_type(kind, value, name)


def _check_types(kind: type, *, optional: bool = False, **named: Any) -> None:
    """``_check_type`` (or ``_check_type_or_none``) of every keyword argument."""
    for name, value in named.items():
        if not (optional and value is None):
            _check_type(kind, value, name)


# --- authentication and encryption: accepted as values, refused when used -------------------


class Authentication:
    """An authentication plugin. raydelay runs inside your Ray cluster and has none: a
    Client given one raises ``NotImplementedError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class AuthenticationTLS(Authentication): ...


class AuthenticationToken(Authentication): ...


class AuthenticationBasic(Authentication): ...


class AuthenticationAthenz(Authentication): ...


class AuthenticationOauth2(Authentication): ...


class CryptoKeyReader:
    def __init__(self, public_key_path: str, private_key_path: str) -> None:
        raise _unsupported("end-to-end encryption (CryptoKeyReader)")


class ServiceInfoProvider:
    """A source of service URLs (Pulsar's cluster failover). raydelay's "cluster" is the
    Ray it runs in: a Client given one raises ``NotImplementedError``."""

    def initial_service_info(self) -> Any:
        raise NotImplementedError

    def initialize(self, on_service_info_update: Callable[[Any], None]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ServiceInfo:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _unsupported("service info providers (cluster failover)")


class AutoClusterFailover:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _unsupported("automatic cluster failover")


# --- policies -------------------------------------------------------------------------------


class ConsumerDeadLetterPolicy:
    """After ``max_redeliver_count`` redeliveries a message goes to ``dead_letter_topic``
    (default ``<topic>-<subscription>-DLQ``); ``initial_subscription_name`` is created on
    that topic first, so nothing sent there is missed."""

    def __init__(
        self,
        max_redeliver_count: int,
        dead_letter_topic: str | None = None,
        initial_subscription_name: str | None = None,
    ) -> None:
        if (
            isinstance(max_redeliver_count, bool)
            or not isinstance(max_redeliver_count, int)
            or max_redeliver_count < 1
        ):
            raise ValueError("max_redeliver_count must be greater than 0")
        _check_type_or_none(str, dead_letter_topic, "dead_letter_topic")
        _check_type_or_none(str, initial_subscription_name, "initial_subscription_name")
        self._max = max_redeliver_count
        self._topic = dead_letter_topic or ""
        self._initial = initial_subscription_name or ""

    @property
    def max_redeliver_count(self) -> int:
        return self._max

    @property
    def dead_letter_topic(self) -> str:
        return self._topic

    @property
    def initial_subscription_name(self) -> str:
        return self._initial


class ConsumerBatchReceivePolicy:
    """What one :meth:`Consumer.batch_receive` waits for: ``max_num_message`` messages,
    ``max_num_bytes`` bytes or ``timeout_ms``, whichever comes first (below 0: no limit)."""

    def __init__(self, max_num_message: int, max_num_bytes: int, timeout_ms: int) -> None:
        for name, v in (
            ("max_num_message", max_num_message),
            ("max_num_bytes", max_num_bytes),
            ("timeout_ms", timeout_ms),
        ):
            _check_type(int, v, name)
        if max_num_message <= 0 and max_num_bytes <= 0 and timeout_ms <= 0:
            raise ValueError(
                "ConsumerBatchReceivePolicy: at least one of max_num_message, max_num_bytes "
                "and timeout_ms must be > 0"
            )
        self.max_num_message = max_num_message
        self.max_num_bytes = max_num_bytes
        self.timeout_ms = timeout_ms


_DEFAULT_BATCH = ConsumerBatchReceivePolicy(-1, 10 * 1024 * 1024, 100)


class ConsumerKeySharedPolicy:
    """Key_Shared options. AutoSplit (consistent hashing of keys over the consumers) is
    what raydelay does; Sticky ranges are checked as Pulsar checks them, then refused by
    ``subscribe`` (``NotImplementedError``)."""

    def __init__(
        self,
        key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
        allow_out_of_order_delivery: bool = False,
        sticky_ranges: list[tuple[int, int]] | None = None,
    ) -> None:
        _check_type(KeySharedMode, key_shared_mode, "key_shared_mode")
        _check_type(bool, allow_out_of_order_delivery, "allow_out_of_order_delivery")
        if key_shared_mode == KeySharedMode.Sticky and sticky_ranges is None:
            raise ValueError(
                "When using key_shared_mode = KeySharedMode.Sticky you must also provide "
                "sticky_ranges"
            )
        if sticky_ranges is not None:
            _check_ranges(sticky_ranges)
        self._mode = key_shared_mode
        self._out_of_order = allow_out_of_order_delivery
        self._ranges = list(sticky_ranges) if sticky_ranges is not None else []

    @property
    def key_shared_mode(self) -> KeySharedMode:
        return self._mode

    @property
    def allow_out_of_order_delivery(self) -> bool:
        return self._out_of_order

    @property
    def sticky_ranges(self) -> list[tuple[int, int]]:
        return list(self._ranges)


def _check_ranges(ranges: Any) -> None:
    if not isinstance(ranges, list) or not ranges:
        raise ValueError("sticky_ranges: expected a non-empty list of (start, end) pairs")
    spans = []
    for r in ranges:
        if (
            not isinstance(r, tuple)
            or len(r) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
        ):
            raise ValueError(f"sticky_ranges: {r!r} is not a (start, end) pair of ints")
        lo, hi = r
        if not 0 <= lo <= hi < 65536:
            raise ValueError(f"sticky_ranges: {r!r} must satisfy 0 <= start <= end < 65536")
        spans.append((lo, hi))
    spans.sort()
    for (_, a_hi), (b_lo, _) in itertools.pairwise(spans):
        if b_lo <= a_hi:
            raise ValueError(f"sticky_ranges: ranges overlap at {b_lo}")


# --- message ids and messages ---------------------------------------------------------------


class MessageId:
    """Where a message is: partition, ledger, entry (and a batch index, always -1 here:
    raydelay stores every message as its own entry). Ordered by position; equal to the
    id ``send`` returned for the same message."""

    __slots__ = ("_partition", "_ledger", "_entry", "_batch", "_topic")

    earliest: MessageId
    latest: MessageId

    def __init__(
        self,
        partition: int = -1,
        ledger_id: int = -1,
        entry_id: int = -1,
        batch_index: int = -1,
        *,
        topic: str | None = None,
    ) -> None:
        for name, v in (
            ("partition", partition),
            ("ledger_id", ledger_id),
            ("entry_id", entry_id),
            ("batch_index", batch_index),
        ):
            _check_type(int, v, name)
        self._partition, self._ledger, self._entry, self._batch = (
            partition,
            ledger_id,
            entry_id,
            batch_index,
        )
        self._topic = topic  # the raydelay topic, when the id came from one

    @classmethod
    def _of(cls, core: _CoreId) -> MessageId:
        return cls(core.partition, core.ledger_id, core.entry_id, -1, topic=core.topic)

    def ledger_id(self) -> int:
        return self._ledger

    def entry_id(self) -> int:
        return self._entry

    def batch_index(self) -> int:
        return self._batch

    def partition(self) -> int:
        return self._partition

    def serialize(self) -> bytes:
        return msgpack.packb(
            [1, self._partition, self._ledger, self._entry, self._batch, self._topic]
        )

    @staticmethod
    def deserialize(message_id_bytes: bytes, topic: str | None = None) -> MessageId:
        _check_type(bytes, message_id_bytes, "message_id_bytes")
        try:
            v, p, lg, e, b, t = msgpack.unpackb(message_id_bytes)
            if v != 1:
                raise ValueError(f"version {v}")
        except Exception as exc:  # noqa: BLE001 - any decode failure is the same error
            raise ValueError(
                f"MessageId.deserialize: not a serialized message id ({exc})"
            ) from None
        return MessageId(p, lg, e, b, topic=_local_name(topic) if topic else t)

    @classmethod
    def wrap(cls, msg_id: Any) -> MessageId:
        if isinstance(msg_id, MessageId):
            return msg_id
        if isinstance(msg_id, _CoreId):
            return cls._of(msg_id)
        raise ValueError(f"MessageId.wrap: expected a message id, got {type(msg_id).__name__}")

    def _key(self) -> tuple[int, int, int, int]:
        return (self._ledger, self._entry, self._batch, self._partition)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageId) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: MessageId) -> bool:
        return self._key() < other._key()

    def __le__(self, other: MessageId) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: MessageId) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: MessageId) -> bool:
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"({self._ledger},{self._entry},{self._partition},{self._batch})"

    __repr__ = __str__


_I64_MAX = 2**63 - 1
MessageId.earliest = MessageId(-1, -1, -1, -1)
MessageId.latest = MessageId(-1, _I64_MAX, _I64_MAX, -1)


class Message:
    """A received message (Pulsar's accessors over a raydelay message)."""

    __slots__ = ("_m", "_schema", "_topic_name", "_props")

    def __init__(self, core: Any, schema_: schema.Schema, topic_name: str) -> None:
        self._m, self._schema, self._topic_name = core, schema_, topic_name
        self._props = core.properties or {}

    def data(self) -> bytes:
        return self._m.payload

    def value(self) -> Any:
        if self.has_null_value():
            return None
        return self._schema.decode(self._m.payload)

    def properties(self) -> dict[str, str]:
        return {k: v for k, v in self._props.items() if not k.startswith(_RESERVED)}

    def partition_key(self) -> str:
        if self._m.key is None or _KEY_IS_ORDERING in self._props:
            return ""
        return self._m.key

    def ordering_key(self) -> str:
        return self._props.get(_ORDERING_KEY, "")

    def publish_timestamp(self) -> int:
        return int(self._m.publish_time_ms)

    def event_timestamp(self) -> int:
        return int(self._props.get(_EVENT_TIME, 0))

    def message_id(self) -> MessageId:
        return MessageId._of(self._m.message_id)

    def topic_name(self) -> str:
        return self._topic_name

    def redelivery_count(self) -> int:
        return int(self._m.redelivery_count)

    def schema_version(self) -> str:
        return ""

    def producer_name(self) -> str:
        return self._props.get(_PRODUCER, "")

    def has_null_value(self) -> bool:
        return _NULL in self._props

    def encryption_context(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"Message(id={self.message_id()}, topic={self._topic_name!r})"


# --- readers -------------------------------------------------------------------------------


class _Endpoint:
    """What a Pulsar consumer and reader share: a topic, a name, and being open."""

    _topic_name: str
    _name: str
    _closed: bool
    _what = "endpoint"

    def topic(self) -> str:
        return self._topic_name

    def is_connected(self) -> bool:
        return not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"{self._what} {self._name!r} is closed")


class Reader(_Endpoint):
    """Reads a topic in log order with no subscription (Pulsar's reader), over
    :class:`raydelay.client.reader.Reader`; it ignores deliver_at."""

    def __init__(
        self,
        client: Client,
        core: Any,
        topic_name: str,
        partitions: int,
        name: str,
        inclusive: bool = False,
    ) -> None:
        self._client, self._core, self._inclusive = client, core, inclusive
        self._topic_name, self._partitions, self._name = topic_name, partitions, name
        self._closed = False
        self._listener: threading.Thread | None = None

    _what = "reader"

    def reader_name(self) -> str:
        return self._name

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits up to ``timeout_millis`` (None: until one comes) and
        raises :class:`Timeout` when none came."""
        self._check_open()
        if timeout_millis is not None:
            _check_type(int, timeout_millis, "timeout_millis")
            if timeout_millis < 0:
                raise ValueError(f"timeout_millis: must be >= 0, got {timeout_millis}")
        m = self._core.read_next(None if timeout_millis is None else timeout_millis / 1000)
        if m is None:
            raise Timeout(f"no message within {timeout_millis} ms")
        return _wrap(self._client, m, schema.BytesSchema(), self._topic_name, self._partitions)

    def has_message_available(self) -> bool:
        self._check_open()
        return self._core.has_message_available()

    def seek(self, messageid: Any) -> None:
        """Read from elsewhere: a message id (the message after it, or it for a reader
        made with ``start_message_id_inclusive``), ``MessageId.earliest`` /
        ``MessageId.latest``, or a publish time (epoch ms)."""
        self._check_open()
        target = _seek_target(self._core.topic, messageid)
        try:
            self._core.seek(target, inclusive=self._inclusive)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None

    def get_last_message_id(self) -> MessageId:
        self._check_open()
        return _last_id(self._core)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()

    def _start_listener(self, listener: Callable[[Reader, Message], None]) -> None:
        def run() -> None:
            while not self._closed:
                try:
                    m = self.read_next(500)
                except (Timeout, AlreadyClosed, InvalidArgument):
                    continue
                try:
                    listener(self, m)
                except Exception:  # noqa: BLE001 - a user's listener must not stop it
                    log.exception("reader listener failed")

        self._listener = threading.Thread(target=run, name="pulsar-reader", daemon=True)
        self._listener.start()


def _wrap(client: Client, m: Any, schema_: schema.Schema, name: str, partitions: int) -> Message:
    """A raydelay message as a Pulsar one; its topic name with a ``-partition-N`` suffix on
    a partitioned topic (a consumer of several topics: the name of the message's own)."""
    mid = m.message_id
    if not name:  # (several topics)
        name = client._full_name(mid.topic)
        partitions = client._cluster._partitions(mid.topic)
    if partitions > 1:
        name = f"{name}-partition-{mid.partition}"
    return Message(m, schema_, name)


def _seek_target(local: str | None, arg: Any) -> Any:
    """What a Pulsar seek argument (or a reader's start) means to raydelay: "earliest",
    "latest", a raydelay MessageId, or epoch ms."""
    if isinstance(arg, MessageId):
        if arg._key() == MessageId.earliest._key():
            return "earliest"
        if arg._ledger == _I64_MAX:
            return "latest"
        if arg._ledger < 0 or arg._entry < 0:
            raise ValueError(f"seek: {arg} names no message")
        topic = _local_name(arg._topic) if arg._topic else local
        if topic is None:
            raise OperationNotSupported(
                f"seek: {arg} has no topic name, and several topics are read"
            )
        return _CoreId(topic, max(arg._partition, 0), arg._ledger, arg._entry)
    if isinstance(arg, int) and not isinstance(arg, bool):
        if arg < 0:
            raise ValueError(f"seek: a publish time must be >= 0 (epoch ms), got {arg}")
        return arg
    raise ValueError(f"invalid seek_arg type {type(arg)}")


def _last_id(core: Any) -> MessageId:
    """A core consumer's or reader's last message id, as Pulsar's (earliest: none)."""
    try:
        last = core.get_last_message_id()
    except InvalidArgument:
        raise OperationNotSupported(
            "get_last_message_id: the topic is partitioned (ask each partition)"
        ) from None
    return MessageId.earliest if last is None else MessageId._of(last)


# --- topic names ----------------------------------------------------------------------------

_PULSAR_NAME = re.compile(r"^(?:(persistent|non-persistent)://)?(?:([^/]+)/([^/]+)/)?([^/]+)$")


def _parse_topic(topic: Any) -> tuple[str, str]:
    """(raydelay topic name, full Pulsar name) of a Pulsar topic name."""
    if isinstance(topic, (list, tuple)):
        raise _unsupported("subscribing to several topics at once")
    _check_type(str, topic, "topic")
    m = _PULSAR_NAME.match(topic)
    if not m:
        raise ValueError(f"topic: {topic!r} is not a Pulsar topic name")
    domain, tenant, ns, name = m.groups()
    domain, tenant, ns = domain or "persistent", tenant or "public", ns or "default"
    local = name if (tenant, ns) == ("public", "default") else f"{tenant}.{ns}.{name}"
    if domain == "non-persistent":  # (its own topic, stored durably as every raydelay one)
        local = f"{_NON_PERSISTENT}{local}"
    try:
        from raydelay.storage.keys import validate_name

        validate_name("topic", local)
    except InvalidArgument as exc:
        raise ValueError(f"{exc} (from the Pulsar topic {topic!r})") from None
    return local, f"{domain}://{tenant}/{ns}/{name}"


# RegexSubscriptionMode (the C extension's enum, matched by name) -> the domains it reads
_REGEX_MODES = {
    "PersistentOnly": ("persistent",),
    "NonPersistentOnly": ("non-persistent",),
    "AllTopics": ("persistent", "non-persistent"),
}


def _regex_mode(mode: Any) -> str:
    """The name of a RegexSubscriptionMode (None: PersistentOnly, Pulsar's default)."""
    if mode is None:
        return "PersistentOnly"
    name = getattr(mode, "name", mode)
    if name not in _REGEX_MODES:
        raise ValueError(
            f"regex_subscription_mode: expected one of {sorted(_REGEX_MODES)}, got {mode!r}"
        )
    return name


_NON_PERSISTENT = "non-persistent."  # the raydelay name's prefix of a non-persistent topic


def _local_name(topic: str) -> str:
    return _parse_topic(topic)[0]


# --- the client -----------------------------------------------------------------------------

_shared_lock = threading.Lock()
_shared: dict[str, Any] = {}  # "cluster": the process's one raydelay connection


def _shared_cluster(config: Any, address: str | None) -> Any:
    with _shared_lock:
        cluster = _shared.get("cluster")
        if cluster is None or cluster._closed:
            import raydelay

            cluster = raydelay.connect(config=config, address=address)
            _shared["cluster"] = cluster
        return cluster


class Client:
    """A Pulsar client over the raydelay of this Ray (see the module's docstring).

    Beyond Pulsar's arguments, three raydelay ones: ``cluster`` (a connected
    :class:`raydelay.Cluster` to use), ``config`` (a raydelay config for the shared
    connection) and ``address`` (the Ray to attach to; default ``$RAYDELAY_ADDRESS``,
    else the embedded default)."""

    def __init__(
        self,
        service_url: Any,
        authentication: Any = None,
        operation_timeout_seconds: int = 30,
        io_threads: int = 1,
        message_listener_threads: int = 1,
        concurrent_lookup_requests: int = 50000,
        log_conf_file_path: str | None = None,
        stats_interval_in_seconds: int = 600,
        use_tls: bool = False,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        logger: Any = None,
        connection_timeout_ms: int = 10000,
        listener_name: str | None = None,
        tls_private_key_file_path: str | None = None,
        tls_certificate_file_path: str | None = None,
        *,
        cluster: Any = None,
        config: Any = None,
        address: str | None = None,
    ) -> None:
        if isinstance(service_url, (ServiceInfoProvider, AutoClusterFailover)):
            raise _unsupported("service info providers (cluster failover)")
        _check_type(str, service_url, "service_url")
        if not service_url.startswith(("pulsar://", "pulsar+ssl://", "http://", "https://")):
            raise ValueError(
                f"service_url: {service_url!r} is not a Pulsar service URL (pulsar://host:port)"
            )
        if authentication is not None:
            _check_type(Authentication, authentication, "authentication")
        _check_types(
            int,
            operation_timeout_seconds=operation_timeout_seconds,
            io_threads=io_threads,
            message_listener_threads=message_listener_threads,
            concurrent_lookup_requests=concurrent_lookup_requests,
            stats_interval_in_seconds=stats_interval_in_seconds,
            connection_timeout_ms=connection_timeout_ms,
        )
        _check_types(
            bool,
            use_tls=use_tls,
            tls_allow_insecure_connection=tls_allow_insecure_connection,
            tls_validate_hostname=tls_validate_hostname,
        )
        _check_types(
            str,
            optional=True,
            log_conf_file_path=log_conf_file_path,
            tls_trust_certs_file_path=tls_trust_certs_file_path,
            listener_name=listener_name,
            tls_private_key_file_path=tls_private_key_file_path,
            tls_certificate_file_path=tls_certificate_file_path,
        )
        if authentication is not None:
            raise _unsupported("authentication plugins")
        if use_tls or service_url.startswith(("pulsar+ssl://", "https://")):
            raise _unsupported("TLS")
        if listener_name:
            raise _unsupported("listener names (advertised listeners)")
        self.service_url = service_url
        self._own_cluster = cluster
        self._config, self._address = config, address or os.environ.get("RAYDELAY_ADDRESS")
        self._producers: list[Producer] = []
        self._consumers: list[Consumer] = []
        self._readers: list[Reader] = []
        self._names: dict[str, str] = {}  # raydelay topic -> the Pulsar name it was used by
        self._closed = False

    @property
    def _cluster(self) -> Any:
        if self._closed:
            raise AlreadyClosed("the client is closed")
        return self._own_cluster or _shared_cluster(self._config, self._address)

    def _topic(self, topic: Any) -> tuple[str, str, int]:
        """(raydelay name, Pulsar name, partitions) of a topic, created if new."""
        local, full = _parse_topic(topic)
        self._names[local] = full
        cluster = self._cluster
        try:
            n = cluster._partitions(local)
        except NotFound:
            cluster.create_topic(local, 1)
            n = cluster._partitions(local)
        return local, full, n

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: schema.Schema = schema.BytesSchema(),  # noqa: B008 - immutable, as Pulsar's
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict | None = None,
        batching_type: BatchingType = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        message_router: Callable[[Message, int], int] | None = None,
    ) -> Producer:
        """A producer on ``topic`` (created if it does not exist)."""
        _check_type(str, topic, "topic")
        _check_type_or_none(str, producer_name, "producer_name")
        _check_type(schema_module.Schema, schema, "schema")
        _check_type_or_none(int, initial_sequence_id, "initial_sequence_id")
        _check_types(
            int,
            send_timeout_millis=send_timeout_millis,
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
        )
        _check_types(
            bool,
            block_if_queue_full=block_if_queue_full,
            batching_enabled=batching_enabled,
            chunking_enabled=chunking_enabled,
            lazy_start_partitioned_producers=lazy_start_partitioned_producers,
        )
        _check_type(CompressionType, compression_type, "compression_type")
        _check_type(PartitionsRoutingMode, message_routing_mode, "message_routing_mode")
        _check_type(BatchingType, batching_type, "batching_type")
        _check_type(ProducerAccessMode, access_mode, "access_mode")
        _check_type_or_none(dict, properties, "properties")
        _check_type_or_none(str, encryption_key, "encryption_key")
        if message_router is not None and not callable(message_router):
            raise ValueError("Argument message_router is expected to be a callable")
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        if compression_type != CompressionType.NONE:
            raise _unsupported(f"compression ({compression_type.name})")
        if chunking_enabled:
            raise _unsupported("chunking (messages are limited to topic.max_message_bytes)")
        if encryption_key or crypto_key_reader is not None:
            raise _unsupported("end-to-end encryption")
        if access_mode != ProducerAccessMode.Shared:
            raise _unsupported(f"producer access mode {access_mode.name}")
        local, full, n = self._topic(topic)
        core = self._cluster.create_producer(local, name=producer_name)
        p = Producer(self, core, full, n, schema, initial_sequence_id, message_routing_mode,
                     message_router)  # fmt: skip
        self._producers.append(p)
        return p

    def subscribe(
        self,
        topic: Any,
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        schema: schema.Schema = schema.BytesSchema(),  # noqa: B008 - immutable, as Pulsar's
        message_listener: Callable[[Consumer, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = 60000,
        is_read_compacted: bool = False,
        properties: dict | None = None,
        pattern_auto_discovery_period: int = 60,
        initial_position: InitialPosition = InitialPosition.Latest,
        crypto_key_reader: Any = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: Any = None,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: Any = None,
        is_pattern_topic: bool = False,
    ) -> Consumer:
        """A consumer of ``subscription_name`` on ``topic`` (both created if new)."""
        several = isinstance(topic, (list, tuple, re.Pattern)) or is_pattern_topic
        if is_pattern_topic and isinstance(topic, str):
            topic = re.compile(topic)
        if isinstance(topic, (list, tuple)):
            for t in topic:
                _check_type(str, t, "topic")
        elif not isinstance(topic, re.Pattern):
            _check_type(str, topic, "topic")
        _check_type(int, pattern_auto_discovery_period, "pattern_auto_discovery_period")
        _check_type(str, subscription_name, "subscription_name")
        _check_type(ConsumerType, consumer_type, "consumer_type")
        _check_type(schema_module.Schema, schema, "schema")
        _check_type(int, receiver_queue_size, "receiver_queue_size")
        _check_type(
            int,
            max_total_receiver_queue_size_across_partitions,
            "max_total_receiver_queue_size_across_partitions",
        )
        _check_type_or_none(str, consumer_name, "consumer_name")
        _check_type_or_none(int, unacked_messages_timeout_ms, "unacked_messages_timeout_ms")
        _check_type(int, broker_consumer_stats_cache_time_ms, "broker_consumer_stats_cache_time_ms")
        _check_type(int, negative_ack_redelivery_delay_ms, "negative_ack_redelivery_delay_ms")
        _check_type(bool, is_read_compacted, "is_read_compacted")
        _check_type_or_none(dict, properties, "properties")
        _check_type(InitialPosition, initial_position, "initial_position")
        _check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        _check_type_or_none(
            ConsumerBatchReceivePolicy, batch_receive_policy, "batch_receive_policy"
        )
        _check_type_or_none(ConsumerKeySharedPolicy, key_shared_policy, "key_shared_policy")
        _check_type_or_none(ConsumerDeadLetterPolicy, dead_letter_policy, "dead_letter_policy")
        _check_type(bool, batch_index_ack_enabled, "batch_index_ack_enabled")
        if message_listener is not None and not callable(message_listener):
            raise ValueError("Argument message_listener is expected to be a callable")
        if receiver_queue_size < 0:
            raise ValueError(f"receiver_queue_size: must be >= 0, got {receiver_queue_size}")
        if negative_ack_redelivery_delay_ms < 0:
            raise ValueError("negative_ack_redelivery_delay_ms: must be >= 0")
        if crypto_key_reader is not None:
            raise _unsupported("end-to-end encryption")
        if is_read_compacted:
            raise _unsupported("compacted reads")
        if (
            key_shared_policy is not None
            and key_shared_policy.key_shared_mode == KeySharedMode.Sticky
        ):
            raise _unsupported("Key_Shared sticky ranges (use KeySharedMode.AutoSplit)")
        if several:
            if dead_letter_policy is not None:
                raise _unsupported("dead letter policies on several topics at once")
            c = self._subscribe_many(
                topic, subscription_name, consumer_type, initial_position,
                pattern_auto_discovery_period, unacked_messages_timeout_ms,
                (consumer_name, schema, receiver_queue_size, negative_ack_redelivery_delay_ms,
                 batch_receive_policy, start_message_id_inclusive),
                _regex_mode(regex_subscription_mode),
            )  # fmt: skip
            if message_listener is not None:
                c._start_listener(message_listener)
            return c
        local, full, n = self._topic(topic)
        cluster = self._cluster
        dlq = None
        if dead_letter_policy is not None:
            dlq_full = dead_letter_policy.dead_letter_topic or f"{full}-{subscription_name}-DLQ"
            dlq, _, _ = self._topic(dlq_full)
            if dead_letter_policy.initial_subscription_name:
                cluster.subscribe(
                    dlq, dead_letter_policy.initial_subscription_name, initial_position="earliest"
                ).close()
        try:
            core = cluster.subscribe(
                local,
                subscription_name,
                _TYPES[consumer_type],
                ack_timeout_s=None
                if not unacked_messages_timeout_ms
                else unacked_messages_timeout_ms / 1000,
                max_redeliveries=None
                if dead_letter_policy is None
                else dead_letter_policy.max_redeliver_count,
                dead_letter_topic=dlq,
                initial_position="earliest"
                if initial_position == InitialPosition.Earliest
                else "latest",
            )
        except _CoreBusy as exc:
            raise ConsumerBusy(str(exc)) from None
        c = Consumer(
            self,
            core,
            full,
            n,
            subscription_name,
            consumer_name or uuid.uuid4().hex[:10],
            consumer_type,
            schema,
            receiver_queue_size,
            negative_ack_redelivery_delay_ms,
            batch_receive_policy or _DEFAULT_BATCH,
            start_message_id_inclusive,
        )
        self._consumers.append(c)
        if message_listener is not None:
            c._start_listener(message_listener)
        return c

    def _subscribe_many(
        self,
        topics: Any,
        subscription_name: str,
        consumer_type: ConsumerType,
        initial_position: InitialPosition,
        period_s: int,
        unacked_ms: int | None,
        rest: tuple,
        mode: str = "PersistentOnly",
    ) -> Consumer:
        """A consumer of several topics: a list, or those a pattern matches by their full
        Pulsar names (``persistent://tenant/ns/name``, or without the domain)."""
        cluster = self._cluster
        options = {
            "subscription_type": _TYPES[consumer_type],
            "ack_timeout_s": None if not unacked_ms else unacked_ms / 1000,
            "initial_position": "earliest"
            if initial_position == InitialPosition.Earliest
            else "latest",
        }
        if isinstance(topics, re.Pattern):
            pattern = topics
            domains = _REGEX_MODES[mode]

            def match(local: str) -> bool:
                full = self._full_name(local)
                domain, bare = full.split("://", 1)
                return domain in domains and bool(
                    pattern.fullmatch(full) or pattern.fullmatch(bare)
                )

            target: Any = match
        else:
            target = [self._topic(t)[0] for t in topics]
        try:
            core = cluster._subscribe_many(
                target, subscription_name, options, refresh_s=max(1, period_s)
            )
        except _CoreBusy as exc:
            raise ConsumerBusy(str(exc)) from None
        consumer_name, schema_, queue, nack_ms, batch_policy, inclusive = rest
        c = Consumer(
            self,
            core,
            "",
            1,
            subscription_name,
            consumer_name or uuid.uuid4().hex[:10],
            consumer_type,
            schema_,
            queue,
            nack_ms,
            batch_policy or _DEFAULT_BATCH,
            inclusive,
        )
        self._consumers.append(c)
        return c

    def _full_name(self, local: str) -> str:
        """The Pulsar name of a raydelay topic (as :meth:`_topic` mapped it, else in
        ``public/default``)."""
        known = self._names.get(local)
        if known is not None:
            return known
        if local.startswith(_NON_PERSISTENT):
            return f"non-persistent://public/default/{local[len(_NON_PERSISTENT) :]}"
        return f"persistent://public/default/{local}"

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        reader_listener: Callable[[Reader, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
    ) -> Reader:
        """A reader of ``topic`` (created if new) from ``start_message_id``
        (``MessageId.earliest``, ``MessageId.latest`` or a message's id: the entry after
        it, or it with ``start_message_id_inclusive``); it ignores deliver_at."""
        _check_type(str, topic, "topic")
        _check_type(MessageId, start_message_id, "start_message_id")
        _check_type(int, receiver_queue_size, "receiver_queue_size")
        _check_type_or_none(str, reader_name, "reader_name")
        _check_type_or_none(str, subscription_role_prefix, "subscription_role_prefix")
        _check_type(bool, is_read_compacted, "is_read_compacted")
        _check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        if reader_listener is not None and not callable(reader_listener):
            raise ValueError("Argument reader_listener is expected to be a callable")
        if is_read_compacted:
            raise _unsupported("compacted reads")
        if crypto_key_reader is not None:
            raise _unsupported("end-to-end encryption")
        local, full, n = self._topic(topic)
        start = _seek_target(local, start_message_id)
        core = self._cluster.create_reader(local, start, inclusive=start_message_id_inclusive)
        name = reader_name or f"reader-{uuid.uuid4().hex[:10]}"
        r = Reader(self, core, full, n, name, start_message_id_inclusive)
        self._readers.append(r)
        if reader_listener is not None:
            r._start_listener(reader_listener)
        return r

    def create_table_view(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported("table views")

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The partitions of a topic by their Pulsar names (a one-partition topic is not
        partitioned: its own name)."""
        _, full, n = self._topic(topic)
        return [full] if n == 1 else [f"{full}-partition-{p}" for p in range(n)]

    def close(self) -> None:
        """Close this client's producers (flushing them) and consumers; the raydelay
        cluster goes on."""
        if self._closed:
            return
        for p in self._producers:
            p.close()
        for c in self._consumers:
            c.close()
        for r in self._readers:
            r.close()
        self._closed = True

    def shutdown(self) -> None:
        """Close without flushing: later calls of its producers and consumers raise
        :class:`AlreadyClosed`."""
        for p in self._producers:
            p._shutdown()
        for c in self._consumers:
            c.close()
        self._closed = True


_TYPES = {
    ConsumerType.Exclusive: "exclusive",
    ConsumerType.Shared: "shared",
    ConsumerType.Failover: "failover",
    ConsumerType.KeyShared: "key_shared",
}


# --- the producer ---------------------------------------------------------------------------


class _Send:
    __slots__ = ("partition", "seq", "auto", "entries", "future", "callback")

    def __init__(
        self, partition: int, seq: int, auto: bool, entries: Entries, callback: Any
    ) -> None:
        self.partition, self.seq, self.auto, self.entries = partition, seq, auto, entries
        self.future: Future = Future()
        self.callback = callback


def _groups(batch: list[_Send]) -> tuple[list[list[_Send]], list[_Send]]:
    """The sends of one append call as batches of the log, and the sends left for the
    next call. Consecutive sends to a partition with ids given here share one batch (its
    id is their last); a send with the caller's own id is a batch of its own. At most
    ``_BATCHES_PER_CALL`` batches go to a partition in one call: as many as the log
    remembers per producer, so that a call that must be retried one batch at a time gets
    every position back."""
    groups: list[list[_Send]] = []
    open_group: dict[int, list[_Send]] = {}  # partition -> its group of auto ids
    count: dict[int, int] = {}
    left: list[_Send] = []
    for s in batch:
        p = s.partition
        if left or (count.get(p, 0) >= _BATCHES_PER_CALL and not (s.auto and p in open_group)):
            left.append(s)  # (everything after it waits too: order per producer)
            continue
        if s.auto and p in open_group:
            open_group[p].append(s)
            continue
        group = [s]
        groups.append(group)
        count[p] = count.get(p, 0) + 1
        if s.auto:
            open_group[p] = group
        else:
            open_group.pop(p, None)
    return groups, left


class Producer:
    """Sends to one topic. Sends queue in order; a background thread carries everything
    queued as one append call per partition, each message with its sequence id."""

    def __init__(
        self,
        client: Client,
        core: Any,
        topic_name: str,
        partitions: int,
        schema_: schema.Schema,
        initial_sequence_id: int | None,
        routing: PartitionsRoutingMode,
        router: Callable[[Message, int], int] | None,
    ) -> None:
        self._client, self._core, self._topic_name = client, core, topic_name
        self._config = client._cluster.config
        self._partitions, self._schema = partitions, schema_
        self._routing, self._router = routing, router
        # Pulsar's ids count from 0; the log's from 1 (0: none), so the log holds id + 1
        last = max(core.last_sequences) - 1
        if initial_sequence_id is not None:
            last = max(last, initial_sequence_id)
        self._last = last  # the largest id published
        self._next = last + 1  # the next id given to a send without one
        self._single = int(np.random.default_rng().integers(partitions))
        self._rr = itertools.count()
        self._queue: deque[_Send] = deque()
        self._cv = threading.Condition()
        self._busy = 0
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"pulsar-producer-{topic_name}", daemon=True
        )
        self._thread.start()

    def topic(self) -> str:
        return self._topic_name

    def producer_name(self) -> str:
        return self._core.name

    def last_sequence_id(self) -> int:
        """The largest sequence id published (-1: none yet, by any producer of this name)."""
        return self._last

    def is_connected(self) -> bool:
        return not self._closed

    def send(
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
        """Send one message; returns its MessageId once it is durable."""
        item = self._build(content, properties, partition_key, ordering_key, sequence_id,
                           replication_clusters, disable_replication, event_timestamp,
                           deliver_at, deliver_after, None)  # fmt: skip
        return item.future.result()

    def send_async(
        self,
        content: Any,
        callback: Callable[[Result, MessageId | None], None] | None,
        properties: dict | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list | None = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> None:
        """Queue one message; ``callback(result, message_id)`` runs once it is durable (or
        failed: then the id is None)."""
        if callback is not None and not callable(callback):
            raise ValueError("Argument callback is expected to be a callable")
        self._build(content, properties, partition_key, ordering_key, sequence_id,
                    replication_clusters, disable_replication, event_timestamp,
                    deliver_at, deliver_after, callback)  # fmt: skip

    def _build(
        self,
        content: Any,
        properties: Any,
        partition_key: Any,
        ordering_key: Any,
        sequence_id: Any,
        replication_clusters: Any,
        disable_replication: Any,
        event_timestamp: Any,
        deliver_at: Any,
        deliver_after: Any,
        callback: Any,
    ) -> _Send:
        if self._closed:
            raise AlreadyClosed(f"producer {self.producer_name()!r} is closed")
        data = None if content is None else self._schema.encode(content)
        _check_type_or_none(dict, properties, "properties")
        _check_type_or_none(str, partition_key, "partition_key")
        _check_type_or_none(str, ordering_key, "ordering_key")
        _check_type_or_none(int, sequence_id, "sequence_id")
        _check_type_or_none(list, replication_clusters, "replication_clusters")
        _check_type(bool, disable_replication, "disable_replication")
        _check_type_or_none(int, event_timestamp, "event_timestamp")
        _check_type_or_none(int, deliver_at, "deliver_at")
        _check_type_or_none(timedelta, deliver_after, "deliver_after")
        if sequence_id is not None and sequence_id < 0:
            raise ValueError(f"sequence_id: must be >= 0, got {sequence_id}")
        props = dict(properties or {})
        bad = [k for k in props if isinstance(k, str) and k.startswith(_RESERVED)]
        if bad:
            raise ValueError(f"properties: {bad[0]!r}: names starting {_RESERVED!r} are reserved")
        if ordering_key:
            props[_ORDERING_KEY] = ordering_key
        key = partition_key or ordering_key or None
        if key is not None and not partition_key:
            props[_KEY_IS_ORDERING] = "1"
        props[_PRODUCER] = self._core.name
        if event_timestamp:
            props[_EVENT_TIME] = str(event_timestamp)
        if data is None:
            props[_NULL] = "1"
            data = b""
        cfg = self._config
        data = check_payload(data, cfg.topic.max_message_bytes, "content")
        key = check_key(key, "partition_key")
        props = check_properties(props) or {}
        now = time.time_ns() // 1_000_000
        at = deliver_at_of(deliver_at, deliver_after, now, cfg.delayed.max_delay_ms)
        partition = self._route(data, key, props)
        entries = Entries.build([data], np.array([at], dtype=np.int64), [key], [props])
        with self._cv:
            if self._closed:  # (checked again here: a close may have come meanwhile)
                raise AlreadyClosed(f"producer {self.producer_name()!r} is closed")
            auto = sequence_id is None
            if auto:
                sequence_id = self._next
            self._next = max(self._next, sequence_id + 1)
            item = _Send(partition, sequence_id, auto, entries, callback)
            self._queue.append(item)
            self._cv.notify_all()
        return item

    def _route(self, data: bytes, key: str | None, props: dict[str, str]) -> int:
        n = self._partitions
        if self._router is not None:
            core = _Outgoing(data, key, props)
            p = int(self._router(Message(core, self._schema, self._topic_name), n))
            if not 0 <= p < n:
                raise ValueError(f"message_router: partition {p} is not in 0..{n - 1}")
            return p
        if key is None and self._routing == PartitionsRoutingMode.UseSinglePartition:
            return self._single
        return partition_of(key, n, self._rr)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch: list[_Send] = []
                seen: set[tuple[int, int]] = set()
                while self._queue and len(batch) < _SEND_BATCH:
                    nxt = self._queue[0]
                    if (nxt.partition, nxt.seq) in seen:
                        break  # one id twice in one call: the second waits for the next
                    seen.add((nxt.partition, nxt.seq))
                    batch.append(self._queue.popleft())
                groups, left = _groups(batch)
                self._queue.extendleft(reversed(left))
                self._busy += 1
            try:
                self._append(groups)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def _append(self, groups: list[list[_Send]]) -> None:
        def batch(g: list[_Send]) -> tuple[int, int, Entries]:
            entries = g[0].entries if len(g) == 1 else concat_entries([s.entries for s in g])
            return (g[0].partition, g[-1].seq + 1, entries)

        results: list[Any] = []
        try:
            ranges = self._core.append_sequenced([batch(g) for g in groups])
            for g, r in zip(groups, ranges, strict=True):
                results += self._ids_of(g, r)
        except StaleSequence:
            # an id the topic holds already but no longer knows the position of: one batch
            # at a time, to tell that one (a duplicate) from the rest
            results = []
            for g in groups:
                try:
                    results += self._ids_of(g, self._core.append_sequenced([batch(g)])[0])
                except StaleSequence:
                    results += [MessageId(s.partition, -1, -1, -1) for s in g]
                except Exception as exc:  # noqa: BLE001 - handed to the senders
                    results += [exc] * len(g)
        except Exception as exc:  # noqa: BLE001 - handed to each sender
            results = [exc] * sum(map(len, groups))
        sends = [s for g in groups for s in g]
        for s, r in zip(sends, results, strict=True):
            if isinstance(r, Exception):
                s.future.set_exception(r)
                outcome: tuple[Result, MessageId | None] = (Result.UnknownError, None)
            else:
                with self._cv:
                    self._last = max(self._last, s.seq)
                s.future.set_result(r)
                outcome = (Result.Ok, r)
            if s.callback is not None:
                try:
                    s.callback(*outcome)
                except Exception:  # noqa: BLE001 - a user's callback must not stop sends
                    log.exception("send_async callback failed")

    def _ids_of(self, group: list[_Send], ranges: list) -> list[MessageId]:
        """The ids of a batch's messages, from the position ranges the log gave it."""
        p = group[0].partition
        ids = [  # (no topic, as Pulsar's: a consumer of several topics cannot place it)
            MessageId(p, int(ledger), int(first) + i, -1)
            for ledger, first, n in ranges
            for i in range(int(n))
        ]
        if len(ids) != len(group):
            raise PulsarException(f"partition {p} gave {len(ids)} positions for {len(group)}")
        return ids

    def flush(self) -> None:
        """Wait until every message sent so far is durable (or failed)."""
        with self._cv:
            while self._queue or self._busy:
                self._cv.wait()

    def close(self) -> None:
        """Flush, then close."""
        if self._closed:
            return
        self.flush()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cv:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for s in dropped:
            s.future.set_exception(AlreadyClosed("the producer was shut down"))
            if s.callback is not None:
                s.callback(Result.AlreadyClosed, None)
        self._core.close()


class _Outgoing:
    """A message being sent, as a message router sees it."""

    def __init__(self, payload: bytes, key: str | None, props: dict[str, str]) -> None:
        self.payload, self.key, self.properties = payload, key, props
        self.publish_time_ms = 0
        self.redelivery_count = 0
        self.message_id = _CoreId("", -1, -1, -1)


# --- the consumer ---------------------------------------------------------------------------


class Consumer(_Endpoint):
    """Receives from one subscription. It asks raydelay for up to ``receiver_queue_size``
    messages at a time (at least 1) and hands them out one by one: those it holds count as
    delivered to it, as in Pulsar's receiver queue."""

    def __init__(
        self,
        client: Client,
        core: Any,
        topic_name: str,
        partitions: int,
        subscription: str,
        name: str,
        kind: ConsumerType,
        schema_: schema.Schema,
        queue_size: int,
        nack_delay_ms: int,
        batch_policy: ConsumerBatchReceivePolicy,
        inclusive: bool = False,
    ) -> None:
        self._client, self._core, self._topic_name = client, core, topic_name
        self._several = isinstance(core, _CoreMulti)  # several topics (a list, a pattern)
        self._inclusive = inclusive  # start_message_id_inclusive: what a seek by id means
        self._partitions, self._subscription, self._name = partitions, subscription, name
        self._kind, self._schema = kind, schema_
        self._fill = max(1, min(queue_size, _FILL_MAX))
        self._nack_delay_s = nack_delay_ms / 1000
        self._batch_policy = batch_policy
        self._buffer: deque[Any] = deque()
        # FIFO types: what it handed out and no ack covered yet, per (topic, partition)
        # (what a cumulative ack acknowledges)
        self._handed: dict[tuple[str, int], set[tuple[int, int]]] | None = (
            {} if kind in (ConsumerType.Exclusive, ConsumerType.Failover) else None
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
        return _wrap(self._client, m, self._schema, self._topic_name, self._partitions)

    def _take(self, want: int, timeout_s: float | None) -> list[Any]:
        """Up to ``want`` raydelay messages: buffered ones first, else one ask of at most the
        receiver queue, waiting up to ``timeout_s`` (None: until one comes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        asked = False
        while True:
            # the lock is held one step at a time (at most _STEP_S), so that an ack or a
            # redelivery from another thread never waits for a long receive
            with self._lock:
                self._check_open()
                if self._buffer:
                    out = [self._buffer.popleft() for _ in range(min(want, len(self._buffer)))]
                    if self._handed is not None:
                        for m in out:
                            mid = m.message_id
                            self._handed.setdefault((mid.topic, mid.partition), set()).add(
                                (mid.ledger_id, mid.entry_id)
                            )
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

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits up to ``timeout_millis`` (None: until one comes) and
        raises :class:`Timeout` when none came."""
        if timeout_millis is not None:
            _check_type(int, timeout_millis, "timeout_millis")
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
            self._client._cluster.delete_subscription(topic, self._subscription)

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
        target = _seek_target(local, messageid)
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
        return _last_id(self._core)
