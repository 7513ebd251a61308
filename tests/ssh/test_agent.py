"""The remote agent without SSH: its zipapp runs on a bare Python (-I -S: no site-packages) over pipes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpudeck.jobs.hosts.bundle import agent_zipapp
from gpudeck.jobs.hosts.protocol import HELLO, diff, encode, pack_status, patch, unpack_status

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON, JSON)
def test_a_delta_turns_old_into_new(old, new):
    delta = diff(old, new)
    assert json.dumps(patch(old, delta), sort_keys=True) == json.dumps(new, sort_keys=True)
    if json.dumps(old) == json.dumps(new):
        assert delta is None


def test_packed_status_keeps_the_status_shape_at_display_precision():
    from gpudeck.jobs.telemetry.sampler import SimulatedSampler
    from gpudeck.jobs.telemetry.status import status_payload
    sampler = SimulatedSampler()
    raw = status_payload(sampler.sample())
    back = unpack_status(json.loads(json.dumps(pack_status(raw))))
    assert set(back) == set(raw) and set(back["host"]) == set(raw["host"])
    assert [set(g) for g in back["gpus"]] == [set(g) for g in raw["gpus"]]
    for got, want in zip(back["gpus"], raw["gpus"]):
        assert abs(got["util"] - want["util"]) <= 0.5 and got["mem_used"] == want["mem_used"]
        assert [p["pid"] for p in got["processes"]] == [p["pid"] for p in want["processes"]]
        for p, q in zip(got["processes"], want["processes"]):
            assert q["age_s"] is None or abs(p["age_s"] - q["age_s"]) <= 1
    cores = zip(back["host"]["cpu_per_core"], raw["host"]["cpu_per_core"])
    assert all(abs(a - b) <= 100 / 63 for a, b in cores)
    assert [p["port"] for p in back["ports"]] == [p["port"] for p in raw["ports"]]


def test_the_zipapp_is_reproducible_and_holds_only_sources():
    import io
    import zipfile
    name, data = agent_zipapp()
    agent_zipapp.cache_clear()
    assert agent_zipapp() == (name, data)
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "__main__.py" in names and "gpudeck/jobs/runner.py" in names and "gpudeck/jobs/hosts/agent.py" in names
    assert all(n.endswith(".py") for n in names)
    assert name.startswith("agent-") and name.endswith(".pyz")


class Pipe:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.hello = json.loads(self.proc.stdout.readline())
        self.ids = 0

    def call(self, op: str, **params) -> dict:
        self.ids += 1
        self.proc.stdin.write(encode({"id": self.ids, "op": op, "params": params}))
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.ids:
                return reply

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def test_agent_zipapp_on_a_bare_python(tmp_path):
    name, data = agent_zipapp()
    zipapp = tmp_path / name
    zipapp.write_bytes(data)
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.hello]\ncmd = "echo hello from the box; sleep 0.2; echo bye"\n')
    # -I -S: no site-packages, no user site, no env vars: psutil, nvidia-ml-py and asyncssh cannot be imported.
    agent = Pipe([sys.executable, "-I", "-S", str(zipapp), "--jobs", str(jobs), "--state-dir", str(tmp_path / "st")])
    try:
        assert agent.hello["hello"] == HELLO and agent.hello["via"] == "zipapp"
        packed = agent.call("status", delta=True)["result"]["full"]
        status = unpack_status(packed)
        assert status["source"] == {"gpu": "nvidia-smi", "host": "/proc"}
        assert status["host"]["cpu_count"] > 0 and status["host"]["mem_total"] > 0
        assert status["gpus"] or status["gpu_error"]
        second = agent.call("status", delta=True)["result"]
        assert "delta" in second and len(json.dumps(second)) < len(json.dumps(packed))
        run_id = agent.call("start", job="hello")["result"]["run_id"]
        deadline = time.monotonic() + 30
        while True:
            jobs_reply = agent.call("jobs")["result"]
            state = next(j for j in jobs_reply["jobs"] if j["name"] == "hello")
            if state["state"] == "exited" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert state["state"] == "exited" and state["exit_code"] == 0 and state["run_id"] == run_id
        import base64
        logs = agent.call("logs", job="hello", offset=0)["result"]
        assert base64.b64decode(logs["data"]) == b"hello from the box\nbye\n"
        rest = agent.call("logs", job="hello", offset=logs["next_offset"], wait_s=1)["result"]
        assert rest["data"] == "" and rest["ended"] is True
        bad = agent.call("start", job="nope")
        assert bad["ok"] is False and "no job named 'nope'" in bad["error"] and not bad.get("internal")
        assert agent.call("frobnicate")["ok"] is False
    finally:
        assert agent.close() == 0


def test_the_agent_on_a_bare_python_lists_listening_ports_without_psutil(tmp_path):
    import os
    import socket

    from gpudeck.jobs.telemetry.snapshot import Snapshot
    from gpudeck.jobs.telemetry.status import render_status_text, snapshot_from_payload
    name, data = agent_zipapp()
    zipapp = tmp_path / name
    zipapp.write_bytes(data)
    with socket.socket(socket.AF_INET6) as s6, socket.socket() as s4:
        s4.bind(("127.0.0.1", 0))
        s4.listen()
        s6.bind(("::1", 0))
        s6.listen()
        wanted = ((s4.getsockname()[1], "127.0.0.1"), (s6.getsockname()[1], "::1"))
        # -I -S: no psutil; the ports come from sock_diag or /proc/net/tcp{,6}, the owner from /proc/PID/fd.
        agent = Pipe([sys.executable, "-I", "-S", str(zipapp), "--state-dir", str(tmp_path / "st")])
        try:
            status = unpack_status(agent.call("status")["result"]["full"])
        finally:
            assert agent.close() == 0
    assert status["source"]["host"] == "/proc" and "ports_error" not in status
    mine = {(p["port"], p["address"]): p for p in status["ports"]}
    for key in wanted:
        found = mine.get(key)
        assert found and found["pid"] == os.getpid() and found["process"], status["ports"]
    assert "no listening TCP ports" not in render_status_text(snapshot_from_payload(status))
    # And where ports really cannot be read, the text says so instead of "no ports".
    blind = Snapshot(time=0.0, host=snapshot_from_payload(status).host, extra={"ports_error": "no /proc here"})
    assert "ports: unknown (no /proc here)" in render_status_text(blind)


def test_a_down_host_is_retried_with_doubling_backoff_up_to_the_cap():
    """A real refused TCP port: DOWN at once, retries 1x, 2x, 4x the first delay, never past the cap."""
    import asyncio
    import socket

    from gpudeck.jobs.hosts.config import HostSpec
    from gpudeck.jobs.hosts.ssh import DOWN, HostLink

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again: connecting is refused
    spec = HostSpec("gone", ssh=f"nobody@127.0.0.1:{port}", connect_timeout_s=2)

    async def scenario():
        delays = []
        link = HostLink(spec, backoff_first_s=0.2, backoff_max_s=0.8)

        def changed(l):
            if l.state == DOWN and l.next_retry is not None:
                delays.append(l.next_retry - time.time())

        link._on_change = changed
        link.start()
        deadline = time.monotonic() + 30
        while len(delays) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert link.state == DOWN and "cannot connect" in link.error
        await link.close()
        return delays

    delays = asyncio.run(scenario())
    assert len(delays) >= 5
    expected = [0.2, 0.4, 0.8, 0.8, 0.8]
    for got, want in zip(delays, expected):
        assert want - 0.15 <= got <= want + 0.05, (delays, expected)


def test_link_age_levels_and_overview_row():
    from gpudeck.jobs.hosts.fleet import HostView
    live = HostView(name="a", ssh="a", state="LIVE", data_age_s=0.5)
    assert live.age_level == "ok"
    assert HostView(name="a", ssh="a", state="STALE", data_age_s=11).age_level == "amber"
    assert HostView(name="a", ssh="a", state="DOWN", data_age_s=61).age_level == "red"
    row = HostView(name="a", ssh="a", state="LIVE", data_age_s=0.1,
                   status={"gpus": [{"util": 50.0, "mem_used": 1, "mem_total": 4}, {"util": 70.0, "mem_used": 1,
                                                                                    "mem_total": 4}]},
                   jobs={"jobs": [{"state": "running", "alerts": [{"code": "stalled"}]},
                                  {"state": "exited", "exit_code": 1}, {"state": "exited", "exit_code": 0}]}).summary()
    assert (row["gpus"], row["gpu_util"], row["gpu_mem_used"], row["gpu_mem_total"]) == (2, 60.0, 2, 8)
    assert (row["jobs_running"], row["jobs_failed"], row["alerts"]) == (1, 1, 1)


def test_nvidia_smi_csv_is_read_when_nvml_is_not_importable(tmp_path, monkeypatch):
    """A stand-in `nvidia-smi` (named as such) answering the exact query the agent sends, in the driver's CSV
    format with its N/A spellings: the bare-box GPU source parses it (the real tool runs on GPU machines)."""
    from gpudeck.jobs.telemetry.gpu.nvidia_smi import SMI_FIELDS as _SMI_FIELDS, SmiGpuSource
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text("#!/bin/sh\n"
                        f'[ "$1" = "--query-gpu={",".join(_SMI_FIELDS)}" ] || exit 9\n'
                        'echo "0, NVIDIA H200, GPU-aaaa, 87, 41, 130000, 143771, 61, 512.35, 700.00, 1980, 3201, [N/A]"\n'
                        'echo "1, NVIDIA H200, GPU-bbbb, 0, 0, 1, 143771, 33, 118.02, 700.00, 345, 3201, [Not Supported]"\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    gpus, error = SmiGpuSource().read()
    assert error is None and [g.index for g in gpus] == [0, 1]
    g = gpus[0]
    assert (g.name, g.uuid, g.util, g.mem_util, g.temp, g.power_w, g.sm_clock_mhz) == \
        ("NVIDIA H200", "GPU-aaaa", 87.0, 41.0, 61.0, 512.35, 1980)
    assert g.mem_used == 130000 << 20 and g.mem_total == 143771 << 20 and g.fan_pct is None
    assert gpus[1].fan_pct is None and gpus[1].util == 0.0
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert SmiGpuSource().read() == ((), "no NVIDIA driver: nvidia-smi not found on this box")


def test_no_keeper_where_its_socket_path_would_not_fit(tmp_path, monkeypatch):
    from gpudeck.jobs.hosts import mux
    from gpudeck.jobs.hosts.config import HostSpec
    spec = HostSpec("box", ssh="box")
    # A short runtime dir of its own: pytest's tmp_path (deeper still under an xdist worker) may
    # itself be too long for a socket path.
    short = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
        monkeypatch.delenv("GPUDECK_SSH_MUX", raising=False)
        assert mux.enabled(spec)
        deep = short / ("d" * 60) / ("e" * 60)
        deep.mkdir(parents=True)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
        assert not mux.enabled(spec)           # the CLI then holds its own link instead
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
        monkeypatch.setenv("GPUDECK_SSH_MUX", "0")
        assert not mux.enabled(spec)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_the_readme_hosts_toml_example_loads(tmp_path):
    import re
    from pathlib import Path

    from gpudeck.jobs.hosts.config import load_hosts
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"## Several boxes over SSH\n.*?```toml\n(.*?)```", readme, flags=re.S).group(1)
    path = tmp_path / "hosts.toml"
    path.write_text(block)
    hosts = load_hosts(path)
    assert list(hosts) == ["local", "box", "lab-2"]
    assert hosts["box"].destination() == (None, "box", None) and hosts["box"].jobs == "~/work/jobs.toml"
    assert hosts["lab-2"].destination() == ("ops", "10.0.0.12", None) and hosts["lab-2"].keepalive_s == 15
