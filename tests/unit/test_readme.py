"""The Python examples of the README and of the docs pages run as written.

Blocks are collected from README.md and every docs/**/*.md. A block that starts Ray
(``# needs: ray``) or Spark (``# needs: spark``) is run by tests/integration/test_readme_client.py
or tests/integration/test_ingest.py instead; a block that shows another tool's code for
comparison (``# not run: ...``, on the "Coming from" pages) is not ours to run.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks() -> list[tuple[str, str]]:
    """(where, code) of every ```python block, ``where`` naming its file and its number."""
    found = []
    for path in DOCS:
        name = path.relative_to(ROOT).as_posix()
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S)):
            found.append((f"{name}:{i}", code))
    return found


WHERE_BLOCKS = _blocks()
ALL_BLOCKS = [code for _, code in WHERE_BLOCKS]
BLOCKS = [(w, b) for w, b in WHERE_BLOCKS if not b.startswith(("# needs:", "# not run:"))]


def test_the_readme_and_docs_have_examples():
    assert len(BLOCKS) >= 2
    assert any(w.startswith("README.md:") for w, b in WHERE_BLOCKS if b.startswith("# needs: ray"))


def test_every_block_that_is_not_run_says_why():
    # only another tool's code may stay unrun, and it says which
    for where, code in WHERE_BLOCKS:
        if code.startswith("# not run:"):
            assert code.split("\n", 1)[0].strip() != "# not run:", where


@pytest.mark.parametrize("where,code", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_readme_example_runs(where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "readme"})
