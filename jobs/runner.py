"""The runner: a small stdlib-only process that owns one run of one job, from start to exit record.

Started by the supervisor as `python -m gpudeck.jobs.runner --detach RUN_DIR` in a new
session. It outlives whoever started it (console, CLI, SSH session): it ignores
SIGHUP/SIGINT, forks away from its parent, and is a child subreaper so that
processes orphaned inside the job (vLLM's EngineCore and workers after their
parent dies) stay in its tree and are cleaned up when the job ends.

The job's stdout+stderr are opened directly on output.log, so output reaches the
disk even if the runner itself dies. Once a second the runner notes how far the
log has grown (the `times` arrival index), samples the tree's resources into
samples.jsonl and hands a `Tick` to its monitors (the hook for stall rules).

Importing this module has no side effects; nothing third-party is imported
(NVML is tried lazily, for the GPU part of the timeline only).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from gpudeck.jobs.procs import (RUN_TAG, ProcessId, ProcStat, all_stats, descendants, identity, io_bytes,
                        signal_group, signal_name, signal_number, signal_process, tagged)
from gpudeck.jobs import cgroups, strictjson
from gpudeck.jobs.runs import Run, open_private, run_dir_main

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
TICK_S = 1.0
# Reported in samples; a tree of thousands (a build) is summed but not listed.
MAX_PIDS_LISTED = 64
# After the main process ends, leftovers get this long after SIGTERM at most
# before SIGKILL, even if the job declares a longer stop_timeout: nothing is
# left to shut down gracefully once the process that coordinated them is gone.
LEFTOVER_GRACE_CAP_S = 10.0
# Space set aside in the run dir at start and freed to write exit.json on a full disk.
RESERVE = ".reserve"
RESERVE_BYTES = 64 * 1024
# ids.json lists at most this many session ids (a build forking thousands of setsid'd workers).
MAX_SESSIONS = 512


@dataclass(frozen=True)
class Tick:
    """What a monitor sees once a second while the job runs."""

    now: float
    run: Run
    meta: dict
    log_size: int                    # bytes in output.log now
    log_grew: bool                   # since the previous tick
    last_output_at: Optional[float]  # unix time the log last grew (None: no output yet)
    sample: dict                     # the record just appended to samples.jsonl
    job_alive: bool


def load_monitors(run: Run, meta: dict) -> list[Any]:
    """Monitors from `gpudeck.jobs.runner_monitors.make_monitors(run, meta)` (stall and health checks).

    A broken monitor is recorded as an event and dropped: it must never stop the job.
    The monitors stay stdlib-only like this module (the runner-side import-linter contract).
    """
    try:
        from gpudeck.jobs import runner_monitors
        return list(runner_monitors.make_monitors(run, meta))
    except Exception as exc:
        run.add_event("MonitorFailed", monitor="gpudeck.jobs.runner_monitors", error=repr(exc))
        return []


def _prctl(option: int, arg: Any) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except Exception:
        return False


def decode_wait_status(status: int) -> tuple[Optional[int], Optional[str]]:
    """(exit_code, signal_name): exit code 128+N for a signal, as shells report it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, signal_name(sig)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


