"""--readonly: no key, command or agent of a read-only gpudeck starts, stops, restarts, pivots or runs a job."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudeck.console.cli import main
from gpudeck.console.screens.confirm import ConfirmScreen
from gpudeck.console.screens.hosts import HostsScreen
from gpudeck.console.screens.jobs import JobsScreen
from gpudeck.jobs.hosts.protocol import encode
from runsupport import free_port, pilot_test, write_jobs
from runsupport import pilot_wait_for as wait_for

REPO = Path(__file__).resolve().parents[1]
ACTING = {"start_job", "stop_job", "restart_job", "pivot"}


def jobs_file(tmp_path: Path, marker: Path) -> Path:
    return write_jobs(tmp_path / "jobs.toml", {
        "toucher": {"kind": "stage", "cmd": f"touch {marker}"},
        "sleeper": {"cmd": "exec sleep 300"},
        "eng": {"cmd": f"touch {marker}; sleep 300", "kind": "engine", "engine": "vllm", "port": free_port()},
    })


def make_console(jobs: Path, **kwargs):
    from gpudeck.console.app import make_app
    from gpudeck.jobs.telemetry.sampler import make_sampler
    return make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3, jobs_file=str(jobs),
                    **kwargs)


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


# -- the console ------------------------------------------------------------------------------------

@pilot_test
async def test_readonly_jobs_view_watches_live_jobs_and_no_key_acts(state, tmp_path) -> None:
    from gpudeck.jobs.spec import load_jobs
    from gpudeck.jobs.supervisor import Supervisor
    marker = tmp_path / "acted"
    jobs = jobs_file(tmp_path, marker)
    sup = Supervisor(load_jobs(jobs), state)
    sup.start("sleeper")                                     # started elsewhere: watched, never stopped
    sleeper = sup.job_state("sleeper")
    runs_before = sorted(p.name for p in (state / "runs").rglob("*") if p.is_dir())
    app = make_console(jobs, readonly="--readonly")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
            await wait_for(pilot, lambda: screen.refreshes >= 1 and len(screen.jobs) == 3, "the live jobs")
            assert {j.name: j.payload["state"] for j in screen.jobs}["sleeper"] == "running"
            offered = {b.binding.action for b in screen.active_bindings.values()}
            assert not offered & ACTING, offered
            assert "actions_refused" in offered
            for row in range(3):                              # every row, every acting key
                for key in ("s", "x", "r", "p"):
                    await pilot.press(key)
                    await pilot.pause(0.05)
                    assert not isinstance(app.screen, ConfirmScreen)
                await pilot.press("down")
            # Every way in refuses too: the actions called directly, and the workers behind them.
            for action in (screen.action_start_job, screen.action_stop_job, screen.action_restart_job,
                           screen.action_pivot):
                action()
            screen._start("toucher")
            screen._stop("sleeper", True)
            screen._plan_stop("sleeper", False)
            screen._plan_pivot("eng")
            await pilot.pause(1.0)                            # a worker that would act has had its time
            assert not isinstance(app.screen, ConfirmScreen)
            assert any(n.startswith("actions off: read-only (--readonly)") for n in notices(app)), notices(app)
            assert any("read-only (--readonly)" in n and "nothing here starts" in n for n in notices(app))
    finally:
        alive = sup.job_state("sleeper")
        sup.stop("sleeper", timeout=2)
    assert alive.live and alive.run_id == sleeper.run_id and alive.pid == sleeper.pid
    assert not marker.exists()
    assert sorted(p.name for p in (state / "runs").rglob("*") if p.is_dir()) == runs_before


@pilot_test
async def test_readonly_host_tab_offers_no_start_or_stop(state, tmp_path, monkeypatch) -> None:
    """A host with readonly = true in hosts.toml: its tab hides s / x, and they open no confirmation."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu2]\nssh = "nobody@127.0.0.1:9"\nconnect_timeout_s = 0.5\nreadonly = true\n'
                     '[hosts.gpu3]\nssh = "nobody@127.0.0.1:9"\nconnect_timeout_s = 0.5\n')
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))
    app = make_console(jobs_file(tmp_path, tmp_path / "acted"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, HostsScreen) and app.screen, "hosts")
        screen.select("gpu2")
        await wait_for(pilot, lambda: screen.selected == "gpu2", "gpu2's tab")
        await pilot.pause(0.1)
        offered = {b.binding.action for b in screen.active_bindings.values()}
        assert not offered & {"start_job", "stop_job"} and "actions_refused" in offered, offered
        await pilot.press("s", "x")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("actions off: read-only (host gpu2 has readonly = true" in n for n in notices(app))
        screen.select("gpu3")                                  # the other host still acts
        await wait_for(pilot, lambda: screen.selected == "gpu3", "gpu3's tab")
        await pilot.pause(0.1)
        offered = {b.binding.action for b in screen.active_bindings.values()}
        assert {"start_job", "stop_job"} <= offered, offered


