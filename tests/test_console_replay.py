"""The console's history view, post-mortem screen and replay, driven by Pilot over REAL recorded runs."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpudeck.console.widgets.log_index import LogIndex
from gpudeck.console.widgets.log_view import LogViewPane
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import oom_trainer, pilot_test, pilot_wait_for, wait_for, write_jobs

PY = sys.executable

# Output spread over ~3 s: the runner samples once a second, so a loaded machine still records points
# strictly inside the log (4 steps 0.3 s apart let both samples of a slow start fall before and after it).
CRASHER = oom_trainer(steps=4, pause_s=0.8)


@pytest.fixture
def recorded(state, tmp_path):
    """Real runs under the test's state dir: a trainer that crashes (CUDA OOM), then a job that succeeds."""
    script = tmp_path / "train.py"
    script.write_text(CRASHER)
    jobs = write_jobs(tmp_path / "jobs.toml", {
        "trainer": {"kind": "train", "cmd": [PY, str(script)]},
        "greeter": {"kind": "stage", "cmd": "echo hello; sleep 0.5; echo bye"},
    })
    sup = Supervisor(load_jobs(jobs), state_dir=state)
    sup.start("trainer")
    assert sup.wait("trainer", timeout=60) is not None
    sup.start("greeter")
    assert sup.wait("greeter", timeout=60) is not None
    for name in ("trainer", "greeter"):
        health = sup.latest(name).path / "health.json"
        wait_for(lambda: health.exists() and json.loads(health.read_text()).get("ended"), timeout=20,
                 what=f"{name}'s final health")
    return {"state": state, "jobs": jobs, "trainer": sup.latest("trainer").path, "greeter": sup.latest("greeter").path}


def make_console(jobs_file=None, **kwargs):
    from gpudeck.console.app import make_app
    from gpudeck.jobs.telemetry.sampler import make_sampler
    return make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3,
                    jobs_file=None if jobs_file is None else str(jobs_file), **kwargs)


def table_rows(table) -> list[list[str]]:
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


# -- the log pane shows a file only up to a byte limit (a replay's position) --------------------------

def test_log_index_limit_shows_the_file_as_it_stood_and_can_go_back(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"one\ntwo\nthree\nfour\n")
    index = LogIndex(path)
    index.limit = 8
    while index.update():
        pass
    assert index.line_count == 2 and index.read_line(1) == (b"two", 0)
    generation = index.state().generation
    index.limit = 14
    while index.update():
        pass
    assert index.line_count == 3 and index.state().generation == generation      # forward: grows in place
    index.limit = 5
    while index.update():
        pass
    st = index.state()
    assert st.size == 5 and st.line_count == 2 and st.generation > generation   # back: re-indexed
    assert index.read_line(1) == (b"t", 0)
    index.limit = None
    while index.update():
        pass
    assert index.line_count == 4


# -- the history view ---------------------------------------------------------------------------------

@pilot_test
async def test_history_lists_runs_newest_first_failed_in_red_and_filters(recorded) -> None:
    from textual.widgets import DataTable

    from gpudeck.console.screens.history import HistoryScreen
    app = make_console(recorded["jobs"])
    async with app.run_test(size=(140, 36)) as pilot:
        await pilot.press("3")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen,
                                      "history view")
        await pilot_wait_for(pilot, lambda: screen.loads >= 1 and len(screen.rows) == 2, "two runs listed",
                             detail=lambda: screen.rows)
        table = screen.query_one(DataTable)
        rows = table_rows(table)
        assert [r[1] for r in rows] == ["greeter", "trainer"]          # newest first
        assert "exit 1" in rows[1][4] and "cuda_oom" in rows[1][6]
        error = app.get_css_variables()["error"]
        trainer_cell = table.get_row_at(1)[1]
        assert error.lower() in str(trainer_cell.style).lower()       # failed in red
        assert error.lower() not in str(table.get_row_at(0)[1].style).lower()

        await pilot.press("f")                                         # failed only
        await pilot_wait_for(pilot, lambda: [r["job"] for r in screen.rows] == ["trainer"], "failed only")
        assert "failed" in str(table.border_title)
        await pilot.press("f")
        await pilot_wait_for(pilot, lambda: len(screen.rows) == 2, "all runs again")
        await pilot.press("j")                                         # the selected run's job
        await pilot_wait_for(pilot, lambda: [r["job"] for r in screen.rows] == ["greeter"], "greeter only")
        await pilot.press("escape")
        await pilot_wait_for(pilot, lambda: len(screen.rows) == 2, "filters cleared")


