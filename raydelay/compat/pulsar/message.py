"""Pulsar's message ids and received messages over raydelay's: :class:`MessageId` (where a
message is, ordered by position, serializable) and :class:`Message` (Pulsar's accessors).
What Pulsar has and raydelay's messages do not (the ordering key, the producer name, the
event time, a null value) travels as properties whose names start with ``__pulsar.``,
hidden from :meth:`Message.properties`."""

from __future__ import annotations

from typing import Any

import msgpack

from raydelay.client.message import MessageId as _CoreId
from raydelay.compat.pulsar._checks import check_type
from raydelay.compat.pulsar._topics import local_name
from raydelay.compat.pulsar.schema import Schema

# The properties a producer adds to carry what Pulsar has and raydelay's messages do not
RESERVED = "__pulsar."  # (a caller's own properties may not start with it)
ORDERING_KEY = RESERVED + "ordering_key"
KEY_IS_ORDERING = RESERVED + "key_is_ordering_key"  # set when the key came from the ordering key
PRODUCER = RESERVED + "producer"
EVENT_TIME = RESERVED + "event_timestamp"
NULL = RESERVED + "null_value"

I64_MAX = 2**63 - 1  # MessageId.latest's ledger and entry


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
            check_type(int, v, name)
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
        check_type(bytes, message_id_bytes, "message_id_bytes")
        try:
            v, p, lg, e, b, t = msgpack.unpackb(message_id_bytes)
            if v != 1:
                raise ValueError(f"version {v}")
        except Exception as exc:  # noqa: BLE001 - any decode failure is the same error
            raise ValueError(
                f"MessageId.deserialize: not a serialized message id ({exc})"
            ) from None
        return MessageId(p, lg, e, b, topic=local_name(topic) if topic else t)

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


MessageId.earliest = MessageId(-1, -1, -1, -1)
MessageId.latest = MessageId(-1, I64_MAX, I64_MAX, -1)


class Message:
    """A received message (Pulsar's accessors over a raydelay message)."""

    __slots__ = ("_m", "_schema", "_topic_name", "_props")

    def __init__(self, core: Any, schema_: Schema, topic_name: str) -> None:
        self._m, self._schema, self._topic_name = core, schema_, topic_name
        self._props = core.properties or {}

    def data(self) -> bytes:
        return self._m.payload

    def value(self) -> Any:
        if self.has_null_value():
            return None
        return self._schema.decode(self._m.payload)

    def properties(self) -> dict[str, str]:
        return {k: v for k, v in self._props.items() if not k.startswith(RESERVED)}

    def partition_key(self) -> str:
        if self._m.key is None or KEY_IS_ORDERING in self._props:
            return ""
        return self._m.key

    def ordering_key(self) -> str:
        return self._props.get(ORDERING_KEY, "")

    def publish_timestamp(self) -> int:
        return int(self._m.publish_time_ms)

    def event_timestamp(self) -> int:
        return int(self._props.get(EVENT_TIME, 0))

    def message_id(self) -> MessageId:
        return MessageId._of(self._m.message_id)

    def topic_name(self) -> str:
        return self._topic_name

    def redelivery_count(self) -> int:
        return int(self._m.redelivery_count)

    def schema_version(self) -> str:
        return ""

    def producer_name(self) -> str:
        return self._props.get(PRODUCER, "")

    def has_null_value(self) -> bool:
        return NULL in self._props

    def encryption_context(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"Message(id={self.message_id()}, topic={self._topic_name!r})"
