"""The Prometheus exporter's collection: jobs, engines' serving numbers and GPUs as prometheus_client metric families.

`gpudeck exporter` (console/commands/exporter.py) serves a registry holding one
`GpudeckCollector`. Each scrape reads the same data `gpudeck jobs --json` prints (the jobs
payload, through `jobs.view`'s typed JobView) and the GPUs through the GPU seam; nothing is kept
between scrapes but the health cache, so a job that disappears from jobs.toml, or a GPU that
falls off the bus, drops out of the next scrape and Prometheus marks its series stale.

Names: jobs and engines are `gpudeck_*` with labels `job_name` (not `job`: that is Prometheus's
own target label, which a scrape would rename to `exported_job`) and `host`; GPUs use the names
and labels of NVIDIA's dcgm-exporter (`DCGM_FI_DEV_GPU_UTIL{gpu, UUID, device, modelName,
Hostname}`, its default-counters.csv units) so its dashboards and alert rules work unchanged.
docs/EXPORTER.md has the whole table beside nvitop-exporter's and DCGM's.

Remote boxes (`gpudeck exporter --host NAME`) are read through the Box seam (`BoxSource`: Box.status()
and Box.jobs(), bounded in time) and served by a `FleetCollector` beside this machine's, their series
labelled host="NAME", with `gpudeck_box_up` saying whether each answered.
"""
from __future__ import annotations

import os
import re
import signal as _signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpudeck.jobs import __version__
from gpudeck.jobs import strictjson
from gpudeck.jobs.strictjson import number
from gpudeck.jobs.view import JobView, job_views

if TYPE_CHECKING:
    from concurrent.futures import Future

# Every state a job can be in (supervisor.JobState.state): the one-hot state gauge has a series
# for each, so `gpudeck_job_state{state="running"} == 1` works without knowing what is absent.
STATES = ("idle", "starting", "running", "stopping", "exited", "stopped", "lost")
# A live run without health.json (an older runner, a crashed monitor) is judged from its log's
# last 4 MiB; while that log grows it is re-read at most this often, never on every scrape.
TAIL_REFRESH_S = 30.0
MIB = 1024 * 1024

JobsReader = Callable[[], dict]
GpuReader = Callable[[], tuple[tuple[Any, ...], Optional[str]]]


# ----------------------------------------------------------------------------------------- the cache

