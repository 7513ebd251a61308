"""The headless core never imports Textual or Rich; the runner side stays stdlib-only."""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpudeck.jobs as jobs

REPO = Path(__file__).resolve().parent.parent


def core_modules() -> list[str]:
    names = ["gpudeck.jobs"]
    for info in pkgutil.walk_packages(jobs.__path__, prefix="gpudeck.jobs."):
        names.append(info.name)
    return sorted(names)


def modules_loaded_by(module: str) -> set[str]:
    # A fresh interpreter per module: one module's imports must not hide another's.
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"importing {module} failed:\n{out.stderr}"
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_core_has_modules_to_check():
    # Guards the parametrisation below against silently checking nothing.
    assert len(core_modules()) >= 5


@pytest.mark.parametrize("module", core_modules())
def test_core_module_never_imports_textual_or_rich(module):
    loaded = modules_loaded_by(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in ("textual", "rich"))
    assert not leaked, f"{module} pulled in {leaked[:5]}"


# The runner (and what it runs each tick) must also work on a remote box with
# nothing but Python: no third-party import at all.
STDLIB_ONLY = ["gpudeck.jobs.runner", "gpudeck.jobs.procs", "gpudeck.jobs.runs", "gpudeck.jobs.logs.analyze",
               "gpudeck.jobs.logs.sanitize", "gpudeck.jobs.stalls", "gpudeck.jobs.health", "gpudeck.jobs.pipeline",
               "gpudeck.jobs.notify", "gpudeck.jobs.notify_targets",
               # the remote agent (shipped as a zipapp to boxes that may have nothing but Python)
               "gpudeck.jobs.hosts.agent", "gpudeck.jobs.hosts.protocol", "gpudeck.jobs.hosts.telemetry"]
THIRD_PARTY = ("psutil", "pynvml", "prometheus_client", "asyncssh", "textual", "rich")


@pytest.mark.parametrize("module", STDLIB_ONLY)
def test_runner_side_is_stdlib_only(module):
    if module not in core_modules():
        pytest.fail(f"{module} is expected to exist")
    loaded = modules_loaded_by(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in THIRD_PARTY)
    assert not leaked, f"{module} pulled in {leaked[:5]}"


def test_console_is_the_only_face():
    # The console may import the core; the reverse direction is what the tests above forbid.
    loaded = modules_loaded_by("gpudeck.console.cli")
    assert "gpudeck.jobs" in loaded
