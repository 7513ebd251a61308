"""Replays recorded run directories: what the live path showed of each run at any recorded instant (no Textual, no Rich).

A run directory holds everything the live console saw: output.log with its `times`
arrival index, samples.jsonl, events.jsonl (alerts raised and cleared), exit.json and
meta.json. `RunReplay.frame(t)` rebuilds, for an instant t, the `jobs --json` record of
the job (state, phase, progress, alerts, serving numbers), how many log bytes had
arrived, and the latest resource sample — so a face can push it through the same
render path as live data. `ReplaySession` puts several runs on one clock with speed,
pause, seek and jump-to-next-event, the way a player does.

The log analyzer runs forward only, fed the bytes that arrived between two recorded
instants with their arrival time (as the runner's monitor fed it). Going back restores
the nearest earlier checkpoint of its state and feeds forward from there, so no tick
ever re-reads the log from the start.
"""
from __future__ import annotations

import bisect
import copy
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from gpudeck.jobs.health import as_dict, make_analyzer, read_health
from gpudeck.jobs import strictjson
from gpudeck.jobs.paths import open_regular
from gpudeck.jobs.runs import EVENTS, EXIT, META, OUTPUT, SAMPLES, TIMES, read_json, read_jsonl, read_times

# A checkpoint of the analyzer's state every this many log bytes: a seek back re-reads at most
# this much (~70 ms at the analyzer's 55 MB/s on serving logs); a 1 GB log keeps ~256 small ones.
CHECKPOINT_BYTES = 4 * 1024 * 1024
# ...and at least one every this many recorded seconds, so a seek back in a slow log is cheap too.
CHECKPOINT_SECONDS = 600.0
# One read of the log is at most this big (the runner's monitor reads at most 8 MiB a tick too).
READ_CHUNK = 8 * 1024 * 1024
SPEEDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
SEEK_STEP_S = 60.0

# events.jsonl entries worth jumping to, in words.
EVENT_WORDS = {
    "JobStarted": "started",
    "JobNotStarted": "not started",
    "JobFailedToStart": "failed to start",
    "StopRequested": "stop requested",
    "StopEscalated": "stop escalated to SIGKILL",
    "StopVerified": "stop verified",
    "LeftoversFound": "leftover processes found",
    "PivotRequested": "pivot requested",
    "PivotStarted": "pivot started",
    "PivotCompleted": "pivot completed",
    "PivotFailed": "pivot failed",
}


class ReplayError(Exception):
    """A path that is not a replayable run (one line for the faces)."""


def _number(value: Any) -> Optional[float]:
    """A recorded unix time, or None: a tampered `1e308` or `-5` would overflow every clock and date."""
    return strictjson.timestamp(value)


@dataclass(frozen=True)
class Mark:
    """Something worth jumping to: an event of the run or an alert raised/cleared."""

    t: float
    job: str
    kind: str            # "event" | "alert" | "cleared" | "exit" | "stacks"
    label: str
    code: Optional[str] = None


@dataclass(frozen=True)
class RunFrame:
    """One run at one recorded instant, as the live path showed it."""

    t: float
    job: dict                          # the `jobs --json` record as it was at t (plus replay: True)
    log_path: Path
    log_bytes: int                     # how much of output.log had arrived by t
    engine: Optional[tuple]            # (engine, model, port) for an engine job, else None


