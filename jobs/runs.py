"""Run directories on disk (stdlib only): one per start of a job — metadata, raw output, arrival times, exit, events, samples.

Layout: <state_dir>/runs/<job>/<run_id>/
    meta.json      job, spec snapshot, command, env (declared part), host, cwd, created_at,
                   runner {pid,start}, job {pid,start}, pgid, started_at
    output.log     stdout+stderr of the job, byte for byte (\\r and all)
    times          arrival index: lines "OFFSET UNIX_SECOND" — bytes before OFFSET had arrived by then
    exit.json      exit_code | signal, ended_at, stopped_by_request, leftovers
    events.jsonl   one JSON object per line: {"t", "event", ...} (JobStarted, StopRequested, ...)
    samples.jsonl  resource timeline of the job's process tree, about one line a second

Everything here is derived from files, never from memory: any process can read a
run's state, and a restarted console re-attaches by reading these files.

The state dir is trusted only when it is provably the user's own: directories are
created 0700 and files 0600 whatever the umask (meta.json holds the job's env,
tokens included), a state/run directory owned by someone else or writable by
group/others is refused (UnsafeStateDir), and every write opens its file with
O_NOFOLLOW so a planted symlink cannot redirect it. Every read of a run's files goes
through strictjson's bounded loader (read_json, read_jsonl, read_times): no symlink,
FIFO or giant file is read, nesting and non-finite numbers are refused, and a bad
file costs its run a note, never the reader.
"""
from __future__ import annotations

import bisect
import calendar
import os
import re
import secrets
import shutil
import stat as _stat
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypedDict

from gpudeck.jobs import paths, strictjson
from gpudeck.jobs.paths import UnsafeStateDir
from gpudeck.jobs.procs import ProcessId, is_alive

META = "meta.json"
OUTPUT = "output.log"
TIMES = "times"
EXIT = "exit.json"
EVENTS = "events.jsonl"
SAMPLES = "samples.jsonl"
IDS = "ids.json"                # runner, job_process, pgid, created_at, started_at, sessions, cgroup
HOOKS = "hooks.jsonl"           # on_alert hooks fired: {"pid", "start", "t", "code"} — outside the job

# A run whose runner has not written its pid after this long never started.
STARTING_GRACE_S = 15.0

_RUN_ID = re.compile(r"^\d{8}-\d{6}-\d{3}[0-9a-f]{2}$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def check_private_dir(path: Path, *, follow: bool = False) -> bool:
    """Raise UnsafeStateDir unless `path` (if it exists) is a directory of ours that only we can write.

    False if it does not exist. Below the state dir's root a symlink is refused
    (`follow=False`): swapping a run dir for a link is how another user's files would be read.
    """
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return False
    if _stat.S_ISLNK(st.st_mode):
        raise UnsafeStateDir(f"{path} is a symlink: refusing to use it as a gpudeck state directory")
    if not _stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeStateDir(f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): "
                             f"refusing to use it")
    if st.st_mode & 0o022:
        raise UnsafeStateDir(f"{path} is writable by group or others (mode {st.st_mode & 0o777:o}): "
                             f"refusing to use it; chmod 700 it if it is yours")
    return True


def ensure_private_dir(path: Path, *, follow: bool = False) -> Path:
    """Create `path` 0700 (whatever the umask) if missing; verify it either way."""
    if not check_private_dir(path, follow=follow):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, PRIVATE_DIR_MODE)
            os.chmod(path, PRIVATE_DIR_MODE)        # the umask may have taken bits away
        except FileExistsError:
            pass                                    # a concurrent creator: verified below
        check_private_dir(path, follow=follow)
    return path


