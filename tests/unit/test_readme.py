"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
ALL_BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
# Examples that start Ray (or Spark) are run by tests/integration/test_readme_client.py
# (and tests/integration/test_ingest.py) instead.
BLOCKS = [b for b in ALL_BLOCKS if not b.startswith("# needs:")]


def test_the_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
