"""Publishing one subscription partition's dead letters: messages redelivered more than
``max_redeliveries`` times go to the dead-letter topic (partition 0), each with its origin
in its properties. :class:`DeadLetters` is the ``publish_dead_letters`` the pure
``Subscription`` flushes through."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.host import HostActor, partition_peer
from raydelay.actors.subscription.ref import PartitionRef
from raydelay.cluster.handles import Peer
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries, encode_batch
from raydelay.positions import split_keys

log = logging.getLogger(__name__)


def dead_letter_topic(ref: PartitionRef, options: dict[str, Any]) -> str:
    """The subscription's dead-letter topic: its option, else ``<topic>-<subscription>-DLQ``."""
    return options.get("dead_letter_topic") or f"{ref.topic}-{ref.subscription}-DLQ"


def dead_letter_entries(ref: PartitionRef, keys: np.ndarray, entries: Entries) -> Entries:
    """``entries`` (at position ``keys``) as dead letters: due at once, each with its
    original message id and subscription added to its properties."""
    ledger_ids, entry_ids = split_keys(keys)
    props = [
        dict(p or {})
        | {
            "raydelay.original_message_id": f"{ref.topic}/{ref.partition}/{lg}:{e}",
            "raydelay.subscription": ref.subscription,
        }
        for p, lg, e in zip(
            entries.properties or [None] * len(entries),
            ledger_ids.tolist(),
            entry_ids.tolist(),
            strict=True,
        )
    ]
    return Entries.build(
        entries.batch.column(0),
        np.full(len(entries), NO_DELAY, dtype=np.int64),
        entries.batch.column(2),
        props,
    )


class DeadLetters:
    """Appends one partition's dead letters to its dead-letter topic through that topic's
    partition-0 handle (looked up once per topic)."""

    def __init__(
        self,
        ref: PartitionRef,
        options: dict[str, Any],
        config: dict,
        coordinator: Peer[CoordinatorActor],
    ) -> None:
        self._ref = ref
        self._options = options
        self._config = config
        self._coordinator = coordinator
        self._peers: dict[str, Peer[HostActor]] = {}  # dead-letter topic -> its partition 0's host

    async def publish(self, keys: np.ndarray, entries: Entries) -> None:
        """Append dead letters to the DLQ topic (partition 0), each with its origin in its
        properties, through the DLQ topic's handle."""
        dlq = dead_letter_topic(self._ref, self._options)
        out = dead_letter_entries(self._ref, keys, entries)
        target = self._peers.get(dlq)
        if target is None:
            target = self._peers[dlq] = partition_peer(dlq, 0, self._config, self._coordinator)
        await target.once(HostActor.append, dlq, 0, encode_batch(AppendBatch("", 0, out)))
        log.info("%s: %d messages dead-lettered to %s", self._ref.name, len(keys), dlq)