class Recording:
    """The files of one run directory, read once: meta, arrival points, samples, events, exit."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise ReplayError(f"{self.path}: no such run directory")
        # Files that are there but unreadable (tampered, torn, too deep): a note each, never a crash.
        self.notes: list[str] = []
        self.meta = read_json(self.path / META, self.notes) or {}
        if not self.meta and not (self.path / OUTPUT).exists():
            raise ReplayError(f"{self.path}: not a run directory (no meta.json, no output.log)")
        spec = self.meta.get("spec")
        self.spec: dict = spec if isinstance(spec, dict) else {}
        self.job = str(self.meta.get("job") or self.path.parent.name)
        self.run_id = str(self.meta.get("run_id") or self.path.name)
        self.log_path = self.path / OUTPUT
        self.exit = read_json(self.path / EXIT, self.notes)
        self.health = read_health(self.path, self.notes)
        self.simulated = bool(self.meta.get("simulated"))
        self.events = sorted((e for e in read_jsonl(self.path / EVENTS, self.notes) if _number(e.get("t")) is not None),
                             key=lambda e: e["t"])
        # samples.jsonl is the big file (a day of 1 s samples is ~30 MB of JSON): only its two ends are
        # read here; the samples themselves load on first use (sample_at), not to open a replay.
        self._samples: Optional[list[dict]] = None
        self._sample_times: list[float] = []
        self._samples_lock = threading.Lock()
        self.first_sample_t, self.last_sample_t = self._sample_bounds()
        self.created_at = _number(self.meta.get("created_at"))
        started = _number(self.meta.get("started_at"))
        for e in self.events:
            if e.get("event") == "JobStarted":
                started = float(e["t"]) if started is None else min(started, float(e["t"]))
                break
        self.started_at = started
        self.ended_at = _number((self.exit or {}).get("ended_at"))
        self._alert_events: Optional[list[dict]] = None
        self._alert_times: list[float] = []
        self.stop_requested_at = next((float(e["t"]) for e in self.events if e.get("event") == "StopRequested"), None)
        self._load_points()
        times = [t for t in (self.created_at, self.started_at, self.ended_at) if t is not None]
        times += [t for t in (self.point_times[:1] + self.point_times[-1:]) if t is not None]
        times += [t for t in (self.first_sample_t, self.last_sample_t) if t is not None]
        times += [float(self.events[0]["t"]), float(self.events[-1]["t"])] if self.events else []
        if not times:
            try:
                times = [self.log_path.stat().st_mtime]
            except OSError as exc:
                raise ReplayError(f"{self.path}: nothing recorded with a time (no meta, times, samples or events)") from exc
        self.start = min(times)
        self.end = max(times)
        self.marks = self._marks()

    def _load_points(self) -> None:
        """(time, offset) arrival points, from `times` (to the second) and the samples' log_bytes (to the ms)."""
        # Through read_times: `100 inf`, a negative offset or a 400-digit one are skipped, never dated.
        raw: list[tuple[float, int]] = [(t, off) for off, t in read_times(self.path / TIMES, self.notes)]
        if not raw:
            # No `times` file (an older or killed runner): the samples note the log's size each second too.
            for s in self.samples:
                size = s.get("log_bytes")
                if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                    raw.append((float(s["t"]), size))
        try:
            self.log_size = self.log_path.stat().st_size
        except OSError:
            self.log_size = 0
        raw.sort()
        times: list[float] = []
        offsets: list[int] = []
        high = 0
        for t, off in raw:
            off = min(off, self.log_size)
            if off <= high:
                continue                          # offsets only grow; a point that adds nothing is dropped
            high = off
            times.append(t)
            offsets.append(off)
        if high < self.log_size:
            # Bytes no index covers (no `times` at all, or the runner died before noting them):
            # shown from the first instant without an index, else at the run's end.
            when = self.ended_at if (times and self.ended_at is not None) else None
            if when is None:
                candidates = [t for t in (self.started_at, self.created_at) if t is not None]
                when = times[-1] if times else (min(candidates) if candidates else None)
            if when is None:
                when = self.last_sample_t or 0.0
            times.append(max(when, times[-1]) if times else when)
            offsets.append(self.log_size)
        self.point_times = times
        self.point_offsets = offsets

    def _marks(self) -> list[Mark]:
        marks: list[Mark] = []
        for e in self.events:
            name = e.get("event")
            t = float(e["t"])
            if name == "AlertRaised":
                code = str(e.get("code") or "alert")
                marks.append(Mark(t, self.job, "alert", f"{code}: {e.get('message') or ''}".strip(), code))
            elif name == "AlertCleared":
                code = str(e.get("code") or "alert")
                marks.append(Mark(t, self.job, "cleared", f"{code} cleared", code))
            elif name == "StacksDumped" and e.get("verdict"):
                marks.append(Mark(t, self.job, "stacks", f"stacks: {e['verdict']}", str(e.get("code") or "") or None))
            elif name == "JobExited":
                marks.append(Mark(t, self.job, "exit", exit_words(e)))
            elif name in EVENT_WORDS or (isinstance(name, str) and name.startswith("Pivot")):
                marks.append(Mark(t, self.job, "event", EVENT_WORDS.get(name, name)))
        return marks

    # -- at an instant ------------------------------------------------------------------
    def offset_at(self, t: float) -> int:
        i = bisect.bisect_right(self.point_times, t)
        return self.point_offsets[i - 1] if i else 0

    def _sample_bounds(self) -> tuple[Optional[float], Optional[float]]:
        """The first and the last sample's time, read from the two ends of samples.jsonl."""
        try:
            with strictjson.open_run_binary(self.path / SAMPLES) as fh:
                head = fh.readline(strictjson.MAX_LINE_BYTES + 1)
                size = fh.seek(0, 2)
                fh.seek(max(0, size - 64 * 1024))
                tail = fh.read(64 * 1024).splitlines()
        except (OSError, ValueError):       # missing, or a symlink/FIFO (strictjson.Unreadable)
            return None, None

        def t_of(line: bytes) -> Optional[float]:
            obj = strictjson.parse_line(line)         # None: torn, too deep, not an object
            return _number(obj.get("t")) if obj is not None else None
        first = t_of(head)
        last = next((t for t in map(t_of, reversed(tail)) if t is not None), None)
        return first, last

    @property
    def samples(self) -> list[dict]:
        """Every resource sample, by time (read once, on first use)."""
        with self._samples_lock:
            if self._samples is None:
                samples = sorted((s for s in read_jsonl(self.path / SAMPLES, self.notes)
                                  if _number(s.get("t")) is not None), key=lambda s: s["t"])
                self._sample_times = [float(s["t"]) for s in samples]
                self._samples = samples
            return self._samples

    def sample_at(self, t: float) -> Optional[dict]:
        """The job's resources as last sampled at or before t (CPU seconds, RSS, disk, GPU memory/util/power)."""
        samples = self.samples
        i = bisect.bisect_right(self._sample_times, t)
        return samples[i - 1] if i else None

    def alerts_at(self, t: float) -> list[dict]:
        """The alerts active at t: raised at or before t and not cleared by then (events.jsonl)."""
        if self._alert_events is None:
            # Only the alert events, with their times: a long run's other events are not walked per frame.
            self._alert_events = [e for e in self.events if e.get("event") in ("AlertRaised", "AlertCleared",
                                                                              "StacksDumped")]
            self._alert_times = [float(e["t"]) for e in self._alert_events]
        active: dict[str, dict] = {}
        for e in self._alert_events[:bisect.bisect_right(self._alert_times, t)]:
            name = e.get("event")
            if name == "AlertRaised":
                alert = {k: v for k, v in e.items() if k not in ("t", "event", "on_alert_pid", "stacks_pending")}
                active[str(alert.get("code"))] = alert
            elif name == "StacksDumped":
                # The episode's dump joins its alert once the replay has passed it, as health.json said live.
                raised = active.get(str(e.get("code")))
                if raised is not None and e.get("verdict") and raised.get("since") == e.get("since"):
                    active[str(e.get("code"))] = {
                        **raised, "stacks": {"verdict": e["verdict"], "path": e.get("path")},
                        "message": f"{raised.get('message') or ''} — stacks: {e['verdict']}"}
            else:
                active.pop(str(e.get("code")), None)
        return list(active.values())

    def stacks_at(self, t: float) -> Optional[dict]:
        """The latest stack dump the run had recorded by t: {"t", "code", "verdict", "path"} (path relative
        to the run dir), or None before its first."""
        found: Optional[dict] = None
        for e in self.events:
            if float(e["t"]) > t:
                break
            if e.get("event") == "StacksDumped" and e.get("verdict") and isinstance(e.get("path"), str):
                found = {"t": float(e["t"]), "code": e.get("code"), "verdict": e["verdict"], "path": e["path"]}
        return found

    def engine_spec(self) -> Optional[tuple]:
        """(engine, model, port) when the run is an engine job (what the engine panel shows)."""
        try:
            from gpudeck.jobs.engines.profiles import engine_settings
            from gpudeck.jobs.spec import spec_from_snapshot
            settings = engine_settings(spec_from_snapshot(self.spec)) if self.spec else None
        except Exception:            # an odd spec snapshot: fall back to what it says outright
            settings = None
        if settings is not None:
            return (settings.engine, settings.model, settings.port)
        if (self.spec.get("kind") or self.meta.get("kind")) == "engine":
            return (self.spec.get("engine"), self.spec.get("model"), self.spec.get("port") or self.meta.get("port"))
        return None


