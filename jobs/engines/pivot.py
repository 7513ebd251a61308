"""The engine pivot: stop every running engine, prove the GPUs and ports are free, start the target, follow it.

`plan_pivot` says exactly what will be stopped (nothing is touched yet);
`execute_pivot` carries the plan out step by step, timing each step, recording
it as events of the runs involved, and stopping at the first failed step with a
message that names what is in the way. The CLI (`gpudeck pivot`) and the console
both call these two.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from gpudeck.jobs.engines.discovery import EngineProcess, discover_engines
from gpudeck.jobs.engines.profiles import EngineSettings, engine_settings
from gpudeck.jobs.engines.readiness import wait_until_ready
from gpudeck.jobs.spec import command_text

if TYPE_CHECKING:
    from gpudeck.jobs.runs import Run
    from gpudeck.jobs.supervisor import Supervisor

# Foreign engines get this long between SIGTERM and SIGKILL: vLLM's and SGLang's
# shutdown (workers, NCCL teardown) takes 2-30 s.
FOREIGN_GRACE_S = 30.0
# Deadline for the driver to hand GPU memory back once the processes are gone.
GPU_RELEASE_DEADLINE_S = 60.0
# A GPU with no process on it still shows some memory in use (driver, context of
# the display): at most this much counts as idle.
GPU_IDLE_BYTES = 2 * 2**30
PORT_FREE_DEADLINE_S = 15.0
READY_DEADLINE_S = 3600.0       # a 1T-parameter model takes 35 min to load


class PivotError(Exception):
    """The pivot cannot be planned (unknown target, not an engine, already running)."""


@dataclass(frozen=True)
class PlannedStop:
    kind: str                         # "job" (managed, stopped through the supervisor) | "foreign"
    pid: int
    engine: str
    cmdline: str
    gpu_mem: Optional[int]
    port: Optional[int]
    job: Optional[str] = None
    run_id: Optional[str] = None
    create_time: float = 0.0
    members: tuple[tuple[int, str], ...] = ()
    gpus: tuple[int, ...] = ()
    # (pid, create_time) of each member as planned: only these very processes are signalled.
    member_create_times: tuple[tuple[int, float], ...] = ()
    conflict: str = ""                # foreign: what of the target's it holds ("GPU 0,1", "port 8000"); "" none

    def describe(self) -> str:
        mem = f", {self.gpu_mem / 2**30:.1f} GiB GPU memory" if self.gpu_mem else ""
        port = f", port {self.port}" if self.port else ""
        who = f"job {self.job} (run {self.run_id})" if self.kind == "job" else "FOREIGN (not started by gpudeck)"
        if self.kind == "foreign" and self.conflict:
            who += f", holds the target's {self.conflict}"
        return f"{who}: {self.engine} PID {self.pid}{port}{mem} — {self.cmdline[:160]}"


@dataclass
class PivotPlan:
    target: str
    target_settings: EngineSettings
    stops: list[PlannedStop] = field(default_factory=list)           # what will be stopped, in order
    foreign_left: list[PlannedStop] = field(default_factory=list)    # seen, NOT to be stopped
    stop_foreign: bool = False
    gpus: tuple[int, ...] = ()        # GPUs that must be free (empty: every GPU)

    def lines(self) -> list[str]:
        out = [f"pivot to {self.target} ({self.target_settings.engine}, port {self.target_settings.port})"]
        if self.stops:
            out.append("will stop:")
            out += [f"  - {s.describe()}" for s in self.stops]
        else:
            out.append("will stop: nothing (no engine is running)")
        if self.foreign_left:
            if self.stop_foreign:
                out.append("left alone (foreign, holds none of the target's GPUs and not its port):")
            else:
                out.append("will NOT stop (foreign; pass --stop-foreign to stop those that hold the target's "
                           "GPUs or port):")
            out += [f"  - {s.describe()}" for s in self.foreign_left]
        gpus = ",".join(map(str, self.gpus)) if self.gpus else "all"
        out.append(f"then: verify GPUs ({gpus}) and port {self.target_settings.port} free, start {self.target}")
        return out

    def to_jsonable(self) -> dict:
        return {"target": self.target, "engine": self.target_settings.engine,
                "port": self.target_settings.port, "stop_foreign": self.stop_foreign,
                "gpus": list(self.gpus), "stops": [asdict(s) for s in self.stops],
                "foreign_left": [asdict(s) for s in self.foreign_left]}


@dataclass(frozen=True)
class PivotStep:
    name: str                         # "stop job vllm-k2", "verify GPUs free", …
    ok: bool
    duration_s: float
    detail: str = ""

    def line(self) -> str:
        mark = "ok" if self.ok else "FAILED"
        return f"[{mark}] {self.name} ({self.duration_s:.1f} s){': ' + self.detail if self.detail else ''}"


@dataclass
class PivotResult:
    target: str
    ok: bool
    steps: list[PivotStep]
    run_id: Optional[str] = None      # the target's new run
    message: str = ""
    duration_s: float = 0.0

    def to_jsonable(self) -> dict:
        return {"target": self.target, "ok": self.ok, "run_id": self.run_id, "message": self.message,
                "duration_s": round(self.duration_s, 3), "steps": [asdict(s) for s in self.steps]}

    @property
    def overhead_s(self) -> float:
        """Time spent outside the engines' own stop and start->ready (planning, checks, bookkeeping)."""
        engine_time = sum(s.duration_s for s in self.steps
                          if s.name.startswith(("stop ", "wait for ")))
        return max(0.0, self.duration_s - engine_time)


