"""The client's value types and input checks (no Ray)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple, overload

import numpy as np
import pyarrow as pa

from raydelay.dispatch.wire import DELIVERY_SCHEMA
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY, int64_values
from raydelay.positions import position_keys


class MessageId(NamedTuple):
    """Where a message is: topic, partition, ledger and entry. Immutable, hashable, and
    ordered by position within a partition; ``str()`` gives ``topic/partition/ledger:entry``."""

    topic: str
    partition: int
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """The MessageId that ``str()`` printed: ``topic/partition/ledger:entry``."""
        if not isinstance(text, str):
            raise InvalidArgument(f"message_id: expected a str, got {type(text).__name__}")
        try:
            topic, partition, rest = text.rsplit("/", 2)
            ledger, entry = rest.split(":")
            mid = cls(topic, int(partition), int(ledger), int(entry))
        except ValueError:
            raise InvalidArgument(
                f"message_id: {text!r} is not topic/partition/ledger:entry"
            ) from None
        if not topic or min(mid.partition, mid.ledger_id, mid.entry_id) < 0:
            raise InvalidArgument(f"message_id: {text!r} has an empty topic or a negative number")
        return mid


class MessageIds(Sequence[MessageId]):
    """The MessageIds of one ``send_many``, in input order, kept as three int64 columns
    (:attr:`partitions`, :attr:`ledger_ids`, :attr:`entry_ids`); a MessageId is built
    when it is asked for. It is a sequence: index it, slice it (a list), iterate, compare
    it with a list of MessageIds."""

    __slots__ = ("topic", "partitions", "ledger_ids", "entry_ids")

    def __init__(
        self, topic: str, partitions: np.ndarray, ledger_ids: np.ndarray, entry_ids: np.ndarray
    ) -> None:
        self.topic = topic
        self.partitions, self.ledger_ids, self.entry_ids = partitions, ledger_ids, entry_ids

    def __len__(self) -> int:
        return len(self.entry_ids)

    @overload
    def __getitem__(self, i: int) -> MessageId: ...

    @overload
    def __getitem__(self, i: slice) -> list[MessageId]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        i = range(len(self))[i]  # negative indexes, and IndexError past the end
        return MessageId(
            self.topic, int(self.partitions[i]), int(self.ledger_ids[i]), int(self.entry_ids[i])
        )

    def __iter__(self) -> Iterator[MessageId]:
        # tuple.__new__ through map: no Python-level call per MessageId
        return map(
            partial(tuple.__new__, MessageId),
            zip(
                repeat(self.topic),
                self.partitions.tolist(),
                self.ledger_ids.tolist(),
                self.entry_ids.tolist(),
            ),
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MessageIds, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageIds(topic={self.topic!r}, n={len(self)})"


class Message(NamedTuple):
    """A delivered message (immutable).

    - ``properties``: the producer's str -> str map ({} when none were given).
    - ``publish_time_ms``: when the partition log committed it (epoch ms).
    - ``deliver_at_ms``: when it was due (epoch ms); None for an immediate message.
    - ``redelivery_count``: how many times it was delivered before this delivery.
    """

    message_id: MessageId
    payload: bytes
    key: str | None
    properties: dict[str, str]
    publish_time_ms: int
    deliver_at_ms: int | None
    redelivery_count: int


def load_arrow_conversions() -> None:
    """Make pyarrow's first conversions between numpy and Arrow now (cheap after the
    first time in a process). pyarrow imports pandas, when it is installed, on the first
    one (its lazy pandas shim): 0.25-0.4 s here. Every consumer and reader calls this when
    it is made, so that it is not paid on the first delivery: before, the first messages a
    new process received were that much late, and in a 20 s stream of 20k msg/s those
    alone made the p99 lateness 168 ms instead of 18."""
    pa.array(np.zeros(1, dtype=np.int64)).to_numpy()


def messages_from_batch(topic: str, partition: int, rb: pa.RecordBatch) -> list[Message]:
    """The rows of one delivered record batch (DELIVERY_SCHEMA) as Message tuples."""
    n = rb.num_rows
    if n == 0:
        return []
    ledger, entry, publish, due, count, payload, key, props = rb.columns
    # tuple.__new__ through map builds the tuples without a Python-level call per message
    ids = map(
        partial(tuple.__new__, MessageId),
        zip(repeat(topic, n), repeat(partition, n), ledger.to_pylist(), entry.to_pylist()),
    )
    if props.null_count == n:
        prop_list: Any = [{} for _ in range(n)]
    else:
        prop_list = [dict(p) if p else {} for p in props.to_pylist()]
    due_np = int64_values(due)
    due_list = due.to_pylist()
    if (due_np < 0).any():
        due_list = [None if d < 0 else d for d in due_list]
    return list(
        map(
            partial(tuple.__new__, Message),
            zip(
                ids,
                payload.to_pylist(),
                repeat(None, n) if key.null_count == n else key.to_pylist(),
                prop_list,
                publish.to_pylist(),
                due_list,
                count.to_pylist(),
                strict=True,
            ),
        )
    )


class MessageBatch:
    """The messages of one :meth:`Consumer.receive_batch`, kept as columns.

    It holds one Arrow record batch per partition the messages came from
    (:attr:`batches`, as ``(partition, record batch)``; the schema is
    :data:`raydelay.dispatch.wire.DELIVERY_SCHEMA`). ``len()`` counts messages;
    iterating yields :class:`Message` tuples, built lazily one partition at a time.
    Pass the whole batch to ``consumer.ack`` or ``consumer.nack``: that is one call per
    partition, with the positions as one integer array.

    Columns (across partitions, in the order of iteration):

    - ``payloads``, ``keys``: Arrow chunked arrays (``.to_pylist()`` for Python objects);
    - ``deliver_at_ms`` (-1 for an immediate message), ``redelivery_count``,
      ``publish_time_ms``, ``partitions``: int64 numpy arrays;
    - ``message_ids``: a list of :class:`MessageId`;
    - ``to_arrow()``: one ``pyarrow.Table`` with a ``partition`` column first.
    """

    __slots__ = ("topic", "batches")

    def __init__(self, topic: str, batches: list[tuple[int, pa.RecordBatch]]) -> None:
        self.topic = topic
        self.batches = [(int(p), rb) for p, rb in batches if rb.num_rows]

    def __len__(self) -> int:
        return sum(rb.num_rows for _, rb in self.batches)

    def __bool__(self) -> bool:
        return bool(self.batches)

    def __iter__(self) -> Iterator[Message]:
        for p, rb in self.batches:
            yield from messages_from_batch(self.topic, p, rb)

    def __repr__(self) -> str:
        return (
            f"MessageBatch(topic={self.topic!r}, messages={len(self)}, "
            f"partitions={[p for p, _ in self.batches]})"
        )

    def _column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array(
            [rb.column(name) for _, rb in self.batches], type=DELIVERY_SCHEMA.field(name).type
        )

    def _ints(self, name: str) -> np.ndarray:
        if not self.batches:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([int64_values(rb.column(name)) for _, rb in self.batches])

    @property
    def payloads(self) -> pa.ChunkedArray:
        return self._column("payload")

    @property
    def keys(self) -> pa.ChunkedArray:
        return self._column("key")

    @property
    def deliver_at_ms(self) -> np.ndarray:
        return self._ints("deliver_at_ms")

    @property
    def redelivery_count(self) -> np.ndarray:
        return self._ints("redelivery_count")

    @property
    def publish_time_ms(self) -> np.ndarray:
        return self._ints("publish_time_ms")

    @property
    def partitions(self) -> np.ndarray:
        if not self.batches:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.full(rb.num_rows, p, dtype=np.int64) for p, rb in self.batches])

    @property
    def message_ids(self) -> list[MessageId]:
        return [
            MessageId(self.topic, p, lg, e)
            for p, rb in self.batches
            for lg, e in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist(), strict=True)
        ]

    def position_keys(self) -> dict[int, np.ndarray]:
        """partition -> int64 position keys ``ledger << 32 | entry`` of its messages."""
        out: dict[int, list[np.ndarray]] = {}
        for p, rb in self.batches:
            keys = position_keys(int64_values(rb.column(0)), int64_values(rb.column(1)))
            out.setdefault(p, []).append(keys)
        return {p: np.concatenate(ks) for p, ks in out.items()}

    def to_arrow(self) -> pa.Table:
        schema = pa.schema([("partition", pa.int32()), *DELIVERY_SCHEMA]).with_metadata(
            {b"topic": self.topic.encode("utf-8")}
        )
        tables = [
            pa.Table.from_batches([rb]).add_column(
                0,
                "partition",
                pa.Array.from_buffers(
                    pa.int32(),
                    rb.num_rows,
                    [None, pa.py_buffer(np.full(rb.num_rows, p, dtype=np.int32))],
                ),
            )
            for p, rb in self.batches
        ]
        if not tables:
            return pa.Table.from_batches([], schema)
        return pa.concat_tables(tables).replace_schema_metadata(schema.metadata)


# --- input checks -------------------------------------------------------------------------


def check_payload(payload: object, max_bytes: int, field_name: str = "payload") -> bytes:
    if type(payload) is bytes and len(payload) <= max_bytes:  # (the common case, first)
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        payload = bytes(payload)
    if not isinstance(payload, bytes):
        raise InvalidArgument(f"{field_name}: expected bytes, got {type(payload).__name__}")
    if len(payload) > max_bytes:
        raise InvalidArgument(
            f"{field_name}: {len(payload)} bytes is over topic.max_message_bytes ({max_bytes})"
        )
    return payload


def check_key(key: object, field_name: str = "key") -> str | None:
    if key is not None and not isinstance(key, str):
        raise InvalidArgument(f"{field_name}: expected a str or None, got {type(key).__name__}")
    return key


def check_properties(props: object, field_name: str = "properties") -> dict[str, str] | None:
    if props is None:
        return None
    if not isinstance(props, dict):
        raise InvalidArgument(f"{field_name}: expected a dict, got {type(props).__name__}")
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument(f"{field_name}: keys and values must be str, got {k!r}: {v!r}")
    return dict(props) or None


# The latest due time accepted: the last millisecond of year 9999 (UTC). Later values,
# such as 2**63, would overflow the int64 column on the way.
MAX_DELIVER_AT_MS = 253_402_300_799_999
_PLAIN = (int, float)  # (by type: bool, an int subclass, is refused on the full path)
_FAST_AFTER_S = 100 * 365 * 86_400.0  # a delay this short lands well before year 9999


def seconds_of(field_name: str, value: object, where: str = "") -> float:
    """A duration in seconds: an int, a float (numpy's too) or a ``datetime.timedelta``."""
    sfx = f" ({where})" if where else ""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (np.integer, np.floating)):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(
            f"{field_name}: expected seconds (int or float) or a timedelta, got "
            f"{type(value).__name__}{sfx}"
        )
    return value


