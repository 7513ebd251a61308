"""What a Box answers: one typed result per request, serialised once (`to_json`) and rebuilt on arrival (`from_json`).

A LocalBox builds these from the core's objects; the agent sends `to_json()` over the
link; a RemoteBox rebuilds them with `from_json()` from a reply that `hosts/replies.py`
has already checked against its shape. So every face reads the same fields, typed,
whichever box answered — and a hostile box can only ever produce a result that fits.
Stdlib only (the agent imports this module on the box).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Optional

# AnalyzeResult is one of these, in a module of its own (see there); _dict is shared with it.
from gpudeck.jobs.box.analyze_result import AnalyzeResult as AnalyzeResult, _dict  # noqa: F401


def _str_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


@dataclass(frozen=True)
class BoxInfo:
    """Who answers: the box's name here, where it is, its agent (remote) and whether it refuses to act."""
    name: str
    local: bool
    hostname: str
    readonly: bool = False
    via: Optional[str] = None           # remote: "installed" or "zipapp"
    version: Optional[str] = None
    python: Optional[str] = None
    pid: Optional[int] = None
    state_dir: Optional[str] = None
    jobs_file: Optional[str] = None

    def to_json(self) -> dict:
        return {"hostname": self.hostname, "readonly": self.readonly, "via": self.via, "version": self.version,
                "python": self.python, "pid": self.pid, "state_dir": self.state_dir, "jobs_file": self.jobs_file}

    @classmethod
    def from_hello(cls, name: str, hello: dict) -> "BoxInfo":
        pid = hello.get("pid")
        return cls(name=name, local=False, hostname=str(hello.get("hostname") or name),
                   readonly=bool(hello.get("readonly")), via=_opt_str(hello.get("via")),
                   version=_opt_str(hello.get("version")), python=_opt_str(hello.get("python")),
                   pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                   state_dir=_opt_str(hello.get("state_dir")), jobs_file=_opt_str(hello.get("jobs_file")))


@dataclass(frozen=True)
class StatusReport:
    """One snapshot of the box: the `gpudeck status --json` object (GPUs, host, ports, engines, Slurm)."""
    payload: dict

    @property
    def gpus(self) -> list:
        gpus = self.payload.get("gpus")
        return gpus if isinstance(gpus, list) else []

    @property
    def gpu_error(self) -> Optional[str]:
        return _opt_str(self.payload.get("gpu_error"))

    @property
    def simulated(self) -> bool:
        return bool(self.payload.get("simulated"))

    def snapshot(self) -> Any:
        """The payload as a telemetry Snapshot (what the dashboard and the status table draw)."""
        from gpudeck.jobs.telemetry.status import snapshot_from_payload
        return snapshot_from_payload(self.payload)

    def to_json(self) -> dict:
        return self.payload


@dataclass(frozen=True)
class JobsListing:
    """Every declared job with its state: the `gpudeck jobs --json` document (jobs, pipelines)."""
    payload: dict

    @property
    def jobs(self) -> list[dict]:
        jobs = self.payload.get("jobs")
        return [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []

    @property
    def pipelines(self) -> list[dict]:
        pipes = self.payload.get("pipelines")
        return [p for p in pipes if isinstance(p, dict)] if isinstance(pipes, list) else []

    def to_json(self) -> dict:
        return self.payload

    @classmethod
    def from_json(cls, obj: Any) -> "JobsListing":
        return cls(payload=_dict(obj))


@dataclass(frozen=True)
class CheckResult:
    """`gpudeck check`: the jobs file read, every located error, and the job names when there were none."""
    path: str
    errors: list[str]
    jobs: list[str]
    # notify targets the runs deliver to: {name, format, url (scheme and host only), on, source}
    targets: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"path": self.path, "errors": self.errors, "jobs": self.jobs, "targets": self.targets}

    @classmethod
    def from_json(cls, obj: Any) -> "CheckResult":
        obj = _dict(obj)
        targets = obj.get("targets")
        return cls(path=str(obj.get("path") or "?"), errors=_str_list(obj.get("errors")), jobs=_str_list(obj.get("jobs")),
                   targets=[t for t in targets if isinstance(t, dict)] if isinstance(targets, list) else [])


