"""What a Pulsar consumer and reader share: the :class:`Endpoint` base (a topic, a name,
being open), a raydelay message as a Pulsar one, and what a seek argument means."""

from __future__ import annotations

from typing import Any

from raydelay.client.message import MessageId as _CoreId
from raydelay.compat.pulsar._topics import TopicMap, local_name
from raydelay.compat.pulsar.exceptions import AlreadyClosed, OperationNotSupported
from raydelay.compat.pulsar.message import I64_MAX, Message, MessageId
from raydelay.compat.pulsar.schema import Schema
from raydelay.errors import InvalidArgument


class Endpoint:
    """A Pulsar consumer or reader: a topic, a name, and being open."""

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


def wrap_message(topics: TopicMap, m: Any, schema_: Schema, name: str, partitions: int) -> Message:
    """A raydelay message as a Pulsar one; its topic name with a ``-partition-N`` suffix on
    a partitioned topic (a consumer of several topics: the name of the message's own)."""
    mid = m.message_id
    if not name:  # (several topics)
        name = topics.full_name(mid.topic)
        partitions = topics.partitions(mid.topic)
    if partitions > 1:
        name = f"{name}-partition-{mid.partition}"
    return Message(m, schema_, name)


def seek_target(local: str | None, arg: Any) -> Any:
    """What a Pulsar seek argument (or a reader's start) means to raydelay: "earliest",
    "latest", a raydelay MessageId, or epoch ms."""
    if isinstance(arg, MessageId):
        if arg._key() == MessageId.earliest._key():
            return "earliest"
        if arg._ledger == I64_MAX:
            return "latest"
        if arg._ledger < 0 or arg._entry < 0:
            raise ValueError(f"seek: {arg} names no message")
        topic = local_name(arg._topic) if arg._topic else local
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


def last_id(core: Any) -> MessageId:
    """A core consumer's or reader's last message id, as Pulsar's (earliest: none)."""
    try:
        last = core.get_last_message_id()
    except InvalidArgument:
        raise OperationNotSupported(
            "get_last_message_id: the topic is partitioned (ask each partition)"
        ) from None
    return MessageId.earliest if last is None else MessageId._of(last)