def open_private(path: Path, flags: int) -> int:
    """os.open for the state dir: never through a symlink, created 0600 whatever the umask."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    if flags & os.O_CREAT:
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o777 != PRIVATE_FILE_MODE:
                os.fchmod(fd, PRIVATE_FILE_MODE)
        except OSError:
            pass
    return fd


def state_root(state_dir: Optional[Path] = None) -> Path:
    """The state dir, verified (and created) private. The root itself may be a symlink the user made."""
    return ensure_private_dir(state_dir or paths.state_dir(), follow=True)


def runs_root(state_dir: Optional[Path] = None) -> Path:
    return (state_dir or paths.state_dir()) / "runs"


def _created_runs_root(state_dir: Optional[Path]) -> Path:
    """The runs/ directory, created private with the state dir above it."""
    return ensure_private_dir(runs_root(state_root(state_dir or paths.state_dir())))


def _verified_runs_root(state_dir: Optional[Path]) -> Optional[Path]:
    """The runs/ directory if it exists and is provably ours (None if missing); never created."""
    root = state_dir or paths.state_dir()
    if not check_private_dir(root, follow=True) or not check_private_dir(runs_root(root)):
        return None
    return runs_root(root)


def new_run_id(now: Optional[float] = None, after: Optional[str] = None) -> str:
    """Sortable by creation time to the millisecond, in UTC: 20261129-234501-123ab.

    UTC, not local time: a TZ change or a DST fall-back must not sort a new run
    before an older one. `after` (the newest id already there) makes the order a
    monotonic sequence even if the wall clock steps back: the new id is then that
    one's millisecond plus one.
    """
    ms = int((time.time() if now is None else now) * 1000)
    if after is not None and _RUN_ID.match(after):
        try:
            prev_ms = calendar.timegm(time.strptime(after[:15], "%Y%m%d-%H%M%S")) * 1000 + int(after[16:19])
        except (ValueError, OverflowError):
            prev_ms = None
        if prev_ms is not None and ms <= prev_ms:
            ms = prev_ms + 1
    whole, millis = divmod(ms, 1000)
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(whole))}-{millis:03d}{secrets.token_hex(1)}"


def json_file_text(data: Any) -> str:
    """A run file's text as write_json_atomic writes it (strict, indented, ASCII: its len is its size)."""
    return strictjson.dumps(data, indent=1, sort_keys=True, default=str) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    # Readers (other CLIs, the console) must never see half a file: write, then rename.
    # O_EXCL|O_NOFOLLOW: a planted tmp symlink is never written through (rename replaces a link, not its target).
    text = json_file_text(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        os.unlink(tmp)           # left by a killed writer with this pid (or planted): never followed
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with open(fd, "w", encoding="utf-8", closefd=True) as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path, notes: Optional[list] = None) -> Optional[dict]:
    """A run's JSON file as a dict, or None (missing, or unreadable: then a note in `notes`).

    Through the strict, bounded loader (strictjson.load_object): no symlink, FIFO or giant file is
    read, no nesting past 64, no Infinity/NaN, no absurd time (top-level "*_at" keys); summary.json
    has its own, larger cap.
    """
    cap = strictjson.MAX_SUMMARY_BYTES if Path(path).name == "summary.json" else strictjson.MAX_FILE_BYTES
    return strictjson.load_object(path, max_bytes=cap, notes=notes, shape=strictjson.timed)