@dataclass(frozen=True)
class DoctorReport:
    """`gpudeck doctor [JOB]`: the checks' JSON (driver, free GPUs, interpreter, port, disk, build RAM)."""
    payload: dict

    def to_json(self) -> dict:
        return self.payload

    @classmethod
    def from_json(cls, obj: Any) -> "DoctorReport":
        return cls(payload=_dict(obj))


@dataclass(frozen=True)
class Started:
    """A run started (detached: it outlives the command, the console and the link)."""
    job: str
    run_id: str

    def to_json(self) -> dict:
        return {"run_id": self.run_id}

    @classmethod
    def from_json(cls, obj: Any, job: str) -> "Started":
        return cls(job=job, run_id=str(_dict(obj).get("run_id")))


@dataclass(frozen=True)
class Stopped:
    """A stop done and verified: the report's lines, its JSON, and whether nothing of the run remains."""
    job: str
    clean: bool
    lines: list[str]
    report: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"report": self.report, "lines": self.lines, "clean": self.clean}

    @classmethod
    def from_json(cls, obj: Any, job: str) -> "Stopped":
        obj = _dict(obj)
        return cls(job=job, clean=bool(obj.get("clean")), lines=_str_list(obj.get("lines")),
                   report=_dict(obj.get("report")))


@dataclass(frozen=True)
class Restarted:
    """A restart: the stop's result, and the new run (None: the old run did not stop clean, nothing started)."""
    stopped: Stopped
    run_id: Optional[str]

    def to_json(self) -> dict:
        return {**self.stopped.to_json(), "run_id": self.run_id}

    @classmethod
    def from_json(cls, obj: Any, job: str) -> "Restarted":
        return cls(stopped=Stopped.from_json(obj, job), run_id=_opt_str(_dict(obj).get("run_id")))


@dataclass(frozen=True)
class PipelineStarted:
    """`gpudeck run JOB`: the detached pipeline's id and its stages in order."""
    job: str
    pipeline_id: str
    stages: list[str]

    def to_json(self) -> dict:
        return {"pipeline_id": self.pipeline_id, "stages": self.stages}

    @classmethod
    def from_json(cls, obj: Any, job: str) -> "PipelineStarted":
        obj = _dict(obj)
        return cls(job=job, pipeline_id=str(obj.get("pipeline_id")), stages=_str_list(obj.get("stages")))


@dataclass(frozen=True)
class PipelineProgress:
    """A pipeline's events from an index on, how many there are, its result (None: still going) and state."""
    events: list[dict]
    count: int
    result: Optional[dict]
    state: str

    def to_json(self) -> dict:
        return {"events": self.events, "count": self.count, "result": self.result, "state": self.state}

    @classmethod
    def from_json(cls, obj: Any) -> "PipelineProgress":
        obj = _dict(obj)
        events = obj.get("events")
        count = obj.get("count")
        return cls(events=[e for e in events if isinstance(e, dict)] if isinstance(events, list) else [],
                   count=count if isinstance(count, int) and not isinstance(count, bool) else 0,
                   result=obj.get("result") if isinstance(obj.get("result"), dict) else None,
                   state=str(obj.get("state") or "unknown"))


@dataclass(frozen=True)
class PivotPlan:
    """What a pivot to `target` would stop and start: the lines shown for confirmation, and the plan's JSON
    (handed back to `Box.pivot`, which refuses when what it would stop changed meanwhile)."""
    target: str
    stop_foreign: bool
    lines: list[str]
    plan: dict

    def to_json(self) -> dict:
        return {"lines": self.lines, "plan": self.plan}

    @classmethod
    def from_json(cls, obj: Any, target: str, stop_foreign: bool) -> "PivotPlan":
        obj = _dict(obj)
        return cls(target=target, stop_foreign=stop_foreign, lines=_str_list(obj.get("lines")),
                   plan=_dict(obj.get("plan")))