@pilot_test
async def test_enter_opens_the_post_mortem_and_a_line_that_matters_jumps_the_log(recorded) -> None:
    from textual.widgets import OptionList, Static

    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen
    app = make_console(recorded["jobs"])
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("3")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen,
                                      "history view")
        await pilot_wait_for(pilot, lambda: len(screen.rows) == 2, "runs listed")
        await pilot.press("down", "enter")                            # the trainer's run
        pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen,
                                  "post-mortem")
        await pilot_wait_for(pilot, lambda: pm.view is not None, "report built")
        verdict = str(pm.query_one("#pm-verdict", Static).render())
        assert verdict.startswith("crashed") and "CUDA out of memory (line 8)" in verdict, verdict
        assert pm.query_one("#pm-verdict").has_class("-failed")
        body = str(pm.query_one("#pm-body", Static).render())
        assert "crashed" in body                                        # the alert, in the timeline
        [cause] = [k for k in pm.view.lines if k.label == "root cause"]
        assert cause.line == 8 and "OutOfMemoryError" in cause.text, pm.view.lines
        assert [k.line for k in pm.view.lines] == sorted(k.line for k in pm.view.lines)
        assert "training" in body and any("RSS" in c.label for c in pm.view.charts), body
        options = pm.query_one("#pm-lines", OptionList)
        assert options.has_focus and pm.view.lines[options.highlighted] == cause     # the cursor starts on it
        await pilot.press("enter")
        pane = pm.query_one(LogViewPane)
        await pilot_wait_for(pilot, lambda: pane.current_match == 7, "log pane on line 8",
                             detail=lambda: pane.current_match)
        assert "OutOfMemoryError" in pane.line_text(7)[0]
        await pilot.press("R")                                          # replay this run from its post-mortem
        await pilot_wait_for(pilot, lambda: getattr(app.screen, "replay", None) is not None, "replaying")
        assert [j.name for j in app.screen.jobs] == ["trainer"]
        source = replay_source(app)
        await pilot.press("space", "a")                                  # paused; the next alert: the crash
        crash = next(m for m in source.session.marks if m.kind == "alert")
        await pilot_wait_for(pilot, lambda: app.screen.replay.t == crash.t and app.screen.jobs[0].alerts,
                             "at the crash alert")
        await pilot.press("3")
        await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), "back to history")


@pilot_test
async def test_a_deleted_run_dir_is_a_line_not_a_crash(recorded) -> None:
    import shutil

    from gpudeck.console.screens.postmortem import PostmortemScreen
    app = make_console(recorded["jobs"])
    async with app.run_test(size=(120, 30)) as pilot:
        gone = recorded["trainer"]
        shutil.rmtree(gone)
        await pilot.pause()
        app.push_screen(PostmortemScreen(gone))
        pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen, "pm")
        await pilot_wait_for(pilot, lambda: pm.query("#pm-verdict") and "no post-mortem" in
                             str(pm.query_one("#pm-verdict").render()), "a one-line reason")
        assert "gone" in str(pm.query_one("#pm-verdict").render())


# -- replay in the jobs view ----------------------------------------------------------------------------

MARKUP_CRASHER = r"""
import sys, time
for i in range(1, 5):
    print(f"epoch 1/1 step {i}/4 [bold]loss[/bold]={2.5 - i * 0.1:.2f}", flush=True)
    time.sleep(0.5)
sys.stderr.write("RuntimeError: CUDA out of memory [red]not markup[/] [link=x]\n")
sys.exit(1)
"""


def replay_source(app):
    source = app.jobs_feed.source
    return source if hasattr(source, "session") else None


