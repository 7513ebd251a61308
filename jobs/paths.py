"""Where gpudeck keeps its state (runs) and finds its config (jobs.toml), per XDG."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Union


class UnsafeStateDir(Exception):
    """A state or run directory another user owns or could write: refused, never read or signalled from."""


def state_dir() -> Path:
    """Root of run directories: $GPUDECK_STATE_DIR, else $XDG_STATE_HOME/gpudeck."""
    explicit = os.environ.get("GPUDECK_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "gpudeck"


class NotARegularFile(OSError):
    """A path gpudeck was asked to read is a FIFO, a device, a socket: reading it could block or never end."""

    def __init__(self, path: Union[str, os.PathLike], mode: int) -> None:
        self.path = os.fspath(path)
        self.what = f"{_kind(mode)}, not a regular file"
        super().__init__(f"{self.path}: {self.what}")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "something else"


def check_regular(path: Union[str, os.PathLike]) -> None:
    """Raise NotARegularFile (FileNotFoundError if missing) unless `path` is a regular file; opens nothing."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotARegularFile(path, mode)


def open_regular(path: Union[str, os.PathLike]) -> BinaryIO:
    """Open a file for reading only if it is a regular file: never blocks on a FIFO, never reads /dev/zero.

    O_NONBLOCK makes opening a FIFO with no writer return at once; the check is on
    the opened fd (fstat), so the file cannot be swapped between check and read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "gpudeck"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/gpudeck (~/.cache/gpudeck): what gpudeck fetched and can fetch again (remote run records)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpudeck"


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
