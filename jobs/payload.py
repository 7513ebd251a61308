"""The JSON documents the faces read (`jobs --json`, the console's jobs table): built above the supervisor and pipelines."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from gpudeck.jobs.pipeline_records import Pipeline, list_pipelines
from gpudeck.jobs.supervisor import JobState, Supervisor


HealthReader = Callable[[Optional[Path]], dict]


def jobs_payload(supervisor: Supervisor, *, health: Optional[HealthReader] = None) -> dict:
    """The `jobs --json` document: {"jobs": [...], "pipelines": [...]}.

    Later features (phase, progress, alerts, serving) add keys to each job dict here.
    `health` reads a run directory's health fields (default `health.job_health`); a caller
    polling often (the exporter) passes a cached one so unchanged runs are not read again.
    """
    jobs = []
    for state in supervisor.job_states():
        data = state.to_jsonable()
        data.update(_health_fields(supervisor, state, health))
        if state.live:
            _engine_fields(supervisor, state, data)
        jobs.append(data)
    try:
        pipes = pipelines_payload(supervisor.state_dir)
    except Exception:           # a broken pipeline record must not hide the jobs
        pipes = []
    return {"jobs": jobs, "pipelines": pipes}


def pipelines_payload(state_dir: Optional[Path] = None) -> list[dict]:
    """The latest pipeline of each target, for `jobs --json` and the console."""
    latest: dict[str, Pipeline] = {}
    for p in list_pipelines(None, state_dir):
        latest[p.target] = p
    return [p.to_jsonable() for p in latest.values()]


def _engine_fields(supervisor: Supervisor, state: JobState, data: dict) -> None:
    """Engine jobs: phase `ready` only when the engine answers; serving from /metrics when it has them."""
    try:
        from gpudeck.jobs.engines.monitor import engine_fields
        fields = engine_fields(supervisor.spec(state.name), supervisor.latest(state.name))
    except Exception as exc:      # an engine probe must not hide the job
        data["engine_error"] = str(exc)
        return
    if fields is None:
        return
    data["engine_status"] = fields
    if fields["ready"]:
        data["phase"] = "ready"
    elif data.get("phase") == "ready":
        data["phase"] = "starting" if fields.get("ready_at") is None else "unresponsive"
    if fields["serving"] is not None:
        data["serving"] = fields["serving"]
    for alert in fields["alerts"]:
        if all(a.get("code") != alert["kind"] for a in data.get("alerts") or []):
            data.setdefault("alerts", []).append({
                "code": alert["kind"], "message": alert["detail"], "severity": "warning",
                "since": None, "job": state.name, "run_id": state.run_id})


def _health_fields(supervisor: Supervisor, state: JobState, health: Optional[HealthReader] = None) -> dict:
    """phase, progress, alerts (and failure, serving) of the job's latest run, from its health.json."""
    if health is None:
        from gpudeck.jobs.health import job_health
        health = job_health
    run = supervisor.latest(state.name) if state.run_id else None
    try:
        return health(run.path if run is not None else None)
    except Exception as exc:      # a corrupt run dir must not hide the job
        return {"phase": None, "progress": None, "alerts": [], "health_error": str(exc)}
