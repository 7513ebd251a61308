"""Console side of jobs: the log pane over real files, and the jobs view driving real jobs with Pilot."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from textual.app import App

from gpudeck.console.screens.confirm import ConfirmScreen
from gpudeck.console.screens.jobs import CELL_GAP, JobsScreen, banner_lines, layout_cells, table_layout
from gpudeck.jobs.view import engine_views, job_views
from gpudeck.jobs.watch import live_jobs_note
from gpudeck.console.widgets.log_index import BLOCK, LogIndex, LogSearch
from gpudeck.console.widgets.log_view import LogViewPane
from runsupport import free_port, pilot_test
from runsupport import pilot_wait_for as wait_for
from appsupport import LogApp



# -- LogIndex / LogSearch on real files ------------------------------------------------------------

def _random_log(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(0, 2500)):
        if rng.random() < 0.03:
            n = rng.choice([0, 1, BLOCK - 1, BLOCK, BLOCK + 7, 3 * BLOCK])
        else:
            n = rng.randint(0, 120)
        parts.append(bytes(rng.choice(b"abcxyz \r\x1b\xff") for _ in range(n)))
    data = b"\n".join(parts)
    return data + b"\n" if rng.random() < 0.5 else data


@pytest.mark.parametrize("seed", range(12))
def test_index_matches_file_content_while_it_grows(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = _random_log(rng)
    path = tmp_path / "out.log"
    path.write_bytes(b"")
    index = LogIndex(path)
    with open(path, "ab") as f:
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 200_000)
            f.write(data[pos:pos + step])
            f.flush()
            pos += step
            index.update(max_bytes=rng.choice([999, 1 << 30]))
    while index.state().size < len(data):
        index.update()
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    assert index.line_count == len(lines)
    offset = 0
    for number, line in enumerate(lines):
        assert index.line_span(number) == (offset, offset + len(line))
        assert index.line_at_offset(offset) == number
        offset += len(line) + 1
    search = LogSearch(index, "XYZ")
    search.scan(chunk=rng.choice([5, 333, 1 << 22]))
    assert list(search.lines) == [n for n, line in enumerate(lines) if b"xyz" in line]


def test_index_resets_when_the_file_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"one\ntwo\nthree\n")
    index = LogIndex(path)
    index.update()
    before = index.state()
    path.write_bytes(b"new\n")
    index.update()
    after = index.state()
    assert before.line_count == 3
    assert after.line_count == 1 and after.generation > before.generation
    assert index.read_line(0) == (b"new", 0)


def test_huge_progress_line_shows_its_last_redraw(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    bar = b"".join(b"\rloading %7d/1000000" % i for i in range(0, 1_000_000, 997))
    path.write_bytes(b"start\n" + bar + b"\rloading 1000000/1000000\nend\n")
    index = LogIndex(path)
    index.update()
    raw, omitted = index.read_line(1)
    assert raw == b"loading 1000000/1000000"
    assert omitted > 0


# -- LogViewPane in an app -------------------------------------------------------------------------

def rendered_rows(pane: LogViewPane) -> list[str]:
    return [row.rstrip() for row in pane.visible_text()]


@pilot_test
async def test_pane_follows_pauses_on_scroll_up_and_resumes_with_G(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(200)))
    app = LogApp(path)
    async with app.run_test(size=(60, 20)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: "line 199" in rendered_rows(pane), "the tail on screen")
        assert pane.following
        with open(path, "ab") as f:
            f.write(b"line 200\nline 201\n")
        await wait_for(pilot, lambda: rendered_rows(pane)[-1] == "line 201", "appended lines followed")
        await pilot.press("pageup")
        await wait_for(pilot, lambda: not pane.following, "pause on scroll up")
        top = pane.scroll_y
        with open(path, "ab") as f:
            f.write(b"line 202\n")
        await wait_for(pilot, lambda: pane.line_count == 203, "new line indexed")
        await pilot.pause(0.2)
        assert pane.scroll_y == top and "line 202" not in rendered_rows(pane)
        await pilot.press("G")
        await wait_for(pilot, lambda: rendered_rows(pane)[-1] == "line 202", "following again after G")
        assert pane.following


@pilot_test
async def test_reopening_another_file_follows_its_tail_with_the_scroll_position_in_sync(tmp_path: Path) -> None:
    first = tmp_path / "run1.log"
    first.write_bytes(b"".join(b"old %d\n" % i for i in range(100)))
    app = LogApp(first)
    async with app.run_test(size=(60, 20)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: pane.line_count == 100, "first file")
        for n in range(3):
            path = tmp_path / f"run{n + 2}.log"
            path.write_bytes(b"".join(b"new %d\n" % i for i in range(100)))
            pane.open(path)
            await wait_for(pilot, lambda: pane.line_count == 100 and pane.path == path, "reopened")
            await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y > 0, "scrolled to the end",
                           detail=lambda: (pane.scroll_y, pane.max_scroll_y))
            assert rendered_rows(pane)[-1] == "new 99" and pane.following


@pilot_test
async def test_search_finds_the_right_lines_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    lines = [f"step {i} loss=0.{i:03d}" for i in range(3000)]
    lines[1234] = "RuntimeError: CUDA out of memory"
    lines[2500] = "torch.OutOfMemoryError: CUDA out of MEMORY again"
    path.write_text("\n".join(lines) + "\n")
    app = LogApp(path)
    async with app.run_test(size=(70, 20)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: pane.line_count == 3000, "indexed")
        await pilot.press("home")
        await pilot.press("slash", *"out of memory", "enter")
        await wait_for(pilot, lambda: pane.current_match == 1234, "first match shown")
        assert pane.match_position() == (1, 2)
        assert any("CUDA out of memory" in row for row in rendered_rows(pane))
        await pilot.press("n")
        assert pane.current_match == 2500 and pane.match_position() == (2, 2)
        await pilot.press("N")
        assert pane.current_match == 1234
        status = str(app.query_one("#log-status").render())
        assert "1/2" in status and "out of memory" in status


@pilot_test
async def test_escape_sequences_never_reach_rendered_segments(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(
        b"\x1b[31mred\x1b[0m plain\n"
        b"title \x1b]0;pwned\x07 and clipboard \x1b]52;c;ZXZpbA==\x1b\\ end\n"
        b"cursor \x1b[2J\x1b[H\x1b[10;10H moved \x9b31m c1\n"
        b"bad utf8 \xff\xfe and a bell \x07 and del \x7f\n"
        b"50%\r75%\r100%\r\n"
        b"tab\tstop\n"
    )
    app = LogApp(path)
    async with app.run_test(size=(80, 12)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: pane.line_count == 6, "indexed")
        await pilot.pause(0.1)
        for wrap in (False, True):
            if wrap:
                await pilot.press("w")
            for y in range(pane.size.height):
                for segment in pane.render_line(y):
                    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in segment.text), segment
        rows = rendered_rows(pane)
        assert rows[0] == "red plain"
        assert "pwned" not in rows[1]
        assert rows[4] == "100%"


@pilot_test
async def test_wrap_shows_a_long_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_text("short\n" + "".join(f"{i:04d}" for i in range(40)) + "\nlast\n")
    app = LogApp(path)
    async with app.run_test(size=(40, 12)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: pane.line_count == 3, "indexed")
        await pilot.press("w")
        await pilot.pause(0.1)
        rows = [r for r in rendered_rows(pane) if r]
        width = pane.size.width
        joined = "".join(rows[1:-1])
        assert joined == "".join(f"{i:04d}" for i in range(40)) and len(rows[1]) == width
        assert rows[-1] == "last"


# -- the jobs view, on real jobs -------------------------------------------------------------------

JOBS_TOML = '''
[jobs.printer]
cmd = "for i in $(seq 1 50); do echo printer line $i; done; sleep 300"
kind = "stage"

[jobs.sleeper]
cmd = "sleep 300"
kind = "train"
port = {port}

[jobs.eng-a]
cmd = "sleep 300"
kind = "engine"
engine = "vllm"
port = {port_a}

[jobs.eng-b]
cmd = "sleep 300"
kind = "engine"
engine = "vllm"
port = {port_b}
'''


@pytest.fixture
def jobs_env(tmp_path: Path, state: Path):
    state.mkdir()
    jobs_file = tmp_path / "jobs.toml"
    jobs_file.write_text(JOBS_TOML.format(port=free_port(), port_a=free_port(), port_b=free_port()))
    yield jobs_file
    from gpudeck.jobs.spec import load_jobs
    from gpudeck.jobs.supervisor import Supervisor
    supervisor = Supervisor(load_jobs(jobs_file), state)
    for name in supervisor.jobs_file.jobs:
        supervisor.stop(name, timeout=2)


def make_console(jobs_file: Path | None):
    from gpudeck.console.app import make_app
    from gpudeck.jobs.telemetry.sampler import make_sampler
    return make_app(sampler=make_sampler(demo=True), start_sampling=False, refresh=0.3,
                    jobs_file=None if jobs_file is None else str(jobs_file))


def job(screen: JobsScreen, name: str) -> dict:
    """The payload record the screen's row for `name` was built from."""
    return next(j.payload for j in screen.jobs if j.name == name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


@pilot_test
async def test_jobs_view_start_log_and_stop_a_real_job(jobs_env: Path) -> None:
    app = make_console(jobs_env)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.refreshes >= 1, "first refresh")
        assert screen.selected_job.name == "printer"             # first job of the file
        assert [j.name for j in screen.jobs] == ["printer", "sleeper", "eng-a", "eng-b"]

        await pilot.press("s")
        await wait_for(pilot, lambda: job(screen, "printer")["state"] == "running", "printer running")
        pid = job(screen, "printer")["pid"]
        assert pid and _alive(pid)

        await pilot.press("enter")
        pane = app.screen.query_one(LogViewPane)
        await wait_for(pilot, lambda: any("printer line 50" in r for r in rendered_rows(pane)), "log lines shown")
        await wait_for(pilot, lambda: pane.has_focus, "log focused")

        await pilot.press("escape")                              # closes the log, focus back to the table
        await pilot.press("x")
        confirm = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "confirm")
        assert "Stop printer?" in confirm.text and f"pid {pid}" in confirm.text
        await pilot.press("n")                                   # "no" leaves it running
        await pilot.pause(0.3)
        assert _alive(pid) and app.screen is screen
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirm again")
        await pilot.press("y")
        await wait_for(pilot, lambda: job(screen, "printer")["state"] == "stopped", "printer stopped")
        assert not _alive(pid)


