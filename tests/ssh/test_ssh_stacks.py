"""`gpudeck --host box stacks JOB` over a real OpenSSH server: the box's agent runs py-spy on the box's processes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runsupport import kill_run_leftovers, wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

BARRIER = """
import multiprocessing as mp

def party(barrier):
    barrier.wait()                      # the third party never comes

if __name__ == "__main__":
    barrier = mp.Barrier(3)
    child = mp.Process(target=party, args=(barrier,))
    child.start()
    print("waiting", flush=True)
    party(barrier)
"""


def gd(lab, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def stuck(lab):
    """box runs a job of two Python processes stuck in a Barrier; returns how to set the agent's python."""
    script = lab.work / "stuck.py"
    script.write_text(BARRIER)
    jobs = f'[jobs.stuck]\ncmd = ["{sys.executable}", "{script}"]\n'

    def setup(extra: str) -> None:
        lab.setup(lab.work, extra=extra)
        (lab.work / "jobs.toml").write_text(jobs)
        started = gd(lab, "--host", "box", "start", "stuck")
        assert started.returncode == 0, started.stderr
    yield setup
    gd(lab, "--host", "box", "stop", "stuck", "--timeout", "2", timeout=60)
    for run_dir in (lab.state_dir("box") / "runs").glob("*/2*"):
        kill_run_leftovers(run_dir.name)


def test_stacks_of_a_job_on_the_box(lab, stuck):
    # The agent under the Python gpudeck is installed in: py-spy sits next to it.
    stuck(f'python = "{sys.executable}"\n')

    def dumped():
        out = gd(lab, "--host", "box", "stacks", "stuck", "--json")
        data = json.loads(out.stdout) if out.returncode == 0 else {}
        return data if len(data.get("processes") or []) == 2 and all(
            p["wait"]["kind"] == "barrier" for p in data["processes"]) else None
    data = wait_for(dumped, timeout=90, what="both processes in the barrier on box", interval=0.5)
    assert data["host"] == "box"
    assert data["verdict"] == "2 of 2 processes waiting on a multiprocessing.Barrier at stuck.py:5 (party)"
    text = gd(lab, "--host", "box", "stacks", "stuck")
    assert text.returncode == 0 and text.stdout.startswith(f"verdict: {data['verdict']}\n")


def test_a_box_without_py_spy_says_what_to_install(lab, stuck):
    if shutil.which("py-spy", path="/usr/local/bin:/usr/bin:/bin") or not Path("/usr/bin/python3").exists():
        pytest.skip("this machine's system Python has py-spy beside it (or there is no /usr/bin/python3)")
    stuck('python = "/usr/bin/python3"\n')            # the zipapp agent, with no py-spy anywhere near
    out = gd(lab, "--host", "box", "stacks", "stuck")
    assert out.returncode == 2
    # Named as every refusal of a box is: `box: ` before the local line.
    assert out.stderr.strip().startswith("gpudeck: box: py-spy is not installed: pip install py-spy")
    assert len(out.stderr.strip().splitlines()) == 1
