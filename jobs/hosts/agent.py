"""The agent: gpudeck's core on a remote box, answering JSON-line requests on stdin/stdout (stdlib only).

Started over SSH as `python3 -m gpudeck.jobs.hosts.agent` (gpudeck installed there)
or `python3 agent-HASH.pyz` (the zipapp gpudeck ships). It owns nothing: jobs are
started under their own detached runners, so the agent (and the SSH connection it
lives on) can die at any moment without touching them.
"""
from __future__ import annotations

import argparse
import base64
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from gpudeck.jobs.hosts.protocol import HELLO, PROTOCOL, decode, diff, encode, pack_status

# A logs request waits at most this long for new output: long enough to make
# `logs -f` cheap, short enough that a dead link is noticed by the next request.
MAX_LOG_WAIT_S = 10.0
LOG_POLL_S = 0.1
MAX_LOG_CHUNK = 256 * 1024
# Ops that change the box finish even if the connection dies under them: a stop
# cut between SIGTERM and SIGKILL would leave half a job.
_ACTIONS = frozenset({"start", "stop", "restart", "pivot", "runs_prune"})
# What an agent started --readonly refuses, whoever asks on its connection: every op that starts,
# signals or deletes (pivot_plan and pivot_ready only read; runs_prune deletes only with `yes`).
MUTATING_OPS = frozenset({"start", "stop", "restart", "pivot", "run"})


class RequestError(Exception):
    """A failure the operator caused or can fix (unknown job, no jobs file): one line, no traceback."""