def _stat_key(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class HealthCache:
    """`health.job_health` per run directory, read again only when the run's files changed.

    The key is the (inode, size, mtime) of health.json and exit.json, and of output.log for a
    run without health.json: an ended run is read once, a live one when its runner rewrote
    health.json (about once a second while it runs), and a log-only run at most every
    `tail_refresh_s` while its log grows. A scrape of 50 jobs therefore opens a few small files,
    never every run's whole log.
    """

    def __init__(self, tail_refresh_s: float = TAIL_REFRESH_S, clock: Callable[[], float] = time.monotonic,
                 reader: Optional[Callable[[Optional[Path]], dict]] = None) -> None:
        self.tail_refresh_s = tail_refresh_s
        self._clock = clock
        if reader is None:
            from gpudeck.jobs.health import job_health
            reader = job_health
        self._reader = reader
        self._cache: dict[Path, tuple[tuple, float, dict]] = {}
        self.reads = 0                      # how many times a run was really read (tests, the bench)

    def __call__(self, run_dir: Optional[Path]) -> dict:
        if run_dir is None:
            return self._reader(None)
        run_dir = Path(run_dir)
        from gpudeck.jobs.health import HEALTH
        health = _stat_key(run_dir / HEALTH)
        ended = _stat_key(run_dir / "exit.json")
        log = _stat_key(run_dir / "output.log") if health is None else None
        key = (health, ended, log)
        now = self._clock()
        hit = self._cache.get(run_dir)
        if hit is not None:
            old_key, read_at, value = hit
            if old_key == key:
                return value
            # Only the log moved, the run is live and has no health.json: the tail can wait.
            if (health is None and ended is None and old_key[:2] == key[:2]
                    and now - read_at < self.tail_refresh_s):
                return value
        value = self._reader(run_dir)
        self.reads += 1
        self._cache[run_dir] = (key, now, value)
        return value

    def forget_except(self, keep: Iterable[Path]) -> None:
        """Drop the runs no longer shown (a newer run replaced them), so the cache stays the size of the jobs file."""
        keep = {Path(p) for p in keep}
        for path in [p for p in self._cache if p not in keep]:
            del self._cache[path]


class AlertEventCounts:
    """AlertRaised events of each run's events.jsonl, counted by code, reading only the bytes added since the last scrape.

    events.jsonl only grows (the runner appends one line an event); a file that shrank or was
    replaced (another inode) is counted again from its start. A partial last line waits for its newline.
    """

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[int, int, dict[str, int]]] = {}     # run dir -> (inode, offset, counts)

    def __call__(self, run_dir: Path) -> dict[str, int]:
        from gpudeck.jobs.runs import EVENTS
        run_dir = Path(run_dir)
        path = run_dir / EVENTS
        try:
            st = os.stat(path)
        except OSError:
            self._seen.pop(run_dir, None)
            return {}
        inode, offset, counts = self._seen.get(run_dir, (st.st_ino, 0, {}))
        if inode != st.st_ino or st.st_size < offset:
            inode, offset, counts = st.st_ino, 0, {}
        if st.st_size > offset:
            counts = dict(counts)
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read(st.st_size - offset)
            except OSError:
                return counts
            end = chunk.rfind(b"\n") + 1
            for line in chunk[:end].splitlines():
                if b"AlertRaised" not in line:
                    continue
                try:
                    event = strictjson.parse(line, path=path)    # a record nested 100,000 deep is skipped
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "AlertRaised" and isinstance(event.get("code"), str):
                    counts[event["code"]] = counts.get(event["code"], 0) + 1
            offset += end
        self._seen[run_dir] = (inode, offset, counts)
        return counts

    def forget_except(self, keep: Iterable[Path]) -> None:
        keep = {Path(p) for p in keep}
        for path in [p for p in self._seen if p not in keep]:
            del self._seen[path]


# ---------------------------------------------------------------------------------------- the sources

class JobsFileSource:
    """The jobs payload of one jobs.toml, re-loaded when the file changes; a broken edit keeps the last good one."""

    def __init__(self, path: Path, state_dir: Optional[Path] = None) -> None:
        self.path = Path(path)
        self.state_dir = state_dir
        self.health = HealthCache()
        self.alert_events = AlertEventCounts()
        self.error: Optional[str] = None
        self._key: Optional[tuple] = None
        self._supervisor: Any = None

    def supervisor(self) -> Any:
        key = _stat_key(self.path)
        if self._supervisor is None or key != self._key:
            from gpudeck.jobs.spec import SpecError, load_jobs
            from gpudeck.jobs.supervisor import Supervisor
            try:
                jobs_file = load_jobs(self.path)
            except (SpecError, OSError) as exc:
                self.error = str(exc)
                if self._supervisor is None:
                    raise
            else:
                self.error = None
                self._supervisor = Supervisor(jobs_file, self.state_dir)
            self._key = key
        return self._supervisor

    def __call__(self) -> dict:
        from gpudeck.jobs.payload import jobs_payload
        supervisor = self.supervisor()
        payload = jobs_payload(supervisor, health=self.health)
        from gpudeck.jobs.runs import job_dir
        runs = {}
        for job in payload["jobs"]:
            if job.get("run_id"):
                # The run the payload just found (and checked to be ours) with latest(): not listed again.
                try:
                    path = job_dir(job["name"], supervisor.state_dir) / job["run_id"]
                except ValueError:
                    continue
                runs[job["name"]] = path
                job["alerts_raised"] = self.alert_events(path)
        self.health.forget_except(runs.values())
        self.alert_events.forget_except(runs.values())
        return payload


