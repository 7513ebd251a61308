"""A spoofed box over real sshd (issue harden 1, 2, 4): its agent answers with escapes, markup and malformed replies.

The "evil" host is the `box` sshd with hosts.toml's `python` pointing at a wrapper
that runs tests/ssh/hostile_agent.py instead of gpudeck's agent: what a compromised
box (or one whose name was spoofed) can send down the link.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runsupport import pilot_wait_for, wait_for

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;aGk=\x07\x9d52;c;aGk=\x9c\x1bc\u202etxt.exe"
MARKUP = "[/zz]x[@click=app.quit]q[/]"
JOB = f"evil{ESCAPES}{MARKUP}"
RUN = f"r1{ESCAPES}{MARKUP}"
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def _status() -> dict:
    from gpudeck.jobs.hosts.protocol import pack_status
    from gpudeck.jobs.telemetry.sampler import SimulatedSampler
    from gpudeck.jobs.telemetry.status import status_payload
    return pack_status(status_payload(SimulatedSampler().sample()))


def _jobs(*extra) -> dict:
    return {"jobs": [{"name": JOB, "kind": "stage", "state": "idle", "pid": None, "run_id": RUN, "gpus": [],
                      "started_at": time.time() - 60, "alerts": []}, *extra], "pipelines": []}


class Evil:
    """The spoofed host: hosts.toml entry, scenario file, and the requests it received."""

    def __init__(self, lab, root: Path) -> None:
        self.scenario = root / "scenario.json"
        wrapper = root / "fake-python"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'hostile_agent.py'} {self.scenario}\n")
        wrapper.chmod(0o755)
        hosts = lab.client.config_dir / "hosts.toml"
        hosts.write_text(hosts.read_text() + f'\n[hosts.evil]\nssh = "box"\npython = "{wrapper}"\n'
                         "keepalive_s = 1\nkeepalive_count = 3\nconnect_timeout_s = 5\n")

    def answer(self, **ops) -> None:
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text(json.dumps(ops))
        tmp.replace(self.scenario)

    def requests(self, op: str) -> list[dict]:
        path = Path(str(self.scenario) + ".requests")
        lines = path.read_text().splitlines() if path.exists() else []
        return [r for r in map(json.loads, lines) if r.get("op") == op]


@pytest.fixture
def evil(lab, tmp_path):
    return Evil(lab, tmp_path)


def gd(lab, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO, env=lab.env,
                          capture_output=True, text=True, timeout=timeout)


def _one_line_failure(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_runs_and_postmortem_with_bad_replies_are_one_line_and_non_zero(lab, evil):
    evil.answer(runs=[{"runs": [{"run_id": "r1", "job": "a", "kind": "job", "started_at": "yesterday",
                                 "state": "exited"}]}],
                postmortem=[{"report": {"verdict": "ok", "phases": [{"phase": "load", "duration_s": [1]}]}}])
    line = _one_line_failure(gd(lab, "--host", "evil", "runs"))
    assert "evil: bad reply to runs: runs[0].started_at is a str, not a number" in line
    line = _one_line_failure(gd(lab, "--host", "evil", "postmortem", "a"))
    assert "evil: bad reply to postmortem: report.phases[0].duration_s is a list, not a number" in line
    # Without the link keeper (this process holds the link) the answer is the same.
    lab.env = {**lab.env, "GPUDECK_SSH_MUX": "0"}
    evil.answer(runs=[{"runs": ["r1"]}], postmortem=[{"report": "none"}])
    assert "bad reply to runs: runs[0] is a str, not an object" in _one_line_failure(gd(lab, "--host", "evil", "runs"))
    assert "bad reply to postmortem: report is a str, not an object" in _one_line_failure(
        gd(lab, "--host", "evil", "postmortem"))


def test_a_first_poll_never_answered_ends_stale_with_the_reason(lab, evil, monkeypatch):
    from gpudeck.jobs.hosts.config import load_hosts
    from gpudeck.jobs.hosts.fleet import Fleet
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    evil.answer(poll=["silent"])
    fleet = Fleet([load_hosts()["evil"]], interval=0.5, poll_timeout=2.0).start()
    try:
        wait_for(lambda: fleet.views()["evil"].connects == 1, 30, "the spoofed agent's hello")
        linked = time.monotonic()
        view = wait_for(lambda: (lambda v: v if v.state != "LIVE" else None)(fleet.views()["evil"]), 10,
                        "evil no longer LIVE")
        assert time.monotonic() - linked < 5
        assert view.state == "STALE" and re.fullmatch(r"evil: no answer to poll within [12](\.\d)? s", view.error)
        assert view.summary()["link"] == "STALE"
    finally:
        fleet.close()


def test_the_hosts_view_of_a_spoofed_box_stays_inert_and_running(lab, evil, monkeypatch):
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    good_poll = {"status": {"full": _status()}, "jobs": {"full": _jobs()}}
    line = f"log {ESCAPES} {MARKUP}\n".encode()
    evil.answer(poll=[good_poll],
                logs=[{"run_id": RUN, "offset": 0, "next_offset": len(line), "ended": False,
                       "data": base64.b64encode(line).decode()}],
                start=[{"run_id": RUN}])
    from gpudeck.console.app import make_app

    def host(app) -> dict:
        return (app.hosts_feed.latest or {}).get("evil") or {}

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        app.initial_host = "evil"
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot_wait_for(pilot, lambda: getattr(app.screen, "selected", None) == "evil"
                                 and (host(app).get("jobs") or {}).get("jobs"), "evil's tab with its job", 60)
            detail = app.screen.query_one("#host-detail")
            await pilot_wait_for(pilot, lambda: "log " in str(detail.render()), "evil's log tail", 30,
                                 detail=lambda: str(detail.render()))
            text = str(detail.render())
            assert not CONTROLS.search(text), sorted({hex(ord(c)) for c in CONTROLS.findall(text)})
            assert MARKUP in text and "<U+202E>" in text
            await pilot.press("s")
            await pilot_wait_for(pilot, lambda: any("started" in n.message for n in app._notifications),
                                 "the started toast", 30, detail=lambda: [n.message for n in app._notifications])
            assert app.is_running and app.return_code is None
            assert [r["params"] for r in evil.requests("start")] == [{"job": JOB}]
            for toast in app._notifications:
                assert not toast.markup and not CONTROLS.search(toast.message), toast.message
            # Now the box answers garbage: the tab says what was wrong in one line, the console runs on.
            evil.answer(poll=[{"status": {"full": _status()}, "jobs": {"full": _jobs("not a job")}}])
            await pilot_wait_for(pilot, lambda: "bad reply" in (host(app)["summary"].get("error") or ""),
                                 "the bad reply named", 30, detail=lambda: host(app)["summary"])
            summary = host(app)["summary"]
            assert summary["error"] == "evil: bad reply to poll: jobs.jobs[1] is a str, not an object"
            assert summary["link"] == "STALE"
            await pilot_wait_for(pilot, lambda: "bad reply to poll" in str(detail.render()), "shown in the tab", 10)
            assert app.is_running
            # And when it answers properly again, it is LIVE again.
            evil.answer(poll=[good_poll])
            await pilot_wait_for(pilot, lambda: host(app)["summary"]["link"] == "LIVE", "LIVE again", 30)
        app.hosts_feed.close()

    asyncio.run(scenario())


def test_a_hello_of_the_wrong_shape_is_refused_in_one_line(lab, evil):
    evil.answer(hello={"hello": "gpudeck-agent", "protocol": 1, "via": "spoofed", "pid": "1; rm -rf /",
                       "hostname": ESCAPES}, jobs=[{"jobs": []}])
    line = _one_line_failure(gd(lab, "--host", "evil", "jobs"))
    assert "evil: bad reply to hello: pid is a str, not an integer" in line


def _drawn(app) -> str:
    """What the screen shows: each widget's rendered lines, and the toasts."""
    out = []
    for widget in app.screen.walk_children():
        try:
            strips = widget.render_lines(widget.region.reset_offset) if widget.region.area else []
        except Exception:  # noqa: BLE001 - a widget that cannot render alone (containers)
            continue
        out.extend("".join(seg.text for seg in strip) for strip in strips)
    out.extend(n.message for n in app._notifications)
    return "\n".join(out)


