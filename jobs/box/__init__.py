"""The Box: the core's public surface — one interface every face (CLI, console, exporter, web) speaks to a box through.

A box is a machine with GPUs and jobs: this one (`LocalBox`, the core called directly) or
one reached over SSH (`RemoteBox`, the same calls answered by the box's agent, which
serves a LocalBox there). Both return the same typed results (`gpudeck.jobs.box.results`)
and raise only `BoxError`, so a face has one code path and never asks which box it has.

    box = open_box("gpu-7")          # or open_box(None): this machine
    with box:
        print(box.start("vllm").run_id)
        for line in box.stop("vllm").lines: ...

Stdlib only at import time: the agent imports this package on the box.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from pathlib import Path

    from gpudeck.jobs.box.results import (AnalyzeResult, BoxInfo, CheckResult, DoctorReport, JobsListing, LogChunk,
                                          PipelineProgress, PipelineStarted, PivotOutcome, PivotPlan, Postmortem,
                                          Pruned, Reindexed, Restarted, RunsListing, StacksResult, Started,
                                          StatusReport, Stopped)

    from gpudeck.jobs.hosts.config import HostSpec

__all__ = ["Box", "BoxError", "open_box", "AnalyzeResult", "BoxInfo", "CheckResult", "DoctorReport", "JobsListing",
           "LogChunk", "PipelineProgress", "PipelineStarted", "PivotOutcome", "PivotPlan", "Postmortem", "Pruned",
           "Reindexed", "Restarted", "RunsListing", "StacksResult", "Started", "StatusReport", "Stopped"]

_RESULTS = frozenset(__all__[3:])


def __getattr__(name: str) -> Any:
    """The results, re-exported on first use (PEP 562): a command that needs one loads results.py then,
    and `gpudeck analyze` (BoxError, LocalBox) never does (local.py imports each where it builds it)."""
    if name in _RESULTS:
        from gpudeck.jobs.box import results
        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A log read waits at most this long for new output: long enough to make following cheap,
# short enough that a dead link is noticed by the next read.
MAX_LOG_WAIT_S = 10.0
MAX_LOG_CHUNK = 256 * 1024
# The files of a run directory a record copy holds (runs.py names them); nothing else is ever read remotely.
RECORD_FILES = ("meta.json", "ids.json", "exit.json", "health.json", "summary.json", "events.jsonl",
                "samples.jsonl", "times", "output.log")


class BoxError(Exception):
    """One line for the operator, and the exit code a CLI gives it.

    code 2: the request was refused (unknown job, no jobs file, a bad argument, read-only box);
    code 1: the box could not do it or could not be reached (a stop that failed, the link down);
    code 3: a --require-gpu box without GPU telemetry.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Box(abc.ABC):
    """One box. Every method blocks (a UI calls it off its UI thread) and raises only BoxError."""

    #: the box's name as the operator gave it ("local" for this machine, a hosts.toml name otherwise)
    name: str = "local"
    #: True for this machine: its files (a log given as a path, stdin) are the caller's files
    local: bool = True

    # -- who ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def info(self) -> BoxInfo:
        """Where the box is and what answers for it (hostname, agent version, read-only)."""

    # -- see ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def status(self, *, interval_s: float = 0.1, engines: bool = True, simulated: bool = False) -> StatusReport:
        """One telemetry snapshot: GPUs, host, listening ports, engines (`engines`), Slurm partitions.

        Rates need two readings `interval_s` apart (0: one reading, rates null). `simulated`: the
        SIMULATED 8-GPU box instead of the driver. Without a GPU the report says why (gpu_error)."""

    @abc.abstractmethod
    def jobs(self) -> JobsListing:
        """Every declared job with its state (idle, starting, running, stopping, exited, stopped, lost),
        phase, progress, alerts, serving numbers, and the pipelines. Raises (code 2) without a jobs file."""

    @abc.abstractmethod
    def check(self) -> CheckResult:
        """The box's jobs file (and config.toml's notify targets) read strictly: every located error."""

    @abc.abstractmethod
    def doctor(self, job: Optional[str] = None) -> DoctorReport:
        """Why a job may not start here: driver, free GPUs, the job's interpreter and imports, port, disk."""

    @abc.abstractmethod
    def analyze(self, path: str, *, max_bytes: Optional[int] = None, workers: Optional[int] = None) -> AnalyzeResult:
        """A log file of the box read there (only the answer travels): engine, phase, progress, failure.
        workers: processes for a large file's byte passes (None: one per core of the box; 1: one)."""

    @abc.abstractmethod
    def read_log(self, job: str, *, run: Optional[str] = None, offset: Optional[int] = None,
                 tail: Optional[int] = None, max_bytes: int = MAX_LOG_CHUNK, wait_s: float = 0.0) -> LogChunk:
        """Bytes of a run's output.log (its latest run, or `run`) from `offset` — or, with no offset, from the
        last `tail` lines (None: the start) — waiting up to `wait_s` for new bytes. Code 2: no such run."""

    def follow_log(self, job: str, write: Callable[[bytes], None], *, run: Optional[str] = None,
                   tail: Optional[int] = None, follow: bool = False, wait_s: float = 5.0,
                   on_idle: Optional[Callable[[], None]] = None) -> int:
        """Write a run's bytes to `write` (all, or the last `tail` lines); with `follow`, until the run ends,
        calling `on_idle()` after each read that brought nothing (at most `wait_s` apart).
        Returns the final offset. Each read names its offset and pins the run: a reconnect in between
        resumes exactly there, with no gap, no repeat and no bytes of a newer run mixed in."""
        offset: Optional[int] = None
        run_id = run
        while True:
            chunk = self.read_log(job, run=run_id, offset=offset, tail=tail if offset is None else None,
                                  wait_s=wait_s if follow else 0.0)
            run_id = chunk.run_id
            if chunk.data:
                write(chunk.data)
            offset = chunk.next_offset
            if chunk.ended or (not follow and not chunk.data):
                return offset
            if not chunk.data and on_idle is not None:
                on_idle()

    # -- act --------------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, job: str) -> Started:
        """Start a detached run of `job`. Code 2: unknown job; 1: it could not start (already running…)."""

    @abc.abstractmethod
    def stop(self, job: str, *, timeout: Optional[float] = None) -> Stopped:
        """Stop signal, grace (`timeout`, default the job's stop_timeout), SIGKILL of the tree, then proof:
        no process left, port free, no GPU memory held. A running pipeline of `job` is asked to stop first."""

    @abc.abstractmethod
    def restart(self, job: str, *, timeout: Optional[float] = None) -> Restarted:
        """stop, then start only if the stop was clean."""

    @abc.abstractmethod
    def run(self, job: str) -> PipelineStarted:
        """A detached pipeline: `job` after everything it needs (stages whose done_when exists are skipped)."""

    @abc.abstractmethod
    def pipeline(self, job: str, pipeline_id: str, *, seen: int = 0) -> PipelineProgress:
        """A pipeline's events from index `seen` on, its result once it ended, and its state."""

    @abc.abstractmethod
    def pivot_plan(self, target: str, *, stop_foreign: bool = False) -> PivotPlan:
        """What switching to engine job `target` would stop (engines, their GPUs and ports). Code 2: no such engine."""

    @abc.abstractmethod
    def pivot(self, plan: PivotPlan, *, wait: bool = False, on_step: Optional[Callable[[dict], None]] = None,
              ready_deadline_s: Optional[float] = None, gpu_deadline_s: Optional[float] = None) -> PivotOutcome:
        """Carry out a confirmed plan: stop, prove GPUs and ports free, start the target; with `wait`, until it is
        ready. `on_step(step)` as each step completes. Nothing is stopped if the plan went stale meanwhile."""

    @abc.abstractmethod
    def stacks(self, job: str, *, native: bool = False) -> StacksResult:
        """The live run's Python stacks grouped (py-spy on the box); a refusal is a result, with its code."""

    # -- remember ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def runs(self, *, job: Optional[str] = None, failed: bool = False, since: Optional[float] = None,
             limit: Optional[int] = None, columns: Optional[tuple[str, ...]] = None) -> RunsListing:
        """Rows of the box's run index (synced first), newest first."""

    @abc.abstractmethod
    def reindex(self) -> Reindexed:
        """The run index rebuilt from the run directories."""

    @abc.abstractmethod
    def prune(self, *, keep: Optional[int] = None, older_s: Optional[float] = None, job: Optional[str] = None,
              yes: bool = False) -> Pruned:
        """What retention would delete (each job's log_keep, or `keep` / `older_s`); with `yes`, delete it."""

    @abc.abstractmethod
    def run_record(self, job: str, run_id: Optional[str] = None) -> "Path":
        """A directory on this machine holding the run's record (meta, output.log, times, events, samples,
        exit, health): the run itself for this machine; for a remote box a private copy fetched by offset
        (a second call fetches only what grew). What a replay plays and a post-mortem can re-read."""

    @abc.abstractmethod
    def postmortem(self, target: Optional[str] = None) -> Postmortem:
        """The report of a run (a run id, a job's latest run; None: the box's latest run). Code 2: none such."""

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Let go of what the box holds (a remote box's link); the box's jobs are never touched."""

    def __enter__(self) -> "Box":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_box(host: "Optional[str | HostSpec]" = None, *, jobs_file: Optional[str] = None,
             readonly: bool = False) -> Box:
    """The box `host` names: None, "local" or a local hosts.toml entry → this machine; another name (or a
    HostSpec) → that box over SSH. `jobs_file` is this machine's --jobs (a remote box has its own in
    hosts.toml). `readonly`: reach a remote box through an agent that refuses to act. BoxError (code 2)
    for an unknown host name or a broken hosts.toml."""
    from gpudeck.jobs.hosts.config import HostConfigError, HostSpec, resolve_host
    if isinstance(host, HostSpec):
        spec = host
    else:
        try:
            spec = resolve_host(host)
        except HostConfigError as exc:
            raise BoxError(str(exc), code=2) from None
    if spec.local:
        from gpudeck.jobs.box.local import LocalBox
        return LocalBox(jobs_file=jobs_file, name=spec.name)
    if readonly and not spec.readonly:
        import dataclasses
        spec = dataclasses.replace(spec, readonly=True)
    from gpudeck.jobs.box.remote import RemoteBox
    return RemoteBox(spec)
