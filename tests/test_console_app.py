"""The console dashboard under Pilot: keys, themes, SIMULATED labels, no-GPU and failing-sampler paths."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from textual.widget import Widget

from gpudeck.jobs.telemetry.history import History
from gpudeck.jobs.telemetry.sampler import make_sampler
from gpudeck.jobs.telemetry.snapshot import GpuProcess, GpuSample, HostSample, ProcInfo, Snapshot

from gpudeck.console.app import GpuDeckApp, make_app, resolve_theme
from gpudeck.console.config import load_console_config
from gpudeck.console.errors import CliError
from gpudeck.console.messages import SamplesCollected
from gpudeck.console.screens.dashboard import DashboardScreen
from gpudeck.console.screens.help import HelpScreen
from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
from gpudeck.console.widgets.gpu_card_panel import GpuCardPanel
from gpudeck.console.widgets.gpu_grid_panel import GpuGridPanel, choose_layout
from gpudeck.console.widgets.gpu_lines_panel import GpuLinesPanel
from gpudeck.console.widgets.gpu_process_table import UNKNOWN_PID, GpuProcessTable
from gpudeck.console.widgets.host_panel import HostPanel
from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 30.0   # generous: two cores shared by many test runs


def rendered_text(widget) -> str:
    """What a widget shows, as plain text: its border titles, then its lines as painted."""
    if type(widget).render_line is not Widget.render_line:       # Line API widgets paint line by line
        text = "\n".join(widget.render_line(y).text for y in range(widget.size.height))
    else:
        body = widget.render()
        text = getattr(body, "plain", None) or str(body)
    return f"{widget.border_title or ''}\n{widget.border_subtitle or ''}\n{text}"


class ScriptedSampler:
    """Returns the given snapshots / raises the given exceptions in order, then repeats the last."""

    def __init__(self, *script) -> None:
        self.script = list(script)
        self.calls = 0
        self.closed = False

    def sample(self) -> Snapshot:
        item = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


class HeldSampler(ScriptedSampler):
    """A ScriptedSampler that stays on the item before its last until `released`: a state between
    two ticks 0.05 s apart is held until the test has seen it, however loaded the machine."""

    released = False

    def sample(self) -> Snapshot:
        if not self.released and self.calls >= len(self.script) - 1:
            self.calls = len(self.script) - 2
        return super().sample()


def host(name: str = "testbox") -> HostSample:
    return HostSample(name=name, cpu_percent=12.0, cpu_per_core=(10.0, 14.0), cpu_count=2,
                      load_avg=(0.5, 0.4, 0.3), mem_total=8 << 30, mem_used=2 << 30, mem_available=6 << 30)


def no_gpu_snapshot(t: float = 1000.0) -> Snapshot:
    return Snapshot(time=t, host=host(), gpus=(), gpu_error="NVML Shared Library Not Found (no NVIDIA driver)")


def one_gpu_snapshot(t: float = 1000.0) -> Snapshot:
    foreign = GpuProcess(pid=4242424, mem_used=1 << 30, proc=ProcInfo(pid=4242424, known=False))
    mine = GpuProcess(pid=os.getpid(), mem_used=2 << 30, sm_util=55.0,
                      proc=ProcInfo(pid=os.getpid(), name="python", cmdline="python train.py", user="op",
                                    cpu_percent=99.0, rss=3 << 30, age_s=4000.0))
    gpu = GpuSample(index=0, name="NVIDIA H200", util=77.0, mem_used=3 << 30, mem_total=140 << 30, temp=91.0,
                    power_w=690.0, power_limit_w=700.0, sm_clock_mhz=1980, mem_clock_mhz=3201,
                    throttle_reasons=("gpu_idle", "hw_thermal_slowdown"), processes=(mine, foreign))
    return Snapshot(time=t, host=host(), gpus=(gpu,))


def demo_app(**kwargs) -> GpuDeckApp:
    return make_app(sampler=make_sampler(demo=True, seed=0), history=History(), **kwargs)


# -- keys ---------------------------------------------------------------------------------------

@pilot_test
async def test_question_mark_opens_help_listing_the_keys_and_escape_closes_it() -> None:
    app = demo_app(start_sampling=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        keys = app.screen.keys
        assert {("q", "Quit"), ("?", "Help"), ("t", "Theme"), ("d", "Density"), ("p", "Pause")} <= set(keys)
        assert keys[0] == ("q", "Quit")          # gpudeck's own keys come before Textual's generic ones
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), "help to close")


@pilot_test
async def test_t_cycles_the_gpudeck_themes_and_wraps_around() -> None:
    app = demo_app(start_sampling=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.theme == "gpudeck-dark"
        seen = []
        for _ in range(3):
            await pilot.press("t")
            seen.append(app.theme)
        assert seen == ["gpudeck-light", "gpudeck-contrast", "gpudeck-dark"]


@pilot_test
async def test_palette_offers_gpudeck_theme_commands_that_switch_the_theme() -> None:
    app = demo_app(start_sampling=False)
    async with app.run_test(size=(100, 30)) as pilot:
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert {"Theme: gpudeck-dark", "Theme: gpudeck-light", "Theme: gpudeck-contrast",
                "View: Dashboard", "Sample now"} <= set(commands)
        commands["Theme: gpudeck-contrast"].callback()
        await pilot.pause()
        assert app.theme == "gpudeck-contrast"


@pilot_test
async def test_bindings_have_ids_so_a_keymap_can_move_them() -> None:
    app = demo_app(start_sampling=False)
    async with app.run_test(size=(100, 30)) as pilot:
        ids = {b.id for b in app.BINDINGS} | {b.id for b in DashboardScreen.BINDINGS}
        assert None not in ids
        app.set_keymap({"app.theme.cycle": "y"})
        await pilot.press("y")
        assert app.theme == "gpudeck-light"


@pilot_test
async def test_q_quits_with_status_zero() -> None:
    sampler = make_sampler(demo=True)
    app = make_app(sampler=sampler, history=History())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, "the app to exit")
    assert app.return_code == 0


# -- what the dashboard shows ------------------------------------------------------------------

@pilot_test
async def test_demo_says_simulated_in_the_header_and_on_every_gpu_line_and_card() -> None:
    app = demo_app(refresh=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.ticks >= 3, "three ticks")
        assert "SIMULATED" in rendered_text(app.screen.query_one(BoxHeaderPanel))
        lines = rendered_text(app.screen.query_one(GpuLinesPanel)).splitlines()[2:]
        assert len(lines) == 8 and all("SIM" in line for line in lines)
        await pilot.resize_terminal(200, 60)
        grid = app.screen.query_one(GpuGridPanel)
        await wait_for(pilot, lambda: grid.cards_mode and len(app.screen.query(GpuCardPanel)) == 8, "8 cards")
        await wait_for(pilot, lambda: all(c.sample is not None for c in app.screen.query(GpuCardPanel)), "cards filled")
        for card in app.screen.query(GpuCardPanel):
            assert card.border_subtitle == "SIMULATED"


@pilot_test
async def test_live_header_clock_shows_minutes_and_repaints_only_when_the_minute_changes() -> None:
    # The clock was the one line at the top that changed every tick; now it changes once a minute.
    start = 60 * 29_000_000.0 + 1.0                      # one second into a minute
    ticks = [one_gpu_snapshot(start + s) for s in (0, 1, 2, 30, 60)]
    app = make_app(sampler=ScriptedSampler(ticks[0]), history=History(), start_sampling=False)
    async with app.run_test(size=(100, 30)) as pilot:
        header = app.screen.query_one(BoxHeaderPanel)
        shown = []
        real_refresh = header.refresh
        header.refresh = lambda *a, **k: (shown.append(header.view.snapshot.time), real_refresh(*a, **k))[1]
        for snap in ticks:
            app.post_message(SamplesCollected(snap))
            await wait_for(pilot, lambda: app.snapshot is snap, "the tick shown")
        assert shown == [ticks[0].time, ticks[-1].time]
        text = rendered_text(header)
        assert time.strftime("%H:%M", time.localtime(ticks[-1].time)) in text
        assert time.strftime("%H:%M:%S", time.localtime(ticks[-1].time)) not in text


@pilot_test
async def test_no_gpu_shows_the_reason_and_everything_else_still_works() -> None:
    snap = no_gpu_snapshot()
    app = make_app(sampler=ScriptedSampler(snap), history=History())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        await pilot.pause()
        grid = app.screen.query_one(GpuGridPanel)
        message = grid.query_one(".gpu-message")
        assert message.display
        assert str(message.render()) == f"No GPU: {snap.gpu_error}"
        assert not app.screen.query(GpuCardPanel)
        assert "testbox" in rendered_text(app.screen.query_one(HostPanel))
        assert "no GPU" in rendered_text(app.screen.query_one(BoxHeaderPanel))
        assert "SIMULATED" not in rendered_text(app.screen.query_one(BoxHeaderPanel))


@pilot_test
async def test_process_table_marks_pids_this_proc_cannot_see_and_flags_heat_and_throttling() -> None:
    app = make_app(sampler=ScriptedSampler(one_gpu_snapshot()), history=History())
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        await pilot.pause()
        table = app.screen.query_one(GpuProcessTable)
        assert table.row_keys == [f"0:{os.getpid()}", "0:4242424"]
        text = rendered_text(table)
        assert UNKNOWN_PID in text and "python train.py" in text and "1h06m" in text
        # One GPU fits a card: it names the real throttle reason and hides the benign gpu_idle.
        card_text = rendered_text(app.screen.query_one(GpuCardPanel))
        assert "throttle: hw_thermal_slowdown" in card_text and "gpu_idle" not in card_text
        await pilot.press("d")          # one line per GPU: the throttle shows as THR
        await pilot.pause()
        assert "THR" in rendered_text(app.screen.query_one(GpuLinesPanel))
        # A click on the second data row moves the table's cursor there.
        await pilot.click(GpuProcessTable, offset=(5, 3))
        assert table.cursor_key == "0:4242424"


@pilot_test
async def test_a_sampler_that_raises_leaves_the_app_running_and_marks_values_stale() -> None:
    good = one_gpu_snapshot(1000.0)
    sampler = HeldSampler(good, RuntimeError("NVML went away"), RuntimeError("NVML went away"), one_gpu_snapshot(1003.0))
    app = make_app(sampler=sampler, history=History(), refresh=0.05)
    seen_stale = []
    async with app.run_test(size=(100, 30)) as pilot:
        header = app.screen.query_one(BoxHeaderPanel)
        def stale_shown() -> bool:
            text = rendered_text(header)
            if "STALE" in text:
                seen_stale.append((text, app.screen.query_one(HostPanel).has_class("-stale")))
            return bool(seen_stale)
        await wait_for(pilot, stale_shown, "the header to say STALE")
        text, host_marked = seen_stale[0]
        assert "RuntimeError: NVML went away" in text and host_marked
        # The loop keeps going: the source recovers and the STALE mark goes away.
        sampler.released = True
        await wait_for(pilot, lambda: sampler.calls >= 4 and app.sample_error is None, "recovery")
        await pilot.pause()
        assert "STALE" not in rendered_text(header)
        assert app.is_running


@pilot_test
async def test_a_sampler_failing_from_the_start_shows_unavailable_not_a_crash() -> None:
    app = make_app(sampler=ScriptedSampler(OSError("psutil exploded")), history=History(), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks >= 2, "two failed ticks")
        await pilot.pause()
        grid_text = str(app.screen.query_one(GpuGridPanel).query_one(".gpu-message").render())
        assert grid_text == "GPU data unavailable: OSError: psutil exploded"
        assert "unavailable" in rendered_text(app.screen.query_one(HostPanel))
        assert "UNAVAILABLE" in rendered_text(app.screen.query_one(BoxHeaderPanel))
        assert app.is_running


@pilot_test
async def test_ticks_never_overlap_even_when_a_sample_is_slower_than_the_refresh() -> None:
    in_flight = 0
    max_in_flight = 0
    lock = threading.Lock()
    inner = make_sampler(demo=True)

    class SlowSampler:
        calls = 0
        def sample(self):
            nonlocal in_flight, max_in_flight
            with lock:
                in_flight += 1
                max_in_flight = max(max_in_flight, in_flight)
            time.sleep(0.15)      # three refresh periods: a timer-driven loop would stack ticks
            with lock:
                in_flight -= 1
            SlowSampler.calls += 1
            return inner.sample()
        def close(self):
            pass

    app = make_app(sampler=SlowSampler(), history=History(), refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks >= 4, "four ticks")
        await pilot.press("r")          # "sample now" while a tick may be in flight must not start a second one
        await wait_for(pilot, lambda: app.ticks >= 6, "six ticks")
    assert max_in_flight == 1


@pilot_test
async def test_p_pauses_sampling_and_says_so() -> None:
    app = demo_app(refresh=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.ticks >= 2, "two ticks")
        await pilot.press("p")
        await pilot.pause(0.1)
        ticks = app.ticks
        await pilot.pause(0.4)
        assert app.ticks <= ticks + 1      # at most the tick that was already out
        assert "PAUSED" in rendered_text(app.screen.query_one(BoxHeaderPanel))
        await pilot.press("p")
        await wait_for(pilot, lambda: app.ticks >= ticks + 3, "ticks to resume")


@pilot_test
async def test_d_cycles_gpu_density_between_auto_lines_and_cards() -> None:
    app = demo_app(refresh=0.05)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        grid = app.screen.query_one(GpuGridPanel)
        assert not grid.cards_mode                       # 120x36: 8 cards would crowd out the rest
        await pilot.press("d")
        assert grid.density == "lines" and not grid.cards_mode
        await pilot.press("d")
        await wait_for(pilot, lambda: len(app.screen.query(GpuCardPanel)) == 8, "8 cards")
        assert grid.density == "cards" and grid.cards_mode
        await pilot.press("d")
        assert grid.density == "auto" and not grid.cards_mode


def test_layout_choice_uses_cards_only_where_they_fit() -> None:
    assert choose_layout(8, 80, 24) == (False, 1)
    assert choose_layout(8, 200, 60) == (True, 4)
    assert choose_layout(8, 160, 50) == (True, 4)
    assert choose_layout(2, 200, 60) == (True, 2)
    assert choose_layout(8, 80, 24, "cards") == (True, 2)
    assert choose_layout(0, 200, 60) == (False, 1)


# -- theme selection: flag, config file, errors ----------------------------------------------

def test_theme_flag_beats_config_and_unknown_names_are_one_line_errors(tmp_path, monkeypatch) -> None:
    assert resolve_theme(None, None) == "gpudeck-dark"
    assert resolve_theme(None, "gpudeck-light") == "gpudeck-light"
    assert resolve_theme("gpudeck-contrast", "gpudeck-light") == "gpudeck-contrast"
    with pytest.raises(CliError) as info:
        resolve_theme("neon", None)
    assert "unknown theme 'neon'" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "gpudeck").mkdir()
    (tmp_path / "gpudeck" / "config.toml").write_text('theme = "gpudeck-light"\n')
    assert load_console_config().theme == "gpudeck-light"


def _gpudeck(*args: str, config_home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CONFIG_HOME=str(config_home), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpudeck.console", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_cli_rejects_an_unknown_theme_with_one_line(tmp_path) -> None:
    result = _gpudeck("--demo", "--theme", "neon", config_home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("gpudeck: unknown theme 'neon' (--theme)")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_cli_names_a_broken_config_file_in_one_line(tmp_path) -> None:
    (tmp_path / "gpudeck").mkdir()
    (tmp_path / "gpudeck" / "config.toml").write_text('theme = "gpudeck-light\n')
    result = _gpudeck("--demo", config_home=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"gpudeck: {tmp_path / 'gpudeck' / 'config.toml'}: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    (tmp_path / "gpudeck" / "config.toml").write_text('theme = "sepia"\n')
    result = _gpudeck("--demo", config_home=tmp_path)
    assert result.returncode == 2 and "unknown theme 'sepia' (config.toml theme)" in result.stderr


# -- the real thing: `gpudeck` in a pseudo-terminal ------------------------------------------

def _run_in_pty(args: list[str], wanted: list[bytes], tmp_path: Path) -> tuple[int, bytes]:
    """Start `python -m gpudeck.console ARGS` on a real pty, wait until every `wanted` text was drawn,
    press q, and return (exit status, everything written to the terminal)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    pid, master = pty.fork()
    if pid == 0:
        env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO), XDG_CONFIG_HOME=str(tmp_path))
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "gpudeck.console", *args], env)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
    output = b""
    status = None
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and not all(w in output for w in wanted):
            if select.select([master], [], [], 0.2)[0]:
                output += os.read(master, 65536)
        drawn = all(w in output for w in wanted)
        os.write(master, b"q")
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    output += os.read(master, 65536)
                except OSError:       # the console exited: the pty closed
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(master)
    assert status is not None, f"gpudeck did not exit after q; saw {output[-2000:]!r}"
    assert drawn, f"never drew {[w for w in wanted if w not in output]}; saw {output[-2000:]!r}"
    return os.waitstatus_to_exitcode(status), output