def exit_words(record: Mapping[str, Any]) -> str:
    if record.get("signal"):
        what = f"killed by {record.get('signal')}"
    elif record.get("exit_code") is None:
        what = "ended"
    else:
        what = f"exited {record.get('exit_code')}"
    return what + (" (stop requested)" if record.get("stopped_by_request") else "")


class _AnalyzerTrack:
    """The log analyzer driven through a recording's arrival points, with checkpoints to go back."""

    def __init__(self, recording: Recording) -> None:
        self.rec = recording
        self.analyzer = make_analyzer()
        self.offset = 0                    # bytes fed
        self.point = 0                     # arrival points consumed
        self.result: dict = {}
        self._result_offset = -1
        # (offset, point, time, analyzer copy); the first one is the empty analyzer
        self.checkpoints: list[tuple[int, int, float, Any]] = [(0, 0, recording.start, self._copy(self.analyzer))]
        self.bytes_read = 0                # total log bytes read (tests and benchmarks look at it)

    @staticmethod
    def _copy(analyzer: Any) -> Any:
        # The state is small by design; the template cache is shared (it is a pure memo).
        clone = copy.copy(analyzer)
        state = getattr(analyzer, "_state", None)
        if state is not None:
            clone._state = copy.deepcopy(state)
        return clone

    def _restore(self, offset_target: int) -> None:
        i = bisect.bisect_right([c[0] for c in self.checkpoints], offset_target) - 1
        offset, point, _t, saved = self.checkpoints[max(0, i)]
        self.analyzer = self._copy(saved)
        self.offset, self.point = offset, point
        self._result_offset = -1

    def advance(self, t: float) -> dict:
        """The analysis of every byte that had arrived by t."""
        rec = self.rec
        target = rec.offset_at(t)
        if target < self.offset:
            self._restore(target)
        if target > self.offset:
            try:
                fh = open_regular(rec.log_path)      # never blocks on a FIFO, never reads /dev/zero
            except OSError:
                fh = None
            if fh is not None:
                with fh:
                    self._feed(fh, target)
        if self._result_offset != self.offset:
            try:
                result = as_dict(self.analyzer.result())
            except Exception:                 # an analyzer bug costs the phase, not the replay
                result = {}
            self.result = result if isinstance(result, dict) else {}
            self._result_offset = self.offset
        return self.result

    def _feed(self, fh: Any, target: int) -> None:
        rec = self.rec
        last_cp = self.checkpoints[-1]
        while self.offset < target and self.point < len(rec.point_offsets):
            stop = min(rec.point_offsets[self.point], target)
            when = rec.point_times[self.point]
            fh.seek(self.offset)
            while self.offset < stop:
                data = fh.read(min(READ_CHUNK, stop - self.offset))
                if not data:
                    self.offset = target = stop      # the file is shorter than its index said
                    break
                self.bytes_read += len(data)
                try:
                    self.analyzer.feed(data, now=when)
                except TypeError:
                    self.analyzer.feed(data)
                self.offset += len(data)
            if self.offset >= rec.point_offsets[self.point]:
                self.point += 1
            if self.offset > last_cp[0] and (self.offset - last_cp[0] >= CHECKPOINT_BYTES
                                             or when - last_cp[2] >= CHECKPOINT_SECONDS):
                last_cp = (self.offset, self.point, when, self._copy(self.analyzer))
                self.checkpoints.append(last_cp)


