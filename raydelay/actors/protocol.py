"""The replies of the partition calls that carry more than one value, as small frozen
dataclasses (one module, so both ends agree on the names). Ray pickles them whole.
Each names the call that answers with it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa


@dataclasses.dataclass(frozen=True)
class BucketList:
    """A partition's sealed buckets (``HostedPartition.buckets``)."""

    version: int  # changes with the list
    through: int  # every ledger up to this one is indexed (sealed or sealed empty)
    buckets: list[str]  # bucket keys, by ledger range


@dataclasses.dataclass(frozen=True)
class ReadReply:
    """A log read (``HostedPartition.read``)."""

    objects: list[Any]  # encoded ledger objects, or DelayedRun stand-ins
    tail: tuple[int, int] | None  # the last committed position
    ledgers: list[tuple[int, int | None]]  # (ledger id, entry count or None while open)
    version: int  # of the bucket list (BucketList.version)


@dataclasses.dataclass(frozen=True)
class ReceiveReply:
    """A receive at several partitions of one actor (``SubscriptionHost.receive_many``)."""

    got: list[tuple[int, pa.RecordBatch]]  # (partition, record batch) of those with messages
    failed: list[tuple[int, BaseException]]  # (partition, error) of those whose receive failed
    made_ms: int = 0  # when it was made (epoch ms): a consumer's ``returned`` stage starts here


@dataclasses.dataclass(frozen=True)
class DueReply:
    """A due query of the unsealed index (``HostedPartition.due_unsealed``)."""

    rows: pa.RecordBatch  # the due rows, with payloads (ROWS_SCHEMA)
    below: int  # the rows taken now include every due one below this position key
    next_d: int  # the earliest deliver_at still waiting there (-1: none)
    waiting: int  # rows still waiting there
    through: int  # the partition's sealed_through when it answered
    version: int  # of the bucket list then
    buckets: BucketList | None = None  # that list, when the caller knew another