@pilot_test
async def test_R_replays_the_selected_jobs_latest_run_through_the_jobs_view_and_esc_goes_live(recorded, tmp_path) -> None:
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.widgets.replay_bar import ReplayBar
    app = make_console(recorded["jobs"])
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await pilot_wait_for(pilot, lambda: [j.name for j in screen.jobs] == ["trainer", "greeter"], "live jobs")
        assert screen.replay is None and not screen.query_one(ReplayBar).display
        await pilot.press("R")                                    # the trainer's latest run
        await pilot_wait_for(pilot, lambda: screen.replay is not None, "replay frames")
        source = replay_source(app)
        assert source.paths == [recorded["trainer"]]
        assert [j.name for j in screen.jobs] == ["trainer"]
        bar = screen.query_one(ReplayBar)
        assert bar.display and "REPLAY" in str(bar.render()) and "SIMULATED" not in str(bar.render())
        # read-only: the keys that act on live jobs are gone, the player's are there
        assert screen.check_action("start_job", ()) is False and screen.check_action("replay_pause", ()) is True

        # from the start, at 1x: the state moves through running to exited with the crash, in recorded order
        await pilot.press("space", "left_square_bracket")
        await pilot_wait_for(pilot, lambda: screen.replay.paused and screen.replay.t == source.session.start,
                             "paused at the start")
        assert screen.jobs[0].alerts == ()
        await pilot.press("plus")
        await pilot_wait_for(pilot, lambda: screen.replay.speed == 2.0, "2x")
        await pilot.press("minus")
        await pilot_wait_for(pilot, lambda: screen.replay.speed == 1.0, "1x")
        states = []
        await pilot.press("space")

        def ended() -> bool:
            job = screen.jobs[0]
            if not states or states[-1] != job.state:
                states.append(job.state)
            return job.state == "exited" and any(a.code == "crashed" for a in job.alerts)
        await pilot_wait_for(pilot, ended, "the replay reaches the crash", timeout=30,
                             detail=lambda: (screen.jobs[0].state, source.session.position - source.session.start))
        assert "running" in states and states[-1] == "exited", states
        assert "CUDA out of memory" in str(screen.query_one("#jobs-banner").render())

        # pause holds the position; seek back a minute goes to the start; n jumps to the next event
        await pilot.press("space")
        await pilot_wait_for(pilot, lambda: screen.replay.paused, "paused")
        held = source.session.position
        await pilot.pause(1.0)
        assert source.session.position == held
        await pilot.press("left_square_bracket")
        await pilot_wait_for(pilot, lambda: screen.replay.t == source.session.start, "back at the start")
        assert screen.jobs[0].alerts == ()
        await pilot.press("n")
        first = source.session.marks[0]
        await pilot_wait_for(pilot, lambda: screen.replay.t == first.t, "at the first event")
        await pilot.press("right_square_bracket")
        await pilot_wait_for(pilot, lambda: screen.jobs[0].state == "exited", "+1 min: the end")

        # Esc leaves the replay: the live jobs of the jobs file again
        await pilot.press("escape")
        await pilot_wait_for(pilot, lambda: screen.replay is None and len(screen.jobs) == 2, "live again")
        assert replay_source(app) is None and not bar.display


@pilot_test
async def test_the_log_pane_shows_only_what_had_arrived_at_the_position(recorded) -> None:
    from gpudeck.console.screens.jobs import JobsScreen
    app = make_console(recorded["jobs"])
    log = (recorded["trainer"] / "output.log").read_bytes()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await pilot_wait_for(pilot, lambda: len(screen.jobs) == 2, "live jobs")
        app.replay_runs([recorded["trainer"]])
        await pilot_wait_for(pilot, lambda: screen.replay is not None, "replaying")
        await pilot.press("space")                                # paused at the start: nothing arrived yet
        await pilot.press("enter")                                # open the replayed log
        pane = screen.query_one(LogViewPane)
        source = replay_source(app)

        def shown_matches_position() -> bool:
            limit = source.session.runs[0].recording.offset_at(source.session.position)
            expected = log[:limit].count(b"\n") + (0 if not limit or log[:limit].endswith(b"\n") else 1)
            return screen.replay is not None and pane.line_count == expected and pane.index.limit == limit
        await pilot_wait_for(pilot, shown_matches_position, "log up to the position")
        await pilot.press("right_square_bracket")                  # the end: the whole log
        await pilot_wait_for(pilot, lambda: pane.line_count == log.count(b"\n"), "whole log at the end",
                             detail=lambda: pane.line_count)
        assert "REPLAY" in pane.status_text() or "REPLAY" in str(screen.query_one("#log-status").render())
        middle = next(t for t in source.session.runs[0].recording.point_times if
                      0 < source.session.runs[0].recording.offset_at(t) < len(log))
        source.session.seek_to(middle)
        source.poll_now()
        await pilot_wait_for(pilot, shown_matches_position, "log shrinks back to the position")
        assert 0 < pane.line_count < log.count(b"\n")


