"""start_spark with RayDP: warm, it returns with its executors registered and their
Python workers attached to Ray; executors that cannot start fail the start (warm) or
the session's jobs (not warm) clearly; a stopped Spark can be started again at once."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
import ray

from raydelay.errors import InvalidArgument, Unavailable
from raydelay.ingest import ingest_dataframe, start_spark, stop_spark


def test_start_spark_checks_its_arguments_before_starting_anything(ray_cluster):
    with pytest.raises(InvalidArgument, match=r"^ready_timeout_s: expected a number > 0"):
        start_spark("raydp", ready_timeout_s=0)
    with pytest.raises(InvalidArgument, match=r"^warm: expected True or False"):
        start_spark("raydp", warm="yes")
    with pytest.raises(InvalidArgument, match=r"^executors: expected an int >= 1"):
        start_spark("raydp", executors=0)


def _attached(batches):
    """Whether this task's Python worker was attached to Ray before the task ran."""
    was = ray.is_initialized()
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "attached": [was]})


def test_a_warm_start_attaches_the_workers_and_a_start_without_executors_fails_clearly(
    cluster, topic_name
):
    # When Spark starts with warm=True
    spark = start_spark("raydp", executors=1, executor_memory="512m", warm=True)
    try:
        # Then its executor has registered, and its Python worker is attached to Ray
        assert spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() == 2  # + driver
        probe = spark.range(0, 1, 1, numPartitions=1).mapInArrow(
            _attached, "pid long, attached boolean"
        )
        assert [r.attached for r in probe.collect()] == [True]
    finally:
        stop_spark(spark)
    # When it asks for executors no node can place, warm
    too_big = {"executors": 1, "executor_cores": 64, "executor_memory": "512m"}
    with pytest.raises(Unavailable, match=r"^spark: 0 of 1 RayDP executors started within 2 s"):
        start_spark("raydp", ready_timeout_s=2, warm=True, **too_big)
    # and not warm: it returns, and an ingest fails once the timeout has passed
    spark = start_spark("raydp", ready_timeout_s=3, **too_big)
    try:
        cluster.create_topic(topic_name, partitions=1)
        df = spark.createDataFrame([("a",)], "body string")
        with pytest.raises(
            Unavailable, match=r": spark: 0 of 1 RayDP executors started within 3 s"
        ):
            ingest_dataframe(df, topic_name, payload_col="body", cluster=cluster, progress=False)
    finally:
        stop_spark(spark)
    assert sum(p["entries"] for p in cluster.stats(topic_name)["partitions"]) == 0
    # Then each was stopped again: a new one starts at once (its app master's name is free)
    spark = start_spark("raydp", executors=1, executor_memory="512m")
    try:
        assert spark.range(0, 10).count() == 10
    finally:
        stop_spark(spark)
