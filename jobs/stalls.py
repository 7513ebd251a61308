"""Health rules for one run: observations over time -> alerts (stalled, nccl_hang, crashed, oom_risk…); pure, no I/O."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from gpudeck.jobs.strictjson import first_number

GIB = 1024 ** 3

# How long a job may show no sign of life before it is called stalled, per phase
# (then per kind). Phases come first because they say what the job is doing now:
# a torch.compile or a kernel build can sit silent far longer than a weight load.
STALL_AFTER_BY_PHASE: dict[str, float] = {
    "starting": 600.0,
    "loading": 600.0,
    "compiling": 900.0,
    "capturing": 600.0,
    "building": 900.0,
    "training": 600.0,
    "ready": 600.0,
}
STALL_AFTER_BY_KIND: dict[str, float] = {
    "engine": 600.0,
    "build": 900.0,
    "train": 600.0,
    "stage": 600.0,
    "service": 600.0,
}
STALL_AFTER_FALLBACK = 600.0

# A hung collective is caught well before NCCL's own 10-minute watchdog fires.
NCCL_HANG_AFTER = 180.0

# Analyzer/engine warnings that are alerts in their own right.
PASS_THROUGH_WARNINGS = ("spec_decode_ineffective", "oom_risk")

SEVERITY = {
    "crashed": "error",
    "stalled": "error",
    "nccl_hang": "error",
    "oom_risk": "warning",
    "spec_decode_ineffective": "warning",
}

FAILURE_WORDS = {
    "cuda_oom": "CUDA out of memory",
    "host_oom": "killed by the host OOM killer",
    "nccl": "NCCL error",
    "cuda_error": "CUDA error",
    "import_error": "import error",
    "syntax_error": "SyntaxError in the code",
    "bad_arguments": "bad command-line arguments",
    "build_failed": "build failed",
    "hang": "the engine's watchdog declared a hang",
    "gpu_fault": "GPU hardware fault",
    "exception": "unhandled exception",
    "time_limit": "Slurm ended it at its time limit",
    "node_fail": "its Slurm node failed",
    "preempted": "Slurm preempted it",
}


def default_stall_after(kind: Optional[str], phase: Optional[str]) -> float:
    if phase in STALL_AFTER_BY_PHASE:
        return STALL_AFTER_BY_PHASE[phase]
    return STALL_AFTER_BY_KIND.get(kind or "", STALL_AFTER_FALLBACK)


def human_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


@dataclass(frozen=True)
class Thresholds:
    """What counts as "doing nothing". Generous on purpose: a false stall wakes someone up."""

    cpu_idle_percent: float = 3.0          # whole tree, 100 = one core busy
    disk_idle_bps: float = 512 * 1024      # a weight load reads hundreds of MB/s
    gpu_idle_util: float = 5.0             # percent
    nccl_util: float = 95.0                # a spinning collective kernel pins util at ~100%
    nccl_power_fraction: float = 0.30      # ...while drawing little more than idle power
    nccl_power_w: float = 150.0            # used when the power limit is unknown
    nccl_after: float = NCCL_HANG_AFTER
    mem_low_fraction: float = 0.10         # "nearly exhausted": below 10% of RAM...
    mem_low_cap: int = 16 * GIB            # ...but never more than 16 GiB on a huge host
    mem_recovered_factor: float = 1.5      # cleared once available climbs back above 1.5x the low mark
    mem_window_s: float = 30.0             # "falling" = below the highest value of the last 30 s
    mem_fall_min: int = 256 * 1024 ** 2    # ...by at least this much
    mem_per_compile_job: int = 6 * GIB     # an nvcc/cicc job takes ~4-8 GB
    live_failure_grace_s: float = 5.0      # a logged fatal error with the tree still alive this long = crashed


@dataclass(frozen=True)
class GpuReading:
    """One of the job's GPUs at one instant (None: NVML did not say)."""

    index: int
    util: Optional[float] = None
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None