@pilot_test
async def test_history_R_replays_a_run_and_job_text_is_never_markup(state, tmp_path) -> None:
    from textual.widgets import DataTable

    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.jobs import JobsScreen
    script = tmp_path / "crash.py"
    script.write_text(MARKUP_CRASHER)
    jobs = write_jobs(tmp_path / "jobs.toml", {"marked": {"kind": "train", "cmd": [PY, str(script)]}})
    sup = Supervisor(load_jobs(jobs), state_dir=state)
    sup.start("marked")
    assert sup.wait("marked", timeout=60) is not None
    health = sup.latest("marked").path / "health.json"
    wait_for(lambda: health.exists() and json.loads(health.read_text()).get("ended"), timeout=20, what="health")
    app = make_console(jobs)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("3")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen, "history")
        await pilot_wait_for(pilot, lambda: len(screen.rows) == 1, "the run listed")
        assert "[red]not markup[/]" in str(screen.query_one(DataTable).get_row_at(0)[6])
        await pilot.press("R")
        jobs_screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen,
                                           "jobs view replaying")
        await pilot_wait_for(pilot, lambda: jobs_screen.replay is not None, "replay frames")
        replay_source(app).seek(3600)
        await pilot_wait_for(pilot, lambda: jobs_screen.jobs and jobs_screen.jobs[0].state == "exited"
                             and jobs_screen.jobs[0].alerts, "the crash replayed")
        banner = str(jobs_screen.query_one("#jobs-banner").render())
        assert "[red]not markup[/]" in banner and "[link=x]" in banner
        await pilot.press("enter")
        pane = jobs_screen.query_one(LogViewPane)
        await pilot_wait_for(pilot, lambda: any("[bold]loss[/bold]" in pane.line_text(i)[0]
                                                for i in range(pane.line_count)), "log text as written")


@pilot_test
async def test_demo_shows_loading_eta_oom_risk_a_crash_and_a_stall_within_seconds() -> None:
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.widgets.replay_bar import ReplayBar
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(140, 40)) as pilot:
        opened = time.monotonic()
        await pilot.press("2")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        seen: set[str] = set()

        def everything_seen() -> bool:
            for job in screen.jobs:
                seen.update(f"{job.name}:{a.code}" for a in job.alerts)
                if job.phase == "loading" and job.progress is not None and job.progress.eta_s:
                    seen.add(f"{job.name}:loading-eta")
            return {"vllm-k2:loading-eta", "sgl-kernel-build:oom_risk", "vllm-eagle3:crashed",
                    "sglang-k2:stalled"} <= seen
        await pilot_wait_for(pilot, everything_seen, "the four stories", timeout=40, detail=lambda: seen)
        took = time.monotonic() - opened
        assert took <= 15, f"a newcomer waited {took:.1f}s"
        bar = str(screen.query_one(ReplayBar).render())
        assert "SIMULATED REPLAY" in bar
        assert all(j.payload.get("simulated") for j in screen.jobs)
        print(f"demo: all four stories on screen {took:.1f}s after pressing 2")


# -- the demo: recorded runs only, never a real action ----------------------------------------------

DEMO_JOBS = {"sgl-kernel-build", "sglang-k2", "vllm-eagle3", "vllm-k2"}


async def demo_jobs_view(app, pilot, rows: int = 4):
    """Press 2 in --demo; the jobs view once it shows the demo's replayed frames."""
    from gpudeck.console.screens.jobs import JobsScreen
    await pilot.press("2")
    screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
    await pilot_wait_for(pilot, lambda: screen.replay is not None and len(screen.jobs) == rows,
                         "the demo's frames", detail=lambda: [j.name for j in screen.jobs])
    return screen


def header_text(screen) -> str:
    from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
    return screen.query_one(BoxHeaderPanel).render_line(0).text