@pilot_test
async def test_restart_reattaches_the_log_to_the_new_run(jobs_env: Path) -> None:
    app = make_console(jobs_env)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.refreshes >= 1, "first refresh")
        await pilot.press("s")
        await wait_for(pilot, lambda: job(screen, "printer")["state"] == "running", "running")
        first_run = job(screen, "printer")["run_id"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen._log_path and first_run in screen._log_path, "log of run 1")
        await wait_for(pilot, lambda: screen.query_one(LogViewPane).has_focus, "log focused")
        await pilot.press("r")                                   # from the log pane: it stays open
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "restart confirm")
        await pilot.press("y")
        notices = lambda: (job(screen, "printer"), [n.message for n in app._notifications])  # noqa: E731
        await wait_for(pilot, lambda: job(screen, "printer")["run_id"] not in (None, first_run)
                       and job(screen, "printer")["state"] == "running", "second run", timeout=60, detail=notices)
        second_run = job(screen, "printer")["run_id"]
        await wait_for(pilot, lambda: second_run in (screen._log_path or ""), "log re-attached",
                       detail=lambda: (screen._log_path, screen.log_paths))
        pane = screen.query_one(LogViewPane)
        await wait_for(pilot, lambda: any("printer line 50" in r for r in rendered_rows(pane)), "new run's lines",
                       detail=lambda: (pane.path, pane.line_count, rendered_rows(pane)[-3:]))
        assert live_jobs_note(str(jobs_env)) == "1 job keeps running (printer); `gpudeck jobs` to see them"