@dataclass(frozen=True)
class Observation:
    """Everything the rules look at for one run at one tick.

    None means "not measured"; the rules never read a missing measurement as idleness,
    except for GPUs and disk, which a job may simply not have or not be allowed to read.
    """

    time: float
    alive: bool = True
    cpu_percent: Optional[float] = None        # process tree, from cpu-seconds deltas
    disk_read_bps: Optional[float] = None      # process tree
    gpus: tuple[GpuReading, ...] = ()          # the job's GPUs (empty: none / unknown)
    log_grew: int = 0                          # log bytes written since the previous tick
    port_listening: Optional[bool] = None      # None: the job declares no port
    phase: Optional[str] = None                # from the log analyzer
    serving: Optional[Mapping[str, Any]] = None
    warnings: tuple[Mapping[str, Any], ...] = ()
    failure: Optional[Mapping[str, Any]] = None
    mem_available: Optional[int] = None        # host, bytes
    mem_total: Optional[int] = None
    cpu_count: Optional[int] = None
    tree_rss: Optional[int] = None             # bytes held by the job's tree


@dataclass(frozen=True)
class RunEnd:
    """How the run ended (from the runner's exit record)."""

    time: float
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stopped: bool = False                      # the operator asked for it: not a crash
    failure: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class Alert:
    code: str
    since: float                               # when the condition began (epoch seconds)
    message: str
    severity: str = "error"
    job: str = ""
    run_id: str = ""
    cleared: Optional[float] = None            # set on the copy reported as cleared
    cause: Optional[str] = None                # crashed: the failure cause
    hint: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "since": self.since, "message": self.message,
                               "severity": self.severity, "job": self.job, "run_id": self.run_id}
        if self.cause is not None:
            out["cause"] = self.cause
        if self.hint is not None:
            out["hint"] = self.hint
        if self.cleared is not None:
            out["cleared"] = self.cleared
        return out


@dataclass(frozen=True)
class HealthUpdate:
    active: tuple[Alert, ...]
    raised: tuple[Alert, ...]                  # new this tick: fire on_alert for these
    cleared: tuple[Alert, ...]


@dataclass
class _Condition:
    since: float
    message: str
    cause: Optional[str] = None
    hint: Optional[str] = None


# The first strict number under any of the keys: the analyzer and the metrics scraper name things differently.
_num = first_number


def serving_demand(serving: Optional[Mapping[str, Any]]) -> Optional[float]:
    running = _num(serving, "running", "num_requests_running", "running_reqs", "num_running_reqs")
    waiting = _num(serving, "waiting", "num_requests_waiting", "waiting_reqs", "queue_reqs", "num_queue_reqs")
    if running is None and waiting is None:
        return None
    return (running or 0.0) + (waiting or 0.0)


def serving_gen_rate(serving: Optional[Mapping[str, Any]]) -> Optional[float]:
    return _num(serving, "gen_tps", "generation_tps", "gen_throughput", "generation_throughput",
                "gen_tokens_per_s", "generation_tokens_per_s")


def serving_gen_total(serving: Optional[Mapping[str, Any]]) -> Optional[float]:
    return _num(serving, "gen_tokens_total", "generation_tokens_total", "gen_total")


