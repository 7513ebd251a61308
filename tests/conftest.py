"""Fixtures shared by every test directory: a private GPUDECK_STATE_DIR whose processes die with the test; the UTC zone.

The plain helpers (wait_for, pilot_wait_for, pilot_test, write_jobs, cli) are in tests/runsupport.py;
this directory is on sys.path because pytest loads this conftest in its default (prepend) import mode.
"""
from __future__ import annotations

import time

import pytest

from runsupport import cleanup_state


# Tests that share a machine-wide real part run on one xdist worker, one after another:
# - "slurm": the one test cluster (a fixed directory under /tmp, a machine-wide lock);
# - "gpu": the real GPUs (tests/gpu reads utilization and memory that any other GPU test moves);
# - "engines": whatever starts an engine (a real vLLM, the SGLang stand-in) or scans the box for
#   engines and ports, so no scan sees another test's engine and no pivot stops one.
# Everything else (private state dirs, its own sshd ports, kernel-picked ports) runs on any worker.
MACHINE_GROUPS = (
    ("slurm", ("tests/slurm/",)),
    ("gpu", ("tests/gpu/",)),          # the box's GPUs: one test's kernel would be another's "busy GPU"
    ("engines", ("tests/engines/", "tests/ssh/test_ssh_commands.py", "tests/ssh/test_box_parity.py::test_pivot",
                 "tests/test_jobs_watch.py", "tests/test_status_cli.py", "tests/test_cli_startup.py",
                 "tests/test_console_jobs.py")),
    # Not machine-wide but ordered: the parity tests share a module's deck, whose `sleeper` test_start
    # starts, test_stop stops and test_restart expects stopped; split over workers, each worker's
    # deck saw only part of that story ("sleeper is already running").
    ("parity", ("tests/ssh/test_box_parity.py",)),
)


def machine_group(nodeid: str):
    for group, prefixes in MACHINE_GROUPS:
        if nodeid.startswith(prefixes):
            return group
    return None


VLLM_INSTALL_TIMEOUT_S = 900


@pytest.hookimpl(tryfirst=True)        # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Tests marked `late` run after every other test of the session, in their own order: each judges a
    real clock that a session fixture started early (Slurm's 1-minute time limit), so the rest of the
    suite runs while it ticks instead of the suite waiting for it. Tests of a machine-wide part are
    marked with its xdist group."""
    for item in items:
        group = machine_group(item.nodeid)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if "vllm_env" in getattr(item, "fixturenames", ()):
            # The first of them installs the CPU vLLM (~1.5 min on a quiet machine, past 300 s beside
            # a loaded suite) and its setup counts in its timeout: the install's time is added.
            own = item.get_closest_marker("timeout")
            seconds = own.args[0] if own and own.args else (own.kwargs.get("timeout") if own else None)
            item.add_marker(pytest.mark.timeout(float(seconds or config.getini("timeout") or 300) + VLLM_INSTALL_TIMEOUT_S))
    late = [item for item in items if item.get_closest_marker("late")]
    if late:
        items[:] = [item for item in items if not item.get_closest_marker("late")] + late


@pytest.fixture(scope="session", autouse=True)
def no_user_config(tmp_path_factory):
    """The suite never reads the developer's own ~/.config/gpudeck: a config.toml with [notify.*] webhooks,
    `readonly = true` or a theme there would reach every job the tests start. Set in os.environ, so the
    runners and CLIs the tests start inherit it; a test that wants a config sets its own. Nor does it write
    the developer's ~/.cache/gpudeck (hyperscan databases, remote run records): a cache of its own."""
    import os
    saved = {key: os.environ.get(key) for key in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "GPUDECK_READONLY",
                                                  "GPUDECK_HOST")}
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ.pop("GPUDECK_READONLY", None)
    os.environ.pop("GPUDECK_HOST", None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