@dataclass(frozen=True)
class PivotOutcome:
    """A pivot's end: ok, the message, every step ({name, ok, duration_s, detail}), the new run, timings."""
    ok: bool
    message: str
    steps: list[dict]
    run_id: Optional[str]
    duration_s: float
    overhead_s: float
    result: dict                     # the core's PivotResult JSON, as `pivot --json` prints it

    @classmethod
    def from_result(cls, result: dict, overhead_s: float) -> "PivotOutcome":
        steps = result.get("steps")
        duration = result.get("duration_s")
        return cls(ok=bool(result.get("ok")), message=str(result.get("message") or ""),
                   steps=[s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else [],
                   run_id=_opt_str(result.get("run_id")),
                   duration_s=float(duration) if isinstance(duration, (int, float)) else 0.0,
                   overhead_s=float(overhead_s), result=result)


@dataclass(frozen=True)
class LogChunk:
    """Bytes of a run's output.log from `offset` to `next_offset`; `ended`: the run had ended and nothing is left."""
    run_id: str
    offset: int
    next_offset: int
    data: bytes
    ended: bool

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "offset": self.offset, "next_offset": self.next_offset,
                "data": base64.b64encode(self.data).decode("ascii"), "ended": self.ended}

    @classmethod
    def from_json(cls, obj: Any) -> "LogChunk":
        obj = _dict(obj)
        data = base64.b64decode(obj.get("data") or "")
        offset = int(obj.get("offset") or 0)
        return cls(run_id=str(obj.get("run_id")), offset=offset,
                   next_offset=int(obj.get("next_offset") or offset + len(data)), data=data, ended=bool(obj.get("ended")))


@dataclass(frozen=True)
class RunsListing:
    """Rows of the box's run index (synced first), newest first: the `gpudeck runs --json` rows."""
    rows: list[dict]
    notes: list[str] = field(default_factory=list)       # e.g. "the run index was rebuilt: …"

    def to_json(self) -> dict:
        return {"runs": self.rows, "notes": self.notes}

    @classmethod
    def from_json(cls, obj: Any) -> "RunsListing":
        obj = _dict(obj)
        rows = obj.get("runs")
        return cls(rows=[r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else [],
                   notes=_str_list(obj.get("notes")))


@dataclass(frozen=True)
class Reindexed:
    """The run index rebuilt from the run directories: how many runs, where the index is, how long it took."""
    count: int
    path: str
    seconds: float

    def to_json(self) -> dict:
        return {"count": self.count, "path": self.path, "seconds": self.seconds}

    @classmethod
    def from_json(cls, obj: Any) -> "Reindexed":
        obj = _dict(obj)
        return cls(count=int(obj.get("count") or 0), path=str(obj.get("path") or "?"),
                   seconds=float(obj.get("seconds") or 0.0))


@dataclass(frozen=True)
class Pruned:
    """Runs that retention would delete ({job, run_id, reason, bytes…}); `removed`: how many were, with `yes`."""
    candidates: list[dict]
    removed: Optional[int] = None

    def to_json(self) -> dict:
        out: dict = {"candidates": self.candidates}
        if self.removed is not None:
            out["removed"] = self.removed
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Pruned":
        obj = _dict(obj)
        cands = obj.get("candidates")
        removed = obj.get("removed")
        return cls(candidates=[c for c in cands if isinstance(c, dict)] if isinstance(cands, list) else [],
                   removed=removed if isinstance(removed, int) and not isinstance(removed, bool) else None)


@dataclass(frozen=True)
class Postmortem:
    """A run's post-mortem report (the `postmortem --format json` object), built on the box that holds the run."""
    report: dict

    def to_json(self) -> dict:
        return {"report": self.report}

    @classmethod
    def from_json(cls, obj: Any) -> "Postmortem":
        return cls(report=_dict(_dict(obj).get("report")))


@dataclass(frozen=True)
class StacksResult:
    """`gpudeck stacks JOB`: the grouped dump and its lines, or why it could not be taken (code 2: no py-spy or
    no ptrace; 1: the job is not running)."""
    dump: Optional[dict] = None
    lines: list[str] = field(default_factory=list)
    refused: Optional[str] = None
    code: int = 0

    def to_json(self) -> dict:
        if self.refused is not None:
            return {"refused": self.refused, "code": self.code}
        return {"dump": self.dump, "lines": self.lines}

    @classmethod
    def from_json(cls, obj: Any) -> "StacksResult":
        obj = _dict(obj)
        if obj.get("refused") is not None:
            code = obj.get("code")
            return cls(refused=str(obj["refused"]), code=code if code in (1, 2) else 1)
        return cls(dump=_dict(obj.get("dump")), lines=_str_list(obj.get("lines")))
