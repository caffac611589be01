"""The consumer policies of the ``pulsar`` package: dead letters, batch receive and
Key_Shared options, checked as Pulsar checks them when they are made."""

from __future__ import annotations

import itertools
from typing import Any

from raydelay.compat.pulsar._checks import check_type, check_type_or_none
from raydelay.compat.pulsar.enums import KeySharedMode


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
        check_type_or_none(str, dead_letter_topic, "dead_letter_topic")
        check_type_or_none(str, initial_subscription_name, "initial_subscription_name")
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
            check_type(int, v, name)
        if max_num_message <= 0 and max_num_bytes <= 0 and timeout_ms <= 0:
            raise ValueError(
                "ConsumerBatchReceivePolicy: at least one of max_num_message, max_num_bytes "
                "and timeout_ms must be > 0"
            )
        self.max_num_message = max_num_message
        self.max_num_bytes = max_num_bytes
        self.timeout_ms = timeout_ms


# what a consumer given no batch receive policy waits for (as Pulsar's default)
DEFAULT_BATCH_POLICY = ConsumerBatchReceivePolicy(-1, 10 * 1024 * 1024, 100)


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
        check_type(KeySharedMode, key_shared_mode, "key_shared_mode")
        check_type(bool, allow_out_of_order_delivery, "allow_out_of_order_delivery")
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