# --------------------------------------------------------------------------- planning

def _planned(e: EngineProcess, kind: str) -> PlannedStop:
    return PlannedStop(kind=kind, pid=e.pid, engine=e.engine, cmdline=e.cmdline, gpu_mem=e.gpu_mem,
                       port=e.port, job=e.job, run_id=e.run_id, create_time=e.create_time,
                       members=tuple((m.pid, m.title) for m in e.members), gpus=e.gpus,
                       member_create_times=tuple((m.pid, m.create_time) for m in e.members))


def plan_pivot(supervisor: Supervisor, target: str, *, stop_foreign: bool = False,
               engines: Optional[list[EngineProcess]] = None) -> PivotPlan:
    """What a pivot to `target` would stop. Raises PivotError when it makes no sense."""
    from gpudeck.jobs.supervisor import UnknownJob
    try:
        spec = supervisor.spec(target)
    except UnknownJob as exc:
        raise PivotError(str(exc)) from None
    settings = engine_settings(spec)
    if settings is None:
        raise PivotError(f"{target} is not an engine job (set engine = \"vllm\" or \"sglang\" in jobs.toml)")
    plan = PivotPlan(target=target, target_settings=settings, stop_foreign=stop_foreign,
                     gpus=tuple(spec.gpus))
    states = {s.name: s for s in supervisor.job_states()}
    if states[target].live:
        raise PivotError(f"{target} is already running (run {states[target].run_id}); nothing to pivot to")
    if engines is None:
        engines = discover_engines()
    managed_runs = set()
    for name, st in states.items():
        job_spec = supervisor.spec(name)
        if not st.live or name == target:
            continue
        job_settings = engine_settings(job_spec)
        if job_spec.kind != "engine" and job_settings is None:
            continue
        found = next((e for e in engines if e.managed and e.run_id == st.run_id), None)
        port = job_settings.port if job_settings else job_spec.port
        plan.stops.append(PlannedStop(
            kind="job", pid=found.pid if found else (st.pid or 0),
            engine=found.engine if found else (job_spec.engine or "?"),
            cmdline=found.cmdline if found else command_text(job_spec.cmd), gpu_mem=found.gpu_mem if found else None,
            port=port, job=name, run_id=st.run_id,
            members=tuple((m.pid, m.title) for m in found.members) if found else (),
            gpus=found.gpus if found else tuple(job_spec.gpus)))
        managed_runs.add(st.run_id)
    for e in engines:
        if e.managed and e.run_id in managed_runs:
            continue
        # Engines of another jobs file, or of a run gpudeck no longer tracks, cannot be stopped
        # through this supervisor: like foreign ones, they need --stop-foreign.
        # --stop-foreign stops only what stands in the target's way: its GPUs or its port.
        conflict = _conflict(e, plan.gpus, settings.port)
        stop = replace(_planned(e, "foreign"), conflict=conflict)
        (plan.stops if stop_foreign and conflict else plan.foreign_left).append(stop)
    return plan


