"""raydelay as PyPI would ship it (#49): the sdist and the wheel build and pass
``twine check``; the wheel declares only the core as dependencies; installed alone into a
clean venv (not ``-e``) it runs the docs' examples, with the newest and with the oldest Ray
line that ``pyproject.toml`` supports.

The venvs are made with this interpreter and filled by pip from the package index (its
cache makes a second run quick); each smoke run has a Ray of its own (``own_ray_env``)."""

from __future__ import annotations

import email
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import raydelay

ROOT = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("smoke.py")
PIP = [
    "-m",
    "pip",
    "install",
    "--quiet",
    "--disable-pip-version-check",
    "--no-input",
    "--no-compile",  # (a third of the install's time; what the smoke run imports compiles then)
]
LINES = ("newest", "oldest")

pytestmark = pytest.mark.timeout(900)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def ray_lines() -> tuple[str, str]:
    """(oldest, newest) Ray minor line of the range the package declares, e.g. ("2.52", "2.60")."""
    spec = next(d for d in _project()["dependencies"] if d.startswith("ray["))
    low = re.search(r">=\s*(\d+)\.(\d+)", spec)
    high = re.search(r"<\s*(\d+)\.(\d+)", spec)
    assert low and high, f"the Ray requirement has no closed range: {spec}"
    return f"{low[1]}.{low[2]}", f"{high[1]}.{int(high[2]) - 1}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # an isolated build, as a release would make it (setuptools comes from the index)
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("raydelay-*.whl")
    return wheel


def test_the_sdist_and_the_wheel_pass_twine_check(dist):
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_declares_the_core_and_its_extras(dist):
    with zipfile.ZipFile(_wheel(dist)) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(info))
    assert "raydelay/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "raydelay/web/templates/base.html" in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    assert meta["Version"] == raydelay.__version__  # one home: raydelay/__init__.py
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert set(meta.get_all("Provides-Extra")) >= {
        "spark",
        "console",
        "http",
        "all",
        "dev",
        "bench",
    }
    requires = meta.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    for heavy in ("pyspark", "raydp", "fastapi", "uvicorn", "jinja2"):
        assert not any(r.startswith(heavy) for r in core), (heavy, core)
    assert any(r.startswith("pyspark") and 'extra == "spark"' in r for r in requires)
    assert any(r.startswith("fastapi") and 'extra == "console"' in r for r in requires)
    assert any(r.startswith("ray[serve]") and 'extra == "http"' in r for r in requires)


def test_the_ray_range_is_the_one_the_docs_name():
    oldest, newest = ray_lines()
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert f"Ray {oldest}" in page and f"Ray {newest}" in page


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin" / "python"


def _want(line: str) -> str:
    oldest, newest = ray_lines()
    return newest if line == "newest" else oldest


@pytest.fixture(scope="module")
def venvs(dist, tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """A clean venv per Ray line with the wheel installed, the two filled at once (pip
    unpacking and writing is most of a fill, and the other core is idle meanwhile); per
    line, its interpreter and how its install ended."""
    fills = {}
    for line in LINES:
        python = _venv(tmp_path_factory.mktemp(f"venv-{line}"))
        pins = [f"ray[default]=={_want(line)}.*"]
        fills[line] = (
            python,
            subprocess.Popen(
                [str(python), *PIP, str(_wheel(dist)), *pins],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    out = {}
    for line, (python, proc) in fills.items():
        stdout, stderr = proc.communicate()
        out[line] = (
            python,
            subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
        )
    return out


@pytest.mark.parametrize("line", LINES)
def test_the_wheel_alone_in_a_clean_venv_runs_the_docs_examples(line, venvs, tmp_path, own_ray_env):
    want = _want(line)
    python, done = venvs[line]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    assert (site / "raydelay").is_dir()
    for absent in ("pyspark", "raydp", "fastapi", "uvicorn", "jinja2"):
        assert not (site / absent).exists(), f"{absent} was installed by the core package"
    size_mb = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 2**20
    print(f"\n{line} Ray line: the core install is {size_mb:.0f} MB (pyspark alone is 345 MB)")

    env = {k: v for k, v in own_ray_env.items() if not k.startswith("RAYDELAY_")}
    done = subprocess.run(
        [str(python), str(SMOKE), str(ROOT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran["ray"].startswith(want + "."), ran
    assert ran["raydelay"] == raydelay.__version__
    assert ran["examples"] >= 3
    print(f"{line} Ray line: {ran}")
