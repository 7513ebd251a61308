"""The box switcher without SSH: switch_box both ways, the `b` picker, the `:` prompt, the palette entries,
and a remote box's views fed from a fake link (LIVE, then DOWN: last data kept, said in every view)."""
from __future__ import annotations

import time
from pathlib import Path

from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.fleet import HostView
from gpudeck.jobs.telemetry.sampler import make_sampler
from gpudeck.jobs.telemetry.status import status_payload

from gpudeck.console.app import make_app
from gpudeck.console.screens.box_picker import BoxPickerScreen, PromptScreen
from gpudeck.console.screens.jobs import JobsScreen
from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for

JOBS_TOML = '''
[jobs.hello]
cmd = "echo hello"
'''


def console(tmp_path: Path, specs: list[HostSpec]):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOBS_TOML)
    app = make_app(sampler=make_sampler(demo=True), refresh=0.2, jobs_file=str(jobs))
    app.host_specs = specs
    return app


def header(screen) -> str:
    return screen.query_one(BoxHeaderPanel).render_line(0).text


LOCALS = [HostSpec("local"), HostSpec("lab2")]          # ssh None: both are this machine (LocalBox)


@pilot_test
async def test_switch_box_swaps_the_box_the_feeds_and_the_history_and_back(tmp_path: Path, state) -> None:
    app = console(tmp_path, LOCALS)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        assert app.box.name == "local" and app.box_feed.latest is app.box
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: [j.name for j in screen.jobs] == ["hello"], "the local jobs")
        first_source, first_history = app.jobs_feed.source, app.history

        assert app.switch_box("lab2")
        assert app.box.name == "lab2" and app.box.local and app.box_feed.latest is app.box
        assert app.jobs_feed.source is not first_source and app.jobs_feed.source.box is app.box
        assert app.history is not first_history and len(app.history) == 0
        await wait_for(pilot, lambda: app.snapshot is not None and len(app.history) >= 1, "lab2's first sample")
        assert screen.box is app.box

        assert not app.switch_box("nowhere")                    # no such box: a notice, nothing changes
        assert app.box.name == "lab2"
        await wait_for(pilot, lambda: any("no box named 'nowhere'" in n.message for n in app._notifications),
                       "the notice")

        assert app.switch_box("local")
        assert app.box.name == "local" and app.jobs_feed.source.box is app.box
        await wait_for(pilot, lambda: [j.name for j in screen.jobs] == ["hello"], "local jobs again")


@pilot_test
async def test_b_picks_a_box_and_the_prompt_takes_box_name(tmp_path: Path, state) -> None:
    app = console(tmp_path, LOCALS)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("b")
        picker = await wait_for(pilot, lambda: isinstance(app.screen, BoxPickerScreen) and app.screen, "picker")
        assert picker.names == ["local", "lab2"] and picker.current == "local"
        assert [state for _, _, state in picker.rows] == ["LIVE", "LIVE"]
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.box.name == "lab2", "lab2 picked")
        assert not isinstance(app.screen, BoxPickerScreen)

        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BoxPickerScreen), "picker again")
        await pilot.press("escape")                             # leaves: nothing switched
        await wait_for(pilot, lambda: not isinstance(app.screen, BoxPickerScreen), "picker closed")
        assert app.box.name == "lab2"

        await pilot.press("colon")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), "the : prompt")
        await pilot.press(*"box local", "enter")
        await wait_for(pilot, lambda: app.box.name == "local", "`box local` ran")

        await pilot.press("colon")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), "the : prompt again")
        await pilot.press(*"jobs", "enter")
        await wait_for(pilot, lambda: app.current_mode == "jobs", "`jobs` shows the jobs view")

        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert "Box: local" in titles and "Box: lab2" in titles


# -- a remote box through a fake link (no SSH): what the views show of LIVE and DOWN ----------------

NOW = time.time()
REMOTE_JOBS = {"jobs": [
    {"name": "sleeper", "kind": "stage", "state": "running", "pid": 4242, "pgid": 4242, "run_id": "r1",
     "exit_code": None, "started_at": NOW - 60, "ended_at": None, "port": None, "port_open": None, "gpus": [],
     "phase": "running", "progress": None, "alerts": []}], "pipelines": []}


