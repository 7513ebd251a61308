"""The whole console on a remote box over real sshd: its jobs in the jobs view, a start with `s`, the
run's lines in the log pane (read by offset through the box), a stop with `x`, the state change."""
from __future__ import annotations

import asyncio
import time

import pytest

from runsupport import pilot_wait_for

pytestmark = pytest.mark.slow


async def until(pilot, predicate, timeout: float, what: str, detail=None):
    return await pilot_wait_for(pilot, predicate, what, timeout, detail)


def test_jobs_view_log_pane_and_keys_on_a_remote_box(console_env):
    lab = console_env
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.confirm import ConfirmScreen
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
    from gpudeck.console.widgets.log_view import LogViewPane

    def job(screen, name):
        return next((j.payload for j in screen.jobs if j.name == name), {})

    def rows(pane):
        return [row.rstrip() for row in pane.visible_text()]

    async def select(pilot, screen, name):
        for _ in range(10):
            if screen.selected_job is not None and screen.selected_job.name == name:
                return
            await pilot.press("down")
        assert screen.selected_job.name == name

    async def scenario():
        # --demo's sampler for this machine only: the console must leave it for the box's telemetry.
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "no-local-jobs.toml"))
        app.initial_box = "box"                        # what `gpudeck --host box` sets
        async with app.run_test(size=(160, 44)) as pilot:
            await until(pilot, lambda: app.box.name == "box" and not app.box.local, 30, "on box")
            dashboard = app.screen
            await until(pilot, lambda: app.snapshot is not None and app.sample_error is None, 60,
                                 "box's telemetry", detail=lambda: app.sample_error)
            header = dashboard.query_one(BoxHeaderPanel).render_line(0).text
            assert "box box" in header and "8 GPUs" in header and "SIMULATED" in header
            # Telemetry and jobs come from one delta poll a round: at most 2 KB a round (2 KB/s at 1 Hz).
            link = app._box_link
            await asyncio.sleep(2.0)
            before, t0 = link.view(), time.monotonic()
            await asyncio.sleep(4.0)
            after, dt = link.view(), time.monotonic() - t0
            moved = (after.bytes_in + after.bytes_out) - (before.bytes_in + before.bytes_out)
            rounds = dt / link.fleet.interval
            print(f"box link: {moved / dt:.0f} B/s at {1 / link.fleet.interval:g} Hz, {moved / rounds:.0f} B a round")
            assert moved / rounds <= 2048, (moved, rounds)

            await pilot.press("2")
            screen = await until(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, 10,
                                          "jobs view")
            await until(pilot, lambda: [j.name for j in screen.jobs] == ["count", "sleeper", "prep",
                                                                                   "train", "tree"], 60,
                                 "box's jobs", detail=lambda: (screen.reason, screen.stale))
            assert screen.remote and screen.box is app.box
            assert "box box" in screen.query_one(BoxHeaderPanel).render_line(0).text

            # s starts count on the box; Enter follows its output, read by offset through the box.
            await select(pilot, screen, "count")
            await pilot.press("s")
            await until(pilot, lambda: job(screen, "count").get("run_id"), 60, "count started",
                                 detail=lambda: [n.message for n in app._notifications][-3:])
            await pilot.press("enter")
            pane = screen.query_one(LogViewPane)
            await until(pilot, lambda: any(r == "line 5" for r in rows(pane)) or pane.line_count > 5, 60,
                                 "count's first lines in the log pane", detail=lambda: rows(pane)[-3:])
            # It follows the run to its end (8 s of output), every line once, none missing.
            await until(pilot, lambda: "line 399" in rows(pane), 90, "count's last line",
                                 detail=lambda: (pane.line_count, rows(pane)[-3:]))
            text = pane.path.read_text()
            assert [line for line in text.splitlines()] == [f"line {i}" for i in range(400)]
            await until(pilot, lambda: job(screen, "count").get("state") == "exited", 60, "count exited")

            # R replays count's run: its record copied from the box by offset, played in this view.
            await pilot.press("escape")
            await select(pilot, screen, "count")
            await pilot.press("R")
            await until(pilot, lambda: screen.replay is not None and [j.name for j in screen.jobs] == ["count"], 60,
                        "count's replay", detail=lambda: [n.message for n in app._notifications][-3:])
            assert (app.jobs_feed.source.paths[0] / "output.log").read_text().count("\n") == 400
            await pilot.press("escape")                           # out of the replay: the box's live jobs
            await until(pilot, lambda: screen.replay is None and len(screen.jobs) == 5 and screen.remote, 60,
                        "box's live jobs again")

            # x stops sleeper after the confirmation; the table shows the state the box reports.
            await select(pilot, screen, "sleeper")
            await pilot.press("s")
            await until(pilot, lambda: job(screen, "sleeper").get("state") == "running", 60,
                                 "sleeper running")
            pid = job(screen, "sleeper")["pid"]
            await pilot.press("enter")
            await until(pilot, lambda: "sleeper up" in rows(pane), 60, "sleeper's line",
                                 detail=lambda: rows(pane)[-3:])
            await pilot.press("escape", "x")
            confirm = await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, 20,
                                           "the stop confirmation")
            assert "Stop sleeper on box?" in confirm.text and f"pid {pid}" in confirm.text
            t0 = time.monotonic()
            await pilot.press("y")
            await until(pilot, lambda: job(screen, "sleeper").get("state") == "stopped", 60,
                                 "sleeper stopped", detail=lambda: [n.message for n in app._notifications][-3:])
            assert time.monotonic() - t0 < 30
            assert any("stop sleeper" in (n.title or "") for n in app._notifications)

            # And back to this machine: its jobs file (none here), its telemetry again.
            assert app.switch_box("local")
            await until(pilot, lambda: not screen.remote and screen.reason, 30, "local jobs again")

    asyncio.run(scenario())
    run = sorted((lab.state_dir("box") / "runs" / "sleeper").glob("2*"))
    assert run and (run[-1] / "exit.json").exists()


