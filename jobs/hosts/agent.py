"""The agent: a thin server of the Box interface on a remote box, JSON-line requests on stdin/stdout (stdlib only).

Each request that is one Box call (start, stop, logs, runs, postmortem… see `box/serve.py`)
is answered by this host's LocalBox; only what a link needs beyond that lives here: the
hello, telemetry and jobs sent as deltas at 1 Hz, and a pivot that outlives the link.

Started over SSH as `python3 -m gpudeck.jobs.hosts.agent` (gpudeck installed there)
or `python3 agent-HASH.pyz` (the zipapp gpudeck ships). It owns nothing: jobs are
started under their own detached runners, so the agent (and the SSH connection it
lives on) can die at any moment without touching them.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from gpudeck.jobs.box import MAX_LOG_WAIT_S, BoxError
from gpudeck.jobs.box.serve import OPS as BOX_OPS
from gpudeck.jobs.box.serve import answer
from gpudeck.jobs.hosts.protocol import HELLO, PROTOCOL, decode, diff, encode, pack_status

NO_JOBS_FILE = ("no jobs file on this host: set `jobs` for it in hosts.toml, or create "
                "~/jobs.toml or ~/.config/gpudeck/jobs.toml there")
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
        self._box: Any = None

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
        if method is None and op in BOX_OPS:
            method = lambda params: answer(self.box, op, params)       # noqa: E731 - one Box call
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
            self.send({"id": rid, "ok": False, "error": str(exc), "code": 2})
        except BoxError as exc:
            self.send({"id": rid, "ok": False, "error": str(exc), "code": exc.code})
        except Exception as exc:  # noqa: BLE001 - one failed request must not end the agent
            self.send({"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}", "internal": True})
        else:
            self.send({"id": rid, "ok": True, "result": result})

    # -- the box this agent serves ---------------------------------------------------------------
    @property
    def box(self) -> Any:
        """The LocalBox of this host: every Box request is its method, answered through `box.serve`."""
        if self._box is None:
            from gpudeck.jobs.box.local import LocalBox
            self._box = LocalBox(jobs_file=self.jobs_file, state_dir=self.state_dir, name=socket.gethostname(),
                                 no_jobs_file=NO_JOBS_FILE, readonly=self.readonly)
        return self._box

    def _state_dir(self) -> Path:
        from gpudeck.jobs import paths
        return self.state_dir if self.state_dir is not None else paths.state_dir().absolute()

    # -- requests that are not one Box call ------------------------------------------------------
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
        payload = self.box.jobs().to_json()
        return self._maybe_delta("jobs", payload, params) if params.get("delta") is not None else payload

    # -- pivot: planned here, confirmed on the laptop, executed here ---------------------
    def op_pivot(self, params: dict) -> dict:
        """Start the pivot the operator confirmed (`plan`), without the wait for ready (`pivot_ready`);
        returns a token for `pivot_progress`, which hands out each step as it completes.

        The plan is made again here: if what it would stop differs from what the operator
        saw (an engine started or ended meanwhile), nothing is stopped. The pivot runs in
        its own thread and finishes even if the link drops (serve() waits for it).
        """
        from gpudeck.jobs.box.results import PivotPlan
        from gpudeck.jobs.box.serve import NUM_OPT, _str
        target = _str(params.get("target"), "target")
        seen = params.get("plan")
        plan = PivotPlan(target=target, stop_foreign=bool(params.get("stop_foreign")), lines=[],
                         plan=seen if isinstance(seen, dict) else {})
        self.box.pivot_plan(target, stop_foreign=plan.stop_foreign)    # a plan that cannot be made fails now
        gpu_deadline = NUM_OPT(params.get("gpu_deadline_s"), "gpu_deadline_s")
        progress: dict = {"steps": [], "done": None, "cond": threading.Condition()}

        def on_step(step: dict) -> None:
            with progress["cond"]:
                progress["steps"].append(step)
                progress["cond"].notify_all()

        def work() -> None:
            from gpudeck.jobs.box import BoxError
            try:
                outcome = self.box.pivot(plan, wait=False, on_step=on_step, gpu_deadline_s=gpu_deadline)
                done = {"result": outcome.result, "overhead_s": outcome.overhead_s}
            except BoxError as exc:
                done = {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - reported to the laptop, not lost in a thread
                done = {"error": f"{type(exc).__name__}: {exc}"}
            with progress["cond"]:
                progress["done"] = done
                progress["cond"].notify_all()

        token = f"{target}-{time.time_ns()}"
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
        from gpudeck.jobs.box.serve import NUM_OPT, STR_OPT, _str
        return self.box.pivot_ready(_str(params.get("target"), "target"), STR_OPT(params.get("run_id"), "run_id"),
                                    NUM_OPT(params.get("wait_s"), "wait_s") or 0.0)

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
        except BoxError as exc:            # no jobs file there: the telemetry still counts
            out["jobs_error"] = str(exc)
        return out


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
