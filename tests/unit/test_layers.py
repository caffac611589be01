"""The packages of raydelay form layers: no two of them import each other.

The unit is a first-level package or module of ``raydelay`` (``delayed``, ``log``,
``dispatch``, ``cluster``, ``positions``...). An import anywhere in a file counts (also one
inside a function), except under ``if TYPE_CHECKING:``, which never runs. A cycle between
two units, direct or through others, fails the test with the imports that make it.

A runtime check adds what the static walk cannot see: importing the pure core, the store
or the metadata journal loads neither Ray, nor the config module, nor dispatch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "raydelay"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _runtime_imports(path: Path, me: str) -> set[str]:
    """Absolute module names the file imports, wherever, except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)
    return found


def _unit(root: Path, module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != root.name:
        return None
    name = parts[1]
    return name if (root / name).is_dir() or (root / f"{name}.py").exists() else None


def layer_edges(root: Path) -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the imports ("module -> imported") that make the edge."""
    edges: dict[str, dict[str, set[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        me = _module_name(root, path)
        src = _unit(root, me)
        if src is None:
            continue
        for imported in _runtime_imports(path, me):
            dst = _unit(root, imported)
            if dst is not None and dst != src:
                edges.setdefault(src, {}).setdefault(dst, set()).add(f"{me} -> {imported}")
    return edges


def cycles(root: Path) -> dict[tuple[str, str], list[str]]:
    """Pairs of units that reach each other, with the direct imports between them."""
    edges = layer_edges(root)

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        stack = [start]
        while stack:
            for nxt in edges.get(stack.pop(), {}):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    units = sorted(set(edges) | {d for e in edges.values() for d in e})
    reached = {u: reach(u) for u in units}
    out: dict[tuple[str, str], list[str]] = {}
    for i, a in enumerate(units):
        for b in units[i + 1 :]:
            if b in reached[a] and a in reached[b]:
                direct = edges.get(a, {}).get(b, set()) | edges.get(b, {}).get(a, set())
                out[(a, b)] = sorted(direct)
    return out


def test_the_walk_sees_the_packages_and_their_edges():
    edges = layer_edges(PKG)
    assert {"delayed", "dispatch", "log", "cluster", "actors", "client"} <= set(edges)
    assert "positions" in edges["dispatch"] and "positions" in edges["log"]
    assert "log" in edges["delayed"]  # the delayed index reads log objects


def test_no_two_packages_import_each_other():
    found = cycles(PKG)
    assert found == {}, "import cycles between packages:\n" + "\n".join(
        f"  {a} <-> {b}: {', '.join(imports) or '(through other packages)'}"
        for (a, b), imports in found.items()
    )


def test_the_walk_finds_a_cycle_through_a_third_package_and_skips_type_checking(tmp_path):
    root = tmp_path / "raydelay"
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "x.py").write_text("from raydelay.b import y\n")
    (root / "b" / "y.py").write_text("def f():\n    from raydelay.c import z\n")
    (root / "c" / "z.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raydelay.b import y\n"
    )
    assert cycles(root) == {}  # c -> b only for type checkers
    (root / "c" / "z.py").write_text("import raydelay.a.x\n")
    found = cycles(root)
    assert set(found) == {("a", "b"), ("a", "c"), ("b", "c")}
    assert found[("a", "b")] == ["raydelay.a.x -> raydelay.b", "raydelay.a.x -> raydelay.b.y"]


def test_the_core_store_and_journal_load_neither_ray_nor_config_nor_dispatch():
    code = (
        "import sys\n"
        "import raydelay.delayed, raydelay.delayed.store, raydelay.delayed.sealed\n"
        "import raydelay.log.partition, raydelay.storage, raydelay.cluster.metadata\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'boto3')\n"
        "             or m in ('raydelay.config',) or m.startswith('raydelay.dispatch'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