def test_gpudeck_opens_the_demo_console_in_a_real_terminal_and_q_quits(tmp_path) -> None:
    code, output = _run_in_pty(["--demo"], [b"SIMULATED", b"h200-sim-01", b"GPUs (8)"], tmp_path)
    assert code == 0
    assert b"SIMULATED" in output and b"Traceback" not in output


def test_gpudeck_opens_on_this_machine_and_shows_its_gpus_or_why_not(tmp_path) -> None:
    # Live sampler: NVML, psutil, sockets. Without a driver the GPU area says why.
    import socket
    code, output = _run_in_pty([], [b"host \xc2\xb7 " + socket.gethostname().encode()[:20]], tmp_path)
    assert code == 0 and b"Traceback" not in output
    assert b"No GPU: " in output or b"GPUs (" in output
    assert b"SIMULATED" not in output


@pilot_test
async def test_a_tick_that_lands_with_no_screen_on_the_stack_is_dropped_not_a_crash() -> None:
    # Seen under load: a worker's SamplesCollected arrived while the app was shutting down
    # (screen stack already empty) and took the app down with ScreenStackError.
    app = demo_app(refresh=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, "a first sample")
        stack = app._screen_stacks[app._current_mode]
        saved = list(stack)
        stack.clear()
        try:
            app._push_telemetry()           # must not raise ScreenStackError
        finally:
            stack.extend(saved)
        assert app.is_running
    app._push_telemetry()                   # after shutdown: no subscriber runs, nothing raises


