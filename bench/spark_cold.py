"""Where a cold ingest job's time goes (issue: Spark-on-Ray ingestion, the first job as fast
as the second). Prints one line per step.

Starts a local Ray and raydelay on a local-dir store, times ``start_spark("raydp")`` (2
executors of 1 core), then optionally (``STEPS=1``) a first job with no Python (the
executors' JVMs), a first and a second job with a Python worker that does nothing, and
(``WARM=1``) a job whose workers attach to raydelay (timed inside each worker). Then it
ingests ROWS rows (default 1M, as bench/ingest_bench.py writes them) twice: the first job
and the second. ``PLAIN_JVM=1`` starts the JVMs without raydelay's fast-start options
(``raydelay.ingest.spark._FAST_START``), for the comparison; ``JOPTS`` adds JVM options to
the driver's and executors' (and with ``AM=1`` RayDP's app master's).

``START_WARM=1`` starts Spark with ``start_spark(warm=True)``.

Usage: [ROWS=1000000] [STEPS=1] [WARM=1] [START_WARM=1] [PLAIN_JVM=1] [JOPTS=... [AM=1]]
       python bench/spark_cold.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import ray  # noqa: E402

import raydelay  # noqa: E402
import raydelay.ingest.spark as spark_setup  # noqa: E402
from bench.common import start_local_ray  # noqa: E402
from bench.ingest_bench import ingest_input, write_input  # noqa: E402
from raydelay.ingest import start_spark, stop_spark  # noqa: E402

ROWS = int(os.environ.get("ROWS", "1000000"))
WARM = os.environ.get("WARM", "0") == "1"


def probe(job_cfg, batches):
    t0 = time.perf_counter()
    import raydelay.ingest.job as J

    t1 = time.perf_counter()
    was = bool(J._CLUSTERS)
    cl = J._worker_cluster(job_cfg)
    t2 = time.perf_counter()
    p = cl.create_producer(job_cfg.topic, name=f"probe-{os.getpid()}-{time.time_ns()}")
    t3 = time.perf_counter()
    p.close()
    for _ in batches:  # (the input is not what is timed)
        pass
    yield pa.RecordBatch.from_pydict(
        {
            "pid": [os.getpid()],
            "import_s": [t1 - t0],
            "connect_s": [t2 - t1],
            "producer_s": [t3 - t2],
            "was": [was],
        }
    )


def main():
    tmp = Path(tempfile.mkdtemp(prefix="sprobe-"))
    write_input(tmp / "input", ROWS)
    start_local_ray()
    cluster = raydelay.connect(
        {"storage": {"kind": "local", "local": {"root": str(tmp / "store")}}}
    )
    conf = spark_setup.SPARK_CONFIG
    if os.environ.get("PLAIN_JVM") == "1":
        for k in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            conf[k] = conf[k].replace(spark_setup._FAST_START, "").strip()
        conf.pop("spark.ray.raydp_app_master.extraJavaOptions", None)
    extra = os.environ.get("JOPTS")
    if extra:
        for k in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            conf[k] = conf[k] + " " + extra
        if os.environ.get("AM") == "1":
            conf["spark.ray.raydp_app_master.extraJavaOptions"] = extra
    t = time.perf_counter()
    warm_start = os.environ.get("START_WARM") == "1"
    spark = start_spark(
        "raydp", executors=2, executor_cores=1, executor_memory="1g", warm=warm_start
    )
    print(f"start_spark {time.perf_counter() - t:.1f} s", flush=True)
    cluster.create_topic("probe", 2)
    if os.environ.get("STEPS") == "1":
        t = time.perf_counter()
        spark.range(0, 2, numPartitions=2).count()
        print(f"jvm-only job {time.perf_counter() - t:.1f} s", flush=True)

        def nothing(batches):
            for _ in batches:
                pass
            yield pa.RecordBatch.from_pydict(
                {"pid": [os.getpid()], "mods": [len(sys.modules)], "ray": ["ray" in sys.modules]}
            )

        for label in ("python-only job", "python-only job again"):
            t = time.perf_counter()
            out = (
                spark.range(0, 2, numPartitions=2)
                .mapInArrow(nothing, "pid long, mods long, ray boolean")
                .collect()
            )
            took = time.perf_counter() - t
            print(f"{label} {took:.1f} s {[r.asDict() for r in out]}", flush=True)
    if WARM:
        import functools

        from raydelay.config import config_to_dict
        from raydelay.ingest.job import _Job
        from raydelay.ingest.rows import RowSpec

        job = _Job(
            "probe",
            "probe",
            RowSpec("payload", None, None, None, ()),
            ray.get_runtime_context().gcs_address,
            config_to_dict(cluster.config),
            "x",
            None,
        )
        for i in range(2):
            t = time.perf_counter()
            out = (
                spark.range(0, 2, numPartitions=2)
                .mapInArrow(
                    functools.partial(probe, job),
                    "pid long, import_s double, connect_s double, producer_s double, was boolean",
                )
                .collect()
            )
            print(
                f"probe job {i} {time.perf_counter() - t:.1f} s: {[r.asDict() for r in out]}",
                flush=True,
            )
    for label in ("first", "second"):
        topic = f"t-{label}"
        cluster.create_topic(topic, 2)
        df = spark.read.parquet(str(tmp / "input"))
        t = time.perf_counter()
        rep = ingest_input(df, topic, cluster, ROWS, progress=False)
        wall = time.perf_counter() - t
        print(
            f"{label}: {rep.rows} rows, elapsed {rep.elapsed_s:.1f} s ({rep.rows / rep.elapsed_s:,.0f} rows/s), wall {wall:.1f} s, splits {rep.splits}",
            flush=True,
        )
    stop_spark(spark)
    cluster.shutdown()
    ray.shutdown()


main()
