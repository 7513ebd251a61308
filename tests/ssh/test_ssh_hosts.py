"""gpudeck --host over a real OpenSSH server: jobs, logs, stop, dropped connections, host keys, the fleet."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runsupport import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gd(lab, *args: str, timeout: float = 90, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO,
                          env=env or lab.env, capture_output=True, text=True, timeout=timeout)


def jobs_json(lab, host: str = "box") -> dict:
    out = gd(lab, "--host", host, "jobs", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def job(payload: dict, name: str) -> dict:
    return next(j for j in payload["jobs"] if j["name"] == name)


def run_dirs(lab, host: str, name: str) -> list[Path]:
    return sorted((lab.state_dir(host) / "runs" / name).glob("2*"))


def test_start_jobs_logs_stop_over_ssh(lab):
    started = gd(lab, "--host", "box", "start", "count")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    payload = jobs_json(lab)
    assert payload["host"] == "box" and job(payload, "count")["host"] == "box"
    assert job(payload, "count")["run_id"] == run_id
    # The run lives on box's state dir, not on box2's and not locally.
    assert [d.name for d in run_dirs(lab, "box", "count")] == [run_id]
    assert not run_dirs(lab, "box2", "count")
    wait_for(lambda: job(jobs_json(lab), "count")["state"] == "exited", 60, "count to finish")
    logs = gd(lab, "--host", "box", "logs", "count")
    assert logs.stdout.splitlines() == [f"line {i}" for i in range(400)]
    tail = gd(lab, "--host", "box", "logs", "-n", "2", "count")
    assert tail.stdout.splitlines() == ["line 398", "line 399"]
    # Same bytes as on the box's disk.
    on_disk = (run_dirs(lab, "box", "count")[0] / "output.log").read_text()
    assert logs.stdout == on_disk
    # GPUDECK_HOST works like --host.
    env = dict(lab.env, GPUDECK_HOST="box")
    assert json.loads(gd(lab, "jobs", "--json", env=env).stdout)["host"] == "box"


def test_status_over_ssh_names_its_source_and_agent(lab):
    out = gd(lab, "--host", "box", "status", "--json", "--interval", "0")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["host_name"] == "box"
    assert payload["simulated"] is True and len(payload["gpus"]) == 8
    assert payload["source"] == {"gpu": "simulated", "host": "simulated"}
    # The box has no gpudeck for /usr/bin/python3: the zipapp was shipped and used.
    assert payload["agent"]["via"] == "zipapp"
    cached = list((lab.box.home / ".cache" / "gpudeck").glob("agent-*.pyz"))
    assert len(cached) == 1
    text = gd(lab, "--host", "box", "status", "--interval", "0")
    assert "SIMULATED" in text.stdout and "GPU via simulated" in text.stdout


def test_installed_gpudeck_on_the_box_is_used(lab):
    # This venv's python has gpudeck installed: the agent runs from it, no zipapp involved.
    lab.setup(lab.work, extra=f'python = "{sys.executable}"\nagent = "installed"\n')
    payload = json.loads(gd(lab, "--host", "box", "status", "--json", "--interval", "0").stdout)
    assert payload["agent"]["via"] == "installed"


def test_unknown_host_and_bad_hosts_file_are_one_line(lab):
    out = gd(lab, "--host", "nope", "jobs")
    assert out.returncode == 2 and out.stderr.startswith("gpudeck: no host named 'nope'")
    assert "Traceback" not in out.stderr
    out = gd(lab, "--host", "box", "pivot", "count")
    assert out.returncode == 2 and "count is not an engine job" in out.stderr and len(out.stderr.splitlines()) == 1
    out = gd(lab, "--host", "box", "start", "nosuchjob")
    assert out.returncode == 2 and "no job named 'nosuchjob'" in out.stderr and "Traceback" not in out.stderr


def _follow(lab, job_name: str):
    proc = subprocess.Popen([sys.executable, "-m", "gpudeck.console.cli", "--host", "box", "logs", "-f", job_name],
                            cwd=REPO, env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    return proc, lines, reader


def test_logs_follow_resumes_after_the_sshd_session_is_killed(lab):
    assert gd(lab, "--host", "box", "start", "count").returncode == 0
    proc, lines, reader = _follow(lab, "count")
    try:
        wait_for(lambda: len(lines) >= 50, 30, "50 lines through logs -f")
        sessions = wait_for(lab.box.sessions, 10, "an sshd session")
        killed = lab.box.kill_sessions()
        assert killed and set(killed) <= set(sessions)
        seen_at_kill = len(lines)
        assert seen_at_kill < 400, "the job finished before the kill; the test proves nothing"
        proc.wait(timeout=90)
    finally:
        proc.kill()
    reader.join(timeout=10)
    assert proc.returncode == 0, proc.stderr.read()
    # Every line exactly once, in order: no gap, no duplicate across the reconnect.
    assert [ln.rstrip("\n") for ln in lines] == [f"line {i}" for i in range(400)]
    # The job itself never noticed: it ran to the end and exited 0.
    state = job(jobs_json(lab), "count")
    assert state["state"] == "exited" and state["exit_code"] == 0


def test_dropped_connection_leaves_the_job_running_with_its_full_log(lab):
    run_id = gd(lab, "--host", "box", "start", "sleeper").stdout.strip()
    before = wait_for(lambda: (lambda j: j if j["state"] == "running" else None)(job(jobs_json(lab), "sleeper")),
                      30, "sleeper running")
    # Keep a connection open (logs -f), then drop it hard, as a closed laptop lid does.
    proc, lines, _ = _follow(lab, "sleeper")
    try:
        wait_for(lambda: lines, 30, "the first line")
        lab.box.kill_sessions()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    after = job(jobs_json(lab), "sleeper")
    assert after["state"] == "running" and after["pid"] == before["pid"] and after["run_id"] == run_id
    assert is_alive(before["pid"])
    assert gd(lab, "--host", "box", "logs", "sleeper").stdout == "sleeper up\n"


def test_remote_stop_of_a_job_with_setsid_grandchildren_leaves_nothing(lab):
    assert gd(lab, "--host", "box", "start", "tree").returncode == 0
    pids_file = lab.work / "tree.pids"
    wait_for(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3, 30, "three setsid pids")
    pids = [int(p) for p in pids_file.read_text().split()]
    running = wait_for(lambda: (lambda j: j if j["state"] == "running" else None)(job(jobs_json(lab), "tree")),
                       30, "tree running")
    for pid in pids:
        assert is_alive(pid) and os.getsid(pid) != os.getsid(running["pid"]), "grandchildren must be in own sessions"
    out = gd(lab, "--host", "box", "stop", "tree", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["host"] == "box" and report["clean"] is True and not report["remaining"]
    for pid in [running["pid"], *pids]:
        assert not is_alive(pid), f"pid {pid} survived the remote stop"
    assert job(jobs_json(lab), "tree")["state"] == "stopped"


def test_unknown_host_key_is_refused_then_trusted(lab):
    lab.client.known_hosts.write_text("")
    try:
        out = gd(lab, "--host", "box", "jobs")
        fingerprint = subprocess.run(["ssh-keygen", "-lf", str(lab.box.host_key) + ".pub"], capture_output=True,
                                     text=True).stdout.split()[1]
        assert out.returncode == 1
        assert "unknown host key" in out.stderr and fingerprint in out.stderr
        assert "gpudeck hosts trust box" in out.stderr and len(out.stderr.strip().splitlines()) == 1
        # Without a terminal and without --yes nothing is recorded.
        out = gd(lab, "hosts", "trust", "box")
        assert out.returncode == 2 and fingerprint in out.stdout and lab.client.known_hosts.read_text() == ""
        out = gd(lab, "hosts", "trust", "box", "--yes")
        assert out.returncode == 0 and fingerprint in out.stdout
        assert gd(lab, "--host", "box", "jobs").returncode == 0
    finally:
        lab.client.trust(lab.box)
        lab.client.trust(lab.box2)


def test_changed_host_key_is_refused(lab, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    lab.client.known_hosts.write_text(f"[127.0.0.1]:{lab.box.port} {Path(str(other) + '.pub').read_text()}")
    try:
        out = gd(lab, "--host", "box", "jobs")
        assert out.returncode == 1 and "HOST KEY CHANGED" in out.stderr
        assert "gpudeck hosts trust box" in out.stderr and "Traceback" not in out.stderr
    finally:
        lab.client.known_hosts.write_text("")
        lab.client.trust(lab.box)
        lab.client.trust(lab.box2)


def test_frozen_box_goes_down_within_keepalive_while_the_other_stays_live(lab, monkeypatch):
    from gpudeck.jobs.hosts.config import load_hosts
    from gpudeck.jobs.hosts.fleet import Fleet
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    fleet = Fleet(list(load_hosts().values()), interval=0.5).start()
    try:
        wait_for(lambda: all(v.state == "LIVE" and v.status for v in fleet.views().values()), 30, "both LIVE")
        lab.box.freeze()
        frozen_at = time.monotonic()
        wait_for(lambda: fleet.views()["box"].state == "DOWN", 15, "box DOWN")
        took = time.monotonic() - frozen_at
        # keepalive 1 s x 3 is the window; asyncssh's timer granularity, one poll interval and a
        # loaded 2-core machine come on top. 15 s x 3 (the default) would be 45 s.
        assert took < 10, f"DOWN after {took:.1f}s"
        box2 = fleet.views()["box2"]
        assert box2.state == "LIVE" and box2.data_age_s is not None and box2.data_age_s < 2
        # Views never wait on the network: reading them is instant even with a dead host.
        t0 = time.perf_counter()
        for _ in range(100):
            fleet.views()
        assert time.perf_counter() - t0 < 0.5
        down = fleet.views()["box"]
        assert down.status is not None, "the last data stays shown, with its age"
        lab.box.thaw()
        wait_for(lambda: fleet.views()["box"].state == "LIVE", 60, "box LIVE again")
        assert fleet.views()["box"].connects >= 2
    finally:
        lab.box.thaw()
        fleet.close()


def test_stopped_sshd_is_down_with_backoff_and_the_other_host_unaffected(lab):
    lab.box.stop()
    t0 = time.monotonic()
    out = gd(lab, "--host", "box", "jobs")
    assert out.returncode == 1 and "cannot connect" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 30
    assert gd(lab, "--host", "box2", "jobs").returncode == 0
    # The keeper keeps retrying box with a growing backoff (1, 2, 4, 8 s by now) ...
    time.sleep(8)
    lab.box.start()
    # ... but a command cuts the backoff short: the box answers at once once it is back.
    t0 = time.monotonic()
    out = gd(lab, "--host", "box", "jobs")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 6


def test_check_over_ssh(lab):
    out = gd(lab, "--host", "box", "check")
    assert out.returncode == 0 and out.stdout.startswith(f"box:{lab.work / 'jobs.toml'}: 5 jobs OK")
    (lab.work / "jobs.toml").write_text('[jobs.bad]\ncmd = 3\n')
    out = gd(lab, "--host", "box", "check")
    assert out.returncode == 1 and "jobs.toml:2:" in out.stdout and "1 error" in out.stderr


def test_proxyjump_from_ssh_config_is_honoured(lab):
    # `hop` reaches box2 only through box (ProxyJump): the alias comes from ~/.ssh/config alone.
    config = lab.client.ssh_dir / "config"
    original = config.read_text()
    user = os.environ.get("USER") or "root"
    config.write_text(original + "\n".join([
        "Host hop", "  HostName 127.0.0.1", f"  Port {lab.box2.port}", f"  User {user}",
        f"  IdentityFile {lab.client.key}", "  IdentitiesOnly yes", "  ProxyJump box", ""]))
    hosts = lab.client.config_dir / "hosts.toml"
    hosts.write_text(hosts.read_text() + f'\n[hosts.hop]\nssh = "hop"\njobs = "{lab.work / "jobs.toml"}"\n'
                     f'state_dir = "{lab.work / "state-hop"}"\nsimulated = true\n')
    try:
        # Sessions are told apart by PID: a link left from an earlier command may end meanwhile
        # (CI once counted 1 before and 1 during: one ended as the jump's began).
        box_sessions = set(lab.box.sessions())
        assert gd(lab, "--host", "hop", "start", "sleeper").returncode == 0
        proc = subprocess.Popen([sys.executable, "-m", "gpudeck.console.cli", "--host", "hop", "logs", "-f", "sleeper"],
                                cwd=REPO, env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline() == "sleeper up\n"
            # The jump went through box's sshd (a session there) and the run is on hop's state dir.
            assert set(lab.box.sessions()) - box_sessions
            assert run_dirs(lab, "hop", "sleeper")
        finally:
            proc.kill()
            proc.wait(timeout=10)
        assert gd(lab, "--host", "hop", "stop", "sleeper").returncode == 0
    finally:
        config.write_text(original)


def test_cli_commands_share_one_kept_link_and_work_without_it(lab, monkeypatch):
    def agent_pid(env=None):
        out = gd(lab, "--host", "box", "status", "--json", "--interval", "0", env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["agent"]

    first, second = agent_pid(), agent_pid()
    # The second command reached the same agent: no new SSH handshake, no new agent start.
    assert first["pid"] == second["pid"] and first["via"] == "zipapp"
    from gpudeck.jobs.hosts import mux
    from gpudeck.jobs.hosts.config import load_hosts
    for key in ("HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.setenv(key, lab.env[key])
    keeper = mux.socket_path(load_hosts(Path(lab.env["HOME"]) / ".config/gpudeck/hosts.toml")["box"])
    assert keeper.exists() and oct(keeper.stat().st_mode & 0o777) == "0o600"
    # GPUDECK_SSH_MUX=0: the command holds its own link (a new agent each time).
    direct = dict(lab.env, GPUDECK_SSH_MUX="0")
    assert agent_pid(direct)["pid"] != first["pid"]
    started = gd(lab, "--host", "box", "start", "sleeper", env=direct)
    assert started.returncode == 0
    wait_for(lambda: gd(lab, "--host", "box", "logs", "sleeper", env=direct).stdout == "sleeper up\n", 30,
             "the sleeper's log without the keeper")
    assert gd(lab, "--host", "box", "stop", "sleeper", env=direct).returncode == 0


def test_run_pipeline_over_ssh_with_wait(lab):
    out = gd(lab, "--host", "box", "run", "train", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("pipeline ") and lines[0].endswith("prep -> train")
    assert "prep: succeeded" in lines and "train: succeeded" in lines and lines[-1].endswith("succeeded")
    # The stages ran on box (its state dir), from the zipapp agent's runners.
    assert gd(lab, "--host", "box", "logs", "train").stdout == "prepared\ntrained\n"
    assert run_dirs(lab, "box", "prep") and not run_dirs(lab, "box2", "prep")


def test_runs_and_postmortem_over_ssh(lab):
    assert gd(lab, "--host", "box", "run", "train", "--wait").returncode == 0
    out = gd(lab, "--host", "box", "runs", "--json")
    assert out.returncode == 0, out.stderr
    jobs_seen = {row.get("job") for row in json.loads(out.stdout)["runs"]}
    assert {"prep", "train"} <= jobs_seen
    table = gd(lab, "--host", "box", "runs", "train")
    assert table.returncode == 0 and "train" in table.stdout
    # box2 never ran them: its own index says so.
    assert "prep" not in gd(lab, "--host", "box2", "runs", "--json").stdout
    report = gd(lab, "--host", "box", "postmortem", "train", "--format", "json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["verdict"] and "train" in json.dumps(data)
    md = gd(lab, "--host", "box", "postmortem", "train")
    assert md.returncode == 0 and md.stdout.strip()
    # --prune runs on the box too (tests/ssh/test_ssh_commands.py deletes): a dry run here.
    assert "dry run" in gd(lab, "--host", "box", "runs", "--prune", "--keep", "0").stdout


def test_hosts_lists_local_first_and_bad_hosts_file_is_one_line(lab):
    out = gd(lab, "hosts", "--json")
    assert [h["name"] for h in json.loads(out.stdout)["hosts"]] == ["local", "box", "box2"]
    assert gd(lab, "hosts").stdout.splitlines()[0].startswith("local")
    hosts = lab.client.config_dir / "hosts.toml"
    hosts.write_text('[hosts.box]\nssh = "box"\nshell = "zsh"\n')
    out = gd(lab, "--host", "box", "jobs")
    assert out.returncode == 2 and "unknown key 'shell'" in out.stderr and len(out.stderr.splitlines()) == 1


def test_doctor_over_ssh_runs_the_checks_on_the_box(lab):
    out = gd(lab, "--host", "box", "doctor", "--json")
    payload = json.loads(out.stdout)
    assert payload["host"] == "box" and payload["checks"]
    names = {c["name"] for c in payload["checks"]}
    assert any("driver" in n for n in names)
    # No NVIDIA driver on this test box: the driver check fails there, exit 1, one line on stderr.
    assert out.returncode == (0 if payload["ok"] else 1)
    text = gd(lab, "--host", "box", "doctor")
    assert text.returncode == out.returncode and "Traceback" not in text.stderr


def test_the_command_right_after_trusting_a_refused_key_gets_through(lab):
    # The link keeper that met the unknown key must not answer the next command from its refusal
    # (it used to, for up to half a second, as a plain "down"): the key is trusted here in-process,
    # so no CLI start-up widens the gap, and the very next command connects through a new keeper.
    lab.client.known_hosts.write_text("")
    try:
        out = gd(lab, "--host", "box", "jobs")
        assert out.returncode == 1 and "unknown host key" in out.stderr
        lab.client.trust(lab.box)
        out = gd(lab, "--host", "box", "jobs")
        assert out.returncode == 0, out.stderr
    finally:
        lab.client.trust(lab.box)
        lab.client.trust(lab.box2)
