"""Plain `gpudeck status` lists the engines on the box, gpudeck's and foreign ones (SGLang STAND-INs, real processes)."""
from __future__ import annotations

import json
import sys

from runsupport import cli, cli_env, free_port, kill_run_leftovers, write_jobs
from test_engine_pivot import STANDIN_PKG, foreign_standin, wait_ready


def test_plain_status_lists_managed_and_foreign_engines(tmp_path):
    mine, theirs = free_port(), free_port()
    # Launched the way discovery recognises an SGLang (`-m sglang.launch_server`), by gpudeck.
    jobs = write_jobs(tmp_path / "jobs.toml", {"serve": {
        "engine": "sglang", "port": mine, "stop_timeout": "10s", "env": {"PYTHONPATH": str(STANDIN_PKG)},
        "cmd": [sys.executable, "-m", "sglang.launch_server", "--gpudeck-stand-in", "--model-path",
                "/models/stand-in", "--port", str(mine), "--load-seconds", "0.1"]}})
    env = cli_env(tmp_path / "state")
    foreign = foreign_standin(theirs)
    run_id = None
    try:
        started = cli(["--jobs", str(jobs), "start", "serve"], env=env, text=True)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.strip()
        wait_ready(mine)
        wait_ready(theirs)
        out = cli(["--jobs", str(jobs), "status", "--interval", "0"], env=env, text=True)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("ENGINE "))
        assert lines[header].split() == ["ENGINE", "PID", "OWNER", "STATE", "PORT", "GPUS", "GPU", "MEM", "MODEL"]
        rows = lines[header + 1:]
        ours = next(r for r in rows if f":{mine} " in r + " ")
        assert ours.startswith("sglang") and f"job serve (run {run_id})" in ours and "/models/stand-in" in ours
        other = next(r for r in rows if f":{theirs} " in r + " ")
        assert str(foreign.pid) in other and "FOREIGN" in other and "/models/foreign" in other
        # The same engines as --json, row for row.
        payload = json.loads(cli(["--jobs", str(jobs), "status", "--json", "--interval", "0"], env=env,
                                 text=True).stdout)
        assert {e["port"] for e in payload["engines"]} >= {mine, theirs}
    finally:
        cli(["--jobs", str(jobs), "stop", "serve", "--timeout", "5"], env=env)
        if run_id:
            kill_run_leftovers(run_id)
        foreign.kill()
        foreign.wait(10)


def test_engine_rows_say_owner_state_and_why_unknown():
    from gpudeck.jobs.telemetry.status import render_engines_text
    text = render_engines_text([
        {"engine": "vllm", "pid": 10, "managed": True, "job": "serve", "run_id": "r1", "port": None,
         "orphan": True, "gpus": [0, 1], "gpu_mem": 3 * 2**30, "model": "org/model"}])
    row = text.splitlines()[1]
    assert "job serve (run r1)" in row and "not listening, orphaned" in row and "0,1" in row and "3.0 GiB" in row
    assert render_engines_text([]).startswith("engines: none")
    assert render_engines_text(None, "needs psutil") == "engines: unknown (needs psutil)"
    assert render_engines_text(None) == ""
