"""The console's hosts view over real sshd: an overview row per host, a tab per host, dead links never block it."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runsupport import pilot_wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


async def until(pilot, predicate, timeout: float, what: str, detail=None):
    return await pilot_wait_for(pilot, predicate, what, timeout, detail=detail)


def links(app) -> dict:
    hosts = app.hosts_feed.latest or {}
    return {name: h["summary"]["link"] for name, h in hosts.items()}


def test_overview_and_tabs_while_one_box_goes_dark(console_env):
    lab = console_env
    from gpudeck.console.app import make_app
    # A wait for the frozen box would last its connect timeout: made 20 s here, far from the bound
    # below (the lab's 5 s was within a loaded machine's time to draw two tabs).
    hosts = lab.client.config_dir / "hosts.toml"
    assert "connect_timeout_s = 5\n" in hosts.read_text()
    hosts.write_text(hosts.read_text().replace("connect_timeout_s = 5\n", "connect_timeout_s = 20\n"))

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: links(app) == {"local": "LIVE", "box": "LIVE", "box2": "LIVE"}
                        and all(h["status"] for h in app.hosts_feed.latest.values()), 60, "three LIVE hosts")
            screen = app.screen
            table = screen.query_one("#hosts-table")
            assert table.row_keys == ["local", "box", "box2"]
            row = app.hosts_feed.latest["box"]["summary"]
            assert row["gpus"] == 8 and row["simulated"] and row["gpu_mem_total"] > 0
            lab.box.freeze()
            try:
                frozen = time.monotonic()
                await until(pilot, lambda: links(app).get("box") == "DOWN", 20, "box DOWN")
                assert time.monotonic() - frozen < 10          # keepalive 1 s x 3, plus a poll or two
                assert links(app)["box2"] == "LIVE"
                # Switching tabs is drawing cached data: it never waits for the dead host.
                t0 = time.monotonic()
                await pilot.press("right", "right")
                await pilot.pause()
                # (A wait for the dead host would last its 20 s connect timeout; 10 s leaves room for load.)
                assert screen.selected == "box" and time.monotonic() - t0 < 10
                detail = str(screen.query_one("#host-detail").render())
                assert "DOWN" in detail and "NVIDIA H200" in detail      # its last data, still shown
                await pilot.press("right")
                await pilot.pause()
                assert screen.selected == "box2"
                assert "LIVE" in str(screen.query_one("#host-detail").render())
            finally:
                lab.box.thaw()
            await until(pilot, lambda: links(app).get("box") == "LIVE", 60, "box LIVE again")
        app.hosts_feed.close()

    asyncio.run(scenario())


def test_console_link_killed_reconnects_and_the_job_runs_on(console_env):
    lab = console_env
    from gpudeck.console.app import make_app
    started = subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "--host", "box", "start", "sleeper"],
                             cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=90)
    assert started.returncode == 0, started.stderr

    def box_jobs(app):
        host = (app.hosts_feed.latest or {}).get("box") or {}
        return {j["name"]: j for j in (host.get("jobs") or {}).get("jobs", [])}

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: box_jobs(app).get("sleeper", {}).get("state") == "running", 60,
                        "sleeper running on box")
            pid = box_jobs(app)["sleeper"]["pid"]
            assert app.hosts_feed.latest["box"]["summary"]["jobs_running"] == 1
            connects = app.hosts_feed.fleet.views()["box"].connects
            assert lab.box.kill_sessions()
            await until(pilot, lambda: app.hosts_feed.fleet.views()["box"].connects > connects
                        and links(app)["box"] == "LIVE", 60, "box reconnected")
            assert box_jobs(app)["sleeper"]["state"] == "running" and box_jobs(app)["sleeper"]["pid"] == pid
            # Its tab shows the job running with its log (fetched by the fleet, off the UI thread).
            await pilot.press("right", "right")
            detail = app.screen.query_one("#host-detail")
            await until(pilot, lambda: "sleeper up" in str(detail.render()), 30, "the sleeper's log in box's tab")
            assert "running" in str(detail.render())
        app.hosts_feed.close()

    asyncio.run(scenario())
    out = subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "--host", "box", "jobs", "--json"],
                         cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=90)
    sleeper = next(j for j in json.loads(out.stdout)["jobs"] if j["name"] == "sleeper")
    assert sleeper["state"] == "running"


def test_start_and_stop_a_remote_job_from_its_tab(console_env):
    lab = console_env
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.confirm import ConfirmScreen

    def box_job(app, name):
        host = (app.hosts_feed.latest or {}).get("box") or {}
        return next((j for j in (host.get("jobs") or {}).get("jobs", []) if j["name"] == name), {})

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: box_job(app, "sleeper").get("state") == "idle", 60, "box's jobs")
            await pilot.press("right", "right")
            screen = app.screen
            assert screen.selected == "box"
            for _ in range(10):                      # j until the sleeper is picked
                if (screen._picked_job() or {}).get("name") == "sleeper":
                    break
                await pilot.press("j")
            assert screen._picked_job()["name"] == "sleeper"
            await pilot.press("s")
            await until(pilot, lambda: box_job(app, "sleeper").get("state") == "running", 60, "sleeper started")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the stop confirmation")
            assert "Stop sleeper on box?" in app.screen.text and "pid" in app.screen.text
            await pilot.press("y")
            await until(pilot, lambda: box_job(app, "sleeper").get("state") == "stopped", 60, "sleeper stopped")
        app.hosts_feed.close()

    asyncio.run(scenario())
    run = sorted((lab.state_dir("box") / "runs" / "sleeper").glob("2*"))
    assert run and (run[-1] / "exit.json").exists()


def test_host_option_opens_the_console_on_that_hosts_tab(console_env):
    lab = console_env
    import argparse

    from gpudeck.console.app import make_app
    from gpudeck.console.commands._host import host_spec

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        app.initial_host = host_spec(argparse.Namespace(host="box2")).name    # what `gpudeck --host box2` sets
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.current_mode == "hosts" and getattr(app.screen, "selected", None) == "box2",
                        30, "the hosts view on box2's tab")
            await until(pilot, lambda: "LIVE" in str(app.screen.query_one("#host-detail").render()), 60,
                        "box2's tab drawn")
        app.hosts_feed.close()

    asyncio.run(scenario())


def test_the_fleet_overview_counts_each_box_and_enter_enters_one(console_env):
    """One row per box: link (DOWN with why), GPUs busy/total, jobs running / stalled / failed; Enter on a row
    asks the app to enter that box (`switch_box`), the row of the box shown carries the ▸."""
    lab = console_env
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.hosts import HostsTable
    from gpudeck.jobs.box import open_box
    with open_box("box") as box:
        box.start("sleeper")

    def cells(app, name):
        table = app.screen.query_one(HostsTable)
        return [c if isinstance(c, str) else c[0] for c in table._rows.get(name, ())]

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "jobs.toml"))
        entered: list[str] = []
        app.switch_box = entered.append                 # the box switcher (the tui branch's), recorded
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: links(app) == {"local": "LIVE", "box": "LIVE", "box2": "LIVE"}
                        and all((app.hosts_feed.latest[n].get("jobs") or {}).get("jobs") for n in ("box", "box2")),
                        60, "three LIVE boxes")
            table = app.screen.query_one(HostsTable)
            await until(pilot, lambda: cells(app, "box")[4:7] == ["1", "0", "0"], 30, "box: the sleeper running",
                        detail=lambda: cells(app, "box"))
            assert table.row_keys == ["local", "box", "box2"]
            assert cells(app, "local")[0] == "▸ local" and cells(app, "box")[0] == "  box"     # the box shown
            busy, total = cells(app, "box")[2].split("/")
            assert total == "8" and 0 <= int(busy) <= 8                                         # SIMULATED 8 GPUs
            assert cells(app, "box")[1] == "LIVE" and cells(app, "box2")[4] == "0"
            assert table.has_focus and table.cursor_key == "local"
            await pilot.press("down", "enter")
            assert entered == ["box"]
            lab.box2.freeze()
            try:
                await until(pilot, lambda: cells(app, "box2")[1].startswith("DOWN"), 30, "box2 DOWN",
                            detail=lambda: cells(app, "box2"))
                assert cells(app, "box2")[8] and cells(app, "box2")[8] != "box2"   # why, not only where
                assert cells(app, "box")[1] == "LIVE"
                await pilot.press("down", "enter")        # a dead box can be entered: its views say DOWN
                assert entered == ["box", "box2"]
            finally:
                lab.box2.thaw()
            # In a box's tab, Enter enters that box.
            await pilot.press("right", "right")
            assert app.screen.selected == "box"
            await pilot.press("enter")
            assert entered == ["box", "box2", "box"]
        app.hosts_feed.close()

    asyncio.run(scenario())