@pilot_test
async def test_a_tick_that_lands_before_a_screens_widgets_mount_reaches_them_once_mounted() -> None:
    # Seen under load: the first SamplesCollected arrived between the screen's creation and
    # the mounting of its widgets, and query_one(BoxHeaderPanel) took the app down. Widgets now
    # subscribe when they mount and start from the feed's latest value.
    app = demo_app(start_sampling=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.snapshot = app.sampler.sample()
        screen = DashboardScreen()
        app.push_screen(screen)
        app._push_telemetry()               # same step as the push: nothing of the screen is mounted yet
        await wait_for(pilot, lambda: screen.is_mounted and screen.query(BoxHeaderPanel)
                       and screen.query_one(BoxHeaderPanel).view is not None, "the header shows the tick")
        assert "h200-sim-01" in "".join(str(p) for p in screen.query_one(BoxHeaderPanel).parts())
        assert screen.query_one(HostPanel).host is not None
        assert app.is_running


def test_host_cores_labelled_up_to_eight_and_one_glyph_row_for_sixteen() -> None:
    from gpudeck.console.widgets.host_panel import host_lines
    from gpudeck.console.widgets.strip_painter import plain

    def core_rows(n: int) -> list[str]:
        h = HostSample(name="box", cpu_percent=50.0, cpu_per_core=tuple(float(6 * i) for i in range(n)), cpu_count=n,
                       load_avg=(1.0, 1.0, 1.0), mem_used=1 << 30, mem_total=8 << 30)
        return [plain(line) for line in host_lines(h, 56, "")[1:-2]]

    eight = core_rows(8)
    assert "c7 " in "".join(eight) and len(eight) == 3           # three labelled bars a row
    sixteen = core_rows(16)
    assert len(sixteen) == 1 and sixteen[0].startswith("core ")  # one glyph per core, one line
    assert sixteen[0][5:] == "▁▁▁▂▂▃▃▄▄▅▅▆▆▇▇█"            # 0 % .. 90 %, 8 levels
