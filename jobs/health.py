"""The health of one live run, owned by its runner: log analysis + stall rules each tick -> health.json, events, on_alert."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from gpudeck.jobs import strictjson
from gpudeck.jobs.procs import port_listening
from gpudeck.jobs.runs import append_jsonl as append_event, json_file_text, open_private, write_json_atomic
from gpudeck.jobs.stalls import Alert, GpuReading, HealthRules, HealthUpdate, Observation, RunEnd
from gpudeck.jobs.strictjson import finite_number, first_number

HEALTH = "health.json"
ON_ALERT_LOG = "on_alert.log"
HOOKS = "hooks.jsonl"
# How long an on_alert command may run before it is terminated ($GPUDECK_ON_ALERT_TIMEOUT overrides).
ON_ALERT_TIMEOUT_S = 120.0

# The monitor reads at most this much new log per tick, so one tick stays short
# even when a job floods its log; the rest is read on the next ticks.
MAX_LOG_READ_PER_TICK = 8 * 1024 * 1024
# The alerts that take a stack dump of the job when raised (dump_on_stall), once per episode.
DUMP_ON = ("stalled", "nccl_hang")
STACKS_DIR = "stacks"
# on_alert waits at most this long for the dump's verdict, then goes out without it.
DUMP_WAIT_S = 45.0
# A stored dump's .json and .txt are each at most this big, as written (read_stored_dump reads no more):
# past it the .json drops the per-process detail, then groups from the end; the verdict stays.
MAX_STORED_DUMP_BYTES = 2 * 1024 * 1024
# A stall that flaps all night dumps at most this many times per run.
MAX_DUMPS_PER_RUN = 20

# Without health.json (an older runner, a crashed monitor) `jobs --json` analyzes
# only the tail of the log: the phase and the failure are near the end.
FALLBACK_TAIL_BYTES = 4 * 1024 * 1024


class _NoAnalyzer:
    """Stands in when the log analyzer cannot be imported: health is judged from processes alone."""

    def feed(self, data: bytes) -> None:
        pass

    def result(self) -> dict:
        return {}


def make_analyzer() -> Any:
    try:
        from gpudeck.jobs.logs.analyze import LogAnalyzer
    except Exception:      # analyzer missing or broken: degrade to process-only health
        return _NoAnalyzer()
    return LogAnalyzer()


def as_dict(value: Any) -> Any:
    """The analyzer's result as plain JSON data, whatever shape it comes in."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return finite_number(value)          # inf/nan never leave the analyzer's result
    if hasattr(value, "to_json") and callable(value.to_json):
        return as_dict(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): as_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_dict(v) for v in value]
    return str(value)


