"""The typed job view model: one job of the `jobs --json` payload as the words every face shows.

`gpudeck jobs` and the console's jobs screen both build their rows from `JobView.cells()`, so a
job reads the same in the terminal table and in the TUI (state, phase, progress, ETA, alerts,
serving). Payload fields come from files other processes write: every field is type-checked here
and every text passes the sanitizer, so a face never sees a wrong type or a control character.
Stdlib only: no Textual, no Rich.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from gpudeck.jobs.logs.sanitize import terminal_text
from gpudeck.jobs.strictjson import finite_number, integer, number

EMPTY = "—"                    # a cell with nothing to say
LIVE_STATES = ("starting", "running", "stopping")
STALL_CODES = frozenset({"stalled", "nccl_hang"})
FAILURE_CODES = frozenset({"crashed"})
ENDED_PHASES = frozenset({"failed", "done", "stopped", "exited", "finished", "crashed"})
# A live run whose progress has not moved for this long shows "no progress for …" instead of an ETA.
NO_PROGRESS_AFTER_S = 120.0
# Every state word a row can show (a face sizes its state column for the longest).
STATE_WORDS = ("idle", "starting", "running", "stopping", "stopped", "exited", "lost", "STALLED")
# The row's columns, in order: (key, label). Faces choose which to show; the texts are these.
COLUMNS = (("name", "name"), ("kind", "kind"), ("state", "state"), ("runtime", "runtime"), ("pid", "pid"),
           ("run", "run"), ("port", "port"), ("gpus", "gpus"), ("exit", "exit"), ("alerts", "alerts"),
           ("serving", "serving"), ("slurm", "slurm"), ("phase", "phase / progress"))


# A progress label longer than this is cut even in a wide column (a label is a few words; a log line is not).
LABEL_CHARS = 80


def fit_progress(words: tuple[str, str, str], width: Optional[int]) -> str:
    """(phase, label, numbers) as one cell of at most `width` characters: the label is shortened with an
    ellipsis first, then left out, then the phase; the numbers and ETA always stay whole."""
    phase, label, numbers = words

    def joined(*parts: str) -> str:
        return " ".join(p for p in parts if p)
    text = joined(phase, label, numbers)
    if width is None or len(text) <= width:
        return text
    room = width - len(joined(phase, numbers)) - 1          # the label's own space beside the others
    if label and room >= 4:                                  # three letters and the ellipsis say something
        return joined(phase, label[:room - 1].rstrip() + "…", numbers)
    if len(joined(phase, numbers)) <= width:
        return joined(phase, numbers)
    return numbers or phase[:width]


def human_age(seconds: Optional[float]) -> str:
    """Two most significant units: '3d04h', '2h05m', '5m12s', '42s'."""
    if seconds is None or finite_number(seconds) is None or seconds < 0:
        return "n/a"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


def clean(text: Any, limit: int = 400) -> str:
    """Text from jobs, logs and processes as one terminal-safe cell: the core's sanitizer, then a TAB
    as a space and anything else unprintable (line separators) as '?', cut to `limit` characters."""
    if text is None or text == "":
        return ""
    text = terminal_text(text, limit).replace("\t", " ")
    return "".join(ch if ch.isprintable() else "?" for ch in text)


# The one strict number rule (strictjson): an `Infinity` or a 400-digit int from an old health.json
# is no number to show.
_num = number
_int = integer


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ProgressView:
    done: Optional[float] = None
    total: Optional[float] = None
    label: Optional[str] = None
    eta_s: Optional[float] = None

    @classmethod
    def from_payload(cls, data: Any) -> Optional["ProgressView"]:
        data = _dict(data)
        if not data:
            return None
        return cls(done=_num(data.get("done")), total=_num(data.get("total")),
                   label=_str(data.get("label")), eta_s=_num(data.get("eta_s")))

    @property
    def percent(self) -> Optional[float]:
        if self.done is None or not self.total:
            return None
        return 100.0 * self.done / self.total

    def text(self, eta: bool = True) -> str:
        """`gen 6200/10000 62% ETA 55m00s`; empty when there is nothing measured. `eta=False`: no ETA."""
        return " ".join(p for p in self.pieces(eta) if p)

    def pieces(self, eta: bool = True) -> tuple[str, str]:
        """(label, numbers and ETA): a column too narrow for both shortens the label, never the numbers."""
        if self.done is None or not self.total:
            return "", (f"ETA {human_age(self.eta_s)}" if eta and self.eta_s is not None else "")
        numbers = f"{self.done:g}/{self.total:g} {self.percent:.0f}%"
        if eta and self.eta_s is not None:
            numbers += f" ETA {human_age(self.eta_s)}"
        return clean(self.label, LABEL_CHARS), numbers

    def where(self) -> str:
        """`8/64` (what an ended or stuck run reached), empty when nothing was counted."""
        if self.done is None:
            return ""
        return f"{self.done:g}/{self.total:g}" if self.total else f"{self.done:g}"


@dataclass(frozen=True)
class AlertView:
    code: str
    message: str = ""
    severity: Optional[str] = None
    since: Optional[float] = None
    stacks: str = ""                        # the verdict of the episode's stack dump, once taken
    cause: str = ""                         # crashed: the failure cause (cuda_oom, host_oom, …), when known

    @classmethod
    def from_payload(cls, data: Any) -> Optional["AlertView"]:
        if not isinstance(data, dict) or data.get("code") is None:
            return None
        stacks = data.get("stacks")
        dumped: dict = stacks if isinstance(stacks, dict) else {}
        return cls(code=clean(data.get("code"), 40), message=clean(data.get("message"), 300),
                   severity=_str(data.get("severity")), since=_num(data.get("since")),
                   stacks=clean(dumped.get("verdict"), 300) if isinstance(dumped.get("verdict"), str) else "",
                   cause=clean(data.get("cause"), 80) if isinstance(data.get("cause"), str) else "")

    def notice_text(self) -> str:
        """The message for a one-line notice: a dump's verdict first (it says where the job waits, and
        the banner cuts long lines), then the rule's own words without the verdict they end with."""
        if not self.stacks:
            return self.message
        return f"stacks: {self.stacks} — {self.message.split(' — stacks: ', 1)[0]}"

    @property
    def is_failure(self) -> bool:
        return self.code in FAILURE_CODES or self.code in STALL_CODES


