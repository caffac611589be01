"""Where a burst's time goes in raydelay: the burst scenario of ``bench/compare.py`` (N
messages due at one instant, 4 partitions, one consumer thread acking) with py-spy
sampling one subscription actor and the driver from the due instant until the drain ends.
Prints the CPU seconds of every process and, for each sampled process, the functions with
the most samples (self) and raydelay's own call sites (inclusive).

Usage: python bench/burst_profile.py [--messages 1000000] [--rate 200] [--size 40000]
"""

from __future__ import annotations

import argparse
import collections
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

import raydelay  # noqa: E402
from bench.common import cpu_times, ray_processes, start_local_ray  # noqa: E402
from bench.peer_raydelay import receive_from  # noqa: E402
from bench.workload import Drain, now_ms, produce, sleep_until  # noqa: E402
from raydelay.actors.handles import subscription_partition  # noqa: E402


def spy(pid: int, seconds: int, rate: int, out: Path) -> subprocess.Popen:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args = [exe, "record", "-p", str(pid), "-d", str(seconds), "-r", str(rate)]
    args += ["-f", "raw", "-o", str(out), "--nonblocking"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize(path: Path, label: str, top: int = 12) -> list[str]:
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        total += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    lines = [f"\n### {label}: {total} samples\n", "| self % | function |", "|---:|---|"]
    lines += [f"| {n / total * 100:.1f} | `{f[:110]}` |" for f, n in own.most_common(top)]
    lines += ["", "| inclusive % | raydelay call site |", "|---:|---|"]
    ours = [(f, n) for f, n in incl.most_common() if "raydelay/" in f or "bench/" in f]
    lines += [f"| {n / total * 100:.1f} | `{f[:110]}` |" for f, n in ours[:top]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--size", type=int, default=40_000, help="max_messages per receive_batch")
    ap.add_argument("--keep", type=Path, help="a directory to keep py-spy's raw stacks in")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = args.messages
    with tempfile.TemporaryDirectory() as root:
        start_local_ray()
        cluster = raydelay.connect({"storage": {"kind": "local", "local": {"root": root}}})
        cluster.create_topic("burst", 4)
        consumer = cluster.subscribe("burst", "bench")
        producer = cluster.create_producer("burst")
        due = now_ms() + 5_000 + n // 100
        produce(lambda items, ats: producer.send_many(items, deliver_at=ats.tolist()), n,
                lambda lo, c: np.full(c, due), threads=4, batch=5_000)  # fmt: skip
        sub = subscription_partition("burst", 0, "bench")  # (its actor serves all 4)
        sub_pid = ray.get(sub.pid())
        drain = Drain(receive_from(consumer, size=args.size)).start()
        roles = ray_processes()
        sleep_until(due - 100)
        seconds = max(3, n // 100_000)
        spies = [
            spy(sub_pid, seconds, args.rate, Path(root) / "sub.txt"),
            spy(psutil.Process().pid, seconds, args.rate, Path(root) / "driver.txt"),
        ]
        sleep_until(due)
        cpu0 = cpu_times(roles)
        drain.wait_for(n, timeout_s=600)
        cpu1 = cpu_times(roles)
        drain.stop()
        for s in spies:
            s.wait()
        drain_s = (drain.times_ms[-1] - due) / 1000
        lines = [
            f"## Burst of {n:,} due at one instant: drained in {drain_s:.2f} s "
            f"({n / drain_s:,.0f} msg/s)\n",
            "| process | CPU s |",
            "|---|---:|",
        ]
        for role, c in sorted(cpu1.items(), key=lambda kv: cpu0.get(kv[0], 0) - kv[1]):
            if c - cpu0.get(role, 0) >= 0.05:
                lines.append(f"| {role} | {c - cpu0.get(role, 0):.2f} |")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in ("sub.txt", "driver.txt"):
                shutil.copy(Path(root) / name, args.keep / name)
        lines += summarize(Path(root) / "sub.txt", "one subscription actor (of 4)")
        lines += summarize(Path(root) / "driver.txt", "the driver (consumer thread)")
        consumer.close()
        producer.close()
        cluster.shutdown()
        ray.shutdown()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
