"""Pipelines: run a job after everything it `needs`, as a detached stdlib-only process that advances with no console open.

`start_pipeline()` writes <state_dir>/pipelines/<target>/<id>/meta.json (the
stages and a snapshot of their specs) and launches `python -m gpudeck.jobs.pipeline
--detach DIR`, which runs each stage in dependency order: skip it when its
`done_when` path exists, else start it (through the Supervisor, so it is an
ordinary run with its own run directory) and wait for its exit; stop at the
first failure. Progress is events.jsonl; the end is result.json.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpudeck.jobs import paths
from gpudeck.jobs.pipeline_records import META, RESULT, Pipeline, latest_pipeline, pipelines_root
from gpudeck.jobs.procs import ProcessId, identity, signal_process
from gpudeck.jobs.runs import (PRIVATE_DIR_MODE, ensure_private_dir, new_run_id, open_private, run_dir_main,
                               state_root, write_json_atomic)
from gpudeck.jobs.spec import file_settings, spec_snapshot

if TYPE_CHECKING:
    from gpudeck.jobs.spec import JobSpec, JobsFile
    from gpudeck.jobs.supervisor import Supervisor

POLL_S = 0.5
# After a Slurm stage fails, how long its dependants get for Slurm to cancel them itself.
DOOMED_WAIT_S = 10.0


class PipelineError(Exception):
    """A pipeline that cannot be planned or started (unknown job, cycle, one already running)."""


def plan(jobs_file: JobsFile, target: str) -> list[str]:
    """`target` after everything it needs, transitively; dependencies first, ties in file order."""
    if target not in jobs_file.jobs:
        raise PipelineError(f"no job named {target!r} in {jobs_file.path}")
    order: list[str] = []
    state: dict[str, int] = {}        # 1 visiting, 2 done

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise PipelineError("dependency cycle: " + " -> ".join(chain + [name]))
        if name not in jobs_file.jobs:
            raise PipelineError(f"{chain[-1]} needs unknown job {name!r}")
        state[name] = 1
        for dep in jobs_file.jobs[name].needs:
            visit(dep, chain + [name])
        state[name] = 2
        order.append(name)

    visit(target, [])
    return order


def start_pipeline(supervisor: Supervisor, target: str) -> Pipeline:
    """Plan, record and launch a detached pipeline for `target`; returns at once."""
    stages = plan(supervisor.jobs_file, target)
    parent = ensure_private_dir(ensure_private_dir(pipelines_root(state_root(supervisor.state_dir))) / target)
    # Check-then-create under a per-target lock: two `gpudeck run X` at once start one pipeline.
    lock_fd = open_private(parent / ".start.lock", os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        current = latest_pipeline(target, supervisor.state_dir)
        if current is not None and current.state() == "running":
            raise PipelineError(f"a pipeline for {target} is already running ({current.pipeline_id})")
        while True:
            path = parent / new_run_id()
            try:
                os.mkdir(path, PRIVATE_DIR_MODE)
                os.chmod(path, PRIVATE_DIR_MODE)
                break
            except FileExistsError:
                continue
        pipe = Pipeline(path)
        write_json_atomic(path / META, {
            "target": target, "stages": stages, "created_at": time.time(),
            # Absolute: the pipeline process runs in another directory, and stages' cwd is relative to it.
            "jobs_file": str(Path(supervisor.jobs_file.path).resolve()), "state_dir": str(supervisor.state_dir),
            "specs": {name: spec_snapshot(supervisor.jobs_file.jobs[name]) for name in stages},
            # Every file-wide setting (vars, the default on_alert, ...): the stages' runs need them too.
            "file_settings": file_settings(supervisor.jobs_file),
        })
    finally:
        os.close(lock_fd)          # closing the fd releases the lock
    launch_cwd, launch_env = paths.child_launch({k: v for k, v in os.environ.items() if k != "GPUDECK_RUN_ID"})
    with open(open_private(path / "pipeline.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as diag:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "gpudeck.jobs.pipeline", "--detach", str(path)],
            cwd=launch_cwd, env=launch_env,
            stdin=subprocess.DEVNULL, stdout=diag, stderr=diag, start_new_session=True, close_fds=True)
    try:
        launcher.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return pipe


def stop_pipeline(pipe: Pipeline) -> bool:
    """Ask a running pipeline to stop (it stops its current stage and records the result).

    The pid in the pipeline's meta.json is signalled only if that process is this
    pipeline's own runner (`python -m gpudeck.jobs.pipeline ... PIPELINE_DIR`).
    """
    proc = pipe.process()
    if proc is None or not _is_pipeline_process(proc, pipe.path):
        return False
    return signal_process(proc, signal.SIGTERM)


def _is_pipeline_process(proc: ProcessId, path: Path) -> bool:
    from gpudeck.jobs.procs import cmdline_args, start_time
    if start_time(proc.pid) != proc.start:
        return False
    args = cmdline_args(proc.pid)
    if "gpudeck.jobs.pipeline" not in args:
        return False
    here = os.path.realpath(path)
    return any(os.path.realpath(a) == here for a in args[args.index("gpudeck.jobs.pipeline") + 1:])


class PipelineRunner:
    """The detached process: runs the stages of one pipeline directory."""

    def __init__(self, path: Path) -> None:
        self.pipe = Pipeline(Path(path))
        self.stop_requested = False

    def _supervisor(self) -> Supervisor:
        from gpudeck.jobs.spec import jobs_file_from_snapshot, spec_from_snapshot
        from gpudeck.jobs.supervisor import Supervisor
        meta = self.pipe.meta()
        specs = {name: spec_from_snapshot(data) for name, data in meta["specs"].items()}
        # A record written before file_settings existed kept only the vars.
        settings = meta.get("file_settings") or {"vars": meta.get("vars") or {}}
        jobs_file = jobs_file_from_snapshot(meta["jobs_file"], specs, settings)
        return Supervisor(jobs_file, state_dir=Path(meta["state_dir"]))

    def main(self) -> int:
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        me = identity(os.getpid())
        meta = self.pipe.meta()
        meta["process"] = me.to_jsonable() if me else None
        write_json_atomic(self.pipe.path / META, meta)
        sup = self._supervisor()
        self.pipe.add_event("PipelineStarted", stages=meta["stages"])
        # Slurm stages are queued at once, each --dependency=afterok on the queued stages it
        # needs, so Slurm advances them with or without this process; `queued` are the ones
        # whose end is still to be recorded, in order.
        self.queued: list[tuple[str, str]] = []
        self.slurm_ids: dict[str, str] = {}
        for stage in meta["stages"]:
            if self.stop_requested:
                failed = self._drain(sup)
                return self._finish(False, failed[0] if failed else stage, stopped=True)
            spec = sup.spec(stage)
            done = sup.done_path(spec)
            if done is not None and done.exists():
                self.pipe.add_event("StageSkipped", stage=stage, reason=f"{done} exists")
                continue
            if spec.backend == "slurm":
                error = self._queue(sup, stage, spec)
                if error is not None:
                    self._cancel_queued(sup)
                    self._drain(sup)
                    return self._finish(False, stage, error=error)
                continue
            # A local stage may need any stage queued before it: their ends come first.
            failed = self._drain(sup)
            if failed is not None:
                return self._finish(False, failed[0], **failed[1])
            from gpudeck.jobs.supervisor import JobAlreadyRunning
            try:
                run_id = sup.start(stage, pipeline=self.pipe.pipeline_id)
            except JobAlreadyRunning as exc:
                run_id = exc.run_id         # started by hand meanwhile: wait for that run
            except Exception as exc:
                self.pipe.add_event("StageFailedToStart", stage=stage, error=str(exc))
                return self._finish(False, stage, error=str(exc))
            self.pipe.add_event("StageStarted", stage=stage, run_id=run_id)
            ended = self._record_end(sup, stage, run_id)
            if ended is not None:
                return self._finish(False, stage, **ended)
        failed = self._drain(sup)
        if failed is not None:
            return self._finish(False, failed[0], **failed[1])
        return self._finish(True, None)

    def _queue(self, sup: Supervisor, stage: str, spec: JobSpec) -> Optional[str]:
        """sbatch a Slurm stage after the queued stages it needs; an error message if it could not be."""
        from gpudeck.jobs.runs import find_run
        from gpudeck.jobs.supervisor import JobAlreadyRunning
        after = [self.slurm_ids[dep] for dep in spec.needs if dep in self.slurm_ids]
        try:
            run_id = sup.start(stage, pipeline=self.pipe.pipeline_id, after=after)
        except JobAlreadyRunning as exc:
            run_id = exc.run_id
        except Exception as exc:
            self.pipe.add_event("StageFailedToStart", stage=stage, error=str(exc))
            return str(exc)
        run = find_run(stage, run_id, sup.state_dir)
        job_id = str((run.meta() if run is not None else {}).get("slurm_job_id") or "")
        if job_id:
            self.slurm_ids[stage] = job_id
        self.queued.append((stage, run_id))
        self.pipe.add_event("StageQueued", stage=stage, run_id=run_id, slurm_job_id=job_id or None, after=after)
        return None

    def _drain(self, sup: Supervisor) -> Optional[tuple[str, dict]]:
        """Record the end of every queued stage, in order; (stage, why) of the first that failed, else None."""
        failed: Optional[tuple[str, dict]] = None
        while self.queued:
            stage, run_id = self.queued.pop(0)
            if failed is not None or self.stop_requested:
                # The rest are cancelled (Slurm cancels the dependants of a failure itself;
                # this also ends queued stages that did not depend on it).
                self._stop_stage(sup, stage, run_id)
            why = self._record_end(sup, stage, run_id)
            self.slurm_ids.pop(stage, None)
            if why is not None and failed is None:
                failed = (stage, why)
        return failed

    def _cancel_queued(self, sup: Supervisor) -> None:
        for stage, run_id in self.queued:
            self._stop_stage(sup, stage, run_id)

    def _stop_stage(self, sup: Supervisor, stage: str, run_id: str) -> None:
        from gpudeck.jobs.runs import find_run
        run = find_run(stage, run_id, sup.state_dir)
        if run is not None and run.exit_record() is None and not self.stop_requested \
                and run.meta().get("slurm_after"):
            # Queued after a stage that failed: Slurm cancels it itself (DependencyNeverSatisfied),
            # which says why better than a stop; one whose dependencies all succeeded is stopped.
            from gpudeck.jobs.slurm import doomed
            deadline = time.monotonic() + DOOMED_WAIT_S
            while time.monotonic() < deadline and not doomed(run):
                time.sleep(0.25)
            if doomed(run):
                return
        if run is not None and run.exit_record() is None:
            self.pipe.add_event("StageStopRequested", stage=stage, run_id=run_id)
            try:
                sup.stop(stage)
            except Exception as exc:          # a stage that cannot be stopped must not lose the record
                self.pipe.add_event("StageStopFailed", stage=stage, run_id=run_id, error=str(exc))

    def _record_end(self, sup: Supervisor, stage: str, run_id: str) -> Optional[dict]:
        """Wait for one stage's end and record it; None when it succeeded, else what the result says."""
        record = self._wait(sup, stage, run_id)
        code = record.get("exit_code") if record else None
        ok = record is not None and code == 0
        self.pipe.add_event("StageFinished", stage=stage, run_id=run_id, ok=ok, exit_code=code,
                            signal=(record or {}).get("signal"),
                            stopped=bool((record or {}).get("stopped_by_request")),
                            **({"slurm_state": record["slurm_state"]} if record and record.get("slurm_state") else {}))
        if ok:
            return None
        return {"exit_code": code, "signal": (record or {}).get("signal"),
                "stopped": self.stop_requested or bool((record or {}).get("stopped_by_request"))}

    def _on_term(self, *_: object) -> None:
        self.stop_requested = True

    def _wait(self, sup: Supervisor, stage: str, run_id: str) -> Optional[dict]:
        from gpudeck.jobs.runs import find_run
        run = find_run(stage, run_id, sup.state_dir)
        stop_sent = False
        while run is not None:
            record = run.exit_record()
            if record is not None:
                return record
            if run.meta().get("backend") == "slurm":
                from gpudeck.jobs.slurm import reconcile
                reconcile(run)          # a watcher that died is replaced; an end Slurm reports is recorded
                if run.exit_record() is not None:
                    continue
            if run.state().state == "lost":
                return None
            if self.stop_requested and not stop_sent:
                stop_sent = True
                self.pipe.add_event("StageStopRequested", stage=stage, run_id=run_id)
                sup.stop(stage)
                continue
            time.sleep(POLL_S)
        return None

    def _finish(self, ok: bool, failed_stage: Optional[str], **extra: Any) -> int:
        result = {"ok": ok, "failed_stage": failed_stage, "ended_at": time.time(), **extra}
        write_json_atomic(self.pipe.path / RESULT, result)
        self.pipe.add_event("PipelineFinished", **result)
        return 0 if ok else 1


def _record_crash(runner: PipelineRunner, error: str) -> None:
    runner._finish(False, None, error=error)


def main(argv: Optional[list[str]] = None) -> int:
    return run_dir_main(argv, "gpudeck.jobs.pipeline", lambda d: PipelineRunner(Path(d)), dir_name="PIPELINE_DIR",
                        on_crash=_record_crash)


if __name__ == "__main__":
    raise SystemExit(main())
