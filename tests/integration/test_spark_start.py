"""start_spark with RayDP: it returns with its executors registered (and, asked to,
their Python workers attached to Ray); executors that cannot start fail it clearly, with
Spark stopped again; a stopped Spark can be started again at once."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
import ray

from raydelay.errors import InvalidArgument, Unavailable
from raydelay.ingest import start_spark, stop_spark


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


def test_start_spark_is_ready_when_it_returns_and_fails_clearly_when_it_cannot_be(ray_cluster):
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
    # When it asks for more executors than the Ray cluster can place
    with pytest.raises(Unavailable, match=r"of 64 RayDP executors started within 3 s"):
        start_spark("raydp", executors=64, executor_memory="512m", ready_timeout_s=3)
    # Then Spark was stopped again: a new one starts at once (its app master's name is free)
    spark = start_spark("raydp", executors=1, executor_memory="512m")
    try:
        assert spark.range(0, 10).count() == 10
    finally:
        stop_spark(spark)
