"""Runs one on_alert command outside the run that raised the alert: its own session, a deadline, a line when it is cut short.

Started by the run's HealthMonitor as `python -m gpudeck.jobs.alert_hook SECONDS RUN_DIR COMMAND`
in a new session. The runner records the session in hooks.jsonl so that neither the
runner's leftover cleanup nor `gpudeck stop` counts the hook as part of the job: an
alert about a crash is delivered even though the job is being cleaned up, and the
hook outlives the runner. The command gets SECONDS, then SIGTERM, then SIGKILL 5 s
later. Stdlib only, like the runner.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

KILL_AFTER_S = 5.0
SHELLS = ("bash", "/bin/sh")


def run_hook(command: str, timeout: float) -> int:
    child = None
    for shell in SHELLS:
        try:
            # Its own process group inside this session, so a timeout takes its children too.
            child = subprocess.Popen([shell, "-c", command], stdin=subprocess.DEVNULL,
                                     preexec_fn=os.setpgrp)
            break
        except FileNotFoundError:
            continue
    if child is None:
        print("gpudeck: on_alert: no shell to run it", flush=True)
        return 127
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    print(f"gpudeck: on_alert: still running after {timeout:g} s; terminated", flush=True)
    for sig, wait_s in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, KILL_AFTER_S)):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            child.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    return 124


def _leave_run_cgroup() -> None:
    """Born in the run's cgroup (the runner is in it): move to the one above, so the hook is not the run's."""
    from gpudeck.jobs import cgroups
    here = cgroups.current_cgroup()
    if here and here.rstrip("/").rsplit("/", 1)[-1].startswith("gpudeck-"):
        cgroups.leave(here.rstrip("/").rsplit("/", 1)[0] or "/")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python -m gpudeck.jobs.alert_hook SECONDS RUN_DIR COMMAND", file=sys.stderr)
        return 2
    try:
        timeout = float(args[0])
    except ValueError:
        timeout = 60.0
    started = time.time()
    _leave_run_cgroup()
    code = run_hook(args[2], timeout)
    if code not in (0, 124):
        print(f"gpudeck: on_alert exited {code} after {time.time() - started:.1f} s", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