@dataclass(frozen=True)
class FailureView:
    cause: str
    line: Optional[int] = None
    hint: str = ""

    @classmethod
    def from_payload(cls, data: Any) -> Optional["FailureView"]:
        data = _dict(data)
        if not data.get("cause"):
            return None
        return cls(cause=clean(data.get("cause"), 80), line=_int(data.get("line")), hint=clean(data.get("hint"), 200))


@dataclass(frozen=True)
class ServingView:
    gen_tokens_per_s: Optional[float] = None
    running: Optional[float] = None
    waiting: Optional[float] = None
    kv_cache_pct: Optional[float] = None
    spec_accept_rate: Optional[float] = None
    spec_accept_len: Optional[float] = None

    @classmethod
    def from_payload(cls, data: Any) -> Optional["ServingView"]:
        data = _dict(data)
        if not data:
            return None
        return cls(**{name: _num(data.get(name)) for name in cls.__dataclass_fields__})

    def text(self) -> str:
        """`54.6 tok/s run 4 wait 0 KV 37%`: the numbers an operator reads at a glance."""
        def num(value: Optional[float], fmt: str) -> str:
            return EMPTY if value is None else format(value, fmt)
        return (f"{num(self.gen_tokens_per_s, '.1f')} tok/s run {num(self.running, '.0f')} "
                f"wait {num(self.waiting, '.0f')} KV {num(self.kv_cache_pct, '.0f')}%")


