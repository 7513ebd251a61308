"""Helpers the tests import: jobs files, the real CLI, polling with deadlines (plain and under Pilot), cleanup of a state dir.

The fixtures built on them (`state`) live in tests/conftest.py.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from gpudeck.jobs import procs

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


_OOM_TRAINER = r"""
import sys, time
for i in range(1, STEPS + 1):
    print(f"epoch 1/1 step {i}/STEPS loss={2.5 - i * 0.1:.2f}", flush=True)
    time.sleep(PAUSE)
sys.stderr.write('''Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    loss = model(batch).loss
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.
''')
sys.exit(1)
"""


def oom_trainer(steps: int, pause_s: float) -> str:
    """A training script: `steps` progress lines `pause_s` apart, then a CUDA out-of-memory traceback and exit 1."""
    return _OOM_TRAINER.replace("STEPS", str(steps)).replace("PAUSE", str(pause_s))


def toml_str(text: str) -> str:
    return json.dumps(text)          # a JSON string is a valid TOML basic string


def own_cmdline() -> str:
    """This test process's command line as the telemetry joins it (`python -m pytest …`, or an xdist
    worker's `python -c …`): what a listing of this process must show."""
    with open("/proc/self/cmdline", "rb") as fh:
        argv = fh.read().decode("utf-8", "replace").split("\0")
    return " ".join(a for a in argv if a)


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_jobs(path: Path, jobs: dict[str, dict]) -> Path:
    """Write a jobs.toml from {name: {key: value}} (str, int, float, list of str/int, dict of str)."""
    lines = []
    for name, keys in jobs.items():
        lines.append(f"[jobs.{name}]")
        for key, value in keys.items():
            if isinstance(value, str):
                lines.append(f"{key} = {toml_str(value)}")
            elif isinstance(value, (list, tuple)):
                lines.append(f"{key} = [{', '.join(toml_str(v) if isinstance(v, str) else str(v) for v in value)}]")
            elif isinstance(value, dict):
                inline = ", ".join(f"{k} = {toml_str(str(v))}" for k, v in value.items())
                lines.append(f"{key} = {{ {inline} }}")
            else:
                lines.append(f"{key} = {value}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.05) -> object:
    """predicate()'s first truthy value, polled every `interval` s; AssertionError naming `what` after `timeout` s.
    A file the predicate reads that is not there yet counts as not yet (a run's record can be listed
    before its runner has created its log: CI saw that race once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except FileNotFoundError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def pilot_wait_for(pilot, predicate: Callable[[], object], what: str, timeout: float = 30.0,
                         detail: Optional[Callable[[], object]] = None) -> object:
    """wait_for for a running Textual app: sleeps on the app's own event loop, so it keeps processing messages.

    Not pilot.pause(): that first waits for every widget of the screen to drain its queue, and a
    widget that a screen change is taking away never answers (a 30 s WaitForScreenTimeout under load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    seen = f"; saw {detail()!r}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{seen}")


def pilot_test(fn):
    """Run an async Pilot test in its own event loop (no asyncio plugin needed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


def cli(args: list[str], env: dict, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=env, capture_output=True,
                          timeout=timeout, **kw)


def cli_env(state_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
    env["GPUDECK_STATE_DIR"] = str(state_dir)
    env["PYTHONPATH"] = str(REPO)
    return env


def tagged_pids(run_id: str) -> list[int]:
    return [st.pid for st in procs.tagged(run_id)]


def pid_alive(pid: int) -> bool:
    st = procs.read_stat(pid)
    return st is not None and st.state != "Z"


def kill_run_leftovers(run_id: Optional[str]) -> None:
    """Test cleanup: nothing a failed test started may outlive it."""
    if not run_id:
        return
    for st in procs.tagged(run_id):
        procs.signal_process(st.identity, 9)


def cleanup_state(state_dir: Path) -> None:
    """Kill every pipeline process and every process of every run under `state_dir`."""
    from gpudeck.jobs.pipeline_records import list_pipelines
    from gpudeck.jobs.runs import iter_all_runs
    for pipe in list_pipelines(None, state_dir):
        proc = pipe.process()
        if proc is not None:
            procs.signal_process(proc, 9)
    from gpudeck.jobs import cgroups
    for run in iter_all_runs(state_dir):
        kill_run_leftovers(run.run_id)
        job = run.job_id()
        if job is not None:
            procs.signal_process(job, 9)
        # The run's cgroup (where this machine allows one): its processes, then the directory.
        path = run.ids().get("cgroup")
        if cgroups.is_run_cgroup(path, run.run_id):
            for pid in cgroups.members(path):
                ident = procs.identity(pid)
                if ident is not None and ident.pid != os.getpid():
                    procs.signal_process(ident, 9)
            deadline = time.monotonic() + 10
            while cgroups.members(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            cgroups.remove(path)


def run_python_in_group(code: str, args: list[str], timeout: float, what: str) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `python -c code args` run in a process group of its own (the
    workers it forks with it); one that does not end in `timeout` is killed, group and all, and fails."""
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise AssertionError(f"{what} did not come back in {timeout} s") from None
    return child.returncode, stdout, stderr


# Child-script code (tests of parallel.py and slices.py): `path` read by one process and by the spread
# over `workers`, with `max_bytes`, into out["serial"] and out["spread"] ([asdict, to_json, truncated]).
BOTH_READINGS = """out = {}
for name, read in (("serial", lambda fh: parallel.analyze_stream(fh, max_bytes=max_bytes)),
                   ("spread", lambda fh: parallel.analyze_regular(fh, max_bytes=max_bytes, workers=workers))):
    with open(path, "rb") as fh:
        analysis, cut = read(fh)
    out[name] = [asdict(analysis), analysis.to_json(), cut]
"""
