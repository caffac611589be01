"""The README's client examples (those marked ``# needs: ray``) run as written."""

from __future__ import annotations

import pytest

from tests.unit.test_readme import ALL_BLOCKS

RAY_BLOCKS = [b for b in ALL_BLOCKS if b.startswith("# needs: ray")]


def test_the_readme_has_a_client_example():
    assert RAY_BLOCKS


@pytest.mark.parametrize("code", RAY_BLOCKS, ids=[f"block{i}" for i in range(len(RAY_BLOCKS))])
def test_readme_client_example_runs(code, cluster, tmp_path, monkeypatch):
    # connect() attaches to the session's Ray and coordinator, like a second client would
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
