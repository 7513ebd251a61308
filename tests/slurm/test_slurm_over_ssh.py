"""sbatch on a login node over SSH: `gpudeck --host login` submits and follows Slurm jobs through the remote core.

The "login node" is a real OpenSSH server on 127.0.0.1 whose sessions see the test cluster (SLURM_CONF, as
/etc/slurm/slurm.conf would on a real one); gpudeck runs its core there (the agent zipapp), which calls the
same sbatch/squeue/sacct/scancel as locally.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runsupport import REPO, cli, wait_for, write_jobs

sys.path.insert(0, str(REPO / "tests" / "ssh"))
from sshsupport import ClientHome, Sshd, ensure_openssh  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def login(slurm_cluster, tmp_path_factory):
    reason = ensure_openssh()
    if reason:
        pytest.skip(reason)
    tmp_path = tmp_path_factory.mktemp("login")    # short: the SSH link's unix socket lives under HOME
    client = ClientHome(tmp_path / "laptop")
    sshd = Sshd(tmp_path / "login", client.pub)
    config = sshd.config.read_text()
    sshd.config.write_text(config.replace(f"SetEnv HOME={sshd.home}",
                                          f"SetEnv HOME={sshd.home} SLURM_CONF={slurm_cluster.conf}"))
    sshd.start()
    client.add_alias("login", sshd)
    client.trust(sshd)
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "hello": {"cmd": "echo \"hello from $(hostname)\"; for i in 1 2 3; do echo \"step $i/3\"; sleep 0.5; done",
                  "backend": "slurm", "partition": "gpu", "gpus_per_node": 1},
        "long": {"cmd": "echo up; sleep 300", "backend": "slurm", "stop_timeout": 3},
    })
    remote_state = tmp_path / "remote-state"
    client.write_hosts(f'[hosts.login]\nssh = "login"\njobs = "{jobs}"\nstate_dir = "{remote_state}"\n')
    yield client.env(), remote_state
    for meta in remote_state.glob("runs/*/*/meta.json"):
        job_id = json.loads(meta.read_text()).get("slurm_job_id")
        if job_id:
            subprocess.run(["scancel", str(job_id)], capture_output=True, timeout=30)
    sshd.stop()


def gd(env: dict, *args: str) -> subprocess.CompletedProcess:
    return cli(["--host", "login", *args], env=env, timeout=120, text=True)


def job(env: dict, name: str) -> dict:
    done = gd(env, "jobs", "--json")
    assert done.returncode == 0, done.stderr
    return next(j for j in json.loads(done.stdout)["jobs"] if j["name"] == name)


def test_submit_follow_and_stop_through_a_login_node(login):
    env, remote_state = login
    started = gd(env, "start", "hello")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    final = wait_for(lambda: (j := job(env, "hello"))["state"] == "exited" and j, timeout=90, interval=0.5,
                     what="hello to finish on Slurm")
    assert final["host"] == "login" and final["run_id"] == run_id
    assert final["slurm"]["state"] == "COMPLETED" and final["exit_code"] == 0
    meta = json.loads((remote_state / "runs" / "hello" / run_id / "meta.json").read_text())
    assert meta["backend"] == "slurm" and meta["slurm_job_id"] == final["slurm"]["job_id"]
    logs = gd(env, "logs", "hello")
    assert logs.stdout.splitlines()[0].startswith("hello from ") and logs.stdout.splitlines()[-1] == "step 3/3"

    assert gd(env, "start", "long").returncode == 0
    wait_for(lambda: job(env, "long")["slurm"]["state"] == "RUNNING", timeout=60, interval=0.5,
             what="long to run")
    stopped = gd(env, "stop", "long")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    after = job(env, "long")
    assert after["state"] == "stopped" and after["slurm"]["state"] in ("CANCELLED", "FAILED")