def suggest_max_jobs(mem_available: int, tree_rss: Optional[int], cpu_count: Optional[int],
                     per_job: int = 6 * GIB) -> int:
    """MAX_JOBS that fits in RAM: what is free plus what the build itself holds (freed on relaunch), 80% of it."""
    budget = mem_available + (tree_rss or 0)
    jobs = int(budget * 0.8 // per_job)
    if cpu_count:
        jobs = min(jobs, cpu_count)
    return max(1, jobs)


def crash_message(cause: Optional[str], failure_message: Optional[str], exit_code: Optional[int],
                  signal: Optional[int]) -> str:
    how = ""
    if signal:
        how = f"killed by signal {signal}"
    elif exit_code is not None:
        how = f"exited with status {exit_code}"
    words = FAILURE_WORDS.get(cause or "", cause or "")
    parts = [p for p in (words, how) if p]
    head = "; ".join(parts) if parts else "ended with a failure"
    if failure_message:
        return f"{head}: {failure_message.strip()[:300]}"
    return head


class HealthRules:
    """Stateful judge for one run: feed `observe()` every tick, `end()` once; read `active`.

    Alerts are raised once (reported in `raised`), kept while their condition holds,
    and cleared when it ends; `since` is when the condition began, not when we noticed.
    """

    def __init__(self, kind: Optional[str] = "stage", stall_after: Optional[float] = None,
                 job: str = "", run_id: str = "", thresholds: Thresholds = Thresholds()):
        self.kind = kind
        self.stall_after = stall_after
        self.job = job
        self.run_id = run_id
        self.t = thresholds
        self._active: dict[str, Alert] = {}
        self._quiet_since: Optional[float] = None      # last sign of life (None: not started)
        self._serving_quiet_since: Optional[float] = None
        self._last_gen_total: Optional[float] = None
        self._pinned_since: Optional[float] = None     # nccl_hang condition began
        self._mem: deque[tuple[float, int]] = deque()
        self._oom_since: Optional[float] = None
        self._failed_alive_since: Optional[float] = None
        self._ended = False
        self.history: list[Alert] = []                  # every alert ever raised, with `cleared` when it was

    @property
    def active(self) -> tuple[Alert, ...]:
        return tuple(self._active.values())

    def stall_window(self, phase: Optional[str]) -> float:
        if self.stall_after is not None:
            return float(self.stall_after)
        return default_stall_after(self.kind, phase)

    # -- ticks -------------------------------------------------------------

    def observe(self, obs: Observation) -> HealthUpdate:
        if self._ended:
            return HealthUpdate(self.active, (), ())
        conditions: dict[str, _Condition] = {}
        if obs.alive:
            stalled = self._stall_condition(obs)
            if stalled:
                conditions["stalled"] = stalled
            hang = self._nccl_condition(obs)
            if hang:
                conditions["nccl_hang"] = hang
            oom = self._oom_condition(obs)
            if oom:
                conditions["oom_risk"] = oom
            if obs.failure and obs.phase == "failed":
                # vLLM's API server (and SGLang after its watchdog) can outlive a dead
                # engine for a long time, holding the GPUs: that is a crash already.
                # A grace period first, so a job that prints its traceback and exits is
                # reported once, by end(), with its exit status.
                if self._failed_alive_since is None:
                    self._failed_alive_since = obs.time
                if obs.time - self._failed_alive_since >= self.t.live_failure_grace_s or "crashed" in self._active:
                    conditions["crashed"] = self._crash_condition(self._failed_alive_since, obs.failure,
                                                                  None, None, alive=True)
            else:
                self._failed_alive_since = None
        elif "crashed" in self._active:
            # The tree is gone but the run has not been judged yet (end() comes next): hold the crash.
            held = self._active["crashed"]
            conditions["crashed"] = _Condition(since=held.since, message=held.message, cause=held.cause,
                                               hint=held.hint)
        for warning in obs.warnings:
            # The log analyzer says {code, message}; the engines' metrics judge says {kind, detail}.
            code = warning.get("code") or warning.get("kind")
            if code in PASS_THROUGH_WARNINGS and code not in conditions:
                text = warning.get("message") or warning.get("detail") or code
                conditions[code] = _Condition(since=obs.time, message=str(text))
        return self._settle(obs.time, conditions)

    def end(self, run_end: RunEnd) -> HealthUpdate:
        """The run is over: live conditions clear; a failed exit raises `crashed`."""
        conditions: dict[str, _Condition] = {}
        failed_exit = (run_end.exit_code not in (None, 0)) or bool(run_end.signal)
        # A crash seen while the tree lingered stays a crash even if the operator then stopped it.
        if "crashed" in self._active or (failed_exit and not run_end.stopped):
            conditions["crashed"] = self._crash_condition(run_end.time, run_end.failure,
                                                          run_end.exit_code, run_end.signal, alive=False)
        update = self._settle(run_end.time, conditions)
        self._ended = True
        return update

    # -- rules -------------------------------------------------------------

    def _gpus_idle(self, obs: Observation) -> bool:
        utils = [g.util for g in obs.gpus if g.util is not None]
        return all(u <= self.t.gpu_idle_util for u in utils)

    def _signs_of_life(self, obs: Observation) -> list[str]:
        """Why this tick is NOT quiet (empty: quiet). Unknown CPU counts as life: never guess a stall."""
        signs = []
        if obs.log_grew > 0:
            signs.append("log")
        if obs.cpu_percent is None or obs.cpu_percent > self.t.cpu_idle_percent:
            signs.append("cpu")
        if obs.disk_read_bps is not None and obs.disk_read_bps > self.t.disk_idle_bps:
            signs.append("disk")
        if not self._gpus_idle(obs):
            signs.append("gpu")
        return signs

    def _stall_condition(self, obs: Observation) -> Optional[_Condition]:
        window = self.stall_window(obs.phase)
        serving_mode = obs.port_listening is True or obs.phase == "ready"
        if serving_mode:
            # A listening, idle server is healthy however quiet it is; a server with
            # requests in flight whose generation does not advance is not.
            self._quiet_since = obs.time
            return self._serving_stall(obs, window)
        self._serving_quiet_since = None
        if self._quiet_since is None or self._signs_of_life(obs):
            self._quiet_since = obs.time
            return None
        quiet_for = obs.time - self._quiet_since
        if quiet_for < window:
            return None
        what = "GPU idle, " if obs.gpus else ""
        port = " and its port is not listening" if obs.port_listening is False else ""
        phase = f" while {obs.phase}" if obs.phase and obs.phase != "unknown" else ""
        message = (f"no sign of life{phase} for {human_duration(quiet_for)}: process alive, "
                   f"{what}CPU ~0%, no disk reads, log silent{port}")
        return _Condition(since=self._quiet_since, message=message)

    def _serving_stall(self, obs: Observation, window: float) -> Optional[_Condition]:
        serving = obs.serving
        demand = serving_demand(serving)
        total = serving_gen_total(serving)
        rate = serving_gen_rate(serving)
        advancing = False
        if total is not None:
            advancing = self._last_gen_total is not None and total > self._last_gen_total
            if self._last_gen_total is None:
                advancing = True
            self._last_gen_total = total
        if not advancing and rate is not None and rate > 0 and obs.log_grew > 0:
            advancing = True     # a fresh stats line reporting tokens flowing
        if demand is None or demand <= 0 or advancing or self._serving_quiet_since is None:
            self._serving_quiet_since = obs.time
            return None
        quiet_for = obs.time - self._serving_quiet_since
        if quiet_for < window:
            return None
        waiting = _num(serving, "waiting", "num_requests_waiting", "waiting_reqs", "queue_reqs", "num_queue_reqs")
        running = _num(serving, "running", "num_requests_running", "running_reqs", "num_running_reqs")
        message = (f"serving but generation has not advanced for {human_duration(quiet_for)} "
                   f"with {int(running or 0)} running and {int(waiting or 0)} waiting requests")
        return _Condition(since=self._serving_quiet_since, message=message)

    def _nccl_condition(self, obs: Observation) -> Optional[_Condition]:
        pinned = [g for g in obs.gpus if g.util is not None and g.util >= self.t.nccl_util]
        busy_power = False
        for g in obs.gpus:
            if g.power_w is None:
                continue
            limit = (g.power_limit_w * self.t.nccl_power_fraction) if g.power_limit_w else self.t.nccl_power_w
            if g.power_w > limit:
                busy_power = True
        pinned_low = pinned and all(g.power_w is not None for g in pinned) and not busy_power
        if not pinned_low or obs.log_grew > 0:
            self._pinned_since = None
            return None
        if self._pinned_since is None:
            self._pinned_since = obs.time
        pinned_for = obs.time - self._pinned_since
        window = min(self.t.nccl_after, self.stall_window(obs.phase))
        if pinned_for < window:
            return None
        gpus = ",".join(str(g.index) for g in pinned)
        watts = ", ".join(f"{g.power_w:.0f} W" for g in pinned[:4])
        message = (f"GPU {gpus} pinned at ~100% util while drawing near-idle power ({watts}) and the log "
                   f"silent for {human_duration(pinned_for)}: looks like a hung NCCL collective")
        return _Condition(since=self._pinned_since, message=message)

    def _oom_condition(self, obs: Observation) -> Optional[_Condition]:
        building = self.kind == "build" or obs.phase == "building"
        if not building or obs.mem_available is None or not obs.mem_total:
            self._mem.clear()
            self._oom_since = None
            return None
        self._mem.append((obs.time, obs.mem_available))
        while self._mem and self._mem[0][0] < obs.time - self.t.mem_window_s:
            self._mem.popleft()
        low = min(obs.mem_total * self.t.mem_low_fraction, self.t.mem_low_cap)
        if self._oom_since is not None:
            # Hysteresis: once raised, hold until memory has clearly recovered.
            if obs.mem_available > low * self.t.mem_recovered_factor:
                self._oom_since = None
                return None
            since = self._oom_since
        else:
            peak = max(m for _, m in self._mem)
            falling = peak - obs.mem_available >= self.t.mem_fall_min
            if obs.mem_available >= low or not falling:
                return None
            since = self._oom_since = obs.time
        jobs = suggest_max_jobs(obs.mem_available, obs.tree_rss, obs.cpu_count, self.t.mem_per_compile_job)
        message = (f"host RAM nearly exhausted while building: {obs.mem_available / GIB:.1f} GiB free of "
                   f"{obs.mem_total / GIB:.0f} GiB and falling; each nvcc/cicc job takes ~4-8 GB — "
                   f"relaunch with MAX_JOBS={jobs} (CMAKE_BUILD_PARALLEL_LEVEL={jobs} for sgl-kernel)")
        return _Condition(since=since, message=message, hint=f"MAX_JOBS={jobs}")

    def _crash_condition(self, when: float, failure: Optional[Mapping[str, Any]], exit_code: Optional[int],
                         signal: Optional[int], alive: bool) -> _Condition:
        cause = (failure or {}).get("cause") if failure else None
        hint = (failure or {}).get("hint") if failure else None
        fmsg = (failure or {}).get("message") if failure else None
        if cause is None and (signal == 9 or exit_code in (137, -9)):
            cause = "host_oom"
            hint = hint or "SIGKILL with no error logged is usually the host OOM killer: check `dmesg`, lower parallelism (MAX_JOBS) or batch size"
        message = crash_message(cause, fmsg, exit_code, signal)
        if alive:
            message += " (process tree still alive: it may be holding the GPUs)"
        line = (failure or {}).get("line") if failure else None
        if isinstance(line, int) and line > 0:
            message += f" [log line {line}]"
        existing = self._active.get("crashed")
        since = existing.since if existing else when
        return _Condition(since=since, message=message, cause=cause, hint=hint)

    # -- bookkeeping -------------------------------------------------------

    def _settle(self, now: float, conditions: dict[str, _Condition]) -> HealthUpdate:
        raised, cleared = [], []
        for code in list(self._active):
            if code not in conditions:
                gone = replace(self._active.pop(code), cleared=now)
                cleared.append(gone)
                self._record_cleared(gone)
        for code, cond in conditions.items():
            existing = self._active.get(code)
            alert = Alert(code=code, since=existing.since if existing else cond.since, message=cond.message,
                          severity=SEVERITY.get(code, "warning"), job=self.job, run_id=self.run_id,
                          cause=cond.cause, hint=cond.hint)
            self._active[code] = alert
            if existing is None:
                raised.append(alert)
                self.history.append(alert)
            else:
                self._replace_in_history(alert)
        return HealthUpdate(self.active, tuple(raised), tuple(cleared))

    def _replace_in_history(self, alert: Alert) -> None:
        for i in range(len(self.history) - 1, -1, -1):
            h = self.history[i]
            if h.code == alert.code and h.cleared is None:
                self.history[i] = alert
                return

    def _record_cleared(self, gone: Alert) -> None:
        for i in range(len(self.history) - 1, -1, -1):
            h = self.history[i]
            if h.code == gone.code and h.cleared is None:
                self.history[i] = gone
                return