@pilot_test
async def test_demo_never_reaches_the_supervisor_whatever_is_pressed(state, tmp_path, monkeypatch) -> None:
    """Issue harden #20: Esc out of the demo's replay opened the jobs.toml's REAL jobs under the SIMULATED
    header, where s started one for real. In --demo every acting key refuses and nothing is started."""
    from gpudeck.console.replay import ReplayJobsSource
    from gpudeck.console.widgets.replay_bar import ReplayBar
    marker = tmp_path / "really-started"
    jobs = write_jobs(tmp_path / "jobs.toml", {"real": {"kind": "stage", "cmd": f"touch {marker}"}})
    calls: list[tuple] = []

    def refuse(verb):
        def call(self, *args, **kwargs):
            calls.append((verb, args))
            raise RuntimeError(f"the demo called Supervisor.{verb}")
        return call
    for verb in ("start", "stop", "restart"):
        monkeypatch.setattr(Supervisor, verb, refuse(verb))

    app = make_console(jobs, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_sample_now()
        await pilot_wait_for(pilot, lambda: app.ticks >= 1, "a SIMULATED sample")
        screen = await demo_jobs_view(app, pilot)
        offered = {b.binding.action for b in screen.active_bindings.values()}
        assert not offered & {"start_job", "stop_job", "restart_job", "pivot"}, offered
        await pilot.press("R")                         # one recorded run, replayed on its own
        await pilot_wait_for(pilot, lambda: screen.replay is not None and len(screen.jobs) == 1, "R's replay")
        for key in ("escape", "s", "x", "r", "p", "escape", "escape", "s", "x", "r", "p", "enter", "escape",
                    "s", "x", "r", "p"):
            await pilot.press(key)
            await pilot.pause(0.1)
        await pilot.pause(1.0)                         # a worker that would act has had its time
        # Every way in refuses too: the actions called directly, and the workers behind them.
        for action in (screen.action_start_job, screen.action_stop_job, screen.action_restart_job,
                       screen.action_pivot):
            action()
        screen._start("real")
        screen._stop("real", True)
        await pilot.pause(0.5)

        assert calls == []
        assert not marker.exists() and not (state / "runs").exists()
        assert screen.supervisor is None
        assert isinstance(app.jobs_feed.source, ReplayJobsSource) and app.jobs_feed.source.demo
        assert {job.name for job in screen.jobs} == DEMO_JOBS
        assert all(job.payload.get("simulated") for job in screen.jobs)
        assert "SIMULATED" in header_text(screen)
        assert "SIMULATED REPLAY" in str(screen.query_one(ReplayBar).render())
        assert any("actions off: demo" in n.message for n in app._notifications)


@pilot_test
async def test_demo_without_its_recordings_shows_no_jobs_rather_than_live_ones(state, tmp_path, monkeypatch) -> None:
    import gpudeck.jobs.replay as replay
    from gpudeck.console.screens.jobs import JobsScreen
    jobs = write_jobs(tmp_path / "jobs.toml", {"real": {"kind": "stage", "cmd": "true"}})
    monkeypatch.setattr(replay, "demo_runs_dir", lambda: tmp_path / "nowhere")
    app = make_console(jobs, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await pilot_wait_for(pilot, lambda: screen.refreshes >= 1, "a snapshot")
        assert screen.jobs == [] and "demo recordings unavailable" in (screen.reason or "")
        assert screen.supervisor is None and app.jobs_feed.supervisor is None


@pilot_test
async def test_demo_hosts_view_reaches_no_real_host(state, tmp_path, monkeypatch) -> None:
    """The hosts view of a demo neither polls hosts.toml's hosts nor offers to start or stop on them."""
    from gpudeck.console.screens.hosts import HostsScreen
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu2]\nssh = "nobody@127.0.0.1"\nconnect_timeout_s = 0.5\n')
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HostsScreen) and app.screen, "hosts")
        await pilot.pause(0.3)
        assert app.hosts_feed.fleet is None and app.hosts_feed.specs == []
        offered = {b.binding.action for b in screen.active_bindings.values()}
        assert not offered & {"start_job", "stop_job"}, offered
        await pilot.press("s", "x")
        await pilot.pause(0.1)
        assert any("actions off: demo" in n.message for n in app._notifications)


@pilot_test
async def test_demo_R_on_another_job_switches_the_open_log_to_its_run(state) -> None:
    """Issue harden #21: R on another job kept showing the previous job's log."""
    from textual.widgets import DataTable
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await demo_jobs_view(app, pilot)
        first = screen.selected_job.name
        await pilot.press("enter")
        pane = screen.query_one(LogViewPane)
        await pilot_wait_for(pilot, lambda: pane.path is not None and pane.path.parent.parent.name == first,
                             "the first job's log")
        screen.query_one(DataTable).focus()            # back to the table, the log still open
        await pilot.press("down")
        other = screen.selected_job.name
        assert other != first
        await pilot.press("R")
        await pilot_wait_for(pilot, lambda: [j.name for j in screen.jobs] == [other], "the other job replayed")
        await pilot_wait_for(pilot, lambda: pane.path is not None and pane.path.parent.parent.name == other,
                             "the replayed job's log", detail=lambda: pane.path)
        assert screen.has_class("-log-open")
        assert Path(screen.log_paths[other]) == pane.path