@pilot_test
async def test_readonly_console_reaches_every_host_read_only(state, tmp_path, monkeypatch) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu2]\nssh = "nobody@127.0.0.1:9"\nconnect_timeout_s = 0.5\n')
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))
    app = make_console(jobs_file(tmp_path, tmp_path / "acted"), readonly="GPUDECK_READONLY=1")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, HostsScreen) and app.screen, "hosts")
        assert [s.readonly for s in app.hosts_feed.specs if not s.local] == [True]
        screen.select("gpu2")
        await wait_for(pilot, lambda: screen.selected == "gpu2", "gpu2's tab")
        await pilot.press("s", "x")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("actions off: read-only (GPUDECK_READONLY=1)" in n for n in notices(app))


# -- the CLI ----------------------------------------------------------------------------------------

MUTATING = [["start", "toucher"], ["stop", "sleeper"], ["restart", "sleeper"], ["pivot", "eng", "--yes"],
            ["run", "toucher"], ["runs", "--prune", "--yes"]]


@pytest.fixture
def cli_env(state, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUDECK_READONLY", raising=False)
    monkeypatch.delenv("GPUDECK_HOST", raising=False)
    marker = tmp_path / "acted"
    return jobs_file(tmp_path, marker), marker


def _refused(capsys, argv: list[str], source: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    word = next(a for a in argv if a in {"start", "stop", "restart", "pivot", "run", "runs"})
    assert len(lines) == 1 and lines[0].startswith(f"gpudeck: {word}: read-only: {source}"), err
    assert lines[0].endswith("nothing was done") and out == ""


@pytest.mark.parametrize("how", ["flag", "env", "config"])
def test_mutating_commands_refuse_in_one_line_with_exit_2(cli_env, capsys, monkeypatch, how) -> None:
    jobs, marker = cli_env
    flag = []
    if how == "flag":
        flag, source = ["--readonly"], "--readonly"
    elif how == "env":
        monkeypatch.setenv("GPUDECK_READONLY", "1")
        source = "GPUDECK_READONLY=1"
    else:
        (config := Path(jobs.parent / "config" / "gpudeck")).mkdir(parents=True)
        (config / "config.toml").write_text("readonly = true\n")
        source = f"readonly = true in {config / 'config.toml'}"
    for command in MUTATING:
        _refused(capsys, [*flag, "--jobs", str(jobs), *command], source)
    state = Path(__import__("os").environ["GPUDECK_STATE_DIR"])
    assert not marker.exists() and not (state / "runs").exists()
    # Watching still works.
    assert main([*flag, "--jobs", str(jobs), "jobs", "--json"]) == 0
    assert {j["name"] for j in json.loads(capsys.readouterr().out)["jobs"]} == {"toucher", "sleeper", "eng"}


def test_readonly_off_values_and_a_bad_config(cli_env, capsys, monkeypatch) -> None:
    jobs, marker = cli_env
    monkeypatch.setenv("GPUDECK_READONLY", "0")
    assert main(["--jobs", str(jobs), "start", "toucher"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("GPUDECK_READONLY", "yes please")      # not an off value: read-only, never open
    _refused(capsys, ["--jobs", str(jobs), "stop", "toucher"], "GPUDECK_READONLY=yes please")
    monkeypatch.delenv("GPUDECK_READONLY")
    (config := Path(jobs.parent / "config" / "gpudeck")).mkdir(parents=True)
    (config / "config.toml").write_text('readonly = "yes"\n')
    capsys.readouterr()
    assert main(["--jobs", str(jobs), "stop", "toucher"]) == 1
    assert "readonly must be true or false" in capsys.readouterr().err


def test_a_readonly_host_refuses_mutating_commands_before_connecting(cli_env, capsys, monkeypatch, tmp_path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu2]\nssh = "nobody@127.0.0.1:9"\nreadonly = true\n')
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))
    for command in MUTATING:
        _refused(capsys, ["--host", "gpu2", *command], f"host gpu2 has readonly = true in {hosts}")
    hosts.write_text('[hosts.gpu2]\nssh = "nobody@127.0.0.1:9"\nreadonly = "yes"\n')
    assert main(["--host", "gpu2", "start", "x"]) == 2
    assert "readonly has the wrong type" in capsys.readouterr().err


# -- the agent, without SSH (the real-sshd test is tests/ssh/test_ssh_readonly.py) ---------------------

def test_a_readonly_agent_refuses_every_mutating_op_whatever_it_is_sent(state, tmp_path) -> None:
    marker = tmp_path / "acted"
    jobs = jobs_file(tmp_path, marker)
    proc = subprocess.Popen([sys.executable, "-m", "gpudeck.jobs.hosts.agent", "--readonly", "--jobs", str(jobs),
                             "--state-dir", str(state)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["readonly"] is True
        requests = [{"op": "hello", "params": {"readonly": False}}, {"op": "start", "params": {"job": "toucher"}},
                    {"op": "run", "params": {"job": "toucher"}}, {"op": "restart", "params": {"job": "sleeper"}},
                    {"op": "stop", "params": {"job": "sleeper"}}, {"op": "pivot", "params": {"target": "eng"}},
                    {"op": "runs_prune", "params": {"yes": True, "keep": 0}},
                    {"op": "start", "params": {"job": "toucher", "readonly": False}},
                    {"op": "jobs", "params": {}}]
        for rid, request in enumerate(requests, 1):
            proc.stdin.write(encode({"id": rid, **request}))
        proc.stdin.flush()
        replies = {}
        while len(replies) < len(requests):
            reply = json.loads(proc.stdout.readline())
            replies[reply["id"]] = reply
        assert replies[1]["ok"] and replies[1]["result"]["readonly"] is True
        for rid in range(2, 9):
            assert not replies[rid]["ok"] and replies[rid]["error"].startswith("read-only: this host's agent refuses"), \
                replies[rid]
        assert replies[9]["ok"] and {j["name"] for j in replies[9]["result"]["jobs"]} == {"toucher", "sleeper", "eng"}
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    time.sleep(0.2)
    assert not marker.exists() and not (state / "runs").exists()


def test_the_box_can_make_its_agent_read_only_on_its_own(state, tmp_path) -> None:
    """GPUDECK_READONLY=1 in the agent's environment on the box: read-only whatever the laptop asked for."""
    import os
    proc = subprocess.Popen([sys.executable, "-m", "gpudeck.jobs.hosts.agent", "--jobs",
                             str(jobs_file(tmp_path, tmp_path / "acted")), "--state-dir", str(state)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "GPUDECK_READONLY": "1"})
    try:
        assert json.loads(proc.stdout.readline())["readonly"] is True
        proc.stdin.write(encode({"id": 1, "op": "start", "params": {"job": "toucher"}}))
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["error"].startswith("read-only")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert not (state / "runs").exists()