def append_jsonl(path: Path, record: dict) -> None:
    # One write() of one line on an O_APPEND fd: concurrent writers (runner,
    # supervisor, stall rules) never interleave inside a line.
    line = (strictjson.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_jsonl(path: Path, notes: Optional[list] = None) -> list[dict]:
    """A run's JSONL file (events, samples, hooks): its records, bad lines skipped (counted in `notes`).

    A time ("t", "*_at") that is not a sane unix time reads as None (strictjson.timed): no reader dates 1e308.
    """
    return strictjson.load_jsonl(path, notes=notes, shape=strictjson.timed)


MAX_TIMES_BYTES = 256 << 20            # `times`: ~20 bytes a second; 256 MiB is a year of one run


def read_times(path: Path, notes: Optional[list] = None) -> list[tuple[int, float]]:
    """The arrival points of `times` ("OFFSET UNIX_SECOND" lines) in file order: offsets that are
    non-negative ints, times that are sane unix times (`100 inf`, `-1 5`, `1e999 7` are skipped)."""
    try:
        raw = strictjson.read_run_bytes(path, MAX_TIMES_BYTES)
    except FileNotFoundError:
        return []
    except strictjson.Unreadable as exc:
        if notes is not None:
            notes.append(str(exc))
        return []
    points: list[tuple[int, float]] = []
    bad = 0
    for line in raw.split(b"\n"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or len(parts[0]) > 20:
            bad += 1
            continue
        try:
            offset, t = int(parts[0]), strictjson.timestamp(float(parts[1]))
        except ValueError:
            bad += 1
            continue
        if t is None or not 0 <= offset < 2 ** 63:
            bad += 1
            continue
        points.append((offset, t))
    if bad > 1 and notes is not None:        # one bad line is the torn last one of a killed runner
        notes.append(f"times: {bad} unreadable lines skipped")
    return points


def _timestamp(value: Any) -> Optional[float]:
    """A timestamp from meta.json or exit.json; None when missing or corrupt (hand-edited, torn)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# What `stop` needs to find and prove the run's processes, kept in meta.json and ids.json both.
ID_FIELDS = ("runner", "job_process", "pgid", "created_at", "started_at")


def _valid_id_field(key: str, value: Any) -> bool:
    if key in ("runner", "job_process"):
        return ProcessId.from_jsonable(value) is not None
    if key == "pgid":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    return _timestamp(value) is not None


def _number(value: Any) -> float:
    return _timestamp(value) or 0.0


@dataclass(frozen=True)
class RunState:
    """What a run is doing now, derived from its files and /proc."""

    state: str                      # starting | running | stopping | exited | stopped | lost
    job_pid: Optional[int] = None
    pgid: Optional[int] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    runner_alive: bool = False
    job_alive: bool = False


class _StateCommon(TypedDict):
    """The fields of RunState that every state of a run shares (Run.state reads them once)."""

    job_pid: Optional[int]
    pgid: Optional[int]
    started_at: Optional[float]
    runner_alive: bool
    job_alive: bool


class Run:
    """One run directory. Cheap to construct; every property reads the disk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def job(self) -> str:
        return self.path.parent.name

    # -- files -----------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        return self.path / META

    @property
    def log_path(self) -> Path:
        return self.path / OUTPUT

    @property
    def ids_path(self) -> Path:
        return self.path / IDS

    @property
    def times_path(self) -> Path:
        return self.path / TIMES

    @property
    def exit_path(self) -> Path:
        return self.path / EXIT

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES

    def meta(self) -> dict:
        """meta.json; the identifiers needed to stop the run fall back to ids.json where meta.json
        lost them (corrupt, torn, hand-edited): a broken meta.json never makes a live run `lost`."""
        data = read_json(self.meta_path) or {}
        if any(not _valid_id_field(key, data.get(key)) for key in ID_FIELDS):
            ids = self.ids()
            for key in ID_FIELDS:
                if not _valid_id_field(key, data.get(key)) and _valid_id_field(key, ids.get(key)):
                    data[key] = ids[key]
        return data

    def update_meta(self, **fields: Any) -> dict:
        data = self.meta()
        data.update(fields)
        write_json_atomic(self.meta_path, data)
        return data

    def ids(self) -> dict:
        """ids.json: the second, small, atomic record of what identifies the run's processes."""
        return read_json(self.ids_path) or {}

    def update_ids(self, **fields: Any) -> dict:
        data = self.ids()
        data.update(fields)
        write_json_atomic(self.ids_path, data)
        return data

    def exit_record(self) -> Optional[dict]:
        return read_json(self.exit_path)

    def write_exit(self, record: dict) -> None:
        write_json_atomic(self.exit_path, record)

    def events(self) -> list[dict]:
        return read_jsonl(self.events_path)

    def add_event(self, event: str, **fields: Any) -> dict:
        record = {"t": round(time.time(), 3), "event": event, **fields}
        append_jsonl(self.events_path, record)
        return record

    def samples(self) -> list[dict]:
        return read_jsonl(self.samples_path)

    def hook_sessions(self) -> dict[int, int]:
        """{session id: start} of the on_alert hooks this run fired (hooks.jsonl): not part of the job."""
        found = {}
        for rec in read_jsonl(self.path / HOOKS):
            pid, start = rec.get("pid"), rec.get("start")
            if isinstance(pid, int) and isinstance(start, int):
                found[pid] = start
        return found

    def without_hooks(self, stats: list) -> list:
        """`stats` (ProcStats) less the processes of this run's alert hooks (their own sessions)."""
        hooks = self.hook_sessions()
        if not hooks:
            return stats
        return [st for st in stats if not (st.session in hooks and st.start >= hooks[st.session])]

    def stop_requested(self) -> bool:
        return any(e.get("event") == "StopRequested" for e in self.events())

    # -- identities ------------------------------------------------------
    def runner_id(self) -> Optional[ProcessId]:
        return ProcessId.from_jsonable(self.meta().get("runner"))

    def job_id(self) -> Optional[ProcessId]:
        return ProcessId.from_jsonable(self.meta().get("job_process"))

    # -- arrival times ---------------------------------------------------
    def arrival_index(self) -> "ArrivalIndex":
        return ArrivalIndex.load(self.times_path)

    # -- state -----------------------------------------------------------
    def state(self, now: Optional[float] = None) -> RunState:
        now = time.time() if now is None else now
        meta = self.meta()
        runner = ProcessId.from_jsonable(meta.get("runner"))
        job = ProcessId.from_jsonable(meta.get("job_process"))
        runner_alive = runner is not None and is_alive(runner.pid, runner.start)
        job_alive = job is not None and is_alive(job.pid, job.start)
        common = _StateCommon(job_pid=job.pid if job else None, pgid=meta.get("pgid"),
                              started_at=_timestamp(meta.get("started_at")) or _timestamp(meta.get("created_at")),
                              runner_alive=runner_alive, job_alive=job_alive)
        record = self.exit_record()
        if meta.get("backend") == "slurm" and record is None:
            return self._slurm_state(meta, now, common)
        if record is not None:
            state = "stopped" if record.get("stopped_by_request") else "exited"
            return RunState(state=state, ended_at=_timestamp(record.get("ended_at")),
                            exit_code=record.get("exit_code"), signal=record.get("signal"), **common)
        if runner_alive or job_alive:
            # A job whose runner was killed still runs (its output still reaches
            # the log): it is running, unsupervised, not lost.
            if self.stop_requested():
                return RunState(state="stopping", **common)
            return RunState(state="running" if job is not None else "starting", **common)
        if runner is None and job is None and now - _number(meta.get("created_at")) < STARTING_GRACE_S:
            return RunState(state="starting", **common)
        return RunState(state="lost", **common)


    def _slurm_state(self, meta: dict, now: float, common: _StateCommon) -> RunState:
        """A Slurm run not yet ended: its watcher's last reading (slurm.json), queued -> starting."""
        live = read_json(self.path / "slurm.json") or {}
        slurm_state = live.get("state")
        queued = slurm_state in (None, "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                 "RESV_DEL_HOLD", "SUSPENDED", "STOPPED")
        polled = _number(live.get("polled_at"))
        # Alive: the watcher runs, or Slurm was read moments ago (by a reader that re-attached).
        if common["runner_alive"] or now - polled < 30 or now - _number(meta.get("created_at")) < STARTING_GRACE_S:
            if self.stop_requested():
                return RunState(state="stopping", **common)
            return RunState(state="starting" if queued else "running", **common)
        return RunState(state="lost", **common)


@dataclass(frozen=True)
class ArrivalIndex:
    """Maps a byte offset of output.log to the unix second it arrived (to the second)."""

    offsets: tuple[int, ...]
    times: tuple[float, ...]

    @classmethod
    def load(cls, path: Path) -> "ArrivalIndex":
        points = read_times(path)
        return cls(tuple(o for o, _ in points), tuple(t for _, t in points))

    def time_of(self, offset: int) -> Optional[float]:
        """When the byte at `offset` had arrived: the first entry whose offset is past it."""
        i = bisect.bisect_right(self.offsets, offset)
        return self.times[i] if i < len(self.times) else None


# -- listing -------------------------------------------------------------

def job_dir(job: str, state_dir: Optional[Path] = None) -> Path:
    if not _JOB_NAME.match(job):
        raise ValueError(f"job name not usable as a directory: {job!r}")
    return runs_root(state_dir) / job


def ensure_job_dir(job: str, state_dir: Optional[Path] = None) -> Path:
    """The job's directory of runs, created 0700 with the state dir above it, every level verified ours."""
    job_dir(job, state_dir)                     # validates the name
    return ensure_private_dir(_created_runs_root(state_dir) / job)


def create_run(job: str, state_dir: Optional[Path] = None) -> Run:
    parent = ensure_job_dir(job, state_dir)
    existing = list_runs(job, state_dir)
    newest = existing[-1].run_id if existing else None
    for _ in range(20):
        path = parent / new_run_id(after=newest)
        try:
            os.mkdir(path, PRIVATE_DIR_MODE)
            os.chmod(path, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue
        return Run(path)
    raise RuntimeError(f"could not create a run directory under {parent}")


def list_runs(job: str, state_dir: Optional[Path] = None) -> list[Run]:
    """Runs of a job, oldest first. Raises UnsafeStateDir if any level is not provably ours."""
    try:
        parent = job_dir(job, state_dir)
    except ValueError:
        return []
    if _verified_runs_root(state_dir) is None or not check_private_dir(parent):
        return []
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    runs = []
    for n in sorted(names):
        try:
            if _RUN_ID.match(n) and check_private_dir(parent / n):
                runs.append(Run(parent / n))
        except NotADirectoryError:
            continue
    return runs


LIVE_RUN_STATES = ("starting", "running", "stopping")


def latest_run(job: str, state_dir: Optional[Path] = None) -> Optional[Run]:
    """The job's current run: the newest one that is live, else the newest one.

    A live run is never hidden by a newer-named one (ids written by an older
    version in local time, a clock set back): `stop` finds it and `start` refuses.
    Only runs without exit.json can be live, so this costs a stat per run.
    """
    runs = list_runs(job, state_dir)
    for run in reversed(runs):
        if not run.exit_path.exists() and run.state().state in LIVE_RUN_STATES:
            return run
    return runs[-1] if runs else None


def find_run(job: str, run_id: str, state_dir: Optional[Path] = None) -> Optional[Run]:
    """A run by exact id or by a unique prefix/suffix of it."""
    runs = list_runs(job, state_dir)
    exact = [r for r in runs if r.run_id == run_id]
    if exact:
        return exact[0]
    partial = [r for r in runs if r.run_id.startswith(run_id) or r.run_id.endswith(run_id)]
    return partial[0] if len(partial) == 1 else None


def known_jobs(state_dir: Optional[Path] = None) -> list[str]:
    try:
        root = _verified_runs_root(state_dir)
        return sorted(n for n in os.listdir(root) if _JOB_NAME.match(n)) if root is not None else []
    except OSError:
        return []


def iter_all_runs(state_dir: Optional[Path] = None) -> Iterator[Run]:
    for job in known_jobs(state_dir):
        yield from list_runs(job, state_dir)


def prune_runs(job: str, keep: int, state_dir: Optional[Path] = None) -> list[Run]:
    """Delete the oldest finished runs beyond `keep` (log_keep). Live runs are never deleted."""
    if keep <= 0:
        return []
    runs = list_runs(job, state_dir)
    removed = []
    for run in runs[:-keep] if len(runs) > keep else []:
        if run.exit_record() is None and run.state().state not in ("lost",):
            continue
        from gpudeck.jobs import cgroups
        cgroup = run.ids().get("cgroup")
        if cgroups.is_run_cgroup(cgroup, run.run_id) and not cgroups.members(cgroup):
            cgroups.remove(cgroup)
        shutil.rmtree(run.path, ignore_errors=True)
        removed.append(run)
    return removed


def detach() -> None:
    """Fork once more so the process that started us (the supervisor's Popen, the Slurm launcher) can reap its child at once."""
    if os.fork() > 0:
        os._exit(0)


def _record_crash(owner: Any, error: str) -> None:
    owner.run.add_event("RunnerFailed", error=error)


def run_dir_main(argv: Optional[list[str]], prog: str, make: Callable[[str], Any], *, dir_name: str = "RUN_DIR",
                 on_crash: Callable[[Any, str], None] = _record_crash) -> int:
    """`python -m PROG [--detach] DIR`, the entry of the runner, the Slurm watcher and the pipeline runner:
    `make(DIR).main()`, whose crash is printed and kept in its directory (`on_crash`; a RunnerFailed event)."""
    args = list(sys.argv[1:] if argv is None else argv)
    do_detach = "--detach" in args
    args = [a for a in args if a != "--detach"]
    if len(args) != 1:
        print(f"usage: python -m {prog} [--detach] {dir_name}", file=sys.stderr)
        return 2
    if do_detach:
        detach()
    owner = make(args[0])
    try:
        return owner.main()
    except Exception:
        traceback.print_exc()
        try:
            on_crash(owner, traceback.format_exc(limit=8))
        except OSError:
            pass
        return 1
