"""A real headless Chromium for the HTML tests: installed from Debian's `chromium` package when missing, run with a throwaway profile and no network."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars"]
# What Chromium writes to stderr (with --enable-logging=stderr) for a page's console messages
# and uncaught errors, and for resources the page could not load.
_PAGE_PROBLEM = re.compile(r'(CONSOLE\(\d+\)|:CONSOLE:|Uncaught|Refused to|net::ERR_|Failed to load resource)')


def _find() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    """The chromium binary, apt-installing Debian's package if it is not there (skip with the reason if it cannot be)."""
    found = _find()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = (["apt-get", "update", "-qq"],
             ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", "chromium"])
    for step in steps:
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 and step[1] == "install":
            pytest.skip(f"chromium could not be installed: {' '.join(step)} -> {done.stderr.strip()[-300:]}")
    found = _find()
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


@dataclass
class PageResult:
    dom: str
    problems: list[str]          # console errors, uncaught exceptions, blocked or failed loads
    stderr: str


class Browser:
    def __init__(self, binary: str) -> None:
        self.binary = binary

    def _run(self, extra: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="gpudeck-chromium-") as profile:
            return subprocess.run([self.binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                                  capture_output=True, text=True, timeout=timeout)

    def load(self, path: Path) -> PageResult:
        """Render the file, return its DOM after load and every console/network problem the page logged."""
        done = self._run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom"],
                         Path(path).resolve().as_uri())
        problems = [line for line in done.stderr.splitlines() if _PAGE_PROBLEM.search(line)]
        return PageResult(dom=done.stdout, problems=problems, stderr=done.stderr)

    def screenshot(self, path: Path, png: Path, width: int = 1000, height: int = 2600) -> Path:
        done = self._run([f"--screenshot={png}", f"--window-size={width},{height}", "--virtual-time-budget=3000"],
                         Path(path).resolve().as_uri())
        assert png.exists() and png.stat().st_size > 0, f"no screenshot: {done.stderr[-500:]}"
        return png


@pytest.fixture(scope="session")
def browser() -> Browser:
    return Browser(ensure_chromium())
