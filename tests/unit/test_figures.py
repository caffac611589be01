"""The headline figures have one home: bench/results/headlines.toml, quoted by the pages.

README.md, docs/index.md and docs/benchmarks.md hold the table tools/figures.py renders from
it; these tests fail when a page's table is stale, when a page states a headline figure by
hand with a value no run of the data has (so two pages cannot disagree), and when a quote
of the data is no longer in its result file.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "figures.py"

_spec = importlib.util.spec_from_file_location("figures", TOOL)
assert _spec is not None and _spec.loader is not None
figures = importlib.util.module_from_spec(_spec)
sys.modules["figures"] = figures  # dataclasses look their module up by name
_spec.loader.exec_module(figures)


@pytest.fixture(scope="module")
def headlines():
    return figures.load()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the tool reads: the pages, the docs, the data and its result files."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results")
    return tmp_path


def _figure(headlines, fid):
    return next(f for f in headlines.figures if f.id == fid)


def test_the_pages_agree_with_the_headlines(headlines):
    assert figures.check(headlines) == []


def test_the_check_command_passes_on_the_repository():
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_each_page_holds_one_block_with_every_headline(headlines):
    for page in figures.PAGES:
        text = (ROOT / page).read_text()
        assert text.count("<!-- figures:start") == 1, page
        for figure in headlines.figures:
            assert f"**{figure.runs[0].value}**" in text, (page, figure.id)


def test_a_stale_block_fails_the_check_and_a_write_mends_it(tree, headlines):
    page = tree / "docs" / "index.md"
    newest = _figure(headlines, "recovery").runs[0].value
    page.write_text(page.read_text().replace(f"**{newest}**", "**1.15-1.91 s**"))
    assert figures.stale_pages(headlines, tree) == ["docs/index.md"]
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check", "--root", str(tree)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "docs/index.md" in done.stderr
    assert figures.write_pages(headlines, tree) == ["docs/index.md"]
    assert figures.check(headlines, tree) == []


def test_a_page_without_its_block_is_stale(tree, headlines):
    readme = tree / "README.md"
    text = readme.read_text()
    start = text.index("<!-- figures:start")
    end = text.index("<!-- figures:end -->") + len("<!-- figures:end -->")
    readme.write_text(text[:start] + text[end:])
    assert figures.stale_pages(headlines, tree) == ["README.md"]


@pytest.mark.parametrize(
    "fid,sentence",
    [
        # the findings of #45: values two pages gave at once
        (
            "recovery",
            "a restarted actor resumes (1.15-1.91 s from kill to first delivery at 10M pending)",
        ),
        ("recovery", "**Back in 1.15-1.91 s** from killing an actor with 10M messages pending."),
        ("burst", "1M messages due at one instant, drained and acked: 822k msg/s."),
        ("burst", "A burst of 1M due at once drains at 1.1M-1.3M msg/s."),
        ("lateness", "A steady 20k msg/s arrives late by 3 / 18 ms at p50 / p99."),
    ],
)
def test_a_hand_copy_with_another_value_fails(tree, headlines, fid, sentence):
    figure = _figure(headlines, fid)
    page = tree / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\n" + sentence + "\n")
    wrong = figures.wrong_hand_copies(headlines, tree)
    assert [(c.page, c.figure) for c in wrong] == [("docs/concepts.md", figure.id)]
    assert any(p.startswith("docs/concepts.md: ") for p in figures.check(headlines, tree))


@pytest.mark.parametrize(
    "sentence",
    [
        # a value some run of the data has, raydelay's or its peer's
        "Back in 1.17-1.39 s from killing an actor with 10M messages pending.",
        "With Ray's 1 s wait, a kill at 10M pending took 1.47-2.18 s.",
        "1M messages due at one instant drained at 864k msg/s against Redis's 290k msg/s.",
        # a dated entry of a history table: the date comes first in its clause
        "| kill -> first delivery at 10M pending | 2.03 s | 2026-11-25: 1.15-1.91 s |",
        # code is not prose
        "```bash\n# 1M due at one instant: 5 msg/s\n```",
    ],
)
def test_a_hand_copy_that_agrees_or_is_dated_passes(tree, headlines, sentence):
    page = tree / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\n" + sentence + "\n")
    assert figures.wrong_hand_copies(headlines, tree) == []


def test_every_quote_is_in_its_result_file(headlines):
    assert figures.missing_quotes(headlines) == []
    assert all(run.quotes for f in headlines.figures for run in f.runs)


def test_a_quote_gone_from_its_result_file_fails(tree, headlines):
    run = _figure(headlines, "recovery").runs[0]
    source = tree / "bench" / "results" / run.source
    source.write_text(source.read_text().replace(run.quotes[0], ""))
    assert figures.missing_quotes(headlines, tree) == [f"{run.source}: {run.quotes[0]!r}"]


def test_the_newest_run_of_a_figure_is_listed_first(headlines):
    for figure in headlines.figures:
        dates = [run.date for run in figure.runs]
        assert dates == sorted(dates, reverse=True), figure.id
