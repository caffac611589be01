"""docs/design.md's layer table names every first-level package of raydelay, in an order
its imports keep: a package imports only packages listed before it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layers import layer_edges

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "raydelay"


def _table_order() -> list[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## The layers") : text.index("## Formats")]
    return re.findall(r"^\| [^|]*\| `(\w+)` \|", table, re.M)


def _units() -> set[str]:
    found = {p.stem for p in PKG.glob("*.py") if p.name != "__init__.py"}
    # a package may have no __init__.py (dispatch is a namespace package)
    return found | {p.name for p in PKG.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def test_the_table_names_each_package_once():
    order = _table_order()
    assert len(order) == len(set(order))
    assert set(order) == _units()


def test_a_package_imports_only_packages_listed_before_it():
    order = _table_order()
    later = [
        f"{src} -> {dst}"
        for src, dsts in layer_edges(PKG).items()
        for dst in dsts
        if order.index(dst) > order.index(src)
    ]
    assert later == []