class RunReplay:
    """One recorded run, framed at any instant. Thread-safe: one frame is computed at a time."""

    def __init__(self, path: Path | str) -> None:
        self.recording = Recording(Path(path))
        self._track = _AnalyzerTrack(self.recording)
        self._lock = threading.Lock()
        self._engine = self.recording.engine_spec()

    @property
    def start(self) -> float:
        return self.recording.start

    @property
    def end(self) -> float:
        return self.recording.end

    @property
    def bytes_read(self) -> int:
        return self._track.bytes_read

    def frame(self, t: float) -> RunFrame:
        rec = self.recording
        with self._lock:
            analysis = dict(self._track.advance(t))
        log_bytes = rec.offset_at(t)
        job = self._job_record(t, analysis)
        return RunFrame(t=t, job=job, log_path=rec.log_path, log_bytes=log_bytes, engine=self._engine)

    def sample_at(self, t: float) -> Optional[dict]:
        """The run's resource sample at t (the latest at or before it); the samples load on first use."""
        return self.recording.sample_at(t)

    def _port(self) -> Optional[int]:
        if self._engine is not None and self._engine[2] is not None:
            return self._engine[2]
        spec, meta = self.recording.spec, self.recording.meta
        port = spec.get("port") if spec.get("port") is not None else meta.get("port")
        return port if isinstance(port, int) and not isinstance(port, bool) else None

    def _gpus(self) -> list[int]:
        meta, spec = self.recording.meta, self.recording.spec
        gpus = meta.get("gpus") if isinstance(meta.get("gpus"), list) else spec.get("gpus")
        return [g for g in gpus or [] if isinstance(g, int) and not isinstance(g, bool)]

    def _job_record(self, t: float, analysis: dict) -> dict:
        """The `jobs --json` record (see supervisor.jobs_payload) as the job stood at t."""
        rec = self.recording
        meta, spec = rec.meta, rec.spec
        if t < rec.start:
            # Before this run existed (a session of runs that started at different times): no run yet.
            return {"name": rec.job, "kind": str(spec.get("kind") or meta.get("kind") or "stage"), "state": "idle",
                    "pid": None, "run_id": None, "exit_code": None, "signal": None, "started_at": None,
                    "ended_at": None, "port": self._port(), "port_open": None, "gpus": self._gpus(),
                    "runner_alive": False, "pgid": None, "phase": None, "progress": None, "alerts": [],
                    "failure": None, "serving": None, "replay": True, "simulated": rec.simulated}
        ended = rec.ended_at is not None and t >= rec.ended_at
        started = rec.started_at is not None and t >= rec.started_at
        if ended:
            state = "stopped" if (rec.exit or {}).get("stopped_by_request") else "exited"
        elif rec.stop_requested_at is not None and t >= rec.stop_requested_at:
            state = "stopping"
        elif started:
            state = "running"
        elif rec.exit is None and rec.started_at is None and t >= rec.end:
            state = "lost"
        else:
            state = "starting"
        live = state in ("starting", "running", "stopping")
        process = meta.get("job_process")
        job_process: dict = process if isinstance(process, dict) else {}
        port = self._port()
        phase = analysis.get("phase")
        # Serving numbers as the log said them (a live engine's /metrics scrapes are not recorded).
        serving = analysis.get("serving") if isinstance(analysis.get("serving"), dict) else None
        exit_record = rec.exit or {}
        return {
            "name": rec.job, "kind": str(spec.get("kind") or meta.get("kind") or "stage"), "state": state,
            "pid": job_process.get("pid") if started else None, "run_id": rec.run_id,
            "exit_code": exit_record.get("exit_code") if ended else None,
            "signal": exit_record.get("signal") if ended else None,
            "started_at": rec.started_at if started else None, "ended_at": rec.ended_at if ended else None,
            # The port itself was not recorded: a recorded engine listened once its log said it was ready.
            "port": port, "port_open": (live and phase == "ready") if port is not None else None,
            "gpus": self._gpus(), "runner_alive": live,
            "pgid": meta.get("pgid") if started else None,
            "phase": phase,
            "progress": analysis.get("progress") if isinstance(analysis.get("progress"), dict) else None,
            "alerts": rec.alerts_at(t), "failure": analysis.get("failure") if ended or live else None,
            "serving": serving if live else None,
            "replay": True, "simulated": rec.simulated,
        }


