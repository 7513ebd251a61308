"""A readonly = true host over a real OpenSSH server: its agent refuses to act on that connection, whatever it is sent."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# A client that skips every console-side check: it opens the link as gpudeck does and sends raw ops
# on it, a forged hello first (asking to be let off read-only), then start / run / stop / restart / pivot.
RAW_CLIENT = r'''
import asyncio, json, sys
from gpudeck.jobs.hosts.config import resolve_host
from gpudeck.jobs.hosts.errors import RemoteError
from gpudeck.jobs.hosts.ssh import AgentChannel

async def main():
    channel = await AgentChannel.open(resolve_host(sys.argv[1]))
    out = {"hello": channel.hello, "replies": {}}
    for op, params in [("hello", {"readonly": False}), ("start", {"job": "sleeper"}), ("run", {"job": "train"}),
                       ("stop", {"job": "sleeper"}), ("restart", {"job": "sleeper"}),
                       ("pivot", {"target": "sleeper"}), ("runs_prune", {"yes": True, "keep": 0}),
                       ("start", {"job": "sleeper", "readonly": False}), ("jobs", {})]:
        try:
            out["replies"][f"{op} {json.dumps(params)}"] = {"ok": await channel.call(op, params, timeout=30)}
        except RemoteError as exc:
            out["replies"][f"{op} {json.dumps(params)}"] = {"error": str(exc)}
    await channel.close()
    print(json.dumps(out))

asyncio.run(main())
'''


def gd(lab, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_readonly_host_agent_refuses_raw_mutating_ops_over_ssh(lab, tmp_path):
    lab.env = lab.setup(tmp_path / "work", extra="readonly = true\n")
    done = subprocess.run([sys.executable, "-c", RAW_CLIENT, "box"], cwd=REPO, env=lab.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["hello"]["readonly"] is True
    replies = out["replies"]
    assert replies.pop('hello {"readonly": false}')["ok"]["readonly"] is True      # a request changes nothing
    jobs = replies.pop("jobs {}")
    assert {j["name"] for j in jobs["ok"]["jobs"]} >= {"sleeper", "train"}          # watching still works
    for request, reply in replies.items():
        assert reply.get("error", "").startswith("box: read-only: this host's agent refuses"), (request, reply)
    assert not (lab.state_dir("box") / "runs").exists()

    # The CLI refuses before it connects; reading over the same read-only link works.
    refused = gd(lab, "--host", "box", "start", "sleeper")
    assert refused.returncode == 2 and refused.stderr.startswith("gpudeck: start: read-only: host box has readonly")
    listed = gd(lab, "--host", "box", "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert not (lab.state_dir("box") / "runs").exists()


def test_readonly_flag_reaches_the_box_read_only_too(lab, tmp_path):
    """--readonly on the laptop: a plain host's agent is started read-only for that invocation's link."""
    done = subprocess.run([sys.executable, "-c",
                           "import sys, dataclasses, argparse\n"
                           "from gpudeck.console.commands._host import host_spec\n"
                           "print(host_spec(argparse.Namespace(host='box', readonly=True)).readonly)\n"
                           "print(host_spec(argparse.Namespace(host='box', readonly=False)).readonly)\n"],
                          cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False"], done.stderr
    refused = gd(lab, "--readonly", "--host", "box", "stop", "sleeper")
    assert refused.returncode == 2 and refused.stderr.startswith("gpudeck: stop: read-only: --readonly")
    listed = gd(lab, "--readonly", "--host", "box", "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    # The link that read-only invocation used is an agent that enforces it; a plain one is not.
    for flags, readonly in ((["--readonly"], True), ([], False)):
        status = gd(lab, *flags, "--host", "box", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["agent"]["readonly"] is readonly


def test_readonly_console_hosts_view_over_ssh_offers_nothing_and_its_links_refuse(lab, monkeypatch):
    """gpudeck --readonly, hosts view: every box's link is a read-only agent; s / x are off; even a call
    straight on the fleet (as a changed console would make) is refused on the box."""
    import asyncio

    from runsupport import pilot_wait_for
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.confirm import ConfirmScreen

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"), readonly="--readonly")
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("4")
            screen = app.screen
            await pilot_wait_for(pilot, lambda: (app.hosts_feed.latest or {}).get("box", {}).get("summary", {})
                                 .get("link") == "LIVE" and app.hosts_feed.latest["box"].get("jobs"),
                                 "box LIVE with its jobs", 60)
            assert app.hosts_feed.latest["box"]["agent"]["readonly"] is True
            screen.select("box")
            await pilot_wait_for(pilot, lambda: screen.selected == "box", "box's tab", 10)
            await pilot.pause(0.2)
            assert "READ-ONLY" in str(screen.query_one("#host-detail").render())
            offered = {b.binding.action for b in screen.active_bindings.values()}
            assert not offered & {"start_job", "stop_job"}, offered
            await pilot.press("s", "x")
            await pilot.pause(0.3)
            assert not isinstance(app.screen, ConfirmScreen)
            future = app.hosts_feed.fleet.call("box", "start", {"job": "sleeper"}, timeout=30, retry=False)
            with pytest.raises(Exception, match="read-only: this host's agent refuses start"):
                await asyncio.wrap_future(future)
        app.hosts_feed.close()

    asyncio.run(scenario())
    assert not (lab.state_dir("box") / "runs").exists()
