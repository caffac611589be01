"""Reader: reads a topic in log order, with no subscription and no acknowledgements
(Pulsar's readers).

A reader keeps, per partition, the next position to read, and reads the partition's log
from its host a chunk of entries at a time, with at most one read outstanding per
partition (a read that finds nothing new waits at the host, up to the caller's timeout).
It ignores ``deliver_at``: a message due tomorrow is read now, where it sits in the log,
as Pulsar's readers do. Cancel markers are not messages and are skipped; a cancelled
message is still in the log and is read.

A reader sees the ledgers the topic still keeps: a ledger every subscription has
acknowledged is deleted (its delayed messages live on in sealed buckets, which a
subscription reads and a reader does not).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from raydelay.actors.host import HostActor
from raydelay.client.message import (
    Message,
    MessageId,
    check_number,
    load_arrow_conversions,
    messages_from_batch,
)
from raydelay.cluster import rpc
from raydelay.cluster.handles import Peer
from raydelay.dispatch.subscription import Delivery
from raydelay.dispatch.wire import delivery_batch
from raydelay.errors import InvalidArgument, StorageError, Unavailable
from raydelay.log.entries import NO_CANCEL, LedgerObject, decode_object
from raydelay.positions import Position, position_keys

log = logging.getLogger(__name__)

READ_ENTRIES = 5_000  # entries asked of a partition per read
_MAX_WAIT_S = 30.0  # the longest a read waits at a host for new entries
_RETRY_S = 0.25  # a partition whose read failed is asked again after this


class Reader:
    """A reader of every partition of a topic (``Cluster.create_reader``). ``peers``: the
    partitions on their hosts; ``starts``: each partition's first position to read;
    ``resolve(to, inclusive)``: partition -> first position to read, for :meth:`seek`; ``tails()``:
    each partition's last position (or None)."""

    def __init__(
        self,
        topic: str,
        peers: list[Peer[HostActor]],
        starts: dict[int, Position],
        *,
        resolve: Callable[[Any, bool], dict[int, Position]],
        tails: Callable[[], list[Position | None]],
    ) -> None:
        load_arrow_conversions()  # (not on the first message read: see there)
        self.topic = topic
        self.partitions = len(peers)
        self._peers = peers
        self._next: dict[int, Position] = dict(starts)
        self._resolve = resolve
        self._tails = tails
        self._buffer: deque[Message] = deque()
        self._inflight: dict[Any, tuple[int, int]] = {}  # read ref -> (partition, generation)
        self._down: dict[int, float] = {}  # partition -> when to ask it again (monotonic)
        self._generation = 0  # moves with every seek: reads sent before are dropped
        self._closed = False

    # --- reading ----------------------------------------------------------------------------

    def read_next(self, timeout_s: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout_s`` seconds for one (None: as long as
        it takes); None when none came in time."""
        got = self.read_batch(1, timeout_s)
        return got[0] if got else None

    def read_batch(self, max_messages: int = 1_000, timeout_s: float | None = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages in log order per partition, waiting up to
        ``timeout_s`` seconds for the first (None: as long as it takes); [] when none came
        in time."""
        self._check_open()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidArgument(f"max_messages: expected an int >= 1, got {max_messages!r}")
        wait = None if timeout_s is None else check_number("timeout_s", timeout_s)
        deadline = None if wait is None else time.monotonic() + wait
        while not self._buffer:
            left = _MAX_WAIT_S if deadline is None else deadline - time.monotonic()
            self._fill(max(0.0, min(left, _MAX_WAIT_S)))
            if deadline is not None and time.monotonic() >= deadline:
                break
        out: list[Message] = []
        while self._buffer and len(out) < max_messages:
            out.append(self._buffer.popleft())
        return out

    def unread(self, messages: list[Message]) -> None:
        """Put messages back before the next ones (an asyncio read that took them and was
        cancelled before it could hand them out)."""
        self._buffer.extendleft(reversed(messages))

    def has_message_available(self, timeout_s: float = 30.0) -> bool:
        """Whether a message is there to read now: the partitions' tails are asked, and
        what lies before them is read ahead into the reader (for up to ``timeout_s``
        seconds, should a partition be down)."""
        self._check_open()
        deadline = time.monotonic() + check_number("timeout_s", timeout_s)
        tails = self._tails()
        while not self._buffer and time.monotonic() < deadline:
            if not any(t is not None and self._next[p] <= tuple(t) for p, t in enumerate(tails)):
                break  # (read up to every tail: what was left were cancel markers)
            self._fill(0.0)
        return bool(self._buffer)

    def _fill(self, wait_s: float) -> None:
        """One round: a read outstanding at every partition that is not down (waiting up to
        ``wait_s`` at its host for new entries), then what answers within ``wait_s``."""
        now = time.monotonic()
        busy = {p for p, _ in self._inflight.values()}
        for p in range(self.partitions):
            if p in busy or self._down.get(p, 0.0) > now:
                continue
            try:
                ref = self._peers[p].submit(
                    HostActor.read, self.topic, p, self._next[p], READ_ENTRIES, wait_s
                )
            except Exception as exc:  # noqa: BLE001 - the partition is down; tried again
                self._failed(p, exc)
                continue
            self._inflight[ref] = (p, self._generation)
        if not self._inflight:  # every partition is down
            time.sleep(_RETRY_S if wait_s <= 0 else min(wait_s, _RETRY_S))
            return
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=wait_s + 5.0)
        if ready:  # and every other answer already there
            ready = ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0)[0]
        for ref in ready:
            p, generation = self._inflight.pop(ref)
            try:
                reply = rpc.get(ref, what=f"{self.topic}/{p}")
                objects = [
                    o if isinstance(o, LedgerObject) else decode_object(o)
                    for o in _fetched(reply.objects)
                ]
            except (Unavailable, StorageError) as exc:
                if isinstance(exc, StorageError) and not exc.retriable:
                    raise
                self._failed(p, exc)
                continue
            if generation == self._generation:
                self._take(p, objects)

    def _failed(self, p: int, exc: Exception) -> None:
        log.warning("reader of %s: partition %d: %s; asked again shortly", self.topic, p, exc)
        self._peers[p].lost()
        self._down[p] = time.monotonic() + _RETRY_S

    def _take(self, p: int, objects: list[LedgerObject]) -> None:
        """The messages of a read of partition ``p``, from its next position on."""
        ledger, entry = self._next[p]
        for obj in objects:
            if obj.ledger_id < ledger or (
                obj.ledger_id == ledger and obj.first_entry + obj.count <= entry
            ):
                continue
            start = max(0, entry - obj.first_entry) if obj.ledger_id == ledger else 0
            idx = np.arange(start, obj.count, dtype=np.int64)
            idx = idx[obj.entries.cancel_targets[idx] == NO_CANCEL]  # (markers are no messages)
            if len(idx):
                keys = position_keys(np.full(len(idx), obj.ledger_id), obj.first_entry + idx)
                counts = np.zeros(len(idx), dtype=np.int64)
                batch = delivery_batch([Delivery(obj, idx, keys, counts)])
                self._buffer.extend(messages_from_batch(self.topic, p, batch))
            ledger, entry = obj.ledger_id, obj.first_entry + obj.count
        self._next[p] = (ledger, entry)

    # --- moving -----------------------------------------------------------------------------

    def seek(self, to: Any, *, inclusive: bool = True) -> None:
        """Read from elsewhere: ``to`` is ``"earliest"``, ``"latest"``, a
        :class:`MessageId` (read from that message on, or from the one after it without
        ``inclusive``, on its partition; the others are left where they are) or a time
        (epoch ms or an aware datetime: on every partition, from the first entry
        published at or after it)."""
        self._check_open()
        if not isinstance(inclusive, bool):
            raise InvalidArgument(f"inclusive: expected True or False, got {inclusive!r}")
        moved = self._resolve(to, inclusive)
        self._generation += 1
        self._inflight.clear()
        self._buffer = deque(m for m in self._buffer if m.message_id.partition not in moved)
        self._next.update(moved)

    def last_message_ids(self) -> list[MessageId | None]:
        """The id of each partition's last entry (None: the partition is empty)."""
        self._check_open()
        return last_ids(self.topic, self._tails())

    def get_last_message_id(self) -> MessageId | None:
        """The id of the topic's last entry; a topic of one partition only (see
        :meth:`last_message_ids`)."""
        return only_id(self.topic, self.last_message_ids())

    def close(self) -> None:
        self._closed = True
        self._inflight.clear()
        self._buffer.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("reader: it was closed")

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def last_ids(topic: str, tails: list[Position | None]) -> list[MessageId | None]:
    """Each partition's last entry as a MessageId (None: empty), from its tail."""
    return [
        None if t is None else MessageId(topic, p, int(t[0]), int(t[1]))
        for p, t in enumerate(tails)
    ]


def only_id(topic: str, ids: list[MessageId | None]) -> MessageId | None:
    """The last id of a topic of one partition (Pulsar's ``get_last_message_id``)."""
    if len(ids) != 1:
        raise InvalidArgument(
            f"topic: {topic} has {len(ids)} partitions; last_message_ids() gives the last id "
            "of each"
        )
    return ids[0]


def _fetched(objects: list) -> list:
    """A read's objects, those shared through Ray's object store fetched."""
    refs = [i for i, o in enumerate(objects) if isinstance(o, ray.ObjectRef)]
    if not refs:
        return objects
    out = list(objects)
    got = rpc.get([objects[i] for i in refs], what="shared ledger objects")
    for i, value in zip(refs, got, strict=True):
        out[i] = value
    return out
