"""`gpudeck status` as a real subprocess: real sockets, real JSON, one-line errors."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeck.jobs.telemetry import gpu as gpu_seam
from runsupport import own_cmdline

REPO = Path(__file__).resolve().parent.parent


def gpudeck(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)




def test_json_lists_the_socket_this_test_opened_with_its_pid():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = gpudeck("status", "--json", "--interval", "0.2")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    mine = [p for p in payload["ports"] if p["port"] == port]
    assert mine == [{"port": port, "address": "127.0.0.1", "pid": os.getpid(), "process": mine[0]["process"],
                     "cmdline": mine[0]["cmdline"], "user": mine[0]["user"]}]
    assert mine[0]["process"] and mine[0]["cmdline"] == own_cmdline()
    assert payload["simulated"] is False
    host = payload["host"]
    assert host["cpu_count"] == os.cpu_count() and 0 < host["mem_used"] < host["mem_total"]
    assert host["cpu_percent"] is not None and host["disk_read_bps"] is not None   # two readings were taken
    for key in ("name", "cpu_percent", "cpu_count", "mem_total", "mem_used", "load_avg", "net_rx_bps"):
        assert key in host


def test_default_status_has_rates_over_its_window():
    # No --interval: the first host reading opens a window the engine scan runs inside; rates are there.
    out = gpudeck("status", "--json")
    assert out.returncode == 0, out.stderr
    host = json.loads(out.stdout)["host"]
    assert host["cpu_percent"] is not None and 0 <= host["cpu_percent"] <= 100
    assert host["disk_read_bps"] is not None and host["net_rx_bps"] is not None


@pytest.mark.skipif(gpu_seam.local().available(), reason="this machine has a working NVIDIA driver")
def test_without_a_gpu_the_reason_is_given_and_require_gpu_fails_in_one_line():
    out = gpudeck("status", "--json", "--interval", "0")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["gpus"] == [] and payload["gpu_error"]
    text = gpudeck("status", "--interval", "0")
    assert text.returncode == 0 and f"GPUs: none ({payload['gpu_error']})" in text.stdout
    strict = gpudeck("status", "--require-gpu", "--interval", "0")
    assert strict.returncode == 3
    assert strict.stderr.strip().splitlines() == [f"gpudeck: no GPU telemetry: {payload['gpu_error']}"]


def test_demo_json_is_eight_simulated_gpus():
    out = gpudeck("--demo", "status", "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["simulated"] is True and payload["gpu_error"] is None
    assert len(payload["gpus"]) == 8 and all(g["simulated"] for g in payload["gpus"])
    for g in payload["gpus"]:
        for key in ("index", "name", "util", "mem_used", "mem_total", "temp", "power_w", "processes"):
            assert key in g
        assert g["processes"] and {"pid", "mem_used"} <= set(g["processes"][0])
    assert {p["port"] for p in payload["ports"]} >= {22, 8000}


def test_demo_table_says_simulated():
    out = gpudeck("--demo", "status")
    assert out.returncode == 0, out.stderr
    assert "SIMULATED" in out.stdout.splitlines()[0]
    assert "VLLM::Worker_TP7" in out.stdout and "NVIDIA H200" in out.stdout


def test_negative_interval_is_a_one_line_error():
    out = gpudeck("status", "--interval", "-1")
    assert out.returncode == 2
    assert out.stderr.strip() == "gpudeck: --interval must be >= 0"


def test_payload_carries_later_layers_without_letting_them_overwrite_core_keys():
    import dataclasses

    from gpudeck.jobs.telemetry.simulated import SimulatedBox
    from gpudeck.jobs.telemetry.status import status_payload

    snap = SimulatedBox(0).snapshot(0)
    snap = dataclasses.replace(snap, extra={"engines": [{"name": "vllm", "port": 8000}], "gpus": "clobber"})
    payload = status_payload(snap)
    assert payload["engines"] == [{"name": "vllm", "port": 8000}]
    assert len(payload["gpus"]) == 8
