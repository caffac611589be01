"""Bulk ingestion through Spark-on-Ray (RayDP): rejects, routing, and exactly once under a
retried task or a rerun of the same job."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import zlib
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from unittest.mock import ANY

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from raydelay.errors import InvalidArgument, NotFound
from raydelay.ingest import ingest_dataframe, rows, start_spark, stop_spark
from raydelay.ingest.job import READ_BY_SPARK, READ_BY_WORKERS, chunk_rows
from tests.integration.helpers import now_ms, receive_all


@pytest.fixture(scope="module")
def spark(ray_cluster):
    session = start_spark("raydp", executors=2, executor_cores=1, executor_memory="768m")
    try:
        yield session
    finally:
        stop_spark(session)


def iso(ms: int, tz=UTC) -> str:
    return datetime.fromtimestamp(ms / 1000, tz).isoformat()


def test_good_rows_load_routed_by_key_and_bad_rows_go_to_the_reject_file(
    cluster, topic_name, spark, tmp_path
):
    # Given 300 good orders due in about a second, and one bad row of each kind
    cluster.create_topic(topic_name, partitions=3)
    base = now_ms() + 1_000
    good = [
        (f"order-{i}", f"timeout {i}", iso(base + i, timezone(timedelta(hours=i % 3))), "eu")
        for i in range(300)
    ]
    big = "x" * (cluster.config.topic.max_message_bytes + 1)
    bad = [
        ("bad-1", None, iso(base), "eu"),
        ("bad-2", big, iso(base), "eu"),
        ("bad-3", "naive", "2030-01-01T10:00:00", "eu"),
        ("bad-4", "garbage", "next tuesday", None),
        ("bad-5", "no time", None, "us"),
    ]
    df = spark.createDataFrame(
        good + bad, "order_id string, body string, due string, region string"
    )
    reject_path = str(tmp_path / "rejects")
    consumer = cluster.subscribe(topic_name, "s")
    # When it is ingested
    report = ingest_dataframe(
        df,
        topic_name,
        payload_col="body",
        deliver_at_col="due",
        key_col="order_id",
        property_cols=["region"],
        reject_path=reject_path,
        cluster=cluster,
        progress=False,
    )
    # Then the report counts both kinds
    assert (report.rows, report.accepted, report.rejected) == (305, 300, 5)
    assert report.reasons == {
        rows.PAYLOAD_MISSING: 1,
        rows.PAYLOAD_TOO_BIG: 1,
        rows.AT_NAIVE: 1,
        rows.AT_UNPARSEABLE: 1,
        rows.AT_MISSING: 1,
    }
    # and the reject file holds the original columns and the reason of each bad row
    rejects = pq.read_table(reject_path).to_pylist()
    assert sorted((r["order_id"], r["reject_reason"]) for r in rejects) == [
        ("bad-1", rows.PAYLOAD_MISSING),
        ("bad-2", rows.PAYLOAD_TOO_BIG),
        ("bad-3", rows.AT_NAIVE),
        ("bad-4", rows.AT_UNPARSEABLE),
        ("bad-5", rows.AT_MISSING),
    ]
    assert {r["due"] for r in rejects if r["order_id"] == "bad-4"} == {"next tuesday"}
    # and every good row is delivered once, on time, in its key's partition, with properties
    got = receive_all(consumer, 300, timeout_s=30)
    assert sorted(m.payload for m, _ in got) == sorted(g[1].encode() for g in good)
    due = {g[1].encode(): base + i for i, g in enumerate(good)}
    for m, received in got:
        assert m.deliver_at_ms == due[m.payload] <= received
        assert m.message_id.partition == zlib.crc32(m.key.encode()) % 3
        assert m.properties == {"region": "eu"}


@pytest.mark.parametrize("reader", [READ_BY_SPARK, READ_BY_WORKERS])
def test_a_task_failing_midway_is_retried_and_a_rerun_appends_nothing(
    cluster, topic_name, spark, tmp_path, reader
):
    # Given 90,000 rows in three input splits of 30,000 rows: Spark's rows, or three
    # parquet files the workers read themselves
    cluster.create_topic(topic_name, partitions=2)
    chunk = chunk_rows(cluster.config)
    assert 30_000 // chunk >= 3
    df = spark.range(0, 90_000, numPartitions=3).selectExpr(
        "cast(concat('m', cast(id as string)) as binary) as payload", "0.2 as delay_s"
    )
    if reader == READ_BY_WORKERS:
        (tmp_path / "input").mkdir()
        for f in range(3):
            pq.write_table(
                pa.table(
                    {
                        "payload": [b"m%d" % i for i in range(f * 30_000, (f + 1) * 30_000)],
                        "delay_s": pa.array([Decimal("0.2")] * 30_000, pa.decimal128(2, 1)),
                    }
                ),
                tmp_path / "input" / f"part-{f}.parquet",
            )
        df = spark.read.parquet(str(tmp_path / "input"))
    ingest = functools.partial(
        ingest_dataframe,
        df,
        topic_name,
        payload_col="payload",
        delay_col="delay_s",
        cluster=cluster,
        progress=False,
        ids_path=str(tmp_path / "ids"),
        id_col="payload",
    )
    # When the first attempt of split 1 fails after its second chunk was written
    report = ingest(_fail_after=(1, 1))
    # Then Spark's retry skipped the two chunks that had landed
    assert report.reader == reader and report.splits == 3
    assert (report.rows, report.accepted, report.rejected) == (90_000, 90_000, 0)
    assert report.already_written == 2 * chunk
    entries = sum(p["entries"] for p in cluster.stats(topic_name)["partitions"])
    assert entries == 90_000
    # When the same job runs again
    again = ingest(job_id=report.job_id)
    # Then everything was there already
    assert again.already_written == again.accepted == 90_000
    assert sum(p["entries"] for p in cluster.stats(topic_name)["partitions"]) == 90_000
    # and a subscription gets each row exactly once
    consumer = cluster.subscribe(topic_name, "s")
    got = receive_all(consumer, 90_000, timeout_s=60, max_messages=2_000)
    payloads = [m.payload for m, _ in got]
    assert len(payloads) == 90_000 and len(set(payloads)) == 90_000
    # and the ids written for cancels name each row's message exactly once
    ids = pq.read_table(tmp_path / "ids").to_pylist()
    assert len(ids) == 90_000
    assert {r["payload"]: r["message_id"] for r in ids} == {
        m.payload: str(m.message_id) for m, _ in got
    }
    assert not consumer.receive(max_messages=10, timeout_s=0.5)


def test_a_plain_parquet_read_is_read_by_the_workers_as_spark_reads_it(
    cluster, topic_name, spark, tmp_path
):
    # Given two parquet files of one schema whose due times are stored two ways (as
    # microseconds, and as the legacy INT96 that Spark reads as UTC), with bad rows
    base = now_ms() + 2_000
    (tmp_path / "input").mkdir()
    for f, legacy in ((0, False), (1, True)):
        ids = range(f * 100, (f + 1) * 100)
        table = pa.table(
            {
                "order_id": [f"order-{i}" for i in ids],
                "body": [None if i % 50 == 7 else b"body %d" % i for i in ids],
                "due": pa.array(
                    [None if i % 50 == 9 else (base + i) * 1000 + 1 for i in ids],
                    pa.timestamp("us", tz="UTC"),
                ),
                "region": [None if i % 3 else "eu" for i in ids],
            }
        )
        if legacy:
            table = table.set_column(2, "due", table.column("due").cast(pa.timestamp("ns")))
        path = tmp_path / "input" / f"part-{f}.parquet"
        pq.write_table(table, path, use_deprecated_int96_timestamps=legacy)
    results = {}
    for how, df in (
        (READ_BY_WORKERS, spark.read.parquet(str(tmp_path / "input"))),
        (READ_BY_SPARK, spark.read.parquet(str(tmp_path / "input")).repartition(2)),
    ):
        topic, rejects = f"{topic_name}-{len(results)}", tmp_path / f"rejects-{len(results)}"
        cluster.create_topic(topic, partitions=3)
        consumer = cluster.subscribe(topic, "s")
        # When the plain read, and the same read repartitioned (rows through Spark), load
        report = ingest_dataframe(
            df,
            topic,
            payload_col="body",
            deliver_at_col="due",
            key_col="order_id",
            property_cols=["region"],
            reject_path=str(rejects),
            cluster=cluster,
            progress=False,
        )
        assert report.reader == how
        got = {
            m.payload: (m.key, m.deliver_at_ms, m.properties, m.message_id.partition)
            for m, _ in receive_all(consumer, report.accepted, timeout_s=30)
        }
        results[how] = (report, got, sorted(pq.read_table(rejects).to_pylist(), key=str))
    # Then both read the same values: the same messages, the same rejects
    workers, by_spark = results[READ_BY_WORKERS], results[READ_BY_SPARK]
    assert (workers[0].rows, workers[0].accepted, workers[0].rejected) == (200, 192, 8)
    assert (
        workers[0].reasons
        == by_spark[0].reasons
        == {
            rows.PAYLOAD_MISSING: 4,
            rows.AT_MISSING: 4,
        }
    )
    assert workers[1] == by_spark[1]
    assert workers[1][b"body 6"] == ("order-6", base + 7, {"region": "eu"}, ANY)
    assert workers[1][b"body 5"][2] == {}  # (a null property is left out)
    assert workers[1][b"body 105"][1] == base + 106  # (INT96: the same instant)
    assert workers[2] == by_spark[2] and len(workers[2]) == 8


def test_a_worker_killed_mid_task_is_retried_and_every_row_lands_once(
    cluster, topic_name, spark, tmp_path
):
    # Given 200,000 rows in 4 parquet files, read by the workers
    cluster.create_topic(topic_name, partitions=2)
    (tmp_path / "input").mkdir()
    for f in range(4):
        ids = range(f * 50_000, (f + 1) * 50_000)
        pq.write_table(
            pa.table({"payload": [b"m%d" % i for i in ids], "delay_s": [0.5] * 50_000}),
            tmp_path / "input" / f"part-{f}.parquet",
        )
    df = spark.read.parquet(str(tmp_path / "input"))
    pid_file = tmp_path / "held.pid"

    def kill_the_held_worker() -> None:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # mid-task, a chunk written

    killer = threading.Thread(target=kill_the_held_worker)
    killer.start()
    # When split 1's worker is killed with SIGKILL after its second chunk landed
    report = ingest_dataframe(
        df,
        topic_name,
        payload_col="payload",
        delay_col="delay_s",
        cluster=cluster,
        progress=False,
        _hold_after=(1, 1, str(pid_file)),
    )
    killer.join()
    # Then Spark retried its task, which skipped the two chunks that had landed, and
    # every row landed exactly once
    chunk = chunk_rows(cluster.config)
    assert report.reader == READ_BY_WORKERS
    assert (report.rows, report.accepted, report.rejected) == (200_000, 200_000, 0)
    assert report.already_written == 2 * chunk
    assert sum(p["entries"] for p in cluster.stats(topic_name)["partitions"]) == 200_000
    consumer = cluster.subscribe(topic_name, "s")
    got = receive_all(consumer, 200_000, timeout_s=120, max_messages=5_000)
    assert len({m.payload for m, _ in got}) == len(got) == 200_000


def test_bad_arguments_fail_before_any_work(cluster, topic_name, spark, tmp_path):
    cluster.create_topic(topic_name, partitions=1)
    df = spark.createDataFrame([("a", 1, "k")], "body string, n int, k string")

    def ingest(**kw):
        args = {"payload_col": "body", "cluster": cluster, "progress": False, **kw}
        topic = args.pop("topic", topic_name)
        return ingest_dataframe(df, topic, **args)

    with pytest.raises(NotFound):
        ingest(topic="no-such-topic")
    with pytest.raises(InvalidArgument, match="'when' not in the input"):
        ingest(deliver_at_col="when")
    with pytest.raises(InvalidArgument, match="^payload_col: column 'n' is int"):
        ingest(payload_col="n")
    with pytest.raises(InvalidArgument, match="^deliver_at_col: give deliver_at_col or delay"):
        ingest(deliver_at_col="n", delay_col="n")
    (tmp_path / "rejects").mkdir()
    with pytest.raises(InvalidArgument, match="^reject_path: .* exists already"):
        ingest(reject_path=str(tmp_path / "rejects"))
    with pytest.raises(InvalidArgument, match="^job_id:"):
        ingest(job_id="no spaces please")
    with pytest.raises(InvalidArgument, match="^df: expected a pyspark DataFrame"):
        ingest_dataframe([("a",)], topic_name, payload_col="body", cluster=cluster)
    # nothing was written, and no job actor was left behind
    assert sum(p["entries"] for p in cluster.stats(topic_name)["partitions"]) == 0
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith("ingest/")]


def test_the_docs_ingestion_example_runs(ray_cluster, spark, tmp_path, monkeypatch):
    # the example of docs/ingest.md (the README's blocks and every docs page are searched)
    from tests.unit.test_readme import WHERE_BLOCKS

    blocks = [(w, b) for w, b in WHERE_BLOCKS if b.startswith("# needs: spark")]
    assert len(blocks) == 1
    where, code = blocks[0]
    import raydelay.ingest.spark

    # the module's Spark is the example's: RayDP runs one Spark session per driver
    monkeypatch.setattr(raydelay.ingest.spark, "start_spark", lambda *a, **k: spark)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "readme"})
    assert (tmp_path / "rejected.parquet").exists()