def test_history_and_post_mortem_of_a_spoofed_box_are_inert_and_its_paths_never_opened(lab, evil, monkeypatch):
    """The console's box is the spoofed one: its run rows, report and run names reach the screen sanitised
    and literal; a report naming a file of this machine never opens it; a run name that is not a path part
    fetches nothing (one line), and the console runs on."""
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    secret = lab.work / "secret.log"
    secret.write_text("not for the box\n")
    row = {"run_id": RUN, "job": JOB, "kind": "job", "started_at": time.time() - 60, "ended_at": time.time() - 30,
           "duration_s": 30.0, "state": "exited", "exit_code": 1, "failed": True,
           "failure_cause": f"cuda_oom{ESCAPES}{MARKUP}", "path": str(lab.work), "key": {"not": "a str"},
           "peak_gpu_mem": {"0": "lots"}}
    report = {"verdict": f"crashed {ESCAPES}{MARKUP}", "source": {"job": JOB, "run_id": RUN, "log": str(secret)},
              "outcome": {"exit_code": 1, "state": "exited"},
              "lines": [{"label": f"root cause{MARKUP}", "line": 1,
                         "context": [{"key": True, "line": 1, "text": f"boom {ESCAPES}{MARKUP}"}]}]}
    evil.answer(runs=[{"runs": [row, row]}], postmortem=[{"report": report}])
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen
    from gpudeck.console.widgets.log_view import LogViewPane
    from gpudeck.jobs.box import open_box
    from gpudeck.jobs.telemetry.sampler import make_sampler

    def inert(text: str) -> None:
        assert not CONTROLS.search(text), sorted({hex(ord(c)) for c in CONTROLS.findall(text)})

    async def scenario():
        app = make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3)
        app._box = open_box("evil")
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.press("3")
            history = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen,
                                           "the history view")
            await pilot_wait_for(pilot, lambda: len(history.rows) == 2, "the spoofed rows", 60,
                                 detail=lambda: str(history.query_one("#history-reason").render()))
            await pilot.pause(0.2)
            drawn = _drawn(app)
            inert(drawn)
            assert "[/zz]x[@click" in drawn and app.is_running
            await pilot.press("enter")
            pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen, "pm")
            await pilot_wait_for(pilot, lambda: pm.view is not None, "the spoofed report", 30)
            await pilot_wait_for(pilot, lambda: any("the log of" in n.message for n in app._notifications),
                                 "the record refused in one line", 30,
                                 detail=lambda: [n.message for n in app._notifications])
            assert pm.view.log_path is None and pm.record is None
            assert pm.query_one(LogViewPane).path != secret          # the box's "log" is never opened here
            await pilot.pause(0.2)
            drawn = _drawn(app)
            inert(drawn)
            assert MARKUP in drawn and "not for the box" not in drawn
            await pilot.press("R")                                   # a replay: nothing fetched, one line
            await pilot_wait_for(pilot, lambda: any("cannot replay" in n.message for n in app._notifications),
                                 "the replay refused in one line", 30)
            for toast in app._notifications:
                assert not toast.markup, toast.message
                inert(toast.message)
            assert app.is_running and not app.replaying
            assert not evil.requests("run_file")
        app._box.close()

    asyncio.run(scenario())