def read_meminfo() -> tuple[Optional[int], Optional[int]]:
    """(MemAvailable, MemTotal) in bytes from /proc/meminfo; (None, None) where it cannot be read."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo", "r", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemAvailable", "MemTotal"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return values.get("MemAvailable"), values.get("MemTotal")


_num = first_number         # the one strict number rule (strictjson), first of several keys


def _gpu_readings(sample: Mapping[str, Any]) -> tuple[GpuReading, ...]:
    """The job's GPUs from a runner sample.

    The runner writes {"gpu": {"util": {"0": 97}, "power_w": {"0": 118.0}, "power_limit_w": {"0": 700}}};
    a list of per-GPU records [{"index": 0, "util": …, "power_w": …}] is read too.
    """
    per_gpu: dict[int, dict[str, Any]] = {}
    gpu = sample.get("gpu")
    if isinstance(gpu, Mapping):
        for field_name in ("util", "power_w", "power_limit_w"):
            values = gpu.get(field_name)
            if isinstance(values, Mapping):
                for key, value in values.items():
                    try:
                        per_gpu.setdefault(int(key), {})[field_name] = value
                    except (TypeError, ValueError):
                        continue
    listed = sample.get("gpus")
    if isinstance(listed, list):
        for val in listed:
            if isinstance(val, Mapping) and isinstance(val.get("index"), int):
                per_gpu.setdefault(val["index"], {}).update(val)
    return tuple(GpuReading(index=i, util=_num(v, "util", "gpu_util", "sm_util"),
                            power_w=_num(v, "power_w", "power"),
                            power_limit_w=_num(v, "power_limit_w", "power_limit"))
                 for i, v in sorted(per_gpu.items()))


class TreeRates:
    """Turns the runner's cumulative counters (cpu-seconds, bytes read) into rates between samples."""

    def __init__(self) -> None:
        self._prev: Optional[tuple[float, Optional[float], Optional[float]]] = None

    def update(self, now: float, sample: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
        cpu_pct = _num(sample, "cpu_percent", "cpu_pct")
        read_bps = _num(sample, "read_bps", "disk_read_bps", "io_read_bps")
        cpu_s = _num(sample, "cpu_seconds", "cpu_s", "cpu_time")
        read_b = _num(sample, "read_bytes", "io_read_bytes", "disk_read_bytes")
        prev, self._prev = self._prev, (now, cpu_s, read_b)
        if prev is not None and now > prev[0]:
            dt = now - prev[0]
            # A child that exited takes its cpu-seconds with it: a negative delta is "unknown", not idle.
            if cpu_pct is None and cpu_s is not None and prev[1] is not None and cpu_s >= prev[1]:
                cpu_pct = (cpu_s - prev[1]) / dt * 100.0
            if read_bps is None and read_b is not None and prev[2] is not None and read_b >= prev[2]:
                read_bps = (read_b - prev[2]) / dt
        return cpu_pct, read_bps


class StallDump:
    """One stack dump of a stalled run, taken in a thread so the runner never blocks on py-spy.

    The thread only writes the run dir's stacks/ files and its own result fields; the
    monitor reads them on a later tick (`done`), fires the alert's on_alert with the verdict
    and records the event: all state the monitor owns stays on the runner's thread.
    """

    def __init__(self, monitor: "HealthMonitor", alert: Any, procs: list, now: float) -> None:
        self.alert = alert
        self.key = (alert.code, alert.since)
        self.sharers: list[tuple] = []                # (code, since) of the episode's other alerts: its verdict is theirs
        self.deadline = time.monotonic() + DUMP_WAIT_S
        self.verdict: Optional[str] = None
        self.path: Optional[str] = None             # relative to the run dir
        self.error: Optional[str] = None
        self.done = False
        self._monitor = monitor
        self._procs = procs
        self._now = now
        self.thread = threading.Thread(target=self._run, name="gpudeck-stall-dump", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from gpudeck.jobs import stacks
        try:
            result = stacks.dump(self._procs, job=self._monitor.job, run_id=self._monitor.run_id,
                                 on_spawn=self._monitor.note_helper)
            self.verdict = result.verdict
            self.path = self._monitor.store_dump(result, self._now)
        except stacks.StacksUnavailable as exc:
            self.error = str(exc)
        except Exception as exc:        # noqa: BLE001 - a failed dump costs the dump, never the runner
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done = True


class HealthMonitor:
    """Judges one run each tick and publishes what it finds; everything it knows is also on disk.

    The runner constructs one per run and calls `tick()` about once a second with the
    sample it just took, then `finish()` once with the exit record. No method raises:
    a broken rule must never take the job's runner down.
    """

    def __init__(self, run_dir: Path, *, job: str = "", run_id: str = "", kind: Optional[str] = None,
                 port: Optional[int] = None, stall_after: Optional[float] = None,
                 on_alert: Optional[str] = None, dump_on_stall: bool = False, notify: Optional[list] = None,
                 clock: Callable[[], float] = time.time,
                 analyzer: Any = None, meminfo: Callable[[], tuple[Optional[int], Optional[int]]] = read_meminfo,
                 listening: Callable[[int], Optional[bool]] = port_listening) -> None:
        self.run_dir = Path(run_dir)
        self.job = job or self.run_dir.parent.name
        self.run_id = run_id or self.run_dir.name
        self.kind = kind or "stage"
        self.port = port
        self.on_alert = on_alert
        self.dump_on_stall = dump_on_stall
        self.notify = [t for t in notify or () if isinstance(t, Mapping)]   # webhook targets (gpudeck.jobs.notify)
        self.clock = clock
        self.analyzer = analyzer if analyzer is not None else make_analyzer()
        self.meminfo = meminfo
        self.listening = listening
        self.rules = HealthRules(kind=self.kind, stall_after=stall_after, job=self.job, run_id=self.run_id)
        self.rates = TreeRates()
        self.log_offset = 0
        self.analysis: dict = {}
        self.last_error: Optional[str] = None
        self.ended = False
        self._children: list[subprocess.Popen] = []
        self._progress_key: Any = None
        self.progress_at: Optional[float] = None     # when the progress last moved (ETA only while it does)
        self._pids: list[int] = []                   # the run's processes in the last sample
        self._dumps: list[StallDump] = []            # dumps whose alert has not gone out yet
        self._dumps_taken = 0
        self.stacks: dict[tuple, dict] = {}          # (code, since) -> {"verdict", "path"} of its episode's dump
        # The (code, since) of the alert that dumped (or tried to) for the stall episode now open, else None.
        self._episode: Optional[tuple] = None

    @classmethod
    def for_run(cls, run_dir: Path, meta: Optional[Mapping[str, Any]] = None, **overrides: Any) -> "HealthMonitor":
        """Settings from the run's meta.json (what the supervisor recorded of the spec)."""
        run_dir = Path(run_dir)
        if meta is None:
            meta = strictjson.load_object(run_dir / "meta.json", shape=strictjson.timed) or {}
        raw_spec = meta.get("spec")
        spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}

        def setting(name: str) -> Any:
            # The spec snapshot if there is one, else the same key at the top of meta.
            value = spec.get(name)
            return meta.get(name) if value is None else value

        port, stall_after, dump = setting("port"), setting("stall_after"), setting("dump_on_stall")
        settings: dict[str, Any] = dict(
            job=str(meta.get("job") or run_dir.parent.name),
            run_id=str(meta.get("run_id") or run_dir.name),
            kind=setting("kind"),
            port=int(port) if isinstance(port, (int, float)) and not isinstance(port, bool) else None,
            stall_after=float(stall_after) if isinstance(stall_after, (int, float)) else None,
            # the job's own command, else the file-wide default the supervisor recorded
            on_alert=setting("on_alert") or meta.get("on_alert_default"),
            dump_on_stall=dump if isinstance(dump, bool) else True,
            # resolved by the supervisor at start: the jobs file's [notify.*] and the user's config.toml ones
            notify=meta.get("notify") if isinstance(meta.get("notify"), list) else None,
        )
        settings.update(overrides)
        return cls(run_dir, **settings)

    # -- the log ------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.run_dir / "output.log"

    def _read_new_log(self, now: Optional[float] = None) -> int:
        """Feed only the bytes written since the last tick to the analyzer; return how many."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.log_offset)
                data = fh.read(MAX_LOG_READ_PER_TICK)
        except OSError:
            return 0
        if data:
            self.log_offset += len(data)
            try:
                # The arrival time lets the analyzer rate bars that print no rate of their own.
                self.analyzer.feed(data, now=now)
            except TypeError:
                self.analyzer.feed(data)
        return len(data)

    def _analyze(self) -> dict:
        try:
            result = as_dict(self.analyzer.result())
        except Exception as exc:            # an analyzer bug costs the log view, not the runner
            self.last_error = f"analyzer: {type(exc).__name__}: {exc}"
            return self.analysis
        return result if isinstance(result, dict) else {}

    # -- ticks --------------------------------------------------------------

    def tick(self, sample: Optional[Mapping[str, Any]] = None, *, alive: bool = True,
             now: Optional[float] = None) -> Optional[HealthUpdate]:
        try:
            return self._tick(sample or {}, alive, self.clock() if now is None else now)
        except Exception as exc:            # never take the runner down
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def _tick(self, sample: Mapping[str, Any], alive: bool, now: float) -> HealthUpdate:
        self._reap()
        pids = sample.get("pids")
        self._pids = [p for p in pids if isinstance(p, int) and not isinstance(p, bool)] if isinstance(pids, list) else []
        self._settle_dumps(now)
        grew = self._read_new_log(now)
        self.analysis = self._analyze()
        self._note_progress(now)
        cpu_pct, read_bps = self.rates.update(now, sample)
        mem_available = mem_total = None
        if self.kind == "build" or self.analysis.get("phase") == "building":
            mem_available, mem_total = self.meminfo()
        obs = Observation(
            time=now, alive=alive, cpu_percent=cpu_pct, disk_read_bps=read_bps,
            gpus=_gpu_readings(sample), log_grew=grew,
            port_listening=self.listening(self.port) if self.port else None,
            phase=self.analysis.get("phase"), serving=self.analysis.get("serving"),
            warnings=tuple(w for w in (self.analysis.get("warnings") or ()) if isinstance(w, Mapping)),
            failure=self.analysis.get("failure"),
            mem_available=mem_available, mem_total=mem_total, cpu_count=os.cpu_count(),
            tree_rss=int(_num(sample, "rss", "rss_bytes") or 0) or None,
        )
        update = self.rules.observe(obs)
        self._publish(update, now)
        return update

    def finish(self, exit_record: Optional[Mapping[str, Any]] = None, *,
               now: Optional[float] = None) -> Optional[HealthUpdate]:
        """The run ended: read the rest of the log, then judge the exit (crashed or not)."""
        now = self.clock() if now is None else now
        try:
            while self._read_new_log(now):
                pass
            finish = getattr(self.analyzer, "finish", None)
            if callable(finish):
                finish()           # the last, unterminated line counts now
            self.analysis = self._analyze()
            record = exit_record or {}
            signal = record.get("signal")
            if isinstance(signal, str):
                signal = _signal_number(signal)
            end = RunEnd(time=float(record.get("ended_at") or now),
                         exit_code=record.get("exit_code") if isinstance(record.get("exit_code"), int) else None,
                         signal=signal if isinstance(signal, int) else None,
                         stopped=bool(record.get("stopped_by_request")),
                         failure=self.analysis.get("failure"))
            update = self.rules.end(end)
            self.ended = True
            self._settle_dumps(now, final=True)
            self._publish(update, now)
            return update
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def _note_progress(self, now: float) -> None:
        progress = self.analysis.get("progress")
        key = ((progress.get("label"), progress.get("done"), progress.get("total"), self.analysis.get("phase"))
               if isinstance(progress, Mapping) else None)
        if key != self._progress_key:
            self._progress_key = key
            self.progress_at = now if key is not None else None

    # -- publishing -----------------------------------------------------------

    def health_record(self, now: float) -> dict:
        a = self.analysis
        return {
            "job": self.job, "run_id": self.run_id, "updated_at": round(now, 3), "ended": self.ended,
            "phase": a.get("phase"), "progress": a.get("progress"), "engine": a.get("engine"),
            "progress_at": round(self.progress_at, 3) if self.progress_at is not None else None,
            "failure": a.get("failure"), "serving": a.get("serving"), "warnings": a.get("warnings") or [],
            "ready_line": a.get("ready_line"),
            "alerts": [self.alert_json(al) for al in self.rules.active],
            "history": [self.alert_json(al) for al in self.rules.history],
            "log_offset": self.log_offset, "error": self.last_error,
        }

    def _publish(self, update: HealthUpdate, now: float) -> None:
        # A stall episode lasts while any alert of DUMP_ON stays raised: `stalled` and `nccl_hang` are often
        # one stall seen by two rules, at once or one after the other, and it takes one dump. Only once none
        # is left standing from an earlier tick does the next one open a new episode (and dump again).
        raised_now = {a.code for a in update.raised}
        if not any(a.code in DUMP_ON and a.code not in raised_now for a in update.active):
            self._episode = None
        # Each record on its own: one that cannot be written (a full disk) loses only itself.
        for alert in update.raised:
            if self._start_dump(alert, now):
                # on_alert waits for the dump's verdict (StacksDumped records its pid).
                self._record_event({"t": round(now, 3), "event": "AlertRaised", **alert.to_json(),
                                    "stacks_pending": True})
                continue
            pid = self._fire(alert)
            notify_pid = self._notify(alert, now)
            self._record_event({"t": round(now, 3), "event": "AlertRaised", **alert.to_json(),
                                **({"on_alert_pid": pid} if pid else {}),
                                **({"notify_pid": notify_pid} if notify_pid else {})})
        for alert in update.cleared:
            self._record_event({"t": round(now, 3), "event": "AlertCleared", "code": alert.code,
                                "since": alert.since, "cleared": alert.cleared})
        write_json_atomic(self.run_dir / HEALTH, self.health_record(now))

    # -- the stack dump on a stall ------------------------------------------------

    def alert_json(self, alert: Any) -> dict:
        """An alert as published, with its episode's stack-dump verdict where one was taken."""
        data = alert.to_json()
        dumped = self.stacks.get((alert.code, alert.since))
        if dumped:
            data["stacks"] = dict(dumped)
            data["message"] = f"{data['message']} — stacks: {dumped['verdict']}"
        return data

    def _start_dump(self, alert: Any, now: float) -> bool:
        """Start this episode's dump in a thread; False (the alert goes out at once) when none can be taken."""
        if not self.dump_on_stall or alert.code not in DUMP_ON or (alert.code, alert.since) in self.stacks:
            return False
        if self._episode is not None:
            # This stall's episode already has its dump (or was refused one): the alert shares its verdict,
            # now if it is in, else when it settles.
            key = (alert.code, alert.since)
            dumped = self.stacks.get(self._episode)
            if dumped:
                self.stacks[key] = dict(dumped)
            for dump in self._dumps:
                if dump.key == self._episode:
                    dump.sharers.append(key)
            return False
        self._episode = (alert.code, alert.since)
        from gpudeck.jobs import stacks
        from gpudeck.jobs.procs import identity
        procs = [ident for ident in (identity(pid) for pid in self._pids[:stacks.MAX_PROCESSES * 2])
                 if ident is not None and stacks.is_python(ident.pid)]
        if not procs:
            return False                # a shell loop, a build: nothing py-spy can read
        why = None if stacks.find_py_spy() else stacks.INSTALL_HINT
        why = why or stacks.ptrace_refusal()
        if not why and self._dumps_taken >= MAX_DUMPS_PER_RUN:
            why = f"this run already took {MAX_DUMPS_PER_RUN} stack dumps"
        if why:
            self._record_event({"t": round(now, 3), "event": "StacksUnavailable", "code": alert.code, "reason": why})
            return False
        self._dumps_taken += 1
        self._dumps.append(StallDump(self, alert, procs, now))
        return True

    def _settle_dumps(self, now: float, final: bool = False) -> None:
        """Dumps that finished (or ran out of time): their verdict joins the alert, then on_alert goes out."""
        for dump in list(self._dumps):
            if not (dump.done or final or time.monotonic() >= dump.deadline):
                continue
            if dump.done and dump.verdict is not None:
                for key in [dump.key] + dump.sharers:
                    self.stacks[key] = {"verdict": dump.verdict, "path": dump.path}
            alert = dump.alert
            if dump.verdict is not None:
                alert = dataclasses.replace(alert, message=f"{alert.message} — stacks: {dump.verdict}")
            pid = self._fire(alert, stacks=dump)
            notify_pid = self._notify(alert, now)      # the webhooks get the verdict too
            self._record_event({"t": round(now, 3), "event": "StacksDumped" if dump.verdict else "StacksFailed",
                                "code": dump.alert.code, "since": dump.alert.since, "verdict": dump.verdict,
                                "path": dump.path, "error": dump.error if dump.done else
                                f"no verdict within {DUMP_WAIT_S:g}s", **({"on_alert_pid": pid} if pid else {}),
                                **({"notify_pid": notify_pid} if notify_pid else {})})
            self._dumps.remove(dump)

    def note_helper(self, pid: int) -> None:
        """A process the monitor started in its own session (py-spy): recorded so it is never the job's."""
        from gpudeck.jobs.procs import identity
        ident = identity(pid)
        append_event(self.run_dir / HOOKS, {"pid": pid, "start": ident.start if ident else None,
                                            "t": round(time.time(), 3), "code": "stacks"})

    def store_dump(self, result: Any, now: float) -> Optional[str]:
        """stacks/<time>.json and .txt in the run dir; the path of the .json relative to the run dir."""
        from gpudeck.jobs.runs import ensure_private_dir
        from gpudeck.jobs.stacks import render_lines
        folder = ensure_private_dir(self.run_dir / STACKS_DIR)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}"
        write_json_atomic(folder / f"{stamp}.json", _bounded_dump(result.to_jsonable(frames=False)))
        # Cut in bytes, not characters (a chain's arrows and a frame's name are UTF-8), on a character's edge.
        text = ("\n".join(render_lines(result)) + "\n").encode("utf-8")[:MAX_STORED_DUMP_BYTES]
        fd = open_private(folder / f"{stamp}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(fd, "wb") as fh:
            fh.write(text.decode("utf-8", "ignore").encode("utf-8"))
        return f"{STACKS_DIR}/{stamp}.json"

    def _record_event(self, record: dict) -> None:
        try:
            append_event(self.run_dir / "events.jsonl", record)
        except OSError as exc:
            self.last_error = f"events.jsonl: {exc}"

    def _fire(self, alert: Alert, stacks: Optional[StallDump] = None) -> Optional[int]:
        """Run on_alert outside the run (gpudeck.jobs.alert_hook: own session, a deadline) with the alert in
        GPUDECK_ALERT_*; output to on_alert.log. Never raises: a hook that cannot start costs the hook only."""
        if not self.on_alert:
            return None
        try:
            return self._launch_hook(alert, stacks)
        except Exception as exc:
            self.last_error = f"on_alert: {type(exc).__name__}: {exc}"
            return None

    def _launch_hook(self, alert: Alert, stacks: Optional[StallDump] = None) -> Optional[int]:
        from gpudeck.jobs.logs.sanitize import terminal_text
        command = self.on_alert or ""
        fields = {
            "GPUDECK_ALERT_CODE": alert.code,
            "GPUDECK_ALERT_MESSAGE": alert.message,
            "GPUDECK_ALERT_JOB": alert.job,
            "GPUDECK_ALERT_RUN_ID": alert.run_id,
            "GPUDECK_ALERT_SINCE": f"{alert.since:.3f}",
            "GPUDECK_ALERT_SEVERITY": alert.severity,
            "GPUDECK_ALERT_CAUSE": alert.cause,
            "GPUDECK_ALERT_HINT": alert.hint,
            "GPUDECK_ALERT_STACKS": stacks.verdict if stacks else None,
            "GPUDECK_ALERT_STACKS_FILE": str(self.run_dir / stacks.path) if stacks and stacks.path else None,
        }
        env = {k: v for k, v in os.environ.items() if "\0" not in v}
        # The alert's text came from the job's log and goes on to a desktop notification, a chat,
        # a terminal: the same sanitizer as every other face. A NUL (a crash message can carry
        # one) cannot be in an environment at all: shown as \0, the alert still goes out.
        env.update({k: terminal_text(str(v).replace("\0", "\\0"), 4000) for k, v in fields.items() if v})
        # The job's own run tag must not leak: the hook is not part of the run's tree.
        env.pop("GPUDECK_RUN_ID", None)
        timeout = _hook_timeout(env)
        try:
            out_fd = open_private(self.run_dir / ON_ALERT_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError:
            out_fd = os.open(os.devnull, os.O_WRONLY)      # a full disk costs the hook's log, not the alert
        try:
            with open(out_fd, "ab") as out:
                child = subprocess.Popen(
                    [sys.executable, "-m", "gpudeck.jobs.alert_hook", f"{timeout:g}", str(self.run_dir),
                     command.replace("\0", "")],
                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                    close_fds=True, cwd=str(self.run_dir))
        except OSError as exc:
            self.last_error = f"on_alert: {exc}"
            return None
        # Recorded before anything else looks: the runner's leftover sweep and `stop` skip this session.
        from gpudeck.jobs.procs import identity
        ident = identity(child.pid)
        append_event(self.run_dir / HOOKS, {"pid": child.pid, "start": ident.start if ident else None,
                                            "t": round(time.time(), 3), "code": alert.code})
        self._children.append(child)
        return child.pid

    def _notify(self, alert: Alert, now: float) -> Optional[int]:
        """Deliver the alert to the webhook targets in a detached child (gpudeck.jobs.notify); never waits, never raises."""
        if not self.notify:
            return None
        try:
            from gpudeck.jobs import notify
            child = notify.launch(self.run_dir, {**alert.to_json(), "t": round(now, 3)}, self.notify)
        except Exception as exc:
            self.last_error = f"notify: {type(exc).__name__}: {exc}"
            return None
        if child is None:
            return None
        self._children.append(child)
        return child.pid

    def _reap(self) -> None:
        # The runner lives as long as the job: collect finished hooks so they do not linger as zombies.
        self._children = [c for c in self._children if c.poll() is None]


def _stored_size(data: Mapping[str, Any]) -> int:
    # As write_json_atomic writes it: the size read_stored_dump has to read back whole.
    return len(json_file_text(data))


def _bounded_dump(data: dict) -> dict:
    """A stored dump of at most MAX_STORED_DUMP_BYTES: the per-process detail goes first, then the groups
    from the end (idle helpers and the rarest stacks: group() sorts the telling ones first); the verdict stays."""
    if _stored_size(data) <= MAX_STORED_DUMP_BYTES:
        return data
    data["processes"], data["truncated"] = [], True
    groups = data.get("groups") or []
    data["groups_left_out"] = 0
    if _stored_size(data) <= MAX_STORED_DUMP_BYTES:
        data.pop("groups_left_out")
        return data
    low, high = 0, len(groups)          # the most groups that fit: a few measures, not one per group
    while low < high:
        mid = (low + high + 1) // 2
        data["groups"], data["groups_left_out"] = groups[:mid], len(groups) - mid
        if _stored_size(data) <= MAX_STORED_DUMP_BYTES:
            low = mid
        else:
            high = mid - 1
    data["groups"], data["groups_left_out"] = groups[:low], len(groups) - low
    return data


def _hook_timeout(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get("GPUDECK_ON_ALERT_TIMEOUT") or ON_ALERT_TIMEOUT_S)
    except ValueError:
        return ON_ALERT_TIMEOUT_S
    return value if 0 < value < 86400 else ON_ALERT_TIMEOUT_S


def _signal_number(name: str) -> Optional[int]:
    import signal as _signal
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(getattr(_signal.Signals, text))
    except AttributeError:
        return None


# -- readers (jobs --json, the console) ------------------------------------------

def read_health(run_dir: Path, notes: Optional[list] = None) -> Optional[dict]:
    """health.json through the strict, bounded loader (a bad one: None, and a note in `notes`)."""
    return strictjson.load_object(Path(run_dir) / HEALTH, notes=notes, shape=strictjson.timed)


def analyze_tail(run_dir: Path, tail_bytes: int = FALLBACK_TAIL_BYTES) -> dict:
    """A one-off analysis of the end of a run's log, for runs without health.json."""
    analyzer = make_analyzer()
    path = Path(run_dir) / "output.log"
    try:
        with strictjson.open_run_binary(path) as fh:      # never a FIFO or /dev/zero behind a symlink
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - tail_bytes))
            if size > tail_bytes:
                fh.readline()              # start on a line boundary
            while True:
                chunk = fh.read(1024 * 1024)
                if not chunk:
                    break
                analyzer.feed(chunk)
    except (OSError, ValueError):
        return {}
    finish = getattr(analyzer, "finish", None)
    if callable(finish):
        finish()
    try:
        result = as_dict(analyzer.result())
    except Exception:
        return {}
    return result if isinstance(result, dict) else {}


