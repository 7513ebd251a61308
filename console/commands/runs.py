"""`gpudeck runs [JOB] [--failed] [--since 2d] [--json]`, `--reindex`, `--prune`: the run history from the run index."""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional

from gpudeck.jobs import strictjson
from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.history.index import RunIndex
    from gpudeck.jobs.history.retention import PruneCandidate
    from gpudeck.jobs.hosts.config import HostSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runs", help="the run history: every run of every job, pipeline and pivot, newest first",
        description="List past and live runs from the run index (a SQLite file under the state dir, kept up "
                    "to date from the run directories). --prune deletes old runs: it lists what it would "
                    "delete and deletes only with --yes.")
    p.add_argument("job", nargs="?", metavar="JOB", help="only this job's (or pipeline/pivot target's) runs")
    p.add_argument("--failed", action="store_true", help="only runs that failed (crashed, non-zero exit, lost)")
    p.add_argument("--since", metavar="AGE", help="only runs started within AGE (e.g. 2d, 12h, 30m)")
    p.add_argument("-n", "--limit", type=int, metavar="N", help="at most N runs")
    p.add_argument("--json", action="store_true", help='print {"runs": [...]} as JSON')
    p.add_argument("--reindex", action="store_true", help="rebuild the index from the run directories")
    p.add_argument("--prune", action="store_true",
                   help="delete finished runs beyond --keep N per job (default: each job's log_keep) "
                        "and/or older than --older AGE; lists them first, deletes with --yes")
    p.add_argument("--keep", type=int, metavar="N", help="with --prune: keep the newest N runs of each job")
    p.add_argument("--older", metavar="AGE", help="with --prune: only runs started more than AGE ago (e.g. 30d)")
    p.add_argument("--yes", action="store_true", help="with --prune: delete without asking")
    p.set_defaults(handler=run_runs, remote_ok=True, mutates=lambda args: args.prune)


def _age(text: Optional[str], flag: str) -> Optional[float]:
    if text is None:
        return None
    from gpudeck.jobs.spec import parse_duration
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}", 2) from None
    if seconds <= 0:
        raise CliError(f"{flag}: must be more than 0", 2)
    return seconds


def open_index(sync: bool = True) -> "RunIndex":
    import sqlite3

    from gpudeck.jobs.history.index import IndexUnavailable, RunIndex
    index = RunIndex()
    try:
        if sync:
            index.sync()
        else:
            index.open()
    except IndexUnavailable as exc:          # locked, disk full, a symlink: its message names the file
        raise CliError(str(exc)) from None
    except sqlite3.Error as exc:
        raise CliError(f"run index {index.path}: {exc}") from None
    if index.rebuilt_reason:
        print(f"gpudeck: {index.rebuilt_reason}", file=sys.stderr)
    return index


def run_runs(args: argparse.Namespace) -> int:
    since = _age(args.since, "--since")
    older = _age(args.older, "--older")
    if (args.keep is not None or older is not None or args.yes) and not args.prune:
        raise CliError("--keep, --older and --yes go with --prune", 2)
    if args.keep is not None and args.keep < 0:
        raise CliError("--keep: must be 0 or more", 2)
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        if args.reindex or args.prune:
            return _upkeep_remote(args, spec, older)
        with Remote(spec) as remote:
            rows = remote.call("runs", {"job": args.job, "failed": args.failed, "limit": args.limit,
                                        "since": time.time() - since if since is not None else None,
                                        "columns": None if args.json else list(TABLE_COLUMNS)})["runs"]
        return _print_rows(args, rows)
    if args.reindex:
        from gpudeck.jobs.history.index import ReindexFailed, RunIndex, reindex
        index = RunIndex()
        try:
            count, seconds = reindex(index)
        except ReindexFailed as exc:
            raise CliError(str(exc)) from None
        print(f"reindexed {count} runs into {index.path} in {seconds:.2f}s")
        if not args.prune:
            return 0
    else:
        index = open_index()
    from gpudeck.jobs.history.index import COLUMN_NAMES
    with index:
        if args.prune:
            return _prune(args, index, older)
        rows = index.query(job=args.job, failed=args.failed,
                           since=time.time() - since if since is not None else None, limit=args.limit,
                           columns=COLUMN_NAMES if args.json else TABLE_COLUMNS)
    return _print_rows(args, rows)