class Agent:
    def __init__(self, out: Any, *, jobs_file: Optional[str], state_dir: Optional[str], simulated: bool,
                 via: str, readonly: bool = False) -> None:
        self._out = out
        self.readonly = readonly            # fixed for the agent's life: no request turns it off
        self._out_lock = threading.Lock()
        self.jobs_file = jobs_file
        self.state_dir = Path(os.path.expanduser(state_dir)).absolute() if state_dir else None
        self.simulated = simulated
        self.via = via
        self._telemetry: Any = None
        self._telemetry_lock = threading.Lock()
        self._last: dict[str, dict] = {}          # per delta-sent op: the payload last sent
        self._last_lock = threading.Lock()
        self._actions: list[threading.Thread] = []
        self._pivots: dict[str, dict] = {}        # pivot token -> its steps so far and its result

    # -- wire ----------------------------------------------------------------------
    def send(self, message: dict) -> None:
        data = encode(message)
        with self._out_lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass                  # the client is gone; in-flight actions still finish

    def hello(self) -> dict:
        from gpudeck.jobs import __version__
        return {"hello": HELLO, "protocol": PROTOCOL, "version": __version__, "via": self.via,
                "python": ".".join(map(str, sys.version_info[:3])), "pid": os.getpid(),
                "hostname": socket.gethostname(), "state_dir": str(self._state_dir()),
                "jobs_file": self.jobs_file, "readonly": self.readonly}

    def refuses(self, op: str, params: Any) -> bool:
        prune_deletes = op == "runs_prune" and (not isinstance(params, dict) or bool(params.get("yes")))
        return self.readonly and (op in MUTATING_OPS or prune_deletes)

    def serve(self, lines: Any) -> None:
        self.send(self.hello())
        for raw in lines:
            if not raw.strip():
                continue
            try:
                request = decode(raw)
            except ValueError as exc:
                self.send({"id": None, "ok": False, "error": f"bad request: {exc}"})
                continue
            op = str(request.get("op"))
            worker = threading.Thread(target=self.handle, args=(request,), name=f"agent-{op}",
                                      daemon=op not in _ACTIONS)
            if op in _ACTIONS:
                self._actions.append(worker)
            worker.start()
        for worker in self._actions:
            worker.join()

    def handle(self, request: dict) -> None:
        rid = request.get("id")
        op = str(request.get("op"))
        method: Optional[Callable[[dict], Any]] = getattr(self, f"op_{op}", None)
        if method is None:
            self.send({"id": rid, "ok": False, "error": f"unknown request {op!r}"})
            return
        params = request.get("params") or {}
        if self.refuses(op, params):
            self.send({"id": rid, "ok": False, "error": f"read-only: this host's agent refuses {op} "
                                                        "(it was started read-only; nothing was done)"})
            return
        try:
            result = method(params)
        except RequestError as exc:
            self.send({"id": rid, "ok": False, "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one failed request must not end the agent
            self.send({"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}", "internal": True})
        else:
            self.send({"id": rid, "ok": True, "result": result})

    # -- helpers ---------------------------------------------------------------------
    def _state_dir(self) -> Path:
        from gpudeck.jobs import paths
        return self.state_dir if self.state_dir is not None else paths.state_dir().absolute()

    def _supervisor(self) -> Any:
        from gpudeck.jobs.paths import find_jobs_file
        from gpudeck.jobs.spec import SpecError, load_jobs
        from gpudeck.jobs.supervisor import Supervisor
        path = find_jobs_file(self.jobs_file)
        if path is None:
            raise RequestError("no jobs file on this host: set `jobs` for it in hosts.toml, or create "
                               "~/jobs.toml or ~/.config/gpudeck/jobs.toml there")
        if not path.exists():
            raise RequestError(f"{path}: no such file on this host")
        try:
            return Supervisor(load_jobs(path), self._state_dir())
        except SpecError as exc:
            raise RequestError(str(exc)) from None

    def _known(self, sup: Any, job: str) -> None:
        from gpudeck.jobs.supervisor import UnknownJob
        try:
            sup.spec(job)
        except UnknownJob as exc:
            raise RequestError(str(exc)) from None

    def _run(self, job: str, run_id: Optional[str]) -> Any:
        from gpudeck.jobs.runs import find_run, latest_run
        run = find_run(job, run_id, self._state_dir()) if run_id else latest_run(job, self._state_dir())
        if run is None:
            raise RequestError(f"{job} has no run {run_id}" if run_id else f"{job} has never run")
        return run

    # -- requests ----------------------------------------------------------------------
    def op_hello(self, params: dict) -> dict:
        return self.hello()

    def op_ping(self, params: dict) -> dict:
        return {"time": time.time()}

    def _maybe_delta(self, op: str, payload: dict, params: dict) -> dict:
        """{"full": payload}, or with `delta` {"delta": what changed since this op's last reply}."""
        with self._last_lock:
            previous, self._last[op] = self._last.get(op), payload
        if params.get("delta") and previous is not None:
            return {"delta": diff(previous, payload)}
        return {"full": payload}

    def op_jobs(self, params: dict) -> dict:
        from gpudeck.jobs.payload import jobs_payload
        payload = jobs_payload(self._supervisor())
        return self._maybe_delta("jobs", payload, params) if params.get("delta") is not None else payload

    def op_check(self, params: dict) -> dict:
        """`gpudeck check` on this host's jobs file: every located error, or the job names."""
        from gpudeck.jobs.paths import find_jobs_file
        from gpudeck.jobs.spec import SpecError, load_jobs, load_user_notify
        path = find_jobs_file(self.jobs_file)
        if path is None or not path.exists():
            self._supervisor()                     # raises the one-line reason
        # this box's config.toml [notify.*]: the runs started here deliver with them
        user_errors = [str(e) for e in load_user_notify()[1]]
        try:
            names = list(load_jobs(path).jobs)     # one read: the errors ride on the first one
        except SpecError as exc:
            return {"path": str(path), "errors": [str(e) for e in exc.errors] + user_errors, "jobs": []}
        return {"path": str(path), "errors": user_errors, "jobs": [] if user_errors else names}

    def op_doctor(self, params: dict) -> dict:
        """`gpudeck doctor [JOB]` on this box: driver, free GPUs, the job's interpreter, port, disk, build RAM."""
        from gpudeck.jobs.engines.doctor import doctor_payload, run_doctor
        job = params.get("job")
        sup = None
        if job is not None:
            sup = self._supervisor()
            self._known(sup, job)
        try:
            return doctor_payload(run_doctor(sup, job), job)
        except ImportError as exc:        # some checks need psutil on the box
            raise RequestError(f"doctor cannot run on this host: {exc}") from None

    def op_analyze(self, params: dict) -> dict:
        """`gpudeck analyze FILE`: a log file of this box read here (only the answer crosses the link).

        `raw` is the analysis unrounded, so the text rendered on the laptop is the one printed on the box.
        """
        from dataclasses import asdict

        from gpudeck.jobs.logs.analyze import analyze_stream
        from gpudeck.jobs.paths import NotARegularFile, open_regular
        name = str(params["path"])
        max_bytes = params.get("max_bytes")
        try:
            with open_regular(os.path.expanduser(name)) as fh:
                analysis, truncated = analyze_stream(fh, max_bytes=int(max_bytes) if max_bytes else None)
        except NotARegularFile as exc:
            raise RequestError(f"cannot analyze {exc}") from None
        except IsADirectoryError:
            raise RequestError(f"cannot analyze {name}: is a directory") from None
        except OSError as exc:
            raise RequestError(f"cannot read {name}: {exc.strerror or exc}") from None
        return {"analysis": analysis.to_json(), "raw": asdict(analysis), "truncated": truncated}

    # -- pivot: planned here, confirmed on the laptop, executed here ---------------------
    def _pivot_plan(self, params: dict) -> tuple[Any, Any]:
        try:
            from gpudeck.jobs.engines.pivot import PivotError, plan_pivot
            sup = self._supervisor()
            return sup, plan_pivot(sup, str(params["target"]), stop_foreign=bool(params.get("stop_foreign")))
        except ImportError as exc:        # engine discovery reads processes and sockets through psutil
            raise RequestError(f"pivot cannot run on this host: {exc} (install psutil for its "
                               f"{sys.executable}, or set `python` in hosts.toml to one that has it)") from None
        except PivotError as exc:
            raise RequestError(str(exc)) from None

    def op_pivot_plan(self, params: dict) -> dict:
        """What a pivot would stop on this box: the plan's lines (shown for confirmation) and its JSON."""
        _, plan = self._pivot_plan(params)
        return {"lines": plan.lines(), "plan": plan.to_jsonable()}

    def op_pivot(self, params: dict) -> dict:
        """Start the pivot the operator confirmed (`plan`), without the wait for ready (`pivot_ready`);
        returns a token for `pivot_progress`, which hands out each step as it completes.

        The plan is made again here: if what it would stop differs from what the operator
        saw (an engine started or ended meanwhile), nothing is stopped. The pivot runs in
        its own thread and finishes even if the link drops (serve() waits for it).
        """
        from dataclasses import asdict

        from gpudeck.jobs.engines.pivot import GPU_RELEASE_DEADLINE_S, execute_pivot
        sup, plan = self._pivot_plan(params)
        seen = params.get("plan")
        if seen is not None and _stops_key(plan.to_jsonable()) != _stops_key(seen):
            raise RequestError("what the pivot would stop changed since the plan was shown; nothing was "
                               "stopped: run the pivot again to see the new plan")
        gpu_deadline = params.get("gpu_deadline_s")
        progress: dict = {"steps": [], "done": None, "cond": threading.Condition()}

        def on_step(step: Any) -> None:
            with progress["cond"]:
                progress["steps"].append(asdict(step))
                progress["cond"].notify_all()

        def work() -> None:
            try:
                result = execute_pivot(sup, plan, wait=False, on_step=on_step,
                                       gpu_deadline_s=float(gpu_deadline) if gpu_deadline is not None
                                       else GPU_RELEASE_DEADLINE_S)
                done = {"result": result.to_jsonable(), "overhead_s": result.overhead_s}
            except Exception as exc:  # noqa: BLE001 - reported to the laptop, not lost in a thread
                done = {"error": f"{type(exc).__name__}: {exc}"}
            with progress["cond"]:
                progress["done"] = done
                progress["cond"].notify_all()

        token = f"{plan.target}-{time.time_ns()}"
        with self._last_lock:
            self._pivots[token] = progress
        worker = threading.Thread(target=work, name="agent-pivot-run")
        self._actions.append(worker)
        worker.start()
        return {"token": token}

    def op_pivot_progress(self, params: dict) -> dict:
        """The steps of pivot `token` from index `seen` on, waiting up to `wait_s` for one; `done` once it ended."""
        with self._last_lock:
            progress = self._pivots.get(str(params.get("token")))
        if progress is None:
            raise RequestError("this agent has no record of that pivot (the link to the box was re-made); "
                               "it carries on on the box")
        seen = int(params.get("seen") or 0)
        deadline = time.monotonic() + min(float(params.get("wait_s") or 0), MAX_LOG_WAIT_S)
        with progress["cond"]:
            while len(progress["steps"]) <= seen and progress["done"] is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                progress["cond"].wait(left)
            return {"steps": progress["steps"][seen:], "done": progress["done"]}

    def op_pivot_ready(self, params: dict) -> dict:
        """Whether the pivot's target is ready, waiting up to `wait_s` (the laptop asks again until it is)."""
        from gpudeck.jobs.engines.profiles import engine_settings
        from gpudeck.jobs.engines.readiness import wait_until_ready
        sup = self._supervisor()
        job = str(params["target"])
        self._known(sup, job)
        settings = engine_settings(sup.spec(job))
        if settings is None:
            raise RequestError(f"{job} is not an engine job")
        run = self._run(job, params.get("run_id"))

        def alive() -> bool:
            state = sup.job_state(job)
            return bool(state.live and state.run_id == run.run_id)
        wait_s = min(float(params.get("wait_s") or 0), MAX_LOG_WAIT_S)
        state = wait_until_ready(settings, run.log_path, deadline_s=wait_s, alive=alive)
        live = alive()
        return {"ready": state.ready, "alive": live,
                "detail": state.detail if state.ready or live else "the engine exited before it was ready"}

    # -- run index upkeep ----------------------------------------------------------------
    def op_runs_reindex(self, params: dict) -> dict:
        """`gpudeck runs --reindex`: this box's run index rebuilt from its run directories."""
        from gpudeck.jobs.history.index import ReindexFailed, RunIndex, reindex
        index = RunIndex()
        try:
            count, seconds = reindex(index)
        except ReindexFailed as exc:
            raise RequestError(str(exc)) from None
        finally:
            index.close()
        return {"count": count, "path": str(index.path), "seconds": seconds}

    def op_runs_prune(self, params: dict) -> dict:
        """`gpudeck runs --prune`: what would go (and with `yes`, deleted) under this box's retention rules."""
        from gpudeck.jobs.history.index import RunIndex
        from gpudeck.jobs.history.retention import plan_prune, prune
        from gpudeck.jobs.spec import JobSpec
        keep, older = params.get("keep"), params.get("older_s")
        default = JobSpec.__dataclass_fields__["log_keep"].default
        jobs: dict = {}
        try:
            jobs = self._supervisor().jobs_file.jobs
        except RequestError:
            pass                                  # no jobs file here: every job keeps the default
        if keep is None and older is None:
            keep_for = (lambda job: jobs[job].log_keep if job in jobs else default)
        else:
            keep_for = (lambda job: None)
        with RunIndex() as index:
            index.sync()
            candidates = plan_prune(index, keep=keep, older_s=older, job=params.get("job"), keep_for=keep_for)
            removed = prune(index, candidates) if params.get("yes") and candidates else None
        out: dict = {"candidates": [c.to_json() for c in candidates]}
        if removed is not None:
            out["removed"] = len(removed)
        return out

    def op_start(self, params: dict) -> dict:
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._supervisor()
        self._known(sup, params["job"])
        try:
            return {"run_id": sup.start(params["job"])}
        except SupervisorError as exc:
            raise RequestError(str(exc)) from None

    def op_stop(self, params: dict) -> dict:
        from gpudeck.jobs.pipeline import latest_pipeline, stop_pipeline
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._supervisor()
        job = params["job"]
        self._known(sup, job)
        notes = []
        pipe = latest_pipeline(job, sup.state_dir)
        if pipe is not None and pipe.state() == "running" and stop_pipeline(pipe):
            notes.append(f"asked pipeline {pipe.pipeline_id} for {job} to stop")
        try:
            report = sup.stop(job, timeout=params.get("timeout"))
        except SupervisorError as exc:
            raise RequestError(str(exc)) from None
        return {"report": report.to_jsonable(), "lines": notes + report.lines(), "clean": report.clean}

    def op_stacks(self, params: dict) -> dict:
        """`gpudeck stacks JOB`: the grouped py-spy dump of the job's live run, taken on this host.

        A refusal (no py-spy here, ptrace not permitted, the job not running) is a result, not an
        error: the CLI keeps its local exit codes (2 and 1) for it."""
        from gpudeck.jobs.stacks import StacksUnavailable, render_lines
        from gpudeck.jobs.supervisor import SupervisorError
        sup = self._supervisor()
        self._known(sup, params["job"])
        try:
            result = sup.stacks(params["job"], native=bool(params.get("native")))
        except StacksUnavailable as exc:
            return {"refused": f"{exc} (on {socket.gethostname()})", "code": 2}
        except SupervisorError as exc:
            return {"refused": str(exc), "code": 1}
        return {"dump": result.to_jsonable(), "lines": render_lines(result)}

    def op_run(self, params: dict) -> dict:
        """`gpudeck run JOB`: a detached pipeline of JOB after its needs, on this host."""
        from gpudeck.jobs.pipeline import PipelineError, start_pipeline
        sup = self._supervisor()
        self._known(sup, params["job"])
        try:
            pipe = start_pipeline(sup, params["job"])
        except PipelineError as exc:
            raise RequestError(str(exc)) from None
        return {"pipeline_id": pipe.pipeline_id, "stages": pipe.meta()["stages"]}

    def op_pipeline(self, params: dict) -> dict:
        """A pipeline's events from index `seen` on, its result and state (what `run --wait` follows)."""
        from gpudeck.jobs.pipeline_records import list_pipelines
        sup = self._supervisor()
        pipe = next((p for p in list_pipelines(params["job"], sup.state_dir)
                     if p.pipeline_id == params["pipeline_id"]), None)
        if pipe is None:
            raise RequestError(f"no pipeline {params['pipeline_id']} for {params['job']}")
        events = pipe.events()
        return {"events": events[int(params.get("seen") or 0):], "count": len(events), "result": pipe.result(),
                "state": pipe.state()}

    def op_restart(self, params: dict) -> dict:
        stopped = self.op_stop(params)
        started = self.op_start(params)
        return {**stopped, **started}

    def op_runs(self, params: dict) -> dict:
        """`gpudeck runs`: rows of this host's run index (synced first), newest first."""
        from gpudeck.jobs.history.index import RunIndex
        columns = params.get("columns")
        with RunIndex() as index:
            index.sync()
            rows = index.query(job=params.get("job"), failed=bool(params.get("failed")), since=params.get("since"),
                               limit=params.get("limit"), **({"columns": tuple(columns)} if columns else {}))
        return {"runs": rows}

    def op_postmortem(self, params: dict) -> dict:
        """`gpudeck postmortem`: the report of a run of this host (its latest when no target is given)."""
        from gpudeck.jobs.history.postmortem import PostmortemError, build
        target = params.get("target")
        if not target:
            from gpudeck.jobs.history.index import RunIndex
            with RunIndex() as index:
                index.sync()
                rows = index.query(kinds=["job"], limit=1, columns=("run_id",))
            if not rows:
                raise RequestError("no runs yet on this host: give a run id or a job")
            target = rows[0]["run_id"]
        try:
            return {"report": build(target)}
        except PostmortemError as exc:
            raise RequestError(str(exc)) from None

    def op_logs(self, params: dict) -> dict:
        """Bytes of a run's output.log from `offset` (or the last `tail` lines), waiting up to `wait_s` for more.

        `ended` is true only when the run had ended before the read that found
        nothing more: output written just before the end is never missed.
        """
        from gpudeck.jobs.logs.follow import tail_offset
        run = self._run(params["job"], params.get("run"))
        path = run.log_path
        offset = params.get("offset")
        if offset is None:
            tail = params.get("tail")
            offset = tail_offset(path, int(tail)) if tail is not None else 0
        offset = int(offset)
        limit = min(int(params.get("max_bytes") or MAX_LOG_CHUNK), MAX_LOG_CHUNK)
        deadline = time.monotonic() + min(float(params.get("wait_s") or 0), MAX_LOG_WAIT_S)
        while True:
            ended = run.exit_record() is not None or run.state().state == "lost"
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(limit)
            except FileNotFoundError:
                data = b""
            if data or ended or time.monotonic() >= deadline:
                return {"run_id": run.run_id, "offset": offset, "next_offset": offset + len(data),
                        "data": base64.b64encode(data).decode("ascii"), "ended": ended and not data}
            time.sleep(LOG_POLL_S)

    def op_status(self, params: dict) -> dict:
        """The status payload, packed for the wire (`protocol.unpack_status` restores it); with `delta`,
        only what changed since the last status this agent sent."""
        with self._telemetry_lock:
            if self._telemetry is None:
                from gpudeck.jobs.hosts.telemetry import AgentTelemetry
                self._telemetry = AgentTelemetry(simulated=self.simulated or bool(params.get("simulated")))
            payload = self._telemetry.payload()
            if params.get("engines") and not self._telemetry.source.get("gpu") == "simulated":
                try:
                    from gpudeck.jobs.engines.discovery import discover_engines, engines_payload
                    payload["engines"] = engines_payload(discover_engines())
                except ImportError as exc:        # discovery needs psutil on this box
                    payload["engines_error"] = f"engine discovery unavailable here: {exc}"
            return self._maybe_delta("status", pack_status(payload), params)


    def op_poll(self, params: dict) -> dict:
        """status and jobs in one round trip (the fleet's 1 Hz request): half the SSH packets of two."""
        out: dict[str, Any] = {"status": self.op_status(params)}
        try:
            out["jobs"] = self.op_jobs({"delta": bool(params.get("jobs_delta"))})
        except RequestError as exc:        # no jobs file there: the telemetry still counts
            out["jobs_error"] = str(exc)
        return out


def _stops_key(plan: dict) -> list:
    """What a pivot plan would stop, as comparable values (pid and start time name a process)."""
    return [(s.get("kind"), s.get("pid"), s.get("create_time"), s.get("job"), s.get("run_id"))
            for s in plan.get("stops") or []]


def main(argv: Optional[list[str]] = None, via: str = "installed") -> int:
    parser = argparse.ArgumentParser(prog="gpudeck-agent")
    parser.add_argument("--jobs", default=None)
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--simulated", action="store_true")
    parser.add_argument("--readonly", action="store_true", help="refuse every op that changes the box")
    args = parser.parse_args(argv)
    # The box's own say too: GPUDECK_READONLY=1 in the agent's environment makes it watch-only.
    readonly = args.readonly or os.environ.get("GPUDECK_READONLY", "").strip().lower() not in ("", "0", "false", "no", "off")
    if args.state_dir:
        # Every core default (run index, post-mortem lookups) follows this host's state dir.
        os.environ["GPUDECK_STATE_DIR"] = str(Path(os.path.expanduser(args.state_dir)).absolute())
    # The protocol owns the real stdout; anything else that prints (a library, a
    # warning) goes to stderr so it can never corrupt a reply.
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    agent = Agent(proto, jobs_file=args.jobs, state_dir=args.state_dir, simulated=args.simulated, via=via,
                  readonly=readonly)
    try:
        agent.serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