@dataclass(frozen=True)
class SessionFrame:
    """Every run of a session at the session's position."""

    t: float
    start: float
    end: float
    speed: float
    paused: bool
    simulated: bool
    runs: tuple[RunFrame, ...]
    marks: tuple[Mark, ...] = field(default=())

    @property
    def jobs(self) -> list[dict]:
        return [r.job for r in self.runs]

    @property
    def fraction(self) -> float:
        span = self.end - self.start
        return 1.0 if span <= 0 else min(1.0, max(0.0, (self.t - self.start) / span))


class ReplaySession:
    """Several recorded runs on one clock, played like a recording: speed, pause, seek, next event.

    The position only moves when `advance(wall_seconds)` is called (the face's timer),
    so a test or a benchmark drives it deterministically.
    """

    def __init__(self, runs: Sequence[RunReplay], *, speed: float = 1.0, position: Optional[float] = None,
                 loop: bool = False) -> None:
        if not runs:
            raise ReplayError("nothing to replay")
        self.runs = list(runs)
        self.start = min(r.start for r in self.runs)
        self.end = max(r.end for r in self.runs)
        self.speed = min(SPEEDS, key=lambda s: abs(s - speed))
        self.paused = False
        self.loop = loop
        self.position = self.start if position is None else self._clamp(position)
        self.loop_start = self.position          # a looping session starts over where it first began
        self.marks = tuple(sorted((m for r in self.runs for m in r.recording.marks), key=lambda m: m.t))
        self.simulated = any(r.recording.simulated for r in self.runs)

    @classmethod
    def open(cls, paths: Sequence[Path | str], **kwargs: Any) -> "ReplaySession":
        return cls([RunReplay(p) for p in paths], **kwargs)

    def _clamp(self, t: float) -> float:
        return min(self.end, max(self.start, t))

    @property
    def at_end(self) -> bool:
        return self.position >= self.end

    def advance(self, wall_seconds: float) -> float:
        """Move the position by wall time × speed (nothing while paused); at the end it stops, or loops."""
        if not self.paused and wall_seconds > 0:
            if self.loop and self.at_end:
                self.position = self.loop_start
            else:
                self.position = self._clamp(self.position + wall_seconds * self.speed)
        return self.position

    def seek(self, delta: float) -> float:
        self.position = self._clamp(self.position + delta)
        return self.position

    def seek_to(self, t: float) -> float:
        self.position = self._clamp(t)
        return self.position

    def toggle_pause(self) -> bool:
        self.paused = not self.paused
        return self.paused

    def faster(self) -> float:
        i = SPEEDS.index(self.speed)
        self.speed = SPEEDS[min(len(SPEEDS) - 1, i + 1)]
        return self.speed

    def slower(self) -> float:
        i = SPEEDS.index(self.speed)
        self.speed = SPEEDS[max(0, i - 1)]
        return self.speed

    def next_mark(self, kinds: Optional[set[str]] = None) -> Optional[Mark]:
        """Jump to the first mark after the position (of `kinds`, if given); None (no move) when none is left."""
        for mark in self.marks:
            if mark.t > self.position + 1e-6 and (kinds is None or mark.kind in kinds):
                self.position = self._clamp(mark.t)
                return mark
        return None

    def previous_mark(self, kinds: Optional[set[str]] = None) -> Optional[Mark]:
        # 1 s of slack: pressing it again right after a jump goes to the one before.
        for mark in reversed(self.marks):
            if mark.t < self.position - 1.0 and (kinds is None or mark.kind in kinds):
                self.position = self._clamp(mark.t)
                return mark
        return None

    def frame(self) -> SessionFrame:
        t = self.position
        return SessionFrame(t=t, start=self.start, end=self.end, speed=self.speed, paused=self.paused,
                            simulated=self.simulated, runs=tuple(r.frame(t) for r in self.runs),
                            marks=self.marks)


