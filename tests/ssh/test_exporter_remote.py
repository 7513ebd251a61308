"""`gpudeck exporter --host BOX` over a real OpenSSH server: a remote box's jobs and GPUs through the Box seam,
labelled host="BOX"; a box that stops answering is `gpudeck_box_up 0` within the bound, and the scrape never hangs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from promsupport import prom_query, start_prometheus
from runsupport import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def gd(lab, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class Exporter:
    """`gpudeck exporter ARGS --listen 127.0.0.1:0` as a process: its port from the line it prints."""

    def __init__(self, lab, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gpudeck.console.cli", "exporter", *args,
                                      "--listen", "127.0.0.1:0"], cwd=REPO, env=lab.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.line = self.proc.stdout.readline()
        if "serving http://127.0.0.1:" not in self.line:
            self.stop()
            raise AssertionError(f"exporter did not serve: {self.line!r} {self.proc.stderr.read()}")
        self.port = int(self.line.split("http://127.0.0.1:")[1].split("/")[0])

    def scrape(self, timeout: float = 30) -> tuple[dict[str, list], float]:
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout) as reply:
            text = reply.read().decode()
        took = time.monotonic() - t0
        found: dict[str, list] = {}
        for fam in text_string_to_metric_families(text):
            found.setdefault(fam.name, []).extend(fam.samples)
        return found, took

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.stderr.read() if self.proc.stderr else ""


def value(found: dict[str, list], name: str, **labels: str) -> Optional[float]:
    hits = [s for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) <= 1, hits
    return hits[0].value if hits else None


def test_exporter_serves_remote_boxes_and_a_frozen_one_is_down_within_the_bound(lab):
    started = gd(lab, "--host", "box", "start", "sleeper")
    assert started.returncode == 0, started.stderr
    exporter = Exporter(lab, "--host", "box", "--host", "box2", "--box-timeout", "2")
    try:
        assert "boxes box, box2" in exporter.line and "read-only" in exporter.line, exporter.line
        found, took = wait_for(lambda: (lambda f: f if value(f[0], "gpudeck_job_state", host="box", job_name="sleeper",
                                                             state="running") == 1.0 else None)(exporter.scrape()),
                               timeout=30, what="the sleeper running on box", interval=0.5)
        print(f"scrape of 2 remote boxes: {took * 1000:.0f} ms")
        for box in ("box", "box2"):
            assert value(found, "gpudeck_box_up", host=box) == 1.0
            assert value(found, "gpudeck_exporter_jobs_up", host=box) == 1.0
            info = [s for s in found["gpudeck_box_info"] if s.labels["host"] == box][0]
            assert info.labels["readonly"] == "true"              # the exporter's agents refuse to act
            assert info.labels["agent_version"]
            # the same names as the local exporter, told apart by host
            assert value(found, "gpudeck_job_state", host=box, job_name="count", state="idle") == 1.0
            gpus = [s for s in found["DCGM_FI_DEV_GPU_UTIL"] if s.labels["Hostname"] == box]
            assert len(gpus) == 8                                   # the boxes are SIMULATED 8-GPU ones
            assert [s for s in found["gpudeck_exporter_info"] if s.labels["host"] == box][0] \
                .labels["gpu_source"] == "SIMULATED"
        assert [s for s in found["gpudeck_job_phase"] if s.labels["host"] == "box" and s.labels["job_name"] == "sleeper"]
        assert value(found, "gpudeck_job_state", host="box2", job_name="sleeper", state="idle") == 1.0
        assert value(found, "gpudeck_job_start_time_seconds", host="box", job_name="sleeper") > time.time() - 600
        assert not [s for fam in found.values() for s in fam if "job" in s.labels]
        # Warm scrapes are quick: a few round trips over each box's kept link.
        times = [exporter.scrape()[1] for _ in range(5)]
        print("warm scrapes (ms):", [round(t * 1000) for t in times])
        assert min(times) < 1.5

        # box2 vanishes without a goodbye (listener and sessions SIGSTOPped): the scrape still answers,
        # within the 2 s bound, box2 down, box still up with its jobs.
        lab.box2.freeze()
        try:
            found, took = exporter.scrape(timeout=10)
            print(f"scrape with box2 frozen: {took * 1000:.0f} ms")
            assert took < 2 + 1.5
            assert value(found, "gpudeck_box_up", host="box2") == 0.0
            assert value(found, "gpudeck_exporter_jobs_up", host="box2") == 0.0
            assert not [s for s in found["gpudeck_job_state"] if s.labels["host"] == "box2"]
            assert not [s for s in found["DCGM_FI_DEV_GPU_UTIL"] if s.labels["Hostname"] == "box2"]
            assert value(found, "gpudeck_box_up", host="box") == 1.0
            assert value(found, "gpudeck_job_state", host="box", job_name="sleeper", state="running") == 1.0
            # Later scrapes neither pile reads up on the stuck link nor wait for it again: they answer at once.
            again = [exporter.scrape(timeout=10) for _ in range(2)]
            assert all(t < 1.0 and value(f, "gpudeck_box_up", host="box2") == 0.0 for f, t in again)
            print("scrapes with box2 still frozen (ms):", [round(t * 1000) for _, t in again])
        finally:
            lab.box2.thaw()
        # Back: it answers again (the kept link recovers or reconnects).
        wait_for(lambda: value(exporter.scrape()[0], "gpudeck_box_up", host="box2") == 1.0, timeout=60,
                 what="box2 up again after the thaw", interval=0.5)
    finally:
        err = exporter.stop()
    assert "Traceback" not in err, err
    assert "box2 is DOWN" in err and "box2 answers" in err, err


def test_exporter_down_host_from_the_start_and_the_host_options(lab):
    """A box whose sshd is gone: up 0 from the first scrape; an unknown name is refused in one line."""
    bad = gd(lab, "exporter", "--host", "nosuch", "--listen", "127.0.0.1:0")
    assert bad.returncode == 2 and "no host named 'nosuch'" in bad.stderr and "Traceback" not in bad.stderr
    demo = gd(lab, "--demo", "exporter", "--host", "box", "--listen", "127.0.0.1:0")
    assert demo.returncode == 2 and "--demo" in demo.stderr
    lab.box2.stop()
    exporter = Exporter(lab, "--all-hosts", "--box-timeout", "2", "--no-gpus")
    try:
        found, took = exporter.scrape(timeout=10)
        print(f"scrape, box up, box2 down: {took * 1000:.0f} ms")
        assert took < 2 + 1.5
        assert value(found, "gpudeck_box_up", host="box") == 1.0
        assert value(found, "gpudeck_box_up", host="box2") == 0.0
        assert "DCGM_FI_DEV_GPU_UTIL" not in found and "gpudeck_exporter_gpus_up" not in found      # --no-gpus
        # hosts.toml's `local` entry is this machine, served as the plain exporter serves it
        local = [s for s in found["gpudeck_exporter_info"] if s.labels["host"] not in ("box", "box2")]
        assert len(local) == 1
    finally:
        err = exporter.stop()
    assert "Traceback" not in err, err


# ------------------------------------------------------------------------------- a real Prometheus

def _prometheus() -> Optional[str]:
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


def test_a_real_prometheus_scrapes_a_remote_boxs_job(lab, tmp_path):
    binary = _prometheus()
    if binary is None:
        pytest.skip("prometheus is not installed (tests/test_exporter.py installs it where it can)")
    assert gd(lab, "--host", "box", "start", "sleeper").returncode == 0
    exporter = Exporter(lab, "--host", "box", "--no-gpus")
    prom, base = start_prometheus(binary, f"127.0.0.1:{exporter.port}", tmp_path)
    try:
        t0 = time.monotonic()
        result = wait_for(lambda: prom_query(base, 'gpudeck_job_state{host="box",job_name="sleeper",'
                                                   'state="running"} == 1'),
                          timeout=30, what="Prometheus to return box's sleeper running", interval=0.5)
        print(f"Prometheus had box's sleeper after {time.monotonic() - t0:.1f} s")
        assert result[0]["metric"]["job"] == "gpudeck"
        up = prom_query(base, 'gpudeck_box_up{host="box"}')
        assert up and up[0]["value"][1] == "1"
        assert prom_query(base, 'up{job="gpudeck"}')[0]["value"][1] == "1"      # scraped within 1 s
    finally:
        prom.terminate()
        prom.wait(timeout=20)
        err = exporter.stop()
    assert "Traceback" not in err, err
