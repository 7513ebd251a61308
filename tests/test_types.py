"""mypy finds no error in gpudeck.jobs and gpudeck.console, at the strictness [tool.mypy] sets."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOPS = ("jobs", "console", "themes")


def shim_tree() -> Path:
    """A gpudeck/ tree of symlinks to the repository's folders: mypy cannot follow the editable
    install's package-dir finder (gpudeck.jobs lives in jobs/). One fixed place per checkout, so
    mypy's cache (next to it) stays valid from run to run: ~20 s cold, a few seconds warm."""
    base = Path(tempfile.gettempdir()) / f"gpudeck-mypy-{hashlib.sha1(str(REPO).encode()).hexdigest()[:12]}"
    package = base / "tree" / "gpudeck"
    package.mkdir(parents=True, exist_ok=True)
    for top in TOPS:
        link = package / top
        if link.is_symlink() and Path(os.readlink(link)) == REPO / top:
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(REPO / top, target_is_directory=True)
    return base


def test_mypy_finds_no_error():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy missing: install the test extra (pip install -e '.[test]')")
    base = shim_tree()
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(base / "cache"),
         "-p", "gpudeck.jobs", "-p", "gpudeck.console"],
        cwd=base / "tree", capture_output=True, text=True, timeout=240)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    checked = re.search(r"Success: no issues found in (\d+) source files", report)
    assert checked and int(checked.group(1)) >= 100, report      # guards against checking nothing
