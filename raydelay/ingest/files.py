"""Parquet inputs read by the workers themselves, not through Spark's rows.

When the DataFrame given to ``ingest_dataframe`` is a plain read of parquet files (all
their columns, or a selection of them; no filter, no computed column, no partition
columns from directory names), Spark does not need to move its rows at all. The driver
reads the files' footers and cuts them into *file splits* of whole row groups; the job
is then one Spark task per split, and each task's Python worker reads its row groups
with pyarrow and writes them as the row path does (:func:`raydelay.ingest.job._write_chunks`).

This skips what costs most in a Spark ingest on a small machine: the executors' JVMs
decoding parquet into rows and encoding the rows into Arrow again for Python (about a
fifth of a warm job's CPU here), and on a first job the JVM's warm-up of that code.

The rows a worker reads are cast to the Arrow types Spark would have given it
(``to_arrow_schema`` of the DataFrame's schema), so both paths see the same values: the
same timestamps in the same unit and zone, the same text. A DataFrame that does not
qualify, or a file whose columns cannot be cast so, takes the row path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from raydelay._extras import require

require("spark", "pyspark")

log = logging.getLogger(__name__)

# Spark's own split sizing (spark.sql.files.maxPartitionBytes and openCostInBytes): a split
# holds whole row groups, up to the smaller of the session's maximum and an even share of
# the input per core, but no less than this.
_MIN_SPLIT_BYTES = 4 * 1024 * 1024
_READ_OPTIONS = {"path", "paths", "mergeschema"}  # options that do not change the values


@dataclass(frozen=True)
class FileSplit:
    """Whole row groups of one file, in order."""

    path: str
    row_groups: tuple[int, ...]
    rows: int


@dataclass(frozen=True)
class ParquetScan:
    """The files behind a DataFrame that is a plain parquet read, cut into splits."""

    columns: tuple[str, ...]  # the DataFrame's columns, in its order
    schema: pa.Schema  # the Arrow types Spark gives these columns
    splits: tuple[FileSplit, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.splits)

    def read(self, split: int, rows: int) -> Iterator[pa.RecordBatch]:
        """Split ``split`` as record batches of at most ``rows`` rows, in Spark's types.
        The cut depends only on the file, so a retried task reads the same batches."""
        s = self.splits[split]
        with pq.ParquetFile(s.path) as f:
            batches = f.iter_batches(
                batch_size=rows, row_groups=list(s.row_groups), columns=list(self.columns)
            )
            for batch in batches:
                yield _cast(batch, self.schema)


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = [
        batch.column(field.name).cast(field.type, safe=False)
        if batch.schema.field(field.name).type != field.type
        else batch.column(field.name)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def parquet_scan(df: Any) -> ParquetScan | None:
    """The file splits of ``df`` when it is a plain read of local parquet files whose
    columns cast to Spark's types; None when it is anything else (it then takes the row
    path, which handles every DataFrame)."""
    try:
        files = _plain_parquet_files(df)
    except Exception as exc:  # noqa: BLE001 - a plan of another shape: the row path
        log.debug("ingest: not a plain parquet read (%s); rows go through Spark", exc)
        return None
    if not files:
        return None
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        schema = to_arrow_schema(df.schema)
    except Exception as exc:  # noqa: BLE001 - a type Arrow cannot carry: the row path
        log.debug("ingest: no Arrow schema for %s (%s)", df.schema, exc)
        return None
    splits = _splits(df, files, schema)
    if not splits:  # (no rows at all: Spark's own path has nothing to read either)
        return None
    return ParquetScan(columns=tuple(df.columns), schema=schema, splits=tuple(splits))


def _plain_parquet_files(df: Any) -> list[str]:
    """The local files of a plan that is a parquet relation under at most a projection
    of its own columns; [] for any other plan."""
    plan = df._jdf.queryExecution().optimizedPlan()
    if _kind(plan) == "Project":
        items = plan.projectList()
        if any(_kind(items.apply(i)) != "AttributeReference" for i in range(items.size())):
            return []
        plan = plan.child()
    if _kind(plan) != "LogicalRelation":
        return []
    relation = plan.relation()
    if _kind(relation) != "HadoopFsRelation" or _kind(relation.fileFormat()) != (
        "ParquetFileFormat"
    ):
        return []
    if relation.partitionSchema().length() != 0 or relation.bucketSpec().isDefined():
        return []
    jvm = df.sparkSession._jvm
    options = jvm.scala.collection.JavaConverters.mapAsJavaMap(relation.options())
    if any(str(key).lower() not in _READ_OPTIONS for key in options.keySet()):
        return []
    paths = []
    for uri in df.inputFiles():
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            return []  # a remote store: Spark's own file systems read it
        paths.append(unquote(parsed.path))
    return sorted(paths)


def _kind(obj: Any) -> str:
    return str(obj.getClass().getSimpleName())


def _splits(df: Any, files: list[str], schema: pa.Schema) -> list[FileSplit] | None:
    groups: list[tuple[str, int, int, int]] = []  # (path, row group, rows, bytes)
    for path in files:
        try:
            with pq.ParquetFile(path) as f:
                meta, file_schema = f.metadata, f.schema_arrow
        except (OSError, pa.ArrowException) as exc:
            log.debug("ingest: cannot read the footer of %s (%s)", path, exc)
            return None
        if not _castable(file_schema, schema):
            return None
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            groups.append((path, i, rg.num_rows, rg.total_byte_size))
    conf = df.sparkSession.conf
    max_bytes = _bytes(conf.get("spark.sql.files.maxPartitionBytes", "128m"))
    cores = max(1, df.sparkSession.sparkContext.defaultParallelism)
    total = sum(g[3] for g in groups)
    target = min(max_bytes, max(_MIN_SPLIT_BYTES, -(-total // cores)))
    splits: list[FileSplit] = []
    current: list[tuple[str, int, int, int]] = []
    for group in groups:
        size = sum(c[3] for c in current) + group[3]
        if current and (current[0][0] != group[0] or size > target):
            splits.append(_split(current))
            current = []
        current.append(group)
    if current:
        splits.append(_split(current))
    return [s for s in splits if s.rows > 0]


def _split(groups: list[tuple[str, int, int, int]]) -> FileSplit:
    return FileSplit(
        path=groups[0][0],
        row_groups=tuple(g[1] for g in groups),
        rows=sum(g[2] for g in groups),
    )


def _castable(file_schema: pa.Schema, schema: pa.Schema) -> bool:
    """Whether the file has every column, each of Spark's type of it or of one that casts
    to it without changing a value (a timestamp of another unit, which Spark reads to
    microseconds as well, or an integer that fits the wider type Spark reads it as)."""
    for field in schema:
        if file_schema.names.count(field.name) != 1:
            return False
        if not _same_values(file_schema.field(field.name).type, field.type):
            return False
    return True


def _same_values(have: pa.DataType, want: pa.DataType) -> bool:
    t = pa.types
    if have == want or (t.is_timestamp(have) and t.is_timestamp(want)):
        return True
    if t.is_integer(have) and t.is_decimal(want):
        return True
    if t.is_integer(have) and t.is_integer(want):
        return t.is_signed_integer(want) and (
            have.bit_width < want.bit_width
            or (have.bit_width == want.bit_width and t.is_signed_integer(have))
        )
    return False


def _bytes(text: str) -> int:
    """Spark's size text (``16m``, ``134217728``, ``1g``) in bytes."""
    t = str(text).strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)
