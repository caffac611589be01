"""Starting Spark for ingestion: Spark-on-Ray (RayDP) by default, or any Spark master.

- ``start_spark("raydp")`` starts Spark executors as Ray actors of the Ray this process
  is connected to (connect to raydelay first). They write straight to the partitions' hosts.
- ``start_spark("local[2]")`` (or ``spark://...``, ``yarn``, ...) uses a plain Spark; its
  Python workers attach to the Ray cluster by address.

Spark's JVM needs a few ``--add-opens`` on Java 17 for Arrow, and its Python workers must
run this interpreter (raydelay is installed in it)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from raydelay.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

RAYDP = "raydp"
FORMATS = ("parquet", "csv", "json")

_JAVA_OPTIONS = " ".join(
    [
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "--add-opens=java.base/java.util=ALL-UNNAMED",
        "-Dio.netty.tryReflectionSetAccessible=true",
    ]
)

# Every JVM of the Spark (the driver's, RayDP's app master, the executors) starts with the
# client compiler only and the serial collector: most of a cold start is class loading and
# compiling, and C2's compiler threads and a parallel collector's contend for the few cores
# of an executor. Measured (bench/results/2026-11-28-spark-cold.md): start_spark 15.6-16.9 s
# instead of 19.1-23.3 s, a first trivial job 6.9-7.1 s instead of 13.4 s, and a warm 1M-row
# ingest no slower (7.3-7.6 s against 7.9-8.3 s).
_FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

SPARK_CONFIG = {
    "spark.driver.extraJavaOptions": f"{_JAVA_OPTIONS} {_FAST_START}",
    "spark.executor.extraJavaOptions": f"{_JAVA_OPTIONS} {_FAST_START}",
    "spark.ray.raydp_app_master.extraJavaOptions": _FAST_START,  # (RayDP's own JVM)
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",  # one chunk = one append per partition
    # Input splits of about 16 MB: a few hundred thousand rows per task, several tasks per
    # executor, so a slow or retried task holds up little.
    "spark.sql.files.maxPartitionBytes": str(16 * 1024 * 1024),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",  # keeps each worker's Ray connection
    "spark.speculation": "false",  # two live attempts of one split would race on sequence ids
}


def start_spark(
    master: str = RAYDP,
    *,
    executors: int = 2,
    executor_cores: int = 1,
    executor_memory: str = "1g",
    app_name: str = "raydelay-ingest",
) -> Any:
    """A SparkSession for ingestion (see the module docstring for ``master``)."""
    if not isinstance(master, str) or not master:
        raise InvalidArgument(
            f"spark_master: expected 'raydp' or a Spark master URL, got {master!r}"
        )
    for name, value in (("executors", executors), ("executor_cores", executor_cores)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"{name}: expected an int >= 1, got {value!r}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise Unavailable(
            "java: not found; Spark needs a Java 17 runtime (`make java` installs it)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master == RAYDP:
        import ray
        import raydp

        if not ray.is_initialized():
            raise InvalidArgument("spark_master: RayDP needs Ray; connect to raydelay first")
        spark = raydp.init_spark(
            app_name,
            num_executors=executors,
            executor_cores=executor_cores,
            executor_memory=executor_memory,
            configs=dict(SPARK_CONFIG),
        )
    else:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(master).appName(app_name)
        for key, setting in SPARK_CONFIG.items():
            builder = builder.config(key, setting)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark(spark: Any, master: str = RAYDP) -> None:
    if master == RAYDP:
        import raydp

        raydp.stop_spark()
    else:
        spark.stop()


def format_of(path: str, fmt: str | None = None) -> str:
    """The input format: ``fmt`` when given, else from the path's extension."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise InvalidArgument(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        return fmt
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    for candidate in FORMATS:
        if f".{candidate}" in suffixes or (candidate == "json" and ".jsonl" in suffixes):
            return candidate
    if p.is_dir():  # a Spark output directory: look at its part files
        for child in sorted(p.iterdir()):
            for candidate in FORMATS:
                if child.name.startswith("part-") and f".{candidate}" in child.suffixes:
                    return candidate
    raise InvalidArgument(
        f"input: cannot tell the format of {path!r} from its name; pass --format "
        f"({', '.join(FORMATS)})"
    )


def read_input(spark: Any, path: str, fmt: str | None = None) -> Any:
    """A DataFrame of a parquet, CSV (with a header row) or JSON-lines input."""
    if "://" not in path:
        if not Path(path).exists():
            raise InvalidArgument(f"input: {path!r} does not exist")
        path = str(Path(path).resolve())  # Spark's JVM may run in another directory
    fmt = format_of(path, fmt)
    reader = spark.read
    try:
        if fmt == "csv":
            return reader.option("header", "true").csv(path)
        if fmt == "json":
            return reader.json(path)
        return reader.parquet(path)
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors carry a JVM trace
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidArgument(f"input: cannot read {path!r} as {fmt}: {first[:300]}") from exc
