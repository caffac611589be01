"""A producer's cancels by MessageId: one marker batch per partition, deduplicated like
any batch of the producer (its name and the partition's next sequence id), each id checked
before any is written. The cancels by key are :mod:`raydelay.client.keyed`'s."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raydelay.client.message import MessageId
from raydelay.errors import InvalidArgument
from raydelay.positions import position_in_range

if TYPE_CHECKING:
    from raydelay.client.links import TopicLink


class CancelSends:
    """The cancels by id of a :class:`raydelay.Producer`."""

    # the producer's state this part uses (set by Producer.__init__)
    topic: str
    name: str
    partitions: int
    retries: int
    _link: TopicLink
    _seq_lock: threading.Lock
    _seq: list[int]
    _check_open: Callable[[], None]

    def cancel(self, message_id: MessageId) -> bool:
        """Cancel a scheduled message. True when no subscription has had it delivered;
        False when it was delivered already (the cancel then has no effect there)."""
        return self.cancel_many([message_id])[0]

    def cancel_many(self, message_ids: Sequence[MessageId]) -> list[bool]:
        """Cancel many messages in one call per partition (and per subscription partition);
        one result per id, as :meth:`cancel` gives. Every id is checked before any is sent:
        one that is not in the log (NotFound) and none is cancelled."""
        by_partition = self._by_partition(message_ids)
        batches = {}
        with self._seq_lock:  # the markers are deduplicated like any batch of this producer
            for p, idx in by_partition.items():
                self._seq[p] += 1
                positions = [(message_ids[i].ledger_id, message_ids[i].entry_id) for i in idx]
                batches[p] = (positions, self._seq[p])
        results, resent = self._link.cancel(batches, self.name)
        self.retries += resent
        out = [False] * len(message_ids)
        for p, idx in by_partition.items():
            for i, ok in zip(idx, results[p], strict=True):
                out[i] = ok
        return out

    def check_cancel(self, message_ids: Sequence[MessageId]) -> None:
        """What :meth:`cancel_many` checks before it writes, and nothing more: InvalidArgument
        or NotFound for the first id it would refuse (a cancel of several topics checks
        them all first)."""
        by_partition = self._by_partition(message_ids)
        self._link.check_cancel(
            {
                p: [(message_ids[i].ledger_id, message_ids[i].entry_id) for i in idx]
                for p, idx in by_partition.items()
            }
        )

    def _by_partition(self, message_ids: Sequence[MessageId]) -> dict[int, list[int]]:
        """The indexes of ``message_ids`` by partition, each id checked."""
        self._check_open()
        if isinstance(message_ids, MessageId) or not isinstance(message_ids, Sequence):
            raise InvalidArgument("message_ids: expected a sequence of MessageId")
        by_partition: dict[int, list[int]] = {}
        for i, mid in enumerate(message_ids):
            check_cancel_target(f"message_ids[{i}]", mid, self.topic, self.partitions)
            by_partition.setdefault(mid.partition, []).append(i)
        return by_partition


def check_cancel_target(field: str, mid: Any, topic: str, partitions: int) -> None:
    """InvalidArgument, naming ``field``, unless ``mid`` is a MessageId of ``topic`` (of
    ``partitions`` partitions) at a message position: what a cancel checks of each id
    before it sends any (the console checks the same before it asks for confirmation)."""
    if not isinstance(mid, MessageId):
        raise InvalidArgument(f"{field}: expected a MessageId, got {type(mid).__name__}")
    if mid.topic != topic:
        raise InvalidArgument(f"{field}: belongs to topic {mid.topic!r}, not {topic!r}")
    if not 0 <= mid.partition < partitions:
        raise InvalidArgument(
            f"{field}: partition {mid.partition} does not exist ({topic} has {partitions})"
        )
    if not position_in_range(mid.ledger_id, mid.entry_id):
        raise InvalidArgument(f"{field}: {mid} is no message position")
