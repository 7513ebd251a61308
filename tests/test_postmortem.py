"""The post-mortem end to end on real runs: a job crashes, `postmortem JOB` says why and when, the HTML renders in a real headless Chromium, and broken inputs give a report that says what is missing."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from gpudeck.jobs.history.postmortem import build, read_lines
from gpudeck.jobs.history.index import db_path
from gpudeck.jobs.runs import latest_run

from browsersupport import browser  # noqa: F401  (session fixture)
from runsupport import PY, REPO, cli, cli_env, wait_for, write_jobs

# A job that loads for a while, serves, then dies of a CUDA OOM in its engine core, with job text
# that would be markup or script if a report did not escape it.
CRASH = r'''
import sys, time
print("INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", flush=True)
print("<script>alert('job text')</script> & \"quotes\" [link](http://x) | pipe *star*", flush=True)
for i in range(1, 4):
    print(f"Loading safetensors checkpoint shards:  {i * 33}% Completed | {i}/3 [00:0{i}<00:01,  1.00it/s]", flush=True)
    time.sleep(0.6)
print("INFO 12-01 10:00:03 [launcher.py:29] Available routes are:", flush=True)
print("INFO:     Application startup complete.", flush=True)
time.sleep(1.2)
print("(EngineCore_DP0 pid=811) ERROR 12-01 10:00:05 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. "
      "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB is free.", flush=True)
print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
sys.exit(1)
'''


def _crash_jobs(tmp_path: Path) -> Path:
    script = tmp_path / "engine.py"
    script.write_text(CRASH)
    return write_jobs(tmp_path / "jobs.toml", {"engine": {"cmd": [PY, str(script)]}})


def _in_order(seen: list, expected: list) -> bool:
    it = iter(seen)
    return all(any(s == e for s in it) for e in expected)


def _run_to_end(jobs: Path, env: dict, name: str = "engine"):
    out = cli(["--jobs", str(jobs), "start", name], env)
    assert out.returncode == 0, out.stderr
    run = latest_run(name)
    wait_for(lambda: run.exit_record() is not None, timeout=60, what="the job to exit")
    # The runner's last act is the index row: wait for it so the readers below race nothing.
    # The runner's last acts are the final summary and the index row: let it finish so nothing races the test.
    wait_for(lambda: not run.state().runner_alive, timeout=60, what="the runner to finish")
    assert json.loads((run.path / "summary.json").read_text())["final"] is True
    return run


def test_story_a_job_crashes_then_postmortem_html_in_chromium_and_runs_failed(tmp_path, state, browser):  # noqa: F811
    jobs = _crash_jobs(tmp_path)
    env = cli_env(state)
    run = _run_to_end(jobs, env)

    out = cli(["postmortem", "engine"], env)
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    first = text.splitlines()[0]
    # The verdict first: crashed, when (after ready), why (CUDA OOM), where (line), what to do (hint).
    assert first.startswith("**crashed ") and "after ready" in first, first
    assert "CUDA out of memory (line 8)" in first and "gpu-memory-utilization" in first, first
    # Phase timeline with durations: loading took about 1.8 s, ready about 1.2 s.
    timeline = re.search(r"^(?:\w+ [\d:]+ → )?loading ([\d:]+) → (?:starting [\d:]+ → )?ready ([\d:]+) → failed$",
                         text, re.M)
    assert timeline, text
    assert "## The lines that matter" in text and ">       8 | (EngineCore_DP0" in text
    # Job text outside code blocks is inert Markdown (inside them it is shown, not rendered).
    assert "\\<script\\>alert" in text or "<script>" not in text.split("```")[0]

    html_path = tmp_path / "r.html"
    out = cli(["postmortem", "engine", "--format", "html", "-o", str(html_path)], env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().startswith("crashed ")
    page = html_path.read_text()
    assert "<script" not in page.lower()                     # no script at all, job text escaped
    assert "&lt;script&gt;alert(&#x27;job text&#x27;)&lt;/script&gt;" in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page)   # nothing fetched from anywhere
    loaded = browser.load(html_path)
    assert loaded.problems == [], "\n".join(loaded.problems)
    assert loaded.dom.count("<svg") >= 3, "charts missing"   # CPU, RSS, log output at least
    assert 'id="verdict"' in loaded.dom and "crashed" in loaded.dom
    png = browser.screenshot(html_path, tmp_path / "r.png")
    keep = os.environ.get("GPUDECK_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(png, keep)
    assert png.stat().st_size > 20_000                      # a rendered page, not a blank one

    failed = cli(["runs", "--failed"], env)
    assert failed.returncode == 0 and run.run_id in failed.stdout.decode()
    data = json.loads(cli(["postmortem", run.run_id[-5:], "--format", "json"], env).stdout)
    assert data["failure"]["cause"] == "cuda_oom" and data["outcome"]["failed"] is True
    phases = [p["phase"] for p in data["phases"]]
    assert _in_order(phases, ["loading", "ready", "failed"]), phases
    loading = data["phases"][phases.index("loading")]
    assert 0.5 < loading["duration_s"] < 6.0 and loading["start_s"] < 1.5


def test_the_browser_check_catches_console_errors(tmp_path, browser):  # noqa: F811
    # The check above can fail: a page with a console error and an uncaught exception is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); throw new Error('uncaught-boom');</script>"
                   "<svg></svg></body></html>")
    loaded = browser.load(bad)
    assert any("boom" in p for p in loaded.problems) and any("uncaught-boom" in p for p in loaded.problems)


def test_comparison_with_earlier_runs(tmp_path, state):
    jobs = _crash_jobs(tmp_path)
    env = cli_env(state)
    for _ in range(3):
        _run_to_end(jobs, env)
    report = build("engine", state)
    hist = report["history"]
    assert hist["earlier_runs"] == 2 and hist["same_failure"] == [2, 2]
    assert hist["median_load_s"] > 1.0 and hist["load_s"] > 1.0
    assert "(same failure in 2 of the last 2 runs)" in report["verdict"]
    md = cli(["postmortem", "engine"], env).stdout.decode()
    assert "same failure seen in 2 of the last 2 runs" in md and "vs median" in md


def test_broken_inputs_give_a_report_that_says_what_is_missing(tmp_path, state):
    jobs = _crash_jobs(tmp_path)
    env = cli_env(state)
    run = _run_to_end(jobs, env)

    # Truncated log: the report says so; lines past the end are named as missing.
    log = run.path / "output.log"
    data = log.read_bytes()
    log.write_bytes(data[: len(data) // 3])
    out = cli(["postmortem", run.run_id, "--format", "json"], env)
    assert out.returncode == 0 and b"Traceback" not in out.stderr
    missing = " ".join(json.loads(out.stdout)["missing"])
    assert "log truncated" in missing and "not in the log on disk" in missing
    log.write_bytes(data)

    # No summary, no samples: the log is re-read, the resource timeline is said to be missing.
    (run.path / "summary.json").unlink()
    (run.path / "samples.jsonl").unlink()
    report = json.loads(cli(["postmortem", run.run_id, "--format", "json"], env).stdout)
    assert report["failure"]["cause"] == "cuda_oom" and report["resources"] is None
    assert any("samples.jsonl missing" in m for m in report["missing"])
    assert any("summary.json missing" in m for m in report["missing"])
    assert _in_order([p["phase"] for p in report["phases"]], ["loading", "ready", "failed"])
    for fmt in ("md", "html"):
        done = cli(["postmortem", run.run_id, "--format", fmt], env)
        assert done.returncode == 0 and b"samples.jsonl missing" in done.stdout

    # Corrupt index: rebuilt, the report still comes.
    _corrupt(state)
    done = cli(["postmortem", "engine"], env)
    assert done.returncode == 0 and done.stdout.startswith(b"**crashed"), done.stderr

    # Deleted run dir: the index row is all that is left, and the report says so.
    shutil.rmtree(run.path)
    done = cli(["postmortem", run.run_id], env)
    assert done.returncode == 0, done.stderr
    assert b"was deleted" in done.stdout and b"crashed" in done.stdout

    # Nothing by that name: one line, exit 2.
    bad = cli(["postmortem", "no-such-thing"], env)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1 and bad.stderr.startswith(b"gpudeck: ")


def test_bare_log_file_gives_every_part_the_log_supports(tmp_path):
    env = cli_env(tmp_path / "state")
    log = REPO / "tests" / "fixtures" / "logs" / "vllm_startup_ready_spec_bad.log"
    report = json.loads(cli(["postmortem", str(log), "--format", "json"], env).stdout)
    assert report["source"]["kind"] == "log"
    phases = [p["phase"] for p in report["phases"]]
    assert phases[0] == "starting" and phases[-1] == "ready" and "loading" in phases
    loading = next(p for p in report["phases"] if p["phase"] == "loading")
    assert loading["duration_s"] and loading["duration_s"] > 30        # from the lines' own timestamps
    assert any(item["label"] == "ready" for item in report["lines"])
    assert report["last_lines"] and report["last_lines"][-1]["line"]
    assert any("bare log" in m for m in report["missing"])


def test_read_lines_from_checkpoints_matches_the_file(tmp_path):
    path = tmp_path / "big.log"
    lines = [b"line %d " % i + b"z" * (i % 97) + (b"\r50%\r100%" if i % 10 == 0 else b"") for i in range(1, 30001)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    offsets, off = [], 0
    for i, line in enumerate(lines):
        if i % 3000 == 0:
            offsets.append([off, i])
        off += len(line) + 1
    want = [1, 2, 2999, 3000, 3001, 17777, 29999, 30000, 30001]
    for checkpoints in (None, offsets):
        got = read_lines(path, want, checkpoints)
        assert got.get(30001) is None
        for n in want[:-1]:
            expected = lines[n - 1].split(b"\r")[-1].decode()
            assert got[n] == expected, (n, checkpoints is not None)


def _corrupt(state):
    # The main file overwritten with junk, its WAL gone (a WAL holding page 1 would mask the junk).
    for suffix in ("-wal", "-shm"):
        Path(str(db_path(state)) + suffix).unlink(missing_ok=True)
    db_path(state).write_bytes(b"this is not a database" * 100)


def test_a_day_of_serving_with_recovered_errors_is_one_phase_and_one_alert_line():
    from gpudeck.jobs.history.charts import alert_items
    from gpudeck.jobs.history.phases import phase_rows
    t0 = 1000.0
    changes = [{"phase": "loading", "t": t0, "line": 1}, {"phase": "ready", "t": t0 + 100, "line": 50}]
    for k in range(30):          # thirty failed requests, each recovered from
        changes += [{"phase": "failed", "t": t0 + 200 + k * 100, "line": 100 + k},
                    {"phase": "ready", "t": t0 + 210 + k * 100, "line": 101 + k}]
    changes.append({"phase": "failed", "t": t0 + 5000, "line": 999})
    rows = phase_rows(changes, t0, t0 + 5000)
    assert [r["phase"] for r in rows] == ["loading", "ready", "failed"]
    assert rows[1]["duration_s"] == 4900 and rows[1]["recovered_errors"] == 30
    alerts = [{"code": "crashed", "message": f"unhandled exception: ValueError: too long [log line {n}]",
               "raised": t0 + n, "cleared": t0 + n + 5, "at_s": float(n)} for n in range(200, 3200, 100)]
    alerts.append({"code": "crashed", "message": "CUDA out of memory [log line 999]", "raised": t0 + 5000,
                   "cleared": None, "at_s": 5000.0})
    items = alert_items(alerts, live_run=True)
    assert len(items) == 2 and "×30" in items[0][2] and "each cleared, after 5 s to 5 s" in items[0][2]
    assert items[1][2].startswith(": CUDA out of memory")


def test_a_live_run_and_no_target_means_the_latest_run(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"slow": {
        "cmd": "echo 'Loading safetensors checkpoint shards:  10% Completed | 1/10'; sleep 60", "stop_timeout": 5}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "slow"], env).returncode == 0
    run = latest_run("slow")
    wait_for(lambda: (run.path / "summary.json").exists(), timeout=30, what="the first summary")
    out = cli(["postmortem"], env)
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert text.startswith("**still running in loading for "), text[:200]
    assert f"Post-mortem of slow run {run.run_id}" in text and "the run is live" in text
    # A sub-second run's verdict names no duration; let this one live past a second, whatever the load.
    started = run.meta()["started_at"]
    wait_for(lambda: time.time() - started >= 2.0, timeout=30, what="the run to be 2 s old")
    assert cli(["--jobs", str(jobs), "stop", "slow"], env).returncode == 0
    wait_for(lambda: not run.state().runner_alive, timeout=60, what="the runner to finish")
    stopped = cli(["postmortem", "slow", "-o", str(tmp_path / "r.md")], env)
    assert stopped.stdout.decode().startswith("stopped by the operator after ")
    assert (tmp_path / "r.md").read_text().startswith("**stopped by the operator")


def test_an_engine_run_made_by_the_runner_monitors_has_serving_charts(tmp_path, browser):  # noqa: F811
    # The benchmark's generator at a small size: a vLLM start-up, a 40-minute load, serving, a CUDA OOM,
    # ticked through the real runner monitors (health + history) on a simulated clock.
    import sys
    sys.path.insert(0, str(REPO / "bench"))
    from bench_postmortem import make_run
    state = tmp_path / "state"
    run_dir = state / "runs" / "vllm-k2" / "20251201-000000-00000"
    make_run(run_dir, gigabytes=0.002, hours=0.75)
    report = build(str(run_dir), state)
    assert report["verdict"].startswith("crashed ") and "after ready" in report["verdict"]
    assert [p["phase"] for p in report["phases"]][:2] == ["starting", "loading"]
    loading = report["phases"][1]
    assert 2300 < loading["duration_s"] < 2500                 # the 40-minute load, from the arrival index
    assert set(report["serving"]["series"]) >= {"gen_tokens_per_s", "running", "kv_cache_pct"}
    assert set(report["resources"]["peaks"]["gpu_mem"]) == {str(g) for g in range(8)}
    from gpudeck.jobs.history import render_html, render_md
    md = render_md.render(report)
    assert "tokens/s generation" in md and "GPU memory GPU0-7" in md
    page = tmp_path / "engine.html"
    page.write_text(render_html.render(report))
    loaded = browser.load(page)
    assert loaded.problems == [] and loaded.dom.count("<svg") >= 10


def test_a_job_whose_command_cannot_start_never_ran(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"ghost": {"cmd": [str(tmp_path / "no-such-program"), "--serve"]}})
    env = cli_env(state)
    cli(["--jobs", str(jobs), "start", "ghost"], env)
    run = latest_run("ghost")
    wait_for(lambda: run is not None and run.exit_record() is not None, timeout=60, what="the launch to fail")
    wait_for(lambda: not run.state().runner_alive, timeout=60, what="the runner to finish")
    report = build("ghost", state)
    assert report["outcome"]["never_ran"] and report["outcome"]["failed"], report["outcome"]
    assert report["verdict"].startswith("never ran; "), report["verdict"]
    assert "no-such-program" in report["verdict"] and "crashed" not in report["verdict"], report["verdict"]