@pilot_test
async def test_pivot_key_confirms_the_plan_then_stops_one_engine_and_starts_the_other(jobs_env: Path) -> None:
    app = make_console(jobs_env)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.refreshes >= 1, "first refresh")
        await pilot.press("down", "down", "s")                   # start eng-a
        await wait_for(pilot, lambda: job(screen, "eng-a")["state"] == "running", "eng-a running")
        engines = screen.query_one("#engines")
        await wait_for(pilot, lambda: any(r.name == "eng-a" and r.managed for r in engines.rows), "engine panel")
        await pilot.press("down", "p")                           # pivot to eng-b
        confirm = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "plan")
        assert "Pivot to eng-b?" in confirm.text and "job eng-a" in confirm.text
        await pilot.press("y")
        await wait_for(pilot, lambda: job(screen, "eng-b")["state"] == "running"
                       and job(screen, "eng-a")["state"] == "stopped", "pivoted", timeout=60)


@pilot_test
async def test_no_jobs_file_shows_a_reason_and_the_dashboard_still_works(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUDECK_JOBS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    app = make_console(None)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.reason, "reason")
        assert screen.reason.startswith("no jobs file")
        assert "\n" not in screen.reason
        await pilot.press("s")                                   # no crash, just a notice
        await pilot.press("1")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "DashboardScreen", "dashboard")


