"""The client examples of the README and the docs pages (those marked ``# needs: ray``) run
as written, each attaching to the session's one Ray."""

from __future__ import annotations

import pytest

from tests.unit.test_readme import WHERE_BLOCKS

RAY_BLOCKS = [(w, b) for w, b in WHERE_BLOCKS if b.startswith("# needs: ray")]


def test_the_readme_has_a_client_example():
    assert any(w.startswith("README.md:") for w, _ in RAY_BLOCKS)


@pytest.mark.parametrize("where,code", RAY_BLOCKS, ids=[w for w, _ in RAY_BLOCKS])
def test_readme_client_example_runs(where, code, cluster, tmp_path, monkeypatch):
    # connect() attaches to the session's Ray and coordinator, like a second client would
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "readme"})