class FakeLink:
    """Stands in for BoxLink: `view()` is whatever the test set."""

    def __init__(self, spec: HostSpec, interval: float, fleet=None) -> None:
        self.spec, self.name = spec, spec.name
        self.state, self.error = "LIVE", None
        self.status = status_payload(make_sampler(demo=True).sample())
        self.closed = False

    def start(self) -> "FakeLink":
        return self

    def view(self) -> HostView:
        return HostView(name=self.name, ssh=self.spec.ssh, state=self.state, data_age_s=0.0 if self.state == "LIVE"
                        else 42.0, error=self.error, status=self.status, jobs=REMOTE_JOBS)

    def close(self) -> None:
        self.closed = True


@pilot_test
async def test_a_remote_box_shows_its_jobs_and_says_down_in_every_view(tmp_path: Path, state, monkeypatch) -> None:
    import gpudeck.console.boxes as boxes
    links: list[FakeLink] = []

    def fake_link(spec, interval, fleet=None):
        links.append(FakeLink(spec, interval))
        return links[-1]
    monkeypatch.setattr(boxes, "BoxLink", fake_link)
    app = console(tmp_path, [HostSpec("local"), HostSpec("gpu7", ssh="gpu7.example")])
    async with app.run_test(size=(170, 36)) as pilot:
        local = await wait_for(pilot, lambda: app.snapshot, "this machine's first sample")
        assert app.switch_box("gpu7")
        # The hosts view's local row keeps this machine's last figures, said to be not sampled now.
        assert app.local_snapshot is local and "not sampled while the console shows box gpu7" in app.local_error
        assert not app.box.local and app.box.name == "gpu7"
        dashboard = app.screen
        await wait_for(pilot, lambda: app.snapshot is not None and "box gpu7" in header(dashboard), "gpu7 telemetry")
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: [j.name for j in screen.jobs] == ["sleeper"], "gpu7's jobs")
        assert screen.remote and screen.live and screen.box is app.box
        assert screen.log_paths["sleeper"].startswith("box:gpu7/sleeper/r1/")
        assert "box gpu7" in header(screen)

        links[-1].state, links[-1].error = "DOWN", "ssh: connect to host gpu7.example: Connection refused"
        await wait_for(pilot, lambda: "DOWN" in header(screen) and "Connection refused" in header(screen),
                       "DOWN in the jobs view's header", detail=lambda: header(screen))
        await wait_for(pilot, lambda: screen.stale and "DOWN" in screen.stale, "the jobs view's stale line")
        assert [j.name for j in screen.jobs] == ["sleeper"]      # the last jobs stay shown
        stale = str(screen.query_one("#jobs-stale").render())
        assert "STALE" in stale and "Connection refused" in stale
        # The view keys are posted, not pilot.press()ed: press() then waits for every widget of the
        # screen it saw, and the footer keys the screen change replaces never answer (a 30 s timeout
        # under load). The test waits for the switch itself instead.
        app.simulate_key("1")
        await wait_for(pilot, lambda: app.screen is dashboard, "the dashboard")
        await wait_for(pilot, lambda: "DOWN" in header(app.screen), "DOWN on the dashboard too")
        assert app.snapshot is not None                          # its last telemetry is kept

        links[-1].state, links[-1].error = "LIVE", None
        await wait_for(pilot, lambda: app.sample_error is None, "LIVE again")
        app.simulate_key("2")
        await wait_for(pilot, lambda: app.screen is screen, "the jobs view again")
        await wait_for(pilot, lambda: screen.stale is None, "the stale line gone")

        assert app.switch_box("local")
        await wait_for(pilot, lambda: links[-1].closed, "gpu7's link let go")
        assert "box gpu7" not in header(app.screen)


@pilot_test
async def test_a_readonly_remote_box_offers_no_acting_key(tmp_path: Path, state, monkeypatch) -> None:
    import gpudeck.console.boxes as boxes
    monkeypatch.setattr(boxes, "BoxLink", FakeLink)
    app = console(tmp_path, [HostSpec("local"), HostSpec("ro", ssh="ro.example", readonly=True)])
    async with app.run_test(size=(140, 36)) as pilot:
        assert app.switch_box("ro")
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.jobs, "ro's jobs")
        assert screen.actions_off == "read-only"
        assert not screen.check_action("start_job", ()) and not screen.check_action("stop_job", ())
        await pilot.press("s")
        await wait_for(pilot, lambda: any("actions off: read-only" in n.message for n in app._notifications),
                       "the refusal")


