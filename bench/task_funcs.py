"""The functions ``bench/tasks_bench.py`` schedules, in a module the runners' Ray workers
import (raydelay stores a call by its import path) and the Celery worker too
(``bench/celery_app.py`` wraps them as Celery tasks), so both peers run the same body.

``record`` writes one line per call, ``<due_ms> <started_ms>``, to ``<out_dir>/<pid>.txt``:
one ``write`` on a file each process opens once, so a task costs a syscall and leaves its
start time behind for the benchmark to read, whatever ran it.
"""

from __future__ import annotations

import os
import time

_files: dict[tuple[str, int], int] = {}  # (out_dir, pid) -> a file descriptor opened O_APPEND


def noop() -> None:
    return None


def record(out_dir: str, due_ms: int) -> None:
    """Append ``<due_ms> <started_ms>`` (epoch ms, the start with 3 decimals) to this
    process's file under ``out_dir``."""
    started_ms = time.time() * 1000
    key = (out_dir, os.getpid())  # (a forked child must not share its parent's file)
    fd = _files.get(key)
    if fd is None:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{os.getpid()}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _files[key] = fd
    os.write(fd, f"{int(due_ms)} {started_ms:.3f}\n".encode())
