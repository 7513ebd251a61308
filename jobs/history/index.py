"""The run index: one SQLite row per run (job runs, pipelines, pivots), rebuilt from the run directories, which stay the source of truth.

Stdlib only (sqlite3): the runner indexes its own run at the end, and every reader
(`gpudeck runs`, the console, `postmortem`) brings the index up to date lazily
before it answers: new run directories are added, live ones re-read, deleted
ones dropped. A missing file is created (0600, never through a symlink); only a file SQLite
proves broken (not a database, malformed, another schema version or other tables) is replaced,
the old one kept beside it with a timestamp. A lock is waited for (BUSY_TIMEOUT_MS) and then
reported, a full disk is reported: neither is ever a reason to rebuild.
A run on a remote host or under Slurm is still a run: `host` and `backend` say where.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import re
import shlex
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Callable, Concatenate, Iterable, Iterator, Optional, ParamSpec, TypeVar

from gpudeck.jobs import paths, runs, strictjson
from gpudeck.jobs.strictjson import integer, number

DB_NAME = "history.sqlite3"
SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 10_000
# Events still arrive on an ended run for a while (a pivot records its later steps on the
# runs it stopped): rows of runs that ended this recently are re-checked when their events grow.
RECHECK_ENDED_S = 2 * 3600
DELETED = "deleted"                # the state of a row whose run directory is gone

_RUN_ID = re.compile(r"^\d{8}-\d{6}-\d{3}[0-9a-f]{2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

COLUMNS = (
    ("key", "TEXT PRIMARY KEY"),      # job/<job>/<run_id> | pipeline/<target>/<id> | pivot/<target>/<run_id>
    ("kind", "TEXT"),                 # job | pipeline | pivot
    ("job", "TEXT"),                  # the job; a pipeline's or pivot's target
    ("run_id", "TEXT"),
    ("path", "TEXT"),
    ("host", "TEXT"),
    ("backend", "TEXT"),              # local | ssh | slurm | ...
    ("job_kind", "TEXT"),             # engine | build | train | stage
    ("engine", "TEXT"),
    ("command", "TEXT"),
    ("gpus", "TEXT"),                 # JSON list
    ("started_at", "REAL"),
    ("ended_at", "REAL"),
    ("duration_s", "REAL"),
    ("state", "TEXT"),                # running | exited | stopped | lost | succeeded | failed ...
    ("exit_code", "INTEGER"),
    ("signal", "TEXT"),
    ("stopped_by", "TEXT"),           # who asked for the stop (the operator, runner, pivot to X, pipeline ...)
    ("final_phase", "TEXT"),
    ("failed", "INTEGER"),
    ("failure_cause", "TEXT"),
    ("failure_line", "INTEGER"),
    ("failure_message", "TEXT"),
    ("failure_hint", "TEXT"),
    ("phases", "TEXT"),               # JSON {phase: seconds}
    ("load_s", "REAL"),               # seconds from start to ready (engines)
    ("peak_gpu_mem", "TEXT"),         # JSON {gpu: bytes}
    ("peak_gpu_mem_max", "REAL"),     # the largest of peak_gpu_mem (listings read this, not the JSON)
    ("gpu_count", "INTEGER"),         # how many GPUs peak_gpu_mem covers
    ("peak_rss", "INTEGER"),
    ("alerts", "TEXT"),               # JSON list of alert codes raised
    ("pipeline", "TEXT"),             # the pipeline id this run was a stage of
    ("pivot", "TEXT"),                # pivot context ("started by pivot", "stopped by pivot to X")
    ("detail", "TEXT"),               # JSON: kind-specific extras (pipeline stages, pivot steps)
    ("final", "INTEGER"),             # 1: the run ended; its row is not re-read (except RECHECK_ENDED_S)
    ("events_size", "INTEGER"),
    ("indexed_at", "REAL"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
JSON_COLUMNS = ("gpus", "phases", "peak_gpu_mem", "alerts", "detail")


def db_path(state_dir: Optional[Path] = None) -> Path:
    return (state_dir or paths.state_dir()) / DB_NAME



# --------------------------------------------------------------------------- reading one run's files

# A run's files are read as the runs module reads them, through the strict, bounded loader
# (strictjson): a non-finite number an older runner wrote (Infinity, NaN) reads as null, so no
# index row or report can carry one into strict JSON; a file nested 100,000 deep, a 2 GB one, a
# symlink or a FIFO costs its run a note (detail.notes), never the index or the other runs.
read_json = runs.read_json
read_jsonl = runs.read_jsonl


_int = integer              # the one strict number rule (strictjson): an int within 64 bits


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def stopper(value: Any) -> str:
    """Who asked for a stop, in words: a row indexed before the operator was named says "supervisor"."""
    return "the operator" if value == "supervisor" else str(value)


def _stopped_by(events: list[dict], exit_record: Optional[dict]) -> Optional[str]:
    if not exit_record or not exit_record.get("stopped_by_request"):
        return None
    who = None
    for ev in events:
        if ev.get("event") == "StopRequested" and who is None:
            # The supervisor is how a stop is carried out, not who wanted it: that is the operator (gpudeck
            # stop/restart, the console, --host), unless a pivot or a pipeline asked (below).
            who = "the operator" if ev.get("by") == "supervisor" else str(ev.get("by") or "request")
            if ev.get("reason"):
                who += f" ({ev['reason']})"
        if ev.get("event") == "PivotRequested":
            return f"pivot to {ev.get('target')}"
        if ev.get("event") == "StageStopRequested":
            return "pipeline"
    return who or "request"


def _pivot_context(events: list[dict]) -> tuple[Optional[str], Optional[dict]]:
    """(the run's pivot context, a pivot record when this run carries one)."""
    started = next((e for e in events if e.get("event") == "PivotStarted"), None)
    requested = next((e for e in events if e.get("event") == "PivotRequested"), None)
    failed = next((e for e in events if e.get("event") == "PivotFailed"), None)
    completed = next((e for e in events if e.get("event") == "PivotCompleted"), None)
    steps = [{"step": e.get("step"), "ok": e.get("ok"), "duration_s": e.get("duration_s"),
              "detail": e.get("detail")}
             for e in events if e.get("event") in ("PivotStepCompleted", "PivotStepFailed")]
    if started is not None:
        stopped = [s.get("job") or f"PID {s.get('pid')}" for s in started.get("stopped") or [] if isinstance(s, dict)]
        context = "started by pivot" + (f" (stopped {', '.join(map(str, stopped))})" if stopped else "")
        return context, {"target": started.get("target"), "t": started.get("t"), "stopped": stopped,
                         "steps": steps, "ok": completed is not None and failed is None,
                         "message": (failed or {}).get("message"),
                         "ended_at": (completed or failed or {}).get("t"),
                         "duration_s": (completed or {}).get("duration_s")}
    if requested is not None:
        context = f"stopped by pivot to {requested.get('target')}"
        if failed is not None and not any(str(s.get("step") or "").startswith("start ") and s.get("ok")
                                          for s in steps):
            # The pivot failed before it started its target: this run is the only place it is recorded.
            return context, {"target": requested.get("target"), "t": requested.get("t"), "stopped": [],
                             "steps": steps, "ok": False, "message": failed.get("message"),
                             "ended_at": failed.get("t"), "duration_s": None}
        return context, None
    return None, None


def summarize_run(run_dir: Path, now: Optional[float] = None) -> list[dict]:
    """The index rows of one run directory: its own, plus a pivot row when it records a pivot."""
    from gpudeck.jobs.history.recorder import read_summary
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    notes: list[str] = []
    meta = read_json(run_dir / "meta.json", notes) or {}
    exit_record = read_json(run_dir / "exit.json", notes)
    health = read_json(run_dir / "health.json", notes) or {}
    summary = read_summary(run_dir, notes) or {}
    events_path = run_dir / "events.jsonl"
    events = read_jsonl(events_path, notes)
    analysis = summary.get("analysis") if isinstance(summary.get("analysis"), dict) else {}
    if not analysis:
        analysis = health
    job, run_id = run_dir.parent.name, run_dir.name
    backend = _text(meta.get("backend")) or _text((exit_record or {}).get("backend")) or "local"
    started = number(meta.get("started_at")) or number(meta.get("created_at"))
    slurm_started = number((exit_record or {}).get("started_at"))
    if backend == "slurm" and slurm_started is not None:
        started = slurm_started                          # when Slurm ran it, not when it was queued
    ended = number((exit_record or {}).get("ended_at"))
    state = _run_state(run_dir, meta, exit_record, events)
    code = _int((exit_record or {}).get("exit_code"))
    sig = _text((exit_record or {}).get("signal"))
    stopped_by = _stopped_by(events, exit_record)
    failure = analysis.get("failure") if isinstance(analysis.get("failure"), dict) else None
    alerts_raised = []
    for ev in events:
        if ev.get("event") == "AlertRaised" and isinstance(ev.get("code"), str) and ev["code"] not in alerts_raised:
            alerts_raised.append(ev["code"])
    for alert in health.get("history") or []:
        if isinstance(alert, dict) and isinstance(alert.get("code"), str) and alert["code"] not in alerts_raised:
            alerts_raised.append(alert["code"])
    failed = _is_failed(state, code, sig, stopped_by, failure, alerts_raised)
    slurm_state = _text((exit_record or {}).get("slurm_state"))
    if slurm_state and slurm_state not in ("COMPLETED", "CANCELLED") and not stopped_by:
        failed = True          # TIMEOUT, OUT_OF_MEMORY, NODE_FAIL...: Slurm ended it, whatever the exit code
    # The job never ran: sbatch refused it (no exit code at all) or its exec failed.
    launch_error = launch_error_of(state, exit_record, stopped_by)
    if launch_error:
        failed = True
        if failure is None:
            failure = {"cause": "not_submitted" if (exit_record or {}).get("not_submitted") else "failed_to_start",
                       "message": launch_error}
    phases_list = [p for p in summary.get("phases") or [] if isinstance(p, dict)]
    from gpudeck.jobs.history.phases import phase_durations
    phases = phase_durations(phases_list, started, ended or (now if state in ("running", "stopping") else None))
    load_s = None
    ready_at = next((number(p.get("t")) for p in phases_list if p.get("phase") == "ready"), None)
    if ready_at is not None and started is not None:
        load_s = round(max(0.0, ready_at - started), 3)
    summary_peaks = summary.get("peaks")
    peaks: dict = summary_peaks if isinstance(summary_peaks, dict) else {}
    command = meta.get("command")
    if isinstance(command, list):
        command = shlex.join(str(c) for c in command)     # as the shell would read it: an argument keeps its spaces
    meta_spec = meta.get("spec")
    spec: dict = meta_spec if isinstance(meta_spec, dict) else {}
    peak_gpu_mem = ({str(k): v for k, v in (peaks.get("gpu_mem") or {}).items()}
                    if isinstance(peaks.get("gpu_mem"), dict) else {})
    pivot_context, pivot_record = _pivot_context(events)
    row = {
        "key": f"job/{job}/{run_id}", "kind": "job", "job": job, "run_id": run_id, "path": str(run_dir),
        # A Slurm job ran on its allocated node(s), not on the host that submitted it.
        "host": (_text((exit_record or {}).get("nodes")) if backend == "slurm" else None)
        or _text(meta.get("host")) or _text(meta.get("runner_host")),
        "backend": backend,
        "job_kind": _text(meta.get("kind")) or _text(spec.get("kind")),
        "engine": _text(analysis.get("engine")) or _text(spec.get("engine")),
        "command": command if isinstance(command, str) else None,
        "gpus": [g for g in meta.get("gpus") or [] if isinstance(g, int)] if isinstance(meta.get("gpus"), list) else [],
        "started_at": started, "ended_at": ended,
        "duration_s": round(ended - started, 3) if ended is not None and started is not None else None,
        "state": state, "exit_code": code, "signal": sig, "stopped_by": stopped_by,
        "final_phase": _text(analysis.get("phase")),
        "failed": 1 if failed else 0,
        "failure_cause": _text((failure or {}).get("cause")) or (_lost_or_signal_cause(state, sig, exit_record)
                                                                  if failed else None),
        "failure_line": _int((failure or {}).get("line")),
        "failure_message": _text((failure or {}).get("message")) or (_text((exit_record or {}).get("note"))
                                                                      if failed else None),
        "failure_hint": _text((failure or {}).get("hint")),
        "phases": phases, "load_s": load_s,
        "peak_gpu_mem": peak_gpu_mem,
        "peak_rss": int(peaks["rss"]) if number(peaks.get("rss")) is not None else None,
        "peak_gpu_mem_max": None, "gpu_count": None,
        "alerts": alerts_raised,
        "pipeline": _text(meta.get("pipeline")),
        "pivot": pivot_context,
        "detail": {"notes": [f"run {run_id}: {n}" for n in notes]} if notes else {},
        "final": 1 if exit_record is not None else 0,
        "events_size": file_size(events_path),
        "indexed_at": now,
    }
    gpu_peaks = [v for v in peak_gpu_mem.values() if number(v) is not None]
    if gpu_peaks:
        row["peak_gpu_mem_max"], row["gpu_count"] = max(gpu_peaks), len(gpu_peaks)
    rows = [row]
    if pivot_record is not None:
        target = str(pivot_record.get("target") or job)
        p_start = number(pivot_record.get("t"))
        p_end = number(pivot_record.get("ended_at"))
        ok = bool(pivot_record.get("ok"))
        rows.append({
            **{name: None for name in COLUMN_NAMES},
            "key": f"pivot/{target}/{run_id}", "kind": "pivot", "job": target, "run_id": run_id,
            "path": str(run_dir), "host": row["host"], "backend": row["backend"],
            "command": f"pivot to {target}" + (f" (stopped {', '.join(pivot_record['stopped'])})"
                                               if pivot_record.get("stopped") else ""),
            "gpus": row["gpus"], "started_at": p_start, "ended_at": p_end,
            "duration_s": number(pivot_record.get("duration_s")) or (
                round(p_end - p_start, 3) if p_end is not None and p_start is not None else None),
            "state": "succeeded" if ok else ("failed" if p_end is not None else "running"),
            "failed": 0 if ok or p_end is None else 1,
            "failure_message": _text(pivot_record.get("message")),
            "failure_cause": "pivot_failed" if not ok and p_end is not None else None,
            "phases": {}, "peak_gpu_mem": {}, "alerts": [],
            "detail": {"steps": pivot_record.get("steps") or []},
            "final": 1 if p_end is not None else 0, "events_size": row["events_size"], "indexed_at": now,
        })
    return rows


def rows_of(run_dirs: Iterable[Path], *, job: Optional[str] = None, failed: bool = False,
            now: Optional[float] = None) -> list[dict]:
    """The job rows of these run directories read from the directories themselves, no database, newest
    first like RunIndex.query: for runs no state dir holds (the recordings `gpudeck --demo` plays)."""
    rows = [row for d in run_dirs for row in summarize_run(d, now) if row.get("kind") == "job"]
    rows = [r for r in rows if (not job or r.get("job") == job) and (not failed or r.get("failed"))]
    # started_at DESC, run_id DESC as the query's ORDER BY, a run without a start last (SQLite's NULL)
    rows.sort(key=lambda r: (number(r.get("started_at")) or float("-inf"), str(r.get("run_id") or "")), reverse=True)
    return rows


def unreadable_row(kind: str, path: Path, now: float, why: str) -> dict:
    """The row of a run directory whose files could not be summarized: its name, where, and why."""
    path = Path(path)
    return {**{name: None for name in COLUMN_NAMES},
            "key": f"{kind}/{path.parent.name}/{path.name}", "kind": kind, "job": path.parent.name,
            "run_id": path.name, "path": str(path), "state": "unreadable", "failed": 0,
            "failure_message": why[:300], "phases": {}, "peak_gpu_mem": {}, "alerts": [], "gpus": [],
            "detail": {"notes": [f"run {path.name}: unreadable: {why[:300]}"]}, "final": 0,
            "events_size": 0, "indexed_at": now}


def _lost_or_signal_cause(state: str, sig: Optional[str], exit_record: Optional[dict]) -> Optional[str]:
    if state == "lost":
        return "lost"
    slurm_state = _text((exit_record or {}).get("slurm_state"))
    if slurm_state and slurm_state not in ("COMPLETED", "FAILED"):
        return f"slurm_{slurm_state.lower()}"       # TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED...
    if sig:
        return f"killed by {sig}"
    return None


def launch_error_of(state: str, exit_record: Optional[dict], stopped_by: Optional[str]) -> Optional[str]:
    """Why the job never ran (sbatch refused it, or its exec failed), or None: it ran, or was stopped."""
    return _text((exit_record or {}).get("error")) if state == "exited" and not stopped_by else None


def _is_failed(state: str, code: Optional[int], sig: Optional[str], stopped_by: Optional[str],
               failure: Optional[dict], alerts: list[str]) -> bool:
    if state == "lost":
        return True
    if state not in ("exited", "stopped"):
        return False
    if stopped_by:
        return False          # asked for: a stop is not a failure, whatever the exit code
    return bool((code is not None and code != 0) or sig or (failure and "crashed" in alerts))


def _run_state(run_dir: Path, meta: dict, exit_record: Optional[dict], events: list[dict]) -> str:
    if exit_record is not None:
        return "stopped" if exit_record.get("stopped_by_request") else "exited"
    try:
        from gpudeck.jobs.runs import Run
        return Run(run_dir).state().state
    except Exception:           # a run dir the rest of the core cannot read is lost, not a crash here
        return "lost"


def summarize_pipeline(pipe_dir: Path, now: Optional[float] = None) -> dict:
    now = time.time() if now is None else now
    notes: list[str] = []
    meta = read_json(pipe_dir / "meta.json", notes) or {}
    result = read_json(pipe_dir / "result.json", notes)
    events = read_jsonl(pipe_dir / "events.jsonl", notes)
    stages = [s for s in meta.get("stages") or [] if isinstance(s, str)]
    stage_runs: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.get("event") in ("StageStarted", "StageFinished", "StageSkipped") and isinstance(ev.get("stage"), str):
            entry = stage_runs.setdefault(ev["stage"], {"stage": ev["stage"]})
            if ev.get("run_id"):
                entry["run_id"] = ev["run_id"]
            if ev.get("event") == "StageSkipped":
                entry["status"] = "skipped"
            elif ev.get("event") == "StageFinished":
                entry["status"] = "succeeded" if ev.get("ok") else "failed"
                entry["exit_code"] = ev.get("exit_code")
            else:
                entry.setdefault("status", "running")
    started = number(meta.get("created_at"))
    ended = number((result or {}).get("ended_at"))
    if result is None:
        state = "running"
        try:
            from gpudeck.jobs.pipeline_records import Pipeline
            state = Pipeline(pipe_dir).state()
        except Exception:
            pass
    elif result.get("ok"):
        state = "succeeded"
    else:
        state = "stopped" if result.get("stopped") else "failed"
    failed_stage = _text((result or {}).get("failed_stage"))
    return {
        **{name: None for name in COLUMN_NAMES},
        "key": f"pipeline/{pipe_dir.parent.name}/{pipe_dir.name}", "kind": "pipeline",
        "job": pipe_dir.parent.name, "run_id": pipe_dir.name, "path": str(pipe_dir), "backend": "local",
        "command": " → ".join(stages), "started_at": started, "ended_at": ended,
        "duration_s": round(ended - started, 3) if ended is not None and started is not None else None,
        "state": state, "exit_code": _int((result or {}).get("exit_code")), "signal": _text((result or {}).get("signal")),
        "stopped_by": "request" if (result or {}).get("stopped") else None,
        "failed": 1 if state in ("failed", "lost") else 0,
        "failure_cause": f"stage {failed_stage} failed" if failed_stage and state == "failed" else
        ("lost" if state == "lost" else None),
        "failure_message": _text((result or {}).get("error")),
        "phases": {}, "peak_gpu_mem": {}, "alerts": [], "gpus": [],
        "detail": {"stages": [stage_runs.get(s, {"stage": s, "status": "pending"}) for s in stages],
                   **({"notes": [f"pipeline {pipe_dir.name}: {n}" for n in notes]} if notes else {})},
        "final": 1 if result is not None else 0, "events_size": file_size(pipe_dir / "events.jsonl"),
        "indexed_at": now,
    }


# --------------------------------------------------------------------------- the database

def _encode(row: dict) -> tuple:
    out = []
    for name in COLUMN_NAMES:
        value = row.get(name)
        if name in JSON_COLUMNS:
            value = json.dumps(value if value is not None else ([] if name in ("gpus", "alerts") else {}),
                               separators=(",", ":"), default=str)
        out.append(value)
    return tuple(out)


_EMPTY_JSON = {"[]": list, "{}": dict}


def decode_row(values: Iterable[Any], names: Iterable[str] = COLUMN_NAMES,
               json_names: Iterable[str] = JSON_COLUMNS) -> dict:
    """A row as a dict, its JSON columns decoded (`json_names`: those of `names` that are JSON, when the caller knows)."""
    row = dict(zip(names, values))
    for name in json_names:
        value = row.get(name)
        if isinstance(value, str):
            empty = _EMPTY_JSON.get(value)
            try:
                # strictjson.parse: a tampered database's column nested 100,000 deep is None, not a RecursionError.
                row[name] = empty() if empty is not None else strictjson.parse(value)
            except ValueError:
                row[name] = None
    if "failed" in row:
        row["failed"] = bool(row["failed"])
    if "final" in row:
        row["final"] = bool(row["final"])
    return row


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE .. COMMIT, or nothing more inside one already open (`rebuild` wraps `sync` in one)."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise
    conn.execute("COMMIT")


class IndexUnavailable(sqlite3.Error):
    """The index cannot be used right now and must not be rebuilt: locked, disk full, a symlink, not ours.
    The message is one line (the file and why); the file is left as it is."""


class _ReplacedWhileOpened(IndexUnavailable):
    """Another process moved a broken file aside and put a new one in its place between our check and
    our connect: the new file is the one to open, so the caller retries."""


class IndexLocked(IndexUnavailable):
    """Another process held the index's lock past the busy timeout."""


# SQLite's primary result codes (the low byte of an extended code) that decide what open() does.
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 3, 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26


def _code(exc: BaseException) -> Optional[int]:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _no_space(path: Path) -> bool:
    """The filesystem of `path` has (about) no room left: SQLite says "disk I/O error" when growing
    its -shm fails on a full disk, "database or disk is full" only when a write does."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _unavailable(exc: BaseException, path: Path, busy_s: float) -> Optional[IndexUnavailable]:
    """The IndexUnavailable an sqlite3/OS error means, or None when it may mean a broken file."""
    code = _code(exc)
    text = str(exc)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or (code is None and "locked" in text):
        return IndexLocked(f"index {path} locked by another process (waited {busy_s:g} s)")
    if (code == _SQLITE_FULL or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))
            or (code is None and "disk is full" in text) or (code == _SQLITE_IOERR and _no_space(path))):
        return IndexUnavailable(f"index {path}: the disk is full ({text}); nothing was rebuilt")
    if code in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CANTOPEN) or isinstance(exc, OSError):
        return IndexUnavailable(f"index {path}: {text}")
    return None


class SchemaMismatch(sqlite3.DatabaseError):
    """A database whose tables or columns are not the index's: proven wrong, rebuilt from the run dirs."""


# The tables and columns open() insists on: a file with the right user_version but other tables
# is not the index ("no such table: dirs" on every `runs`), so it is rebuilt like a corrupt one.
SCHEMA = {"runs": COLUMN_NAMES, "dirs": ("path", "mtime_ns")}


def _check_schema(conn: sqlite3.Connection) -> None:
    for table, wanted in SCHEMA.items():
        have = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
        if not have:
            raise SchemaMismatch(f"no table {table}")
        if set(have) != set(wanted):
            missing = sorted(set(wanted) - set(have))
            extra = sorted(set(have) - set(wanted))
            raise SchemaMismatch(f"table {table} has other columns (missing {', '.join(missing) or '-'}; "
                                 f"extra {', '.join(extra) or '-'})")


def _proven_corrupt(exc: sqlite3.DatabaseError, path: Path) -> bool:
    """True only when SQLite itself says the file is not (or no longer) a sound database of ours."""
    if isinstance(exc, SchemaMismatch):
        return True
    code = _code(exc)
    if code == _SQLITE_NOTADB:
        return True                      # "file is not a database": nothing to check it with
    if code != _SQLITE_CORRUPT:
        return False
    # "malformed": confirmed by quick_check on a fresh connection, read-only (it may fail in turn: proven).
    try:
        probe = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return True
    try:
        return probe.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as again:
        return _code(again) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    finally:
        probe.close()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _guarded(method: Callable[Concatenate[RunIndex, _P], _R]) -> Callable[Concatenate[RunIndex, _P], _R]:
    """An index method whose lock wait, full disk or I/O error comes out as IndexUnavailable (one line)."""
    @functools.wraps(method)
    def wrapper(self: RunIndex, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except IndexUnavailable:
            raise
        except (sqlite3.Error, OSError) as exc:
            mapped = _unavailable(exc, self.path, self.busy_timeout_s)
            if mapped is None:
                raise
            raise mapped from exc
    return wrapper


class RunIndex:
    """The SQLite index of every run under one state dir."""

    def __init__(self, state_dir: Optional[Path] = None, busy_timeout_s: Optional[float] = None) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else paths.state_dir()
        self.path = db_path(self.state_dir)
        self.busy_timeout_s = BUSY_TIMEOUT_MS / 1000 if busy_timeout_s is None else busy_timeout_s
        self.rebuilt_reason: Optional[str] = None      # set when open() had to rebuild the file
        self.kept_as: Optional[Path] = None            # where the replaced file was moved aside
        self._ident: Optional[tuple[int, int]] = None  # (st_dev, st_ino) of the file last connected to
        self._conn: Optional[sqlite3.Connection] = None

    # -- opening ----------------------------------------------------------------
    def _check_file(self) -> os.stat_result:
        """The database file, created 0600 if missing, never through a symlink: its (lstat) identity.

        SQLite opens files by name and follows links, so the file and its -wal/-shm are checked
        here (O_NOFOLLOW, a regular file, ours, 0600) and the file SQLite opened is compared after.
        """
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            try:
                st = os.lstat(side)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise IndexUnavailable(f"index {side} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a regular file'}:"
                                       " refusing to use it (remove it; the index is rebuilt from the run directories)")
        from gpudeck.jobs.runs import open_private
        try:
            try:
                # Created 0600 before SQLite opens it: its -wal and -shm files take the same mode.
                fd = open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # A read-only file or filesystem: still checked, and SQLite may read it (queries work).
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise IndexUnavailable(f"index {self.path} is a symlink: refusing to write through it "
                                       "(remove it; the index is rebuilt from the run directories)") from None
            mapped = _unavailable(exc, self.path, self.busy_timeout_s)
            raise (mapped or IndexUnavailable(f"index {self.path}: {exc.strerror or exc}")) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IndexUnavailable(f"index {self.path} is not a regular file: refusing to use it")
            if st.st_uid != os.geteuid():
                raise IndexUnavailable(f"index {self.path} is owned by uid {st.st_uid}, not by you: refusing to use it")
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)     # an index an older gpudeck rebuilt 0644
                for suffix in ("-wal", "-shm"):
                    try:
                        os.chmod(str(self.path) + suffix, 0o600, follow_symlinks=False)
                    except (OSError, NotImplementedError):
                        pass
            return st
        finally:
            os.close(fd)

    def _connect(self) -> sqlite3.Connection:
        st = self._check_file()
        # The file this connection reads: if it proves broken, only that file may be moved aside
        # (another process may have put a sound new one in its place meanwhile).
        self._ident = (st.st_dev, st.st_ino)
        conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None)
        try:
            try:
                now = os.lstat(self.path)
            except FileNotFoundError:
                # Another process moved the broken file aside between our check and our connect.
                raise _ReplacedWhileOpened(f"index {self.path} was moved away while it was opened") from None
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise _ReplacedWhileOpened(f"index {self.path} was replaced while it was opened: refusing to use it")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise SchemaMismatch(f"schema version {version}, expected {SCHEMA_VERSION}")
            if version == 0:
                cols = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
                with _transaction(conn):
                    conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
                    conn.execute("CREATE INDEX IF NOT EXISTS runs_started ON runs(started_at)")
                    conn.execute("CREATE INDEX IF NOT EXISTS runs_job_started ON runs(job, started_at)")
                    conn.execute("CREATE INDEX IF NOT EXISTS runs_pending ON runs(final, ended_at)")
                    # A job directory's mtime changes when a run directory is created or deleted in it:
                    # an unchanged one with no live run needs no listing.
                    conn.execute("CREATE TABLE IF NOT EXISTS dirs (path TEXT PRIMARY KEY, mtime_ns INTEGER)")
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            _check_schema(conn)
            # Touch the table: a file that is not a database (or a broken one) fails here, not later.
            conn.execute("SELECT count(*) FROM runs WHERE key = ''").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    @_guarded
    def open(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        from gpudeck.jobs.runs import state_root
        state_root(self.state_dir)             # created 0700, refused if not ours
        try:
            self._conn = self._connect_settled()
        except IndexUnavailable:
            raise
        except sqlite3.DatabaseError as exc:
            # Only a file SQLite proves broken (not a database, malformed, other tables) is replaced:
            # a lock, a full disk or an I/O error is reported and the file left alone.
            if _unavailable(exc, self.path, self.busy_timeout_s) is not None or not _proven_corrupt(exc, self.path):
                raise
            return self._replace(exc)
        return self._conn

    def _connect_settled(self, attempts: int = 5) -> sqlite3.Connection:
        """_connect, again when another process replaced the file under it (its replacement is sound:
        a replacer holds the lock and moves a file aside only once); a file that keeps changing is refused."""
        for _ in range(attempts - 1):
            try:
                return self._connect()
            except _ReplacedWhileOpened:
                time.sleep(0.05)
        return self._connect()

    def _replace(self, exc: BaseException) -> sqlite3.Connection:
        """Move the broken file aside (kept, timestamped) and start a new one, one process at a time:
        the connection to it, which is self._conn from now on."""
        from gpudeck.jobs.runs import open_private
        broken = self._ident
        lock_fd = open_private(Path(str(self.path) + ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                current = os.lstat(self.path)
            except FileNotFoundError:
                current = None
            if broken is not None and current is not None and (current.st_dev, current.st_ino) == broken:
                self.kept_as = self._move_aside()
            # else: another process replaced it while we waited for the lock: its new file is used.
            self._conn = conn = self._connect_settled()
        finally:
            os.close(lock_fd)
        kept = f"; the old file is kept as {self.kept_as.name}" if self.kept_as else ""
        self.rebuilt_reason = f"index {self.path} unusable ({exc}); rebuilt from the run directories{kept}"
        return conn

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = Path(f"{self.path}.corrupt-{stamp}")
        n = 1
        while os.path.lexists(aside):
            aside = Path(f"{self.path}.corrupt-{stamp}.{n}")
            n += 1
        os.rename(self.path, aside)
        # The WAL holds the file's last commits: it goes with it. The -shm is only a cache of the WAL.
        try:
            os.rename(f"{self.path}-wal", f"{aside}-wal")
        except FileNotFoundError:
            pass
        try:
            os.unlink(f"{self.path}-shm")
        except FileNotFoundError:
            pass
        return aside

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "RunIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------
    @_guarded
    def upsert(self, rows: Iterable[dict], delete_keys: Iterable[str] = ()) -> None:
        conn = self.open()
        marks = ", ".join("?" for _ in COLUMN_NAMES)
        encoded = [_encode(r) for r in rows]
        delete = [(k,) for k in delete_keys]
        if not encoded and not delete:
            return
        with _transaction(conn):
            if delete:
                conn.executemany("DELETE FROM runs WHERE key = ?", delete)
            if encoded:
                conn.executemany(f"INSERT OR REPLACE INTO runs ({', '.join(COLUMN_NAMES)}) VALUES ({marks})", encoded)

    def index_run(self, run_dir: Path) -> None:
        self.upsert(summarize_run(Path(run_dir)))

    @_guarded
    def remove_paths(self, dirs: Iterable[Path]) -> None:
        """Runs whose directories were deleted (prune), pivot rows they carried included: marked deleted."""
        conn = self.open()
        keys: list[str] = []
        for d in dirs:
            keys.extend(k for (k,) in conn.execute("SELECT key FROM runs WHERE path = ?", (str(d),)))
        self.mark_deleted(keys)

    # -- keeping up with the run directories -------------------------------------
    def _job_dirs(self) -> Iterator[tuple[str, str, str, int]]:
        """(kind, name, path, mtime_ns) of every job's and pipeline target's directory."""
        for kind, sub in (("job", "runs"), ("pipeline", "pipelines")):
            root = self.state_dir / sub
            try:
                entries = os.scandir(root)
            except OSError:
                continue
            with entries:
                for entry in entries:
                    if _NAME.match(entry.name) and entry.is_dir(follow_symlinks=False):
                        try:
                            yield kind, entry.name, entry.path, entry.stat(follow_symlinks=False).st_mtime_ns
                        except OSError:
                            continue

    def _recovered(self, exc: sqlite3.DatabaseError) -> bool:
        """After an error past open(): True when the file was proven corrupt and has been replaced."""
        if isinstance(exc, IndexUnavailable) or _code(exc) != _SQLITE_CORRUPT:
            return False
        if self._conn is not None and self._conn.in_transaction:
            return False                   # rebuild() calls sync() in its transaction: it recovers itself
        if not _proven_corrupt(exc, self.path):
            return False
        self.close()
        self._replace(exc)
        return True

    @_guarded
    def sync(self, now: Optional[float] = None) -> int:
        """Index what changed on disk since the last call (see _sync); a file found malformed on the
        way (quick_check agrees) is replaced and the sync done again on the new one."""
        try:
            return self._sync(now)
        except sqlite3.DatabaseError as exc:
            if not self._recovered(exc):
                raise
        return self._sync(now)

    def _sync(self, now: Optional[float] = None) -> int:
        """Index what changed on disk since the last call; returns how many rows were (re)written.

        Job directories whose mtime is unchanged are not listed; live runs, and runs that ended
        recently whose events grew, are re-read; run directories that vanished are marked deleted.
        """
        now = time.time() if now is None else now
        conn = self.open()
        seen_dirs = {path: mtime for path, mtime in conn.execute("SELECT path, mtime_ns FROM dirs")}
        on_disk = list(self._job_dirs())
        changed = [(kind, name, path) for kind, name, path, mtime in on_disk if seen_dirs.get(path) != mtime]
        rows: list[dict] = []
        gone: list[str] = []
        rescanned: set[str] = set()
        for kind, name, path in changed:
            rescanned.add(f"{kind}/{name}")
            known: dict[str, tuple] = {}
            for key, final, ended, events_size, state in conn.execute(
                    "SELECT key, final, ended_at, events_size, state FROM runs WHERE job = ? AND kind = ?",
                    (name, kind)):
                known[key] = (final, ended, events_size, state)
            present = set()
            try:
                entries = os.scandir(path)
            except OSError:
                entries = None
            if entries is not None:
                with entries:
                    for entry in entries:
                        if not (_RUN_ID.match(entry.name) and entry.is_dir(follow_symlinks=False)):
                            continue
                        key = f"{kind}/{name}/{entry.name}"
                        present.add(key)
                        entry_row = known.get(key)
                        if entry_row is not None and entry_row[0] and entry_row[3] != DELETED:
                            continue          # final: re-read below only if recently ended
                        rows.extend(self._summarize(kind, Path(entry.path), now))
            gone.extend(k for k, v in known.items() if k not in present and v[3] != DELETED)
        # Live runs, and recently ended ones whose events grew (a pivot adds steps after the stop).
        for key, kind, job, path, final, ended, events_size in conn.execute(
                "SELECT key, kind, job, path, final, ended_at, events_size FROM runs "
                "WHERE kind != 'pivot' AND state != ? AND (final = 0 OR ended_at > ?)", (DELETED, now - RECHECK_ENDED_S)):
            if f"{kind}/{job}" in rescanned and not final:
                continue                      # just summarized above
            p = Path(path)
            if not p.is_dir():
                if f"{kind}/{job}" not in rescanned:
                    gone.append(key)
                continue
            if final and (kind != "job" or file_size(p / "events.jsonl") == events_size):
                continue
            rows.extend(self._summarize(kind, p, now))
        self.upsert(rows)
        self.mark_deleted(gone)
        if changed or len(seen_dirs) != len(on_disk):
            with _transaction(conn):
                conn.execute("DELETE FROM dirs")
                conn.executemany("INSERT INTO dirs (path, mtime_ns) VALUES (?, ?)",
                                 [(path, mtime) for _, _, path, mtime in on_disk])
        return len(rows) + len(gone)

    @staticmethod
    def _summarize(kind: str, path: Path, now: float) -> list[dict]:
        try:
            return summarize_run(path, now) if kind == "job" else [summarize_pipeline(path, now)]
        except Exception as exc:
            # A run dir being created or deleted right now, or one no reader can make sense of: it
            # is listed with what went wrong (re-read next sync: final 0), and the other runs are not held up.
            return [unreadable_row(kind, path, now, f"{type(exc).__name__}: {exc}")]

    @_guarded
    def mark_deleted(self, keys: list[str]) -> None:
        """Runs whose directories are gone keep their row, marked deleted: a post-mortem can still
        say what the index knew. Listings leave them out; --reindex forgets them."""
        if not keys:
            return
        conn = self.open()
        with _transaction(conn):
            conn.executemany("UPDATE runs SET state = ?, final = 1 WHERE key = ?", [(DELETED, k) for k in keys])
            # Pivot rows live in the run directory that carried them.
            conn.executemany("UPDATE runs SET state = ?, final = 1 WHERE kind = 'pivot' AND path = "
                             "(SELECT path FROM runs WHERE key = ?)", [(DELETED, k) for k in keys])

    @_guarded
    def rebuild(self) -> int:
        """Index every run directory again (`gpudeck runs --reindex`), in one transaction on the same file.

        The file is never deleted or moved here: another process may have it open (a reader, a
        runner indexing its run, a second --reindex, which waits for this one's lock).
        """
        conn = self.open()
        try:
            with _transaction(conn):
                conn.execute("DELETE FROM runs")
                conn.execute("DELETE FROM dirs")
                return self._sync()
        except sqlite3.DatabaseError as exc:
            if not self._recovered(exc):   # rolled back by now: a malformed file is replaced, then filled
                raise
        return self._sync()

    # -- queries ------------------------------------------------------------------
    @_guarded
    def query(self, *, job: Optional[str] = None, failed: bool = False, since: Optional[float] = None,
              kinds: Optional[Iterable[str]] = None, limit: Optional[int] = None,
              columns: Iterable[str] = COLUMN_NAMES, include_deleted: bool = False) -> list[dict]:
        """Rows newest first (runs whose directories are gone only with include_deleted)."""
        conn = self.open()
        cols = [c for c in columns if c in COLUMN_NAMES]
        where: list[str] = []
        args: list[str | float] = []          # the ? parameters, in order
        if not include_deleted:
            where.append("(state IS NULL OR state != ?)")
            args.append(DELETED)
        if job:
            where.append("job = ?")
            args.append(job)
        if failed:
            where.append("failed = 1")
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        kinds = list(kinds or ())
        if kinds:
            where.append(f"kind IN ({', '.join('?' for _ in kinds)})")
            args.extend(kinds)
        sql = f"SELECT {', '.join(cols)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, run_id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        json_cols = [c for c in cols if c in JSON_COLUMNS]
        return [decode_row(values, cols, json_cols) for values in conn.execute(sql, args)]

    @_guarded
    def get(self, key: str) -> Optional[dict]:
        conn = self.open()
        values = conn.execute(f"SELECT {', '.join(COLUMN_NAMES)} FROM runs WHERE key = ?", (key,)).fetchone()
        return decode_row(values) if values else None

    @_guarded
    def find(self, run_id: str) -> list[dict]:
        """Rows whose run id is `run_id`, or starts/ends with it (job runs first)."""
        conn = self.open()
        cur = conn.execute(f"SELECT {', '.join(COLUMN_NAMES)} FROM runs WHERE run_id = ? "
                           "ORDER BY kind = 'job' DESC", (run_id,))
        rows = [decode_row(v) for v in cur]
        if rows:
            return rows
        like = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        cur = conn.execute(f"SELECT {', '.join(COLUMN_NAMES)} FROM runs WHERE run_id LIKE ? ESCAPE '\\' "
                           "OR run_id LIKE ? ESCAPE '\\' ORDER BY kind = 'job' DESC",
                           (like + "%", "%" + like))
        return [decode_row(v) for v in cur]


class ReindexFailed(Exception):
    """The index could not be rebuilt; the message is one line: the database and why."""


def reindex(index: RunIndex) -> tuple[int, float]:
    """`runs --reindex`, here or on a host's agent: index.rebuild(), timed -> (runs indexed, seconds)."""
    started = time.perf_counter()
    try:
        count = index.rebuild()
    except IndexUnavailable as exc:
        raise ReindexFailed(str(exc)) from None
    except sqlite3.Error as exc:
        raise ReindexFailed(f"run index {index.path}: {exc}") from None
    return count, time.perf_counter() - started


def open_index(state_dir: Optional[Path] = None, sync: bool = True) -> RunIndex:
    """The index of `state_dir`, brought up to date with the run directories."""
    index = RunIndex(state_dir)
    if sync:
        index.sync()
    return index


def index_run_at_end(run_dir: Path) -> None:
    """The runner's last act: its run's row (never raises; a reader re-indexes it lazily otherwise)."""
    run_dir = Path(run_dir)
    try:
        state_dir = run_dir.parent.parent.parent      # <state>/runs/<job>/<run_id>
        with RunIndex(state_dir) as index:
            index.index_run(run_dir)
    except Exception:
        pass
