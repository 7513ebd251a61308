"""Issue 9, terminal: every string from a job, a log, a process table or a config reaches the CLI sanitised."""
from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest

from gpudeck.console.format import safe_text
from gpudeck.jobs.logs.sanitize import sanitize_text, terminal_text
from gpudeck.jobs.runs import latest_run

from runsupport import PY, cli, cli_env, wait_for, write_jobs

# ESC c (reset), ESC #8 (screen fill), BEL, BS, 8-bit CSI, UTF-8 C1 OSC 52 (\u009d…\u009c), 7-bit OSC 52,
# and bidi overrides/isolates.
HOSTILE = ("\x1bc\x1b#8\x07\x08 \x9b2J \u009d52;c;U0VDUkVUMQ==\u009c \x1b]52;c;U0VDUkVUMg==\x07"
           " \u202eevil\u202c \u2066iso\u2069 \u202a\u202b\u202d\u2067\u2068 end")
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_terminal_safe(text: str) -> None:
    bad = UNSAFE.search(text)
    assert bad is None, f"{bad.group()!r} reached the terminal in {text!r}"
    assert "U0VDUkVUMQ" not in text and "U0VDUkVUMg" not in text, "an OSC 52 payload reached the terminal"


def test_the_sanitizer_removes_sequences_and_shows_bidi_escaped():
    out = sanitize_text(HOSTILE)
    assert_terminal_safe(out)
    assert "<U+202E>evil<U+202C>" in out and "<U+2066>iso<U+2069>" in out and out.endswith("end")
    assert_terminal_safe(terminal_text(HOSTILE, 20))
    assert_terminal_safe(safe_text(HOSTILE))


def test_jobs_cli_sanitises_alert_and_failure_messages(tmp_path, state):
    script = tmp_path / "crash.py"
    script.write_text("import sys\n"
                      "sys.stderr.write('Traceback (most recent call last):\\n  File \"x.py\", line 1, in <module>\\n')\n"
                      f"sys.stderr.write('ValueError: ' + {HOSTILE!r} + '\\n')\n"
                      "sys.exit(1)\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"crashy": {"cmd": f"{PY} {script}"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "crashy"], env).returncode == 0
    run = latest_run("crashy", state)
    wait_for(lambda: run.exit_record(), what="exit record")
    wait_for(lambda: (run.path / "health.json").exists() and '"ended": true' in (run.path / "health.json").read_text(),
             what="final health")
    done = cli(["--jobs", str(jobs), "jobs"], env)
    out = done.stdout.decode("utf-8")
    assert done.returncode == 0, done.stderr
    assert "crashy" in out and "evil" in out, out          # the message is shown ...
    assert_terminal_safe(out)                            # ... but nothing in it acts on the terminal
    assert "<U+202E>evil" in out


def test_stop_cli_sanitises_the_argv_of_a_foreign_port_holder(tmp_path, state):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A foreign process (not started by gpudeck) holds the job's port; its argv is hostile.
    holder = subprocess.Popen([PY, "-c", "import socket,sys,time\ns=socket.socket();"
                               "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                               f"s.bind(('127.0.0.1',{port}));s.listen();print('up',flush=True);time.sleep(120)",
                               HOSTILE], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"up"
        jobs = write_jobs(tmp_path / "jobs.toml", {"svc": {"cmd": "sleep 300", "port": port}})
        env = cli_env(state)
        assert cli(["--jobs", str(jobs), "start", "svc"], env).returncode == 0
        done = cli(["--jobs", str(jobs), "stop", "svc", "--timeout", "5"], env)
        text = done.stdout.decode() + done.stderr.decode()
        assert f"port {port} still listening" in text and "evil" in text, text
        assert_terminal_safe(text)
    finally:
        holder.kill()
        holder.wait()


def test_doctor_cli_sanitises_the_model_path(tmp_path, state):
    model = "/nonexistent/" + HOSTILE.replace(" ", "_")
    jobs = write_jobs(tmp_path / "jobs.toml", {"eng": {"kind": "engine",
                                                       "cmd": ["vllm", "serve", model, "--port", "18431"]}})
    done = cli(["--jobs", str(jobs), "doctor", "eng"], cli_env(state), timeout=120)
    text = done.stdout.decode() + done.stderr.decode()
    assert "does not exist" in text, text
    assert_terminal_safe(text)
