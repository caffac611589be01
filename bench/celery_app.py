"""The Celery peer of ``bench/tasks_bench.py``: an app on a Redis broker whose tasks run the
same bodies as raydelay's scheduled calls (``bench/task_funcs.py``).

The worker is started by the benchmark as ``celery -A bench.celery_app worker`` from the
repo root, with the broker's URL in ``RAYDELAY_BENCH_BROKER``. Settings are Celery's
defaults except: no result backend (nothing reads results), UTC, and a visibility timeout
of 4 hours, longer than any ETA of the benchmark (Redis hands an unacknowledged message to
another consumer after it, and an ETA task stays unacknowledged until it runs).
"""

from __future__ import annotations

import os

from celery import Celery

from bench import task_funcs

BROKER_ENV = "RAYDELAY_BENCH_BROKER"

app = Celery("raydelay_bench", broker=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    result_backend=None,
    enable_utc=True,
    timezone="UTC",
    broker_transport_options={"visibility_timeout": 4 * 3600},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop")
def noop() -> None:
    task_funcs.noop()


@app.task(name="bench.record")
def record(out_dir: str, due_ms: int) -> None:
    task_funcs.record(out_dir, due_ms)
