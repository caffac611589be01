"""mkdocs hooks: bench/results/ on the docs site, and Sphinx roles off the API pages.

The benchmark scripts write their dated tables (``*.md``), figures (``*.json``) and plots
(``*.png``) to ``bench/results/``. ``on_files`` adds each of them to the site under the same
path, plus a generated index of them all. A docs page links ``../bench/results/NAME``, as
the file lies in the repository; the hook points that at the site's copy, and ``mkdocs build
--strict`` checks the link.

The docstrings name other objects Sphinx-style (``:class:`Cluster```); rendered as Markdown
that leaves a stray ``:class:`` before the code, which ``on_page_content`` takes away.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
RESULTS_URI = "bench/results"
RESULTS_DIR = ROOT / RESULTS_URI
KEPT = (".md", ".png", ".json")  # *.tmp and *.partial.pkl are leftovers of unfinished runs
INDEX_URI = f"{RESULTS_URI}/index.md"
# ![alt](plot.png) in a results page; an early run named plots it did not keep
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")
# :class:<code>~a.b.C</code> as Markdown renders :class:`~a.b.C`; "~" shows the last part only
_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):<code>(~?)([^<]*)</code>")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    names = sorted(p.name for p in RESULTS_DIR.iterdir() if p.suffix in KEPT)
    for name in names:
        files.append(
            File(
                f"{RESULTS_URI}/{name}",
                src_dir=str(ROOT),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
                inclusion=InclusionLevel.NOT_IN_NAV,  # reached by links, not the nav
            )
        )
    files.append(File.generated(config, INDEX_URI, content=_index(names)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if not page.file.src_uri.startswith(RESULTS_URI + "/"):
        return _site_links(markdown, page)
    if page.file.src_uri == INDEX_URI:
        return markdown

    def keep_or_say(m: re.Match[str]) -> str:
        if (RESULTS_DIR / m.group(2)).exists():
            return m.group(0)
        return f"*(plot `{m.group(2)}` was not kept)*"

    return _IMAGE.sub(keep_or_say, markdown)


def _site_links(markdown: str, page: Page) -> str:
    """A docs page links a result as ``../bench/results/NAME`` (where it is in the
    repository, so the link works on GitHub too); on the site the file sits under the docs
    root, one ``..`` nearer. The folder itself becomes the generated index."""
    up = "../" * page.file.src_uri.count("/")
    markdown = markdown.replace(f"](../{up}{RESULTS_URI}/)", f"]({up}{INDEX_URI})")
    return markdown.replace(f"](../{up}{RESULTS_URI}/", f"]({up}{RESULTS_URI}/")


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def plain(m: re.Match[str]) -> str:
        name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
        return f"<code>{name}</code>"

    return _ROLE.sub(plain, html)


def _index(names: list[str]) -> str:
    """A page listing every result by date, newest first, its plots and data beside it."""
    pages = [n for n in names if n.endswith(".md")]
    lines = [
        "# Every benchmark result",
        "",
        "The files of `bench/results/` as the benchmark scripts wrote them, newest first. Each",
        "page says its command, its machine and its commit. [Benchmarks](../../benchmarks.md)",
        "explains the suites and shows the headline figures.",
        "",
        "| date | result | plots and data |",
        "|---|---|---|",
    ]
    for page in sorted(pages, key=lambda n: (n[:10], n), reverse=True):
        stem = page[:-3]
        extras = [n for n in names if n != page and n.startswith(stem) and not n.endswith(".md")]
        # a longer name with the same start is another run's file ("quick" vs "quick-hosts")
        extras = [n for n in extras if _own_extra(stem, n, pages)]
        links = ", ".join(f"[{n[len(stem) :].lstrip('-') or n}]({n})" for n in extras)
        lines.append(f"| {page[:10]} | [{stem[11:]}]({page}) | {links} |")
    return "\n".join(lines) + "\n"


def _own_extra(stem: str, name: str, pages: list[str]) -> bool:
    """Whether ``name`` (a plot or data file) belongs to the result ``stem`` and not to a
    result whose name is longer and starts the same."""
    longer = [p[:-3] for p in pages if p[:-3] != stem and p[:-3].startswith(stem)]
    return not any(name.startswith(other) for other in longer)
