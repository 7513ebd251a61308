"""Start, stop, restart and observe the jobs of a jobs.toml; everything it knows is read back from run directories.

Nothing in a Supervisor's memory matters: a console or CLI that was killed and
restarted builds a new one and sees the same states, because every fact (pids
with start times, exit records, stop requests) lives in the run directories.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpudeck.jobs import paths
from gpudeck.jobs.cgroups import is_run_cgroup, members as cgroup_members
from gpudeck.jobs.procs import (RUN_TAG, ProcessId, ProcStat, all_stats, cmdline, cmdline_args, descendants,
                                environ_value, file_id, group_members, holders_of, holds_file, is_alive,
                                listening_ports, port_owners, signal_group, signal_name, signal_number,
                                signal_process, tagged, ticks_at)
from gpudeck.jobs.runs import (Run, RunState, create_run, ensure_job_dir, latest_run, list_runs, open_private,
                               prune_runs)
from gpudeck.jobs.spec import JobsFile, JobSpec, spec_snapshot

LIVE_STATES = ("starting", "running", "stopping")
# `start` waits at most this long for the runner to report the job's pid; past
# it, start returns anyway and the job shows as "starting".
START_WAIT_S = 0.8
# `stop` of a run still "starting" waits this long for the runner to report the job's pid.
STARTING_STOP_WAIT_S = 5.0
# After SIGKILL, how long to keep re-killing and waiting for the tree to vanish.
KILL_WAIT_S = 10.0
# How long the runner gets to write exit.json once the job is gone.
EXIT_RECORD_WAIT_S = 5.0
# GPU memory of a dead process is released by the driver shortly after exit.
GPU_RELEASE_WAIT_S = 10.0


class SupervisorError(Exception):
    """A user-facing failure of start/stop (unknown job, already running...)."""


class UnknownJob(SupervisorError):
    pass


class JobAlreadyRunning(SupervisorError):
    def __init__(self, job: str, run_id: str) -> None:
        super().__init__(f"{job} is already running (run {run_id}); stop it first or use restart")
        self.job = job
        self.run_id = run_id


@dataclass(frozen=True)
class JobState:
    """One job as every face shows it (`jobs --json`, the console's table)."""

    name: str
    kind: str
    state: str                       # idle|starting|running|stopping|exited|stopped|lost
    pid: Optional[int] = None
    run_id: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    port: Optional[int] = None
    port_open: Optional[bool] = None
    gpus: tuple[int, ...] = ()
    runner_alive: bool = False
    pgid: Optional[int] = None
    backend: str = "local"
    slurm: Optional[dict] = None     # {"job_id", "state", "reason", "nodes", "text"} for a Slurm run

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def to_jsonable(self) -> dict:
        data = dataclasses.asdict(self)
        data["gpus"] = list(self.gpus)
        return data


@dataclass(frozen=True)
class ProcessReport:
    """A process that stop found still there: named, never silently touched if it is not ours."""

    pid: int
    command: Optional[str]
    gpu_mem: Optional[int] = None        # bytes over all GPUs; None: unknown or none
    gpus: tuple[int, ...] = ()
    owned: bool = True                   # part of the run (tree or tagged) vs foreign

    def describe(self) -> str:
        mem = f", {self.gpu_mem / 2**30:.1f} GiB on GPU {','.join(map(str, self.gpus))}" if self.gpu_mem else ""
        who = "" if self.owned else " (not started by this run; left alone)"
        return f"pid {self.pid} {self.command or '?'}{mem}{who}"


@dataclass
class StopReport:
    job: str
    run_id: Optional[str]
    was_running: bool
    signal: Optional[str] = None
    escalated: bool = False                            # SIGKILL was needed
    signalled: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    remaining: list[ProcessReport] = field(default_factory=list)      # run processes still alive
    port: Optional[int] = None
    port_free: Optional[bool] = None                   # None: no port declared
    port_holders: list[ProcessReport] = field(default_factory=list)
    gpu_checked: bool = False                          # False: NVML unavailable
    gpu_unavailable_reason: Optional[str] = None
    gpu_holders: list[ProcessReport] = field(default_factory=list)   # anything still on the job's GPUs
    duration_s: float = 0.0
    message: str = ""
    slurm_job_id: Optional[str] = None
    slurm_state: Optional[str] = None                  # Slurm's state once stop is done (final: CANCELLED...)
    slurm_final: Optional[bool] = None                 # None: not a Slurm run

    @property
    def clean(self) -> bool:
        """Nothing of the run is alive, its port is free and no process of it holds GPU memory."""
        return (not self.remaining and self.port_free is not False
                and not any(h.owned for h in self.gpu_holders) and self.slurm_final is not False)

    def to_jsonable(self) -> dict:
        data = dataclasses.asdict(self)
        data["clean"] = self.clean
        return data

    def lines(self) -> list[str]:
        out = [self.message] if self.message else []
        for p in self.remaining:
            out.append(f"still alive: {p.describe()}")
        if self.port is not None and self.port_free is False:
            holders = ", ".join(p.describe() for p in self.port_holders) or "owner unknown"
            out.append(f"port {self.port} still listening: {holders}")
        for p in self.gpu_holders:
            out.append(f"GPU memory still held: {p.describe()}")
        if self.slurm_final is False:
            out.append(f"slurm job {self.slurm_job_id} still {self.slurm_state or 'unknown'} after scancel")
        if not self.gpu_checked and self.was_running:
            out.append(f"GPU memory not checked: {self.gpu_unavailable_reason or 'NVML unavailable'}")
        return out


def proven_runner(run: Run, meta: dict, stats: dict[int, ProcStat]) -> Optional[ProcessId]:
    """The run's runner as recorded in meta.json, only if the live process at that pid and start
    time really is `python -m gpudeck.jobs.runner ... RUN_DIR` for this run directory."""
    runner = ProcessId.from_jsonable(meta.get("runner"))
    st = stats.get(runner.pid) if runner is not None else None
    if runner is None or st is None or st.start != runner.start:
        return None
    args = cmdline_args(runner.pid)
    if "gpudeck.jobs.runner" not in args:
        return None
    here = os.path.realpath(run.path)
    return runner if any(os.path.realpath(a) == here for a in args[args.index("gpudeck.jobs.runner") + 1:]) else None


def proven_job(run: Run, meta: dict, stats: dict[int, ProcStat], runner: Optional[ProcessId],
               log_id: Optional[tuple[int, int]]) -> Optional[ProcessId]:
    """The job's main process from meta.json, only if it is provably this run's.

    meta.json is a file: a pid and start time in it prove nothing alone (an edited
    one could name sshd). The process must also carry the run's tag, be a child of
    the proven runner, or hold the run's output.log open.
    """
    job = ProcessId.from_jsonable(meta.get("job_process"))
    st = stats.get(job.pid) if job is not None else None
    if job is None or st is None or st.start != job.start:
        return None
    if environ_value(job.pid, RUN_TAG) == run.run_id:
        return job
    if runner is not None and st.ppid == runner.pid:
        return job
    if log_id is not None and holds_file(job.pid, log_id):
        return job
    return None


def run_processes(run: Run, stats: Optional[dict[int, ProcStat]] = None) -> list[ProcStat]:
    """Every live, non-zombie process of a run: the runner's subtree, the job's group, and tagged escapees.

    Membership is proven, never assumed: a descendant of the runner's verified
    identity (cmdline names this run dir), the job proven by tag / parent / log fd,
    a member of the job's group while a proven process of ours is in it, or a
    process whose environment carries this run's tag. Daemons that left all of
    that (setsid, double fork, a cleared environment — after the runner was
    SIGKILLed) are found in the run's cgroup, in a session the runner recorded,
    or holding the run's output.log open; only processes started after the run was
    created are considered.
    """
    stats = all_stats() if stats is None else stats
    meta = run.meta()
    ids = run.ids()
    log_id = file_id(run.log_path)
    runner = proven_runner(run, meta, stats)
    job = proven_job(run, meta, stats, runner, log_id)
    found: dict[int, ProcStat] = {}
    if runner is not None:
        for st in descendants(runner, stats):
            found[st.pid] = st
    if job is not None:
        top = stats.get(job.pid)
        if top is not None and top.start == job.start:
            found[job.pid] = top
            for st in descendants(job, stats):
                found[st.pid] = st
    created = meta.get("created_at")
    created_ticks = ticks_at(float(created)) if isinstance(created, (int, float)) and created > 0 else 0
    earliest = min([p.start for p in (runner, job) if p is not None], default=created_ticks)
    candidates = {pid: st for pid, st in stats.items() if st.start >= earliest and pid not in found}
    for st in tagged(run.run_id, candidates):
        found[st.pid] = st
    if is_run_cgroup(ids.get("cgroup"), run.run_id):
        for pid in cgroup_members(ids.get("cgroup")):
            if pid in stats:
                found.setdefault(pid, stats[pid])
    if earliest > 0:
        sessions = {s for s in ids.get("sessions") or [] if isinstance(s, int) and s > 1}
        # Only our own processes: a session id is a pid, and a reused one must never name another user's.
        rest = [st for st in candidates.values() if st.pid not in found and _owned_by_me(st.pid)]
        for st in rest:
            if st.session in sessions:
                found[st.pid] = st
        if log_id is not None:
            for st in holders_of(log_id, {st.pid: st for st in rest if st.pid not in found}):
                found[st.pid] = st
    pgid = meta.get("pgid")
    if pgid and found:
        ours = {st.pid: st.start for st in found.values()}
        members = group_members(int(pgid), stats)
        if any(ours.get(m.pid) == m.start for m in members):
            for m in members:
                found.setdefault(m.pid, m)
    if runner is not None:
        found.pop(runner.pid, None)
    recorded = ProcessId.from_jsonable(meta.get("runner"))
    if recorded is not None and recorded.pid in found and found[recorded.pid].start == recorded.start:
        found.pop(recorded.pid)         # the runner itself (it sits in the run's cgroup) is never a leftover
    return run.without_hooks([st for st in found.values() if st.state != "Z"])


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def _remove_cgroup(run: Run) -> None:
    """The run's cgroup, once empty (a runner killed before it could remove it)."""
    from gpudeck.jobs import cgroups
    path = run.ids().get("cgroup")
    if cgroups.is_run_cgroup(path, run.run_id) and not cgroups.members(path) and cgroups.remove(path):
        try:
            run.update_ids(cgroup=None)
        except OSError:
            pass


def _host() -> str:
    return socket.gethostname()


class Supervisor:
    """The jobs of one jobs file, with their runs under one state directory."""

    def __init__(self, jobs_file: JobsFile, state_dir: Optional[Path] = None) -> None:
        self.jobs_file = jobs_file
        # Absolute: the runner and pipeline processes run in another working directory.
        self.state_dir = (Path(state_dir) if state_dir is not None else paths.state_dir()).absolute()

    # -- lookups -----------------------------------------------------------
    def spec(self, name: str) -> JobSpec:
        try:
            return self.jobs_file.jobs[name]
        except KeyError:
            known = ", ".join(self.jobs_file.jobs) or "none"
            raise UnknownJob(f"no job named {name!r} in {self.jobs_file.path} (jobs: {known})") from None

    def latest(self, name: str) -> Optional[Run]:
        return latest_run(name, self.state_dir)

    def runs(self, name: str) -> list[Run]:
        return list_runs(name, self.state_dir)

    def base_dir(self) -> Path:
        return Path(self.jobs_file.path).resolve().parent

    def job_cwd(self, spec: JobSpec) -> str:
        """The job's working directory: its `cwd` (relative to the jobs file), else the jobs file's directory."""
        if spec.cwd:
            return str((self.base_dir() / os.path.expanduser(spec.cwd)).resolve())
        return str(self.base_dir())

    def done_path(self, spec: JobSpec) -> Optional[Path]:
        """`done_when`, relative to the job's working directory (where its command writes it)."""
        if not spec.done_when:
            return None
        return Path(self.job_cwd(spec)) / os.path.expanduser(spec.done_when)

    # -- start ---------------------------------------------------------------
    def start(self, name: str, *, pipeline: Optional[str] = None, after: Optional[list[str]] = None) -> str:
        """Start a run of `name` under a detached runner; returns its run id within about a second.

        A `backend = "slurm"` job is submitted with sbatch instead (gpudeck.jobs.slurm);
        `after` are Slurm job ids it must wait for (--dependency=afterok).
        """
        spec = self.spec(name)
        job_runs = ensure_job_dir(name, self.state_dir)
        # Check-and-create under a lock: two CLIs (or a CLI and the console) starting the
        # same job at once would otherwise both see it idle and start it twice. Once
        # meta.json has created_at, the new run reads "starting" (live) to everyone.
        lock_fd = open_private(job_runs / ".start.lock", os.O_WRONLY | os.O_CREAT)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            current = self.latest(name)
            if current is not None and current.exit_record() is None and current.meta().get("backend") == "slurm":
                # Its watcher may have died: ask Slurm before a queued or running job reads as lost.
                from gpudeck.jobs import slurm
                slurm.reconcile(current)
                current = self.latest(name)
            if current is not None:
                st = current.state()
                if st.state in LIVE_STATES:
                    raise JobAlreadyRunning(name, current.run_id)
            run = create_run(name, self.state_dir)
            created = time.time()
            run.update_meta(job=name, run_id=run.run_id, created_at=created)
            run.update_ids(run_id=run.run_id, created_at=created)
        finally:
            os.close(lock_fd)
        os.close(open_private(run.log_path, os.O_WRONLY | os.O_CREAT))   # readers (logs -f, the console) may open it at once
        from gpudeck.jobs.telemetry.gpu import visible_devices_env
        env = {str(k): str(v) for k, v in spec.env.items()}
        env.update(visible_devices_env(spec.gpus))
        command: Any = spec.cmd if isinstance(spec.cmd, str) else list(spec.cmd)
        from gpudeck.jobs.notify import run_targets
        notify, notify_problem = run_targets(self.jobs_file)
        run.update_meta(
            job=name, run_id=run.run_id, kind=spec.kind, spec=spec_snapshot(spec),
            command=command, cwd=self.job_cwd(spec), env=env, host=_host(),
            jobs_file=str(self.jobs_file.path), created_at=time.time(),
            started_by={"pid": os.getpid(), "user": os.environ.get("USER")},
            stop_signal=spec.stop_signal, stop_timeout=spec.stop_timeout,
            port=spec.port, gpus=list(spec.gpus), pipeline=pipeline, backend=spec.backend,
            # resolved here (job's own, else the file-wide default): the runner fires it with no jobs.toml at hand
            on_alert=self.jobs_file.alert_command(name),
            # webhook targets, resolved here like on_alert (meta.json is private to the user: URLs stay whole)
            notify=notify)
        if notify_problem:
            run.add_event("NotifyConfigInvalid", error=notify_problem)
        # One launch per backend, the same run directory for both: every view reads it the same way.
        if spec.backend == "slurm":
            self._submit_slurm(run, spec, env, after or [])
        else:
            self._launch_runner(run)
        try:
            prune_runs(name, spec.log_keep, self.state_dir)
        except OSError:
            pass
        return run.run_id

    def _launch_runner(self, run: Run) -> None:
        """The local backend: a detached runner owns the job; waits briefly for it to report the job's pid."""
        runner_env = {k: v for k, v in os.environ.items()
                      if k not in (RUN_TAG, "GPUDECK_JOB", "GPUDECK_RUN_DIR")}
        # The runner's own diagnostics (a traceback if it ever fails) go beside the run.
        launch_cwd, runner_env = paths.child_launch(runner_env)
        with open(open_private(run.path / "runner.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as diag:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "gpudeck.jobs.runner", "--detach", str(run.path)],
                cwd=launch_cwd, env=runner_env, stdin=subprocess.DEVNULL,
                stdout=diag, stderr=diag, start_new_session=True, close_fds=True)
        # The launcher forks the real runner and exits: reaping it here leaves no zombie.
        try:
            launcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            meta = run.meta()
            if meta.get("job_process") or run.exit_path.exists():
                break
            time.sleep(0.01)

    def _submit_slurm(self, run: Run, spec: JobSpec, env: dict, after: list[str]) -> None:
        """The Slurm backend: sbatch into the run directory, then a detached watcher follows it."""
        from gpudeck.jobs import slurm
        try:
            job_id = slurm.submit(run, spec, self.job_cwd(spec), env, after)
        except slurm.SlurmError as exc:
            # A failed run, not a finished one: `runs --failed`, the ✗ and the post-mortem all read
            # the error (and the log says it too, as a local run's failed exec does).
            try:
                with open(open_private(run.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "w") as fh:
                    fh.write(f"gpudeck: {spec.name} was not submitted: {exc}\n")
            except OSError:
                pass
            run.add_event("JobFailedToStart", error=str(exc))
            run.write_exit({"exit_code": None, "signal": None, "ended_at": time.time(), "error": str(exc),
                            "stopped_by_request": False, "leftovers": [], "backend": "slurm",
                            "not_submitted": True, "note": f"not submitted: {exc}"})
            raise SupervisorError(f"{spec.name}: not submitted: {exc}") from None
        run.update_meta(slurm_job_id=job_id, slurm_after=after)
        slurm.write_live(run, {"job_id": job_id, "state": "PENDING", "reason": None, "nodes": None})
        run.add_event("SlurmSubmitted", slurm_job_id=job_id, after=after)
        slurm.launch_watcher(run)

    # -- states --------------------------------------------------------------
    def job_state(self, name: str, listening: Optional[dict[int, set[int]]] = None) -> JobState:
        spec = self.spec(name)
        listening = listening_ports() if listening is None else listening
        port_open = (spec.port in listening) if spec.port is not None else None
        run = self.latest(name)
        if run is None:
            return JobState(name=name, kind=spec.kind, state="idle", port=spec.port,
                            port_open=port_open, gpus=tuple(spec.gpus))
        slurm_run = run.meta().get("backend") == "slurm"
        if slurm_run:
            from gpudeck.jobs import slurm
            slurm.reconcile(run)           # a watcher that died is re-attached (or the end recorded)
        # The run's state before Slurm's fields: the watcher writes exit.json before slurm.json's
        # final state, so fields read after an ended state come from the exit record, never a stale poll.
        rs: RunState = run.state()
        slurm_fields = None
        if slurm_run:
            slurm_fields = self._slurm_fields(run)
            port_open = None               # the port is on a Slurm node, not on this box
        return JobState(
            name=name, kind=spec.kind, state=rs.state, pid=rs.job_pid, run_id=run.run_id,
            exit_code=rs.exit_code, signal=rs.signal, started_at=rs.started_at, ended_at=rs.ended_at,
            port=spec.port, port_open=port_open, gpus=tuple(spec.gpus), runner_alive=rs.runner_alive,
            pgid=rs.pgid, backend="slurm" if slurm_fields is not None else "local", slurm=slurm_fields)

    @staticmethod
    def _slurm_fields(run: Run) -> dict:
        """Slurm's own view of the run (job id, state, reason, nodes)."""
        from gpudeck.jobs import slurm
        meta = run.meta()
        live = slurm.live(run)
        record = run.exit_record() or {}
        data = {"job_id": meta.get("slurm_job_id"), "state": record.get("slurm_state") or live.get("state"),
                "reason": record.get("slurm_reason") if record else live.get("reason"),
                "nodes": record.get("nodes") or live.get("nodes") or meta.get("nodes")}
        data["text"] = slurm.describe(data)
        return data

    def job_states(self) -> list[JobState]:
        listening = listening_ports()
        return [self.job_state(name, listening) for name in self.jobs_file.jobs]

    def wait(self, name: str, run_id: Optional[str] = None, timeout: Optional[float] = None,
             poll_s: float = 0.2) -> Optional[dict]:
        """Block until the run ends (exit record or lost); returns the exit record (None if lost/timeout)."""
        run = self._run(name, run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = run.exit_record()
            if record is not None:
                return record
            if run.state().state == "lost":
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)

    def _run(self, name: str, run_id: Optional[str]) -> Run:
        if run_id is None:
            run = self.latest(name)
        else:
            from gpudeck.jobs.runs import find_run
            run = find_run(name, run_id, self.state_dir)
        if run is None:
            raise SupervisorError(f"{name} has no run{' ' + run_id if run_id else ''}")
        return run

    # -- stop ------------------------------------------------------------------
    def stop(self, name: str, *, timeout: Optional[float] = None) -> StopReport:
        """Stop signal to the group, wait, SIGKILL the group and every escapee, then verify."""
        spec = self.spec(name)
        started = time.monotonic()
        run = self.latest(name)
        if run is None:
            return self._verify(StopReport(job=name, run_id=None, was_running=False, port=spec.port,
                                           message=f"{name} was never started by gpudeck; nothing signalled"),
                                spec, None, started)
        if run.meta().get("backend") == "slurm":
            return self._stop_slurm(run, spec, timeout, started)
        was_starting = run.state().state == "starting"
        if was_starting:
            # Recorded first: a runner not yet up (a loaded box) reads it and never launches
            # the job; one already up has its pid written within the wait below.
            run.add_event("StopRequested", by="supervisor", pid=os.getpid(), before_launch=True)
            # (With that event recorded the state reads "stopping" once the runner is up,
            # so wait on the files themselves.)
            deadline = time.monotonic() + STARTING_STOP_WAIT_S
            while not self._launch_settled(run) and time.monotonic() < deadline:
                time.sleep(0.02)
        procs = run_processes(run)
        rs = run.state()
        report = StopReport(job=name, run_id=run.run_id, was_running=bool(procs) or rs.state in LIVE_STATES,
                            port=spec.port)
        if was_starting and not procs and not self._launch_settled(run):
            report.message = (f"{name} (run {run.run_id}) was still starting: its runner will not "
                              f"launch the job")
            return self._verify(report, spec, run, started)
        if not procs:
            report.message = f"{name} is not running (run {run.run_id} {rs.state})"
            return self._verify(report, spec, run, started)
        try:
            sig = signal_number(spec.stop_signal)
        except (AttributeError, ValueError):
            sig = signal.SIGTERM
        report.signal = signal_name(sig)
        grace = spec.stop_timeout if timeout is None else timeout
        run.add_event("StopRequested", by="supervisor", pid=os.getpid(), signal=report.signal,
                      timeout_s=grace)
        meta = run.meta()
        ids = [st.identity for st in procs]
        # The recorded job process is signalled only once run_processes proved it ours.
        job = ProcessId.from_jsonable(meta.get("job_process"))
        job = job if job in ids else None
        pgid = meta.get("pgid")
        if pgid:
            signal_group(int(pgid), sig, ids + ([job] if job else []))
        if job is not None:
            signal_process(job, sig)
        for st in procs:
            if st.pgrp != pgid:
                signal_process(st.identity, sig)     # escapees outside the job's group get the signal too
        # The deadline is the run's: the runner adopts it and escalates on its own if this CLI dies.
        runner = proven_runner(run, meta, all_stats())
        if runner is not None:
            signal_process(runner, signal.SIGTERM)
        report.signalled = sorted(p.pid for p in ids)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not run_processes(run):
                break
            time.sleep(0.1)
        left = run_processes(run)
        if left:
            report.escalated = True
            run.add_event("StopEscalated", by="supervisor", signal="SIGKILL", pids=[st.pid for st in left])
            report.killed = self._kill_all(run)
        self._await_exit_record(run)
        # The runner owns the deadline and may have escalated first: its event counts too.
        if not report.escalated and any(e.get("event") == "StopEscalated" and e.get("by") == "runner"
                                        for e in run.events()):
            report.escalated = True
        report.message = f"stopped {name} (run {run.run_id})" + (" after SIGKILL" if report.escalated else "")
        return self._verify(report, spec, run, started)

    def _stop_slurm(self, run: Run, spec: JobSpec, timeout: Optional[float], started: float) -> StopReport:
        """scancel with the stop signal, scancel after the grace period, then Slurm's final state as proof."""
        from gpudeck.jobs import slurm
        job_id = str(run.meta().get("slurm_job_id") or "")
        report = StopReport(job=spec.name, run_id=run.run_id, was_running=False, slurm_job_id=job_id or None,
                            gpu_unavailable_reason="a Slurm job's GPUs are freed by Slurm on its node")
        if not job_id:
            report.message = f"{spec.name} (run {run.run_id}) was never submitted to Slurm"
            return report
        grace = spec.stop_timeout if timeout is None else timeout
        try:
            result = slurm.stop(run, spec.stop_signal, grace)
        except slurm.SlurmError as exc:
            raise SupervisorError(f"{spec.name}: {exc}") from None
        report.was_running = result["was_running"]
        report.signal = result["signal"]
        report.escalated = result["escalated"]
        report.slurm_state = result["state"]
        report.slurm_final = result["final"]
        if report.was_running:
            run.add_event("StopVerified", clean=report.clean, slurm_job_id=job_id, slurm_state=result["state"])
            how = " after scancel" if report.escalated else ""
            report.message = f"stopped {spec.name} (run {run.run_id}, slurm job {job_id} {result['state']}){how}"
        else:
            report.message = (f"{spec.name} is not running (run {run.run_id}, slurm job {job_id} "
                              f"{result['state'] or 'unknown to Slurm'})")
        report.duration_s = round(time.monotonic() - started, 3)
        return report

    @staticmethod
    def _launch_settled(run: Run) -> bool:
        """The runner has recorded the job's pid or the run's end, or it died before either."""
        meta = run.meta()
        if meta.get("job_process") or run.exit_record() is not None:
            return True
        runner = ProcessId.from_jsonable(meta.get("runner"))
        return runner is not None and not is_alive(runner.pid, runner.start)

    def _kill_all(self, run: Run) -> list[int]:
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_WAIT_S
        pgid = run.meta().get("pgid")
        # Repeat: a dying parent can fork one more child between our scan and its death.
        while time.monotonic() < deadline:
            procs = run_processes(run)
            if not procs:
                break
            ids = [st.identity for st in procs]
            if pgid:
                signal_group(int(pgid), signal.SIGKILL, ids)
            for ident in ids:
                if signal_process(ident, signal.SIGKILL):
                    killed.add(ident.pid)
            time.sleep(0.05)
        return sorted(killed)

    def _await_exit_record(self, run: Run) -> None:
        deadline = time.monotonic() + EXIT_RECORD_WAIT_S
        while run.exit_record() is None and time.monotonic() < deadline:
            runner = run.runner_id()
            if runner is None or not is_alive(runner.pid, runner.start):
                break
            time.sleep(0.05)
        if run.exit_record() is None:
            # The runner is gone (killed with the job, or long before): nobody can
            # know the exit status any more, but it is known that we stopped it.
            run.write_exit({"exit_code": None, "signal": None, "ended_at": time.time(),
                            "stopped_by_request": True, "leftovers": [],
                            "note": "runner was gone; exit status unknown"})
            run.add_event("JobExited", exit_code=None, signal=None, stopped_by_request=True,
                          note="recorded by the supervisor")

    def _verify(self, report: StopReport, spec: JobSpec, run: Optional[Run], started: float) -> StopReport:
        from gpudeck.jobs.telemetry import gpu
        left = run_processes(run) if run is not None else []
        holders = gpu.local().holders()
        report.gpu_checked = holders is not None
        if holders is None:
            report.gpu_unavailable_reason = gpu.local().error
        ours = {st.pid for st in left}
        if holders is not None and run is not None:
            deadline = time.monotonic() + GPU_RELEASE_WAIT_S
            while time.monotonic() < deadline:
                tagged_pids = {st.pid for st in tagged(run.run_id)} | ours
                if not any(h.pid in tagged_pids for h in holders):
                    break
                time.sleep(0.2)
                holders = gpu.local().holders() or []
        mem_by_pid: dict[int, list] = {}
        for h in holders or []:
            mem_by_pid.setdefault(h.pid, []).append(h)
        report.remaining = [self._describe(st.pid, mem_by_pid, owned=True) for st in left]
        if holders is not None:
            watched = set(spec.gpus) if spec.gpus else {h.gpu for h in holders}
            owned_pids = ours | ({st.pid for st in tagged(run.run_id)} if run is not None else set())
            seen = set()
            for h in holders:
                if h.gpu in watched and h.pid not in seen:
                    seen.add(h.pid)
                    report.gpu_holders.append(self._describe(h.pid, mem_by_pid, owned=h.pid in owned_pids))
        if spec.port is not None:
            listening = listening_ports()
            report.port_free = spec.port not in listening
            if not report.port_free:
                report.port_holders = [self._describe(pid, mem_by_pid, owned=pid in ours)
                                       for pid in port_owners(spec.port)]
        report.duration_s = round(time.monotonic() - started, 3)
        if run is not None and not left:
            _remove_cgroup(run)
        if run is not None and report.was_running:
            run.add_event("StopVerified", clean=report.clean,
                          remaining=[p.pid for p in report.remaining],
                          port_free=report.port_free,
                          gpu_holders=[dataclasses.asdict(p) for p in report.gpu_holders],
                          gpu_checked=report.gpu_checked)
        return report

    @staticmethod
    def _describe(pid: int, mem_by_pid: dict[int, list], owned: bool) -> ProcessReport:
        entries = mem_by_pid.get(pid, [])
        mem = sum(h.mem_used or 0 for h in entries) or None
        return ProcessReport(pid=pid, command=cmdline(pid), gpu_mem=mem,
                             gpus=tuple(sorted({h.gpu for h in entries})), owned=owned)

    def processes(self, name: str) -> list[ProcessReport]:
        """The live processes of the job's latest run (pid, command, GPU memory): what a stop confirmation names."""
        run = self.latest(name)
        if run is None or run.meta().get("backend") == "slurm":
            return []               # a Slurm job's processes are on its node, Slurm's to signal
        from gpudeck.jobs.telemetry import gpu
        mem_by_pid: dict[int, list] = {}
        for h in gpu.local().holders() or []:
            mem_by_pid.setdefault(h.pid, []).append(h)
        return [self._describe(st.pid, mem_by_pid, owned=True)
                for st in sorted(run_processes(run), key=lambda st: st.pid)]

    def stacks(self, name: str, *, native: bool = False) -> Any:
        """A grouped stack dump (gpudeck.jobs.stacks.StackDump) of every Python process of the job's latest
        live run: the same proven tree `stop` finds, escapees included, and nothing else.

        Raises SupervisorError when there is no live run, stacks.StacksUnavailable when nothing can be dumped here.
        """
        from gpudeck.jobs import stacks
        run = self.latest(name)
        if run is None:
            raise SupervisorError(f"{name} was never started by gpudeck: no process to dump")
        if run.meta().get("backend") == "slurm":
            raise SupervisorError(f"{name} runs under Slurm: its processes are on its node; run "
                                  f"`gpudeck stacks {name}` there")
        procs = run_processes(run)
        if not procs:
            raise SupervisorError(f"{name} is not running (run {run.run_id} {run.state().state}): no process to dump")
        return stacks.dump([st.identity for st in procs], native=native, job=name, run_id=run.run_id)

    def restart(self, name: str) -> tuple[StopReport, str]:
        report = self.stop(name)
        return report, self.start(name)
