"""The smoke run of an installed raydelay: ``python smoke.py <checkout>``.

tests/package/test_wheel.py runs it with the interpreter of a clean venv into which only
the built wheel was installed (no ``-e``, no extras), once with the newest Ray line of
the supported range and once with the oldest. It imports nothing from the checkout but
the docs' examples, and prints one JSON line of what it ran on.

1. The package is the installed one, and its optional parts say which extra they need.
2. The README's and docs/tasks.md's Ray examples run as written: the quickstart, a
   cancel and a peek, a scheduled Ray call.
3. Pending messages and a cancel survive a shutdown and a restart on the same store.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pyarrow
import ray

import raydelay
from raydelay.errors import MissingExtra

DOCS = ("README.md", "docs/tasks.md")


def installed_not_checkout(checkout: Path) -> None:
    where = Path(raydelay.__file__).resolve()
    assert not where.is_relative_to(checkout), f"raydelay imported from the checkout: {where}"
    assert (where.parent / "py.typed").exists(), "py.typed is not installed"


def extras_named() -> None:
    for load, extra in (
        (lambda: __import__("raydelay.web"), "console"),
        (lambda: __import__("raydelay.http.serve"), "http"),
        (lambda: __import__("raydelay.ingest.spark"), "spark"),
        (lambda: raydelay.ingest.ingest_dataframe, "spark"),
    ):
        try:
            load()
        except MissingExtra as exc:
            assert f"pip install 'raydelay[{extra}]'" in str(exc), str(exc)
            assert isinstance(exc, ImportError)
        else:
            raise AssertionError(f"a feature of the [{extra}] extra loaded without it")
    from raydelay.ingest import RowSpec  # the pure part of ingest needs no extra

    assert RowSpec


def doc_examples(checkout: Path) -> int:
    ran = 0
    for doc in DOCS:
        text = (checkout / doc).read_text()
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            if not code.startswith("# needs: ray"):
                continue
            with tempfile.TemporaryDirectory() as work:
                os.chdir(work)
                exec(compile(code, f"{doc}:{i}", "exec"), {"__name__": "__main__"})
                ran += 1
    return ran


def restart(work: Path) -> None:
    os.chdir(work)
    cluster = raydelay.connect()
    cluster.create_topic("smoke", partitions=2)
    cluster.subscribe("smoke", "s")
    producer = cluster.create_producer("smoke")
    ids = producer.send_many(
        [f"m{i}".encode() for i in range(100)],
        deliver_after=[3600.0] * 100,
        keys=[f"k{i}" for i in range(100)],
    )
    assert producer.cancel(ids[7])
    cluster.shutdown()

    cluster = raydelay.connect()  # the same store: ./.raydelay/data
    pending = cluster.peek("smoke", "s", limit=1000)
    assert sorted(m.key for m in pending) == sorted(f"k{i}" for i in range(100) if i != 7)
    cluster.shutdown()


def main() -> None:
    checkout = Path(sys.argv[1]).resolve()
    installed_not_checkout(checkout)
    extras_named()
    examples = doc_examples(checkout)
    assert examples >= 3, f"only {examples} examples ran"
    with tempfile.TemporaryDirectory() as work:
        restart(Path(work))
    print(
        json.dumps(
            {
                "ray": ray.__version__,
                "pyarrow": pyarrow.__version__,
                "python": sys.version.split()[0],
                "raydelay": raydelay.__version__,
                "examples": examples,
            }
        )
    )


if __name__ == "__main__":
    main()