@pilot_test
async def test_demo_escape_closes_the_log_pane_at_once_as_its_hint_says(state) -> None:
    """Issue harden #21: the first Esc in the log pane only moved the focus; the hint says Esc closes it."""
    from textual.widgets import DataTable, Input
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await demo_jobs_view(app, pilot)
        hint = str(screen.query_one("#jobs-log-hint").render())
        assert "Esc closes it" in hint
        await pilot.press("enter")
        pane = screen.query_one(LogViewPane)
        await pilot_wait_for(pilot, lambda: screen.has_class("-log-open") and pane.has_focus, "log open, focused")
        await pilot.press("slash")                     # the search box's Esc only cancels the search
        box = screen.query_one("#log-search", Input)
        await pilot_wait_for(pilot, lambda: box.has_focus, "the search box")
        await pilot.press("escape")
        await pilot_wait_for(pilot, lambda: pane.has_focus, "search cancelled")
        assert screen.has_class("-log-open")
        await pilot.press("escape")                    # one Esc: closed
        await pilot.pause(0.1)
        assert not screen.has_class("-log-open")
        assert screen.query_one(DataTable).has_focus
        assert screen.replay is not None               # ...and the replay is still on


@pilot_test
async def test_demo_history_lists_the_recorded_runs_and_opens_their_post_mortem(state) -> None:
    """Issue harden #21: in --demo the history view said "runs (0)": it lists the demo's recorded runs."""
    from textual.widgets import DataTable

    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen
    from gpudeck.jobs.replay import demo_run_dirs, demo_runs_dir
    before = sorted(p.relative_to(demo_runs_dir()) for p in demo_runs_dir().rglob("*"))
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen, "history")
        await pilot_wait_for(pilot, lambda: screen.loads >= 1 and len(screen.rows) == 4, "the demo's runs",
                             detail=lambda: screen.rows)
        assert {r["job"] for r in screen.rows} == DEMO_JOBS
        assert {Path(r["path"]) for r in screen.rows} == set(demo_run_dirs())
        title = str(screen.query_one(DataTable).border_title)
        assert "runs (4)" in title and "SIMULATED" in title
        crashed = next(i for i, r in enumerate(screen.rows) if r["job"] == "vllm-eagle3")
        screen.query_one(DataTable).move_cursor(row=crashed)
        await pilot.press("enter")
        pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen,
                                  "the post-mortem")
        await pilot_wait_for(pilot, lambda: pm.view is not None, "the post-mortem built")
        assert pm.run_dir.parent.name == "vllm-eagle3" and "SyntaxError" in pm.view.verdict
        await pilot.press("escape")
        await pilot_wait_for(pilot, lambda: app.screen is screen, "back to the history")
        await pilot.press("f")                         # the filters work on the recorded runs too
        await pilot_wait_for(pilot, lambda: screen.rows and all(r["failed"] for r in screen.rows), "failed only")
        await pilot.press("R")                         # and a replay of one stays a demo replay
        jobs = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await pilot_wait_for(pilot, lambda: jobs.replay is not None and len(jobs.jobs) == 1, "the run replayed")
        assert jobs.supervisor is None
    assert sorted(p.relative_to(demo_runs_dir()) for p in demo_runs_dir().rglob("*")) == before


