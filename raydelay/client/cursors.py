"""Where a subscription's cursor, or a reader, goes for a point in a topic: ``"earliest"``,
``"latest"``, a message id or a time, turned into each partition's mark-delete position
(what ``Cluster.reset_cursor``, ``Consumer.seek`` and ``Cluster.create_reader`` take), and
the reset of a subscription's units to those marks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np

from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost, UnitPeer
from raydelay.client.message import MessageId, time_ms_of
from raydelay.client.peers import ClusterPeers
from raydelay.cluster import rpc
from raydelay.errors import InvalidArgument, NotFound


class Cursors:
    """Marks and resets over one client's peers."""

    def __init__(self, peers: ClusterPeers) -> None:
        self._peers = peers

    def reset(
        self, topic: str, subscription: str, n: int, to: Any, inclusive: bool = True
    ) -> dict[int, list[int]]:
        marks = self.marks(topic, n, to, inclusive=inclusive)
        groups: dict[str, tuple[UnitPeer, dict[int, list[int]]]] = {}
        for p, md in marks.items():
            peer = self._peers.subscription_peer(topic, p, subscription)
            groups.setdefault(peer.name, (peer, {}))[1][p] = md
        peers = [peer for peer, _ in groups.values()]

        def lost() -> None:
            for peer in peers:
                peer.lost()

        rpc.call(
            lambda: [
                peer.submit(SubscriptionHost.reset, peer.unit, work)
                for peer, work in groups.values()
            ],
            what=f"resetting the cursor of {topic}/{subscription}",
            deadline_s=self._peers.deadline_s,
            on_failure=lost,
        )
        return marks

    def marks(
        self, topic: str, n: int, to: Any, field: str = "to", inclusive: bool = True
    ) -> dict[int, list[int]]:
        """partition -> the mark-delete position a reset ``to`` gives (see reset_cursor);
        a message id is delivered again with ``inclusive``, else what follows it."""
        if isinstance(to, str) and to in ("earliest", "latest"):
            if to == "earliest":
                return {p: [-1, -1] for p in range(n)}
            tails = self._peers.on_partitions(topic, n, HostActor.tail)
            return {
                p: [-1, -1] if t is None else [int(t[0]), int(t[1])] for p, t in enumerate(tails)
            }
        if isinstance(to, str):
            to = MessageId.parse(to)
        if isinstance(to, MessageId):
            md = self._mark_before(topic, n, to)
            return {to.partition: md if inclusive else [md[0], md[1] + 1]}
        if isinstance(to, datetime) or (
            isinstance(to, (int, np.integer)) and not isinstance(to, bool)
        ):
            at = time_ms_of(field, to)
            found = self._peers.on_partitions(topic, n, HostActor.position_at, at)
            tails = self._peers.on_partitions(topic, n, HostActor.tail)
            out = {}
            for p, (pos, tail) in enumerate(zip(found, tails, strict=True)):
                if pos is not None:
                    out[p] = [int(pos[0]), int(pos[1]) - 1]
                else:  # every entry is older: after the last one
                    out[p] = [-1, -1] if tail is None else [int(tail[0]), int(tail[1])]
            return out
        raise InvalidArgument(
            f"{field}: expected 'earliest', 'latest', a MessageId (or its string), epoch "
            f"milliseconds or an aware datetime; got {type(to).__name__}"
        )

    def _mark_before(self, topic: str, n: int, mid: MessageId) -> list[int]:
        """The mark-delete position just before message ``mid``, which must be in the log."""
        if mid.topic != topic:
            raise InvalidArgument(f"message_id: {mid} is of topic {mid.topic!r}, not {topic!r}")
        if not 0 <= mid.partition < n:
            raise InvalidArgument(
                f"message_id: {topic} has partitions 0..{n - 1}, not {mid.partition}"
            )
        ledgers = self._peers.on_partition(topic, mid.partition, HostActor.ledgers)
        sizes = dict((int(i), c) for i, c in ledgers)
        if mid.ledger_id not in sizes:
            if ledgers and mid.ledger_id < min(sizes):
                raise NotFound(f"message_id: {mid} is no longer in the log (retention deleted it)")
            raise InvalidArgument(f"message_id: {mid} is past the end of {topic}/{mid.partition}")
        count = sizes[mid.ledger_id]
        if count is None:  # the open ledger: up to its last entry
            tail = self._peers.on_partition(topic, mid.partition, HostActor.tail)
            count = int(tail[1]) + 1 if tail is not None and int(tail[0]) == mid.ledger_id else 0
        if mid.entry_id >= count:
            raise InvalidArgument(f"message_id: {mid} is past the end of {topic}/{mid.partition}")
        return [mid.ledger_id, mid.entry_id - 1]

    def read_from(
        self, topic: str, n: int, to: Any, inclusive: bool, field: str
    ) -> dict[int, tuple[int, int]]:
        """partition -> the first position to read for ``to`` (see create_reader): the
        entry after the mark-delete position a reset to it gives."""
        marks = self.marks(topic, n, to, field, inclusive)
        return {p: (md[0], md[1] + 1) if md[0] >= 0 else (-1, 0) for p, md in marks.items()}
