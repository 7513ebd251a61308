"""The post-mortem of one run (or of a bare log file) as plain data: verdict, phase timeline, stalls, alerts, context, resource and serving timelines, the lines that matter, comparison with the job's earlier runs.

Everything comes from files the runner already wrote; a finished run's log is not
re-read (summary.json holds the analyzer's final state, the phase changes and a line
index), so a report on a 1 GB log and a day of samples takes well under two seconds.
Whatever is missing (samples, summary, a truncated log, a deleted run directory, a
broken index) is said in `missing`, never raised.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from gpudeck.jobs.history.index import RunIndex, file_size, read_json, read_jsonl
from gpudeck.jobs.strictjson import number
from gpudeck.jobs.paths import open_regular
from gpudeck.jobs.history.phases import phase_rows
from gpudeck.jobs.history.recorder import read_summary, timeline_from_samples

if TYPE_CHECKING:                  # imported where used, at run time
    from gpudeck.jobs.runs import ArrivalIndex

REPORT_VERSION = 1
CONTEXT_LINES = 2                  # lines shown before and after each line that matters
LAST_LINES = 8
LINE_CHARS = 400                   # a line that matters is shown up to this many characters
SILENCE_MIN_S = 300.0              # a log silence this long is worth a line in the report
MAX_SILENCES = 8
MAX_SAMPLE_LINES_PARSED = 20_000   # samples.jsonl without summary.json: every k-th line beyond this
REPLAY_CHUNK = 1024 * 1024         # a re-read log: phase changes are placed to within this many bytes at most
SMALL_LOG = 4 * 1024 * 1024        # ... and to the line in a log this small
HISTORY_RUNS = 5                   # "same failure seen in K of the last N runs"
LOAD_HISTORY_RUNS = 20

CAUSE_TEXT = {
    "cuda_oom": "CUDA out of memory", "host_oom": "host OOM kill", "nccl": "NCCL error",
    "cuda_error": "CUDA error", "import_error": "import error", "syntax_error": "SyntaxError",
    "bad_arguments": "bad arguments", "build_failed": "build failed", "hang": "hang",
    "gpu_fault": "GPU fault", "exception": "Python exception", "lost": "lost (runner and job gone, no exit record)",
    "time_limit": "Slurm time limit", "node_fail": "node failure", "preempted": "preempted by Slurm",
}
SERVING_LABELS = {
    "gen_tokens_per_s": "generation tokens/s", "prompt_tokens_per_s": "prompt tokens/s",
    "running": "running requests", "waiting": "waiting requests", "kv_cache_pct": "KV cache %",
    "spec_accept_rate": "spec-decode acceptance",
}
_TS = re.compile(rb"(?:(\d{4})-)?(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)")


class PostmortemError(Exception):
    """The target names no run, job or file (the CLI prints it as one line)."""


# --------------------------------------------------------------------------- small helpers

def clock(seconds: Optional[float]) -> str:
    """35:02, 1:02:03, 0:12 — durations as an operator reads them off a timeline."""
    if seconds is None:
        return "?"
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def span(seconds: Optional[float]) -> str:
    """2 s, 5 min 3 s, 2 h 05 min — a duration inside a sentence."""
    if seconds is None:
        return "?"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def _clean(raw: bytes) -> str:
    from gpudeck.jobs.logs.sanitize import sanitize_line
    return sanitize_line(raw, LINE_CHARS)


# --------------------------------------------------------------------------- reading lines of a big log

def read_lines(path: Path, wanted: Iterable[int], checkpoints: Optional[list] = None) -> dict[int, str]:
    """{line number: sanitized text} for the wanted 1-based lines, reading from the nearest checkpoint.

    checkpoints: [[offset, newlines before offset], ...] from summary.json; without them the
    file is skipped through from its start (newlines counted at C speed).
    """
    wanted = sorted({n for n in wanted if isinstance(n, int) and n >= 1})
    points = sorted((o, n) for o, n in (checkpoints or []) if isinstance(o, int) and isinstance(n, int))
    points.insert(0, (0, 0))
    out: dict[int, str] = {}
    try:
        fh = open_regular(path)          # never blocks on a FIFO, never reads /dev/zero
    except OSError:
        return out
    with fh:
        i = 0
        while i < len(wanted):
            target = wanted[i]
            offset, newlines = max((p for p in points if p[1] < target), default=(0, 0))
            fh.seek(offset)
            line_no = newlines + 1
            while line_no < target:                  # skip whole lines to the target
                chunk = fh.read(1 << 20)
                if not chunk:
                    return out
                need = target - line_no
                count = chunk.count(b"\n")
                if count < need:
                    line_no += count
                    continue
                pos = -1
                for _ in range(need):
                    pos = chunk.index(b"\n", pos + 1)
                fh.seek(fh.tell() - len(chunk) + pos + 1)
                line_no = target
            # At the start of line `target`: read on while the next wanted lines are close.
            while i < len(wanted) and 0 <= wanted[i] - line_no <= 64:
                raw = fh.readline(LINE_CHARS * 8)
                if not raw:
                    return out
                rest = raw
                while not rest.endswith(b"\n"):         # a giant line: show its head, skip the rest
                    rest = fh.readline(1 << 20)
                    if not rest:
                        break
                if line_no == wanted[i]:
                    out[line_no] = _clean(raw)
                    i += 1
                line_no += 1
            while i < len(wanted) and wanted[i] < line_no:
                i += 1
    return out


def _tail_lines(path: Path, count: int, total_lines: Optional[int]) -> list[dict]:
    """The last `count` lines of the log with their numbers (when the total is known)."""
    try:
        with open_regular(path) as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return []
    ends_with_nl = data.endswith(b"\n")
    parts = data.split(b"\n")
    if ends_with_nl:
        parts = parts[:-1]
    if size > 64 * 1024 and parts:
        parts = parts[1:]                    # the first piece may be half a line
    last = parts[-count:]
    out = []
    first_no = None
    if total_lines is not None:
        first_no = total_lines - len(last) + 1
    for k, raw in enumerate(last):
        out.append({"line": first_no + k if first_no is not None else None, "text": _clean(raw)})
    return out


def _line_timestamp(data: bytes) -> Optional[float]:
    """The last timestamp a log line prints (2025-11-29 23:45:01, or vLLM's 11-29 23:45:01), as a unix time."""
    found = None
    for m in _TS.finditer(data):
        found = m
    if found is None:
        return None
    year, mo, d, h, mi, s = found.groups()
    try:
        return datetime(int(year) if year else 2000, int(mo), int(d), int(h), int(mi), int(s)).timestamp()
    except ValueError:
        return None


def replay_log(path: Path, arrival: Optional[ArrivalIndex] = None) -> dict:
    """Read a log once (no summary.json to use): analysis, phase changes, line count.

    Phase changes are placed to within REPLAY_CHUNK bytes; their times come from the run's
    arrival index when there is one, else from the timestamps the log's lines print.
    """
    from gpudeck.jobs.health import as_dict
    from gpudeck.jobs.logs.analyze import LogAnalyzer
    analyzer = LogAnalyzer()
    phases: list[dict] = []
    offset = 0
    carry = b""
    last_ts: Optional[float] = None
    # A small log is fed line by line (exact phase lines); a big one in pieces of about
    # 1/4000th of it, so the pass stays near the analyzer's own speed.
    size = file_size(Path(path))
    piece_size = 0 if size <= SMALL_LOG else max(64 * 1024, min(REPLAY_CHUNK, size // 4000))
    with open_regular(path) as fh:
        while True:
            chunk = fh.readline() if piece_size == 0 else fh.read(piece_size)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < 4 * REPLAY_CHUNK and piece_size:
                carry = data
                continue
            cut = cut or len(data)
            piece, carry = data[:cut], data[cut:]
            analyzer.feed(piece)
            offset += len(piece)
            if arrival is None:
                # A line without a timestamp happened no earlier than the last one that had one.
                last_ts = _line_timestamp(piece[-8192:]) or last_ts
            phase = analyzer.result().phase
            if not phases or phases[-1]["phase"] != phase:
                t = arrival.time_of(offset - 1) if arrival is not None else last_ts
                phases.append({"phase": phase, "t": t, "offset": offset, "line": max(1, analyzer.line - 1)})
        if carry:
            analyzer.feed(carry)
            offset += len(carry)
    analyzer.finish()
    result = as_dict(analyzer.result())
    if result.get("phase") and (not phases or phases[-1]["phase"] != result["phase"]):
        t = arrival.time_of(offset - 1) if arrival is not None else last_ts
        phases.append({"phase": result["phase"], "t": t, "offset": offset, "line": max(1, analyzer.line - 1)})
    lines = analyzer.line - (1 if offset and _last_byte(path) == b"\n" else 0)
    return {"analysis": result, "phases": phases, "lines": lines, "bytes": offset}


def _last_byte(path: Path) -> bytes:
    try:
        with open_regular(path) as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1)
    except OSError:
        return b""


# --------------------------------------------------------------------------- locating what to report on

def _is_run_dir(path: Path) -> bool:
    return (path / "meta.json").is_file() or ((path / "output.log").is_file() and (path / "times").is_file())


def resolve(target: str, state_dir: Optional[Path] = None) -> dict:
    """What `target` names: {"kind": "run", "path"} | {"kind": "log", "path"} | {"kind": "deleted", "row"}.

    Order: an existing file or directory, then a job name (its latest run), then a run id
    (exact, or a unique prefix/suffix). Raises PostmortemError when nothing matches.
    """
    from gpudeck.jobs import paths
    state_dir = Path(state_dir) if state_dir is not None else paths.state_dir()
    p = Path(target).expanduser()
    if p.is_dir():
        if _is_run_dir(p):
            return {"kind": "run", "path": p}
        raise PostmortemError(f"{target}: a directory that is not a run directory")
    if p.is_file():
        if p.name == "output.log" and _is_run_dir(p.parent):
            return {"kind": "run", "path": p.parent}
        return {"kind": "log", "path": p}
    index, index_error = _index(state_dir)
    rows: list[dict] = []
    if index is not None:
        try:
            rows = index.query(job=target, kinds=["job"], limit=1)
            if not rows:
                rows = index.query(job=target, kinds=["job"], limit=1, include_deleted=True)
            if not rows:
                rows = index.find(target)
        except Exception as exc:            # a broken index: fall back to the run directories
            index_error = str(exc)
            rows = []
        finally:
            index.close()
    if rows:
        if len({r["run_id"] for r in rows}) > 1 and not any(r["run_id"] == target for r in rows):
            raise PostmortemError(f"{target}: matches {len(rows)} runs ({', '.join(r['run_id'] for r in rows[:4])}"
                                  f"{' …' if len(rows) > 4 else ''}); give more of the run id")
        row = rows[0]
        if row["kind"] == "pipeline":
            return {"kind": "pipeline", "path": Path(row["path"]), "row": row}
        if Path(row["path"]).is_dir():
            return {"kind": "run", "path": Path(row["path"])}
        return {"kind": "deleted", "row": row}
    # No index (or nothing in it): the run directories themselves.
    from gpudeck.jobs.runs import iter_all_runs, latest_run
    try:
        run = latest_run(target, state_dir)
    except ValueError:
        run = None
    if run is not None:
        return {"kind": "run", "path": run.path}
    matches = [r for r in iter_all_runs(state_dir) if r.run_id == target or r.run_id.startswith(target)
               or r.run_id.endswith(target)]
    if len(matches) == 1:
        return {"kind": "run", "path": matches[0].path}
    if len(matches) > 1:
        raise PostmortemError(f"{target}: matches {len(matches)} runs; give more of the run id")
    hint = f" (index: {index_error})" if index_error else ""
    raise PostmortemError(f"{target}: no such log file, job with runs, or run id{hint}")


def _index(state_dir: Path) -> tuple[Optional[RunIndex], Optional[str]]:
    index = RunIndex(state_dir)
    try:
        index.sync()
    except Exception as exc:                 # unwritable state dir, locked for too long
        index.close()
        return None, str(exc)
    return index, None


# --------------------------------------------------------------------------- the report

def build(target: str, state_dir: Optional[Path] = None) -> dict:
    """The post-mortem of `target` (run id, job name, run directory or any log file)."""
    t0 = time.perf_counter()
    where = resolve(target, state_dir)
    if where["kind"] == "run":
        report = build_run(where["path"], state_dir=state_dir)
    elif where["kind"] == "log":
        report = build_log(where["path"])
    elif where["kind"] == "pipeline":
        report = build_pipeline(where["path"], where["row"])
    else:
        report = build_deleted(where["row"])
    report["build_s"] = round(time.perf_counter() - t0, 3)
    return report


def _empty(kind: str) -> dict:
    return {"version": REPORT_VERSION, "source": {"kind": kind}, "verdict": "", "outcome": {}, "failure": None,
            "analysis": {}, "phases": [], "stalls": [], "silences": [], "alerts": [], "context": {},
            "resources": None, "serving": None, "lines": [], "last_lines": [], "history": None, "missing": [],
            "notifications": []}


def build_run(run_dir: Path, state_dir: Optional[Path] = None) -> dict:
    run_dir = Path(run_dir)
    report = _empty("run")
    missing = report["missing"]
    notes: list[str] = []            # files that are there but unreadable (strictjson's words)
    meta = read_json(run_dir / "meta.json", notes)
    if meta is None:
        missing.append("meta.json missing or unreadable: command, host and GPUs unknown")
        meta = {}
    exit_record = read_json(run_dir / "exit.json", notes)
    health = read_json(run_dir / "health.json", notes) or {}
    events = read_jsonl(run_dir / "events.jsonl", notes)
    if not (run_dir / "events.jsonl").exists():
        missing.append("events.jsonl missing: no alerts or stop requests known")
    summary = read_summary(run_dir, notes)
    missing.extend(notes)
    log_path = run_dir / "output.log"
    log_size = file_size(log_path)
    from gpudeck.jobs.history.index import summarize_run
    row = summarize_run(run_dir)[0]
    started = row["started_at"]
    ended = row["ended_at"]
    now = time.time()
    end_for_phases = ended if ended is not None else (now if row["state"] in ("running", "stopping", "starting")
                                                      else None)
    command = meta.get("command")
    report["source"] = {"kind": "run", "job": row["job"], "run_id": row["run_id"], "path": str(run_dir),
                        "log": str(log_path), "host": row["host"], "backend": row["backend"],
                        "command": shlex.join(map(str, command)) if isinstance(command, list) else command,
                        "gpus": row["gpus"], "job_kind": row["job_kind"], "engine": row["engine"]}
    report["outcome"] = {k: row[k] for k in ("state", "exit_code", "signal", "stopped_by", "failed", "started_at",
                                              "ended_at", "duration_s", "final_phase", "load_s")}
    report["outcome"]["failed"] = bool(row["failed"])
    note = (exit_record or {}).get("note")
    if isinstance(note, str):
        report["outcome"]["note"] = note                         # Slurm's word on how the job ended
    # sbatch refused it or its exec failed (as the history reads it): the log holds only gpudeck's word on that.
    from gpudeck.jobs.history.index import launch_error_of
    launch_error = launch_error_of(row["state"], exit_record, row["stopped_by"])
    report["outcome"]["never_ran"] = bool(launch_error)
    if launch_error:
        report["outcome"]["launch_error"] = launch_error
    if meta.get("backend") == "slurm":
        # Slurm's own word for the end (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL...), with its job id and nodes.
        rec = exit_record or {}
        report["outcome"]["slurm"] = {"job_id": meta.get("slurm_job_id"), "state": rec.get("slurm_state"),
                                      "reason": rec.get("slurm_reason"), "nodes": rec.get("nodes") or meta.get("nodes")}
    if exit_record is None and row["state"] not in ("running", "starting", "stopping"):
        missing.append("exit.json missing: the run ended without its runner recording how")

    # The analyzer's final state: kept by the runner (summary.json), else re-read from the log.
    arrival = None
    phases_raw: list[dict] = []
    checkpoints = None
    total_lines = None
    if summary is not None:
        analysis = summary.get("analysis") or {}
        phases_raw = [p for p in summary.get("phases") or [] if isinstance(p, dict)]
        log = summary.get("log") or {}
        checkpoints = log.get("checkpoints")
        recorded = number(log.get("bytes"))
        lines_next = number(log.get("lines"))
        if lines_next:
            total_lines = int(lines_next) - (1 if _last_byte(log_path) == b"\n" else 0)
        if recorded is not None and log_size < recorded:
            missing.append(f"log truncated: the runner read {int(recorded):,} bytes, {log_size:,} are on disk now")
            checkpoints = None
        if not summary.get("final") and exit_record is not None:
            missing.append(_not_final(run_dir))
    elif log_path.exists():
        missing.append("summary.json missing (a runner that predates it, or killed): the log was re-read")
        from gpudeck.jobs.runs import ArrivalIndex
        arrival = ArrivalIndex.load(run_dir / "times")
        if not arrival.offsets:
            arrival = None
            missing.append("times (the log's arrival index) missing: phase times come from the log's own timestamps")
        try:
            replayed = replay_log(log_path, arrival)
        except OSError as exc:
            replayed = {"analysis": health, "phases": [], "lines": None}
            missing.append(f"log unreadable: {exc.strerror or exc}")
        analysis = replayed["analysis"] or health
        phases_raw = replayed["phases"]
        total_lines = replayed["lines"]
    else:
        analysis = health
    if not log_path.exists():
        missing.append("output.log missing: no phases or lines from the log")
    report["analysis"] = {k: analysis.get(k) for k in ("engine", "phase", "progress", "failure", "ready_line",
                                                        "serving", "warnings", "key_lines") if k in analysis}
    failure = analysis.get("failure") if isinstance(analysis.get("failure"), dict) else None
    report["failure"] = failure
    report["phases"] = phase_rows(phases_raw, started, end_for_phases)

    # Alerts, stalls and the log's silences.
    report["alerts"], report["stalls"] = _alerts(events, health, end_for_phases, started)
    report["silences"] = _silences(run_dir / "times", started, end_for_phases)
    report["context"] = _context(meta, events, row, state_dir)
    report["events"] = _notable_events(events, started)
    report["stacks"] = stack_dumps(events, report["stalls"], started, run_dir)
    # Webhook deliveries and their failures (gpudeck.jobs.notify), each attempt with its status or error.
    from gpudeck.jobs.notify import deliveries
    report["notifications"] = deliveries(events, started)

    # Resource and serving timelines.
    timeline, peaks = None, None
    live = row["state"] in ("running", "starting", "stopping")
    if live and summary is not None:
        age = now - (number(summary.get("written_at")) or now)
        missing.append(f"the run is live: phases and the lines that matter are as of its runner's last summary "
                       f"({span(age)} ago); the resource timeline is read from samples.jsonl")
    if live and (run_dir / "samples.jsonl").exists():
        timeline, peaks = _timeline_from_samples_file(run_dir / "samples.jsonl", missing)
    elif summary is not None and isinstance(summary.get("timeline"), dict) and summary["timeline"].get("t"):
        timeline, peaks = summary["timeline"], summary.get("peaks") or {}
    elif (run_dir / "samples.jsonl").exists():
        timeline, peaks = _timeline_from_samples_file(run_dir / "samples.jsonl", missing)
    else:
        missing.append("samples.jsonl missing: no resource timeline")
    if timeline is not None:
        report["resources"], report["serving"] = _split_timeline(timeline, peaks, started)
        if report["resources"] is None:
            missing.append("the samples hold no resource numbers")

    # The lines that matter, with context, and the log's last lines.
    report["lines"] = _key_lines(log_path, analysis, checkpoints, total_lines, missing)
    report["last_lines"] = _tail_lines(log_path, LAST_LINES, total_lines) if log_path.exists() else []
    report["history"] = _history(row, state_dir, missing)
    report["verdict"] = verdict(report)
    return report


def _not_final(run_dir: Path) -> str:
    """Why summary.json is not final although the job has exited: its runner still reads the log, or died."""
    from gpudeck.jobs.procs import alive
    from gpudeck.jobs.runs import Run
    try:
        finishing = alive(Run(run_dir).runner_id())        # pid and start time: a reused pid is not our runner
    except Exception:            # unreadable meta: nothing says the runner lives
        finishing = False
    if finishing:
        return ("summary.json is not final yet: the job has exited and its runner is finishing (reading the rest "
                "of the log); the phases and the lines that matter are complete once it is done")
    return "summary.json is not final (the runner died before the end): its last minute may be missing"


def _alerts(events: list[dict], health: dict, end: Optional[float], started: Optional[float]
            ) -> tuple[list[dict], list[dict]]:
    alerts: list[dict] = []
    open_by_code: dict[str, dict] = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "AlertRaised":
            entry = {"code": ev.get("code"), "raised": number(ev.get("t")), "since": number(ev.get("since")),
                     "cleared": None, "message": ev.get("message"), "severity": ev.get("severity"),
                     "cause": ev.get("cause"), "hint": ev.get("hint")}
            alerts.append(entry)
            open_by_code[str(ev.get("code"))] = entry
        elif kind == "AlertCleared":
            opened = open_by_code.pop(str(ev.get("code")), None)
            if opened is not None:
                opened["cleared"] = number(ev.get("cleared")) or number(ev.get("t"))
    if not alerts:
        # An older runner that kept alerts only in health.json.
        for al in (health.get("history") or []) + (health.get("alerts") or []):
            if isinstance(al, dict) and not any(a["code"] == al.get("code") and a["since"] == al.get("since")
                                                for a in alerts):
                alerts.append({"code": al.get("code"), "raised": number(al.get("since")), "since": number(al.get("since")),
                               "cleared": number(al.get("cleared")), "message": al.get("message"),
                               "severity": al.get("severity"), "cause": al.get("cause"), "hint": al.get("hint")})
    for a in alerts:
        # When the condition began (the rules' clock), else when the alert was written.
        at = a["since"] if a["since"] is not None else a["raised"]
        a["at_s"] = round(at - started, 3) if at is not None and started is not None else None
    stalls = []
    for a in alerts:
        if a["code"] in ("stalled", "nccl_hang"):
            begin = a["since"] or a["raised"]
            finish = a["cleared"] or end
            stalls.append({"code": a["code"], "start": begin, "end": finish,
                           "start_s": round(begin - started, 3) if begin is not None and started is not None else None,
                           "duration_s": round(finish - begin, 3) if begin is not None and finish is not None else None,
                           "cleared": a["cleared"] is not None, "message": a["message"]})
    return alerts, stalls


def _silences(times_path: Path, started: Optional[float], end: Optional[float]) -> list[dict]:
    """Windows where the log did not grow for SILENCE_MIN_S or more, longest first."""
    from gpudeck.jobs.runs import read_times
    stamps = [t for _, t in read_times(times_path)]
    if started is not None:
        stamps.insert(0, started)
    if end is not None:
        stamps.append(end)
    gaps: list[dict[str, Any]] = []           # start_s is None without a start; duration_s is a float
    for a, b in zip(stamps, stamps[1:]):
        if b - a >= SILENCE_MIN_S:
            gaps.append({"start": a, "end": b, "duration_s": round(b - a, 3),
                         "start_s": round(a - started, 3) if started is not None else None})
    gaps.sort(key=lambda g: -g["duration_s"])
    return gaps[:MAX_SILENCES]


def _notable_events(events: list[dict], started: Optional[float]) -> list[dict]:
    keep = ("JobStarted", "StopRequested", "StopEscalated", "JobExited", "LeftoversFound", "LeftoversTerminated",
            "PivotRequested", "PivotStarted", "PivotCompleted", "PivotFailed", "JobFailedToStart", "RunnerFailed",
            "MonitorFailed", "JobNotStarted", "StopVerified")
    out = []
    for ev in events:
        if ev.get("event") in keep:
            t = number(ev.get("t"))
            detail = {k: v for k, v in ev.items() if k not in ("t", "event", "plan", "traceback")}
            out.append({"event": ev["event"], "t": t,
                        "at_s": round(t - started, 3) if t is not None and started is not None else None,
                        "detail": json.dumps(detail, default=str, sort_keys=True)[:300]})
    return out


def _context(meta: dict, events: list[dict], row: dict, state_dir: Optional[Path]) -> dict:
    out: dict[str, Any] = {}
    if row.get("pivot"):
        out["pivot"] = row["pivot"]
        steps = [f"{e.get('step')}: {'ok' if e.get('ok') else 'FAILED'} ({span(number(e.get('duration_s')))})"
                 for e in events if e.get("event") in ("PivotStepCompleted", "PivotStepFailed")]
        if steps:
            out["pivot_steps"] = steps
    pipeline_id = meta.get("pipeline")
    if isinstance(pipeline_id, str) and pipeline_id:
        out["pipeline"] = {"id": pipeline_id}
        try:
            from gpudeck.jobs.pipeline_records import list_pipelines
            for pipe in list_pipelines(None, state_dir):
                if pipe.pipeline_id == pipeline_id:
                    data = pipe.to_jsonable()
                    out["pipeline"] = {"id": pipeline_id, "target": data["target"], "state": data["state"],
                                       "stages": [f"{s['name']} [{s['status']}]" for s in data["stages"]]}
                    break
        except Exception:           # a pipeline dir that cannot be read costs its context only
            pass
    if row.get("stopped_by"):
        out["stopped_by"] = row["stopped_by"]
    return out


def _timeline_from_samples_file(path: Path, missing: list[str]) -> tuple[Optional[dict], Optional[dict]]:
    from gpudeck.jobs import strictjson
    skipped: list[str] = []
    try:
        lines = list(strictjson.iter_lines(path, skipped=skipped))
    except (OSError, strictjson.Unreadable) as exc:
        missing.append(str(exc) if isinstance(exc, strictjson.Unreadable)
                       else f"samples.jsonl unreadable: {exc.strerror or exc}")
        return None, None
    if skipped:
        missing.append("samples.jsonl: " + ", ".join(skipped))
    step = max(1, len(lines) // MAX_SAMPLE_LINES_PARSED)
    if step > 1:
        missing.append(f"summary.json missing: the resource timeline reads every {step}th sample")

    def parsed() -> Iterator[dict]:
        for line in lines[::step]:
            obj = strictjson.parse_line(line)
            shaped = strictjson.timed(obj) if obj is not None else None
            if shaped is not None:
                yield shaped
    timeline, peaks = timeline_from_samples(parsed())
    if not timeline.get("t"):
        missing.append("samples.jsonl holds no samples")
        return None, None
    return timeline, peaks


def _split_timeline(timeline: dict, peaks: Optional[dict], started: Optional[float]) -> tuple[Optional[dict], Optional[dict]]:
    times = [number(t) for t in timeline.get("t") or []]
    # The first time the timeline has (a corrupt summary.json may hold a null one).
    base = started if started is not None else next((t for t in times if t is not None), 0.0)
    rel = [round(t - base, 3) if t is not None else None for t in times]
    resources, serving = {}, {}
    for name, values in (timeline.get("series") or {}).items():
        if not isinstance(values, list) or not any(v is not None for v in values):
            continue
        if name.startswith("serving:"):
            serving[name.split(":", 1)[1]] = values
        else:
            resources[name] = values
    width = timeline.get("width_s")
    res = {"t": rel, "width_s": width, "series": resources, "peaks": peaks or {}} if resources else None
    srv = {"t": rel, "width_s": width, "series": serving} if serving else None
    return res, srv


def _key_lines(log_path: Path, analysis: dict, checkpoints: Optional[list], total_lines: Optional[int],
               missing: list[str]) -> list[dict]:
    """The lines that matter: the analyzer's key_lines when it has them, else root cause, ready line, warnings."""
    wanted: list[tuple[str, int]] = []
    for item in analysis.get("key_lines") or []:
        if isinstance(item, dict) and isinstance(item.get("line"), int):
            label = item.get("label") or item.get("kind") or item.get("what") or "line"
            wanted.append((str(label).replace("_", " "), item["line"]))
    if not wanted:
        failure = analysis.get("failure")
        if isinstance(failure, dict) and isinstance(failure.get("line"), int):
            wanted.append(("root cause", failure["line"]))
        if isinstance(analysis.get("ready_line"), int):
            wanted.append(("ready", analysis["ready_line"]))
        for w in analysis.get("warnings") or []:
            if isinstance(w, dict) and isinstance(w.get("line"), int):
                wanted.append((f"warning: {w.get('code')}", w["line"]))
    seen: set[int] = set()
    unique = []
    for label, line in wanted:
        if line not in seen:
            seen.add(line)
            unique.append((label, line))
    unique = unique[:8]
    if not unique:
        return []
    need = {n for _, line in unique for n in range(max(1, line - CONTEXT_LINES), line + CONTEXT_LINES + 1)}
    got = read_lines(log_path, need, checkpoints) if log_path.exists() else {}
    out = []
    for label, line in sorted(unique, key=lambda x: x[1]):
        context = [{"line": n, "text": got[n], "key": n == line}
                   for n in range(max(1, line - CONTEXT_LINES), line + CONTEXT_LINES + 1) if n in got]
        if line not in got:
            missing.append(f"line {line:,} ({label}) is not in the log on disk")
        out.append({"label": label, "line": line, "context": context})
    return out


def _history(row: dict, state_dir: Optional[Path], missing: list[str]) -> Optional[dict]:
    """This run against the job's earlier runs (from the index)."""
    started = row.get("started_at")
    index, error = _index(Path(state_dir) if state_dir is not None else _default_state())
    if index is None:
        missing.append(f"run index unusable ({error}): no comparison with earlier runs")
        return None
    try:
        earlier = [r for r in index.query(job=row["job"], kinds=["job"], limit=LOAD_HISTORY_RUNS + 1,
                                          columns=("run_id", "started_at", "failed", "failure_cause", "load_s",
                                                   "state", "duration_s"))
                   if r["run_id"] != row["run_id"] and (started is None or (r["started_at"] or 0) < started)]
    except Exception as exc:
        missing.append(f"run index unreadable ({exc}): no comparison with earlier runs")
        return None
    finally:
        index.close()
    if not earlier:
        return {"earlier_runs": 0}
    last = earlier[:HISTORY_RUNS]
    out: dict[str, Any] = {"earlier_runs": len(earlier),
                           "last": [{"run_id": r["run_id"], "failed": r["failed"], "cause": r["failure_cause"],
                                     "load_s": r["load_s"]} for r in last],
                           "failed_of_last": [sum(1 for r in last if r["failed"]), len(last)]}
    cause = row.get("failure_cause")
    if cause:
        out["same_failure"] = [sum(1 for r in last if r["failure_cause"] == cause), len(last)]
    loads = [r["load_s"] for r in earlier if r["load_s"] is not None]
    if loads:
        out["median_load_s"] = round(statistics.median(loads), 3)
        out["load_runs"] = len(loads)
    if row.get("load_s") is not None:
        out["load_s"] = row["load_s"]
    return out


def _default_state() -> Path:
    from gpudeck.jobs import paths
    return paths.state_dir()


# --------------------------------------------------------------------------- bare logs, pipelines, deleted runs

def build_log(path: Path) -> dict:
    report = _empty("log")
    missing = report["missing"]
    report["source"] = {"kind": "log", "log": str(path), "bytes": file_size(path)}
    try:
        replayed = replay_log(path)
    except OSError as exc:
        raise PostmortemError(f"cannot read {path}: {exc.strerror or exc}") from None
    analysis = replayed["analysis"]
    report["analysis"] = analysis
    report["failure"] = analysis.get("failure")
    phases = replayed["phases"]
    times = [p["t"] for p in phases if p.get("t") is not None]
    start = times[0] if times else None
    end = None
    if times:
        tail = b""
        try:
            with open_regular(path) as fh:
                fh.seek(max(0, file_size(path) - 8192))
                tail = fh.read()
        except OSError:
            pass
        end = _line_timestamp(tail) or times[-1]
    else:
        missing.append("no timestamps in the log and no run around it: phase durations unknown")
    report["phases"] = phase_rows(phases, start, end)
    report["outcome"] = {"state": "log", "final_phase": analysis.get("phase"),
                         "failed": bool(analysis.get("failure")), "duration_s": (end - start) if start and end else None}
    missing.append("a bare log: no exit status, samples, alerts or earlier runs")
    report["lines"] = _key_lines(path, analysis, None, replayed["lines"], missing)
    report["last_lines"] = _tail_lines(path, LAST_LINES, replayed["lines"])
    report["verdict"] = verdict(report)
    return report


def build_pipeline(path: Path, row: dict) -> dict:
    report = _empty("pipeline")
    report["source"] = {"kind": "pipeline", "job": row["job"], "run_id": row["run_id"], "path": str(path),
                        "command": row.get("command")}
    report["outcome"] = {k: row.get(k) for k in ("state", "failed", "started_at", "ended_at", "duration_s")}
    stages = (row.get("detail") or {}).get("stages") or []
    report["context"] = {"pipeline": {"id": row["run_id"], "target": row["job"], "state": row["state"],
                                      "stages": [f"{s.get('stage')} [{s.get('status')}]"
                                                 + (f" run {s['run_id']}" if s.get("run_id") else "")
                                                 for s in stages]}}
    failed_stage = next((s for s in stages if s.get("status") == "failed"), None)
    if row.get("state") == "succeeded":
        report["verdict"] = f"pipeline {row['job']} succeeded in {span(row.get('duration_s'))}: {row.get('command')}"
    elif failed_stage:
        report["verdict"] = (f"pipeline {row['job']} failed at stage {failed_stage.get('stage')} (run "
                             f"{failed_stage.get('run_id')}, exit {failed_stage.get('exit_code')}) — "
                             f"`gpudeck postmortem {failed_stage.get('run_id')}` for that run")
    else:
        report["verdict"] = f"pipeline {row['job']}: {row.get('state')}"
    return report


def build_deleted(row: dict) -> dict:
    report = _empty("run")
    report["source"] = {"kind": "run", "job": row["job"], "run_id": row["run_id"], "path": row["path"],
                        "host": row.get("host"), "backend": row.get("backend"), "command": row.get("command"),
                        "gpus": row.get("gpus")}
    report["outcome"] = {k: row.get(k) for k in ("state", "exit_code", "signal", "stopped_by", "failed",
                                                  "started_at", "ended_at", "duration_s", "final_phase", "load_s")}
    if row.get("failure_cause"):
        report["failure"] = {"cause": row["failure_cause"], "line": row.get("failure_line"),
                             "message": row.get("failure_message"), "hint": row.get("failure_hint")}
    report["phases"] = [{"phase": p, "start_s": None, "at": None, "duration_s": d, "line": None}
                        for p, d in (row.get("phases") or {}).items()]
    report["missing"].append(f"run directory {row['path']} was deleted: this report comes from the run index only "
                             "(no log lines, samples or events)")
    report["verdict"] = verdict(report)
    return report


# --------------------------------------------------------------------------- the verdict

LOAD_PHASES = ("loading", "compiling", "capturing")


def _load_phase(phase: Optional[dict]) -> bool:
    return phase is not None and phase["phase"] in LOAD_PHASES and phase.get("duration_s") is not None


def verdict(report: dict) -> str:
    """One line: what happened, when, why, and what to do."""
    o = report.get("outcome") or {}
    f = report.get("failure") or None
    state = o.get("state")
    phases = [p for p in report.get("phases") or [] if p["phase"] != "failed"]
    last_phase = phases[-1] if phases else None
    duration = o.get("duration_s")
    if state in ("running", "starting", "stopping"):
        where = f" in {last_phase['phase']} for {span(last_phase.get('duration_s'))}" if last_phase else ""
        alerts = [a["code"] for a in report.get("alerts") or [] if a.get("cleared") is None]
        return f"still {state}{where}" + (f"; open alerts: {', '.join(alerts)}" if alerts else "")
    when = ""
    if last_phase is not None and last_phase.get("duration_s") is not None:
        name = last_phase["phase"]
        if last_phase["duration_s"] < 1 and (duration or 0) < 1:
            when = ""
        elif name == "ready":
            when = f" {span(last_phase['duration_s'])} after ready"
        elif name == "starting" and _load_phase(phases[-2] if len(phases) > 1 else None):
            # Weights loaded, then it died in the start-up after: the load is what the run spent its time on.
            took, load = last_phase["duration_s"], phases[-2]
            lead = "right after" if took < 1 else f"{span(took)} after"
            when = f" {lead} {span(load['duration_s'])} of {load['phase']}"
        elif name != "running":
            when = f" after {span(last_phase['duration_s'])} of {name}"
        elif duration is not None:
            when = f" after {span(duration)}"
    elif duration is not None:
        when = f" after {span(duration)}"
    if state == "stopped" and not o.get("failed"):
        from gpudeck.jobs.history.index import stopper
        by = stopper(o.get("stopped_by") or "request")
        phase_said = last_phase is not None and last_phase["phase"] in when
        return f"stopped by {by}{when}" + (f" (phase {last_phase['phase']})" if last_phase and not phase_said else "")
    if state == "lost":
        return "lost: the runner and the job are gone and no exit was recorded" + when
    if o.get("never_ran"):
        # The log's reading of that line (a refused request: bad_arguments) adds its hint, not a crash.
        hint = f" — {f['hint']}" if f and f.get("hint") else ""
        return f"never ran; {o.get('note') or 'it failed to start: ' + str(o.get('launch_error'))}{hint}"
    if f and (o.get("failed") or state == "log"):
        word = "failed" if state == "log" else "crashed"
        cause = CAUSE_TEXT.get(str(f.get("cause")), str(f.get("cause")))
        line = f" (line {f['line']:,})" if isinstance(f.get("line"), int) else ""
        message = str(f.get("message") or "").strip()
        if len(message) > 100:
            message = message[:99] + "…"
        hint = f" — {f['hint']}" if f.get("hint") else ""
        text = f"{word}{when}: {cause}{line}" + (f": {message}" if message else "") + hint
        history = report.get("history") or {}
        same = history.get("same_failure")
        if same and same[0]:
            text += f" (same failure in {same[0]} of the last {same[1]} runs)"
        return text
    if o.get("failed"):
        code, sig = o.get("exit_code"), o.get("signal")
        if sig:
            what = f"killed by {sig}"
            if sig in ("SIGKILL", "KILL"):
                what += " (not asked for by gpudeck: the host OOM killer or someone's kill -9?)"
        elif code is None:
            what = "never ran"          # sbatch refused it, or its exec failed: the note says which
        else:
            what = f"exited with code {code}"
        note = o.get("note")
        if note:
            return f"{what}{when}; {note}"
        return f"{what}{when}; the log names no cause — see its last lines"
    if state == "log":
        return f"log ends in phase {o.get('final_phase') or 'unknown'}; no failure in it"
    return f"finished OK{when or ''}" + (f" (exit {o.get('exit_code')})" if o.get("exit_code") not in (None, 0) else "")


# -- the stack dumps a stall took by itself (gpudeck.jobs.health: StacksDumped / StacksFailed events) ----

# How much of each stored dump's grouped text a post-mortem carries (the whole file stays in the run dir).
DUMP_EXCERPT_LINES = 40


def stack_dumps(events: list[dict], stalls: list[dict], started: Optional[float],
                run_dir: Optional[Path] = None) -> list[dict]:
    """Each dump on the run's timeline, with the head of its grouped text (`lines`, the verdict line
    left out) where the run dir still holds it; the stall it was taken for gets its verdict (`stacks`) and
    when it was taken (`stacks_at_s`)."""
    from gpudeck.jobs.stacks import read_stored_dump
    dumps = []
    for ev in events:
        if ev.get("event") not in ("StacksDumped", "StacksFailed"):
            continue
        t = number(ev.get("t"))
        raw_path = ev.get("path")
        path = raw_path if isinstance(raw_path, str) else None
        entry = {"t": t, "at_s": round(t - started, 3) if t is not None and started is not None else None,
                 "code": ev.get("code"), "since": number(ev.get("since")),
                 "verdict": ev.get("verdict") if isinstance(ev.get("verdict"), str) else None,
                 "path": path,
                 "error": ev.get("error") if isinstance(ev.get("error"), str) else None}
        if run_dir is not None and path:
            try:
                stored = read_stored_dump(run_dir, path)
            except (OSError, ValueError):
                stored = None               # pruned or never written (a full disk): the event still says it
            if stored is not None:
                # The groups with their chains; each group's full frame list (indented 4) stays in the file.
                body = [line for line in stored.lines if not line.startswith(("verdict: ", "    "))]
                entry["lines"] = body[:DUMP_EXCERPT_LINES]
                entry["lines_left_out"] = max(0, len(body) - DUMP_EXCERPT_LINES)
                entry["simulated"] = stored.simulated
        dumps.append(entry)
        for stall in stalls:
            if entry["verdict"] and _took_it(stall, entry):
                stall["stacks"], stall["stacks_at_s"] = entry["verdict"], entry["at_s"]
    return dumps


def _took_it(stall: dict, dump: dict) -> bool:
    """Whether a stall has this dump: the one it was taken for, or another rule's stall under way when it was
    taken (stalled and nccl_hang on one stall share one dump, as the runner's alerts do)."""
    if stall.get("code") == dump["code"] and stall.get("start") == dump["since"]:
        return True
    start, end, t = number(stall.get("start")), number(stall.get("end")), dump["t"]
    return (stall.get("code") != dump["code"] and "stacks" not in stall and t is not None and start is not None
            and start <= t and (end is None or t <= end))
