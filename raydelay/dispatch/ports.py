"""The small interfaces and value types a subscription's parts share (pure: no Ray).

What the driver hands a :class:`~raydelay.dispatch.subscription.Subscription` (a
:class:`Fetch`, a :class:`CursorWriter`...), what it gets back (:class:`Step`,
:class:`TailQuery`, :class:`Delivery`), and the helpers every part uses on position keys.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.base import DelayedDeliveryTracker
from raydelay.delayed.index import bitmap64_values
from raydelay.delayed.reader import SegmentLoad
from raydelay.dispatch.peek import PeekRange, SegmentRef
from raydelay.log.entries import Entries, Rows
from raydelay.positions import KEY_DTYPE


class Source(Protocol):
    """Where delivered rows come from: a ledger object read in order, or rows read at
    scattered positions (:class:`~raydelay.log.entries.Rows`)."""

    @property
    def entries(self) -> Entries: ...

    def publish_times(self, idx: np.ndarray) -> np.ndarray: ...


Group = tuple[Source, np.ndarray, np.ndarray]  # (source, row indexes in it, position keys)


class Tracker(DelayedDeliveryTracker, Protocol):
    """The delayed tracker as a subscription uses it: the fixed tracker API plus the
    column and recovery methods both trackers have."""

    def get_scheduled_keys(self, max_messages: int) -> np.ndarray: ...

    def persisted_through(self) -> int: ...

    def tracked_among(self, keys: BitMap64) -> BitMap64: ...

    def due_histogram(self, edges: np.ndarray) -> list[int]: ...


class Fetch(Protocol):
    """Reads the log at scattered positions (the host's point read): the rows of ``keys``
    it still has, sorted by position."""

    async def __call__(self, keys: np.ndarray) -> Rows: ...


class ReadSegments(Protocol):
    """Reads sealed segments not loaded (a peek): the rows of each, in their order."""

    async def __call__(self, refs: list[SegmentRef]) -> list[Rows]: ...


class ReadUnsealed(Protocol):
    """Asks the partition's host for the rows of its unsealed index a subscription has not
    taken (every row below position key ``below`` due at or before ``through`` it took),
    within ``q``'s range and key, in (deliver_at, position) order, after the row
    ``start`` = (deliver_at, position key) (None: from the first), at most ``page``."""

    async def __call__(
        self, below: int, through: int, q: PeekRange, start: tuple[int, int] | None, page: int
    ) -> Rows: ...


class LogTail(Protocol):
    """The log's tail as its host knows it now: the last position's key (None: empty)."""

    async def __call__(self) -> int | None: ...


class CursorWriter(Protocol):
    """Writes one cursor snapshot (:meth:`Cursor.encode` bytes) durably; returns once it is."""

    async def __call__(self, data: bytes) -> None: ...


class DeadLetterPublisher(Protocol):
    """Publishes messages to the dead-letter topic: their position keys and their rows
    (payload, key, properties) as read from the log; returns once they are durable."""

    async def __call__(self, keys: np.ndarray, entries: Entries) -> None: ...


@dataclass(frozen=True)
class TailQuery:
    """A due query of the host's unsealed index: rows below position key ``below`` due
    at or before ``through_ms`` were taken already; everything due by ``now_ms`` is wanted.
    Answer it with ``Subscription.take_unsealed`` (or ``Subscription.tail_failed``)."""

    below: int
    through_ms: int
    now_ms: int


@dataclass(frozen=True)
class Step:
    """What one ``Subscription.step`` leaves to its driver."""

    wake_at_ms: int | None  # step again by then (epoch ms); None: when something changes
    deliverable: bool  # something can be delivered: wake the waiting receive calls
    wants_read: bool  # the read-ahead has room: let the log reader read on
    expired: list[tuple[str, int]] = field(default_factory=list)  # (consumer, handed back)
    loads: list[SegmentLoad] = field(default_factory=list)  # then install() / load_failed()
    tail_query: TailQuery | None = None  # ask the host's unsealed index
    dead_letters: bool = False  # dead letters wait: call flush_dead_letters()
    persist: bool = False  # the cursor is due to be written: call persist()


@dataclass(frozen=True)
class Delivery:
    """Messages handed to a consumer from one source: their row indexes in it, their
    position keys, and how many times each was delivered before."""

    source: Source
    indexes: np.ndarray  # int64
    keys: np.ndarray  # int64 position keys
    counts: np.ndarray  # int64 redelivery counts

    def __len__(self) -> int:
        return len(self.keys)


def keys_of(keys: Iterable[int] | np.ndarray) -> np.ndarray:
    """Position keys as an int64 array (no copy when they are one already)."""
    if isinstance(keys, np.ndarray):
        return keys.astype(KEY_DTYPE, copy=False)
    return np.fromiter(keys, dtype=KEY_DTYPE)


def first_keys(bm: BitMap64, n: int) -> np.ndarray:
    """The ``n`` lowest keys of ``bm``."""
    if len(bm) <= n:
        return bitmap64_values(bm)
    return np.fromiter(itertools.islice(bm, n), dtype=KEY_DTYPE, count=n)
