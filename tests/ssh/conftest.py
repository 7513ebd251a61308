"""Session fixtures: two real OpenSSH servers on 127.0.0.1 (hosts `box` and `box2`) and a laptop-side HOME."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sshsupport import ClientHome, Sshd, ensure_openssh  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# Short keepalive for the tests: DOWN within 1 s x 3 instead of 15 s x 3.
KEEPALIVE = "keepalive_s = 1\nkeepalive_count = 3\nconnect_timeout_s = 5\n"

JOBS = '''
[jobs.count]
cmd = ["python3", "-u", "-c", "import time\\nfor i in range(400):\\n    print('line %d' % i, flush=True)\\n    time.sleep(0.02)"]

[jobs.sleeper]
cmd = "echo sleeper up; exec sleep 600"

[jobs.prep]
cmd = "echo prepared > prep.done"

[jobs.train]
cmd = "cat prep.done; echo trained"
needs = ["prep"]

[jobs.tree]
cmd = "setsid sleep 600 & echo $! > tree.pids; setsid sh -c 'sleep 600 & echo $! >> tree.pids; wait' & echo $! >> tree.pids; echo tree up; wait"
stop_timeout = 2
'''


class Lab:
    """Both boxes, the client HOME, and a hosts.toml with fresh remote state dirs per test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client = ClientHome(root / "laptop")
        self.box = Sshd(root / "box", self.client.pub).start()
        self.box2 = Sshd(root / "box2", self.client.pub).start()
        for alias, sshd in (("box", self.box), ("box2", self.box2)):
            self.client.add_alias(alias, sshd)
            self.client.trust(sshd)

    def setup(self, work: Path, *, extra: str = "") -> dict:
        """Write the jobs file and hosts.toml for one test; returns the CLI environment."""
        work.mkdir(parents=True, exist_ok=True)
        jobs = work / "jobs.toml"
        jobs.write_text(JOBS)
        self.work = work
        hosts = []
        for name in ("box", "box2"):
            hosts.append(f'[hosts.{name}]\nssh = "{name}"\njobs = "{jobs}"\nstate_dir = "{work / ("state-" + name)}"\n'
                         f'simulated = true\n{KEEPALIVE}{extra}')
        self.client.write_hosts("\n".join(hosts))
        return self.client.env()

    def state_dir(self, name: str) -> Path:
        return self.work / f"state-{name}"

    def close(self) -> None:
        self.client.stop_keepers()
        for sshd in (self.box, self.box2):
            sshd.stop()


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory):
    reason = ensure_openssh()
    if reason:
        pytest.skip(reason)
    lab = Lab(tmp_path_factory.mktemp("sshlab"))
    yield lab
    lab.close()


@pytest.fixture
def lab(ssh_lab, tmp_path):
    """The session's sshds, both running, with this test's own jobs file and remote state dirs."""
    for sshd in (ssh_lab.box, ssh_lab.box2):
        if sshd.proc is None:
            sshd.start()
    ssh_lab.env = ssh_lab.setup(tmp_path)
    yield ssh_lab
    ssh_lab.client.stop_keepers()
    # Leave nothing running on the "boxes": stop every job of this test locally.
    for name in ("box", "box2"):
        state = ssh_lab.state_dir(name)
        if state.exists():
            for job in ("count", "sleeper", "tree"):
                if not (state / "runs" / job).is_dir():
                    continue            # never started here: nothing to stop (a CLI start costs ~0.3 s)
                subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "--jobs", str(tmp_path / "jobs.toml"),
                                "stop", job, "--timeout", "1"], env={**ssh_lab.client.env(),
                                                                     "GPUDECK_STATE_DIR": str(state)},
                               capture_output=True, timeout=60)
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def console_env(lab, monkeypatch):
    """The lab's laptop environment for an in-process console (the Pilot tests): its HOME, hosts.toml and
    known_hosts, and no ssh-agent of the developer's."""
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return lab
