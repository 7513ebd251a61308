"""Issue 9, input: `check` rejects NUL in every string; `check`/`analyze` refuse FIFOs and devices in one line; stdin is bounded."""
from __future__ import annotations

import os
import subprocess

import pytest

from gpudeck.jobs.spec import check_jobs

from runsupport import PY, REPO, cli, cli_env


def _one_line_error(done, code=2):
    err = done.stderr.decode()
    assert done.returncode == code, (done.returncode, err)
    assert err.startswith("gpudeck: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


NUL_FILE = ('[jobs.a]\ncmd = "echo hi"\ncwd = "/tmp/\\u0000x"\n'
            '[jobs.b]\ncmd = ["echo", "a\\u0000b"]\nenv = { Y = "\\u0000" }\n'
            'done_when = "x\\u0000"\n'
            '[jobs.c]\ncmd = "echo \\u0000"\non_alert = "x\\u0000"\n')


def test_check_rejects_a_nul_in_every_string(tmp_path, state):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(NUL_FILE)
    errors = check_jobs(jobs)
    located = sorted((e.line, str(e)) for e in errors if "NUL" in str(e))
    assert [line for line, _ in located] == [3, 5, 6, 7, 9, 10], located
    done = cli(["--jobs", str(jobs), "check"], cli_env(state))
    assert done.returncode == 1 and done.stdout.decode().count("NUL byte") == 6, done.stdout
    # start refuses the file too: one line, no run left "starting".
    started = cli(["--jobs", str(jobs), "start", "a"], cli_env(state))
    _one_line_error(started)
    assert not (state / "runs" / "a").exists()


@pytest.mark.parametrize("command", [["check"], ["jobs"], ["start", "a"]])
def test_a_fifo_as_jobs_file_is_refused_in_one_line(tmp_path, state, command):
    fifo = tmp_path / "jobs.toml"
    os.mkfifo(fifo)
    err = _one_line_error(cli(["--jobs", str(fifo), *command], cli_env(state), timeout=20))
    assert "a FIFO, not a regular file" in err


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "dir"])
def test_analyze_refuses_fifos_devices_and_directories(tmp_path, target):
    if target == "fifo":
        target = str(tmp_path / "log.fifo")
        os.mkfifo(target)
    elif target == "dir":
        target = str(tmp_path)
    err = _one_line_error(cli(["analyze", target], cli_env(tmp_path / "state"), timeout=20))
    assert "not a regular file" in err


def test_analyze_stdin_is_bounded_by_max_bytes(tmp_path):
    # An endless stdin (yes) ends at --max-bytes with a note, not never.
    yes = subprocess.Popen(["yes", "Loading safetensors checkpoint shards: 50% 1/2"], stdout=subprocess.PIPE)
    try:
        done = subprocess.run([PY, "-m", "gpudeck.console.cli", "analyze", "--max-bytes", "2M", "-"], cwd=REPO,
                              env=cli_env(tmp_path / "state"), stdin=yes.stdout, capture_output=True, timeout=60)
    finally:
        yes.kill()
        yes.wait()
    assert done.returncode == 0, done.stderr
    assert b"phase:" in done.stdout
    assert done.stderr.decode() == "gpudeck: analyze: read only the first 2097152 bytes (--max-bytes)\n"
    small = subprocess.run([PY, "-m", "gpudeck.console.cli", "analyze", "-"], cwd=REPO, input=b"hello\n",
                           env=cli_env(tmp_path / "state"), capture_output=True, timeout=60)
    assert small.returncode == 0 and small.stderr == b"", small.stderr