class DemoJobsSource:
    """The four bundled SIMULATED recordings (what `gpudeck --demo` replays), advanced by wall time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        from gpudeck.jobs.replay import demo_session
        self.session = demo_session()
        self._clock = clock
        self._last = clock()
        self.now = self.session.position

    def __call__(self) -> dict:
        t = self._clock()
        self.now = self.session.advance(t - self._last)
        self._last = t
        jobs = []
        for run in self.session.frame().runs:
            job = dict(run.job)
            raised: dict[str, int] = {}
            for mark in self.session.marks:       # the recording's AlertRaised events up to the position
                if mark.kind == "alert" and mark.code and mark.job == job.get("name") and mark.t <= self.now:
                    raised[mark.code] = raised.get(mark.code, 0) + 1
            if job.get("run_id"):
                job["alerts_raised"] = raised
            jobs.append(job)
        return {"jobs": jobs, "pipelines": []}


def live_gpus() -> tuple[GpuReader, str, Callable[[], None]]:
    """(read, label, close) of this box's GPU backend (NVML, else nvidia-smi), without the PCIe thread."""
    from gpudeck.jobs.telemetry.gpu import make_backend
    backend = make_backend(pcie=False)
    return backend.read, backend.label, backend.close


def simulated_gpus(seed: int = 0) -> tuple[GpuReader, str, Callable[[], None]]:
    """(read, label, close) of the SIMULATED 8-GPU box, one step a scrape."""
    from gpudeck.jobs.telemetry.sampler import make_sampler
    sampler = make_sampler(demo=True, seed=seed)

    def read() -> tuple[tuple[Any, ...], Optional[str]]:
        snap = sampler.sample()
        return snap.gpus, snap.gpu_error
    return read, "SIMULATED", sampler.close


# ------------------------------------------------------------------------------------------ the metrics

@dataclass(frozen=True)
class Reading:
    """One scrape's inputs: what the families are built from (tests build these by hand)."""

    jobs: tuple[JobView, ...] = ()
    jobs_error: Optional[str] = None
    gpus: tuple[Any, ...] = ()                 # telemetry.snapshot.GpuSample
    gpu_error: Optional[str] = None
    gpus_read: bool = True                     # False: --no-gpus
    host: str = ""
    now: float = 0.0
    simulated: bool = False
    gpu_source: str = ""
    box: Optional["BoxState"] = None          # a remote box: whether it answered (None: this machine)


@dataclass(frozen=True)
class BoxState:
    """How a remote box answered one scrape."""

    up: bool
    seconds: float
    error: Optional[str] = None
    hostname: str = ""
    version: str = ""
    readonly: bool = False


JOB_LABELS = ("job_name", "host")
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")

# DCGM field, GpuSample attribute, scale to DCGM's unit, help (units as dcgm-exporter's default-counters.csv).
GPU_FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "util", 1, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util", 1, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "mem_used", 1 / MIB, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "mem_free", 1 / MIB, "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_TOTAL", "mem_total", 1 / MIB, "Framebuffer memory total (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temp", 1, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1, "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1, "Power management limit (in W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_FAN_SPEED", "fan_pct", 1, "Fan speed (in %)."),
)

# gpudeck_engine_* name, ServingView attribute, scale, help.
SERVING_FIELDS = (
    ("gpudeck_engine_generation_tokens_per_second", "gen_tokens_per_s", 1, "Generation throughput (tokens/s)."),
    ("gpudeck_engine_prompt_tokens_per_second", "prompt_tokens_per_s", 1, "Prompt (prefill) throughput (tokens/s)."),
    ("gpudeck_engine_requests_running", "running", 1, "Requests the engine is running."),
    ("gpudeck_engine_requests_waiting", "waiting", 1, "Requests waiting in the engine's queue."),
    ("gpudeck_engine_kv_cache_usage_ratio", "kv_cache_pct", 0.01, "KV-cache use, 0..1."),
    ("gpudeck_engine_spec_decode_acceptance_ratio", "spec_accept_rate", 1,
     "Speculative decoding: accepted / drafted tokens, 0..1."),
    ("gpudeck_engine_spec_decode_acceptance_length", "spec_accept_len", 1,
     "Speculative decoding: mean tokens a step, the bonus token included."),
)


