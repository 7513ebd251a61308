"""Stall and crash alerts on REAL jobs started through the supervisor (real runner, real processes, real on_alert)."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.payload import jobs_payload
from gpudeck.jobs.supervisor import Supervisor
from runsupport import free_port, toml_str, wait_for

STALL_AFTER = 3.0
# The bound: flagged within stall_after plus two seconds of going quiet.
FLAG_WITHIN = STALL_AFTER + 2.0
PY = sys.executable
# Phase and failure cause come from the log analyzer (gpudeck.jobs.logs.analyze); stalls do not need it.
HAVE_ANALYZER = importlib.util.find_spec("gpudeck.jobs.logs.analyze") is not None

LOADING = r"""
printf 'INFO 11-29 12:00:01 [api_server.py:1] Starting engine on port %s\n' "$PORT"
printf 'Load weight begin. avail mem=70.12 GB\n'
for i in 1 2 3 4; do
  printf 'Loading safetensors checkpoint shards:  %d%% Completed | %d/4 [00:0%ds<00:00]\n' $((i*25)) $i $i
  sleep 0.2
done
printf 'Load weight end. type=DeepseekV3ForCausalLM, mem usage=68.40 GB\n'
printf 'LOADING-DONE\n'
exec sleep 600
"""

CUDA_OOM = r"""
import sys, time
print("epoch 1/3 step 10/500 loss=2.31", flush=True)
time.sleep(0.3)
sys.stderr.write('''Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    loss = model(batch).loss
  File "/work/model.py", line 41, in forward
    h = self.mlp(h)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. Of the allocated memory 75.31 GiB is allocated by PyTorch.
''')
sys.exit(1)
"""


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """One jobs.toml with every live scenario, all started at once (they run in parallel)."""
    root = tmp_path_factory.mktemp("stall_live")
    port = free_port()
    hooks = root / "hooks"
    hooks.mkdir()
    oom_script = root / "oom.py"
    oom_script.write_text(CUDA_OOM)
    # The file-wide default on_alert writes the alert's env to hooks/<job>.<code>.env.
    hook = ('env | grep ^GPUDECK_ALERT_ | sort > "%s/$GPUDECK_ALERT_JOB.$GPUDECK_ALERT_CODE.tmp" && '
            'mv "%s/$GPUDECK_ALERT_JOB.$GPUDECK_ALERT_CODE.tmp" "%s/$GPUDECK_ALERT_JOB.$GPUDECK_ALERT_CODE.env"'
            % (hooks, hooks, hooks))
    text = f"""
on_alert = {toml_str(hook)}

[jobs.loader]
kind = "engine"
port = {port}
stall_after = {STALL_AFTER}
env = {{ PORT = "{port}" }}
cmd = {toml_str(LOADING)}

[jobs.burner]
kind = "stage"
stall_after = {STALL_AFTER}
cmd = [{toml_str(PY)}, "-c", "while True: pass"]

[jobs.chatty]
kind = "stage"
stall_after = {STALL_AFTER}
cmd = "while :; do echo \\"step $((n+=1))\\"; sleep 0.5; done"

