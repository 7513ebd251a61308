"""LocalBox: the Box interface answered by the core on this machine (and, inside the agent, on a remote one)."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from gpudeck.jobs.box import MAX_LOG_CHUNK, MAX_LOG_WAIT_S, Box, BoxError

if TYPE_CHECKING:
    # Each method imports the result it builds: `gpudeck analyze` (a CLI run per log) loads only its own
    # (analyze_result.py), not the 18 others' dataclasses (12 ms of a 104 ms start on the H100, 12-07).
    from gpudeck.jobs.box.analyze_result import AnalyzeResult
    from gpudeck.jobs.box.results import (BoxInfo, CheckResult, DoctorReport, JobsListing, LogChunk, PipelineProgress,
                                          PipelineStarted, PivotOutcome, PivotPlan, Postmortem, Pruned, Reindexed,
                                          Restarted, RunsListing, StacksResult, Started, StatusReport, Stopped)
    from gpudeck.jobs.runs import Run
    from gpudeck.jobs.spec import JobsFile
    from gpudeck.jobs.supervisor import Supervisor

NO_JOBS_FILE = ("no jobs file: pass --jobs FILE, set GPUDECK_JOBS, or create ./jobs.toml "
                "or ~/.config/gpudeck/jobs.toml")
LOG_POLL_S = 0.1


class LocalBox(Box):
    """This machine. `jobs_file`: the --jobs argument (None: $GPUDECK_JOBS, ./jobs.toml, ~/.config/…);
    `state_dir`: where runs live (None: $GPUDECK_STATE_DIR or the XDG default); `no_jobs_file`: what a
    request that needs the jobs file says when there is none (the agent names hosts.toml instead)."""

    local = True

    def __init__(self, *, jobs_file: Optional[str] = None, state_dir: Optional[Path] = None, name: str = "local",
                 no_jobs_file: str = NO_JOBS_FILE, readonly: bool = False) -> None:
        self.name = name
        self.jobs_file_arg = jobs_file
        self._state_dir = state_dir
        self._no_jobs_file = no_jobs_file
        self.readonly = readonly
        # (path, its stat identity) -> the job names it declares: a remote log pane asks for a chunk
        # every poll, and each used to parse the jobs file again only to check the job's name.
        self._names: Optional[tuple[tuple, frozenset[str]]] = None

    # -- the core's objects ------------------------------------------------------------------
    def state_dir(self) -> Path:
        from gpudeck.jobs import paths
        return self._state_dir if self._state_dir is not None else paths.state_dir().absolute()

    def jobs_path(self) -> Optional[Path]:
        from gpudeck.jobs.paths import find_jobs_file
        return find_jobs_file(self.jobs_file_arg)

    def _readable_jobs_path(self) -> Path:
        """The jobs file's path if it is there and a regular file; BoxError (code 2) saying why not."""
        from gpudeck.jobs.paths import check_regular
        path = self.jobs_path()
        if path is None:
            raise BoxError(self._no_jobs_file, code=2)
        if not path.exists():
            raise BoxError(f"{path}: no such file", code=2)
        try:
            check_regular(path)             # a FIFO would block the read, /dev/zero never end it
        except OSError as exc:
            raise BoxError(str(exc), code=2) from None
        return path

    def jobs_file(self) -> JobsFile:
        """The jobs file, loaded strictly; BoxError (code 2) with the first located error, or why there is none."""
        path = self._readable_jobs_path()
        from gpudeck.jobs.spec import SpecError, load_jobs     # only with a file to read (`status` loads no spec)
        try:
            return load_jobs(path)
        except SpecError as exc:
            # The first located error is enough here; `gpudeck check` lists them all.
            raise BoxError(f"{exc} (run `gpudeck check` for every problem)", code=2) from None

    def supervisor(self) -> Supervisor:
        from gpudeck.jobs.supervisor import Supervisor
        return Supervisor(self.jobs_file(), self._state_dir)

    def _known(self, sup: Supervisor, job: str) -> None:
        from gpudeck.jobs.supervisor import UnknownJob
        try:
            sup.spec(job)
        except UnknownJob as exc:
            raise BoxError(str(exc), code=2) from None

    def _job_supervisor(self, job: str) -> Supervisor:
        sup = self.supervisor()
        self._known(sup, job)
        return sup

    def find_run(self, job: str, run: Optional[str] = None) -> Run:
        """The run of `job` (its latest, or the one `run` names). A job the jobs file lacks still has its
        runs (logs are read from the state directory); code 2 when it never ran."""
        from gpudeck.jobs.runs import find_run, latest_run, list_runs
        state = self.state_dir()
        path = self.jobs_path()
        if path is not None and path.exists():
            if job not in self._job_names(path) and not list_runs(job, state):
                raise BoxError(f"no job named {job!r} in {path}", code=2)
        elif not list_runs(job, state):
            raise BoxError(self._no_jobs_file if path is None else f"{path}: no such file", code=2)
        found = find_run(job, run, state) if run else latest_run(job, state)
        if found is None:
            raise BoxError(f"{job} has no run {run}" if run else f"{job} has never run", code=2)
        return found

    def _job_names(self, path: Path) -> frozenset[str]:
        """The jobs file's job names, parsed again only when the file changed (its inode, size or mtime)."""
        try:
            st = os.stat(path)
            key: tuple = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = ()
        if key and self._names is not None and self._names[0] == key:
            return self._names[1]
        names = frozenset(self.jobs_file().jobs)
        self._names = (key, names) if key else None
        return names

    # -- who -----------------------------------------------------------------------------------
    def info(self) -> BoxInfo:
        from gpudeck.jobs.box.results import BoxInfo
        import socket                   # (here: ~5 ms of every command's start on the VM otherwise)
        from gpudeck.jobs import __version__
        path = self.jobs_path()
        return BoxInfo(name=self.name, local=True, hostname=socket.gethostname(), readonly=self.readonly,
                       version=__version__, python=".".join(map(str, sys.version_info[:3])), pid=os.getpid(),
                       state_dir=str(self.state_dir()), jobs_file=str(path) if path is not None else None)

    # -- see ----------------------------------------------------------------------------------
    def status(self, *, interval_s: float = 0.1, engines: bool = True, simulated: bool = False) -> StatusReport:
        from gpudeck.jobs.box.results import StatusReport
        from gpudeck.jobs.telemetry.sampler import make_sampler
        from gpudeck.jobs.telemetry.status import status_payload
        # One sample: a PCIe throughput thread would have nothing to show yet, and close() would wait for it.
        sampler = make_sampler(demo=simulated, pcie=False)
        found_engines: Optional[list] = None
        engines_error: Optional[str] = None
        slurm = None
        try:
            if not sampler.simulated:
                # The first host reading opens the rate window; the engine scan and sinfo run inside it,
                # and only the rest of the window is waited (a timed wait, not a hope).
                started = time.monotonic()
                if interval_s > 0:
                    sampler.prime_rates()
                # The GPU driver's session start runs beside the engine scan, inside the window.
                opener = threading.Thread(target=sampler.open_sources, name="gpudeck-gpu-open", daemon=True)
                opener.start()
                if engines:
                    try:
                        from gpudeck.jobs.engines.discovery import discover_engines, engines_payload
                        found_engines = engines_payload(discover_engines())
                    except ImportError as exc:       # discovery reads processes through psutil
                        engines_error = f"engine discovery unavailable here: {exc}"
                slurm = self._slurm_status()
                opener.join()
                left = interval_s - (time.monotonic() - started)
                if interval_s > 0 and left > 0:
                    threading.Event().wait(left)
            snapshot = sampler.sample()
        finally:
            sampler.close()
        if sampler.simulated:
            slurm = self._slurm_status()
        if found_engines is not None:
            snapshot.extra["engines"] = found_engines
        if slurm is not None:
            snapshot.extra["slurm"] = slurm
        payload = status_payload(snapshot)
        if engines_error is not None:
            payload["engines_error"] = engines_error
        payload["host_name"] = self.name
        return StatusReport(payload)

    def _slurm_status(self) -> Optional[dict]:
        """sinfo of the partitions the jobs file's Slurm jobs use; None without such jobs (or a usable jobs file)."""
        try:
            jobs_file = self.jobs_file()
        except BoxError:
            return None         # status is about the box; `gpudeck check` reports a broken jobs file
        if not any(spec.backend == "slurm" for spec in jobs_file.jobs.values()):
            return None         # no Slurm jobs: not even the Slurm module is loaded
        from gpudeck.jobs.slurm import cluster_status
        return cluster_status(jobs_file)

    def jobs(self) -> JobsListing:
        from gpudeck.jobs.box.results import JobsListing
        from gpudeck.jobs.payload import jobs_payload
        return JobsListing(jobs_payload(self.supervisor()))

    def check(self) -> CheckResult:
        from gpudeck.jobs.box.results import CheckResult
        from gpudeck.jobs.spec import SpecError, load_jobs, load_user_notify
        path = self._readable_jobs_path()
        # config.toml's [notify.*]: the runs started here deliver with them
        everyone, user_problems = load_user_notify()
        user_errors = [str(e) for e in user_problems]
        try:
            jobs_file = load_jobs(path)            # one read: the errors ride on the first one
        except SpecError as exc:
            return CheckResult(str(path), [str(e) for e in exc.errors] + user_errors, [])
        if user_errors:
            return CheckResult(str(path), user_errors, [])
        from gpudeck.jobs.notify_targets import merged, redact_url
        # A webhook URL is often its own token: only its scheme and host ever leave this module.
        targets = [{"name": t["name"], "format": t["format"], "url": redact_url(t["url"]), "on": t.get("on"),
                    "source": t.get("source")} for t in merged(jobs_file.notify, everyone)]
        return CheckResult(str(path), [], list(jobs_file.jobs), targets)

    def doctor(self, job: Optional[str] = None) -> DoctorReport:
        from gpudeck.jobs.box.results import DoctorReport
        from gpudeck.jobs.engines.doctor import doctor_payload, run_doctor
        sup = self._job_supervisor(job) if job is not None else None
        try:
            return DoctorReport(doctor_payload(run_doctor(sup, job), job))
        except ImportError as exc:        # some checks need psutil on the box
            raise BoxError(f"doctor cannot run on this host: {exc}", code=2) from None

    def analyze(self, path: str, *, max_bytes: Optional[int] = None, workers: Optional[int] = None) -> AnalyzeResult:
        from gpudeck.jobs.paths import NotARegularFile, open_regular
        try:
            with open_regular(os.path.expanduser(path)) as fh:
                return analyze_stream_result(fh, max_bytes=max_bytes, regular=True, workers=workers)
        except NotARegularFile as exc:
            raise BoxError(f"cannot analyze {exc}", code=2) from None
        except IsADirectoryError:
            raise BoxError(f"cannot analyze {path}: is a directory", code=2) from None
        except OSError as exc:
            raise BoxError(f"cannot read {path}: {exc.strerror or exc}", code=2) from None

    def read_log(self, job: str, *, run: Optional[str] = None, offset: Optional[int] = None,
                 tail: Optional[int] = None, max_bytes: int = MAX_LOG_CHUNK, wait_s: float = 0.0) -> LogChunk:
        from gpudeck.jobs.box.results import LogChunk
        from gpudeck.jobs.logs.follow import tail_offset
        from gpudeck.jobs.paths import NotARegularFile, open_regular
        found = self.find_run(job, run)
        path = found.log_path
        if offset is None:
            offset = tail_offset(path, int(tail)) if tail is not None else 0
        offset = max(0, int(offset))
        limit = max(1, min(int(max_bytes or MAX_LOG_CHUNK), MAX_LOG_CHUNK))
        deadline = time.monotonic() + max(0.0, min(float(wait_s or 0), MAX_LOG_WAIT_S))
        while True:
            ended = found.exit_record() is not None or found.state().state == "lost"
            try:
                # open_regular: a FIFO planted as output.log would block this read forever
                with open_regular(path) as fh:
                    fh.seek(offset)
                    data = fh.read(limit)
            except FileNotFoundError:
                data = b""
            except (NotARegularFile, OSError) as exc:
                raise BoxError(f"cannot read the log of {job}: {exc}", code=1) from None
            if data or ended or time.monotonic() >= deadline:
                return LogChunk(run_id=found.run_id, offset=offset, next_offset=offset + len(data), data=data,
                                ended=ended and not data)
            time.sleep(LOG_POLL_S)

    def follow_log(self, job: str, write: Callable[[bytes], None], *, run: Optional[str] = None,
                   tail: Optional[int] = None, follow: bool = False, wait_s: float = 5.0,
                   on_idle: Optional[Callable[[], None]] = None) -> int:
        """Box.follow_log with the run found once and its file read in place (a 1 GB log is not 4,000 lookups)."""
        from gpudeck.jobs.logs.follow import tail_offset
        from gpudeck.jobs.paths import NotARegularFile, open_regular
        found = self.find_run(job, run)
        offset = tail_offset(found.log_path, int(tail)) if tail is not None else 0
        fh = None
        try:
            while True:
                ended = found.exit_record() is not None or found.state().state == "lost"
                if fh is None:
                    try:
                        fh = open_regular(found.log_path)
                    except FileNotFoundError:
                        pass
                    except (NotARegularFile, OSError) as exc:
                        raise BoxError(f"cannot read the log of {job}: {exc}", code=1) from None
                data = b""
                if fh is not None:
                    fh.seek(offset)
                    data = fh.read(MAX_LOG_CHUNK)
                if data:
                    write(data)
                    offset += len(data)
                    continue
                if not follow or ended:
                    return offset
                if on_idle is not None:
                    on_idle()
                time.sleep(LOG_POLL_S)
        finally:
            if fh is not None:
                fh.close()

    # -- act -------------------------------------------------------------------------------------
    def start(self, job: str) -> Started:
        from gpudeck.jobs.box.results import Started
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._job_supervisor(job)
        try:
            return Started(job=job, run_id=sup.start(job))
        except SupervisorError as exc:
            raise BoxError(str(exc), code=1) from None

    def stop(self, job: str, *, timeout: Optional[float] = None) -> Stopped:
        from gpudeck.jobs.box.results import Stopped
        from gpudeck.jobs.pipeline import stop_pipeline
        from gpudeck.jobs.pipeline_records import latest_pipeline
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._job_supervisor(job)
        notes = []
        # Stopping a pipeline's target stops the pipeline too (it stops its current stage itself).
        pipe = latest_pipeline(job, sup.state_dir)
        if pipe is not None and pipe.state() == "running" and stop_pipeline(pipe):
            notes.append(f"asked pipeline {pipe.pipeline_id} for {job} to stop")
        try:
            report = sup.stop(job, timeout=timeout)
        except SupervisorError as exc:
            raise BoxError(str(exc), code=1) from None
        return Stopped(job=job, clean=report.clean, lines=notes + report.lines(), report=report.to_jsonable())

    def restart(self, job: str, *, timeout: Optional[float] = None) -> Restarted:
        from gpudeck.jobs.box.results import Restarted
        stopped = self.stop(job, timeout=timeout)
        if not stopped.clean:
            return Restarted(stopped=stopped, run_id=None)
        return Restarted(stopped=stopped, run_id=self.start(job).run_id)

    def run(self, job: str) -> PipelineStarted:
        from gpudeck.jobs.box.results import PipelineStarted
        from gpudeck.jobs.pipeline import PipelineError, start_pipeline
        sup = self._job_supervisor(job)
        try:
            pipe = start_pipeline(sup, job)
        except PipelineError as exc:
            raise BoxError(str(exc), code=1) from None
        return PipelineStarted(job=job, pipeline_id=pipe.pipeline_id, stages=list(pipe.meta()["stages"]))

    def pipeline(self, job: str, pipeline_id: str, *, seen: int = 0) -> PipelineProgress:
        from gpudeck.jobs.box.results import PipelineProgress
        from gpudeck.jobs.pipeline_records import list_pipelines
        sup = self.supervisor()
        pipe = next((p for p in list_pipelines(job, sup.state_dir) if p.pipeline_id == pipeline_id), None)
        if pipe is None:
            raise BoxError(f"no pipeline {pipeline_id} for {job}", code=2)
        events = pipe.events()
        return PipelineProgress(events=events[max(0, int(seen)):], count=len(events), result=pipe.result(),
                                state=pipe.state())

    def _plan(self, target: str, stop_foreign: bool) -> tuple[Supervisor, Any]:
        try:
            from gpudeck.jobs.engines.pivot import PivotError, plan_pivot
            sup = self.supervisor()
            return sup, plan_pivot(sup, target, stop_foreign=stop_foreign)
        except ImportError as exc:        # engine discovery reads processes and sockets through psutil
            raise BoxError(f"pivot cannot run on this host: {exc} (install psutil for its {sys.executable}, "
                           "or set `python` in hosts.toml to one that has it)", code=2) from None
        except PivotError as exc:
            raise BoxError(str(exc), code=2) from None

    def pivot_plan(self, target: str, *, stop_foreign: bool = False) -> PivotPlan:
        from gpudeck.jobs.box.results import PivotPlan
        _, plan = self._plan(target, stop_foreign)
        return PivotPlan(target=target, stop_foreign=stop_foreign, lines=plan.lines(), plan=plan.to_jsonable())

    def pivot(self, plan: PivotPlan, *, wait: bool = False, on_step: Optional[Callable[[dict], None]] = None,
              ready_deadline_s: Optional[float] = None, gpu_deadline_s: Optional[float] = None) -> PivotOutcome:
        from gpudeck.jobs.box.results import PivotOutcome
        from dataclasses import asdict

        from gpudeck.jobs.engines.pivot import execute_pivot
        sup, fresh = self._plan(plan.target, plan.stop_foreign)
        if plan.plan and stops_key(fresh.to_jsonable()) != stops_key(plan.plan):
            raise BoxError("what the pivot would stop changed since the plan was shown; nothing was "
                           "stopped: run the pivot again to see the new plan", code=2)
        deadlines: dict[str, float] = {}
        if ready_deadline_s is not None:
            deadlines["ready_deadline_s"] = ready_deadline_s
        if gpu_deadline_s is not None:
            deadlines["gpu_deadline_s"] = gpu_deadline_s
        def step_done(step: Any) -> None:
            if on_step is not None:
                on_step(asdict(step))
        result = execute_pivot(sup, fresh, wait=wait, on_step=step_done, **deadlines)
        return PivotOutcome.from_result(result.to_jsonable(), result.overhead_s)

    def pivot_ready(self, target: str, run_id: Optional[str], wait_s: float) -> dict:
        """Whether the pivot's target is ready, waiting up to `wait_s` (the agent's half of a remote --wait)."""
        from gpudeck.jobs.engines.profiles import engine_settings
        from gpudeck.jobs.engines.readiness import wait_until_ready
        sup = self._job_supervisor(target)
        settings = engine_settings(sup.spec(target))
        if settings is None:
            raise BoxError(f"{target} is not an engine job", code=2)
        found = self.find_run(target, run_id)

        def alive() -> bool:
            state = sup.job_state(target)
            return bool(state.live and state.run_id == found.run_id)
        state = wait_until_ready(settings, found.log_path, deadline_s=min(max(0.0, wait_s), MAX_LOG_WAIT_S), alive=alive)
        live = alive()
        return {"ready": state.ready, "alive": live,
                "detail": state.detail if state.ready or live else "the engine exited before it was ready"}

    def stacks(self, job: str, *, native: bool = False) -> StacksResult:
        from gpudeck.jobs.box.results import StacksResult
        from gpudeck.jobs.stacks import StacksUnavailable, render_lines
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._job_supervisor(job)
        try:
            result = sup.stacks(job, native=native)
        except StacksUnavailable as exc:
            return StacksResult(refused=str(exc), code=2)
        except SupervisorError as exc:
            return StacksResult(refused=str(exc), code=1)
        return StacksResult(dump=result.to_jsonable(), lines=render_lines(result))

    # -- remember --------------------------------------------------------------------------------
    def _index(self) -> Any:
        import sqlite3

        from gpudeck.jobs.history.index import IndexUnavailable, RunIndex
        index = RunIndex()
        try:
            index.sync()
        except IndexUnavailable as exc:          # locked, disk full, a symlink: its message names the file
            raise BoxError(str(exc), code=1) from None
        except sqlite3.Error as exc:
            raise BoxError(f"run index {index.path}: {exc}", code=1) from None
        return index

    def runs(self, *, job: Optional[str] = None, failed: bool = False, since: Optional[float] = None,
             limit: Optional[int] = None, columns: Optional[tuple[str, ...]] = None) -> RunsListing:
        from gpudeck.jobs.box.results import RunsListing
        with self._index() as index:
            rows = index.query(job=job, failed=failed, since=since, limit=limit,
                               **({"columns": tuple(columns)} if columns else {}))
            notes = [index.rebuilt_reason] if index.rebuilt_reason else []
        return RunsListing(rows=rows, notes=notes)

    def reindex(self) -> Reindexed:
        from gpudeck.jobs.box.results import Reindexed
        from gpudeck.jobs.history.index import ReindexFailed, RunIndex, reindex
        index = RunIndex()
        try:
            count, seconds = reindex(index)
        except ReindexFailed as exc:
            raise BoxError(str(exc), code=1) from None
        finally:
            index.close()
        return Reindexed(count=count, path=str(index.path), seconds=seconds)

    def prune(self, *, keep: Optional[int] = None, older_s: Optional[float] = None, job: Optional[str] = None,
              yes: bool = False) -> Pruned:
        from gpudeck.jobs.box.results import Pruned
        from gpudeck.jobs.history.retention import plan_prune, prune
        from gpudeck.jobs.spec import JobSpec
        default: int = JobSpec.log_keep                 # the dataclass default, read off the class
        try:
            jobs = self.jobs_file().jobs
        except BoxError:
            jobs = {}                                   # no jobs file here: every job keeps the default
        if keep is None and older_s is None:
            def keep_for(name: str) -> Optional[int]:
                return jobs[name].log_keep if name in jobs else default
        else:
            def keep_for(name: str) -> Optional[int]:
                return None
        with self._index() as index:
            candidates = plan_prune(index, keep=keep, older_s=older_s, job=job, keep_for=keep_for)
            removed = prune(index, candidates) if yes and candidates else None
        return Pruned(candidates=[c.to_json() for c in candidates],
                      removed=len(removed) if removed is not None else (0 if yes else None))

    def run_record(self, job: str, run_id: Optional[str] = None) -> Path:
        return self.find_run(job, run_id).path

    def record_file(self, job: str, run_id: str, name: str, offset: int = 0) -> dict:
        """Bytes of one file of a run's record from `offset` (the agent's half of RemoteBox.run_record)."""
        import base64

        from gpudeck.jobs.box import RECORD_FILES
        from gpudeck.jobs.paths import NotARegularFile, open_regular
        if name not in RECORD_FILES:
            raise BoxError(f"bad request: {name!r} is not a file of a run's record", code=2)
        path = self.find_run(job, run_id).path / name
        try:
            with open_regular(path) as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, int(offset)))
                data = fh.read(MAX_LOG_CHUNK)
        except FileNotFoundError:
            return {"size": None, "data": ""}
        except (NotARegularFile, OSError) as exc:
            raise BoxError(f"cannot read {name} of {job}/{run_id}: {exc}", code=1) from None
        return {"size": size, "data": base64.b64encode(data).decode("ascii")}

    def postmortem(self, target: Optional[str] = None) -> Postmortem:
        from gpudeck.jobs.box.results import Postmortem
        from gpudeck.jobs.history.postmortem import PostmortemError, build
        if not target:
            try:
                with self._index() as index:
                    rows = index.query(kinds=["job"], limit=1, columns=("run_id",))
            except BoxError as exc:
                raise BoxError(f"no run given and the run index is unusable: {exc}", code=2) from None
            if not rows:
                raise BoxError("no runs yet: give a run id, a job or a log file", code=2)
            target = str(rows[0]["run_id"])
        try:
            return Postmortem(report=build(target))
        except PostmortemError as exc:
            raise BoxError(str(exc), code=2) from None


def stops_key(plan: dict) -> list:
    """What a pivot plan would stop, as comparable values (pid and start time name a process)."""
    return [(s.get("kind"), s.get("pid"), s.get("create_time"), s.get("job"), s.get("run_id"))
            for s in plan.get("stops") or []]


def analyze_stream_result(stream: Any, *, max_bytes: Optional[int] = None, regular: bool = False,
                          workers: Optional[int] = None) -> AnalyzeResult:
    """An open byte stream (a log file of this machine, or its stdin) analysed into the Box's result;
    `regular`: a regular file at its start, whose byte passes may be spread over `workers` processes."""
    from gpudeck.jobs.box.analyze_result import AnalyzeResult
    from dataclasses import asdict

    from gpudeck.jobs.logs.analyze import analyze_stream
    if regular:
        from gpudeck.jobs.logs.analyze.parallel import analyze_regular
        analysis, truncated = analyze_regular(stream, max_bytes=max_bytes, workers=workers)
    else:
        analysis, truncated = analyze_stream(stream, max_bytes=max_bytes)
    return AnalyzeResult(analysis=analysis.to_json(), raw=asdict(analysis), truncated=truncated)
