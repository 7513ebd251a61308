"""Pipeline records: the directories a pipeline leaves under <state_dir>/pipelines, read back (state, stages, events).

Below the runner and the supervisor, so that anything (history, the faces) can read a pipeline's
record without importing what runs pipelines.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gpudeck.jobs import paths
from gpudeck.jobs.procs import ProcessId, is_alive
from gpudeck.jobs.runs import append_jsonl, read_json, read_jsonl

META = "meta.json"
EVENTS = "events.jsonl"
RESULT = "result.json"

def pipelines_root(state_dir: Optional[Path] = None) -> Path:
    return (state_dir or paths.state_dir()) / "pipelines"


@dataclass
class Pipeline:
    """One pipeline directory; all state is read from its files."""

    path: Path

    @property
    def pipeline_id(self) -> str:
        return self.path.name

    @property
    def target(self) -> str:
        return self.path.parent.name

    def meta(self) -> dict:
        return read_json(self.path / META) or {}

    def events(self) -> list[dict]:
        return read_jsonl(self.path / EVENTS)

    def result(self) -> Optional[dict]:
        return read_json(self.path / RESULT)

    def add_event(self, event: str, **fields: Any) -> None:
        append_jsonl(self.path / EVENTS, {"t": round(time.time(), 3), "event": event, **fields})

    def process(self) -> Optional[ProcessId]:
        return ProcessId.from_jsonable(self.meta().get("process"))

    def state(self) -> str:
        """running | succeeded | failed | stopped | lost (process gone without a result)."""
        result = self.result()
        if result is not None:
            if result.get("ok"):
                return "succeeded"
            return "stopped" if result.get("stopped") else "failed"
        proc = self.process()
        if proc is None:
            created = float(self.meta().get("created_at") or 0)
            return "running" if time.time() - created < 15 else "lost"
        return "running" if is_alive(proc.pid, proc.start) else "lost"

    def to_jsonable(self) -> dict:
        meta = self.meta()
        stages = {name: {"name": name, "status": "pending", "run_id": None, "exit_code": None}
                  for name in meta.get("stages", [])}
        current = None
        for ev in self.events():
            stage = stages.get(ev.get("stage"))
            if stage is None:
                continue
            kind = ev.get("event")
            if kind == "StageSkipped":
                stage["status"] = "skipped"
            elif kind == "StageStarted":
                stage.update(status="running", run_id=ev.get("run_id"))
                current = ev.get("stage")
            elif kind == "StageQueued":         # handed to Slurm, which starts it when its needs succeeded
                stage.update(status="queued", run_id=ev.get("run_id"), slurm_job_id=ev.get("slurm_job_id"))
            elif kind == "StageFinished":
                stage.update(status="succeeded" if ev.get("ok") else "failed",
                             exit_code=ev.get("exit_code"), run_id=ev.get("run_id") or stage["run_id"])
        result = self.result() or {}
        state = self.state()
        return {
            "id": self.pipeline_id, "target": self.target, "state": state,
            "stages": list(stages.values()), "current": current if state == "running" else None,
            "failed_stage": result.get("failed_stage"), "started_at": meta.get("created_at"),
            "ended_at": result.get("ended_at"),
        }


def list_pipelines(target: Optional[str] = None, state_dir: Optional[Path] = None) -> list[Pipeline]:
    """Pipelines (of one target, or all), oldest first."""
    root = pipelines_root(state_dir)
    targets = [target] if target else (sorted(os.listdir(root)) if root.is_dir() else [])
    found: list[Pipeline] = []
    for name in targets:
        d = root / name
        if d.is_dir():
            found.extend(Pipeline(d / p) for p in sorted(os.listdir(d)) if (d / p).is_dir())
    return sorted(found, key=lambda p: p.pipeline_id)


def latest_pipeline(target: str, state_dir: Optional[Path] = None) -> Optional[Pipeline]:
    found = list_pipelines(target, state_dir)
    return found[-1] if found else None