[jobs.oom]
kind = "train"
stall_after = 60
cmd = [{toml_str(PY)}, {toml_str(str(oom_script))}]
"""
    jobs_toml = root / "jobs.toml"
    jobs_toml.write_text(text)
    sup = Supervisor(load_jobs(jobs_toml), state_dir=root / "state")
    started = {name: sup.start(name) for name in ("loader", "burner", "chatty", "oom")}
    yield {"sup": sup, "hooks": hooks, "runs": started, "port": port}
    for name in started:
        try:
            sup.stop(name, timeout=5)
        except Exception:
            pass


def job_entry(sup: Supervisor, name: str) -> dict:
    return next(j for j in jobs_payload(sup)["jobs"] if j["name"] == name)


def codes(entry: dict) -> set[str]:
    return {a["code"] for a in entry.get("alerts") or []}


def log_of(sup: Supervisor, name: str) -> Path:
    return sup.latest(name).log_path


def test_loading_then_silent_with_port_closed_is_stalled_within_stall_after_plus_two(box):
    sup = box["sup"]
    log = log_of(sup, "loader")
    wait_for(lambda: log.exists() and b"LOADING-DONE" in log.read_bytes(), 30, what="the loader to load")
    went_quiet = time.time()
    assert "stalled" not in codes(job_entry(sup, "loader"))

    flagged = wait_for(lambda: "stalled" in codes(job_entry(sup, "loader")) and time.time(), FLAG_WITHIN + 20,
                       what="the loader to be flagged stalled")
    took = flagged - went_quiet
    assert took <= FLAG_WITHIN, f"flagged {took:.1f}s after going quiet (bound {FLAG_WITHIN}s)"
    print(f"stalled flagged {took:.2f}s after the log went quiet (stall_after {STALL_AFTER}s)")

    entry = job_entry(sup, "loader")
    [alert] = [a for a in entry["alerts"] if a["code"] == "stalled"]
    assert entry["state"] == "running" and entry["port_open"] is False
    if HAVE_ANALYZER:       # weights loaded, never served: somewhere in startup
        assert entry["phase"] in ("starting", "loading"), entry["phase"]
    assert "port is not listening" in alert["message"]
    assert alert["since"] <= went_quiet + 1.5
    assert alert["job"] == "loader" and alert["run_id"] == box["runs"]["loader"]

    # on_alert fired, detached, with the alert in its environment
    env_file = box["hooks"] / "loader.stalled.env"
    wait_for(env_file.exists, 15, what="on_alert to run")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["GPUDECK_ALERT_CODE"] == "stalled"
    assert env["GPUDECK_ALERT_JOB"] == "loader"
    assert env["GPUDECK_ALERT_RUN_ID"] == box["runs"]["loader"]
    assert abs(float(env["GPUDECK_ALERT_SINCE"]) - alert["since"]) < 0.01
    assert env["GPUDECK_ALERT_MESSAGE"] == alert["message"]
    events = [json.loads(line) for line in (sup.latest("loader").path / "events.jsonl").read_text().splitlines()]
    raised = [e for e in events if e["event"] == "AlertRaised"]
    assert [e["code"] for e in raised] == ["stalled"]       # raised once, however long it lasts


def _watch_never_stalled(sup: Supervisor, name: str, seconds: float) -> dict:
    """Poll health for `seconds`; fail on any stalled; prove the monitor was ticking all along."""
    health_path = sup.latest(name).path / "health.json"
    wait_for(health_path.exists, 20, what=f"{name}: health.json (is the runner monitor running?)")
    first = json.loads(health_path.read_text())["updated_at"]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        entry = job_entry(sup, name)
        assert "stalled" not in codes(entry), f"{name} falsely flagged: {entry['alerts']}"
        assert entry["state"] == "running"
        time.sleep(0.25)
    last = json.loads(health_path.read_text())["updated_at"]
    assert last - first >= seconds - 2.5, "health.json stopped being updated: the test proved nothing"
    return entry


def test_silent_job_burning_cpu_is_not_stalled(box):
    _watch_never_stalled(box["sup"], "burner", STALL_AFTER + 4)


def test_job_whose_log_advances_is_not_stalled(box):
    entry = _watch_never_stalled(box["sup"], "chatty", STALL_AFTER + 4)
    assert entry["alerts"] == []


def test_cuda_oom_exit_is_crashed_with_cause_and_hint(box):
    sup = box["sup"]
    assert sup.wait("oom", timeout=30) is not None, "the oom job did not end"
    entry = wait_for(lambda: (e := job_entry(sup, "oom")) and "crashed" in codes(e) and e, 15, what="a crashed alert on oom")
    assert entry["state"] == "exited" and entry["exit_code"] == 1
    [alert] = [a for a in entry["alerts"] if a["code"] == "crashed"]
    assert "status 1" in alert["message"]
    if HAVE_ANALYZER:       # the cause and hint are the analyzer's reading of the log
        assert alert["cause"] == "cuda_oom"
        assert alert["hint"]
        assert "CUDA out of memory" in alert["message"]
    env_file = box["hooks"] / "oom.crashed.env"
    wait_for(env_file.exists, 15, what="on_alert to run for the crash")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["GPUDECK_ALERT_CODE"] == "crashed"
    if HAVE_ANALYZER:
        assert env["GPUDECK_ALERT_CAUSE"] == "cuda_oom"
    assert env["GPUDECK_ALERT_RUN_ID"] == box["runs"]["oom"]
