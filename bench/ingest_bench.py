"""Bulk ingestion throughput (issue: Spark-on-Ray ingestion). Prints a table.

Writes a parquet input of N rows (default 1M): a key, a 100-byte payload and a deliver_at
uniform over the next hour, in 8 files of row groups of 50k rows. Starts a local Ray with
raydelay on a local-dir store (one topic, 2 partitions; ``--store s3``: S3 on SeaweedFS;
``--store local,s3``: both, each in a process of its own, one row each with the ratio) and
Spark on that Ray (RayDP, 2 executors of 1 core), then ingests the file three ways, each
into a fresh topic:

- **first job**: right after ``start_spark``; it includes each Spark Python worker
  starting and attaching to Ray, and the JVMs' first run of the job's code;
- **second job**: the same input again (a new job id), with workers attached already;
- **first job, warm=True**: Spark stopped and started again with ``start_spark(warm=True)``,
  which attaches the workers before it returns;
- **peer, driver send_many**: no Spark; the driver reads the parquet with pyarrow and calls
  ``Producer.send_many`` in batches of 10,000 (what a hand-written loader does), with the
  columns as Python lists or as the Arrow arrays themselves.

A plain parquet read like this one is read by the workers themselves (``input read as``
in the report; raydelay.ingest.files). Rows/s is rows over the ingest call's time until
every row is durable (the ingest returns only then). ``start_spark`` is timed apart.

Usage: python bench/ingest_bench.py [--rows 1000000] [--out bench/results/<date>-ingest.md]
       [--store local|s3|local,s3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

import raydelay  # noqa: E402
from bench.common import (  # noqa: E402
    add_store_args,
    bench_store,
    measure_stores,
    ratio,
    start_local_ray,
)
from raydelay.clock import now_ms  # noqa: E402
from raydelay.console import table  # noqa: E402
from raydelay.ingest import ingest_dataframe, start_spark, stop_spark  # noqa: E402

PARTITIONS = 2


def write_input(path: Path, rows: int) -> int:
    rng = np.random.default_rng(7)
    now = now_ms()
    path.mkdir(parents=True)
    files = 8
    per = -(-rows // files)
    size = 0
    for f in range(files):
        lo, hi = f * per, min(rows, (f + 1) * per)
        if lo >= hi:
            break
        n = hi - lo
        body = rng.integers(0, 256, (n, 100), dtype=np.uint8)
        payloads = pa.array([bytes(r) for r in body], pa.binary())  # incompressible
        t = pa.table(
            {
                "order_id": [f"order-{i:09d}" for i in range(lo, hi)],
                "payload": payloads,
                "deliver_at": pa.array(now + 600_000 + rng.integers(0, 3_600_000, n), pa.int64()),
            }
        )
        target = path / f"part-{f:05d}.parquet"
        pq.write_table(t, target, row_group_size=50_000)
        size += target.stat().st_size
    return size


def ingest_input(df, topic: str, cluster, rows: int, **options):
    """``ingest_dataframe`` of ``df``, the input :func:`write_input` wrote (its columns
    named), into ``topic``; ``options`` go to it as well."""
    return ingest_dataframe(
        df,
        topic,
        payload_col="payload",
        deliver_at_col="deliver_at",
        key_col="order_id",
        cluster=cluster,
        total_rows=rows,
        **options,
    )


def driver_send_many(cluster, topic: str, path: Path, arrow: bool = False) -> float:
    """A hand-written loader: pyarrow reads the files, ``send_many`` of 10,000 rows with
    keys; the columns as Python lists, or (``arrow``) as the Arrow arrays themselves."""
    producer = cluster.create_producer(topic)
    start = time.perf_counter()
    for file in sorted(path.glob("*.parquet")):
        for batch in pq.ParquetFile(file).iter_batches(batch_size=10_000):
            if arrow:
                producer.send_many(
                    batch.column("payload"),
                    deliver_at=batch.column("deliver_at"),
                    keys=batch.column("order_id"),
                )
            else:
                producer.send_many(
                    batch.column("payload").to_pylist(),
                    deliver_at=batch.column("deliver_at").to_pylist(),
                    keys=batch.column("order_id").to_pylist(),
                )
    elapsed = time.perf_counter() - start
    producer.close()
    return elapsed


def entries(cluster, topic: str) -> int:
    return sum(p["entries"] for p in cluster.stats(topic)["partitions"])


def measure(args, store: str) -> dict:
    """One store's figures: (path, seconds, input splits) rows and Spark's start-up time."""
    with tempfile.TemporaryDirectory(prefix="raydelay-ingest-bench-") as tmp:
        return _measure(args, store, Path(tmp))


def _measure(args, store: str, work: Path) -> dict:
    size = write_input(work / "input", args.rows)
    print(f"input: {args.rows:,} rows, {size / 1e6:,.0f} MB of parquet in 8 files", flush=True)
    with bench_store(store, work) as st:
        start_local_ray()
        cluster = raydelay.connect({"storage": st.config})
        results = []
        for warm in (False, True):
            t = time.perf_counter()
            spark = start_spark(
                "raydp", executors=2, executor_cores=1, executor_memory="1g", warm=warm
            )
            start_s = time.perf_counter() - t
            labels = ("first job", "second job") if not warm else ("first job, warm=True",)
            try:
                for label in labels:
                    topic = f"bench-{len(results)}"
                    cluster.create_topic(topic, PARTITIONS)
                    df = spark.read.parquet(str(work / "input"))
                    report = ingest_input(df, topic, cluster, args.rows)
                    assert report.accepted == args.rows == entries(cluster, topic), "rows lost"
                    start = round(start_s, 1) if label.startswith("first") else ""
                    first = round(report.first_rows_s or 0, 2)
                    what = f"Spark on Ray (RayDP), {label}"
                    results.append((what, report.elapsed_s, report.splits, start, first))
            finally:
                stop_spark(spark)
        for arrow in (False, True):
            topic = f"bench-driver-{arrow}"
            cluster.create_topic(topic, PARTITIONS)
            driver_s = driver_send_many(cluster, topic, work / "input", arrow=arrow)
            assert entries(cluster, topic) == args.rows
            kind = "Arrow arrays" if arrow else "Python lists"
            results.append((f"peer: driver send_many, {kind}", driver_s, 1, "", ""))
        cluster.shutdown()
        ray.shutdown()  # before the store goes
    return {"rows": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--out", default=None, help="write the table to this markdown file too")
    add_store_args(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    by_store = measure_stores(args, measure)
    if by_store is None:  # a child run for one store: its result is written
        return 0

    stores = list(by_store)
    local = {row[0]: row[1] for row in by_store.get("local", {}).get("rows", [])}
    rows = []
    for i, row in enumerate(by_store[stores[0]]["rows"]):
        what = row[0]
        for store in stores:
            _, secs, splits, start_s, first_s = by_store[store]["rows"][i]
            base = {r[0]: r[1] for r in by_store[store]["rows"]}
            lists = args.rows / base["peer: driver send_many, Python lists"]
            arrow = args.rows / base["peer: driver send_many, Arrow arrays"]
            rate = args.rows / secs
            rows.append(
                [
                    what,
                    store,
                    args.rows,
                    start_s,
                    round(secs, 2),
                    first_s,
                    round(rate),
                    f"{rate / lists:.2f}x",
                    f"{rate / arrow:.2f}x",
                    ratio(rate, args.rows / local[what])
                    if what in local and store != "local"
                    else "",
                    splits,
                ]
            )
    text = table(
        [
            "path",
            "store",
            "rows",
            "start_spark s",
            "job s",
            "first rows after s",
            "rows/s",
            "vs driver, lists",
            "vs driver, Arrow",
            "vs local",
            "input splits",
        ],
        rows,
    )
    first = {r[0]: r[1] for r in by_store[stores[0]]["rows"]}
    second = first["Spark on Ray (RayDP), second job"]
    notes = (
        f"first job against the second: "
        f"{second / first['Spark on Ray (RayDP), first job']:.2f}x "
        f"(after start_spark(warm=True): "
        f"{second / first['Spark on Ray (RayDP), first job, warm=True']:.2f}x). "
        f"start_spark is timed apart: its JVMs and RayDP's app master; the 2 executors "
        f"(1 core each) still start as it returns, except with warm=True, which waits for "
        f"them and attaches their Python workers to Ray (a second start in this process: "
        f"the driver's JVM is up already). "
        f"{PARTITIONS} partitions, 100-byte payloads, keyed, deliver_at over the next hour, "
        f"store: {' vs '.join(stores)} (s3: SeaweedFS on this machine), 2-core machine."
    )
    print(text)
    print(notes)
    if args.out:
        out = Path(args.out)
        out.write_text(
            f"# Ingestion benchmark, {dt.date.today()}\n\n`python bench/ingest_bench.py "
            f"--rows {args.rows} --store {','.join(stores)}`\n\n```text\n{text}\n```\n\n"
            f"{notes}\n"
        )
        print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
