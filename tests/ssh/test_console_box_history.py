"""The console on a remote box over real sshd: history, post-mortem and replay of a run of `box`, through the app.

The app's box is set to the RemoteBox of `box` (what the box switcher sets); a run that
ended there is listed by the history view, its post-mortem is the box's report with the
log fetched here, and its replay plays the record fetched by offset — all through the app.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from runsupport import oom_trainer, pilot_wait_for, toml_str, wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def console_env(lab, monkeypatch, tmp_path):
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "laptop-cache"))     # where remote records are copied
    return lab


def ran_on_box(lab, tmp_path: Path) -> tuple:
    """A trainer that crashes with CUDA OOM, started on `box` through the Box API and waited out."""
    from gpudeck.jobs.box import open_box
    script = tmp_path / "train.py"
    script.write_text(oom_trainer(steps=3, pause_s=0.2))
    jobs = lab.work / "jobs.toml"
    jobs.write_text(jobs.read_text() + f'\n[jobs.trainer]\nkind = "train"\ncmd = [{toml_str(sys.executable)}, '
                    f'{toml_str(str(script))}]\n')
    box = open_box("box")
    run_id = box.start("trainer").run_id

    def ended():
        job = next((j for j in box.jobs().jobs if j.get("name") == "trainer"), {})
        return job.get("state") == "exited" and job.get("run_id") == run_id
    wait_for(ended, timeout=60, what="the trainer's run on box to end")
    health = lab.state_dir("box") / "runs" / "trainer" / run_id / "health.json"
    wait_for(lambda: health.exists() and json.loads(health.read_text()).get("ended"), timeout=20,
             what="the run's final health on box")
    return box, run_id


def test_history_postmortem_and_replay_of_a_remote_run(console_env, tmp_path):
    lab = console_env
    box, run_id = ran_on_box(lab, tmp_path)
    from textual.widgets import DataTable

    from gpudeck.console.app import make_app
    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen
    from gpudeck.console.widgets.log_view import LogViewPane
    from gpudeck.jobs.telemetry.sampler import make_sampler

    remote_dir = lab.state_dir("box") / "runs" / "trainer" / run_id
    log = (remote_dir / "output.log").read_bytes()

    async def scenario():
        app = make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3)
        app._box = box                           # what the box switcher sets: every view shows `box`
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("3")
            history = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen,
                                           "the history view")
            await pilot_wait_for(pilot, lambda: any(r.get("run_id") == run_id for r in history.rows),
                                 "the box's run listed", 60, detail=lambda: (history.rows, history.loads))
            assert history.listed_box is box
            table = history.query_one(DataTable)
            assert "box box" in str(table.border_title)
            row = next(i for i, r in enumerate(history.rows) if r["run_id"] == run_id)
            cells = [str(c) for c in table.get_row_at(row)]
            assert cells[1] == "trainer" and "exit 1" in cells[4] and "cuda_oom" in cells[6]
            table.move_cursor(row=row)

            await pilot.press("enter")                                    # the post-mortem, the box's report
            pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen,
                                      "the post-mortem screen")
            await pilot_wait_for(pilot, lambda: pm.view is not None, "the report", 60,
                                 detail=lambda: str(pm.query_one("#pm-verdict").render()))
            assert pm.view.failed and "trainer" in pm.view.title and run_id in pm.view.title
            assert "out of memory" in pm.view.verdict.lower() or "oom" in pm.view.verdict.lower(), pm.view.verdict
            assert any("root cause" in k.label or "first error" in k.label for k in pm.view.lines)
            # The log pane shows the run's log fetched here, never the box's path opened on this machine.
            await pilot_wait_for(pilot, lambda: pm.record is not None, "the record fetched", 60)
            assert pm.record != remote_dir and (pm.record / "output.log").read_bytes() == log
            assert any("fetching the log" in n.message and not n.markup for n in app._notifications)
            pane = pm.query_one(LogViewPane)
            await pilot_wait_for(pilot, lambda: pane.line_count == log.count(b"\n"), "the log in the pane", 30,
                                 detail=lambda: pane.line_count)
            assert pane.path == pm.record / "output.log"

            await pilot.press("R")                                        # its replay, in the jobs view
            jobs = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen
                                        and app.screen.replay is not None and app.screen, "the replay", 60)
            source = app.jobs_feed.source
            assert source.paths == [pm.record]
            assert [j.name for j in jobs.jobs] == ["trainer"]
            await pilot.press("right_square_bracket", "right_square_bracket")       # to its end
            await pilot_wait_for(pilot, lambda: jobs.jobs[0].state == "exited"
                                 and any(a.code == "crashed" for a in jobs.jobs[0].alerts),
                                 "the recorded crash", 30, detail=lambda: jobs.jobs[0])

            # History's own R on the same row replays it too (fetching only what grew: nothing).
            await pilot.press("escape")
            await pilot.press("3")
            await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), "history again")
            stat = (pm.record / "output.log").stat().st_mtime_ns
            await pilot.press("R")
            await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.replay is not None,
                                 "the replay from history", 60)
            assert (pm.record / "output.log").stat().st_mtime_ns == stat
        box.close()

    asyncio.run(scenario())


def test_a_remote_box_gone_dark_keeps_its_rows_and_says_why(console_env, tmp_path):
    lab = console_env
    box, run_id = ran_on_box(lab, tmp_path)
    from gpudeck.console.app import make_app
    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.jobs.telemetry.sampler import make_sampler

    async def scenario():
        app = make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3)
        app._box = box
        from gpudeck.console.app import CONSOLE_QUERY_TIMEOUT_S
        box.query_timeout_s = CONSOLE_QUERY_TIMEOUT_S      # as switch_box makes it
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("3")
            history = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen,
                                           "the history view")
            await pilot_wait_for(pilot, lambda: any(r.get("run_id") == run_id for r in history.rows),
                                 "the box's run listed", 60)
            loads = history.loads
            lab.box.freeze()
            try:
                t0 = time.monotonic()
                history.action_toggle_failed()                # a reload, over a link gone silent
                reason = history.query_one("#history-reason")
                await pilot_wait_for(pilot, lambda: history.loads > loads and "box" in str(reason.render()),
                                     "the reason shown", 90, detail=lambda: str(reason.render()))
                assert any(r.get("run_id") == run_id for r in history.rows)     # the last rows stay
                assert app.is_running and time.monotonic() - t0 < 90
            finally:
                lab.box.thaw()
        box.close()

    asyncio.run(scenario())