def _upkeep_remote(args: argparse.Namespace, spec: "HostSpec", older: Optional[float]) -> int:
    """--reindex / --prune on the box's own run index (its runs, its jobs file's log_keep), printed here."""
    from gpudeck.console.commands._host import Remote
    from gpudeck.jobs.history.retention import PruneCandidate
    with Remote(spec) as remote:
        if args.reindex:
            done = remote.call("runs_reindex")
            print(f"reindexed {done['count']} runs into {spec.name}:{done['path']} in {done['seconds']:.2f}s")
            if not args.prune:
                return 0
        params = {"job": args.job, "keep": args.keep, "older_s": older, "yes": bool(args.yes)}
        # Only a deletion changes the box: sent once, never re-sent after a lost answer.
        reply = remote.action("runs_prune", params) if args.yes else remote.call("runs_prune", params)
    candidates = [PruneCandidate(**c) for c in reply["candidates"]]
    if args.json and not args.yes:
        print(strictjson.dumps({"would_delete": [c.to_json() for c in candidates], "host": spec.name}, indent=1))
        return 0
    return _print_prune(args, candidates, reply.get("removed"))


def _print_rows(args: argparse.Namespace, rows: list) -> int:
    if args.json:
        print(strictjson.dumps({"runs": rows}, indent=1, default=str))
        return 0
    if not rows:
        print("no runs" + (f" of {args.job}" if args.job else "") + (" that failed" if args.failed else ""))
        return 0
    sys.stdout.write(render_table(rows))
    # A run file that could not be read cost its run a note ("run <id>: summary.json unreadable: ..."):
    # said once, on stderr, so the table stays a table. --json carries them in each row's detail.
    from gpudeck.jobs.logs.sanitize import terminal_text
    for row in rows:
        detail = row.get("detail") if isinstance(row.get("detail"), dict) else {}
        for note in (detail.get("notes") or [])[:5]:
            print(f"gpudeck: {terminal_text(str(note), 300)}", file=sys.stderr)
    return 0


def _outcome(row: dict) -> str:
    if row["kind"] != "job":
        return row.get("state") or "-"
    state = row.get("state") or "-"
    if state in ("exited", "stopped"):
        parts = []
        if row.get("signal"):
            parts.append(str(row["signal"]))
        elif row.get("exit_code") is not None:
            parts.append(f"exit {row['exit_code']}")
        if state == "stopped":
            parts.append("stopped")
        if not parts and row.get("failure_cause") == "not_submitted":
            return "not submitted"
        return " ".join(parts) or state
    return state


LOAD_PHASES = ("loading", "compiling", "capturing")


