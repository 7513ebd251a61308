"""`gpudeck exporter`: its text parsed by prometheus_client's own parser, its cache, and a real Prometheus server scraping it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Optional

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpudeck.jobs import exporter as core
from gpudeck.jobs.telemetry.snapshot import GpuSample
from gpudeck.jobs.view import JobView

from runsupport import PY, REPO, cli, cli_env, oom_trainer, wait_for, write_jobs
from promsupport import prom_query, start_prometheus

NOW = 1_800_000_000.0


def scrape_text(collector: core.GpudeckCollector) -> str:
    return generate_latest(core.make_registry(collector)).decode()


def samples(text: str) -> dict[str, list]:
    """{metric family name: [Sample, ...]} as Prometheus's own client library reads the text."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def one(found: dict[str, list], name: str, **labels: str):
    hits = [s for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {hits} (have {sorted(found)})"
    return hits[0]


TRAIN = {"name": "train", "kind": "train", "state": "running", "pid": 4242, "run_id": "20261201-100000-00001",
         "started_at": NOW - 600, "phase": "training", "progress_at": NOW - 5,
         "progress": {"done": 250, "total": 1000, "label": "step", "eta_s": 1800.0},
         "alerts": [{"code": "oom_risk", "message": "RSS near the limit"},
                    {"code": "oom_risk", "message": "again"}, {"code": "slow_io", "message": "disk"}]}
SERVE = {"name": "vllm-k2", "kind": "engine", "state": "running", "pid": 4343, "run_id": "20261201-090000-00002",
         "started_at": NOW - 3600, "phase": "ready", "port": 8000, "port_open": True,
         "serving": {"gen_tokens_per_s": 54.6, "prompt_tokens_per_s": 310.0, "running": 4, "waiting": 1,
                     "kv_cache_pct": 37.0, "spec_accept_rate": 0.15, "spec_accept_len": 1.4}}
HUNG = {"name": "sglang", "kind": "engine", "state": "running", "run_id": "20261201-110000-00003",
        "started_at": NOW - 300, "phase": "loading", "progress": {"done": 8, "total": 64, "eta_s": 40.0},
        "progress_at": NOW - 290, "alerts": [{"code": "stalled", "message": "silent"}]}
CRASHED = {"name": "build", "kind": "build", "state": "exited", "run_id": "20261201-080000-00004",
           "started_at": NOW - 7200, "ended_at": NOW - 4000, "exit_code": 137, "signal": "SIGKILL",
           "phase": "failed", "alerts": [{"code": "crashed", "message": "host OOM kill"}]}
IDLE = {"name": "never", "kind": "job", "state": "idle"}

GPU = GpuSample(index=3, name="NVIDIA H200", uuid="GPU-1234", util=97.0, mem_util=41.0, mem_used=80 * 2**30,
                mem_total=141 * 2**30, temp=61.0, power_w=650.5, power_limit_w=700.0, sm_clock_mhz=1980,
                mem_clock_mhz=3201)


def reading(jobs: list[dict], **kw) -> core.Reading:
    kw.setdefault("gpus", (GPU,))
    return core.Reading(jobs=tuple(JobView.from_payload(j) for j in jobs), host="box1", now=NOW,
                        gpu_source="NVML", **kw)


class FixedCollector(core.GpudeckCollector):
    def __init__(self, r: core.Reading) -> None:
        super().__init__(None, None, host=r.host, simulated=r.simulated)
        self._r = r

    def reading(self) -> core.Reading:
        return self._r


def test_job_metrics_parse_with_prometheus_clients_parser():
    found = samples(scrape_text(FixedCollector(reading([TRAIN, SERVE, HUNG, CRASHED, IDLE]))))
    # state: one-hot over every state, so `== 1` finds the running jobs without knowing the absent ones
    train_states = {s.labels["state"]: s.value for s in found["gpudeck_job_state"] if s.labels["job_name"] == "train"}
    assert train_states == {s: (1.0 if s == "running" else 0.0) for s in core.STATES}
    assert one(found, "gpudeck_job_state", job_name="build", state="exited").value == 1.0
    assert one(found, "gpudeck_job_phase", job_name="train", host="box1").labels["phase"] == "training"
    assert one(found, "gpudeck_job_phase", job_name="sglang").labels["phase"] == "loading"
    assert not [s for s in found["gpudeck_job_phase"] if s.labels["job_name"] == "never"]    # no run: no phase
    assert one(found, "gpudeck_job_progress_ratio", job_name="train").value == pytest.approx(0.25)
    assert one(found, "gpudeck_job_eta_seconds", job_name="train").value == 1800.0
    # a stuck run's ETA is not shown (as in the jobs table), its stall is
    assert not [s for s in found.get("gpudeck_job_eta_seconds", []) if s.labels["job_name"] == "sglang"]
    assert one(found, "gpudeck_job_stalled", job_name="sglang").value == 1.0
    assert one(found, "gpudeck_job_stalled", job_name="train").value == 0.0
    assert one(found, "gpudeck_jobs_stalled", host="box1").value == 1.0
    assert one(found, "gpudeck_job_alerts", job_name="train", code="oom_risk").value == 2.0
    assert one(found, "gpudeck_job_alerts", job_name="train", code="slow_io").value == 1.0
    assert one(found, "gpudeck_job_exit_code", job_name="build").value == 137.0
    sig = one(found, "gpudeck_job_exit_signal", job_name="build")
    assert (sig.labels["signal"], sig.value) == ("SIGKILL", 9.0)
    assert one(found, "gpudeck_job_start_time_seconds", job_name="train").value == NOW - 600
    assert one(found, "gpudeck_job_end_time_seconds", job_name="build").value == NOW - 4000
    info = one(found, "gpudeck_job_info", job_name="vllm-k2")
    assert (info.labels["kind"], info.labels["run_id"]) == ("engine", "20261201-090000-00002")
    assert one(found, "gpudeck_job_port_open", job_name="vllm-k2", port="8000").value == 1.0
    # no label is Prometheus's own `job`: a scrape would rename it to exported_job
    assert all("job" not in s.labels for fam in found.values() for s in fam)


def test_the_failure_cause_of_a_failed_run_is_one_series_with_a_cause_label():
    oom = dict(CRASHED, alerts=[{"code": "crashed", "message": "host OOM kill", "cause": "host_oom"}])
    logged = dict(CRASHED, name="serve", exit_code=1, signal=None, alerts=[{"code": "crashed", "message": "x"}],
                  failure={"cause": "nccl", "line": 12, "hint": "check NCCL_*"})
    bare = dict(CRASHED, name="bare", exit_code=1, signal=None, alerts=[])
    odd = dict(CRASHED, name="odd", alerts=[{"code": "crashed", "message": "x", "cause": "Weird \x1b[31mcause!\n"}])
    lingering = dict(TRAIN, name="zombie", phase="failed", failure={"cause": "cuda_oom"},
                     alerts=[{"code": "crashed", "message": "tree alive", "cause": "cuda_oom"}])
    recovered = dict(TRAIN, name="carried-on", failure={"cause": "cuda_error"}, alerts=[])
    stopped = dict(CRASHED, name="stopped", state="stopped", exit_code=None, signal="SIGTERM", alerts=[],
                   failure={"cause": "exception"})
    lost = dict(IDLE, name="lost", state="lost", run_id="20261201-070000-00005")
    found = samples(scrape_text(FixedCollector(reading([oom, logged, bare, odd, lingering, recovered, stopped,
                                                         lost, TRAIN, IDLE]))))
    causes = {s.labels["job_name"]: (s.labels["cause"], s.value) for s in found["gpudeck_job_failure_cause"]}
    assert causes == {
        "build": ("host_oom", 1.0),          # the crashed alert's cause (SIGKILL with no error logged)
        "serve": ("nccl", 1.0),              # the log analysis's cause, when the alert names none
        "bare": ("unknown", 1.0),            # it failed and nothing says why: still one series
        "odd": ("weird_cause", 1.0),         # a cause that is not a code is made one: no raw text in a label
        "zombie": ("cuda_oom", 1.0),         # crashed while its process tree lingers
        "lost": ("lost", 1.0),               # runner and job gone, no exit record
    }                                        # a live run that carried on, a stopped one, an idle one: none
    assert all(set(s.labels) == {"job_name", "host", "cause"} for s in found["gpudeck_job_failure_cause"])


def test_a_real_crashed_jobs_failure_cause_is_served(tmp_path, state):
    """A real process prints a CUDA OOM traceback and exits 1; the exporter's text names cuda_oom."""
    script = tmp_path / "train.py"
    script.write_text(oom_trainer(steps=2, pause_s=0.05))
    jobs = write_jobs(tmp_path / "jobs.toml", {"crasher": {"cmd": f"{PY} {script}", "kind": "train"},
                                               "fine": {"cmd": "true"}})
    env = cli_env(state)
    for name in ("crasher", "fine"):
        started = cli(["--jobs", str(jobs), "start", name], env, timeout=60)
        assert started.returncode == 0, started.stderr
    collector = core.GpudeckCollector(core.JobsFileSource(jobs, state), None, host="box1")

    def ended() -> Optional[dict]:
        found = samples(scrape_text(collector))
        exited = [s for s in found["gpudeck_job_state"] if s.labels["state"] == "exited" and s.value == 1.0]
        crashed = [s for s in found.get("gpudeck_job_alerts", []) if s.labels["code"] == "crashed"]
        return found if len(exited) == 2 and crashed else None
    found = wait_for(ended, timeout=30, what="the crasher to exit with a crashed alert", interval=0.2)
    assert one(found, "gpudeck_job_exit_code", job_name="crasher").value == 1.0
    cause = one(found, "gpudeck_job_failure_cause", job_name="crasher", host="box1")
    assert (cause.labels["cause"], cause.value) == ("cuda_oom", 1.0)
    assert not [s for s in found["gpudeck_job_failure_cause"] if s.labels["job_name"] == "fine"]   # exit 0


def test_engine_serving_numbers_of_a_live_engine():
    found = samples(scrape_text(FixedCollector(reading([SERVE, dict(SERVE, name="old", state="exited")]))))
    assert one(found, "gpudeck_engine_generation_tokens_per_second", job_name="vllm-k2").value == 54.6
    assert one(found, "gpudeck_engine_prompt_tokens_per_second", job_name="vllm-k2").value == 310.0
    assert one(found, "gpudeck_engine_requests_running", job_name="vllm-k2").value == 4.0
    assert one(found, "gpudeck_engine_requests_waiting", job_name="vllm-k2").value == 1.0
    assert one(found, "gpudeck_engine_kv_cache_usage_ratio", job_name="vllm-k2").value == pytest.approx(0.37)
    assert one(found, "gpudeck_engine_spec_decode_acceptance_ratio", job_name="vllm-k2").value == 0.15
    assert one(found, "gpudeck_engine_spec_decode_acceptance_length", job_name="vllm-k2").value == 1.4
    # an ended engine's last serving numbers are not current figures
    assert not [s for s in found["gpudeck_engine_requests_running"] if s.labels["job_name"] == "old"]


def test_gpus_under_dcgm_exporter_names_labels_and_units():
    found = samples(scrape_text(FixedCollector(reading([]))))
    labels = {"gpu": "3", "UUID": "GPU-1234", "device": "nvidia3", "modelName": "NVIDIA H200", "Hostname": "box1"}
    expected = {"DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
                "DCGM_FI_DEV_FB_USED": 80 * 1024.0, "DCGM_FI_DEV_FB_FREE": 61 * 1024.0,
                "DCGM_FI_DEV_FB_TOTAL": 141 * 1024.0, "DCGM_FI_DEV_GPU_TEMP": 61.0,
                "DCGM_FI_DEV_POWER_USAGE": 650.5, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0,
                "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_MEM_CLOCK": 3201.0}
    for name, value in expected.items():
        assert one(found, name).labels == labels
        assert one(found, name).value == value, name
    assert "DCGM_FI_DEV_FAN_SPEED" not in found          # NVML said nothing (H200s have no fan): no series
    assert one(found, "gpudeck_exporter_gpus_up").value == 1.0
    nogpu = samples(scrape_text(FixedCollector(reading([], gpus=(), gpu_error="no NVIDIA driver"))))
    assert one(nogpu, "gpudeck_exporter_gpus_up").value == 0.0
    assert not [n for n in nogpu if n.startswith("DCGM_")]


def test_demo_serves_the_simulated_box_every_series_labelled():
    read, label, close = core.simulated_gpus()
    try:
        collector = core.GpudeckCollector(core.DemoJobsSource(), read, host="h200-sim-01", simulated=True,
                                          gpu_source=label)
        found = samples(scrape_text(collector))
    finally:
        close()
    assert all(s.labels.get("simulated") == "true" for fam in found.values() for s in fam)
    assert len(found["DCGM_FI_DEV_GPU_UTIL"]) == 8
    assert {s.labels["job_name"] for s in found["gpudeck_job_phase"]} == {
        "sgl-kernel-build", "sglang-k2", "vllm-eagle3", "vllm-k2"}
    assert one(found, "gpudeck_exporter_info").labels["gpu_source"] == "SIMULATED"


def test_health_cache_reads_a_run_again_only_when_its_files_change(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "health.json").write_text(json.dumps({"phase": "loading"}))
    (run / "output.log").write_text("x\n")
    clock = [0.0]
    cache = core.HealthCache(tail_refresh_s=30, clock=lambda: clock[0])
    assert cache(run)["phase"] == "loading"
    for _ in range(20):
        cache(run)
    assert cache.reads == 1
    with open(run / "output.log", "a") as fh:      # the log grows, health.json says it all: not read
        fh.write("more\n")
    cache(run)
    assert cache.reads == 1
    (run / "health.json").write_text(json.dumps({"phase": "ready", "progress": None}))
    assert cache(run)["phase"] == "ready" and cache.reads == 2
    (run / "exit.json").write_text(json.dumps({"exit_code": 0}))
    cache(run)
    assert cache.reads == 3


def test_health_cache_rereads_a_growing_log_only_on_its_refresh_interval(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "output.log"
    log.write_text("epoch 1/1 step 1/10\n")
    clock = [0.0]
    cache = core.HealthCache(tail_refresh_s=30, clock=lambda: clock[0])
    cache(run)
    for i in range(2, 6):                  # a live run without health.json: its tail waits 30 s
        with open(log, "a") as fh:
            fh.write(f"epoch 1/1 step {i}/10\n")
        clock[0] += 5
        cache(run)
    assert cache.reads == 1
    clock[0] += 30
    cache(run)
    assert cache.reads == 2
    (run / "exit.json").write_text(json.dumps({"exit_code": 0}))      # it ended: read at once, then never
    cache(run)
    cache(run)
    assert cache.reads == 3


def test_listen_addresses_and_the_loopback_rule(tmp_path, state):
    from gpudeck.console.commands.exporter import is_loopback, parse_listen
    from gpudeck.console.errors import CliError
    assert parse_listen("127.0.0.1:9402", "x") == ("127.0.0.1", 9402)
    assert parse_listen("[::1]:9402", "x") == ("::1", 9402)
    with pytest.raises(CliError):
        parse_listen(":9402", "x")                # every address must be named: 0.0.0.0:9402
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    jobs = write_jobs(tmp_path / "jobs.toml", {"a": {"cmd": "true"}})
    done = cli(["--jobs", str(jobs), "exporter", "--listen", "0.0.0.0:0"], cli_env(state), timeout=30)
    assert done.returncode == 2
    assert b"--allow-remote" in done.stderr and b"Traceback" not in done.stderr
    bad = cli(["--jobs", str(jobs), "exporter", "--listen", "nonsense"], cli_env(state), timeout=30)
    assert bad.returncode == 2 and b"HOST:PORT" in bad.stderr


def test_the_demo_command_serves_until_sigterm_and_exits_0(tmp_path, state):
    proc = subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--demo", "exporter", "--listen", "127.0.0.1:0"],
                            cwd=REPO, env=cli_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "SIMULATED" in line and "serving http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            found = samples(reply.read().decode())
        assert one(found, "gpudeck_exporter_info").labels["simulated"] == "true"
        assert len(found["DCGM_FI_DEV_GPU_UTIL"]) == 8
        assert "process_cpu_seconds" not in found         # its own registry: none of the default collectors
        proc.terminate()
        assert proc.wait(timeout=20) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        _stop(proc)


# ------------------------------------------------------------------------------- a real Prometheus

PROMETHEUS = "/usr/bin/prometheus"


def ensure_prometheus() -> Optional[str]:
    """Install Debian's prometheus if missing (as .ci/run does); None when usable, else why not."""
    if shutil.which("prometheus") or os.path.exists(PROMETHEUS):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "prometheus is not installed and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
    done = subprocess.run(["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", "prometheus"],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not (shutil.which("prometheus") or os.path.exists(PROMETHEUS)):
        return f"installing prometheus failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def exporter_of_a_running_job(tmp_path, state):
    """A real job started with `gpudeck start`, and a real `gpudeck exporter` subprocess over its jobs.toml: (port, jobs file)."""
    script = tmp_path / "train.py"
    script.write_text("import time\nfor i in range(1, 100000):\n"
                      "    print(f'epoch 1/1 step {i}/100000 loss=2.0', flush=True)\n    time.sleep(0.5)\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"trainer": {"cmd": f"{PY} {script}", "kind": "train"}})
    env = cli_env(state)
    started = cli(["--jobs", str(jobs), "start", "trainer"], env, timeout=60)
    assert started.returncode == 0, started.stderr
    proc = subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "exporter",
                             "--listen", "127.0.0.1:0"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        yield port, jobs, env
    finally:
        _stop(proc)
        cli(["--jobs", str(jobs), "stop", "trainer"], env, timeout=60)


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on 127.0.0.1 scraping `targets` every second; yields a start(targets) -> base URL function."""
    reason = ensure_prometheus()
    if reason is not None:
        pytest.skip(reason)
    binary = shutil.which("prometheus") or PROMETHEUS
    procs: list[subprocess.Popen] = []

    def start(target: str) -> str:
        proc, base = start_prometheus(binary, target, tmp_path)
        procs.append(proc)
        return base
    yield start
    for proc in procs:
        _stop(proc)


def test_a_real_prometheus_scrapes_the_phase_of_a_real_running_job(exporter_of_a_running_job, prometheus):
    port, jobs, env = exporter_of_a_running_job
    # What `gpudeck jobs --json` says the phase is, once the runner's monitor has judged the log's step
    # lines (before the first one it says `unknown`, which Prometheus may never scrape: it moves on).
    def phase() -> Optional[str]:
        out = cli(["--jobs", str(jobs), "jobs", "--json"], env, timeout=30)
        job = json.loads(out.stdout)["jobs"][0]
        return job["phase"] if job["state"] == "running" and job.get("phase") == "training" else None
    expected = wait_for(phase, timeout=30, what="the job's phase `training` in `gpudeck jobs --json`", interval=0.5)
    base = prometheus(f"127.0.0.1:{port}")
    result = wait_for(lambda: prom_query(base, f'gpudeck_job_phase{{job_name="trainer",phase="{expected}"}} == 1'),
                      timeout=60, what=f"Prometheus to return the trainer's phase {expected!r}", interval=0.5)
    metric = result[0]["metric"]
    assert metric["job"] == "gpudeck"                     # Prometheus's own target label, untouched
    assert (metric["job_name"], metric["phase"]) == ("trainer", expected)
    running = prom_query(base, 'gpudeck_job_state{job_name="trainer",state="running"}')
    assert running and running[0]["value"][1] == "1"
    up = wait_for(lambda: prom_query(base, 'up{job="gpudeck"}'), timeout=10, what="the target's up")
    assert up[0]["value"][1] == "1"
    # Every query of the shipped Grafana dashboard is PromQL this Prometheus accepts.
    for expr in dashboard_exprs():
        url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert json.loads(reply.read())["status"] == "success", expr
    table = prom_query(base, 'gpudeck_job_progress_ratio{job_name="trainer"}')
    assert table and 0.0 < float(table[0]["value"][1]) < 1.0


# ------------------------------------------------------------------------------- the Grafana dashboard

DASHBOARD = REPO / "docs" / "grafana-gpudeck.json"


def dashboard_exprs() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    return [t["expr"].replace("$host", ".*") for p in data["panels"] for t in p.get("targets", [])]


def test_every_metric_the_dashboard_asks_for_is_served():
    import re
    served = set(samples(scrape_text(FixedCollector(reading([TRAIN, SERVE, HUNG, CRASHED, IDLE])))))
    served |= {"gpudeck_exporter_collect_seconds"}
    asked = {m for expr in dashboard_exprs() for m in re.findall(r"\b(gpudeck_[a-z_]+|DCGM_FI_[A-Z_]+)", expr)}
    # the parser names an info family without its _info suffix
    asked = {m[:-5] if m.endswith("_info") else m for m in asked}
    assert asked and asked <= served, sorted(asked - served)
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"Stalled jobs", "Jobs: state, phase, progress, ETA", "GPU utilization", "GPU memory used"} <= titles


def test_alerts_raised_are_counted_from_events_jsonl_reading_only_new_bytes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    events = run / "events.jsonl"
    def add(**event) -> None:
        with open(events, "a") as fh:
            fh.write(json.dumps(event) + "\n")
    add(t=1, event="JobStarted")
    add(t=2, event="AlertRaised", code="oom_risk")
    add(t=3, event="AlertCleared", code="oom_risk")
    counts = core.AlertEventCounts()
    assert counts(run) == {"oom_risk": 1}
    add(t=4, event="AlertRaised", code="oom_risk")
    with open(events, "a") as fh:
        fh.write('{"t": 5, "event": "AlertRaised", "code": "stal')          # half a line: not yet
    assert counts(run) == {"oom_risk": 2}
    with open(events, "a") as fh:
        fh.write('led"}\n')
    assert counts(run) == {"oom_risk": 2, "stalled": 1}
    events.write_text(json.dumps({"t": 9, "event": "AlertRaised", "code": "crashed"}) + "\n")   # replaced
    assert counts(run) == {"crashed": 1}
    with open(events, "a") as fh:         # a tampered record nested past any writer: skipped, not a RecursionError
        fh.write('{"event": "AlertRaised", "code": "stalled", "x": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    add(t=10, event="AlertRaised", code="stalled")
    assert counts(run) == {"crashed": 1, "stalled": 1}
    found = samples(scrape_text(FixedCollector(reading([dict(CRASHED, alerts_raised={"crashed": 1, "oom_risk": 3})]))))
    assert found["gpudeck_job_alerts_raised"][0].name == "gpudeck_job_alerts_raised_total"
    assert one(found, "gpudeck_job_alerts_raised", job_name="build", code="oom_risk").value == 3.0


def test_the_jobs_file_is_reread_when_it_changes_and_a_broken_edit_keeps_the_last_good_one(tmp_path, state):
    path = write_jobs(tmp_path / "jobs.toml", {"a": {"cmd": "true"}})
    source = core.JobsFileSource(path)
    collector = core.GpudeckCollector(source, None, host="box1")
    found = samples(scrape_text(collector))
    assert {s.labels["job_name"] for s in found["gpudeck_job_state"]} == {"a"}
    assert one(found, "gpudeck_job_state", job_name="a", state="idle").value == 1.0
    time.sleep(0.01)                        # a new mtime even on a coarse clock
    write_jobs(path, {"a": {"cmd": "true"}, "b": {"cmd": "sleep 1"}})
    found = samples(scrape_text(collector))
    assert {s.labels["job_name"] for s in found["gpudeck_job_state"]} == {"a", "b"}
    assert one(found, "gpudeck_exporter_jobs_up").value == 1.0
    path.write_text("[jobs.a]\ncmd = \n")
    found = samples(scrape_text(collector))
    assert {s.labels["job_name"] for s in found["gpudeck_job_state"]} == {"a", "b"}
    assert one(found, "gpudeck_exporter_jobs_up").value == 0.0
    assert "gpudeck_exporter_gpus_up" not in found          # --no-gpus: not even the up gauge


# ------------------------------------------------------------------------------- remote boxes (Box seam)

class FakeBox:
    """A Box answering status() and jobs() from dicts, or hanging until released (a frozen link)."""

    local = False

    def __init__(self, name: str, jobs: list[dict], *, hang: bool = False, fail: Optional[str] = None) -> None:
        import threading
        self.name = name
        self._jobs = jobs
        self.release = threading.Event()
        if not hang:
            self.release.set()
        self.fail = fail
        self.calls = 0

    def status(self, *, interval_s: float = 0.1, engines: bool = True, simulated: bool = False):
        from gpudeck.jobs.box import BoxError, StatusReport
        self.calls += 1
        self.release.wait(30)
        if self.fail:
            raise BoxError(self.fail, code=1)
        gpu = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-r0", "util": 55.0, "mem_used": 2**30,
               "mem_total": 141 * 2**30, "processes": []}
        return StatusReport({"time": NOW, "simulated": False, "host": {"name": self.name}, "gpus": [gpu],
                             "gpu_error": None, "ports": [], "source": {"gpu": "nvml"},
                             "agent": {"hostname": f"{self.name}.example", "version": "9.9", "readonly": True}})

    def jobs(self):
        from gpudeck.jobs.box import JobsListing
        return JobsListing({"jobs": self._jobs, "pipelines": []})

    def close(self) -> None:
        self.release.set()


def test_remote_boxes_share_the_local_names_told_apart_by_host():
    boxes = [core.BoxSource(FakeBox("gpu-7", [TRAIN, SERVE])), core.BoxSource(FakeBox("gpu-8", [CRASHED]))]
    collector = core.FleetCollector(FixedCollector(reading([HUNG])), boxes)
    found = samples(scrape_text(collector))
    assert one(found, "gpudeck_job_state", host="gpu-7", job_name="train", state="running").value == 1.0
    assert one(found, "gpudeck_job_exit_code", host="gpu-8", job_name="build").value == 137.0
    assert one(found, "gpudeck_job_stalled", host="box1", job_name="sglang").value == 1.0      # this machine
    assert one(found, "gpudeck_engine_requests_running", host="gpu-7", job_name="vllm-k2").value == 4.0
    assert one(found, "DCGM_FI_DEV_GPU_UTIL", Hostname="gpu-8").value == 55.0
    for name in ("gpu-7", "gpu-8"):
        assert one(found, "gpudeck_box_up", host=name).value == 1.0
        info = one(found, "gpudeck_box_info", host=name)
        assert (info.labels["hostname"], info.labels["readonly"]) == (f"{name}.example", "true")
        assert one(found, "gpudeck_exporter_info", host=name).labels["gpu_source"] == "nvml"
    # this machine's series are what the local exporter alone serves: no box_up of its own
    assert not [s for s in found["gpudeck_box_up"] if s.labels["host"] == "box1"]
    assert {s.labels["host"] for s in found["gpudeck_exporter_jobs_up"]} == {"box1", "gpu-7", "gpu-8"}


def test_a_hanging_box_is_down_within_the_bound_and_not_asked_again_while_stuck():
    frozen = FakeBox("frozen", [TRAIN], hang=True)
    boxes = [core.BoxSource(FakeBox("ok", [SERVE]), timeout_s=0.3), core.BoxSource(frozen, timeout_s=0.3)]
    collector = core.FleetCollector(None, boxes)
    try:
        t0 = time.monotonic()
        found = samples(scrape_text(collector))
        first = time.monotonic() - t0
        assert first < 0.3 + 0.5
        assert one(found, "gpudeck_box_up", host="frozen").value == 0.0
        assert one(found, "gpudeck_exporter_jobs_up", host="frozen").value == 0.0
        assert one(found, "gpudeck_exporter_gpus_up", host="frozen").value == 0.0
        assert not [s for s in found["gpudeck_job_state"] if s.labels["host"] == "frozen"]
        assert one(found, "gpudeck_box_up", host="ok").value == 1.0
        time.sleep(0.35)
        t0 = time.monotonic()
        found = samples(scrape_text(collector))
        assert time.monotonic() - t0 < 0.2            # the stuck read is not waited for again
        assert one(found, "gpudeck_box_up", host="frozen").value == 0.0
        assert frozen.calls == 1                      # nor is a second read piled onto the stuck link
        frozen.release.set()                          # it thaws: the old answer is dropped, a new read answers
        time.sleep(0.05)
        found = samples(scrape_text(collector))
        assert one(found, "gpudeck_box_up", host="frozen").value == 1.0 and frozen.calls == 2
    finally:
        collector.close()


def test_a_box_that_refuses_the_link_is_down_at_once_and_says_why():
    source = core.BoxSource(FakeBox("gone", [], fail="gone: cannot connect: Connection refused"), timeout_s=5)
    changes = []
    collector = core.FleetCollector(None, [source])
    collector.on_change = lambda *change: changes.append(change)
    t0 = time.monotonic()
    found = samples(scrape_text(collector))
    assert time.monotonic() - t0 < 1.0
    assert one(found, "gpudeck_box_up", host="gone").value == 0.0
    assert changes == [("gone", False, "gone: cannot connect: Connection refused")]


def test_the_exporter_reaches_every_remote_box_read_only(tmp_path, monkeypatch):
    import argparse

    from gpudeck.console.commands.exporter import box_specs
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.a]\nssh = "a"\n\n[hosts.b]\nssh = "b"\nreadonly = true\n')
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))

    def specs(**kw):
        ns = argparse.Namespace(**{"host": None, "hosts": None, "all_hosts": False, "readonly": False, **kw})
        return [(s.name, s.readonly) for s in box_specs(ns)]
    assert specs() == []                                            # no --host: this machine, as always
    assert specs(host="a") == [("a", True)]                         # `gpudeck --host a exporter`
    assert specs(hosts=["b", "a", "b"]) == [("b", True), ("a", True)]
    assert specs(all_hosts=True) == [("local", False), ("a", True), ("b", True)]
    assert specs(hosts=["local"]) == []                             # `--host local` alone: the plain exporter