@pilot_test
async def test_demo_D_shows_the_deadlocks_recorded_dump_once_the_replay_has_passed_it(state, monkeypatch, utc) -> None:
    """In --demo, D on the deadlocked SGLang shows the dump its stall recorded (SIMULATED), never a live py-spy;
    the banner carries the verdict from the moment the dump was taken."""
    from textual.widgets import DataTable, Static
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.console.screens.stacks import StacksScreen
    from gpudeck.jobs import stacks

    def never(*args, **kwargs):
        raise AssertionError("the demo traced a process")
    monkeypatch.setattr(stacks, "dump", never)
    monkeypatch.setattr(Supervisor, "stacks", never)
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await demo_jobs_view(app, pilot)
        source = app.jobs_feed.source
        [run] = [r for r in source.session.runs if r.recording.job == "sglang-k2"]
        [raised] = [e for e in run.recording.events if e.get("event") == "AlertRaised"]
        [dumped] = [e for e in run.recording.events if e.get("event") == "StacksDumped"]
        verdict = dumped["verdict"]
        assert "D" in {b.binding.key for b in screen.active_bindings.values()}
        await pilot.press("space")                                # paused: the position moves only by hand
        await pilot_wait_for(pilot, lambda: source.session.paused, "paused")
        row = [j.name for j in screen.jobs].index("sglang-k2")
        screen.query_one(DataTable).move_cursor(row=row)
        banner = screen.query_one("#jobs-banner", Static)

        # At the stall, before its dump: no verdict on the banner, and D says there is no dump yet.
        source.session.seek_to(raised["t"] + 0.1)
        source.poll_now()
        await pilot_wait_for(pilot, lambda: screen.replay is not None and abs(screen.replay.t - raised["t"] - 0.1) < 1e-6,
                             "the frame at the stall")
        await pilot_wait_for(pilot, lambda: "stalled" in str(banner.render()) or "no sign of life" in str(banner.render()),
                             "the stall on the banner", detail=lambda: str(banner.render()))
        assert "stacks:" not in str(banner.render())
        await pilot.press("D")
        await pilot_wait_for(pilot, lambda: any("no stack dump recorded by this point" in n.message
                                                for n in app._notifications), "D's refusal before the dump")
        assert isinstance(app.screen, JobsScreen)

        # Past it: the verdict joins the banner, and D shows the recorded dump.
        source.session.seek_to(dumped["t"] + 1.0)
        source.poll_now()
        await pilot_wait_for(pilot, lambda: f"— stacks: {verdict[:40]}" in str(banner.render()),
                             "the verdict on the banner", detail=lambda: str(banner.render()))
        await pilot.press("D")
        modal = await pilot_wait_for(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen, "the dump")
        await pilot_wait_for(pilot, lambda: modal.done, "the recorded dump read")
        assert modal.verdict == verdict
        assert "recorded at 2027-01-15 08:01:04 UTC (SIMULATED)" in modal.text
        assert stacks.SIMULATED_LINE in modal.text
        assert "4 of 6 processes [MainThread] — in a collective (torch.distributed.all_reduce)" in modal.text
        assert "recorded dump of the replayed run" in str(modal.query_one("#stacks-title", Static).render())
        await pilot.press("escape")
        await pilot_wait_for(pilot, lambda: app.screen is screen, "back to the jobs view")