def test_remote_stop_plan_stacks_and_pivot_steps_read_the_box_results() -> None:
    from gpudeck.jobs.box.results import StacksResult

    from gpudeck.console.boxes import box_stacks
    from gpudeck.console.screens.jobs import box_stop_plan, step_line

    class Box:
        local, name = False, "gpu7"

        def __init__(self, result):
            self.result = result

        def stacks(self, job):
            return self.result

    plan = box_stop_plan(Box(None), "sleeper", REMOTE_JOBS["jobs"][0])
    assert (plan.run_id, plan.pgid, plan.processes, plan.where) == ("r1", 4242, [(4242, "(as last reported by the box)")],
                                                                    " on gpu7")
    assert box_stop_plan(Box(None), "sleeper", {"state": "stopped", "pid": None}).processes == []
    dump = box_stacks(Box(StacksResult(dump={"verdict": "waiting on a lock"}, lines=["verdict: x", "1 process"])),
                      "sleeper")
    assert dump.verdict == "waiting on a lock" and dump.lines == ("verdict: x", "1 process")
    try:
        box_stacks(Box(StacksResult(refused="py-spy is not installed (on gpu7)", code=2)), "sleeper")
    except RuntimeError as exc:
        assert "py-spy" in str(exc)
    else:
        raise AssertionError("a refusal must raise its line")
    assert step_line({"name": "stop job a", "ok": True, "duration_s": 1.25, "detail": ""}) == "[ok] stop job a (1.2 s)"


# -- the history view and the post-mortem follow the box on a switch ---------------------------------

@pilot_test
async def test_history_reloads_for_the_new_box_and_a_postmortem_says_its_box_was_left(
        tmp_path: Path, state, monkeypatch) -> None:
    """Each LocalBox lists runs named after it (a listing says whose it is). The view's first listing (of
    local) is held back until the console has switched to lab2: lab2's runs must be listed all the same,
    and local's late listing dropped, never shown as lab2's."""
    import threading

    from gpudeck.jobs.box.local import LocalBox
    from gpudeck.jobs.box.results import RunsListing

    from gpudeck.console.screens.history import HistoryScreen
    from gpudeck.console.screens.postmortem import PostmortemScreen

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    hold_first = threading.Event()
    asked: list[str] = []

    def runs(self, *, job=None, failed=False, since=None, limit=None, columns=None):
        asked.append(self.name)
        if self.name == "local":
            hold_first.wait(10)             # local's listings hang until the test lets them go
        return RunsListing(rows=[{"job": f"{self.name}-job", "run_id": "r1", "kind": "job", "state": "exited",
                                  "exit_code": 0, "started_at": NOW - 30, "ended_at": NOW - 20,
                                  "path": str(run_dir)}])
    monkeypatch.setattr(LocalBox, "runs", runs)

    def jobs(screen):
        return [r["job"] for r in screen.rows]

    app = console(tmp_path, LOCALS)
    async with app.run_test(size=(140, 36)) as pilot:
        await pilot.press("3")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen, "history view")
        await wait_for(pilot, lambda: asked and set(asked) == {"local"}, "local's first listing asked (and held)")

        # The switch lands before the view ever listed a box: lab2's runs, at once.
        assert app.switch_box("lab2")
        await wait_for(pilot, lambda: jobs(screen) == ["lab2-job"] and screen.listed_box is app.box,
                       "lab2's runs", detail=lambda: (asked, jobs(screen)))
        hold_first.set()
        await pilot.pause(0.3)
        assert jobs(screen) == ["lab2-job"] and screen.listed_box is app.box   # local's late listing dropped

        # And back: local's runs, lab2's cleared meanwhile.
        loads = screen.loads
        assert app.switch_box("local")
        await wait_for(pilot, lambda: jobs(screen) == ["local-job"] and screen.listed_box is app.box,
                       "local's runs again", detail=lambda: (asked, jobs(screen)))
        assert screen.loads > loads

        # A post-mortem of local's run: a switch says whose run it is, and R no longer asks the box left.
        await pilot.press("enter")
        pm = await wait_for(pilot, lambda: isinstance(app.screen, PostmortemScreen) and app.screen, "post-mortem")
        assert pm.box is app.box and pm.left_for is None
        assert app.switch_box("lab2")
        await wait_for(pilot, lambda: pm.left_for == "lab2", "the post-mortem follows the switch")
        left = str(pm.query_one("#pm-left").render())
        assert "a run of box local" in left and "now shows box lab2" in left
        await pilot.press("R")
        await wait_for(pilot, lambda: any("b back to local" in n.message for n in app._notifications), "R refused")
        assert isinstance(app.screen, PostmortemScreen)
        assert app.switch_box("local")
        await wait_for(pilot, lambda: pm.left_for is None and not pm.query_one("#pm-left").has_class("-shown"),
                       "back on local: the line gone")
