"""The layer contracts in .importlinter hold (lint-imports, which sees function-local imports), and can break."""
from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_import_hygiene import STDLIB_ONLY

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / ".importlinter"
LINT = Path(sys.executable).with_name("lint-imports")      # import-linter, from the test extra


def lint(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.fail(f"{LINT} missing: install the test extra (pip install -e '.[test]')")
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([str(LINT), "--config", str(cwd / ".importlinter"), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def contracts() -> dict[str, configparser.SectionProxy]:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    prefix = "importlinter:contract:"
    return {name[len(prefix):]: parser[name] for name in parser.sections() if name.startswith(prefix)}


def entries(section: configparser.SectionProxy, key: str) -> list[str]:
    return [line.strip() for line in section.get(key, "").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_every_contract_is_kept():
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    kept = out.stdout.count(" KEPT")
    assert kept == len(contracts()) >= 5, out.stdout


def test_the_contracts_say_what_the_layers_are():
    c = contracts()
    headless = c["core-is-headless"]
    assert entries(headless, "source_modules") == ["gpudeck.jobs"]          # every core module, new ones too
    assert set(entries(headless, "forbidden_modules")) >= {"gpudeck.console", "gpudeck.themes", "textual", "rich"}

    runner = c["runner-side-stdlib-only"]
    sources = entries(runner, "source_modules")
    uncovered = [m for m in STDLIB_ONLY if not any(m == s or m.startswith(s + ".") for s in sources)]
    assert not uncovered, f"the runtime hygiene test's stdlib-only modules lack a static contract: {uncovered}"
    assert set(entries(runner, "forbidden_modules")) >= {"psutil", "pynvml", "prometheus_client", "asyncssh"}

    layers = c["core-layers"]
    assert entries(layers, "containers") == ["gpudeck.jobs"]
    rows = [{name.strip() for name in row.split("|")} for row in entries(layers, "layers")]
    bottom = next(i for i, row in enumerate(rows) if "spec" in row)
    assert rows[bottom] >= {"telemetry", "logs", "procs", "spec"}
    assert all(row <= {"paths"} for row in rows[bottom + 1:]), "only paths may sit under the bottom layer"
    assert len(rows) >= 5


def copy_tree(tmp_path: Path) -> Path:
    """The three packages as an importable gpudeck/ tree under tmp_path (found before the installed one)."""
    root = tmp_path / "tree"
    for top in ("jobs", "console", "themes"):
        shutil.copytree(REPO / top, root / "gpudeck" / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, root / ".importlinter")
    return root


# One violation each, all hidden inside a function, as 85 imports of the code base are.
VIOLATIONS = [
    ("jobs/procs.py", "import textual", "gpudeck.jobs is not allowed to import textual"),
    ("jobs/logs/sanitize.py", "import psutil", "is not allowed to import psutil"),
    ("jobs/procs.py", "from gpudeck.jobs import supervisor", "gpudeck.jobs.procs is not allowed to import"),
    ("jobs/added_later.py", "from gpudeck.console import cli", "gpudeck.jobs is not allowed to import gpudeck.console"),
    ("themes/__init__.py", "from gpudeck.console import cli", "is not allowed to import gpudeck.console"),
]


@pytest.mark.parametrize("path,statement,message", VIOLATIONS, ids=[v[0] + ":" + v[1] for v in VIOLATIONS])
def test_a_function_local_violation_breaks_a_contract(tmp_path, path, statement, message):
    root = copy_tree(tmp_path)
    target = root / "gpudeck" / path
    before = target.read_text() if target.exists() else '"""A module someone adds later."""\n'
    target.write_text(before + f"\n\ndef _violation():\n    {statement}  # noqa: F401\n")
    out = lint(root, pythonpath=str(root))
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout and message in out.stdout, out.stdout
    assert f"gpudeck.{path[:-3].replace('/', '.').removesuffix('.__init__')}" in out.stdout
