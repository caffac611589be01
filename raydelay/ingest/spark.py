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
import threading
import time
from pathlib import Path
from typing import Any

from raydelay._extras import require
from raydelay.errors import InvalidArgument, Unavailable

require("spark", "pyspark")

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
    ready_timeout_s: float = 120.0,
    warm: bool = False,
) -> Any:
    """A SparkSession for ingestion (see the module docstring for ``master``).

    With RayDP it returns while the executors still start; if none has started after
    ``ready_timeout_s`` (the Ray cluster lacks the CPUs or memory they ask for), the
    session's jobs are cancelled and an ingest raises ``Unavailable`` saying so.
    ``warm`` waits for the executors and starts each one's Python worker, with what an
    ingest task imports loaded and attached to Ray, so that the first job starts as
    quickly as the next. It is off by default: measured (docs/ingest.md), the warming
    job costs more than it saves the first job, so it pays where a first job's latency
    matters more than the total (a long-lived session that ingests on demand)."""
    if not isinstance(master, str) or not master:
        raise InvalidArgument(
            f"spark_master: expected 'raydp' or a Spark master URL, got {master!r}"
        )
    if not isinstance(warm, bool):
        raise InvalidArgument(f"warm: expected True or False, got {warm!r}")
    for name, value in (("executors", executors), ("executor_cores", executor_cores)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"{name}: expected an int >= 1, got {value!r}")
    if (
        isinstance(ready_timeout_s, bool)
        or not isinstance(ready_timeout_s, int | float)
        or not ready_timeout_s > 0
    ):
        raise InvalidArgument(f"ready_timeout_s: expected a number > 0, got {ready_timeout_s!r}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise Unavailable(
            "java: not found; Spark needs a Java 17 runtime (`make java` installs it)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master == RAYDP:
        require("spark", "raydp")
        return _start_raydp(
            app_name, executors, executor_cores, executor_memory, ready_timeout_s, warm
        )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, setting in SPARK_CONFIG.items():
        builder = builder.config(key, setting)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _start_raydp(
    app_name: str, executors: int, cores: int, memory: str, ready_timeout_s: float, warm: bool
) -> Any:
    """RayDP's start, with its serial steps overlapped where they do not depend on each
    other (measured in docs/ingest.md, "A cold start"):

    - the driver's JVM is launched while RayDP's app master starts (it needs the app
      master's URL only later, when the SparkContext is made);
    - the driver does not attach its own JVM to Ray (RayDP's ``fault_tolerant_mode``,
      for Spark-to-Ray-dataset conversion, which ingestion does not use);
    - it returns while the executors (Ray actors, a JVM each) still start: a first job
      plans meanwhile. Waiting for them here cost a first job's planning, 3 s here.

    A watchdog (:class:`_Executors`) fails the session's jobs, clearly, when no executor
    has started after ``ready_timeout_s``."""
    import ray
    import raydp

    if not ray.is_initialized():
        raise InvalidArgument("spark_master: RayDP needs Ray; connect to raydelay first")
    configs = dict(SPARK_CONFIG)
    launch = _DriverLaunch.begin(configs, executors, cores, memory)
    try:
        spark = raydp.init_spark(
            app_name,
            num_executors=executors,
            executor_cores=cores,
            executor_memory=memory,
            fault_tolerant_mode=False,
            configs=configs,
        )
    finally:
        launch.join()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        _Executors.watch(spark, executors, cores, ready_timeout_s)
        if warm:
            from raydelay.ingest.job import warm_workers

            _wait_for_executors(spark, executors, cores, ready_timeout_s)
            warm_workers(spark, executors * cores)
    except BaseException:
        stop_spark(spark)
        raise
    return spark


class _Executors:
    """Watches a RayDP session's executors start. When none has registered after the
    timeout, Spark would wait for them forever (and a job with it): the watchdog cancels
    the session's jobs instead and keeps the reason, which :func:`not_started` gives
    (an ingest raises it as Unavailable). Fewer than asked for is only logged: jobs run
    on those that started."""

    _why: dict[int, str] = {}  # id of the SparkContext -> why its jobs were cancelled

    @classmethod
    def watch(cls, spark: Any, executors: int, cores: int, timeout_s: float) -> None:
        sc = spark.sparkContext
        status = sc._jsc.sc()
        cls._why.pop(id(sc), None)

        def run() -> None:
            deadline = time.monotonic() + timeout_s
            have = 0
            while time.monotonic() < deadline:
                if sc._jsc is None:
                    return  # stopped meanwhile
                try:
                    have = status.getExecutorMemoryStatus().size() - 1  # (- the driver)
                except Exception:  # noqa: BLE001 - the session stopped meanwhile
                    return
                if have >= executors:
                    return
                time.sleep(0.1)
            why = _too_few(have, executors, cores, timeout_s)
            if have:
                log.warning("%s; jobs run on the %d that did", why, have)
                return
            cls._why[id(sc)] = why
            log.error("%s: cancelling the session's jobs", why)
            try:
                sc.cancelAllJobs()
            except Exception:  # noqa: BLE001 - the session stopped meanwhile
                pass

        threading.Thread(target=run, name="raydelay-spark-executors", daemon=True).start()


def _wait_for_executors(spark: Any, executors: int, cores: int, timeout_s: float) -> None:
    status = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + timeout_s
    while (have := status.getExecutorMemoryStatus().size() - 1) < executors:  # (- the driver)
        if time.monotonic() > deadline:
            raise Unavailable(_too_few(have, executors, cores, timeout_s))
        time.sleep(0.05)


def _too_few(have: int, executors: int, cores: int, timeout_s: float) -> str:
    return (
        f"spark: {have} of {executors} RayDP executors started within {timeout_s:g} s; "
        f"the Ray cluster may lack the CPUs ({executors} x {cores}) or the memory they ask for"
    )


def not_started(spark: Any) -> str | None:
    """Why the session's jobs were cancelled (no executor started), or None."""
    return _Executors._why.get(id(spark.sparkContext))


class _DriverLaunch:
    """The driver's JVM (pyspark's gateway), launched on a thread with the settings that
    RayDP gives the driver; pyspark's own start then finds the gateway up and uses it.
    When RayDP's settings cannot be worked out (another RayDP), nothing is launched
    early and pyspark launches the JVM itself, as without this."""

    def __init__(self, thread: threading.Thread | None) -> None:
        self._thread = thread

    @classmethod
    def begin(cls, configs: dict, executors: int, cores: int, memory: str) -> _DriverLaunch:
        from pyspark import SparkConf, SparkContext

        if SparkContext._gateway is not None:  # this process launched it already
            return cls(None)
        try:
            from raydp.spark.ray_cluster import SparkCluster

            probe = SparkCluster.__new__(SparkCluster)
            probe._configs = dict(configs)
            probe._num_executors = executors
            probe._executor_cores = cores
            probe._executor_memory = memory
            probe._prepare_spark_configs()  # what RayDP adds: its jars, agent, log4j
            conf = SparkConf(loadDefaults=False).setAll(list(probe._configs.items()))
        except Exception as exc:  # noqa: BLE001 - an unexpected RayDP: start as it does
            log.debug("the driver's JVM starts after RayDP's app master: %s", exc)
            return cls(None)

        def run() -> None:
            try:
                SparkContext._ensure_initialized(conf=conf)
            except Exception as exc:  # noqa: BLE001 - pyspark retries it and reports it
                log.debug("launching the driver's JVM early failed: %s", exc)

        thread = threading.Thread(target=run, name="raydelay-spark-driver", daemon=True)
        thread.start()
        return cls(thread)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def stop_spark(spark: Any, master: str = RAYDP, timeout_s: float = 30.0) -> None:
    """Stop ``spark``. With RayDP, also wait (up to ``timeout_s``) until its app master
    actor is gone: RayDP ends it in the background, and a ``start_spark`` meanwhile would
    find its name taken."""
    if master != RAYDP:
        spark.stop()
        return
    import ray
    import raydp
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX

    name = spark.sparkContext.appName + RAYDP_SPARK_MASTER_SUFFIX
    raydp.stop_spark()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return  # gone
        time.sleep(0.05)
    log.warning("RayDP's app master %s is still there after %g s", name, timeout_s)


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
