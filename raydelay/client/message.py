"""The client's value types and input checks (no Ray)."""

from __future__ import annotations

import math
from datetime import datetime
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY


class MessageId(NamedTuple):
    """Where a message is: topic, partition, ledger and entry. Immutable, hashable, and
    ordered by position within a partition; ``str()`` gives ``topic/partition/ledger:entry``."""

    topic: str
    partition: int
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.ledger_id}:{self.entry_id}"


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


def messages_from_wire(cols: dict[str, Any]) -> list[Message]:
    # tuple.__new__ through map builds the tuples without a Python-level call per message
    n = len(cols["l"])
    ids = map(
        partial(tuple.__new__, MessageId),
        zip(repeat(cols["topic"], n), repeat(cols["partition"], n), cols["l"], cols["e"]),
    )
    props = [pr or {} for pr in cols["pr"]] if cols["pr"] else [{} for _ in range(n)]
    due = [None if d < 0 else d for d in cols["d"]]
    return list(
        map(
            partial(tuple.__new__, Message),
            zip(
                ids,
                cols["p"],
                cols["k"] or repeat(None, n),
                props,
                cols["t"],
                due,
                cols["r"],
                strict=True,
            ),
        )
    )


# --- input checks -------------------------------------------------------------------------


def check_payload(payload: object, max_bytes: int, field_name: str = "payload") -> bytes:
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


def deliver_at_of(
    deliver_at: object, deliver_after: object, now_ms: int, max_delay_ms: int, where: str = ""
) -> int:
    """The epoch-ms due time of one message (NO_DELAY for an immediate one).

    ``deliver_at``: epoch milliseconds (int) or an aware datetime. ``deliver_after``:
    seconds from now (int or float, >= 0). At most one of them may be given."""
    sfx = f" ({where})" if where else ""
    if deliver_at is not None and deliver_after is not None:
        raise InvalidArgument(f"deliver_at: give deliver_at or deliver_after, not both{sfx}")
    if deliver_after is not None:
        if isinstance(deliver_after, bool) or not isinstance(deliver_after, (int, float)):
            raise InvalidArgument(
                f"deliver_after: expected seconds as int or float, got "
                f"{type(deliver_after).__name__}{sfx}"
            )
        if not math.isfinite(deliver_after) or deliver_after < 0:
            raise InvalidArgument(f"deliver_after: must be >= 0 seconds, got {deliver_after}{sfx}")
        at = now_ms + int(round(deliver_after * 1000))
    elif deliver_at is not None:
        if isinstance(deliver_at, datetime):
            if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
                raise InvalidArgument(
                    f"deliver_at: a naive datetime is ambiguous; give it a timezone{sfx}"
                )
            at = int(round(deliver_at.timestamp() * 1000))
        elif isinstance(deliver_at, bool) or not isinstance(deliver_at, int):
            raise InvalidArgument(
                f"deliver_at: expected epoch milliseconds (int) or an aware datetime, got "
                f"{type(deliver_at).__name__}{sfx}"
            )
        else:
            at = deliver_at
        if at < 0:
            raise InvalidArgument(f"deliver_at: must be >= 0 (epoch ms), got {at}{sfx}")
    else:
        return NO_DELAY
    if max_delay_ms and at - now_ms > max_delay_ms:
        raise InvalidArgument(
            f"deliver_at: {at - now_ms} ms from now is beyond delayed.max_delay_ms "
            f"({max_delay_ms}){sfx}"
        )
    return at


def check_number(field_name: str, value: object, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{field_name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < minimum:
        raise InvalidArgument(f"{field_name}: must be >= {minimum}, got {value}")
    return float(value)