def _signal_number(name: Optional[str]) -> Optional[int]:
    if not name:
        return None
    try:
        return int(_signal.Signals[name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"])
    except KeyError:
        return int(name) if name.isdigit() else None


def cause_label(cause: str) -> str:
    """A failure cause as a label value: the analysis's codes (cuda_oom, nccl, …) as they are; any other
    text (a future code, a hand-edited health.json) lower-cased to [a-z0-9_], at most 40 characters."""
    text = re.sub(r"[^a-z0-9]+", "_", cause.lower()).strip("_")[:40].rstrip("_")
    return text or "unknown"


def _value(sample: Any, attr: str) -> Optional[float]:
    if attr == "mem_free":
        used, total = getattr(sample, "mem_used", None), getattr(sample, "mem_total", None)
        return None if used is None or total is None else max(0, total - used)
    value = getattr(sample, attr, None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Families:
    """Metric families by name, created on first use with the constant labels (simulated) appended."""

    def __init__(self, const: dict[str, str]) -> None:
        self.const = const
        self.made: dict[str, Metric] = {}              # every family, in the order first made
        # One map per kind as well: add_metric is on the family subclasses, not on Metric.
        self._gauges: dict[str, GaugeMetricFamily] = {}
        self._counters: dict[str, CounterMetricFamily] = {}
        self._infos: dict[str, InfoMetricFamily] = {}

    def gauge(self, name: str, doc: str, labels: tuple[str, ...], values: tuple[str, ...], value: float,
              unit: str = "") -> None:
        fam = self._gauges.get(name)
        if fam is None:
            fam = self._gauges[name] = GaugeMetricFamily(name, doc, labels=list(labels) + list(self.const), unit=unit)
            self.made[name] = fam
        fam.add_metric(list(values) + list(self.const.values()), value)

    def counter(self, name: str, doc: str, labels: tuple[str, ...], values: tuple[str, ...], value: float) -> None:
        fam = self._counters.get(name)
        if fam is None:
            fam = self._counters[name] = CounterMetricFamily(name, doc, labels=list(labels) + list(self.const))
            self.made[name] = fam
        fam.add_metric(list(values) + list(self.const.values()), value)

    def info(self, name: str, doc: str, labels: dict[str, str]) -> None:
        fam = self._infos.get(name)
        if fam is None:
            fam = self._infos[name] = InfoMetricFamily(name, doc, labels=list(self.const))
            self.made[name] = fam
        fam.add_metric(list(self.const.values()), labels)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self.made.values())


def families(reading: Reading) -> list[Metric]:
    """Every metric family of one scrape (pure: the same reading gives the same text)."""
    fams = _Families({"simulated": "true"} if reading.simulated else {})
    add_families(fams, reading)
    return list(fams)


def add_families(fams: _Families, reading: Reading) -> None:
    """One box's series added to `fams`: several boxes share the families, told apart by `host`."""
    if reading.box is not None:
        _box_families(fams, reading)
        if not reading.box.up:
            # Nothing else is known of a box that did not answer: its series go stale in Prometheus.
            fams.gauge("gpudeck_exporter_jobs_up", "1 when the jobs file and run directories were read, else 0.",
                       ("host",), (reading.host,), 0.0)
            if reading.gpus_read:
                fams.gauge("gpudeck_exporter_gpus_up", "1 when the GPU driver answered with at least one GPU, else 0.",
                           ("host",), (reading.host,), 0.0)
            return
    fams.info("gpudeck_exporter", "The gpudeck exporter: version, host, GPU source; simulated=true on the demo box.",
              {"version": __version__, "host": reading.host, "gpu_source": reading.gpu_source,
               "simulated": "true" if reading.simulated else "false"})
    fams.gauge("gpudeck_exporter_jobs_up", "1 when the jobs file and run directories were read, else 0.",
               ("host",), (reading.host,), 0.0 if reading.jobs_error else 1.0)
    if reading.gpus_read:
        fams.gauge("gpudeck_exporter_gpus_up", "1 when the GPU driver answered with at least one GPU, else 0.",
                   ("host",), (reading.host,), 1.0 if reading.gpus else 0.0)
    for job in reading.jobs:
        _job_families(fams, job, reading)
    fams.gauge("gpudeck_jobs_stalled", "How many jobs are stalled right now.", ("host",), (reading.host,),
               float(sum(1 for job in reading.jobs if job.health == "stalled")))
    for gpu in reading.gpus:
        labels = (str(gpu.index), gpu.uuid or "", f"nvidia{gpu.index}", gpu.name or "", reading.host)
        for name, attr, scale, doc in GPU_FIELDS:
            value = _value(gpu, attr)
            if value is not None:
                # dcgm-exporter reports whole MiB; NVML's bytes would print as 130413.19999980927.
                fams.gauge(name, doc, GPU_LABELS, labels, float(round(value * scale)) if scale != 1 else value)


def _box_families(fams: _Families, reading: Reading) -> None:
    box = reading.box
    assert box is not None
    fams.gauge("gpudeck_box_up", "1 when the remote box (hosts.toml) answered within the scrape's bound, else 0.",
               ("host",), (reading.host,), 1.0 if box.up else 0.0)
    fams.gauge("gpudeck_box_read_seconds", "Seconds the remote box took to answer (the bound, when it did not).",
               ("host",), (reading.host,), box.seconds)
    if box.up:
        fams.info("gpudeck_box", "The remote box: its own hostname, its agent's version, whether the agent "
                  "refuses to act.", {"host": reading.host, "hostname": box.hostname, "agent_version": box.version,
                                      "readonly": "true" if box.readonly else "false"})


def _job_families(fams: _Families, job: JobView, reading: Reading) -> None:
    base = (job.name, reading.host)
    payload = job.payload
    fams.info("gpudeck_job", "One job of the jobs file: kind, backend and its latest run.",
              {"job_name": job.name, "host": reading.host, "kind": job.kind,
               "backend": str(payload.get("backend") or "local"), "run_id": job.run_id or ""})
    states = STATES if job.state in STATES else STATES + (job.state,)
    for state in states:
        fams.gauge("gpudeck_job_state", "The job's state, one-hot: 1 for the state it is in.",
                   JOB_LABELS + ("state",), base + (state,), 1.0 if state == job.state else 0.0)
    if job.run_id is not None:
        fams.gauge("gpudeck_job_phase", "The phase of the job's latest run (1 for the phase it is in).",
                   JOB_LABELS + ("phase",), base + (job.phase or "unknown",), 1.0)
        fams.gauge("gpudeck_job_stalled", "1 while a stall alert (stalled, nccl_hang) is raised on the job.",
                   JOB_LABELS, base, 1.0 if job.health == "stalled" else 0.0)
    progress = job.progress
    if progress is not None:
        if progress.done is not None:
            fams.gauge("gpudeck_job_progress_done", "Units of work done (steps, items, shards) in the current phase.",
                       JOB_LABELS, base, progress.done)
        if progress.total:
            fams.gauge("gpudeck_job_progress_total", "Units of work of the current phase.", JOB_LABELS, base,
                       progress.total)
            if progress.done is not None:
                fams.gauge("gpudeck_job_progress_ratio", "Progress of the current phase, 0..1.", JOB_LABELS, base,
                           progress.done / progress.total)
    eta = job.eta_s(reading.now)
    if eta is not None:
        fams.gauge("gpudeck_job_eta_seconds", "Seconds left, while the run is live and its progress moves.",
                   JOB_LABELS, base, eta)
    if job.progress_at is not None:
        fams.gauge("gpudeck_job_progress_time_seconds", "When the progress last moved (unix seconds).",
                   JOB_LABELS, base, job.progress_at)
    codes: dict[str, int] = {}
    for alert in job.alerts:
        codes[alert.code] = codes.get(alert.code, 0) + 1
    for code, count in sorted(codes.items()):
        fams.gauge("gpudeck_job_alerts", "Alerts raised on the job's latest run and still active, by code.",
                   JOB_LABELS + ("code",), base + (code,), float(count))
    raised = payload.get("alerts_raised")
    if isinstance(raised, dict):
        for code, count in sorted(raised.items()):
            if isinstance(code, str) and isinstance(count, int):
                fams.counter("gpudeck_job_alerts_raised", "Alerts raised on the job's latest run so far, by code "
                             "(resets when a new run starts).", JOB_LABELS + ("code",), base + (code,), float(count))
    cause = job.failure_cause
    if cause is not None:
        fams.gauge("gpudeck_job_failure_cause", "Why the job's latest run failed (1 for its cause: cuda_oom, "
                   "host_oom, nccl, ..., lost, unknown); absent while it has not failed.",
                   JOB_LABELS + ("cause",), base + (cause_label(cause),), 1.0)
    if job.exit_code is not None:
        fams.gauge("gpudeck_job_exit_code", "Exit code of the job's last ended run.", JOB_LABELS, base,
                   float(job.exit_code))
    signum = _signal_number(job.signal)
    if signum is not None:
        fams.gauge("gpudeck_job_exit_signal", "Signal number that ended the job's last run.",
                   JOB_LABELS + ("signal",), base + (job.signal or "",), float(signum))
    if job.started_at:
        fams.gauge("gpudeck_job_start_time_seconds", "When the job's latest run started (unix seconds).",
                   JOB_LABELS, base, job.started_at)
    if job.ended_at:
        fams.gauge("gpudeck_job_end_time_seconds", "When the job's latest run ended (unix seconds).",
                   JOB_LABELS, base, job.ended_at)
    if job.port is not None and job.port_open is not None:
        fams.gauge("gpudeck_job_port_open", "1 when the job's declared port is listening.",
                   JOB_LABELS + ("port",), base + (str(job.port),), 1.0 if job.port_open else 0.0)
    serving = payload.get("serving")
    if isinstance(serving, dict) and job.live:
        for name, attr, scale, doc in SERVING_FIELDS:
            value = number(serving.get(attr))       # the strict number rule: no Infinity, no 400-digit int
            if value is not None:
                fams.gauge(name, doc, JOB_LABELS, base, value * scale)


# ------------------------------------------------------------------------------------------ the collector

class GpudeckCollector:
    """A prometheus_client custom collector: one `Reading` a scrape, turned into families.

    Scrapes are serialised (start_http_server answers each in its own thread, and two Prometheus
    servers may scrape at once): the jobs source and the GPU driver are read by one scrape at a time.
    """

    def __init__(self, jobs: Optional[JobsReader], gpus: Optional[GpuReader], *, host: Optional[str] = None,
                 simulated: bool = False, gpu_source: str = "", jobs_reason: Optional[str] = None,
                 now: Optional[Callable[[], float]] = None) -> None:
        self.jobs = jobs
        self.gpus = gpus
        self.host = host or socket.gethostname()
        self.simulated = simulated
        self.gpu_source = gpu_source
        self.jobs_reason = jobs_reason         # why there is no jobs source (no jobs file)
        self._now = now or time.time
        self._lock = threading.Lock()
        self.last_duration_s: Optional[float] = None
        self.scrapes = 0

    def warm(self) -> None:
        """Read the jobs once before serving: the first read of every run (log-only ones analyse a 4 MiB
        tail) is paid at start, not by a scrape that Prometheus times out after 10 s."""
        with self._lock:
            if self.jobs is not None:
                try:
                    self.jobs()
                except Exception:           # noqa: BLE001 - the first scrape reports it
                    pass

    def describe(self) -> list[Metric]:
        return []                   # registering must not scrape: the families are only known per scrape

    def reading(self) -> Reading:
        views: tuple[JobView, ...] = ()
        jobs_error = self.jobs_reason
        if self.jobs is not None:
            try:
                payload = self.jobs()
                views = tuple(job_views(payload))
                jobs_error = getattr(self.jobs, "error", None)
            except Exception as exc:        # noqa: BLE001 - a broken run dir must not cost the GPU figures
                jobs_error = f"jobs: {exc}"
        gpus: tuple[Any, ...] = ()
        gpu_error = None
        if self.gpus is not None:
            try:
                gpus, gpu_error = self.gpus()
            except Exception as exc:        # noqa: BLE001
                gpus, gpu_error = (), f"GPU read failed: {exc}"
        now = getattr(self.jobs, "now", None)
        return Reading(jobs=views, jobs_error=jobs_error, gpus=tuple(gpus), gpu_error=gpu_error,
                       gpus_read=self.gpus is not None, host=self.host,
                       now=now if isinstance(now, (int, float)) else self._now(),
                       simulated=self.simulated, gpu_source=self.gpu_source)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.perf_counter()
            made = families(self.reading())
            self.last_duration_s = time.perf_counter() - started
            self.scrapes += 1
        duration = GaugeMetricFamily("gpudeck_exporter_collect_seconds",
                                     "Seconds this scrape took to read the jobs and the GPUs.",
                                     labels=["simulated"] if self.simulated else [])
        duration.add_metric(["true"] if self.simulated else [], self.last_duration_s)
        yield from made
        yield duration


# ------------------------------------------------------------------------------------------ remote boxes

# A remote box that has not answered within this is down for that scrape (Prometheus's own default
# scrape_timeout is 10 s; a box's answer over a kept SSH link takes a few round trips).
BOX_TIMEOUT_S = 3.0
# At start the exporter waits this long for every box's first answer (link and agent started once).
WARM_WAIT_S = 20.0


class BoxSource:
    """One remote box (`gpudeck.jobs.box.Box`) read for a scrape: `Box.status()` for the GPUs and `Box.jobs()`
    for the jobs, in a thread of its own, waited for at most the scrape's bound.

    A read has the bound from its own start; one still going when a later scrape comes is shared
    with it (two Prometheus servers scraping at once ask the box once). A read stuck past its bound
    (a frozen box) is neither waited for again nor repeated while it hangs: each scrape says the box
    is down at once, and the one after the stuck read returns asks afresh. A frozen box costs one
    blocked thread, never a slow scrape.
    """

    def __init__(self, box: Any, *, gpus: bool = True, timeout_s: float = BOX_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], float] = time.time) -> None:
        self.box = box
        self.name = str(box.name)
        self.gpus = gpus
        self.timeout_s = timeout_s
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._inflight: Optional[tuple[float, "Future[Reading]"]] = None     # (started, its answer)
        self.last_error: Optional[str] = None

    def begin(self) -> tuple[float, "Future[Reading]"]:
        """The read this scrape waits for: a new one, or the one in flight (even a stuck one: never two)."""
        from concurrent.futures import Future
        with self._lock:
            if self._inflight is not None and not self._inflight[1].done():
                return self._inflight
            future: Future[Reading] = Future()
            started = self._clock()
            self._inflight = (started, future)
        threading.Thread(target=self._run, args=(future, started), name=f"gpudeck-exporter-{self.name}",
                         daemon=True).start()
        return started, future

    def _run(self, future: "Future[Reading]", started: float) -> None:
        try:
            future.set_result(self._read(started))
        except BaseException as exc:        # noqa: BLE001 - a bug must show as a down box, not a dead thread
            future.set_result(self.down(f"{type(exc).__name__}: {exc}", self._clock() - started))

    def _read(self, started: float) -> Reading:
        from gpudeck.jobs.box import BoxError
        gpus: tuple[Any, ...] = ()
        gpu_error: Optional[str] = None
        gpu_source = ""
        try:
            if self.gpus:
                report = self.box.status(interval_s=0, engines=False)
                agent = report.payload.get("agent") if isinstance(report.payload.get("agent"), dict) else {}
                snapshot = report.snapshot()
                gpus, gpu_error = tuple(snapshot.gpus), snapshot.gpu_error
                source = report.payload.get("source")
                gpu_source = str(source.get("gpu") or "") if isinstance(source, dict) else ""
                if report.simulated:
                    gpu_source = "SIMULATED"
            else:
                info = self.box.info()
                agent = {"hostname": info.hostname, "version": info.version, "readonly": info.readonly}
            jobs: tuple[JobView, ...] = ()
            jobs_error: Optional[str] = None
            try:
                jobs = tuple(job_views(self.box.jobs().payload))
            except BoxError as exc:
                if exc.code != 2:
                    raise
                jobs_error = str(exc)           # the box answers but has no (good) jobs file: GPUs still count
        except BoxError as exc:
            return self.down(str(exc), self._clock() - started)
        self.last_error = None
        return Reading(jobs=jobs, jobs_error=jobs_error, gpus=gpus, gpu_error=gpu_error, gpus_read=self.gpus,
                       host=self.name, now=self._now(), gpu_source=gpu_source,
                       box=BoxState(up=True, seconds=self._clock() - started,
                                    hostname=str(agent.get("hostname") or ""), version=str(agent.get("version") or ""),
                                    readonly=bool(agent.get("readonly"))))

    def down(self, error: str, seconds: float) -> Reading:
        self.last_error = error
        return Reading(gpus_read=self.gpus, host=self.name, now=self._now(), jobs_error=error,
                       box=BoxState(up=False, seconds=seconds, error=error))

    def reading(self, started: float, future: "Future[Reading]", deadline: float, asked: float) -> Reading:
        """The answer of `begin()`'s read by `deadline` (a clock() time), else the box is down for this scrape."""
        from concurrent.futures import TimeoutError as FutureTimeout
        if started < asked - self.timeout_s:
            # A read started long before this scrape is stuck (a frozen box): not waited for again, and
            # its answer, whenever it comes, is too old to be this scrape's.
            return self.down(f"no answer for {asked - started:.0f} s", self.timeout_s)
        deadline = min(deadline, started + self.timeout_s)     # a read has the bound from its own start
        try:
            got = future.result(timeout=max(0.0, deadline - self._clock()))
        except FutureTimeout:
            return self.down(f"no answer within {self.timeout_s:g} s", min(self.timeout_s, self._clock() - asked))
        return got

    def close(self) -> None:
        try:
            self.box.close()
        except Exception:           # noqa: BLE001
            pass


