"""``ingest_dataframe``: load a Spark DataFrame into a topic, exactly once.

How one ingest job runs:

- Spark runs one task per input split, in the executors' Python workers. A worker
  attaches to the Ray cluster by address once, and keeps the connection while Spark
  reuses it. A split is read one of two ways:

  - a DataFrame that is a plain read of parquet files: the worker reads its split's row
    groups itself with pyarrow (:mod:`raydelay.ingest.files`; :func:`_write_file_split`);
  - any other DataFrame: Spark gives the worker the split's rows (``mapInArrow``;
    :func:`_write_split`).
- Each Arrow batch of a split (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, or
  a parquet batch of a chunk's rows, cut to ``topic.max_entries_per_ledger``) is one
  *chunk*. Its rows are validated and routed (:mod:`raydelay.ingest.rows`), and its good
  rows go to the topic as one append per partition it touches: never a call per row.
- **Exactly once.** Split ``s`` writes as the producer ``ingest-<job>-<s>``, and chunk
  ``c`` carries sequence id ``c + 1`` in every partition. A retried task (Spark retries
  failed tasks) asks each partition for the producer's last sequence id first and skips
  the chunks that landed; the partition's dedup covers the rest. Chunks are sent one at a
  time, so every id at or below a partition's last one has landed. Running the same
  ``job_id`` again after a failed run finishes the job without duplicates.
- Rejected rows come back out of ``mapInArrow`` with a ``reject_reason`` column; Spark
  writes them to ``reject_path`` as parquet, committing only when the job succeeds.
- A small Ray actor keeps the tally: per split, the live attempt's progress (for the
  progress line) and the final counts of the attempt that finished.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import ray
from ray.actor import ActorHandle

from raydelay.cluster.names import NAMESPACE
from raydelay.console import ProgressLine, table
from raydelay.errors import InvalidArgument, RaydelayError, Unavailable
from raydelay.ingest.files import ParquetScan, parquet_scan
from raydelay.ingest.rows import RowSpec, prepare
from raydelay.ingest.spark import not_started
from raydelay.ingest.tally import Tally
from raydelay.storage.keys import validate_name

log = logging.getLogger(__name__)

REJECT_REASON = "reject_reason"
READ_BY_WORKERS = "parquet, read by the workers"
READ_BY_SPARK = "Spark's rows"
SLOW_START_S = 2.0
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,48}$")


@dataclass
class IngestReport:
    """What one ingest job did. ``accepted`` rows are in the topic; ``already_written``
    of them were there before this attempt of their chunk (a retried task, or a rerun of
    the same job id) and were not appended again."""

    job_id: str
    topic: str
    rows: int
    accepted: int
    rejected: int
    already_written: int
    splits: int
    elapsed_s: float
    reasons: dict[str, int] = field(default_factory=dict)
    reject_path: str | None = None
    reader: str = ""  # READ_BY_WORKERS or READ_BY_SPARK
    first_rows_s: float | None = None  # from the job's start to its first rows written

    @property
    def slow_start(self) -> bool:
        """Whether the job spent much of its time before its first rows: Spark's tasks
        starting (on a first job, the executors' Python workers start and attach to
        Ray, and their JVMs warm up)."""
        f = self.first_rows_s
        return f is not None and f >= SLOW_START_S and f >= 0.25 * self.elapsed_s

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def table(self) -> str:
        rows: list[list[object]] = [
            ["job id", self.job_id],
            ["topic", self.topic],
            ["rows read", self.rows],
            ["accepted", self.accepted],
            ["  already written (not appended again)", self.already_written],
            ["rejected", self.rejected],
        ]
        rows += [[f"  {reason}", n] for reason, n in sorted(self.reasons.items())]
        rows += [
            ["rejected rows in", self.reject_path or "(not kept)"],
            ["input splits", self.splits],
            ["input read as", self.reader or "?"],
            ["elapsed s", round(self.elapsed_s, 2)],
            [
                "first rows after s",
                "-" if self.first_rows_s is None else round(self.first_rows_s, 2),
            ],
            ["rows/s", round(self.rows_per_s)],
        ]
        if self.slow_start:
            rows.append(
                [
                    "  (a slow start)",
                    "Spark's first tasks: executors' Python workers starting and "
                    "attaching to Ray; a second job in the same session starts at once",
                ]
            )
        return table(["ingest", ""], [[k, _text(v)] for k, v in rows])


def _text(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class _Job:
    """What every task of one job needs (pickled into the Spark closure)."""

    job_id: str
    topic: str
    spec: RowSpec
    address: str
    config: dict
    tally: str
    fail_after: tuple[int, int] | None  # test hook: (split, chunk) fails attempt 0 after it
    ids_path: str | None = None
    id_col: str | None = None
    # test hook: (split, chunk, path): attempt 0 writes its pid to path after that chunk,
    # then waits (for a test to kill it)
    hold_after: tuple[int, int, str] | None = None


def ingest_dataframe(
    df: Any,
    topic: str,
    *,
    payload_col: str,
    deliver_at_col: str | None = None,
    delay_col: str | None = None,
    key_col: str | None = None,
    property_cols: Sequence[str] = (),
    reject_path: str | None = None,
    ids_path: str | None = None,
    id_col: str | None = None,
    cluster: Any = None,
    job_id: str | None = None,
    progress: bool = True,
    total_rows: int | None = None,
    _fail_after: tuple[int, int] | None = None,
    _hold_after: tuple[int, int, str] | None = None,
) -> IngestReport:
    """Load the rows of a Spark DataFrame into ``topic`` (which must exist), one message
    per good row; see the module docstring for how.

    - ``payload_col``: binary or string. ``deliver_at_col``: an aware timestamp, epoch
      ms, or ISO-8601 text with an offset. ``delay_col``: seconds from ingestion. At most
      one of the two; with neither, messages are immediate.
    - ``key_col`` routes rows (one key stays in one partition); ``property_cols`` become
      the messages' properties (as text; nulls are left out).
    - ``reject_path``: where rejected rows go as parquet (with ``reject_reason``); it
      must not exist yet. None: rejected rows are only counted.
    - ``ids_path``: a local directory (it must not exist yet; executors must see it)
      that gets, per chunk, a parquet file of the accepted rows' ``id_col`` value (default
      ``key_col``) and ``message_id`` (``topic/partition/ledger:entry``), for cancels.
      Retried tasks and reruns complete it without duplicates.
    - ``cluster``: a connected :class:`raydelay.Cluster` (default: ``raydelay.connect()``).
    - ``job_id``: names the job; running the same job id again over the same input
      skips what the earlier run wrote. Default: a new id.
    - ``progress``: print a progress line and the final table to stderr.
    - ``total_rows``: the row count for the ETA; default: ``df.count()`` when
      ``progress`` is on.
    """
    from raydelay.client.connection import connect
    from raydelay.config import config_to_dict

    if not hasattr(df, "mapInArrow") or not hasattr(df, "schema"):
        raise InvalidArgument(f"df: expected a pyspark DataFrame, got {type(df).__name__}")
    validate_name("topic", topic)
    spec = RowSpec(payload_col, deliver_at_col, delay_col, key_col, tuple(property_cols))
    spec.check_columns(df.columns)
    _check_types(df.schema, spec)
    if REJECT_REASON in df.columns:
        raise InvalidArgument(f"df: has a column named {REJECT_REASON!r}; rename it first")
    if reject_path is not None:
        if not isinstance(reject_path, str) or not reject_path:
            raise InvalidArgument(f"reject_path: expected a path, got {reject_path!r}")
        if "://" not in reject_path:  # Spark's JVM may run in another directory
            reject_path = str(Path(reject_path).resolve())
            if Path(reject_path).exists():
                raise InvalidArgument(f"reject_path: {reject_path!r} exists already")
    if ids_path is not None:
        if not isinstance(ids_path, str) or not ids_path or "://" in ids_path:
            raise InvalidArgument(f"ids_path: expected a local directory, got {ids_path!r}")
        id_col = id_col if id_col is not None else key_col
        if id_col is None:
            raise InvalidArgument("id_col: ids_path needs id_col (or key_col) to name rows")
        if id_col not in df.columns:
            raise InvalidArgument(f"id_col: {id_col!r} not in the input")
        ids_path = str(Path(ids_path).resolve())
        if Path(ids_path).exists() and job_id is None:
            raise InvalidArgument(f"ids_path: {ids_path!r} exists already")
    if job_id is None:
        job_id = uuid.uuid4().hex[:12]
    elif not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise InvalidArgument(f"job_id: expected 1-48 letters, digits, '-' or '_', got {job_id!r}")
    if total_rows is not None and (
        isinstance(total_rows, bool) or not isinstance(total_rows, int) or total_rows < 0
    ):
        raise InvalidArgument(f"total_rows: expected an int >= 0, got {total_rows!r}")
    cluster = cluster if cluster is not None else connect()
    cluster._partitions(topic)  # NotFound for a missing topic, before any work

    tally_name = f"ingest/{job_id}"
    try:
        # no CPU: it only counts; no restarts: its counts live in its memory only
        actor = ray.remote(Tally).options(
            name=tally_name, namespace=NAMESPACE, num_cpus=0, max_restarts=0
        )
        tally = cast("ActorHandle[Tally]", actor.remote())  # Ray types it "| type[Tally]"
    except ValueError as exc:
        raise InvalidArgument(f"job_id: ingest job {job_id!r} is running already") from exc
    job = _Job(
        job_id=job_id,
        topic=topic,
        spec=spec,
        address=ray.get_runtime_context().gcs_address,
        config=config_to_dict(cluster.config),
        tally=tally_name,
        fail_after=_fail_after,
        hold_after=_hold_after,
        ids_path=ids_path,
        id_col=id_col,
    )
    try:
        return _run(df, job, tally, reject_path, progress, total_rows)
    finally:
        ray.kill(tally, no_restart=True)


def _run(df, job: _Job, tally, reject_path, progress: bool, total_rows) -> IngestReport:
    from pyspark.sql.types import StringType, StructField, StructType

    started = time.time()
    schema = StructType([*df.schema.fields, StructField(REJECT_REASON, StringType(), True)])
    scan = parquet_scan(df)
    if scan is not None:  # the workers read the files (raydelay.ingest.files)
        splits = len(scan.splits)
        tasks = df.sparkSession.range(0, splits, 1, numPartitions=splits)
        out = tasks.mapInArrow(functools.partial(_write_file_split, job, scan), schema)
        total_rows = scan.rows if total_rows is None else total_rows
    else:
        out = df.mapInArrow(functools.partial(_write_split, job), schema)
        if total_rows is None and progress:
            total_rows = df.count()
    line = ProgressLine(f"ingest {job.topic}", total_rows) if progress else None
    stop = threading.Event()
    watcher = None
    if line is not None:
        watcher = threading.Thread(target=_watch, args=(tally, line, stop), daemon=True)
        watcher.start()
    try:
        if reject_path is not None:
            out.write.mode("errorifexists").parquet(reject_path)
        else:
            out.write.format("noop").mode("overwrite").save()
    except Exception as exc:  # noqa: BLE001 - Spark's errors are long Java traces
        why = not_started(df.sparkSession)
        if why is not None:
            raise Unavailable(f"ingest job {job.job_id}: {why}") from exc
        raise RaydelayError(
            f"ingest job {job.job_id} failed: {_cause(exc)}. Rows written so far stay in "
            f"{job.topic}; run again with job_id={job.job_id!r} to finish without duplicates"
        ) from exc
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    elapsed = time.time() - started
    done, first_at = ray.get([tally.final.remote(), tally.first_rows_at.remote()])
    reasons: Counter = Counter()
    for totals in done.values():
        reasons.update(totals["reasons"])
    report = IngestReport(
        job_id=job.job_id,
        topic=job.topic,
        rows=sum(t["rows"] for t in done.values()),
        accepted=sum(t["accepted"] for t in done.values()),
        rejected=sum(t["rejected"] for t in done.values()),
        already_written=sum(t["already_written"] for t in done.values()),
        splits=len(done),
        elapsed_s=elapsed,
        reasons=dict(reasons),
        reject_path=reject_path,
        reader=READ_BY_WORKERS if scan is not None else READ_BY_SPARK,
        first_rows_s=None if first_at is None else max(0.0, first_at - started),
    )
    if line is not None:
        line.update(report.rows)
        line.finish()
        print(report.table(), file=line.out)
    return report


def _watch(tally, line: ProgressLine, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            snap = ray.get(tally.snapshot.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - the display must not break the job
            continue
        if snap["rows"]:
            line.update(snap["rows"], f"rejected {snap['rejected']:,}")
        else:  # a first job's tasks start slowly: say what it waits for
            line.update(0, "waiting for Spark's tasks to start (Python workers attaching to Ray)")


def _cause(exc: BaseException) -> str:
    """The most useful line of a Spark failure: the Python error of the failed task."""
    text = str(exc)
    for pattern in (
        r"(RaydelayError|InvalidArgument|NotFound|Unavailable|StorageError)[:(].*",
        r"RuntimeError: .*",
        r"\w+Exception: .*",
    ):
        m = re.search(pattern, text)
        if m:
            return m.group(0).strip()[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


def _check_types(schema: Any, spec: RowSpec) -> None:
    """Reject column types that cannot mean what they are used for, before any work."""
    from pyspark.sql import types as T

    kinds = {f.name: f.dataType for f in schema.fields}

    def check(col: str | None, allowed: tuple, what: str) -> None:
        if col is not None and not isinstance(kinds[col], allowed):
            raise InvalidArgument(f"{what}: column {col!r} is {kinds[col].simpleString()}")

    check(spec.payload_col, (T.BinaryType, T.StringType), "payload_col")
    check(
        spec.deliver_at_col,
        (T.TimestampType, T.TimestampNTZType, T.DateType, T.IntegralType, T.StringType),
        "deliver_at_col",
    )
    check(spec.delay_col, (T.NumericType, T.StringType), "delay_col")
    for col in [spec.key_col, *spec.property_cols]:
        check(col, (T.AtomicType,), "key_col" if col == spec.key_col else "property_cols")


# --- the executor side --------------------------------------------------------------------------

_CLUSTERS: dict[str, Any] = {}


def _worker_cluster(job: _Job) -> Any:
    """This worker process's raydelay client (Spark reuses Python workers across tasks)."""
    from raydelay.client.connection import connect

    cluster = _CLUSTERS.get(job.address)
    if cluster is None:
        cluster = _CLUSTERS[job.address] = connect(job.config, address=job.address)
    return cluster


