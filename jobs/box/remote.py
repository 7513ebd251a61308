"""RemoteBox: the Box interface over SSH — each call one request to the box's agent, its reply rebuilt as the same result."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from gpudeck.jobs.box import MAX_LOG_CHUNK, Box, BoxError
from gpudeck.jobs.box.results import (AnalyzeResult, BoxInfo, CheckResult, DoctorReport, JobsListing, LogChunk,
                                      PipelineProgress, PipelineStarted, PivotOutcome, PivotPlan, Postmortem, Pruned,
                                      Reindexed, Restarted, RunsListing, StacksResult, Started, StatusReport, Stopped)

if TYPE_CHECKING:
    from gpudeck.jobs.hosts.config import HostSpec
    from gpudeck.jobs.hosts.remote import RemoteHost

T = TypeVar("T")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")     # a path part, never "." or ".."
_SAFE_NAME_SUB = re.compile(r"[^A-Za-z0-9_.-]")

# A follow's read waits for the link to come back this long before it gives up on the box.
RECONNECT_TIMEOUT_S = 3600.0


class RemoteBox(Box):
    """A box reached over SSH (hosts.toml). Requests go through the host's link keeper (one kept SSH link
    per host) unless GPUDECK_SSH_MUX=0; replies are checked against their shape before they are read
    (`hosts/replies.py`). A link failure is BoxError code 1; a request the box refused keeps its code."""

    local = False

    def __init__(self, spec: HostSpec, *, query_timeout_s: Optional[float] = None) -> None:
        """`query_timeout_s`: how long a query waits for its answer (default QUERY_TIMEOUT_S, 60 s: a CLI
        command); a console asks with less, so a box gone silent says so within seconds."""
        from gpudeck.jobs.hosts.remote import QUERY_TIMEOUT_S, RemoteHost
        self.query_timeout_s = float(query_timeout_s) if query_timeout_s is not None else QUERY_TIMEOUT_S
        self.spec = spec
        self.name = spec.name
        self.host: RemoteHost = RemoteHost(spec)

    # -- the wire ------------------------------------------------------------------------------
    def _guard(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        from gpudeck.jobs.hosts.errors import HostError, RemoteError
        try:
            return fn(*args, **kwargs)
        except RemoteError as exc:
            raise BoxError(str(exc), code=getattr(exc, "code", 2)) from None
        except HostError as exc:
            raise BoxError(str(exc), code=1) from None

    def call(self, op: str, params: Optional[dict] = None, **kw: Any) -> Any:
        """One request to the agent, its reply checked (a query: re-sent once over a new link if one dropped)."""
        kw.setdefault("timeout", self.query_timeout_s)
        return self._guard(self.host.call, op, params, **kw)

    def action(self, op: str, params: dict) -> Any:
        """A request that changes the box: never re-sent after a lost answer (it may have happened: said so)."""
        return self._guard(self.host.action, op, params)

    def close(self) -> None:
        try:
            self.host.close()
        except Exception:  # noqa: BLE001 - closing a dead link must not mask the real result
            pass

    # -- who -----------------------------------------------------------------------------------
    def info(self) -> BoxInfo:
        return BoxInfo.from_hello(self.name, self._guard(self.host.agent_info))

    # -- see ------------------------------------------------------------------------------------
    def status(self, *, interval_s: float = 0.1, engines: bool = True, simulated: bool = False) -> StatusReport:
        from gpudeck.jobs.hosts.protocol import unpack_status
        params = {"engines": engines, "simulated": simulated}
        payload = unpack_status(self.call("status", params)["full"])
        if not payload.get("simulated") and interval_s > 0:
            # The agent's rates run from its previous reading: a second one `interval_s` later has them.
            threading.Event().wait(interval_s)
            payload = unpack_status(self.call("status", params)["full"])
        payload["host_name"] = self.name
        info = self.info()
        payload["agent"] = {"via": info.via, "version": info.version, "python": info.python,
                            "hostname": info.hostname, "pid": info.pid, "readonly": info.readonly}
        return StatusReport(payload)

    def jobs(self) -> JobsListing:
        return JobsListing.from_json(self.call("jobs"))

    def check(self) -> CheckResult:
        return CheckResult.from_json(self.call("check"))

    def doctor(self, job: Optional[str] = None) -> DoctorReport:
        return DoctorReport.from_json(self.call("doctor", {"job": job}))

    def analyze(self, path: str, *, max_bytes: Optional[int] = None, workers: Optional[int] = None) -> AnalyzeResult:
        params: dict[str, Any] = {"path": path, "max_bytes": max_bytes}
        if workers is not None:                       # (a box of an earlier release knows no "workers")
            params["workers"] = workers
        return AnalyzeResult.from_json(self.call("analyze", params))

    def read_log(self, job: str, *, run: Optional[str] = None, offset: Optional[int] = None,
                 tail: Optional[int] = None, max_bytes: int = MAX_LOG_CHUNK, wait_s: float = 0.0) -> LogChunk:
        params: dict[str, Any] = {"job": job, "run": run, "wait_s": wait_s, "max_bytes": max_bytes}
        if offset is None:
            params["tail"] = tail
        else:
            params["offset"] = offset
        # The first read fails at once on a box that is down; a follow's later ones wait for the reconnect.
        timeout = RECONNECT_TIMEOUT_S + wait_s if offset is not None else self.query_timeout_s
        return LogChunk.from_json(self.call("logs", params, timeout=timeout))

    # -- act ------------------------------------------------------------------------------------
    def start(self, job: str) -> Started:
        return Started.from_json(self.action("start", {"job": job}), job)

    def stop(self, job: str, *, timeout: Optional[float] = None) -> Stopped:
        return Stopped.from_json(self.action("stop", {"job": job, "timeout": timeout}), job)

    def restart(self, job: str, *, timeout: Optional[float] = None) -> Restarted:
        return Restarted.from_json(self.action("restart", {"job": job, "timeout": timeout}), job)

    def run(self, job: str) -> PipelineStarted:
        return PipelineStarted.from_json(self.action("run", {"job": job}), job)

    def pipeline(self, job: str, pipeline_id: str, *, seen: int = 0) -> PipelineProgress:
        return PipelineProgress.from_json(self.call("pipeline", {"job": job, "pipeline_id": pipeline_id,
                                                                 "seen": seen}))

    def pivot_plan(self, target: str, *, stop_foreign: bool = False) -> PivotPlan:
        reply = self.call("pivot_plan", {"target": target, "stop_foreign": stop_foreign})
        return PivotPlan.from_json(reply, target, stop_foreign)

    def pivot(self, plan: PivotPlan, *, wait: bool = False, on_step: Optional[Callable[[dict], None]] = None,
              ready_deadline_s: Optional[float] = None, gpu_deadline_s: Optional[float] = None) -> PivotOutcome:
        """Planned there, confirmed here, stopped and started there; `wait` asks the box until the target is
        ready (each ask bounded, so a dropped link costs one ask, not the pivot)."""
        from gpudeck.jobs.engines.pivot import READY_DEADLINE_S
        params: dict[str, Any] = {"target": plan.target, "stop_foreign": plan.stop_foreign, "plan": plan.plan}
        if gpu_deadline_s is not None:
            params["gpu_deadline_s"] = gpu_deadline_s
        token = self.action("pivot", params)["token"]
        seen = 0
        while True:
            try:
                progress = self.call("pivot_progress", {"token": token, "seen": seen, "wait_s": 5.0})
            except BoxError as exc:
                raise BoxError(f"{exc}; the pivot started on {self.name} and carries on there without this "
                               f"command: check `gpudeck --host {self.name} jobs`", exc.code) from None
            for step in progress["steps"]:
                if on_step is not None:
                    on_step(step)
            seen += len(progress["steps"])
            if progress["done"] is not None:
                break
        done = progress["done"]
        if "error" in done:
            raise BoxError(f"pivot failed on {self.name}: {done['error']}", code=1)
        result = dict(done["result"])
        if result.get("ok") and wait:
            result = self._wait_ready(plan.target, result,
                                      ready_deadline_s if ready_deadline_s is not None else READY_DEADLINE_S, on_step)
        return PivotOutcome.from_result(result, float(done.get("overhead_s") or 0.0))

    def _wait_ready(self, target: str, result: dict, deadline: float, on_step: Optional[Callable[[dict], None]]) -> dict:
        t0 = time.monotonic()
        while True:
            try:
                state = self.call("pivot_ready", {"target": target, "run_id": result.get("run_id"),
                                                  "wait_s": max(0.0, min(5.0, deadline - (time.monotonic() - t0)))})
            except BoxError as exc:
                # The pivot itself is done on the box: say so, not only that the link failed.
                raise BoxError(f"{exc}; the pivot was done on {self.name} ({result.get('message')}) but its "
                               f"readiness is unknown: check `gpudeck --host {self.name} jobs`", exc.code) from None
            waited = time.monotonic() - t0
            if state["ready"] or not state["alive"] or waited >= deadline:
                break
        detail = state["detail"] if state["ready"] or not state["alive"] else \
            f"not ready after {deadline:.0f} s: {state['detail']}"
        step = {"name": f"wait for {target} ready", "ok": bool(state["ready"]), "duration_s": round(waited, 3),
                "detail": detail}
        if on_step is not None:
            on_step(step)
        result["steps"] = list(result.get("steps") or []) + [step]
        result["duration_s"] = round(float(result.get("duration_s") or 0.0) + waited, 3)
        if step["ok"]:
            result["message"] = f"{result.get('message')}, ready"
        else:
            result["ok"] = False
            result["message"] = f"{target} did not become ready: {detail}"
        return result

    def stacks(self, job: str, *, native: bool = False) -> StacksResult:
        result = StacksResult.from_json(self.call("stacks", {"job": job, "native": native}))
        if result.refused is not None:
            # A refusal is a result, not an error reply: it names the box as every refused request does.
            import dataclasses
            result = dataclasses.replace(result, refused=f"{self.name}: {result.refused}")
        return result

    # -- remember -------------------------------------------------------------------------------
    def runs(self, *, job: Optional[str] = None, failed: bool = False, since: Optional[float] = None,
             limit: Optional[int] = None, columns: Optional[tuple[str, ...]] = None) -> RunsListing:
        return RunsListing.from_json(self.call("runs", {"job": job, "failed": failed, "since": since, "limit": limit,
                                                        "columns": list(columns) if columns else None}))

    def reindex(self) -> Reindexed:
        return Reindexed.from_json(self.call("runs_reindex"))

    def prune(self, *, keep: Optional[int] = None, older_s: Optional[float] = None, job: Optional[str] = None,
              yes: bool = False) -> Pruned:
        params = {"keep": keep, "older_s": older_s, "job": job, "yes": yes}
        return Pruned.from_json(self.action("runs_prune", params) if yes else self.call("runs_prune", params))

    def run_record(self, job: str, run_id: Optional[str] = None) -> Path:
        import base64
        import os

        from gpudeck.jobs.box import RECORD_FILES
        from gpudeck.jobs.paths import cache_dir
        if run_id is None:
            run_id = self.read_log(job, tail=0).run_id      # the latest run's id, no bytes
        if not _SAFE_NAME.match(job) or not _SAFE_NAME.match(run_id):
            raise BoxError(f"{self.name}: bad run name {job!r}/{run_id!r}", code=1)
        dest = cache_dir() / "boxes" / _SAFE_NAME_SUB.sub("_", self.name) / "runs" / job / run_id
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in RECORD_FILES:
            path = dest / name
            have = path.stat().st_size if path.exists() else 0
            # An append-only file (log, events, samples, times) grows: fetch what is new; others whole.
            offset = have if name in ("output.log", "events.jsonl", "samples.jsonl", "times") else 0
            chunks: list[bytes] = []
            while True:
                reply = self.call("run_file", {"job": job, "run_id": run_id, "name": name, "offset": offset})
                data = base64.b64decode(reply.get("data") or "")
                if not data:
                    break
                chunks.append(data)
                offset += len(data)
            if reply.get("size") is None:
                continue                                 # not written (yet) on the box
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if have and offset > have else os.O_TRUNC)
            if have and offset == have and not chunks:
                continue
            fd = os.open(path, flags, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(b"".join(chunks))
        return dest

    def postmortem(self, target: Optional[str] = None) -> Postmortem:
        return Postmortem.from_json(self.call("postmortem", {"target": target}))
