"""Is an engine ready? Its log said so, its port listens, and its health endpoint answers 200.

Stdlib only (urllib, socket), short timeouts; callers run it off the UI thread.
"""
from __future__ import annotations

import os
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from gpudeck.jobs.engines.profiles import EngineSettings

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class LogLineWatcher:
    """Follows a log by byte offset and remembers whether any of `needles` has appeared.

    tqdm bars arrive as `\\r`-separated updates and a record can be glued onto the last
    one, so the text is searched as a stream, not line by line.
    """

    def __init__(self, path: Path, needles: tuple[str, ...]) -> None:
        self.path = Path(path)
        self.needles = tuple(needles)
        self.offset = 0
        self.seen: Optional[str] = None
        self._tail = ""               # a needle may straddle two reads

    def poll(self) -> bool:
        if self.seen is not None:
            return True
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        if size < self.offset:        # truncated or replaced: start again
            self.offset, self._tail = 0, ""
        if size == self.offset:
            return False
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(min(size - self.offset, 8 << 20))
        self.offset += len(data)
        text = self._tail + _ANSI.sub("", data.decode("utf-8", "replace"))
        for needle in self.needles:
            if needle in text:
                self.seen = needle
                return True
        longest = max((len(n) for n in self.needles), default=0)
        self._tail = text[-longest:] if longest else ""
        return False


def port_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_get(url: str, timeout: float = 2.0) -> tuple[Optional[int], str]:
    """(status, body) — status None when nothing answered; body is at most 4 MiB."""
    req = urllib.request.Request(url, headers={"User-Agent": "gpudeck"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(4 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(4096).decode("utf-8", "replace")
        except Exception:
            body = ""
        return exc.code, body
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


@dataclass(frozen=True)
class Readiness:
    log_ready: bool
    port_listening: bool
    health_status: Optional[int]        # None: not asked or nothing answered
    detail: str

    @property
    def ready(self) -> bool:
        return self.log_ready and self.port_listening and self.health_status == 200


def check_readiness(settings: EngineSettings, watcher: Optional[LogLineWatcher],
                    *, timeout: float = 2.0) -> Readiness:
    log_ready = watcher.poll() if watcher is not None else False
    listening = port_listening(settings.host, settings.port, timeout=min(timeout, 0.5))
    status: Optional[int] = None
    if listening:
        status, _ = http_get(settings.url(settings.health_path), timeout=timeout)
    line = settings.profile.ready_lines[0]
    if not log_ready and not listening:
        detail = f"loading: no '{line}' in the log yet, port {settings.port} not listening"
    elif not listening:
        detail = f"log says ready but port {settings.port} is not listening"
    elif status != 200:
        got = "no answer" if status is None else f"HTTP {status}"
        detail = f"port {settings.port} listens, {settings.health_path} gave {got}"
    elif not log_ready:
        detail = f"{settings.health_path} is 200 but the log has not said '{line}' yet"
    else:
        detail = f"ready on port {settings.port}"
    return Readiness(log_ready, listening, status, detail)


def wait_until_ready(settings: EngineSettings, log_path: Path, *, deadline_s: float,
                     alive: Callable[[], bool] = lambda: True, poll_s: float = 0.25,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Readiness:
    """Poll until ready, the process dies, or the deadline passes; returns the last Readiness."""
    watcher = LogLineWatcher(log_path, settings.profile.ready_lines)
    end = clock() + deadline_s
    while True:
        state = check_readiness(settings, watcher)
        if state.ready:
            return state
        if not alive():
            return Readiness(state.log_ready, state.port_listening, state.health_status,
                             "the engine exited before it was ready")
        if clock() >= end:
            return Readiness(state.log_ready, state.port_listening, state.health_status,
                             f"not ready after {deadline_s:.0f} s: {state.detail}")
        sleep(poll_s)