def _load(row: dict, human_age: Callable[[float], str]) -> str:
    """Start to ready; a run that never became ready shows the time it spent loading, marked ✗ (died or
    stopped before ready) or … (still at it)."""
    if row.get("load_s") is not None:
        return human_age(row["load_s"])
    raw = row.get("phases")
    phases: dict = raw if isinstance(raw, dict) else {}
    spent = [v for k, v in phases.items() if k in LOAD_PHASES and isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not spent:
        return "-"
    live = row.get("state") in ("running", "starting", "stopping")
    return human_age(sum(spent)) + ("…" if live else "✗")


def _why(row: dict) -> str:
    if row.get("failure_cause"):
        text = row["failure_cause"]
        if row.get("failure_line"):
            text += f" (line {row['failure_line']})"
        return text
    if row.get("stopped_by"):
        from gpudeck.jobs.history.index import stopper
        return f"stopped by {stopper(row['stopped_by'])}"
    if row.get("pivot"):
        return row["pivot"]
    alerts = [a for a in row.get("alerts") or [] if a != "crashed"]
    return ", ".join(alerts) if alerts else "-"


# What the table shows (the JSON has every column); fewer columns and no JSON to decode keep 10,000 rows fast.
TABLE_COLUMNS = ("run_id", "job", "kind", "started_at", "duration_s", "state", "exit_code", "signal", "final_phase",
                 "load_s", "phases", "peak_gpu_mem_max", "gpu_count", "failure_cause", "failure_line", "stopped_by",
                 "pivot", "alerts", "host", "backend", "failed", "detail")


def render_table(rows: list[dict], now: Optional[float] = None) -> str:
    from gpudeck.console.format import human_age, human_bytes, safe_text
    now = time.time() if now is None else now
    cleaned: dict = {}

    def cell(value: Optional[str], limit: int) -> str:
        # Job text goes through the sanitizer; most rows repeat the same few hosts and causes.
        key = (value, limit)
        if key not in cleaned:
            cleaned[key] = safe_text(value, limit)
        return cleaned[key]
    table = [("RUN", "JOB", "KIND", "STARTED", "TOOK", "RESULT", "PHASE", "LOAD", "PEAK GPU", "WHY", "HOST")]
    for row in rows:
        started = row.get("started_at")
        took = row.get("duration_s")
        if took is None and started is not None and row.get("state") in ("running", "starting", "stopping"):
            took = now - started
        phase = row.get("final_phase")
        peak = row.get("peak_gpu_mem_max")
        peak_text = human_bytes(peak) if peak is not None else "-"
        if (row.get("gpu_count") or 0) > 1:
            peak_text += f" x{row['gpu_count']}"
        table.append((
            ("✗ " if row.get("failed") else "  ") + str(row.get("run_id")),
            cell(row.get("job"), 40), row.get("kind") or "-",
            f"{human_age(now - started)} ago" if started else "-",
            human_age(took) if took is not None else "-",
            _outcome(row), phase if phase is not None and phase != "unknown" else "-",
            _load(row, human_age),
            peak_text, cell(_why(row), 60), cell(row.get("host") or "-", 24)
            + ("" if (row.get("backend") or "local") == "local" else f" ({row['backend']})"),
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in table)


def _log_keep_lookup(args: argparse.Namespace) -> Callable[[str], Optional[int]]:
    """Each job's log_keep from the jobs file when there is one (else 20, the default)."""
    from gpudeck.jobs.paths import find_jobs_file
    from gpudeck.jobs.spec import JobSpec
    default: int = JobSpec.log_keep                     # the dataclass default, read off the class
    jobs = {}
    path = find_jobs_file(getattr(args, "jobs_file", None))
    if path is not None and path.is_file():
        from gpudeck.jobs.spec import SpecError, load_jobs
        try:
            jobs = load_jobs(path).jobs
        except SpecError:
            jobs = {}
    return lambda job: jobs[job].log_keep if job in jobs else default


def _prune(args: argparse.Namespace, index: "RunIndex", older: Optional[float]) -> int:
    from gpudeck.jobs.history.retention import plan_prune, prune
    keep_for = _log_keep_lookup(args)
    candidates = plan_prune(index, keep=args.keep, older_s=older, job=args.job,
                            keep_for=keep_for if args.keep is None and older is None else (lambda job: None))
    if args.json and not args.yes:
        print(strictjson.dumps({"would_delete": [c.to_json() for c in candidates]}, indent=1))
        return 0
    return _print_prune(args, candidates, None, lambda: prune(index, candidates))


def _print_prune(args: argparse.Namespace, candidates: list, removed_count: Optional[int],
                 delete: Optional[Callable[[], list["PruneCandidate"]]] = None) -> int:
    """The prune listing and outcome, the same here and over SSH (there the box deleted; `removed_count`)."""
    from gpudeck.console.format import human_bytes
    if not candidates:
        print("nothing to prune")
        return 0
    total = sum(c.size_bytes for c in candidates)
    verb = "deleting" if args.yes else "would delete"
    print(f"{verb} {len(candidates)} runs ({human_bytes(total)}):")
    for c in candidates:
        print(f"  {c.job}/{c.run_id}  {c.state}  {human_bytes(c.size_bytes)}  {c.why}")
    if not args.yes:
        print("dry run: nothing deleted; add --yes to delete them")
        return 0
    removed = len(delete()) if delete is not None else int(removed_count or 0)
    print(f"deleted {removed} runs" + (f" ({len(candidates) - removed} were live again and kept)"
                                       if removed != len(candidates) else ""))
    return 0