def _conflict(e: EngineProcess, gpus: tuple[int, ...], port: Optional[int]) -> str:
    """What of the target's (GPUs, port) engine `e` holds, as words; "" when nothing.

    A target without a GPU list takes every GPU, so any GPU `e` holds is in its way; GPUs
    that cannot be seen (no NVML) are not assumed to be held.
    """
    held = sorted(set(e.gpus) & set(gpus)) if gpus else sorted(e.gpus)
    parts = []
    if held:
        parts.append("GPU " + ",".join(map(str, held)))
    if port is not None and e.port == port:
        parts.append(f"port {port}")
    return " and ".join(parts)


# --------------------------------------------------------------------------- execution

def _gpu_state() -> Optional[tuple[dict[int, list[tuple[int, Optional[int]]]], dict[int, int]]]:
    """({gpu: [(pid, bytes)]}, {gpu: used bytes}) from the GPU seam, or None when no GPU backend answers."""
    from gpudeck.jobs.telemetry import gpu as gpu_seam
    memory = gpu_seam.local().memory()
    if memory is None:
        return None
    by_gpu: dict[int, list[tuple[int, Optional[int]]]] = {}
    for h in memory.holders:
        by_gpu.setdefault(h.gpu, []).append((h.pid, h.mem_used))
    return by_gpu, dict(memory.used)


def _proc_title(pid: int) -> str:
    import psutil
    try:
        p = psutil.Process(pid)
        cmd = p.cmdline()
        if cmd and "::" in cmd[0]:
            return cmd[0].strip()
        return p.name()
    except (psutil.Error, OSError):
        return "?"


def _owner_note(pid: int, managed_pids: set[int]) -> str:
    from gpudeck.jobs.engines.discovery import _environ_tags
    run_id, job = _environ_tags(pid)
    if run_id or pid in managed_pids:
        return f"started by gpudeck{' (job ' + job + ')' if job else ''}"
    return "not started by gpudeck"


