"""Fixtures shared by every test directory: a private GPUDECK_STATE_DIR whose processes die with the test; the UTC zone.

The plain helpers (wait_for, pilot_wait_for, pilot_test, write_jobs, cli) are in tests/runsupport.py;
this directory is on sys.path because pytest loads this conftest in its default (prepend) import mode.
"""
from __future__ import annotations

import time

import pytest

from runsupport import cleanup_state


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A private GPUDECK_STATE_DIR for one test; everything started under it is killed afterwards."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("GPUDECK_STATE_DIR", str(state_dir))
    for key in ("GPUDECK_RUN_ID", "GPUDECK_JOB", "GPUDECK_JOBS"):
        monkeypatch.delenv(key, raising=False)
    yield state_dir
    cleanup_state(state_dir)


@pytest.fixture
def utc(monkeypatch):
    """Local time is UTC for the test: what prints dates or a clock (the SVG snapshots) does not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
