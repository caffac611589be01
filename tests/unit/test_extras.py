"""The package's optional parts: a feature whose extra is missing fails on import with one
MissingExtra that names the extra to install (#49)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from raydelay import _extras
from raydelay.errors import MissingExtra, RaydelayError


def test_a_missing_module_names_its_extra(monkeypatch):
    monkeypatch.setitem(
        _extras.EXTRAS, "spark", ("Spark ingestion", ("pyspark", "no_such_module_here"))
    )
    with pytest.raises(MissingExtra) as info:
        _extras.require("spark")
    text = str(info.value)
    assert "pip install 'raydelay[spark]'" in text
    assert "'no_such_module_here'" in text and "'pyspark'" not in text
    assert info.value.name == "no_such_module_here"
    assert isinstance(info.value, ImportError) and isinstance(info.value, RaydelayError)


def test_present_modules_pass_and_a_subset_is_checked_alone(monkeypatch):
    monkeypatch.setitem(_extras.EXTRAS, "console", ("the console", ("json", "no_such_module")))
    _extras.require("console", "json")  # only the module asked for
    assert _extras.missing("console") == ["no_such_module"]


def test_every_extra_of_the_package_is_known_here():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for name, (_, modules) in _extras.EXTRAS.items():
        declared = " ".join(extras[name])
        for module in modules:
            assert module in declared, (name, module)


def test_the_core_imports_no_extra():
    # a fresh interpreter: connect's modules, the CLI's parser and the tasks load without
    # importing Spark or the web stack
    code = (
        "import sys, raydelay, raydelay.client.connection, raydelay.cli.parser, raydelay.tasks;"
        "print(sorted(m for m in ('pyspark', 'raydp', 'fastapi', 'uvicorn', 'jinja2') if m in sys.modules))"
    )
    out = subprocess.check_output([sys.executable, "-c", code], text=True)
    assert out.strip() == "[]"
