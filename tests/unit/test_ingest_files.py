"""Parquet file splits read by the workers (raydelay.ingest.files): which file types read
as Spark's types, the batches a split gives, and Spark's size text."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydelay.ingest import files as F


@pytest.mark.parametrize(
    ("have", "want", "same"),
    [
        (pa.string(), pa.string(), True),
        (pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC"), True),
        (pa.timestamp("ns"), pa.timestamp("us", tz="UTC"), True),  # INT96, read as UTC
        (pa.int32(), pa.int64(), True),
        (pa.uint32(), pa.int64(), True),
        (pa.uint64(), pa.decimal128(20, 0), True),
        (pa.int64(), pa.int32(), False),  # would not fit
        (pa.uint64(), pa.int64(), False),
        (pa.string(), pa.binary(), False),  # Spark's type differs: the row path decides
        (pa.float32(), pa.float64(), False),
    ],
)
def test_a_file_column_reads_by_the_workers_only_when_its_values_stay_the_same(have, want, same):
    assert F._same_values(have, want) is same


def test_a_file_lacking_a_column_or_holding_it_twice_is_not_castable():
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert F._castable(pa.schema([("b", pa.string()), ("a", pa.int32())]), schema)
    assert not F._castable(pa.schema([("a", pa.int64())]), schema)
    assert not F._castable(pa.schema([("a", pa.int64()), ("b", pa.int64())]), schema)


def test_a_split_reads_its_row_groups_in_chunks_in_spark_types(tmp_path):
    # Given a file of three row groups of 10 rows, with millisecond timestamps
    path = tmp_path / "part-0.parquet"
    table = pa.table(
        {
            "k": [f"k{i}" for i in range(30)],
            "at": pa.array(list(range(30)), pa.timestamp("ms", tz="UTC")),
        }
    )
    pq.write_table(table, path, row_group_size=10)
    schema = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("k", pa.string())])
    scan = F.ParquetScan(
        columns=("at", "k"),
        schema=schema,
        splits=(F.FileSplit(str(path), (1, 2), 20),),
    )
    # When split 0 is read in chunks of 8 rows
    batches = list(scan.read(0, 8))
    # Then it holds the second and third row groups, in Spark's types and column order
    assert all(b.schema == schema for b in batches)
    assert [b.num_rows for b in batches] == [8, 8, 4]
    assert pa.Table.from_batches(batches).column("k").to_pylist() == [
        f"k{i}" for i in range(10, 30)
    ]
    assert batches[0].column("at")[0].value == 10_000  # 10 ms in microseconds
    assert scan.rows == 20


@pytest.mark.parametrize(
    ("text", "n"), [("16m", 16 << 20), ("134217728", 134217728), ("1g", 1 << 30), ("4MB", 4 << 20)]
)
def test_spark_size_text_reads_as_bytes(text, n):
    assert F._bytes(text) == n