class FleetCollector:
    """A prometheus_client collector of several boxes in one scrape: this machine's (a `GpudeckCollector`, or
    none) and remote ones (`BoxSource`), read side by side; the scrape answers within the boxes' bound."""

    def __init__(self, local: Optional[GpudeckCollector], boxes: list[BoxSource],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.local = local
        self.boxes = boxes
        self._clock = clock
        self._lock = threading.Lock()
        self.last_duration_s: Optional[float] = None
        self.scrapes = 0
        self.on_change: Optional[Callable[[str, bool, Optional[str]], None]] = None   # (box, up, why)
        self._was_up: dict[str, bool] = {}

    def warm(self, wait_s: float = WARM_WAIT_S) -> None:
        """This machine's runs read once, and every box asked once (its SSH link and agent started: a
        handshake the first scrape's bound need not cover), waiting up to `wait_s` for them all."""
        reads = [box.begin() for box in self.boxes]
        if self.local is not None:
            self.local.warm()
        from concurrent.futures import wait
        wait([future for _, future in reads], timeout=wait_s)

    def describe(self) -> list[Metric]:
        return []

    def readings(self) -> list[Reading]:
        asked = self._clock()
        reads = [(box, *box.begin()) for box in self.boxes]       # every box asked before any is waited for
        out: list[Reading] = []
        if self.local is not None:
            with self.local._lock:
                out.append(self.local.reading())
        for box, started, future in reads:
            got = box.reading(started, future, asked + box.timeout_s, asked)
            up = got.box is not None and got.box.up
            if self.on_change is not None and self._was_up.get(box.name) != up:
                self.on_change(box.name, up, None if up else got.jobs_error)
            self._was_up[box.name] = up
            out.append(got)
        return out

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.perf_counter()
            fams = _Families({})
            for r in self.readings():
                add_families(fams, r)
            self.last_duration_s = time.perf_counter() - started
            self.scrapes += 1
        duration = GaugeMetricFamily("gpudeck_exporter_collect_seconds",
                                     "Seconds this scrape took to read the jobs and the GPUs.", labels=[])
        duration.add_metric([], self.last_duration_s)
        yield from fams
        yield duration

    def close(self) -> None:
        for box in self.boxes:
            box.close()


def make_registry(collector: Any) -> Any:
    """A registry of its own holding only the collector (no process_/python_ metrics of the default one)."""
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
