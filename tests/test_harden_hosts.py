"""Issue harden 1 and 2, the hosts view: a remote's text reaches the screen only through the sanitizer, and never as markup.

A compromised (or spoofed) box chooses its job names, run ids, states and log lines.
The hosts view draws them in a tab, a confirmation title and toasts: no escape
sequence, C1 control or bidi override may reach the operator's terminal, and
`[/zz]` / `[@click=app.quit]` in a name must be shown as written, not parsed.
"""
from __future__ import annotations

import base64
import concurrent.futures
import re
from typing import Any

from textual.app import App

from gpudeck.console.screens.confirm import ConfirmScreen
from gpudeck.console.screens.hosts import HostsScreen
from gpudeck.jobs.hosts.fleet import HostView

from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for

# OSC 0 (title), OSC 52 (clipboard) in its 7- and 8-bit forms, RIS (ESC c), a bidi override, and markup.
ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;aGk=\x07\x9d52;c;aGk=\x9c\x1bc\u202etxt.exe"
MARKUP = "[/zz]x[@click=app.quit]q[/]"
JOB = f"evil{ESCAPES}{MARKUP}"
RUN = f"r1{ESCAPES}{MARKUP}"
LINE = f"log {ESCAPES} {MARKUP}"
CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def _jobs() -> dict:
    return {"jobs": [{"name": JOB, "kind": "stage", "state": f"running{ESCAPES}", "pid": 4242, "run_id": RUN,
                      "started_at": 1.0, "gpus": [], "alerts": [{"code": "stall", "message": LINE}]}],
            "pipelines": []}


def _hosts() -> dict:
    view = HostView(name="box", ssh="box", state="LIVE", data_age_s=0.1, jobs=_jobs(),
                    error=f"jobs: {ESCAPES}{MARKUP}", agent={"via": f"zipapp{ESCAPES}", "python": MARKUP})
    return {"box": {"summary": view.summary(), "status": None, "jobs": view.jobs, "agent": view.agent}}


class _Fleet:
    """The fleet as the hosts view sees it: its hosts, and calls answered at once (by the spoofed box)."""

    def __init__(self) -> None:
        self.specs_by_name = {"box": object()}
        self.calls: list[tuple[str, str, dict]] = []

    def call(self, host: str, op: str, params: Any = None, **_: Any) -> concurrent.futures.Future:
        self.calls.append((host, op, dict(params or {})))
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if op == "logs":
            fut.set_result({"run_id": RUN, "offset": 0, "next_offset": 10, "ended": False,
                            "data": base64.b64encode((LINE + "\n").encode()).decode()})
        elif op == "start":
            fut.set_result({"run_id": RUN})
        else:
            fut.set_result({"lines": [f"stopped {JOB}"], "clean": True})
        return fut


class _Feed:
    def __init__(self) -> None:
        self.fleet = _Fleet()

    def follow(self, node: Any, callback: Any, **_: Any) -> None:
        node.call_after_refresh(callback, _hosts())

    def publish_now(self) -> None:
        pass


class HostsApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.hosts_feed = _Feed()
        self.jobs_feed = None
        self.initial_host = "box"

    def on_mount(self) -> None:
        self.push_screen(HostsScreen())


def _rendered(app: App) -> str:
    """What the screen shows: each widget's rendered lines, as strips (what reaches the terminal)."""
    out = []
    for widget in app.screen.walk_children():
        try:
            strips = widget.render_lines(widget.region.reset_offset) if widget.region.area else []
        except Exception:  # noqa: BLE001 - a widget that cannot render alone (containers)
            continue
        out.extend("".join(seg.text for seg in strip) for strip in strips)
    for toast in app._notifications:
        out.append(toast.message)
    return "\n".join(out)


def _assert_inert(text: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in CONTROLS.findall(text.replace("\n", ""))})
    assert not found, f"control characters reached the screen: {found}"
    assert "pwned" not in text or "]0;" not in text


@pilot_test
async def test_a_remote_job_name_run_id_and_log_are_drawn_sanitised_and_literal() -> None:
    app = HostsApp()
    async with app.run_test(size=(200, 50)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: isinstance(app.screen, HostsScreen) and app.screen.selected == "box",
                       "box's tab")
        detail = screen.query_one("#host-detail")
        await wait_for(pilot, lambda: "log " in str(detail.render()) and "── evil" in str(detail.render()),
                       "box's log tail", detail=lambda: str(detail.render()))
        text = str(detail.render())
        _assert_inert(text)
        assert MARKUP in text                                   # markup in a name is shown, as written
        assert "<U+202E>" in text                               # the bidi override shown escaped, not obeyed
        await pilot.pause(0.2)
        _assert_inert(_rendered(app))
        assert app.is_running


@pilot_test
async def test_start_and_stop_toasts_and_the_confirmation_of_a_remote_job_are_never_markup() -> None:
    app = HostsApp()
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, HostsScreen) and app.screen.selected == "box"
                       and app.screen._picked_job() is not None, "box's tab with its job")
        screen = app.screen
        await pilot.press("s")                 # "start evil… on box…", then "started … (run r1…)"
        await wait_for(pilot, lambda: any("started" in n.message for n in app._notifications), "the started toast",
                       detail=lambda: [n.message for n in app._notifications])
        assert app.is_running and app.return_code is None
        assert ("box", "start", {"job": JOB}) in screen.app.hosts_feed.fleet.calls     # the name as the box knows it
        for toast in app._notifications:
            assert not toast.markup, toast.message
            _assert_inert(toast.message)
        assert any(MARKUP in n.message for n in app._notifications)
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the stop confirmation")
        asked = app.screen.text
        _assert_inert(asked)
        assert asked.startswith("Stop evil") and MARKUP in asked
        await pilot.pause(0.1)
        _assert_inert(_rendered(app))
        await pilot.press("y")
        await wait_for(pilot, lambda: any(n.message.startswith("stopped evil") for n in app._notifications),
                       "the stopped toast", detail=lambda: [n.message for n in app._notifications])
        assert app.is_running and app.return_code is None
        for toast in app._notifications:
            assert not toast.markup, toast.message
            _assert_inert(toast.message)
        _assert_inert(_rendered(app))


@pilot_test
async def test_the_fleet_overview_of_a_spoofed_box_is_inert_and_counts_only() -> None:
    """The fleet row's why column is the box's own error text: sanitised, never markup; its jobs are only counted."""
    from gpudeck.console.screens.hosts import HostsTable
    app = HostsApp()
    app.initial_host = None
    async with app.run_test(size=(200, 50)) as pilot:
        table = await wait_for(pilot, lambda: isinstance(app.screen, HostsScreen)
                               and app.screen.query_one(HostsTable).row_keys == ["box"]
                               and app.screen.query_one(HostsTable), "the fleet row")
        row = [c if isinstance(c, str) else c[0] for c in table._rows["box"]]
        assert row[4:7] == ["1", "0", "0"]          # running; its "stall" alert is not a stall code
        _assert_inert(row[8])
        assert MARKUP in row[8]
        await pilot.pause(0.1)
        _assert_inert(_rendered(app))
        assert app.is_running