@pilot_test
async def test_demo_post_mortem_of_the_deadlock_shows_its_stack_dump_and_verdict(state) -> None:
    """History (3) → enter on the deadlocked SGLang run: the post-mortem lists the recorded dump, its verdict
    and its groups, and the stall it was taken for carries its verdict and its time; `gpudeck postmortem` on
    that run says the same in every format."""
    import subprocess
    from textual.widgets import DataTable, Static
    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen
    from gpudeck.jobs.replay import demo_run_dirs
    [run_dir] = [d for d in demo_run_dirs() if d.parent.name == "sglang-k2"]
    [dumped] = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
                if json.loads(line)["event"] == "StacksDumped"]
    verdict = dumped["verdict"]
    started = next(json.loads(line)["t"] for line in (run_dir / "events.jsonl").read_text().splitlines()
                   if json.loads(line)["event"] == "JobStarted")
    at = f"{int(round(dumped['t'] - started)) // 60}:{int(round(dumped['t'] - started)) % 60:02d}"   # 0:57
    stall_note = f"stacks at {at}: {verdict}"
    app = make_console(None, demo_replay=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("3")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen, "history")
        await pilot_wait_for(pilot, lambda: screen.loads >= 1 and len(screen.rows) == 4, "the demo's runs")
        screen.query_one(DataTable).move_cursor(row=next(i for i, r in enumerate(screen.rows) if r["job"] == "sglang-k2"))
        await pilot.press("enter")
        pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen, "post-mortem")
        await pilot_wait_for(pilot, lambda: pm.view is not None, "the post-mortem built")
        assert pm.view.stacks[0].endswith(f"stacks on stalled: {verdict}")
        assert "          SIMULATED: a recorded demo dump (docs/make_demo_runs.py); no process was traced" in pm.view.stacks
        body = str(pm.query_one("#pm-body", Static).render())
        assert "stack dumps" in body and "4 of 6 processes [MainThread] — in a collective" in body
        # The stall's own line on the timeline, then its dump's verdict and time just below it.
        stall = next(i for i, line in enumerate(pm.view.timeline) if "stalled for" in line)
        assert pm.view.timeline[stall + 1] == f"          {stall_note}"
        assert f"stalled for ? (never cleared)\n          {stall_note}\n" in body
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
    env["GPUDECK_STATE_DIR"] = str(state)

    def postmortem(fmt: str) -> str:
        out = subprocess.run([PY, "-m", "gpudeck.console.cli", "postmortem", str(run_dir), "--format", fmt],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout
    report = json.loads(postmortem("json"))
    [entry] = report["stacks"]
    assert entry["verdict"] == verdict and entry["simulated"] is True and entry["path"] == dumped["path"]
    from gpudeck.jobs.hosts.replies import check_reply
    assert check_reply("postmortem", {"report": report})     # as a remote box would send it: it fits the shape
    assert [(s.get("stacks"), s.get("stacks_at_s")) for s in report["stalls"]] == [(verdict, entry["at_s"])]
    assert "4 of 6 processes [MainThread] — in a collective (torch.distributed.all_reduce)" in entry["lines"]
    md = postmortem("md")
    assert "## Stack dumps" in md and f"on **stalled**: {verdict[:60]}" in md
    [window] = [line for line in md.splitlines() if line.startswith("- stall window")]
    assert window == f"- stall window (stalled): from 0:26 for ? (until the end); {stall_note}"
    assert "  4 of 6 processes [MainThread] — in a collective (torch.distributed.all_reduce)" in md
    page = postmortem("html")
    assert '<pre class="stack-dump">' in page and "SIMULATED: a recorded demo dump" in page
    assert f"<li>stall window (stalled): from 0:26 for ? (until the end); {stall_note}</li>" in page


HOSTILE_VERDICT = ("[bold red]evil[/] [link=https://evil.example]x[/link] <script>alert(1)</script> "
                   "| a | `tick` [y](javascript:alert(1)) \x1b]52;c;U0VDUkVU\x07")


@pilot_test
async def test_a_hostile_dump_verdict_on_a_stall_stays_text_in_the_console_md_and_html(state, tmp_path) -> None:
    """A verdict is made of the job's frame names: on the stall's line it is shown as written, never as
    markup, Markdown or HTML, and with no escape sequence."""
    import shutil
    from textual.widgets import Static
    from gpudeck.console.screens.postmortem import PostmortemScreen
    from gpudeck.jobs.history import render_html, render_md
    from gpudeck.jobs.history.postmortem import build_run
    from gpudeck.jobs.replay import demo_run_dirs
    [demo] = [d for d in demo_run_dirs() if d.parent.name == "sglang-k2"]
    run_dir = tmp_path / "runs" / "sglang-k2" / demo.name
    shutil.copytree(demo, run_dir)
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for e in lines:
        if e["event"] == "StacksDumped":
            e["verdict"] = HOSTILE_VERDICT
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    report = build_run(run_dir)
    [stall] = report["stalls"]
    assert stall["stacks"] == HOSTILE_VERDICT
    md = render_md.render(report)
    [window] = [line for line in md.splitlines() if line.startswith("- stall window")]
    assert (r"; stacks at 0:57: \[bold red\]evil\[/\] \[link=https://evil.example\]x\[/link\] "
            r"\<script\>alert(1)\</script\> \| a \| \`tick\` \[y\](javascript:alert(1))") in window
    from markdown_it import MarkdownIt
    rendered = MarkdownIt("commonmark", {"html": True}).render(window)     # as GitHub would, raw HTML allowed
    assert "<script" not in rendered and "<a " not in rendered and "<code>" not in rendered
    page = render_html.render(report)
    [item] = [li for li in page.split("<li>") if li.startswith("stall window")]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in item and "<script>" not in page
    assert "\x1b" not in md + page and "U0VDUkVU" not in md + page
    app = make_console(None)
    async with app.run_test(size=(160, 50)) as pilot:
        app.push_screen(PostmortemScreen(run_dir))
        pm = await pilot_wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen, "pm")
        await pilot_wait_for(pilot, lambda: pm.view is not None, "the post-mortem built")
        body = str(pm.query_one("#pm-body", Static).render())
        shown = "stacks at 0:57: [bold red]evil[/] [link=https://evil.example]x[/link] <script>alert(1)</script>"
        assert shown in body                                 # as written: not parsed as markup
        assert "\x1b" not in body and "U0VDUkVU" not in body
