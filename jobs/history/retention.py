"""Which runs to delete (`gpudeck runs --prune`): beyond the newest N of each job and/or older than an age; live runs never."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from gpudeck.jobs.history.index import RunIndex

LIVE_STATES = ("starting", "running", "stopping")


@dataclass(frozen=True)
class PruneCandidate:
    job: str
    run_id: str
    path: str
    started_at: Optional[float]
    state: str
    size_bytes: int
    why: str

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _dir_size(path: Path) -> int:
    total = 0
    try:
        for child in path.iterdir():
            try:
                total += child.stat().st_size
            except OSError:
                pass
    except OSError:
        pass
    return total


def plan_prune(index: RunIndex, *, keep: Optional[int] = None, older_s: Optional[float] = None,
               job: Optional[str] = None, keep_for: Callable[[str], Optional[int]] = lambda job: None,
               now: Optional[float] = None) -> list[PruneCandidate]:
    """Finished job runs to delete, oldest first.

    keep N: all but the newest N runs of each job (else each job's own log_keep via keep_for);
    older_s: only runs started longer ago than that. With both, a run must meet both.
    """
    now = time.time() if now is None else now
    rows = index.query(job=job, kinds=["job"], columns=("job", "run_id", "path", "started_at", "state"))
    by_job: dict[str, list[dict]] = {}
    for row in rows:                       # newest first
        by_job.setdefault(row["job"], []).append(row)
    out: list[PruneCandidate] = []
    for name, runs in by_job.items():
        limit = keep if keep is not None else keep_for(name)
        for position, row in enumerate(runs):
            if row["state"] in LIVE_STATES:
                continue
            reasons = []
            if limit is not None:
                if position < limit:
                    continue
                reasons.append(f"beyond the newest {limit}")
            if older_s is not None:
                started = row.get("started_at")
                if started is None or now - started <= older_s:
                    continue
                reasons.append(f"started {(now - started) / 86400:.1f} days ago")
            if not reasons:
                continue
            out.append(PruneCandidate(job=name, run_id=row["run_id"], path=row["path"],
                                      started_at=row.get("started_at"), state=row["state"],
                                      size_bytes=_dir_size(Path(row["path"])), why=", ".join(reasons)))
    out.sort(key=lambda c: (c.started_at or 0, c.run_id))
    return out


def prune(index: RunIndex, candidates: list[PruneCandidate]) -> list[PruneCandidate]:
    """Delete the candidates' run directories (re-checking that each is still not live) and their index rows."""
    from gpudeck.jobs.runs import Run
    removed = []
    for cand in candidates:
        path = Path(cand.path)
        if path.is_dir():
            if Run(path).state().state in LIVE_STATES:
                continue
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                continue
        removed.append(cand)
    index.remove_paths(Path(c.path) for c in removed)
    return removed
