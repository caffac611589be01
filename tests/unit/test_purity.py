"""The pure core (raydelay/delayed, raydelay/dispatch) never imports ray or boto3.

Two checks: a static walk of the import graph with ``ast`` (a module of the core
may not import a forbidden package anywhere, nor import a raydelay module that
does so when it is imported), and a runtime check in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "raydelay"
PURE = ("delayed", "dispatch", "log")
PURE_MODULES = (
    "cluster/metadata.py",
    "cluster/assignments.py",
    "ingest/rows.py",
)  # pure modules in packages that also hold Ray code
FORBIDDEN = {"ray", "boto3", "botocore"}


def module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    base = PKG.joinpath(*parts)
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, *, anywhere: bool) -> set[str]:
    """Absolute module names imported by the file (module level only unless ``anywhere``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    nodes = ast.walk(tree) if anywhere else _module_level(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for alias in node.names:  # "from raydelay.x import y" may name a submodule y
                found.add(f"{mod}.{alias.name}")
    return found


def _module_level(tree: ast.Module):
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def forbidden_paths(start: Path) -> list[list[str]]:
    """Import chains from ``start`` to a forbidden package."""
    bad: list[list[str]] = []
    seen: set[str] = set()
    stack: list[tuple[str, list[str], bool]] = [(module_name(start), [module_name(start)], True)]
    while stack:
        name, chain, anywhere = stack.pop()
        path = module_file(name)
        if path is None:
            continue
        for imported in imports_of(path, anywhere=anywhere):
            top = imported.split(".")[0]
            if top in FORBIDDEN:
                bad.append(chain + [imported])
            elif top == "raydelay":
                for mod in with_parents(imported):
                    if mod not in seen and module_file(mod) is not None:
                        seen.add(mod)
                        stack.append((mod, chain + [mod], False))
    return bad


def pure_modules() -> list[Path]:
    found = [p for sub in PURE if (PKG / sub).exists() for p in sorted((PKG / sub).rglob("*.py"))]
    return found + [PKG / m for m in PURE_MODULES if (PKG / m).exists()]


def test_the_walk_covers_the_delayed_index():
    names = {module_name(p) for p in pure_modules()}
    assert {
        "raydelay.delayed.tracker",
        "raydelay.delayed.memory",
        "raydelay.delayed.reader",
    } <= names
    assert {
        "raydelay.dispatch.subscription",
        "raydelay.dispatch.cursor",
        "raydelay.log.partition",
        "raydelay.cluster.metadata",
        "raydelay.cluster.assignments",
    } <= names


def test_no_pure_module_reaches_ray_or_boto3_through_the_import_graph():
    problems = {str(p.relative_to(PKG)): forbidden_paths(p) for p in pure_modules()}
    problems = {k: v for k, v in problems.items() if v}
    assert problems == {}, f"forbidden import chains: {problems}"


def test_the_walker_catches_a_forbidden_import(tmp_path, monkeypatch):
    # Given a fake package whose pure module imports a helper that imports boto3
    fake = tmp_path / "raydelay"
    (fake / "delayed").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "delayed" / "__init__.py").write_text("from raydelay import helper\n")
    (fake / "helper.py").write_text("import boto3\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    # then the walker reports the chain
    chains = forbidden_paths(fake / "delayed" / "__init__.py")
    assert chains == [["raydelay.delayed", "raydelay.helper", "boto3"]]


def test_importing_the_pure_core_loads_neither_ray_nor_boto3_at_runtime():
    code = (
        "import sys\n"
        "import importlib, pkgutil, raydelay\n"
        f"for sub in {PURE!r}:\n"
        "    try:\n"
        "        pkg = importlib.import_module('raydelay.' + sub)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        f"for m in {[m[:-3].replace('/', '.') for m in PURE_MODULES]!r}:\n"
        "    importlib.import_module('raydelay.' + m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
