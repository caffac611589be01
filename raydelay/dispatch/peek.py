"""Peek: the next scheduled messages of one subscription on one partition, read without
changing anything (pure: no Ray, no store).

What a subscription will deliver later lives in several places, and a peek looks at all
of them (see :meth:`raydelay.dispatch.subscription.Subscription.peek`):

- rows held in memory with their payloads: the rows taken from the topic's unsealed
  index ahead of their due instant, the loaded groups of the sealed buckets, and the due
  rows staged for the next receive;
- the segments of the sealed buckets not loaded yet (:class:`SegmentRef`), read from the
  store in deliver_at order and only as far as the answer needs: a segment whose earliest
  deliver_at comes after the ``limit``-th row found so far cannot hold a row of the
  answer, so a backlog of 100M messages is paged through, never loaded;
- the rows of the topic's unsealed index this subscription has not taken yet (asked of
  the partition's host);
- positions without payloads: the subscription's own delayed nacks and the redelivery
  set (due, waiting for a consumer); their payloads are read from the log.

A row goes out of the answer when the subscription acknowledged it (or a cancel did),
when a consumer holds it, or when it waits for the dead-letter topic. The answer is
sorted by (deliver_at, position): the order the subscription delivers in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydelay.limits import NO_LIMIT
from raydelay.log.entries import Entries, Rows


@dataclass(frozen=True)
class PeekRange:
    """What a peek asks for: at most ``limit`` rows (-1: all), whose deliver_at is at or
    after ``due_after`` and before ``due_before`` (epoch ms; None: open), of the message
    key ``key`` (None: any)."""

    limit: int = 100
    due_after: int | None = None
    due_before: int | None = None
    key: str | None = None

    def admits_span(self, min_d: int, max_d: int) -> bool:
        """Whether rows due between ``min_d`` and ``max_d`` may fall in the range."""
        if self.due_after is not None and max_d < self.due_after:
            return False
        return self.due_before is None or min_d < self.due_before

    def mask(self, rows: Rows) -> np.ndarray:
        """Which of ``rows`` the range and the key admit."""
        d = rows.entries.deliver_at_ms
        keep = np.ones(len(rows), dtype=bool)
        if self.due_after is not None:
            keep &= d >= self.due_after
        if self.due_before is not None:
            keep &= d < self.due_before
        if self.key is not None and len(rows):
            col = rows.entries.batch.column(2)
            hit = pc.fill_null(pc.equal(col, pa.scalar(self.key, pa.string())), False)
            keep &= hit.to_numpy(zero_copy_only=False)
        return keep

    def bar(self, found: Rows) -> int | None:
        """The deliver_at a row must not exceed to enter an answer that holds ``found``
        (sorted, at most ``limit``): the last one's when the answer is full, else None
        (any row may)."""
        if self.limit == NO_LIMIT or len(found) < self.limit:
            return None
        return int(found.entries.deliver_at_ms[-1])


class SegmentRef(NamedTuple):
    """A sealed segment not loaded: where it is (bytes ``offset`` .. ``offset + length``
    of the ``data`` object of bucket run ``run_key``), its deliver_at span, and the rows
    of it the subscription took from the topic's unsealed index already (position below
    ``taken_below`` and due at or before ``taken_through``), which are not in its future."""

    min_d: int
    max_d: int
    run_key: str
    offset: int
    length: int
    taken_below: int
    taken_through: int

    def untaken(self, rows: Rows) -> np.ndarray:
        """Which of the segment's ``rows`` were not taken already."""
        d = rows.entries.deliver_at_ms
        return ~((rows.positions < self.taken_below) & (d <= self.taken_through))


def first_rows(parts: list[Rows], limit: int) -> Rows:
    """The rows of ``parts`` in (deliver_at, position) order, each position once, the
    first ``limit`` of them (-1: all)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Rows.join([])
    rows = Rows.join(parts)
    d, keys = rows.entries.deliver_at_ms, rows.positions
    order = np.lexsort((keys, d))
    # each position once: where it is held twice (a nack moved its deliver_at, or a row
    # is both in a loaded group and staged) the earlier copy counts
    _, first = np.unique(keys[order], return_index=True)
    if len(first) != len(order):
        order = order[np.sort(first)]
    if limit != NO_LIMIT:
        order = order[:limit]
    return rows.take(order)


def with_deliver_at(rows: Rows, d: np.ndarray) -> Rows:
    """``rows`` with their deliver_at replaced by ``d`` (when a nack moved it)."""
    batch = rows.entries.batch
    col = pa.array(np.asarray(d, dtype=np.int64), type=pa.int64())
    entries = Entries(batch.set_column(1, batch.schema.field(1), col))
    return Rows(rows.positions, rows.publish_time_ms, entries)


def page_of(rows: Rows, q: PeekRange, start: tuple[int, int] | None, page: int) -> Rows:
    """The rows of ``rows`` in ``q``'s range and key, in (deliver_at, position) order,
    after the row ``start`` = (deliver_at, position key) (None: from the first), at most
    ``page`` of them."""
    keep = q.mask(rows)
    if start is not None:
        d, keys = rows.entries.deliver_at_ms, rows.positions
        keep &= (d > start[0]) | ((d == start[0]) & (keys > start[1]))
    return first_rows([rows.take(np.flatnonzero(keep))], page)