@dataclass(frozen=True)
class JobView:
    """One job as every face shows it (built from one record of `jobs_payload()["jobs"]`)."""

    name: str
    kind: str = ""
    state: str = "?"
    pid: Optional[int] = None
    run_id: Optional[str] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    port: Optional[int] = None
    port_open: Optional[bool] = None
    gpus: tuple[int, ...] = ()
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    phase: Optional[str] = None
    progress: Optional[ProgressView] = None
    progress_at: Optional[float] = None   # unix time the progress last moved (health.json)
    alerts: tuple[AlertView, ...] = ()
    failure: Optional[FailureView] = None
    serving: Optional[ServingView] = None
    slurm: Optional[str] = None      # a Slurm run: "10 PENDING (Dependency)", "10 RUNNING on node12", "10 TIMEOUT"
    payload: dict = field(default_factory=dict, compare=False, repr=False)   # the record it came from

    @classmethod
    def from_payload(cls, job: dict) -> "JobView":
        alerts = job.get("alerts")
        if not isinstance(alerts, list):
            alerts = []
        gpus = job.get("gpus")
        if not isinstance(gpus, (list, tuple)):
            gpus = ()
        phase = _str(job.get("phase"))
        return cls(
            name=clean(job.get("name"), 40) or "?", kind=clean(job.get("kind"), 16), state=clean(job.get("state"), 16) or "?",
            pid=_int(job.get("pid")), run_id=_str(job.get("run_id")),
            started_at=_num(job.get("started_at")), ended_at=_num(job.get("ended_at")),
            port=_int(job.get("port")), port_open=job.get("port_open") if isinstance(job.get("port_open"), bool) else None,
            gpus=tuple(g for g in gpus if _int(g) is not None),
            exit_code=_int(job.get("exit_code")), signal=_str(job.get("signal")),
            phase=None if phase == "unknown" else clean(phase, 24) or None,
            progress=ProgressView.from_payload(job.get("progress")),
            progress_at=_num(job.get("progress_at")),
            alerts=tuple(a for a in (AlertView.from_payload(x) for x in alerts) if a is not None),
            failure=FailureView.from_payload(job.get("failure")),
            serving=ServingView.from_payload(job.get("serving")),
            slurm=_slurm_text(job.get("slurm")),
            payload=job)

    # -- meaning -----------------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def health(self) -> str:
        """ok / idle / warning / stalled / failed, from the state, the exit and the alerts."""
        codes = {a.code for a in self.alerts}
        if codes & STALL_CODES:
            return "stalled"
        if codes & FAILURE_CODES or self.state == "lost":
            return "failed"
        if self.state == "exited" and (self.exit_code not in (0, None) or self.signal):
            return "failed"
        if codes:
            return "warning"
        if self.state in ("idle", "?"):
            return "idle"
        return "ok"

    @property
    def failure_cause(self) -> Optional[str]:
        """Why the latest run failed, None when it did not: the crashed alert's cause (which also names
        a SIGKILL with nothing logged `host_oom`), else the log analysis's, else `lost` for a run whose
        runner vanished, else `unknown`. A live run whose logged error it carried on from has none."""
        crashed = [a for a in self.alerts if a.code in FAILURE_CODES]
        if not crashed and self.health != "failed":
            return None
        for alert in crashed:
            if alert.cause:
                return alert.cause
        if self.failure is not None:
            return self.failure.cause
        return "lost" if self.state == "lost" else "unknown"

    # -- the row's words -------------------------------------------------------------------------
    def state_text(self) -> str:
        return "STALLED" if self.health == "stalled" else self.state

    def runtime_text(self, now: float) -> str:
        if not self.started_at:
            return EMPTY
        return human_age(max(0.0, (self.ended_at or now) - self.started_at))

    def port_text(self) -> str:
        return EMPTY if self.port is None else f"{self.port} {'open' if self.port_open else 'shut'}"

    def gpus_text(self) -> str:
        gpus = list(self.gpus)
        if not gpus:
            return EMPTY
        if len(gpus) > 2 and gpus == list(range(gpus[0], gpus[0] + len(gpus))):
            return f"{gpus[0]}-{gpus[-1]}"
        return ",".join(str(g) for g in gpus)

    def exit_text(self) -> str:
        if self.signal:
            return clean(self.signal, 16)
        return EMPTY if self.exit_code is None else str(self.exit_code)

    def progress_text(self, compact: bool = False, now: Optional[float] = None, width: Optional[int] = None) -> str:
        """`loading gen 33/85 39% ETA 12m00s`; `compact` leaves out a phase that only repeats the state.

        An ETA is shown only while the run is live and its progress moves: an ended run
        says where it got to (`loading at 8/64 when stopped`), a stuck one for how long
        nothing moved (`loading 8/64 13% no progress for 5m00s`). `width`: the characters the column has;
        the label is shortened to fit, never the numbers or the ETA.
        """
        progress = self.progress
        if progress is not None and not self.live and self.state != "idle" and progress.where():
            when = {"stopped": "when stopped", "lost": "when lost"}.get(
                self.state, "when it failed" if self.health == "failed" else "when it ended")
            # A phase that only names the end ("failed") says nothing beside "when it failed".
            phase = f"{self.phase} " if self.phase and self.phase not in ENDED_PHASES else ""
            return clean(f"{phase}at {progress.where()} {when}", 60) or EMPTY
        stuck = self._stuck_for(now)
        label, numbers = progress.pieces(eta=stuck is None) if progress is not None else ("", "")
        if numbers and stuck is not None:
            # A stall alert without a time the progress last moved: how long is not known, so not said.
            numbers += f" no progress for {human_age(stuck)}" if stuck >= 0 else " no progress"
        measured = bool(label or numbers)
        # A phase repeating the state word beside it says nothing in a narrow table (alone it still shows).
        phase = self.phase if self.phase and not (compact and measured and self.phase == self.state_text()) else ""
        return fit_progress((phase, label, numbers), width) or EMPTY

    def eta_s(self, now: Optional[float] = None) -> Optional[float]:
        """The ETA a face may show: the progress's, only while the run is live and its progress moves."""
        if not self.live or self.progress is None or self._stuck_for(now) is not None:
            return None
        return self.progress.eta_s

    def _stuck_for(self, now: Optional[float]) -> Optional[float]:
        """Seconds since the progress last moved, when that is long enough to distrust an ETA (or a stall alert
        says so); -1.0 when a stall alert says so but the time the progress last moved is not known."""
        if not self.live or self.progress is None:
            return None
        since = None if now is None or self.progress_at is None else max(0.0, now - self.progress_at)
        if since is not None and since >= NO_PROGRESS_AFTER_S:
            return since
        if {a.code for a in self.alerts} & STALL_CODES:
            return since if since is not None else -1.0
        return None

    def alerts_text(self) -> str:
        return clean(",".join(a.code for a in self.alerts), 40)

    def serving_text(self) -> str:
        return self.serving.text() if self.serving is not None and self.live else ""

    def cells(self, now: float, compact: bool = False, phase_width: Optional[int] = None) -> dict[str, str]:
        """Each column's text, by the keys of COLUMNS; `phase_width`: the phase column's width, if it has one."""
        return {"name": self.name, "kind": self.kind, "state": self.state_text(), "runtime": self.runtime_text(now),
                "pid": self.pid_text(), "run": clean(self.run_id, 32) or EMPTY,
                "port": self.port_text(), "gpus": self.gpus_text(), "exit": self.exit_text(),
                "alerts": self.alerts_text(), "serving": self.serving_text(), "slurm": self.slurm or "",
                "phase": self.progress_text(compact, now, phase_width)}

    def pid_text(self) -> str:
        if self.pid is not None:
            return str(self.pid)
        job_id = _dict(self.payload.get("slurm")).get("job_id")
        return clean(f"slurm:{job_id}", 16) if job_id else EMPTY

    def notice_lines(self, now: float) -> list[str]:
        """What the operator must act on, one line each: its alerts, and a failure no alert names."""
        lines = []
        for alert in self.alerts:
            when = f" for {human_age(now - alert.since)}" if alert.since is not None else ""
            lines.append(clean(f"⚠ {self.name}: {alert.code}{when} — {alert.notice_text()}", 300))
        if self.failure is not None and not any(a.code in FAILURE_CODES for a in self.alerts):
            where = f" at log line {self.failure.line}" if self.failure.line is not None else ""
            hint = f" — {self.failure.hint}" if self.failure.hint else ""
            lines.append(clean(f"⚠ {self.name}: {self.failure.cause}{where}{hint}", 300))
        return lines