def time_ms_of(field_name: str, value: object, where: str = "") -> int:
    """An instant as epoch milliseconds: an int (numpy's too) or an aware datetime, from
    0 to the end of year 9999."""
    sfx = f" ({where})" if where else ""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(
                f"{field_name}: a naive datetime is ambiguous; give it a timezone{sfx}"
            )
        at = int(round(value.timestamp() * 1000))
    elif isinstance(value, np.integer):
        at = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"{field_name}: expected epoch milliseconds (int) or an aware datetime, got "
            f"{type(value).__name__}{sfx}"
        )
    else:
        at = value
    if at < 0:
        raise InvalidArgument(f"{field_name}: must be >= 0 (epoch ms), got {at}{sfx}")
    if at > MAX_DELIVER_AT_MS:
        raise InvalidArgument(
            f"{field_name}: {at} is after year 9999 (at most {MAX_DELIVER_AT_MS} epoch ms){sfx}"
        )
    return at


def deliver_at_of(
    deliver_at: object, deliver_after: object, now_ms: int, max_delay_ms: int, where: str = ""
) -> int:
    """The epoch-ms due time of one message (NO_DELAY for an immediate one).

    ``deliver_at``: epoch milliseconds (an int, numpy's too) or an aware datetime.
    ``deliver_after``: a duration from now (seconds as int or float, or a timedelta),
    >= 0. At most one of them may be given. Either must land before year 10000."""
    # The common cases first, in a few operations (a send_async's budget is microseconds):
    # a plain number of seconds from now, or plain epoch ms; anything else, or a value the
    # checks below would refuse, takes the full path.
    if deliver_at is None:
        if type(deliver_after) in _PLAIN and 0 <= deliver_after <= _FAST_AFTER_S:  # type: ignore[operator]
            at = now_ms + int(round(deliver_after * 1000))  # type: ignore[operator]
            if not max_delay_ms or at - now_ms <= max_delay_ms:
                return at
    elif (
        deliver_after is None
        and type(deliver_at) is int
        and 0 <= deliver_at <= MAX_DELIVER_AT_MS
        and (not max_delay_ms or deliver_at - now_ms <= max_delay_ms)
    ):
        return deliver_at
    sfx = f" ({where})" if where else ""
    if deliver_at is not None and deliver_after is not None:
        raise InvalidArgument(f"deliver_at: give deliver_at or deliver_after, not both{sfx}")
    if deliver_after is not None:
        after = seconds_of("deliver_after", deliver_after, where)
        if not math.isfinite(after) or after < 0:
            raise InvalidArgument(
                f"deliver_after: must be a finite number of seconds >= 0, got {after}{sfx}"
            )
        if after > (MAX_DELIVER_AT_MS - now_ms) / 1000:
            raise InvalidArgument(f"deliver_after: {after:g} s from now is after year 9999{sfx}")
        at = now_ms + int(round(after * 1000))
    elif deliver_at is not None:
        at = time_ms_of("deliver_at", deliver_at, where)
    else:
        return NO_DELAY
    if max_delay_ms and at - now_ms > max_delay_ms:
        raise InvalidArgument(
            f"deliver_at: {at - now_ms} ms from now is beyond delayed.max_delay_ms "
            f"({max_delay_ms}){sfx}"
        )
    return at


def check_number(field_name: str, value: object, *, minimum: float = 0.0) -> float:
    """A duration in seconds (see :func:`seconds_of`), finite and at least ``minimum``."""
    value = seconds_of(field_name, value)
    if not math.isfinite(value) or value < minimum:
        raise InvalidArgument(f"{field_name}: must be a finite number >= {minimum}, got {value}")
    return float(value)
