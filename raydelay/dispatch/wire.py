"""The column form in which a subscription hands messages to a consumer (pure).

One receive from one partition is one Arrow record batch of :data:`DELIVERY_SCHEMA`.
Its rows are taken out of the sources' columns with Arrow ``take`` (a copy in C++,
no Python object per message), or sliced when they are a run and then compacted (a
slice would carry its source's whole buffers over the wire). A receive's reply carries it
packed (:func:`pack_delivery`) up to 512 KiB: one Arrow IPC record-batch message, a
single buffer that Ray ships out of band (pickle protocol 5), read back on the consumer's
side without a copy; a larger one as the record batch itself, whose buffers Ray ships out
of band. Nothing is copied element by element on either side.
"""

from __future__ import annotations

import pyarrow as pa

from raydelay.dispatch.subscription import Delivery
from raydelay.log.entries import PROPERTIES_TYPE, compact, empty_batch, int64_array
from raydelay.positions import split_keys

DELIVERY_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("publish_time_ms", pa.int64()),
        ("deliver_at_ms", pa.int64()),  # -1 for an immediate message
        ("redelivery_count", pa.int64()),
        ("payload", pa.binary()),
        ("key", pa.string()),
        ("properties", PROPERTIES_TYPE),
    ]
)


def delivery_batch(deliveries: list[Delivery]) -> pa.RecordBatch:
    """The deliveries of one receive as one record batch, in order, holding no more
    buffer than its rows need."""
    parts = []
    for dv in deliveries:
        taken = dv.source.entries.at(dv.indexes).batch  # (a slice when they are a run)
        ledger_ids, entry_ids = split_keys(dv.keys)
        parts.append(
            pa.RecordBatch.from_arrays(
                [
                    int64_array(ledger_ids),
                    int64_array(entry_ids),
                    int64_array(dv.source.publish_times(dv.indexes)),
                    taken.column(1),
                    int64_array(dv.counts),
                    taken.column(0),
                    taken.column(2),
                    taken.column(3),
                ],
                schema=DELIVERY_SCHEMA,
            )
        )
    if not parts:
        return empty_delivery_batch()
    return compact(parts[0]) if len(parts) == 1 else pa.concat_batches(parts)


def empty_delivery_batch() -> pa.RecordBatch:
    return empty_batch(DELIVERY_SCHEMA)


# Batches up to this size go packed. A record batch pickled whole costs a reply of 200 to
# 3,000 rows 0.4-0.6 ms more here (its arrays and buffers are pickled one by one, and
# rebuilt on the consumer's side); at 10,000 rows of 100 B (1.1 MB) the copy that packing
# makes outweighs that (+0.17 ms, 4%), and Ray ships the batch's own buffers out of band.
PACK_MAX_BYTES = 512 * 1024


def pack_delivery(rb: pa.RecordBatch) -> pa.Buffer | pa.RecordBatch:
    """A delivery batch of up to PACK_MAX_BYTES as one Arrow IPC record-batch message,
    without its schema (both sides know :data:`DELIVERY_SCHEMA`): a single buffer, which
    Ray ships out of band. A larger batch, or one of another schema, goes as it is."""
    if rb.nbytes <= PACK_MAX_BYTES and rb.schema.equals(DELIVERY_SCHEMA):
        return rb.serialize()
    return rb


def unpack_delivery(got: pa.Buffer | pa.RecordBatch) -> pa.RecordBatch:
    """The record batch of what :func:`pack_delivery` made (a record batch: itself)."""
    if isinstance(got, pa.RecordBatch):
        return got
    return pa.ipc.read_record_batch(got, DELIVERY_SCHEMA)