def _slurm_text(data: Any) -> Optional[str]:
    """Slurm's own words for a Slurm run: its job id and state (with the reason while pending)."""
    data = _dict(data)
    if not data.get("job_id"):
        return None
    return clean(f"{data.get('job_id')} {data.get('text') or data.get('state') or ''}".strip(), 48)


def job_views(payload: Any) -> list[JobView]:
    """Every job of a `jobs_payload()` document, typed (a record that is not a dict is skipped)."""
    jobs = _dict(payload).get("jobs")
    return [JobView.from_payload(job) for job in jobs or [] if isinstance(job, dict)]


@dataclass(frozen=True)
class EngineView:
    """One inference engine as the engine panel shows it: a managed engine job, or a FOREIGN engine process."""

    name: str                          # job name, or "vllm PID 4412" for a foreign one
    managed: bool
    engine: Optional[str] = None       # "vllm" | "sglang" | None (not known yet)
    state: str = "idle"                # job state, or the engine's phase when it runs
    model: Optional[str] = None
    port: Optional[int] = None
    port_open: Optional[bool] = None
    started_at: Optional[float] = None
    serving: Optional[dict] = None
    pid: Optional[int] = None
    gpu_mem: Optional[int] = None
    cmdline: str = ""
    orphan: bool = False


