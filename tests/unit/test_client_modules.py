"""The modules of ``raydelay.client`` form layers too: each imports the ones it needs at
the top, none inside a function (which would hide a cycle), and no two of them import
each other, directly or through others. ``if TYPE_CHECKING:`` imports (annotations only)
do not count."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "raydelay" / "client"


def _imports_in_functions(tree: ast.Module) -> list[int]:
    return [
        node.lineno
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


def _client_imports(tree: ast.Module) -> set[str]:
    """The client modules a module imports at its top level."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "raydelay.client":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("raydelay.client."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[2] for a in node.names if a.name.startswith("raydelay.client.")
            )
    return found


def test_no_client_module_imports_inside_a_function():
    inner = {
        path.name: lines
        for path in sorted(CLIENT.glob("*.py"))
        if (lines := _imports_in_functions(ast.parse(path.read_text())))
    }
    assert inner == {}


def test_the_client_modules_form_a_dag():
    graph = {
        path.stem: _client_imports(ast.parse(path.read_text()))
        for path in sorted(CLIENT.glob("*.py"))
    }
    assert {"connection", "topics", "operations", "tasks", "runner", "redrive"} <= set(graph)
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError on a cycle
    # the facade sits on its parts, and the runners on the topics side, not on the facade
    assert order.index("connection") > order.index("tasks") > order.index("runner")
    assert "connection" not in graph["runner"] and "tasks" not in graph["runner"]
