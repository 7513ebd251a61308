"""`pip install .` into a fresh venv that already has PyPI's `console` and `themes`: all three keep working.

gpudeck installs as gpudeck.jobs / gpudeck.console / gpudeck.themes (package-dir mapping), so it
never shadows the PyPI packages named `console` and `themes`. Slow: it builds a venv and installs
real distributions from the configured package index.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeck.jobs import __version__

REPO = Path(__file__).resolve().parent.parent
SOURCE = ("pyproject.toml", "setup.py", "README.md", "entry", "jobs", "console", "themes")

pytestmark = pytest.mark.slow


def run(argv: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, f"{' '.join(out.args)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict:
    """A fresh venv (no system site-packages) with PyPI's console and themes, then gpudeck from a copy of this tree."""
    root = tmp_path_factory.mktemp("packaging")
    env_dir = root / "venv"
    # This pip installs into the venv (`--python`): no pip of its own to bootstrap (~5 s). No .pyc
    # compiling either (themes brings pandas and numpy, ~10 s of it): what is installed, and where,
    # is the same.
    ok(run([sys.executable, "-m", "venv", "--without-pip", env_dir], cwd=root))
    py = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "--no-compile"]
    theirs = run([*pip, "console", "themes"], cwd=root)
    if theirs.returncode != 0:
        pytest.skip(f"PyPI's console/themes cannot be installed here: {theirs.stderr.strip().splitlines()[-1:]}")
    src = root / "src"          # a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(REPO / name, src / name)
    ok(run([*pip, src], cwd=root))
    site = Path(ok(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)).strip())
    return {"root": root, "py": py, "bin": env_dir / "bin", "site": site}


def test_pypi_console_still_works(venv):
    out = ok(run([venv["py"], "-c",
                  "import console\nfrom console import fg\nfrom console.constants import CSI\n"
                  "assert CSI == '\\x1b[' and callable(fg.red)\nprint(console.__file__)"], cwd=venv["root"]))
    assert Path(out.strip()) == venv["site"] / "console" / "__init__.py"


def test_pypi_themes_still_works(venv):
    out = ok(run([venv["py"], "-c",
                  "import themes\nfrom themes.registrar import custom_themes\n"
                  "themes.register(include=[])\nassert isinstance(custom_themes, dict)\nprint(themes.__file__)"],
                 cwd=venv["root"]))
    assert Path(out.strip()) == venv["site"] / "themes" / "__init__.py"


def test_gpudeck_works_beside_them(venv):
    assert ok(run([venv["bin"] / "gpudeck", "--version"], cwd=venv["root"])).strip() == f"gpudeck {__version__}"
    assert ok(run([venv["py"], "-m", "gpudeck", "--version"], cwd=venv["root"])).strip() == f"gpudeck {__version__}"
    out = ok(run([venv["py"], "-c", "import gpudeck.jobs.runner as r, gpudeck.console.cli as c\n"
                                    "print(r.__file__); print(c.__file__)"], cwd=venv["root"]))
    for path in out.split():
        assert Path(path).is_relative_to(venv["site"] / "gpudeck"), path
    status = json.loads(ok(run([venv["bin"] / "gpudeck", "--demo", "status", "--json"], cwd=venv["root"])))
    assert status["simulated"] is True and len(status["gpus"]) == 8
    # The demo's recordings are installed whole: the deadlock's recorded stack dump too (D shows it).
    dumps = sorted(p.name for p in (venv["site"] / "gpudeck" / "jobs" / "demo_runs").glob("*/*/stacks/*"))
    assert dumps == sorted(p.name for p in (REPO / "jobs" / "demo_runs").glob("*/*/stacks/*")) and dumps


def test_gpudeck_owns_only_its_own_names(venv):
    records = list(venv["site"].glob("gpudeck-*.dist-info/RECORD"))
    assert len(records) == 1
    tops = {line.split(",")[0].split("/")[0] for line in records[0].read_text().splitlines() if line}
    assert tops <= {"gpudeck", records[0].parent.name, ".."}, tops    # "..": the bin/gpudeck script
    assert {p.name for p in (venv["site"] / "gpudeck").iterdir()} >= {"jobs", "console", "themes"}
    assert not (venv["site"] / "jobs").exists()


def test_python_dash_m_gpudeck_runs_the_cli_from_the_checkout():
    out = run([sys.executable, "-m", "gpudeck", "--demo", "status", "--json"], cwd=REPO)
    assert json.loads(ok(out))["simulated"] is True


def test_textual_past_the_checked_minor_release_is_not_admitted():
    """The console touches Textual internals checked against one minor release; pip must not pick the next."""
    from packaging.requirements import Requirement
    try:
        import tomllib
    except ModuleNotFoundError:                       # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "textual")
    tested = next(Requirement(r) for r in project["optional-dependencies"]["test"] if Requirement(r).name == "textual")
    pinned = next(iter(tested.specifier)).version
    assert runtime.specifier.contains(pinned), (runtime, pinned)
    major, minor = (int(part) for part in pinned.split(".")[:2])
    assert not runtime.specifier.contains(f"{major}.{minor + 1}.0"), runtime
    assert not runtime.specifier.contains(f"{major + 1}.0.0"), runtime
