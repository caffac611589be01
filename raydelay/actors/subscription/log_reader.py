"""The log reader of one subscription partition: reads the partition's log at its host
ahead of delivery, and the fetch of payloads by position.

:class:`LogReader` runs as a task beside the driver. It reads ahead while the
``Subscription`` wants more (bounded by ``subscription.read_ahead_entries``), re-reads
loose positions first, and long-polls the host when caught up, 30 s at a time (a shared
subscription's poll is woken only by entries due within a lookahead); the next step
applies what it read. Big ledger objects come as references into Ray's object store, put
once by the host for every reader (``SharedObjects``), and are decoded in place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np
import ray

from raydelay.actors.host import HostActor
from raydelay.actors.protocol import ReadReply
from raydelay.actors.subscription.ref import RETRY_S, PartitionRef
from raydelay.actors.subscription.sealed_io import SealedIO
from raydelay.actors.subscription.shared_calls import SHARED
from raydelay.clock import now_ms
from raydelay.cluster import rpc
from raydelay.cluster.handles import Peer
from raydelay.dispatch.subscription import Subscription
from raydelay.log.entries import Rows, decode_object, note_arrival
from raydelay.positions import key_of

log = logging.getLogger(__name__)

# A log read that is caught up waits at its host this long for new entries (the host's
# cap: an idle partition costs a call per this long, per process reading it); a shared
# subscription's reads wait only for entries due within a lookahead plus this margin (for
# the call's own trips).
_LONG_POLL_S = 60.0
_POLL_MARGIN_MS = 250
_READ_CHUNK = 5_000
_READ_LINGER_S = 0.005


class LogReader:
    """Reads one partition's log for its subscription; ``wake`` (the driver's event) is
    set whenever it brought something for the next step to apply."""

    def __init__(
        self,
        ref: PartitionRef,
        sub: Subscription,
        host: Peer[HostActor],
        sealed_io: SealedIO,
        wake: asyncio.Event,
        count_log_bytes: Callable[[int], None],
    ) -> None:
        self._ref = ref
        self._sub = sub
        self._host = host
        self._sealed_io = sealed_io
        self._wake = wake
        self._count_log_bytes = count_log_bytes
        self._space = asyncio.Event()  # wakes the reader when read-ahead has room
        self.closed = False  # set by a planned stop: a read it ends is not retried

    def make_room(self) -> None:
        """Read-ahead may have room: look again."""
        self._space.set()

    async def tail_key(self) -> int | None:
        """The log's tail as the host knows it now (its position key; None: empty)."""
        tail = await self._host.once(HostActor.tail, self._ref.topic, self._ref.partition)
        return None if tail is None else key_of(*tail)

    async def read_rows(self, keys: np.ndarray) -> Rows:
        """The fetch given to the subscription: the host's rows at ``keys``."""
        batch = await self._host.once(
            HostActor.read_positions, self._ref.topic, self._ref.partition, keys.astype(np.int64)
        )
        self._count_log_bytes(int(batch.nbytes))
        rows = Rows.from_batch(batch)
        note_arrival([rows], now_ms())
        return rows

    async def run(self) -> None:
        """Read the log ahead while the subscription wants more; the next step applies it."""
        retries = rpc.Retries(log, f"{self._sub.name}: reading the log")
        while not self.closed:
            try:
                if not self._sub.wants_read():
                    self._space.clear()
                    await self._space.wait()
                    continue
                room = min(
                    self._sub.reading.read_ahead_entries - self._sub.ready_count(), _READ_CHUNK
                )
                if self._sub.reading.unread:
                    keys = np.asarray(self._sub.next_unread(room), dtype=np.int64)
                    self._sub.offer_reread(await self.read_rows(keys), keys)
                    retries.ok()
                    self._wake.set()
                    continue
                sealed = self._sub.sealed is not None
                # Wake only for entries due at once or within a lookahead (the host wakes
                # the read when one it passed over comes that close): a steady stream of
                # messages due later does not wake the reader at every commit.
                within = self._sub.lookahead_ms + _POLL_MARGIN_MS if sealed else None
                args = (
                    self._ref.topic,
                    self._ref.partition,
                    tuple(self._sub.reading.read_position),
                    room,
                    _LONG_POLL_S,
                    sealed,
                    within,
                )
                reply, objects, nbytes = await SHARED.call(("read", *args), self._read, args)
                note_arrival(objects, now_ms())
                retries.ok()
                self._count_log_bytes(nbytes)
                self._sub.offer_read(
                    objects,
                    reply.ledgers,
                    reply.tail,
                    buckets_changed=sealed and reply.version != self._sealed_io.version,
                )
                self._wake.set()
                if sum(obj.count for obj in objects) < _READ_CHUNK // 4:
                    # A trickle: let a few group commits gather before the next call.
                    await asyncio.sleep(_READ_LINGER_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported and retried
                if self.closed:
                    # a planned stop: the hosts may be stopping too, and nothing is retried
                    log.debug("%s: a log read ended by the close: %s", self._sub.name, exc)
                    return
                retries.failed(exc)
                await asyncio.sleep(RETRY_S)

    async def _read(self, args: tuple) -> tuple[ReadReply, list, int]:
        """One log read at the host (``args`` as :meth:`HostActor.read` takes them), its
        objects fetched and decoded: the reply, the objects, their bytes."""
        reply: ReadReply = await self._host.once(HostActor.read, *args)
        raw = await fetch_shared(reply.objects)
        nbytes = sum(len(b) for b in raw if isinstance(b, (bytes, np.ndarray)))
        objects = [decode_object(b) if isinstance(b, (bytes, np.ndarray)) else b for b in raw]
        return reply, objects, nbytes


async def fetch_shared(objects: list) -> list:
    """The objects of a log read, with the shared ones (references into Ray's object store,
    see ``SharedObjects``) fetched: read-only numpy views of the shared memory."""
    refs = [i for i, o in enumerate(objects) if isinstance(o, ray.ObjectRef)]
    if not refs:
        return objects
    got = await asyncio.gather(*(objects[i] for i in refs))
    out = list(objects)
    for i, value in zip(refs, got, strict=True):
        out[i] = value
    return out
