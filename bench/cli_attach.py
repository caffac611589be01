"""How long a ``raydelay`` command takes end to end when it does almost nothing
(``raydelay topics list`` on a cluster with no topics): the attach every command pays.
Each is a new process, timed from its start to its exit, beside the floor measured in the
same run: a Python that imports Ray and joins the same cluster, nothing more.

    raydelay up                     # or pass --address of a running raydelay's Ray
    python bench/cli_attach.py --runs 5 [--tree OTHER_CHECKOUT ...]

Rows, each run in turn (so that a busy machine weighs on all alike):

- ``import ray``: the interpreter and Ray's import alone;
- the floor, ``python -c "import ray; ray.init(address=...)"``: leaving it to Ray's exit
  hook, which first sleeps 0.5 s for log lines of the cluster's workers;
- the floor with ``ray.shutdown()`` called at its end (no sleep: what a driver pays that
  leaves Ray itself);
- ``raydelay topics list`` of this checkout, and of each ``--tree`` (another checkout of
  raydelay, imported instead: a before/after in one run).

A first, uncounted run of each warms the disk cache and Python's bytecode cache (when
``PYTHONDONTWRITEBYTECODE`` is set, the children write theirs under a temporary
``PYTHONPYCACHEPREFIX`` instead: a user's install compiles raydelay once, not each time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raydelay._auth import send_token_by_default
from raydelay.cluster.local import up_address

HERE = Path(__file__).resolve().parents[1]  # this checkout


def _floor(address: str, shutdown: bool) -> list[str]:
    code = f"import ray; ray.init(address={address!r})"
    return [sys.executable, "-c", code + ("; ray.shutdown()" if shutdown else "")]


def _cli(address: str) -> list[str]:
    return [sys.executable, "-m", "raydelay.cli", "--address", address, "topics", "list"]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the start of ``argv`` to its exit (it must succeed)."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"{' '.join(argv[:4])}...: exit {done.returncode}: {last}")
    return took


def _env(pythonpath: Path, cache: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", help="the Ray to attach to (default: the one `raydelay up` ran)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each row (default 5)")
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        help="another raydelay checkout whose `topics list` is timed too (repeatable)",
    )
    args = ap.parse_args()
    if args.runs < 1:
        raise SystemExit(f"runs: expected >= 1, got {args.runs}")
    address = args.address or os.environ.get("RAYDELAY_ADDRESS") or up_address()
    if not address:
        raise SystemExit("no Ray to attach to: run `raydelay up` first, or pass --address")
    trees = [HERE, *(Path(t).resolve() for t in args.tree)]
    for tree in trees:
        if not (tree / "raydelay" / "cli.py").is_file():
            raise SystemExit(f"tree: {tree} is not a raydelay checkout")
    send_token_by_default()  # the floor's children send Ray's token as raydelay does
    cache = None
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        cache = tempfile.mkdtemp(prefix="raydelay-pycache-")
    base = _env(HERE, cache)
    rows: list[tuple[str, list[str], dict[str, str]]] = [
        ("import ray", [sys.executable, "-c", "import ray"], base),
        ("floor: import ray; ray.init(address)", _floor(address, False), base),
        ("floor, then ray.shutdown()", _floor(address, True), base),
    ]
    for tree in trees:
        label = "raydelay topics list" + ("" if tree == HERE else f" ({tree})")
        rows.append((label, _cli(address), _env(tree, cache)))
    for _, argv, env in rows:  # warm-up, not counted
        _timed(argv, env)
    times: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(args.runs):
        for label, argv, env in rows:
            times[label].append(_timed(argv, env))
    floor = statistics.median(times[rows[1][0]])
    width = max(len(label) for label, _, _ in rows)
    print(f"Ray at {address}; {args.runs} runs each, alternating; seconds from start to exit")
    if cache is not None:
        print(f"(PYTHONDONTWRITEBYTECODE is set here: the children cache bytecode in {cache})")
    print()
    print(f"{'':{width}}  median     min     max  median - floor")
    for label, _, _ in rows:
        t = times[label]
        med = statistics.median(t)
        print(f"{label:{width}}  {med:6.2f}  {min(t):6.2f}  {max(t):6.2f}  {med - floor:+14.2f}")


if __name__ == "__main__":
    main()