def verify_gpus_free(gpus: tuple[int, ...], stopped_pids: set[int], *,
                     deadline_s: float = GPU_RELEASE_DEADLINE_S, idle_bytes: int = GPU_IDLE_BYTES,
                     poll_s: float = 0.25, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    """Wait until no process holds memory on `gpus` (all when empty) and memory is back near idle."""
    state = _gpu_state()
    if state is None:
        from gpudeck.jobs.telemetry import gpu as gpu_seam
        backend = gpu_seam.local()
        return True, f"not applicable: {backend.label} unavailable ({backend.error or 'no NVIDIA driver'})"
    end = clock() + deadline_s
    while True:
        by_gpu, used = state
        watched = set(gpus) if gpus else set(used) | set(by_gpu)
        problem = None
        for gpu in sorted(watched):
            holders = [(pid, mem) for pid, mem in by_gpu.get(gpu, []) if pid != os.getpid()]
            if holders:
                pid, mem = max(holders, key=lambda h: h[1] or 0)
                held = f"{(mem or used.get(gpu, 0)) / 2**30:.0f} GiB"
                owner = _owner_note(pid, stopped_pids)
                problem = f"GPU {gpu} still holds {held} for PID {pid} ({_proc_title(pid)}), {owner}"
                if pid not in stopped_pids and owner == "not started by gpudeck":
                    # Nobody asked it to stop, so it will not let go: fail now, not at the deadline.
                    return False, problem
                break
            if used.get(gpu, 0) > idle_bytes:
                problem = (f"GPU {gpu} still has {used[gpu] / 2**30:.1f} GiB in use with no process the driver "
                           f"can name (another container?)")
                break
        if problem is None:
            return True, f"{len(watched)} GPU(s) free"
        if clock() >= end:
            return False, f"{problem}; waited {deadline_s:.0f} s"
        sleep(poll_s)
        state = _gpu_state() or ({}, {})


def verify_port_free(port: int, *, deadline_s: float = PORT_FREE_DEADLINE_S,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    from gpudeck.jobs.procs import cmdline, port_listening as listening, port_owners
    end = clock() + deadline_s
    # /proc/net/tcp, not a connect(): probing by connecting fills a stuck listener's
    # backlog until connects time out and the port merely looks free.
    while listening(port):
        if clock() >= end:
            owners = port_owners(port)
            who = ", ".join(f"PID {p} ({(cmdline(p) or '?')[:80]})" for p in owners) or "an unknown process"
            return False, f"port {port} is still listening: {who}"
        sleep(0.1)
    return True, f"port {port} free"


def stop_foreign(stop: PlannedStop, *, grace_s: float = FOREIGN_GRACE_S) -> tuple[bool, str]:
    """SIGTERM the foreign engine's processes (pid + start time checked), wait, SIGKILL what is left."""
    import psutil
    planned_times = dict(stop.member_create_times)
    planned_times.setdefault(stop.pid, stop.create_time)
    procs = []
    for pid, _title in stop.members or ((stop.pid, ""),):
        try:
            p = psutil.Process(pid)
            started = p.create_time()
        except psutil.Error:
            continue
        # Only the very processes the operator saw: a reused PID is never signalled, and a
        # member whose start the plan did not record is left alone (nothing proves it is the engine's).
        planned = planned_times.get(pid)
        if not planned or abs(started - planned) > 0.05:
            if pid == stop.pid:
                return False, f"PID {pid} is now a different process; nothing signalled"
            continue
        procs.append(p)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    killed = []
    for p in alive:
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    _gone, still = psutil.wait_procs(alive, timeout=5)
    if still:
        return False, "still alive after SIGKILL: " + ", ".join(f"PID {p.pid}" for p in still)
    note = f"SIGKILL needed for {', '.join(map(str, killed))}" if killed else "exited on SIGTERM"
    return True, f"{len(procs)} process(es) gone, {note}"


def execute_pivot(supervisor: Supervisor, plan: PivotPlan, *, wait: bool = False,
                  on_step: Callable[[PivotStep], None] = lambda step: None,
                  gpu_deadline_s: float = GPU_RELEASE_DEADLINE_S,
                  port_deadline_s: float = PORT_FREE_DEADLINE_S,
                  ready_deadline_s: float = READY_DEADLINE_S) -> PivotResult:
    """Carry `plan` out; the first failed step ends the pivot (the target is then not started)."""
    from gpudeck.jobs.runs import find_run
    started = time.monotonic()
    steps: list[PivotStep] = []
    stopped_runs = []
    for stop in plan.stops:
        if stop.kind == "job" and stop.job and stop.run_id:
            run = find_run(stop.job, stop.run_id, supervisor.state_dir)
            if run is not None:
                stopped_runs.append(run)
                run.add_event("PivotRequested", target=plan.target, plan=plan.to_jsonable())

    def record(step: PivotStep, runs: Iterable[Run]) -> None:
        steps.append(step)
        on_step(step)
        for run in runs:
            run.add_event("PivotStepCompleted" if step.ok else "PivotStepFailed", target=plan.target,
                          step=step.name, ok=step.ok, duration_s=round(step.duration_s, 3), detail=step.detail)

    def fail(message: str, runs: Iterable[Run]) -> PivotResult:
        for run in runs:
            run.add_event("PivotFailed", target=plan.target, message=message)
        return PivotResult(plan.target, False, steps, message=message,
                           duration_s=time.monotonic() - started)

    stopped_pids: set[int] = set()
    for stop in plan.stops:
        t0 = time.monotonic()
        stopped_pids.update([stop.pid, *(pid for pid, _ in stop.members)])
        if stop.kind == "job":
            assert stop.job is not None               # plan_pivot names the job of every "job" stop
            report = supervisor.stop(stop.job)
            lines = [ln for ln in report.lines() if not ln.startswith("GPU memory not checked")]
            ok = not report.remaining and report.port_free is not False
            step = PivotStep(f"stop job {stop.job}", ok, time.monotonic() - t0, "; ".join(lines))
        else:
            ok, detail = stop_foreign(stop)
            step = PivotStep(f"stop foreign {stop.engine} PID {stop.pid}", ok, time.monotonic() - t0, detail)
        record(step, stopped_runs)
        if not step.ok:
            return fail(f"{step.name} failed: {step.detail}", stopped_runs)

    t0 = time.monotonic()
    ok, detail = verify_gpus_free(plan.gpus, stopped_pids, deadline_s=gpu_deadline_s)
    record(PivotStep("verify GPUs free", ok, time.monotonic() - t0, detail), stopped_runs)
    if not ok:
        return fail(detail, stopped_runs)

    t0 = time.monotonic()
    ports = [plan.target_settings.port] + [s.port for s in plan.stops if s.port]
    details = []
    for port in dict.fromkeys(ports):
        ok, detail = verify_port_free(port, deadline_s=port_deadline_s)
        details.append(detail)
        if not ok:
            break
    record(PivotStep("verify ports free", ok, time.monotonic() - t0, "; ".join(details)), stopped_runs)
    if not ok:
        return fail(details[-1], stopped_runs)

    t0 = time.monotonic()
    try:
        run_id = supervisor.start(plan.target)
    except Exception as exc:          # SupervisorError and the like: the pivot says so, no traceback
        record(PivotStep(f"start {plan.target}", False, time.monotonic() - t0, str(exc)), stopped_runs)
        return fail(f"start {plan.target} failed: {exc}", stopped_runs)
    target_run = find_run(plan.target, run_id, supervisor.state_dir)
    runs = stopped_runs + ([target_run] if target_run else [])
    if target_run is not None:
        target_run.add_event("PivotStarted", target=plan.target,
                             stopped=[{"job": s.job, "pid": s.pid, "kind": s.kind} for s in plan.stops])
        for earlier in steps:
            target_run.add_event("PivotStepCompleted", target=plan.target, step=earlier.name, ok=earlier.ok,
                                 duration_s=round(earlier.duration_s, 3), detail=earlier.detail)
    record(PivotStep(f"start {plan.target}", True, time.monotonic() - t0, f"run {run_id}"), runs)

    if wait:
        t0 = time.monotonic()

        def alive() -> bool:
            return supervisor.job_state(plan.target).live
        log_path = target_run.log_path if target_run else supervisor.state_dir / "missing.log"
        state = wait_until_ready(plan.target_settings, log_path,
                                 deadline_s=ready_deadline_s, alive=alive)
        record(PivotStep(f"wait for {plan.target} ready", state.ready, time.monotonic() - t0, state.detail),
               runs)
        if not state.ready:
            result = fail(f"{plan.target} did not become ready: {state.detail}", runs)
            result.run_id = run_id
            return result
    for run in runs:
        run.add_event("PivotCompleted", target=plan.target, run_id=run_id,
                      duration_s=round(time.monotonic() - started, 3))
    return PivotResult(plan.target, True, steps, run_id=run_id,
                       message=f"pivoted to {plan.target} (run {run_id})" + (", ready" if wait else ""),
                       duration_s=time.monotonic() - started)


def pivot(supervisor: Supervisor, target: str, *, stop_foreign: bool = False, wait: bool = False,
          confirm: Callable[[PivotPlan], bool] = lambda plan: True,
          on_step: Callable[[PivotStep], None] = lambda step: None, **deadlines: float) -> PivotResult:
    """Plan, ask `confirm(plan)`, execute. The console's one key calls this (in a worker thread)."""
    plan = plan_pivot(supervisor, target, stop_foreign=stop_foreign)
    if not confirm(plan):
        return PivotResult(target, False, [], message="pivot cancelled; nothing was stopped")
    return execute_pivot(supervisor, plan, wait=wait, on_step=on_step, **deadlines)