# -- presentation and the snapshot ------------------------------------------------------------------

NOW = 1_767_000_000.0
FAKE_JOBS = [
    {"name": "vllm-k2", "kind": "engine", "state": "running", "pid": 4412, "run_id": "r1", "exit_code": None,
     "started_at": NOW - 2100, "ended_at": None, "port": 8000, "port_open": True, "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
     "phase": "ready", "progress": None, "alerts": [
         {"code": "spec_decode_ineffective", "since": NOW - 300, "message": "acceptance 15%: 0.66x throughput"}],
     "serving": {"running": 4, "waiting": 0, "kv_cache_pct": 37.0, "gen_tokens_per_s": 54.6,
                 "spec_accept_rate": 0.15, "spec_accept_len": 1.18}},
    {"name": "sglang-k2", "kind": "engine", "state": "running", "pid": 5120, "run_id": "r2", "exit_code": None,
     "started_at": NOW - 900, "ended_at": None, "port": 30000, "port_open": False, "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
     "phase": "loading", "progress": None, "alerts": [
         {"code": "stalled", "since": NOW - 420, "message": "alive, 0% CPU, 0% GPU, log silent, port shut"}]},
    {"name": "sgl-kernel", "kind": "build", "state": "exited", "pid": None, "run_id": "r3", "exit_code": 137,
     "signal": None, "started_at": NOW - 7200, "ended_at": NOW - 4320, "port": None, "port_open": None, "gpus": [],
     "phase": "failed", "progress": {"done": 611, "total": 812, "label": "ninja", "eta_s": None},
     "alerts": [{"code": "crashed", "since": NOW - 4320, "message": "host_oom: lower MAX_JOBS"}]},
    {"name": "datagen", "kind": "stage", "state": "running", "pid": 6001, "run_id": "r4", "exit_code": None,
     "started_at": NOW - 5400, "ended_at": None, "port": None, "port_open": None, "gpus": [0, 1],
     "phase": "running", "progress": {"done": 6200, "total": 10000, "label": "gen", "eta_s": 3300}, "alerts": []},
    {"name": "finetune", "kind": "train", "state": "idle", "pid": None, "run_id": None, "exit_code": None,
     "started_at": None, "ended_at": None, "port": None, "port_open": None, "gpus": [0, 1, 2, 3],
     "phase": None, "progress": None, "alerts": []},
]