def test_one_fleet_one_poll_a_round_for_the_box_shown_and_in_the_hosts_view(console_env, monkeypatch):
    """The box shown and the hosts view share the app's one Fleet: with both on, the shown box's agent gets
    one `poll` a round over one SSH link (not two), at the same ≤ 2 KB a round; a switch keeps polling
    a host the hosts view shows, and before it was ever opened, lets the box left go."""
    lab = console_env
    import collections

    from gpudeck.jobs.hosts import ssh as hostssh
    from gpudeck.console.app import make_app

    polls: collections.Counter = collections.Counter()      # every `poll` sent to each host, whatever link
    real_call = hostssh.HostLink.call

    async def counting_call(self, op, params=None, timeout=None, retry=True, wake=True):
        if op == "poll":
            polls[self.spec.name] += 1
        return await real_call(self, op, params, timeout=timeout, retry=retry, wake=wake)
    monkeypatch.setattr(hostssh.HostLink, "call", counting_call)

    def links(app):
        return {name: h["summary"]["link"] for name, h in (app.hosts_feed.latest or {}).items()}

    async def scenario():
        app = make_app(demo=True, refresh=0.5, jobs_file=str(lab.work / "no-local-jobs.toml"))
        app.initial_box = "box"
        async with app.run_test(size=(160, 44)) as pilot:
            await until(pilot, lambda: app.box.name == "box" and app.snapshot is not None, 60, "on box")
            assert sorted(app.fleet.views()) == ["box"]
            # The hosts view never opened: the box left is let go of at once.
            assert app.switch_box("box2")
            assert sorted(app.fleet.views()) == ["box2"] and not app.fleet.watching("box")
            await until(pilot, lambda: app.snapshot is not None and app.sample_error is None, 60, "box2's telemetry",
                        detail=lambda: app.sample_error)
            link = app._box_link
            sessions = len(lab.box2.sessions())

            await pilot.press("4")
            # (local is never sampled here: the console opened on box; its row says CONNECTING)
            await until(pilot, lambda: links(app).get("box") == links(app).get("box2") == "LIVE", 60,
                        "box and box2 LIVE in the hosts view", detail=lambda: links(app))
            # One Fleet, one poller per host: the hosts view reads the shown box's poll.
            assert app.hosts_feed.fleet is app.fleet is link.fleet
            assert sorted(app.fleet.views()) == ["box", "box2"]
            assert len(lab.box2.sessions()) <= sessions, "the hosts view opened a second SSH link to box2"
            await asyncio.sleep(1.0)
            count0, before, t0 = polls["box2"], link.view(), time.monotonic()
            await asyncio.sleep(5.0)
            count, after, dt = polls["box2"] - count0, link.view(), time.monotonic() - t0
            rounds = dt / app.fleet.interval
            moved = (after.bytes_in + after.bytes_out) - (before.bytes_in + before.bytes_out)
            print(f"box2 shown + hosts view: {count} polls in {dt:.1f}s ({rounds:.1f} rounds), "
                  f"{moved / dt:.0f} B/s, {moved / rounds:.0f} B a round; box: {polls['box']} polls in all")
            assert 0.5 * rounds <= count <= rounds + 1.5, (count, rounds)      # two Fleets: ~2 x rounds
            assert moved / rounds <= 2048, (moved, rounds)

            # A switch keeps every host the hosts view shows polled, over the link it already has.
            connects = {name: view.connects for name, view in app.fleet.views().items()}
            assert app.switch_box("box")
            assert app._box_link.fleet is app.fleet and sorted(app.fleet.views()) == ["box", "box2"]
            await until(pilot, lambda: app.snapshot is not None and app.sample_error is None, 30, "box's telemetry")
            assert {name: view.connects for name, view in app.fleet.views().items()} == connects
            assert links(app)["box2"] == "LIVE"
            fleet = app.fleet
        assert fleet._closed and fleet._thread is None                  # closed with the app

    asyncio.run(scenario())