def jobs_snapshot(frame: SessionFrame) -> "Any":
    """The frame as the JobsSnapshot a live JobsWatcher would have produced at that instant."""
    from gpudeck.jobs.view import JobsSnapshot, engine_views
    payload = {"jobs": [r.job for r in frame.runs]}
    log_paths, log_limits, specs = {}, {}, {}
    for r in frame.runs:
        name = r.job["name"]
        if r.job.get("run_id"):              # before its run began a job has no log yet
            log_paths[name] = str(r.log_path)
            log_limits[name] = r.log_bytes
        if r.engine is not None:
            specs[name] = r.engine
    snapshot = JobsSnapshot.from_payload(payload, frame.t)
    engines = engine_views(list(snapshot.jobs), specs, [])
    return JobsSnapshot(taken_at=frame.t, jobs=snapshot.jobs, engines=tuple(engines), log_paths=log_paths,
                        log_limits=log_limits, replay=frame)


def position_bar(frame: SessionFrame, width: int) -> str:
    """The position as a bar of `width` cells: ━ played, ─ to come, ▲ marks of alerts, ● the position."""
    width = max(3, width)
    span = frame.end - frame.start
    cells = ["━" if i < round(frame.fraction * (width - 1)) else "─" for i in range(width)]
    if span > 0:
        for mark in frame.marks:
            if mark.kind in ("alert", "exit"):
                cells[min(width - 1, int((mark.t - frame.start) / span * (width - 1) + 0.5))] = "▲"
    cells[min(width - 1, round(frame.fraction * (width - 1)))] = "●"
    return "".join(cells)