def test_health_levels_and_cells() -> None:
    views = job_views({"jobs": FAKE_JOBS})
    assert [v.health for v in views] == ["warning", "stalled", "failed", "ok", "idle"]
    keys = ("name", "kind", "state", "runtime", "port", "gpus", "exit", "phase", "alerts")
    cells = [views[3].cells(NOW)[key] for key in keys]
    assert cells == ["datagen", "stage", "running", "1h30m", "—", "0,1", "—", "running gen 6200/10000 62% ETA 55m00s", ""]
    assert views[1].cells(NOW)["state"] == "STALLED"
    assert banner_lines(views, NOW)[1] == "⚠ sglang-k2: stalled for 7m00s — alive, 0% CPU, 0% GPU, log silent, port shut"


class FakeSupervisor:
    """A fixed state for the snapshot: no processes, no clock, no files."""

    COMMANDS = {"vllm-k2": "vllm serve /models/kimi-k2-int4 --port 8000 -tp 8",
                "sglang-k2": "python -m sglang.launch_server --model-path /models/kimi-k2-int4 --port 30000"}

    def latest(self, name: str):
        return None

    def spec(self, name: str):
        from gpudeck.jobs.spec import JobSpec
        job = next(j for j in FAKE_JOBS if j["name"] == name)
        engine = name.split("-")[0] if name in self.COMMANDS else None
        return JobSpec(name=name, cmd=self.COMMANDS.get(name, "true"), kind=job["kind"], engine=engine,
                       port=job["port"], gpus=tuple(job["gpus"]))


class SnapshotApp(App):
    def on_mount(self) -> None:
        from gpudeck.themes import DEFAULT_THEME, GPUDECK_THEMES
        for theme in GPUDECK_THEMES.values():
            self.register_theme(theme)
        self.theme = DEFAULT_THEME
        self.push_screen(JobsScreen(supervisor=FakeSupervisor(), payload=lambda _: {"jobs": FAKE_JOBS},
                                    refresh_s=3600, clock=lambda: NOW))


def test_jobs_screen_snapshot(snap_compare) -> None:
    async def settle(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, JobsScreen) and pilot.app.screen.refreshes, "rows")
        await pilot.pause(0.1)

    assert snap_compare(SnapshotApp(), terminal_size=(80, 24), run_before=settle)


def test_jobs_screen_snapshot_120x36(snap_compare) -> None:
    async def settle(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, JobsScreen) and pilot.app.screen.refreshes, "rows")
        await pilot.pause(0.1)

    assert snap_compare(SnapshotApp(), terminal_size=(120, 36), run_before=settle)


@pilot_test
async def test_resizing_the_terminal_lays_the_columns_out_again() -> None:
    app = SnapshotApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.refreshes
                                and app.screen, "rows")
        keys = lambda: [c.key for c in screen._layout.columns]  # noqa: E731
        assert "run" not in keys() and "kind" not in keys()
        await pilot.resize_terminal(200, 60)
        await wait_for(pilot, lambda: "run" in keys(), "wide columns", detail=keys)
        table = screen.query_one("#jobs-table")
        assert not table.show_horizontal_scrollbar
        assert [str(c.key.value) for c in table.ordered_columns] == keys()


@pytest.mark.parametrize("width", [40, 60, 76, 96, 116, 156, 196, 300])
def test_table_columns_fit_the_width_and_keep_state_and_progress(width: int) -> None:
    views = job_views({"jobs": FAKE_JOBS})
    layout = table_layout(views, NOW, width)
    keys = [c.key for c in layout.columns]
    assert sum(c.width + CELL_GAP for c in layout.columns) <= width
    assert {"name", "state", "phase"} <= set(keys) and keys[-1] == "phase"
    state = next(c for c in layout.columns if c.key == "state")
    assert state.width >= len("STALLED") and state.width >= len("stopping")
    if width >= 116:
        assert "pid" in keys
    if width >= 196:
        assert {"kind", "alerts", "run"} <= set(keys)
    cells = layout_cells(views[1], NOW, layout)
    # Every cell is padded to its column: the row's health style spans the row with no gaps.
    assert [c.cell_len for c in cells] == [c.width + CELL_GAP for c in layout.columns]
    assert cells[keys.index("state")].plain.strip() == "STALLED"


