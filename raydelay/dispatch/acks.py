"""One acknowledgement, through every part that may hold the positions (pure: no Ray).

An ack takes a position out of what its consumer holds, out of the redelivery and
dead-letter sets and their counts, out of the key_shared pool, and into the cursor.
Cancels, dead letters and positions gone from the log are acknowledged the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import cast

import numpy as np

from raydelay.delayed.index import bitmap64_of
from raydelay.dispatch.consumers import ConsumerTable
from raydelay.dispatch.keypool import KeyPool
from raydelay.dispatch.marks import CursorMarks
from raydelay.dispatch.ports import LogTail, keys_of
from raydelay.dispatch.reading import LogReading
from raydelay.dispatch.redelivery import Redelivery
from raydelay.errors import InvalidArgument, Unavailable
from raydelay.positions import key_text

log = logging.getLogger(__name__)

# How long an ack past what a subscription has read waits for the log's tail (then it
# fails as Unavailable, and the consumer's client sends it again)
ACK_TAIL_TIMEOUT_S = 2.0


class Acks:
    """Acknowledges positions everywhere at once, and counts them."""

    def __init__(
        self,
        *,
        name: str,
        consumers: ConsumerTable,
        redelivery: Redelivery,
        marks: CursorMarks,
        counters: dict[str, int],
    ) -> None:
        self.name = name
        self._consumers = consumers
        self._redelivery = redelivery
        self._marks = marks
        self._counters = counters
        self.reading: LogReading | None = None  # wired after it (the end of the log)
        self.key_pool: KeyPool | None = None  # key_shared only, wired after it

    def past_end(self, keys: np.ndarray) -> bool:
        """Whether a position of ``keys`` lies past the last one this subscription knows to
        exist. That end is only what it has seen so far: a consumer may ack what an earlier
        life of it delivered before this one has read that far, so its owner learns the
        log's tail before an ack that this answers True for (see :meth:`ack`)."""
        end = self.reading.end_key if self.reading is not None else None
        return end is not None and len(keys) > 0 and int(keys.max()) > end

    def ack(self, keys: Iterable[int] | np.ndarray) -> int:
        """A consumer's ack of positions (int64 keys); returns how many were newly
        acknowledged. A position past the end of the log (as far as this subscription
        knows it: see :meth:`past_end`) is an InvalidArgument, and nothing is acked."""
        ks = keys_of(keys)
        if self.past_end(ks):
            end = cast(LogReading, self.reading).end_key
            bad = ks[ks > end][:3]
            shown = ", ".join(key_text(int(k)) for k in bad)
            last = key_text(end)
            raise InvalidArgument(
                f"messages: {shown} past the end of {self.name} (its last entry is {last}): "
                "no such message"
            )
        return self.ack_keys(ks)

    async def ack_learning_tail(self, keys: Iterable[int] | np.ndarray, log_tail: LogTail) -> int:
        """:meth:`ack`, but a position past the end this subscription knows first has the
        log's tail asked for (``log_tail()``: its key, None for an empty log), for at most
        ``ACK_TAIL_TIMEOUT_S`` (else Unavailable: the client sends the ack again). A
        consumer may ack what an earlier life of this subscription delivered before this
        one has read that far (or when only the host's index has answered it yet): that
        ack names a message, and is not refused."""
        ks = keys_of(keys)
        if self.past_end(ks):
            reading = cast(LogReading, self.reading)
            known = reading.end_key
            try:  # (bounded: an ack must not wait on a host that does not answer)
                tail = await asyncio.wait_for(log_tail(), ACK_TAIL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - any failure: the ack is tried again
                raise Unavailable(
                    f"{self.name}: an ack names {key_text(int(ks.max()))}, past what this "
                    f"subscription has read, and the log's tail cannot be asked now "
                    f"({type(exc).__name__}: {exc}); the ack is kept and sent again"
                ) from None
            if tail is not None:
                reading.see_end(tail)
            log.info(
                "%s: an ack names %s, past %s read so far; the log's tail is %s",
                self.name,
                key_text(int(ks.max())),
                key_text(known),
                key_text(tail),
            )
        return self.ack(ks)

    def ack_keys(self, ks: np.ndarray) -> int:
        """Acknowledge ``ks`` everywhere; returns how many the cursor had not."""
        if len(ks) == 0:
            return 0
        bm = bitmap64_of(ks)
        self._consumers.release(bm)
        self._redelivery.forget(bm)
        if self.key_pool is not None:
            self.key_pool.forget(ks)
        added = self._marks.ack(ks, bm)
        self._counters["acked"] += added
        return added

    def dead_lettered(self, keys: Iterable[int] | np.ndarray) -> int:
        """These were published to the dead-letter topic: ack them."""
        ks = keys_of(keys)
        self._counters["dead_lettered_since_start"] += len(ks)
        self._marks.cursor.dead_lettered += len(ks)  # (counted in the cursor: it persists)
        return self.ack_keys(ks)