def clock_text(seconds: float) -> str:
    """A position within a replay: 0:42, 12:05, 3:04:09."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def demo_runs_dir() -> Path:
    """The bundled SIMULATED recordings `gpudeck --demo` plays (made by docs/make_demo_runs.py)."""
    return Path(__file__).resolve().parent / "demo_runs"


def demo_run_dirs() -> list[Path]:
    root = demo_runs_dir()
    try:
        jobs = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    out = []
    for job in jobs:
        runs = sorted(p for p in job.iterdir() if p.is_dir() and (p / META).exists())
        if runs:
            out.append(runs[-1])
    return out


# The demo opens 38 s in, at 4x: the relaunch has crashed, the engine is loading with an ETA,
# the build's OOM alert comes within a second and SGLang's stall ~7 s later.
DEMO_LEAD_S = 38.0
DEMO_SPEED = 4.0


def demo_session(**kwargs: Any) -> ReplaySession:
    """The bundled SIMULATED recordings on one clock, looping."""
    dirs = demo_run_dirs()
    if not dirs:
        raise ReplayError(f"no demo recordings under {demo_runs_dir()} (run docs/make_demo_runs.py)")
    runs = [RunReplay(d) for d in dirs]
    kwargs.setdefault("loop", True)
    kwargs.setdefault("speed", DEMO_SPEED)
    kwargs.setdefault("position", min(r.start for r in runs) + DEMO_LEAD_S)
    return ReplaySession(runs, **kwargs)
