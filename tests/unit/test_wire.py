"""The packed form of a delivery batch (raydelay.dispatch.wire): one Arrow IPC record-batch
message that a receive's reply carries instead of the record batch pickled whole."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from raydelay.dispatch.wire import (
    DELIVERY_SCHEMA,
    PACK_MAX_BYTES,
    empty_delivery_batch,
    pack_delivery,
    unpack_delivery,
)


def _batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "ledger_id": [7] * n,
            "entry_id": list(range(n)),
            "publish_time_ms": [1_000 + i for i in range(n)],
            "deliver_at_ms": [-1 if i % 3 == 0 else 5_000 + i for i in range(n)],
            "redelivery_count": [i % 2 for i in range(n)],
            "payload": [b"p%d" % i if i % 4 else b"" for i in range(n)],
            "key": [None if i % 2 else f"k{i}" for i in range(n)],
            "properties": [None if i % 3 else [("a", f"b{i}"), ("c", None)] for i in range(n)],
        },
        schema=DELIVERY_SCHEMA,
    )


@pytest.mark.parametrize("n", [0, 1, 257])
def test_a_packed_delivery_unpacks_to_the_same_rows(n):
    rb = _batch(n)
    packed = pack_delivery(rb)
    assert isinstance(packed, pa.Buffer)
    # (as a reply carries it: pickled, its one buffer out of band)
    back = unpack_delivery(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert back.schema.equals(DELIVERY_SCHEMA)
    assert back.to_pylist() == rb.to_pylist()


def test_a_slice_packs_only_its_own_rows():
    rb = _batch(1_000)
    part = rb.slice(400, 10)
    packed = pack_delivery(part)
    assert unpack_delivery(packed).to_pylist() == part.to_pylist()
    assert packed.size < pack_delivery(rb).size / 20  # (not its source's whole buffers)


def test_a_batch_over_the_packed_size_goes_as_it_is():
    rb = _batch(2_000)
    big = rb.set_column(5, "payload", pa.array([b"x" * 300] * 2_000, pa.binary()))
    assert big.nbytes > PACK_MAX_BYTES >= rb.nbytes
    assert pack_delivery(big) is big
    assert unpack_delivery(pack_delivery(big)) is big
    assert isinstance(pack_delivery(rb), pa.Buffer)


def test_the_empty_batch_and_other_schemas_go_as_they_are():
    assert unpack_delivery(pack_delivery(empty_delivery_batch())).num_rows == 0
    other = pa.RecordBatch.from_pydict({"x": [1, 2]})
    assert pack_delivery(other) is other
    assert unpack_delivery(other) is other  # (a record batch from a host that did not pack)
