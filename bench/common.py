"""What the Ray benchmarks share: one way to start the local Ray they measure on, the CPU
seconds each of its processes spent, and the store a run keeps its data in (``--store``:
a local dir, or S3 on a SeaweedFS server started for the run)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray

from raydelay.actors.subscription import SubscriptionHost
from raydelay.clock import now_ms
from raydelay.cluster.local import RAY_SYSTEM_CONFIG

STORES = ("local", "s3")


def start_local_ray() -> None:
    """A new local Ray on the machine's 2 cores, quiet, with raydelay's system config
    (``address="local"``: never a Ray that another program on the machine started)."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        configure_logging=False,
        log_to_driver=False,
        _system_config=RAY_SYSTEM_CONFIG,
    )


def ray_processes() -> dict[int, str]:
    """pid -> a role for the driver and every process of the local Ray it started (workers
    name themselves ``ray::<ActorClass>`` in their command line), and the SeaweedFS server
    of ``--store s3``. Only this process's descendants: not another program's Ray."""
    me = psutil.Process()
    roles: dict[int, str] = {me.pid: "driver (producer + consumer)"}
    for proc in me.children(recursive=True):
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        cmd = " ".join(argv)
        if cmd.startswith("ray::"):
            roles[proc.pid] = cmd.split()[0][5:].split(".")[0]
        elif "gcs_server" in cmd:
            roles[proc.pid] = "ray gcs"
        elif "raylet" in cmd:
            roles[proc.pid] = "ray raylet"
        elif argv and Path(argv[0]).name == "weed":
            roles[proc.pid] = "SeaweedFS (weed server)"
    return roles


def cpu_times(roles: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) so far, summed per role."""
    out: dict[str, float] = {}
    for pid, role in roles.items():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def ask(call, timeout_s: float = 120.0):
    """ray.get that waits out an actor restart."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(call(), timeout=30)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def kill_and_recover(actor, timeout_s: float = 300.0) -> tuple[int, dict, dict]:
    """SIGKILL the subscription host serving a partition (Ray restarts it) and wait for the
    new process and its first delivery. Returns (kill time in epoch ms, the new process's stats, their
    ``recovery`` part); ``recovery["first_delivery_at_ms"]`` is missing if none came in
    ``timeout_s``. What a consumer receives after the kill is not looked at: its prefetch
    buffer may still hand out what the old process delivered."""
    pid = ask(actor.pid)
    killed = now_ms()
    ray.kill(actor.handle, no_restart=False)  # (its process)
    deadline = time.monotonic() + timeout_s
    while ask(actor.pid) == pid:  # the old process may answer until it is gone
        if time.monotonic() > deadline:
            raise RuntimeError("the subscription host was not restarted")
        time.sleep(0.005)
    stats = ask(lambda: actor.submit(SubscriptionHost.stats))
    while "first_delivery_at_ms" not in stats["recovery"] and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = ask(lambda: actor.submit(SubscriptionHost.stats))
    return killed, stats, stats["recovery"]


# --- the store of a run (--store local|s3|local,s3) ---------------------------------------


def add_store_args(ap: argparse.ArgumentParser) -> None:
    """``--store`` (and the hidden ``--result-json`` a per-store child process writes)."""
    ap.add_argument(
        "--store",
        default="local",
        type=parse_stores,
        help="local (a dir), s3 (SeaweedFS started in a temp dir for the run), or both "
        "comma-separated (local,s3): one child process per store, one table row per store",
    )
    ap.add_argument("--result-json", default=None, help=argparse.SUPPRESS)


def parse_stores(text: str) -> list[str]:
    stores = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in stores if s not in STORES]
    if not stores or bad or len(set(stores)) != len(stores):
        raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(STORES)}")
    return stores


@dataclass
class BenchStore:
    """Where one run keeps raydelay's data. ``config`` is raydelay's ``storage`` table."""

    kind: str
    config: dict[str, Any]
    size_of: Callable[[str], int]  # bytes of the objects under a key prefix

    def bytes_under(self, prefix: str) -> int:
        return self.size_of(prefix)


@contextlib.contextmanager
def bench_store(kind: str, work: Path) -> Iterator[BenchStore]:
    """The store of a run, under ``work``. Enter it before ``start_local_ray``: for ``s3``
    it puts the server's key in ``os.environ``, which Ray's workers inherit."""
    if kind == "local":
        root = work / "store"
        root.mkdir(parents=True, exist_ok=True)

        def local_size(prefix: str) -> int:
            base = root / prefix
            return sum(p.stat().st_size for p in base.rglob("*") if p.is_file())

        yield BenchStore("local", {"kind": "local", "local": {"root": str(root)}}, local_size)
        return
    from tests.seaweed import start_seaweed  # the repo root is on sys.path (see the benches)

    server = start_seaweed(work / "seaweed")
    try:
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.update(server.env())
        bucket = server.bucket("raydelay-bench")
        client = server.client()

        def s3_size(prefix: str) -> int:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return sum(o["Size"] for page in pages for o in page.get("Contents", ()))

        print(f"store: SeaweedFS S3 at {server.endpoint}, bucket {bucket}", flush=True)
        yield BenchStore("s3", server.storage_config(bucket), s3_size)
    finally:
        server.stop()


def run_per_store(stores: list[str]) -> dict[str, Any]:
    """Run this script again once per store, each in a child process of its own (a fresh
    Ray, and a fresh JVM for Spark), with the same arguments; returns store -> the result
    the child wrote with :func:`write_result`."""
    argv = _without_option(sys.argv[1:], "--store")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="raydelay-bench-") as tmp:
        for store in stores:
            out = Path(tmp) / f"{store}.json"
            print(f"\n=== --store {store} ===", flush=True)
            cmd = [sys.executable, sys.argv[0], *argv, "--store", store, "--result-json", str(out)]
            subprocess.run(cmd, check=True)
            results[store] = json.loads(out.read_text())
    return results


def measure_stores(args: argparse.Namespace, measure: Any) -> dict[str, Any] | None:
    """``measure(args, store)`` for each store of ``--store``: with several, each in a child
    process of its own; with one, here. None when this is such a child (``--result-json``:
    it wrote its result for the parent)."""
    if len(args.store) > 1:
        return run_per_store(args.store)
    results = {args.store[0]: measure(args, args.store[0])}
    if args.result_json:
        write_result(args.result_json, results[args.store[0]])
        return None
    return results


def write_result(path: str, result: Any) -> None:
    Path(path).write_text(json.dumps(result))


def ratio(value: float | None, base: float | None) -> str:
    """``value / base`` as ``1.23x``; empty when either is missing."""
    if value is None or not base:
        return ""
    return f"{value / base:.2f}x"


def _without_option(argv: list[str], name: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out
