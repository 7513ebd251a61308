"""One engine job watched over time: phase (starting -> ready -> unhealthy), serving numbers, alerts.

Each `poll()` does blocking HTTP with short timeouts: call it from a worker thread,
never from the UI thread.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from gpudeck.jobs.engines.metrics import EngineAlert, Serving, ServingTracker, scrape
from gpudeck.jobs.engines.profiles import EngineSettings
from gpudeck.jobs.engines.readiness import LogLineWatcher, Readiness, check_readiness

if TYPE_CHECKING:
    from gpudeck.jobs.runs import Run
    from gpudeck.jobs.spec import JobSpec

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_MAX_READ = 4 << 20


@dataclass(frozen=True)
class EngineStatus:
    engine: str
    phase: str                       # "starting" | "ready" | "unhealthy"
    detail: str
    port: int
    model: Optional[str]
    serving: Optional[Serving]
    serving_source: Optional[str]    # "metrics" | "log" | None
    alerts: tuple[EngineAlert, ...] = ()
    ready_at: Optional[float] = None  # wall clock when it first became ready

    def to_dict(self) -> dict:
        return {"engine": self.engine, "phase": self.phase, "detail": self.detail, "port": self.port,
                "model": self.model, "ready_at": self.ready_at,
                "serving": self.serving.to_dict() if self.serving else None,
                "alerts": [{"kind": a.kind, "detail": a.detail} for a in self.alerts]}


@dataclass
class EngineMonitor:
    settings: EngineSettings
    log_path: Path
    wall: Callable[[], float] = time.time
    tracker: ServingTracker = field(init=False)
    _ready_watch: LogLineWatcher = field(init=False)
    _log_offset: int = 0
    _partial: str = ""
    ready_at: Optional[float] = None
    metrics_available: Optional[bool] = None     # None: not tried yet
    last: Optional[Readiness] = None

    def __post_init__(self) -> None:
        self.tracker = ServingTracker(self.settings.engine, wall=self.wall)
        self._ready_watch = LogLineWatcher(self.log_path, self.settings.profile.ready_lines)

    def poll(self) -> EngineStatus:
        state = check_readiness(self.settings, self._ready_watch)
        self.last = state
        if state.ready:
            if self.ready_at is None:
                self.ready_at = self.wall()
            phase, detail = "ready", state.detail
            self._collect_serving()
        elif self.ready_at is not None:
            # It was ready and no longer answers: the engine core died or hangs.
            phase, detail = "unhealthy", state.detail
        else:
            phase, detail = "starting", state.detail
        serving = self.tracker.latest
        return EngineStatus(
            engine=self.settings.engine, phase=phase, detail=detail, port=self.settings.port,
            model=self.settings.model, serving=serving,
            serving_source=serving.source if serving else None,
            alerts=tuple(self.tracker.alerts), ready_at=self.ready_at)

    def _collect_serving(self) -> None:
        if self.settings.metrics_path and self.metrics_available is not False:
            status, body = scrape(self.settings.url(self.settings.metrics_path))
            if status == 200:
                self.metrics_available = True
                try:
                    self.tracker.update_from_metrics(body)
                    return
                except Exception:
                    pass           # an unparseable body: treat like metrics off
            if status in (404, 405):
                # Metrics off (SGLang without --enable-metrics): the log's stats lines from now on.
                self.metrics_available = False
            # Any other failure: the log this time, /metrics again next time.
        self._follow_log()

    def _follow_log(self) -> None:
        try:
            size = os.path.getsize(self.log_path)
        except OSError:
            return
        if size < self._log_offset:
            self._log_offset, self._partial = 0, ""
        if self._log_offset == 0 and size > _MAX_READ:
            self._log_offset = size - _MAX_READ     # only recent stats matter
        if size == self._log_offset:
            return
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_offset)
            data = fh.read(min(size - self._log_offset, _MAX_READ))
        self._log_offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        parts = re.split(r"[\r\n]", text)
        self._partial = parts.pop()
        for line in parts:
            if line:
                self.tracker.update_from_log_line(_ANSI.sub("", line))


# --------------------------------------------------------------------------- one-shot (`jobs --json`)

ENGINE_STATE = "engine_state.json"


def engine_fields(spec: JobSpec, run: Optional[Run]) -> Optional[dict]:
    """Readiness and /metrics serving of a live engine job, for one-shot callers (`gpudeck jobs --json`).

    The previous scrape and the readiness scan position are kept in the run
    directory, so successive calls give counter rates and never rescan the log.
    """
    from gpudeck.jobs.engines.metrics import _Baseline
    from gpudeck.jobs.engines.profiles import engine_settings
    settings = engine_settings(spec)
    if settings is None or run is None:
        return None
    path = Path(run.path) / ENGINE_STATE
    from gpudeck.jobs import strictjson
    saved = strictjson.load_object(path) or {}
    watcher = LogLineWatcher(run.log_path, settings.profile.ready_lines)
    offset = saved.get("offset")
    watcher.offset = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 else 0
    if saved.get("log_ready"):
        watcher.seen = settings.profile.ready_lines[0]
    state = check_readiness(settings, watcher)
    saved.update(offset=watcher.offset, log_ready=watcher.seen is not None)
    serving = None
    alerts: list[EngineAlert] = []
    if state.ready:
        saved.setdefault("ready_at", time.time())
        if settings.metrics_path:
            status, body = scrape(settings.url(settings.metrics_path))
            if status == 200:
                try:
                    tracker = ServingTracker(settings.engine, clock=time.time)
                    prev = saved.get("prev")
                    if prev:
                        tracker._prev = _Baseline(prev["t"], prev["values"])
                        first = saved.get("first") or prev
                        tracker._first = _Baseline(first["t"], first["values"])
                    serving = tracker.update_from_metrics(body)
                    alerts = tracker.alerts
                    baseline = tracker._prev
                    assert baseline is not None           # update_from_metrics() sets it
                    saved["prev"] = {"t": baseline.at, "values": baseline.values}
                    saved.setdefault("first", saved["prev"])
                except Exception:
                    serving = None
    try:
        from gpudeck.jobs.runs import write_json_atomic
        write_json_atomic(path, saved)
    except (OSError, ValueError):
        pass
    return {"ready": state.ready, "readiness": state.detail, "port": settings.port,
            "ready_at": saved.get("ready_at"), "metrics": serving is not None,
            "serving": serving.to_dict() if serving else None,
            "alerts": [{"kind": a.kind, "detail": a.detail} for a in alerts]}