def test_engine_rows_mark_foreign_engines_and_keep_history() -> None:
    from gpudeck.console.widgets.engine_panel import EnginePanel
    foreign = [{"pid": 4412, "engine": "vllm", "port": 8000, "gpu_mem": 71 * 2**30, "cmdline": "vllm serve x",
                "managed": False, "orphan": True, "model": "x", "create_time": NOW - 60},
               {"pid": 9, "engine": "vllm", "managed": True, "job": "vllm-k2"}]
    specs = {"vllm-k2": ("vllm", "/models/kimi-k2-int4", 8000), "sglang-k2": ("sglang", None, 30000)}
    rows = engine_views(job_views({"jobs": FAKE_JOBS}), specs, foreign)
    assert [(r.name, r.managed, r.state) for r in rows] == [
        ("vllm-k2", True, "ready"), ("sglang-k2", True, "loading"), ("vllm PID 4412", False, "running")]
    panel = EnginePanel(clock=lambda: NOW)
    for rate in (50.0, 54.6):
        serving = dict(FAKE_JOBS[0]["serving"], gen_tokens_per_s=rate)
        panel.update_engines([rows[0].__class__(**{**rows[0].__dict__, "serving": serving}), rows[2]])
    assert panel.history("vllm-k2", "gen_tokens_per_s") == [50.0, 54.6]
    # A paused replay republishes one instant: the graphs grow once per instant, not per publish.
    for _ in range(3):
        panel.update_engines([rows[0].__class__(**{**rows[0].__dict__, "serving": serving}), rows[2]], at=NOW)
    panel.update_engines([rows[0].__class__(**{**rows[0].__dict__, "serving": serving}), rows[2]], at=NOW + 1)
    assert panel.history("vllm-k2", "gen_tokens_per_s") == [50.0, 54.6, 54.6, 54.6]
    text = "\n".join(line.plain for line in panel.lines())
    assert "FOREIGN" in text and "vllm PID 4412" in text and "orphan" in text and "71.0G GPU" in text
    assert "54.6 tok/s" in text and "spec accept 15% len 1.18" in text and "up 1m00s" in text


@pilot_test
async def test_a_new_alert_rings_the_bell_and_notifies_once() -> None:
    calls = {"n": 0}
    alert = {"code": "stalled", "since": NOW - 30, "message": "log silent, port shut"}

    def payload(_):
        calls["n"] += 1
        jobs = [dict(j, alerts=[]) for j in FAKE_JOBS[3:]]
        if calls["n"] >= 2:
            jobs[0]["alerts"] = [alert]
        return {"jobs": jobs}

    class AlertApp(App):
        bells = 0

        def bell(self) -> None:
            self.bells += 1

        def on_mount(self) -> None:
            self.push_screen(JobsScreen(supervisor=FakeSupervisor(), payload=payload, refresh_s=0.1,
                                        clock=lambda: NOW))

    app = AlertApp()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen, "jobs view")
        await wait_for(pilot, lambda: screen.refreshes >= 5, "several refreshes")
        assert app.bells == 1
        notices = [n.message for n in app._notifications]
        assert sum("datagen: stalled" in m for m in notices) == 1
        banner = str(screen.query_one("#jobs-banner").render())
        assert "datagen: stalled for 30s" in banner
        assert screen.jobs[0].health == "stalled"


# Records on which `gpudeck jobs` and the jobs view used to disagree: exit by signal ("None (SIGKILL)"
# vs "SIGKILL"), a shut port ("30000" vs "30000 shut"), GPU ranges, progress without a phase or with a
# label and ETA, a stalled job's state, serving numbers, and job text with escape sequences.
DISAGREED = FAKE_JOBS + [
    {"name": "killed", "kind": "stage", "state": "exited", "pid": None, "run_id": "r5", "exit_code": None,
     "signal": "SIGKILL", "started_at": NOW - 60, "ended_at": NOW - 30, "port": 9000, "port_open": False,
     "gpus": [2, 3, 4], "phase": "unknown", "progress": {"done": 3, "total": 9, "label": "shard", "eta_s": 40},
     "alerts": [], "failure": {"cause": "oom", "line": 12, "hint": "lower the batch"}},
    {"name": "evil\x1b]52;c;aGk=\x07name", "kind": "stage", "state": "running", "pid": 7, "run_id": "r6",
     "exit_code": None, "started_at": NOW - 5, "ended_at": None, "port": None, "port_open": None, "gpus": [],
     "phase": "load\x1b[31ming", "progress": {"eta_s": 90}, "alerts": "not a list"},
]