EngineSpec = tuple[Optional[str], Optional[str], Optional[int]]     # (engine, model, port) of an engine job


def engine_views(jobs: list[JobView], engine_specs: dict[str, EngineSpec], foreign: list[dict]) -> list[EngineView]:
    """Engine jobs (those with an entry in `engine_specs`), then foreign engines (discovery's dicts)."""
    rows = []
    for job in jobs:
        if job.name not in engine_specs:
            continue
        engine, model, port = engine_specs[job.name]
        state = job.phase if job.live and job.phase else job.state if job.state != "?" else "idle"
        serving = job.payload.get("serving")
        rows.append(EngineView(name=job.name, managed=True, engine=engine, state=state, model=model,
                               port=port if port is not None else job.port, port_open=job.port_open,
                               started_at=job.started_at if job.live else None,
                               serving=serving if job.live and isinstance(serving, dict) else None, pid=job.pid))
    for e in foreign:
        if e.get("managed"):
            continue
        rows.append(EngineView(name=f"{e.get('engine')} PID {e.get('pid')}", managed=False, engine=e.get("engine"),
                               state="running", model=e.get("model"), port=e.get("port"),
                               port_open=e.get("port") is not None, started_at=e.get("create_time") or None,
                               pid=e.get("pid"), gpu_mem=e.get("gpu_mem"), cmdline=str(e.get("cmdline") or ""),
                               orphan=bool(e.get("orphan"))))
    return rows


@dataclass(frozen=True)
class JobsSnapshot:
    """Everything the jobs view shows at one instant; a live watcher and a replay both produce these."""

    taken_at: float
    jobs: tuple[JobView, ...] = ()
    engines: tuple[EngineView, ...] = ()
    log_paths: dict[str, str] = field(default_factory=dict)    # job -> its latest run's output.log
    pipelines: tuple[dict, ...] = ()
    reason: Optional[str] = None        # why there are no jobs at all (no jobs file, a bad one)
    error: Optional[str] = None         # this poll failed: the jobs shown are the last good ones
    # A replay (gpudeck.jobs.replay): how much of each log had arrived at the position, and the
    # player's state (a SessionFrame: position, speed, marks). Both empty for live snapshots.
    log_limits: dict[str, int] = field(default_factory=dict)
    replay: Optional[Any] = None

    @classmethod
    def from_payload(cls, payload: dict, taken_at: float, **kwargs: Any) -> "JobsSnapshot":
        """From a `jobs_payload()` document (or a replayed one with the same shape)."""
        pipelines = _dict(payload).get("pipelines")
        return cls(taken_at=taken_at, jobs=tuple(job_views(payload)),
                   pipelines=tuple(p for p in pipelines or [] if isinstance(p, dict)), **kwargs)

    def to_dict(self) -> dict:
        """JSON-able; `from_dict` gives the same snapshot back (a recording can store these)."""
        return {"taken_at": self.taken_at, "jobs": [job.payload for job in self.jobs],
                "engines": [dict(vars(e)) for e in self.engines], "log_paths": dict(self.log_paths),
                "pipelines": list(self.pipelines), "reason": self.reason, "error": self.error}

    @classmethod
    def from_dict(cls, data: dict) -> "JobsSnapshot":
        fields = set(EngineView.__dataclass_fields__)
        engines = tuple(EngineView(**{k: v for k, v in e.items() if k in fields})
                        for e in data.get("engines") or [] if isinstance(e, dict) and "name" in e)
        return cls.from_payload({"jobs": data.get("jobs") or [], "pipelines": data.get("pipelines") or []},
                                taken_at=float(data.get("taken_at") or 0.0), engines=engines,
                                log_paths={str(k): str(v) for k, v in _dict(data.get("log_paths")).items()},
                                reason=_str(data.get("reason")), error=_str(data.get("error")))