def warm_workers(spark: Any, slots: int) -> None:
    """Start a Python worker on each of the executors' ``slots`` task slots, with the
    modules an ingest task imports loaded and the worker attached to Ray: what a first
    job would otherwise do before its first row. Spark keeps the workers for the next
    tasks (``spark.python.worker.reuse``). The job has an ingest's shape (``mapInArrow``
    into Spark's no-op writer), so the driver's planning and the executors' code for it
    are warm as well."""
    address = ray.get_runtime_context().gcs_address
    tasks = spark.range(0, slots, 1, numPartitions=slots)
    # (a barrier stage: it starts once every slot is there, so each runs one task)
    out = tasks.mapInArrow(functools.partial(_warm_worker, address), tasks.schema, barrier=True)
    out.write.format("noop").mode("overwrite").save()


def _warm_worker(address: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from raydelay.client.bootstrap import attach_ray

    for _ in batches:
        pass
    if not ray.is_initialized():
        attach_ray(address)
    yield from ()  # no rows, as an ingest with no rejects


def chunk_rows(config: Any) -> int:
    """Rows per chunk: an Arrow batch, cut to what one append may hold."""
    return min(10_000, config.topic.max_entries_per_ledger)


def _chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The split's batches cut into chunks of at most ``rows`` rows. The cut depends only
    on the input, so a retried task numbers its chunks as the first attempt did."""
    for batch in batches:
        for offset in range(0, batch.num_rows, rows):
            yield batch.slice(offset, rows)


def _id_file(job: _Job, split: int, chunk: int) -> Path | None:
    if job.ids_path is None:
        return None
    return Path(job.ids_path) / f"split-{split:05d}-chunk-{chunk:06d}.parquet"


def _write_ids(path: Path, job: _Job, batch, prepared, todo, ranges) -> None:
    """The chunk's accepted rows: their ``id_col`` value and message id, written to a
    temporary name and renamed, so a file that exists is whole."""
    import pyarrow.parquet as pq

    ids = batch.column(job.id_col).to_pylist()
    out_ids, out_mids = [], []
    routed = prepared.rows
    for (p, _, _), rs in zip(todo, ranges, strict=True):
        positions = [(lg, first + j) for lg, first, count in rs for j in range(count)]
        rows = routed[p]
        if len(positions) != len(rows):
            raise RaydelayError(
                f"partition {p} returned {len(positions)} positions for {len(rows)} rows"
            )
        out_ids += [ids[i] for i in rows]
        out_mids += [f"{job.topic}/{p}/{lg}:{e}" for lg, e in positions]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    pq.write_table(pa.table({job.id_col: out_ids, "message_id": out_mids}), tmp)
    tmp.rename(path)


def _hold(path: str) -> None:
    """The test hook ``hold_after``: say this worker's pid, then wait to be killed."""
    import os

    Path(path).write_text(str(os.getpid()))
    time.sleep(60)


def _task() -> tuple[int, int]:
    """This Spark task's split (its partition id) and attempt number."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RaydelayError("ingest: a split is written only inside a Spark task")
    return ctx.partitionId(), ctx.attemptNumber()


def _write_split(job: _Job, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The row path: the split's rows as Spark gives them to ``mapInArrow``."""
    split, attempt = _task()
    yield from _write_chunks(job, split, attempt, lambda rows: _chunks(batches, rows))


def _write_file_split(
    job: _Job, scan: ParquetScan, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The file path: the task's one input row is its split's number; the worker reads
    that split's row groups itself (:mod:`raydelay.ingest.files`)."""
    split, attempt = _task()
    named = [i for b in batches for i in b.column(0).to_pylist()]
    if named != [split]:
        raise RaydelayError(f"ingest: task {split} was given file splits {named}")
    yield from _write_chunks(
        job, split, attempt, lambda rows: _chunks(scan.read(split, rows), rows)
    )


def _write_chunks(
    job: _Job,
    split: int,
    attempt: int,
    chunks_of: Callable[[int], Iterator[pa.RecordBatch]],
) -> Iterator[pa.RecordBatch]:
    """Write one split, chunk by chunk (``chunks_of(rows)`` cuts it), exactly once (see
    the module docstring); yields its rejected rows with their reasons."""
    cluster = _worker_cluster(job)
    tally = ray.get_actor(job.tally, namespace=NAMESPACE)
    producer = cluster.create_producer(job.topic, name=f"ingest-{job.job_id}-{split}")
    last = producer.last_sequences  # what earlier attempts of this split got appended
    cfg = cluster.config
    totals = {"rows": 0, "accepted": 0, "rejected": 0, "already_written": 0}
    reasons: Counter = Counter()
    try:
        for chunk, batch in enumerate(chunks_of(chunk_rows(cfg))):
            prepared = prepare(
                batch,
                job.spec,
                now_ms=time.time_ns() // 1_000_000,
                max_delay_ms=cfg.delayed.max_delay_ms,
                max_bytes=cfg.topic.max_message_bytes,
                partitions=producer.partitions,
                keyless_partition=split + chunk,
            )
            seq = chunk + 1
            id_file = _id_file(job, split, chunk)
            if id_file is not None and not id_file.exists():
                # every partition's batch: the ones that landed already give their
                # positions back from the partition's dedup
                todo = [(p, seq, e) for p, e in prepared.by_partition.items()]
            else:
                todo = [(p, seq, e) for p, e in prepared.by_partition.items() if seq > last[p]]
            ranges = producer.append_sequenced(todo) if todo else []
            if id_file is not None and not id_file.exists():
                _write_ids(id_file, job, batch, prepared, todo, ranges)
            todo = [(p, q, e) for p, q, e in todo if q > last[p]]
            accepted = prepared.accepted
            totals["rows"] += batch.num_rows
            totals["accepted"] += accepted
            totals["rejected"] += len(prepared.rejected)
            totals["already_written"] += accepted - sum(len(e) for _, _, e in todo)
            reasons.update(prepared.reasons)
            tally.add.remote(split, attempt, batch.num_rows, accepted, len(prepared.rejected))
            if job.hold_after is not None and job.hold_after[:2] == (split, chunk) and not attempt:
                _hold(job.hold_after[2])
            if job.fail_after == (split, chunk) and attempt == 0:
                raise RuntimeError(f"injected failure after chunk {chunk} of split {split}")
            if len(prepared.rejected):
                rejected = batch.take(pa.array(prepared.rejected, type=pa.int64()))
                yield rejected.append_column(
                    REJECT_REASON, pa.array(prepared.reasons, type=pa.string())
                )
        ray.get(tally.finish.remote(split, {**totals, "reasons": dict(reasons)}))
    finally:
        producer.close()
