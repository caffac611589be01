"""Optional parts of raydelay (the package's extras) and the one error for a missing one.

The core (``connect``, producers, consumers, scheduled calls, the CLI) needs only what
``pip install raydelay`` installs. Spark ingestion, the web console and the HTTP API need an extra; their
modules call :func:`require` when they are imported, so a missing extra is one clear
:class:`~raydelay.errors.MissingExtra` naming what to install, not a bare
``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import importlib.util

from raydelay.errors import MissingExtra

# extra -> (what it is for, the modules it brings)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "spark": (
        "Spark ingestion (raydelay.ingest, `raydelay ingest`, `raydelay demo`)",
        ("pyspark", "raydp"),
    ),
    "http": (
        "the HTTP API (raydelay.http, `raydelay serve`)",
        ("fastapi", "uvicorn"),
    ),
    "console": (
        "the web console (raydelay.web, `raydelay console`)",
        ("fastapi", "uvicorn", "jinja2"),
    ),
}


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (or the given subset) that cannot be imported here."""
    wanted = EXTRAS[extra][1] if modules is None else modules
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def require(extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` (or just ``modules``) is
    importable."""
    absent = missing(extra, modules or None)
    if absent:
        what = EXTRAS[extra][0]
        raise MissingExtra(
            f"{what} needs raydelay's [{extra}] extra, which is not installed here "
            f"(no module {', '.join(repr(m) for m in absent)}): pip install 'raydelay[{extra}]'"
            " (or 'raydelay[all]')",
            name=absent[0],
        )
