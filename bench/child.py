"""Running one variant of a benchmark in a process of its own: this tree's raydelay, or
another source tree's (``--baseline SRC``, for example a ``git worktree`` of an older
commit), so both columns of a table come from the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_child(code: str, argv: list[str], src: str | None, timeout_s: float = 3600) -> dict:
    """Run ``code`` (a Python program) with ``argv`` and the temp dir it may keep a store
    in as its last argument, with the raydelay of ``src`` (None: this tree) first on its
    path; return the JSON of its last ``RESULT `` line on stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYDELAY_ADDRESS")}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", code, *argv, os.path.join(tmp, "store")]
        print(f"running {'baseline ' + src if src else 'this tree'} ...", file=sys.stderr)
        proc = subprocess.run(
            cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])
