"""Compare quick-suite runs of two trees (bench/compare.py --peers raydelay --out DIR), made
alternately in the same hour: each figure's mean per side, and new / old oriented so that
above 1.00 is better. Prints a Markdown table.

    python bench/ab_compare.py --new DIR [DIR ...] --old DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from collections.abc import Callable
from typing import Any


def _steady(i: int, q: str) -> Callable[[dict], Any]:
    return lambda r: r["steady"][i][q]


def _fanout_cpu(i: int) -> Callable[[dict], Any]:
    return lambda r: r["fanout"][i]["net_cpu_s"]


# (label, how to read it from raydelay's results, True if higher is better)
FIGURES: list[tuple[str, Callable[[dict], Any], bool]] = [
    ("ingest, msg/s until durable", lambda r: r["ingest"]["durable_rate"], True),
    ("memory at 1M pending, bytes/msg", lambda r: r["memory"][0]["memory_bytes"] / 1e6, False),
    ("recovery at 1M, s to first delivery", lambda r: r["memory"][0]["recovery_s"], False),
    ("burst 1M x40000, drain s", lambda r: r["burst"]["drain_s"], False),
    ("burst 1M x10000, drain s", lambda r: r["burst_10k"]["drain_s"], False),
    ("burst 1M receive() path, drain s", lambda r: r["burst_receive"]["drain_s"], False),
    ("lateness 20k/s loaded ahead, p50 ms", lambda r: r["lateness"]["p50"], False),
    ("lateness 20k/s loaded ahead, p99 ms", lambda r: r["lateness"]["p99"], False),
    ("send() loop, msg/s", lambda r: r["send"]["loop"]["rate"], True),
    ("send() from 16 threads, msg/s", lambda r: r["send"]["threads"]["rate"], True),
    ("send_async, msg/s", lambda r: r["send"]["async"]["rate"], True),
    *[
        (
            f"steady {rate // 1000}k/s, {q} ms",
            _steady(i, q),
            False,
        )
        for i, rate in enumerate((5_000, 20_000, 50_000))
        for q in ("p50", "p99")
    ],
    ("steady 50k/s, producer reached msg/s", lambda r: r["steady"][2]["sent_rate"], True),
    *[(f"fan-out 300k, K={k}, net CPU s", _fanout_cpu(i), False) for i, k in enumerate((1, 8, 32))],
    ("drain 2M over 40 buckets, msg/s", lambda r: r["drain"]["rate"], True),
    ("topology, worker processes", lambda r: r["topology"]["processes"], False),
    ("topology, idle CPU (share of a core)", lambda r: r["topology"]["idle_cpu"], False),
    ("topology, PSS GiB", lambda r: r["topology"]["pss_bytes"] / 2**30, False),
]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1_000 else f"{v:.3g}"


def load(dirs: list[str]) -> list[dict]:
    out = []
    for d in dirs:
        (path,) = glob.glob(f"{d}/*.json")
        with open(path) as f:
            out.append(json.load(f)["peers"]["raydelay"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--old", nargs="+", required=True)
    args = ap.parse_args()
    new, old = load(args.new), load(args.old)
    print("| figure | new (each run) | old (each run) | new / old, better > 1 |")
    print("|---|---|---|---:|")
    for label, get, higher in FIGURES:
        try:
            a, b = [get(r) for r in new], [get(r) for r in old]
        except (KeyError, IndexError, TypeError):
            continue
        ma, mb = statistics.mean(a), statistics.mean(b)
        ratio = (ma / mb if higher else mb / ma) if ma and mb else float("nan")
        shown = " / ".join(map(_fmt, a)), " / ".join(map(_fmt, b))
        print(f"| {label} | {shown[0]} | {shown[1]} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