def _cli_cells(lines: list[str]) -> list[dict[str, str]]:
    """Split `gpudeck jobs` table lines into cells at the header's column starts."""
    import re
    from gpudeck.console.commands.jobs_list import cli_columns
    header = lines[0]
    labels = {label.split(" /")[0].upper(): key for key, label in cli_columns()}
    starts = [(m.start(), labels[m.group()]) for m in re.finditer(r"\S+", header)]
    rows = []
    for line in lines[1:]:
        if line.startswith("⚠"):
            break
        bounds = [s for s, _ in starts] + [len(line) + 1]
        rows.append({key: line[bounds[i]:bounds[i + 1]].strip() for i, (_, key) in enumerate(starts)})
    return rows


@pilot_test
async def test_cli_and_jobs_view_show_the_same_words_for_every_job() -> None:
    from gpudeck.console.commands.jobs_list import table_lines

    class WideApp(App):
        def on_mount(self) -> None:
            self.push_screen(JobsScreen(supervisor=FakeSupervisor(), payload=lambda _: {"jobs": DISAGREED},
                                        refresh_s=3600, clock=lambda: NOW))

    cli = _cli_cells(table_lines(job_views({"jobs": DISAGREED}), NOW))
    app = WideApp()
    async with app.run_test(size=(320, 30)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.refreshes
                                and app.screen, "rows")
        table = screen.query_one("#jobs-table")
        keys = [str(c.key.value) for c in table.ordered_columns]
        assert {"state", "phase", "port", "exit", "gpus", "serving", "alerts", "runtime"} <= set(keys), keys
        shown = [{key: table.get_row_at(i)[n].plain.strip() for n, key in enumerate(keys)}
                 for i in range(table.row_count)]
        banner = str(screen.query_one("#jobs-banner").render())
    assert len(shown) == len(cli) == len(DISAGREED)
    for tui, text in zip(shown, cli):
        for key in keys:
            if key == "alerts":
                continue            # the CLI lists alerts under the table, one line each (checked below)
            assert (tui[key] or "—") == text[key], (key, tui, text)   # the CLI marks an empty cell "—"
            assert "\x1b" not in tui[key] and "\x07" not in tui[key]
    by_name = {row["name"]: row for row in cli}
    assert by_name["killed"]["exit"] == "SIGKILL" and by_name["killed"]["port"] == "9000 shut"
    # an ended run says where it got to, never an ETA (issue 9)
    assert by_name["killed"]["gpus"] == "2-4" and by_name["killed"]["phase"] == "at 3/9 when it failed"
    assert by_name["sglang-k2"]["state"] == "STALLED"
    assert by_name["vllm-k2"]["serving"].startswith("54.6 tok/s")
    notices = [line for line in table_lines(job_views({"jobs": DISAGREED}), NOW) if line.startswith("⚠")]
    for line in banner.splitlines():
        assert line in notices
    assert "⚠ killed: oom at log line 12 — lower the batch" in notices


def test_slurm_jobs_get_a_slurm_column_only_when_there_are_some() -> None:
    slurm_job = {"name": "train", "kind": "train", "state": "starting", "pid": None, "run_id": "20261201-044852-00001",
                 "backend": "slurm", "slurm": {"job_id": "4242", "state": "PENDING", "reason": "Dependency",
                                               "nodes": None, "text": "PENDING (Dependency)"}}
    views = job_views({"jobs": FAKE_JOBS + [slurm_job]})
    cells = views[-1].cells(NOW)
    assert cells["slurm"] == "4242 PENDING (Dependency)" and cells["pid"] == "slurm:4242"
    assert "slurm" in [c.key for c in table_layout(views, NOW, 200).columns]
    assert "slurm" not in [c.key for c in table_layout(job_views({"jobs": FAKE_JOBS}), NOW, 300).columns]
    assert all(v.cells(NOW)["slurm"] == "" for v in views[:-1])