def job_health(run_dir: Optional[Path]) -> dict:
    """{phase, progress, alerts} for a job's latest run: health.json if the runner wrote one, else the log's tail."""
    if run_dir is None:
        return {"phase": None, "progress": None, "alerts": []}
    notes: list[str] = []            # run files there but unreadable (strictjson's words), for `jobs --json`
    health = read_health(run_dir, notes)
    if health is not None:
        # Typed as the faces expect them: a hand-edited or version-skewed health.json
        # loses the odd field instead of crashing `gpudeck jobs` and the console.
        def typed(key: str, kind: type | tuple[type, ...]) -> Any:
            value = health.get(key)
            return value if isinstance(value, kind) else None
        listed = health.get("alerts")
        return {"phase": typed("phase", str), "progress": typed("progress", dict),
                "progress_at": finite_number(typed("progress_at", (int, float))),
                "alerts": [a for a in listed if isinstance(a, dict)] if isinstance(listed, list) else [],
                "failure": typed("failure", dict), "serving": typed("serving", dict)}
    analysis = analyze_tail(run_dir)
    alerts: list[dict] = []
    record = strictjson.load_object(Path(run_dir) / "exit.json", notes=notes, shape=strictjson.timed)
    if isinstance(record, dict):
        # The run ended with no monitor: judge its exit the way the monitor would have.
        rules = HealthRules(job=Path(run_dir).parent.name, run_id=Path(run_dir).name)
        signal = record.get("signal")
        signal = _signal_number(signal) if isinstance(signal, str) else signal
        ended_at = record.get("ended_at")
        rules.end(RunEnd(time=float(ended_at) if isinstance(ended_at, (int, float)) else time.time(),
                         exit_code=record.get("exit_code") if isinstance(record.get("exit_code"), int) else None,
                         signal=signal if isinstance(signal, int) else None,
                         stopped=bool(record.get("stopped_by_request")), failure=analysis.get("failure")))
        alerts = [a.to_json() for a in rules.active]
    out = {"phase": analysis.get("phase"), "progress": analysis.get("progress"), "alerts": alerts,
           "failure": analysis.get("failure"), "serving": analysis.get("serving")}
    if notes:
        out["notes"] = [f"run {Path(run_dir).name}: {n}" for n in notes]
    return out