class Runner:
    """Owns one run: start the job, watch it, record its end, leave nothing behind."""

    def __init__(self, run_dir: str | Path, tick_s: float = TICK_S) -> None:
        self.run = Run(Path(run_dir))
        self.tick_s = tick_s
        # Objects with tick(Tick) and finished(run, exit_record), filled by load_monitors(); one that raises is
        # disabled for the rest of the run (a MonitorFailed event), never taking the runner down.
        self.monitors: list[Any] = []
        self.tick_hooks: list[Callable[[Tick], None]] = []   # plain callables, same contract
        self.meta: dict = {}
        self.job: Optional[ProcessId] = None
        self.pgid: Optional[int] = None
        self.run_id = self.run.run_id
        self.me: Optional[ProcessId] = None
        self._main_status: Optional[int] = None
        self._sigterm = False
        self._wake_r = -1
        self._wake_w = -1
        self._log_recorded = 0            # size last written to `times`
        self._last_size = 0
        self._last_output_at: Optional[float] = None
        self._stop_started: Optional[float] = None
        self._stop_killed = False
        self._popen: Optional[subprocess.Popen] = None
        self._disk_error: Optional[OSError] = None
        self._sessions: set[int] = set()
        self.cgroup: Optional[Path] = None
        self._cgroup_home: Optional[str] = None
        self._stop_timeout: Optional[float] = None     # from the StopRequested that started the stop

    # -- setup -----------------------------------------------------------
    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        # Handlers, not SIG_IGN: an ignored disposition would be inherited by the
        # job through exec, a handler is reset to the default there.
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, *_: Any) -> None:
        self._sigterm = True

    def _job_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (self.meta.get("env") or {}).items()})
        env[RUN_TAG] = self.run_id
        env["GPUDECK_JOB"] = self.run.job
        env["GPUDECK_RUN_DIR"] = str(self.run.path)
        return env

    def _argv(self) -> list[str]:
        command = self.meta.get("command")
        if isinstance(command, str):
            return ["bash", "-c", command]
        if not isinstance(command, list):
            raise TypeError(f"meta.json's command is {type(command).__name__}, not a string or a list")
        return [str(part) for part in command]

    # -- main ------------------------------------------------------------
    def main(self) -> int:
        self._install_signals()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_NAME, ctypes.c_char_p(b"gpudeck-runner"))
        self.me = identity(os.getpid())
        self.meta = self.run.meta()
        self.meta = self.run.update_meta(runner=self.me.to_jsonable() if self.me else None,
                                         runner_host=socket.gethostname())
        self._ids(runner=self.me.to_jsonable() if self.me else None, run_id=self.run_id,
                  created_at=self.meta.get("created_at"))
        if self.run.stop_requested():
            # `stop` came while this runner was still coming up (start at once followed by
            # stop on a loaded box): the job is never launched, and the run says why.
            self.run.add_event("JobNotStarted", reason="stop requested before launch")
            self.run.write_exit({"exit_code": None, "signal": None, "ended_at": time.time(),
                                 "stopped_by_request": True, "leftovers": [],
                                 "note": "stopped before the job was launched"})
            return 0
        self._reserve_space()
        # The job is born in the run's own cgroup where one can be made: however it daemonises
        # (setsid, double fork, a cleared environment, closed fds), stop still finds it there.
        self._cgroup_home = cgroups.current_cgroup()
        if os.environ.get("GPUDECK_RUN_CGROUP", "1") != "0":       # 0: do without (and test that path)
            self.cgroup = cgroups.enter_new(f"gpudeck-{self.run.job}-{self.run_id}")
        if self.cgroup is not None:
            self._ids(cgroup=str(self.cgroup))
        log_fd = open_private(self.run.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        cwd = self.meta.get("cwd") or None
        try:
            self._popen = subprocess.Popen(
                self._argv(), stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                cwd=cwd, env=self._job_env(), start_new_session=True, close_fds=True)
        except (OSError, ValueError, TypeError) as exc:
            message = f"gpudeck: could not start {self.run.job}: {exc}\n"
            os.write(log_fd, message.encode("utf-8", "replace"))
            os.close(log_fd)
            now = time.time()
            self.run.add_event("JobFailedToStart", error=str(exc))
            self.run.write_exit({"exit_code": 127, "signal": None, "ended_at": now, "error": str(exc),
                                 "stopped_by_request": False, "leftovers": []})
            return 1
        os.close(log_fd)
        pid = self._popen.pid
        self.job = identity(pid)
        self.pgid = pid            # start_new_session: the job leads its own session and group
        started = time.time()
        try:
            self.meta = self.run.update_meta(
                job_process=self.job.to_jsonable() if self.job else {"pid": pid, "start": None},
                pgid=self.pgid, started_at=started)
        except OSError as exc:
            # The job runs: supervise it whatever the disk says (stop still finds it by its tag).
            self._disk_error = exc
        self._ids(job_process=self.job.to_jsonable() if self.job else None, pgid=self.pgid, started_at=started)
        self._event("JobStarted", pid=pid, pgid=self.pgid)
        if self.run.stop_requested():
            # A stop that came between the check above and the pid being recorded found
            # no job to signal: the runner carries it out itself.
            self._begin_stop("stop requested while the job was being launched")
        self.monitors = load_monitors(self.run, self.meta)
        self._watch()
        self._finish()
        return 0

    # -- a full disk ----------------------------------------------------------
    def _reserve_space(self) -> None:
        """Set aside a little space in the run dir, freed only to write the exit record on a full disk."""
        try:
            fd = open_private(self.run.path / RESERVE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            pass              # no reserve: the exit record is then only as safe as the free space

    def _ids(self, **fields: Any) -> None:
        # ids.json: the second record of what stop needs, written whole each time (never torn).
        try:
            self.run.update_ids(**fields)
        except OSError as exc:
            self._disk_error = exc

    def _note_sessions(self, procs: list[ProcStat]) -> None:
        """Record every session seen in the run: a daemon that setsid'd and cleared its environment
        keeps its session after the runner is gone, and stop looks there."""
        new = {st.session for st in procs if st.session > 1} - self._sessions
        if new and len(self._sessions) < MAX_SESSIONS:
            self._sessions |= new
            self._ids(sessions=sorted(self._sessions)[:MAX_SESSIONS])

    def _event(self, event: str, **fields: Any) -> None:
        # Events are the story of the run, never a reason to stop supervising it (a full disk).
        try:
            self.run.add_event(event, **fields)
        except OSError as exc:
            self._disk_error = exc

    def _write_exit(self, record: dict) -> bool:
        """exit.json, even on a full disk: on ENOSPC it is written into the space reserved at start.

        Written *into* the reserve file (its blocks are already allocated) and renamed to
        exit.json: freeing the reserve and writing anew could lose the space to a job
        process still writing.
        """
        for attempt in range(4):
            try:
                self.run.write_exit(record)
                return True
            except OSError as exc:
                self._disk_error = exc
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._exit_into_reserve(record):
                    return True
                time.sleep(0.2 * (attempt + 1))     # the cleanup may free space meanwhile
        return False

    def _exit_into_reserve(self, record: dict) -> bool:
        reserve = self.run.path / RESERVE
        data = dict(record, note="disk full: recorded in the space reserved at start")
        text = (strictjson.dumps(data, indent=1, sort_keys=True, default=str) + "\n").encode()
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if len(text) > os.fstat(fd).st_size:
                return False
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))
        except OSError:
            return False
        finally:
            os.close(fd)
        try:
            os.replace(reserve, self.run.exit_path)
        except OSError:
            return False
        record.update(note=data["note"])
        return True

    def _watch(self) -> None:
        next_tick = time.monotonic()
        while True:
            self._reap()
            if self._main_status is not None:
                return
            if self._sigterm and self._stop_started is None:
                self._begin_stop("runner received SIGTERM")
            self._advance_stop()
            now = time.monotonic()
            if now >= next_tick:
                self._tick(job_alive=True)
                next_tick = now + self.tick_s
            self._sleep(max(0.0, next_tick - time.monotonic()))

    def _sleep(self, seconds: float) -> None:
        # Woken early by any signal (SIGCHLD when the job exits, SIGTERM) via the wakeup fd.
        try:
            ready, _, _ = select.select([self._wake_r], [], [], seconds)
        except InterruptedError:
            ready = []
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def _reap(self) -> None:
        # As a subreaper the runner inherits the job's orphans: reap them all, and
        # keep the main process's status.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self._popen is not None and pid == self._popen.pid:
                self._main_status = status
                self._popen.returncode = os.waitstatus_to_exitcode(status)

    # -- stop ------------------------------------------------------------
    def _stop_settings(self) -> tuple[int, float]:
        try:
            sig = signal_number(self.meta.get("stop_signal") or "TERM")
        except (AttributeError, ValueError):
            sig = signal.SIGTERM
        return sig, float(self.meta.get("stop_timeout") or 30.0)

    def _begin_stop(self, reason: str) -> None:
        """Start stopping the job; the deadline is the run's, kept here, whoever asked.

        When `gpudeck stop` asked (a StopRequested by the supervisor, then SIGTERM to this
        runner) it has already sent the stop signal and its deadline is adopted: if that
        CLI is killed mid-stop, the runner still escalates to SIGKILL on time.
        """
        sig, timeout = self._stop_settings()
        started = time.monotonic()
        asked = [e for e in self.run.events() if e.get("event") == "StopRequested" and e.get("by") == "supervisor"
                 and isinstance(e.get("timeout_s"), (int, float)) and isinstance(e.get("t"), (int, float))]
        if asked:
            last = asked[-1]
            timeout = float(last["timeout_s"])
            started -= max(0.0, time.time() - float(last["t"]))
        self._stop_started = started
        self._stop_timeout = timeout
        self._event("StopRequested", by="runner", reason=reason, signal=signal_name(sig), timeout_s=timeout)
        if self.job is not None and self.pgid is not None and not asked:
            signal_group(self.pgid, sig, [self.job])
            signal_process(self.job, sig)

    def _advance_stop(self) -> None:
        if self._stop_started is None or self._stop_killed:
            return
        timeout = self._stop_timeout if self._stop_timeout is not None else self._stop_settings()[1]
        if time.monotonic() - self._stop_started >= timeout:
            self._stop_killed = True
            killed = self.kill_everything(signal.SIGKILL)
            self._event("StopEscalated", by="runner", signal="SIGKILL",
                               pids=[p.pid for p in killed])

    # -- the run's processes ----------------------------------------------
    def run_processes(self, stats: Optional[dict[int, ProcStat]] = None) -> list[ProcStat]:
        """The job's tree below the runner plus every process tagged with this run (escapees)."""
        stats = all_stats() if stats is None else stats
        found: dict[int, ProcStat] = {}
        if self.me is not None:
            for st in descendants(self.me, stats):
                found[st.pid] = st
        job_start = self.job.start if self.job else 0
        # Only processes started after the job can carry its tag: skip reading
        # the environ of everything older.
        candidates = {pid: st for pid, st in stats.items() if st.start >= job_start and pid not in found}
        for st in tagged(self.run_id, candidates):
            found[st.pid] = st
        for pid in cgroups.members(self.cgroup):
            if pid in stats:
                found.setdefault(pid, stats[pid])
        if self.me is not None:
            found.pop(self.me.pid, None)
        return self.run.without_hooks([st for st in found.values() if st.state != "Z"])

    def kill_everything(self, sig: int) -> list[ProcessId]:
        procs = self.run_processes()
        if self.pgid is not None and self.job is not None:
            signal_group(self.pgid, sig, [st.identity for st in procs] + [self.job])
        sent = []
        for st in procs:
            if signal_process(st.identity, sig):
                sent.append(st.identity)
        return sent

    # -- each second --------------------------------------------------------
    def _update_times(self, now: float) -> tuple[int, bool]:
        try:
            size = os.stat(self.run.log_path).st_size
        except OSError:
            size = self._last_size
        grew = size > self._last_size
        self._last_size = size
        if size > self._log_recorded:
            self._last_output_at = now
            try:
                with open(open_private(self.run.times_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a",
                          encoding="ascii") as fh:
                    fh.write(f"{size} {int(now)}\n")
                self._log_recorded = size
            except OSError:
                pass            # a full disk or a planted symlink costs the arrival index, not the run
        return size, grew

    def _sample(self, now: float, size: int) -> dict:
        stats = all_stats()
        procs = self.run_processes(stats)
        cpu = 0.0
        rss = 0
        read_b = 0
        write_b = 0
        io_known = False
        for st in procs:
            cpu += st.cpu_seconds
            rss += st.rss_bytes
            r, w = io_bytes(st.pid)
            if r is not None:
                io_known = True
                read_b += r
                write_b += w or 0
        self._note_sessions(procs)
        pids = sorted(st.pid for st in procs)
        sample: dict[str, Any] = {
            "t": round(now, 3), "procs": len(procs), "pids": pids[:MAX_PIDS_LISTED],
            # Sums over the processes alive now: a child that exits takes its share
            # with it, so rates are diffs of consecutive samples, clipped at zero.
            "cpu_s": round(cpu, 2), "rss": rss,
            "read_bytes": read_b if io_known else None, "write_bytes": write_b if io_known else None,
            "log_bytes": size,
        }
        gpu = self._gpu_sample(set(pids))
        if gpu is not None:
            sample["gpu"] = gpu
        return sample

    def _gpu_sample(self, pids: set[int]) -> Optional[dict]:
        try:
            from gpudeck.jobs.telemetry import gpu
            backend = gpu.local()
            holders = backend.holders()
            if holders is None:
                return None
            mine = [h for h in holders if h.pid in pids]
            gpus = {h.gpu for h in mine}
            # The declared GPUs too: in a container NVML's PIDs may not be ours to match,
            # and a job that has not allocated yet still has GPUs the stall rules judge.
            gpus |= {int(g) for g in (self.meta.get("gpus") or []) if isinstance(g, int)}
            figures = backend.figures(gpus) if gpus else {}
            return {
                "mem_by_pid": [{"gpu": h.gpu, "pid": h.pid, "mem": h.mem_used} for h in mine],
                "mem": sum(h.mem_used or 0 for h in mine),
                "util": {str(k): f.util for k, f in figures.items()},
                "power_w": {str(k): f.power_w for k, f in figures.items()},
                "power_limit_w": {str(k): f.power_limit_w for k, f in figures.items()},
            }
        except Exception:
            return None

    def _tick(self, job_alive: bool) -> None:
        now = time.time()
        size, grew = self._update_times(now)
        sample = self._sample(now, size)
        try:
            from gpudeck.jobs.runs import append_jsonl
            append_jsonl(self.run.samples_path, sample)
        except OSError:
            pass
        tick = Tick(now=now, run=self.run, meta=self.meta, log_size=size, log_grew=grew,
                    last_output_at=self._last_output_at, sample=sample, job_alive=job_alive)
        for monitor in list(self.monitors):
            self._call_monitor(monitor, "tick", tick)
        for hook in list(self.tick_hooks):
            try:
                hook(tick)
            except Exception as exc:
                self.tick_hooks.remove(hook)
                self._event("MonitorFailed", monitor=repr(hook), error=repr(exc))

    def _call_monitor(self, monitor: Any, method: str, *args: Any) -> None:
        fn = getattr(monitor, method, None)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception as exc:
            if monitor in self.monitors:
                self.monitors.remove(monitor)
            self._event("MonitorFailed", monitor=type(monitor).__name__, method=method,
                               error=repr(exc), traceback=traceback.format_exc(limit=5))

    # -- the end --------------------------------------------------------------
    def _finish(self) -> None:
        now = time.time()
        self._update_times(now)
        code, sig = decode_wait_status(self._main_status or 0)
        stopped = self._stop_started is not None or self.run.stop_requested()
        record: dict[str, Any] = {"exit_code": code, "signal": sig, "ended_at": now,
                  "stopped_by_request": stopped, "leftovers": []}
        # The exit status is a fact about the main process: persist it before the
        # cleanup below, which can take a while and during which we could be killed.
        # A write that fails (a full disk) must not keep the cleanup from running.
        recorded = self._write_exit(record)
        self._event("JobExited", exit_code=code, signal=sig, stopped_by_request=stopped)
        leftovers = self._clean_leftovers()
        if leftovers or not recorded:
            record["leftovers"] = leftovers
            recorded = self._write_exit(record)
        if not recorded:
            try:
                print(f"gpudeck: exit not recorded: disk full ({self._disk_error})", file=sys.stderr, flush=True)
            except OSError:
                pass            # runner.log is on the same full disk
        try:
            (self.run.path / RESERVE).unlink()
        except OSError:
            pass
        if self.cgroup is not None and cgroups.leave(self._cgroup_home) and cgroups.remove(self.cgroup):
            self._ids(cgroup=None)          # gone: nothing of the run was left in it
        self._tick(job_alive=False)
        for monitor in list(self.monitors):
            self._call_monitor(monitor, "finished", self.run, record)

    def _clean_leftovers(self) -> list[dict]:
        """TERM, grace, KILL whatever of the run outlived its main process (GPU holders above all)."""
        procs = self.run_processes()
        if not procs:
            return []
        from gpudeck.jobs.procs import cmdline
        left = [{"pid": st.pid, "command": cmdline(st.pid) or st.comm} for st in procs]
        _, timeout = self._stop_settings()
        grace = min(timeout, LEFTOVER_GRACE_CAP_S)
        self._event("LeftoversFound", processes=left, grace_s=grace)
        self.kill_everything(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self._reap()
            if not self.run_processes():
                self._event("LeftoversTerminated", signal="SIGTERM")
                return left
            self._update_times(time.time())
            self._sleep(0.1)
        killed_deadline = time.monotonic() + 10.0
        killed = self.kill_everything(signal.SIGKILL)
        while self.run_processes() and time.monotonic() < killed_deadline:
            self._reap()
            self._sleep(0.05)
            self.kill_everything(signal.SIGKILL)
        self._reap()
        remaining = [st.pid for st in self.run_processes()]
        self._event("LeftoversTerminated", signal="SIGKILL", pids=[p.pid for p in killed],
                           remaining=remaining)
        return left


def main(argv: Optional[list[str]] = None) -> int:
    return run_dir_main(argv, "gpudeck.jobs.runner", Runner)


if __name__ == "__main__":
    raise SystemExit(main())