# -- a long progress label: the phase column shortens the label, never the numbers or the ETA (harden 18) --

LONG_LABEL = "Loading safetensors checkpoint shards"
LOADING_JOBS = [
    {"name": "vllm-k2", "kind": "engine", "state": "running", "pid": 4412, "run_id": "r1", "exit_code": None,
     "started_at": NOW - 600, "ended_at": None, "port": 8000, "port_open": False, "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
     "phase": "loading", "progress": {"done": 33, "total": 85, "label": LONG_LABEL, "eta_s": 720}, "alerts": []},
    FAKE_JOBS[3],
]


@pytest.mark.parametrize("width", [80, 120, 160])
@pilot_test
async def test_a_long_progress_label_is_shortened_and_the_eta_stays_whole(width: int) -> None:
    class LoadingApp(App):
        def on_mount(self) -> None:
            self.push_screen(JobsScreen(supervisor=FakeSupervisor(), payload=lambda _: {"jobs": LOADING_JOBS},
                                        refresh_s=3600, clock=lambda: NOW))

    app = LoadingApp()
    async with app.run_test(size=(width, 24)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.refreshes
                                and app.screen, "rows")
        table = screen.query_one("#jobs-table")
        keys = [str(c.key.value) for c in table.ordered_columns]
        column = next(c for c in screen._layout.columns if c.key == "phase")
        cell = table.get_row_at(0)[keys.index("phase")].plain.rstrip()
        gen = table.get_row_at(1)[keys.index("phase")].plain.rstrip()
    assert cell.endswith("33/85 39% ETA 12m00s"), (width, cell)         # the numbers and the ETA, whole
    assert gen.endswith("6200/10000 62% ETA 55m00s"), (width, gen)
    assert len(cell) <= column.width
    whole = f"loading {LONG_LABEL} 33/85 39% ETA 12m00s"
    if len(whole) <= column.width:
        assert cell == whole, (width, cell)
    elif column.width >= len(whole) - len(LONG_LABEL) + 4:
        assert "Loading" in cell and "…" in cell, (width, cell)       # the label shortened, with an ellipsis
    if width == 160:
        assert cell == whole                   # wide enough: more than 24 characters of label (was "…chec")


@pytest.mark.parametrize("columns", [80, 120, 160])
def test_cli_jobs_phase_column_uses_the_terminal_width(columns: int) -> None:
    from gpudeck.console.commands.jobs_list import PHASE_MIN, table_lines
    lines = table_lines(job_views({"jobs": LOADING_JOBS}), NOW, columns)
    table = [line for line in lines if not line.startswith("⚠")]
    rows = _cli_cells(table)
    assert rows[0]["phase"].endswith("33/85 39% ETA 12m00s") and rows[1]["phase"].endswith("62% ETA 55m00s"), rows
    others = table[0].index("PHASE")
    # Past the terminal only where the other columns leave less than PHASE_MIN, and then only by whole numbers.
    numbers = ("33/85 39% ETA 12m00s", "6200/10000 62% ETA 55m00s")
    for line, whole in zip(table[1:], numbers):
        assert len(line) <= max(columns, others + max(PHASE_MIN, len(whole))), "\n".join(table)
    if columns == 160:
        assert rows[0]["phase"] == f"loading {LONG_LABEL} 33/85 39% ETA 12m00s", rows[0]
    elif columns == 120:
        assert "Loading safetensors" in rows[0]["phase"] and "…" in rows[0]["phase"], rows[0]
    # Without a terminal (a pipe) the label is whole.
    assert LONG_LABEL in _cli_cells(table_lines(job_views({"jobs": LOADING_JOBS}), NOW))[0]["phase"]
