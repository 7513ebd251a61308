"""Where gpudeck keeps its state (runs) and finds its config (jobs.toml), per XDG."""
from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """Root of run directories: $GPUDECK_STATE_DIR, else $XDG_STATE_HOME/gpudeck."""
    explicit = os.environ.get("GPUDECK_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "gpudeck"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "gpudeck"


def find_jobs_file(explicit: str | None = None) -> Path | None:
    """--jobs FILE, then $GPUDECK_JOBS, then ./jobs.toml, then the XDG config dir.

    An explicit path is returned even if missing, so the caller can say so.
    """
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("GPUDECK_JOBS")
    if env:
        return Path(env).expanduser()
    for candidate in (Path.cwd() / "jobs.toml", config_dir() / "jobs.toml"):
        if candidate.is_file():
            return candidate
    return None


def child_launch(env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(cwd, env) for a `python -m gpudeck.jobs...` child (runner, pipeline) that must import gpudeck as we did.

    Installed or from a checkout, the package directory is the cwd. Inside the agent
    zipapp on a remote box there is no directory: the child gets the archive on
    PYTHONPATH instead.
    """
    import sys
    root = Path(__file__).resolve().parent.parent
    if root.is_dir():
        return str(root), env
    here = str(Path(__file__))
    archive = next((p for p in sys.path if p and os.path.isfile(p) and here.startswith(p)), None)
    if archive is None:
        return "/", env
    env = dict(env)
    env["PYTHONPATH"] = archive + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return "/", env
