"""The Textual console: the app, its sampling loop, its views and keys, and how `gpudeck` opens it."""
from __future__ import annotations

import argparse
import asyncio
import contextvars
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from gpudeck.jobs.telemetry.snapshot import Snapshot
from gpudeck.jobs.watch import JobsWatcher, live_jobs_note

from gpudeck.console.config import load_console_config
from gpudeck.console.format import safe_text
from gpudeck.console.errors import CliError
from gpudeck.console.messages import SampleFailed, SamplesCollected
from gpudeck.console.sampling import SamplingThread
from gpudeck.console.screens.dashboard import DashboardScreen
from gpudeck.console.screens.help import HelpScreen
from gpudeck.console.feeds import Feed, JobsFeed, JobsSource, LiveJobsSource
from gpudeck.console.screens.history import HistoryScreen
from gpudeck.console.screens.hosts import HostsScreen
from gpudeck.console.screens.jobs import JobsScreen
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.themes import DEFAULT_THEME, GPUDECK_THEMES, THEME_CYCLE, is_known_theme, next_theme, unknown_theme

if TYPE_CHECKING:                  # imported where first used: the hosts view, a replay, make_app's defaults
    from gpudeck.console.boxes import BoxLink
    from gpudeck.jobs.box import Box
    from gpudeck.console.hosts_feed import HostsFeed
    from gpudeck.jobs.hosts.fleet import Fleet
    from gpudeck.jobs.replay import ReplaySession
    from gpudeck.jobs.telemetry.history import History
    from gpudeck.jobs.telemetry.sampler import Sampler

# The views, in the order of their number keys. A new view (the jobs screen…) adds one
# entry here: (mode name, key, title, screen class). The app binds the key and switches mode.
VIEWS: list[tuple[str, str, str, type[Screen]]] = [
    ("dashboard", "1", "Dashboard", DashboardScreen),
    ("jobs", "2", "Jobs", JobsScreen),
    ("history", "3", "History", HistoryScreen),
    ("hosts", "4", "Hosts", HostsScreen),
]

CONSOLE_QUERY_TIMEOUT_S = 10.0   # a remote box's answer to one view's query (history, post-mortem…)
HISTORY_CAPACITY = 900   # 15 minutes at the default 1 s refresh: more than the 10 the issue asks


def quiet_driver_class(chosen: type) -> type:
    """Textual's Linux driver swapped for ours (same terminal handling, an input thread that sleeps)."""
    if not sys.platform.startswith("linux"):
        return chosen
    from textual.drivers.linux_driver import LinuxDriver
    if chosen is not LinuxDriver:           # $TEXTUAL_DRIVER or another platform's choice: leave it
        return chosen
    from gpudeck.console.terminal import QuietLinuxDriver
    return QuietLinuxDriver


class GpuDeckApp(App[int]):
    TITLE = "gpudeck"
    CSS = """
    Screen { background: $background; }
    """

    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("t", "cycle_theme", "Theme", id="app.theme.cycle"),
        Binding("r", "sample_now", "Refresh", id="app.sample.now"),
        Binding("p", "toggle_pause", "Pause", id="app.sample.pause"),
        # Not in the footers (their snapshots stay as they are); `?` lists them.
        Binding("b", "pick_box", "Switch box", show=False, id="app.box.pick", tooltip="show another box: local or a hosts.toml host"),
        Binding("colon", "prompt", "Command (box NAME)", key_display=":", show=False, id="app.prompt",
                tooltip="`box NAME` (k9s's :ctx), or a view: dashboard, jobs, history, hosts"),
        *[
            Binding(key, f"show_view('{mode}')", title, show=len(VIEWS) > 1, id=f"app.view.{mode}")
            for mode, key, title, _ in VIEWS
        ],
    ]

    MODES = {mode: screen for mode, _, _, screen in VIEWS}
    jobs_file: Optional[str] = None        # --jobs FILE; the jobs view resolves it like the CLI does
    demo_replay = False                    # --demo: the jobs view replays the bundled SIMULATED runs
    readonly: Optional[str] = None         # what made the console watch-only (--readonly…); None: it may act
    DEFAULT_MODE = VIEWS[0][0]

    def __init__(
        self,
        sampler: Sampler,
        *,
        theme: str = DEFAULT_THEME,
        refresh: float = 1.0,
        history: Optional[History] = None,
        start_sampling: bool = True,
    ) -> None:
        super().__init__()
        self.driver_class = quiet_driver_class(self.driver_class)
        for definition in GPUDECK_THEMES.values():
            self.register_theme(definition)
        self.theme = theme
        self.sampler = sampler
        self._local_sampler = sampler      # this machine's: kept while another box is shown, to come back to
        self.refresh_s = refresh
        self.history = history
        self.start_sampling = start_sampling
        self.snapshot: Optional[Snapshot] = None
        self.sample_error: Optional[str] = None
        self.paused = False
        self.ticks = 0                     # completed ticks, good or failed (tests wait on it)
        self._sampling = False             # a one-off sample is being taken off the UI thread
        self._sampling_thread: Optional[SamplingThread] = None
        # The push paths: widgets follow these instead of the app walking its screens.
        self.telemetry_feed: Feed[TelemetryView] = Feed(self, "telemetry")
        self._jobs_feed: Optional[JobsFeed] = None
        self._hosts_feed: Optional[HostsFeed] = None
        self.host_specs: Optional[list] = None     # None: read hosts.toml when the hosts view opens
        self._box: Optional[Box] = None            # the box every view shows and acts on (see `box`)
        self._box_link: Optional[BoxLink] = None   # a remote box's one delta poll (telemetry and jobs)
        self._fleet: Optional[Fleet] = None        # every remote host's polling: the box's and the hosts view's
        self.box_feed: Feed[Box] = Feed(self, "box")
        self._local_last: tuple = (None, None)     # this machine's last snapshot and jobs, while another box is shown
        self.initial_box: Optional[str] = None     # --host NAME: the console opens on that box
        self.initial_host: Optional[str] = None    # the hosts view opens on this host's tab

    @property
    def box(self) -> Box:
        """The box the console shows and acts on: this machine (with --jobs) until another is chosen.
        Views read and act through it, never through the core directly; calls block (run them in workers)."""
        if self._box is None:
            from gpudeck.jobs.box.local import LocalBox
            self._box = LocalBox(jobs_file=self.jobs_file)
        return self._box

    @property
    def jobs_feed(self) -> JobsFeed:
        """Job snapshots for the jobs view: live from --jobs (in --demo the demo's recordings, never live
        jobs) unless a replay set its own feed first.
        Made on first use (--jobs is known by then); polling starts when a view first follows it."""
        if self._jobs_feed is None:
            self._jobs_feed = JobsFeed(self, self._home_source())
        return self._jobs_feed

    @jobs_feed.setter
    def jobs_feed(self, feed: JobsFeed) -> None:
        self._jobs_feed = feed

    def _home_source(self) -> JobsSource:
        """What the jobs view shows when it replays nothing chosen: the jobs file's live jobs, or in
        --demo the bundled recordings. A demo never gets a live source: its jobs file's jobs are real
        ones (`s` would start them, their on_alert would post), and the screen says SIMULATED."""
        if self.demo_replay:
            return self._demo_source()
        if self._box_link is not None:
            from gpudeck.console.boxes import RemoteJobsSource
            return RemoteJobsSource(self.box, self._box_link, self._poll_interval())
        return LiveJobsSource(JobsWatcher(self.jobs_file), lambda: max(0.5, float(self.refresh_s or 1.0)),
                              box=self.box)

    def _poll_interval(self) -> float:
        return max(0.5, float(self.refresh_s or 1.0))

    @property
    def fleet(self) -> Fleet:
        """The console's one Fleet (made and started on first use, closed on unmount): the shown remote
        box and every host of the hosts view are polled through it, so a host both show is polled once
        a round over one SSH link. Which hosts it polls:

        - the box shown, while it is shown;
        - once the hosts view has been opened, every hosts.toml host, until the console quits.

        So switching away from a box stops its polling only if the hosts view was never opened."""
        if self._fleet is None:
            from gpudeck.jobs.hosts.fleet import Fleet
            self._fleet = Fleet([], interval=self._poll_interval()).start()
        return self._fleet

    def _release_host(self, link: Optional[BoxLink]) -> None:
        """UI thread, on a switch: the box left stops being polled unless the hosts view still shows it
        (`fleet`'s rule). Never blocks: its link closes on the fleet's loop."""
        fleet = self._fleet
        if link is None or fleet is None:
            return
        if getattr(link, "fleet", None) is not self._fleet:      # a link with a Fleet of its own
            return
        if link.name == getattr(self._box_link, "name", None):
            return
        if self._hosts_feed is not None and self._hosts_feed.watches(link.name):
            return
        fleet.unwatch(link.name)

    # -- the box: which machine every view shows and acts on ----------------------------------------
    @property
    def local_snapshot(self) -> Optional[Snapshot]:
        """This machine's latest telemetry: the live one, or (another box shown) the last one before the switch."""
        return self.snapshot if self.box.local else self._local_last[0]

    @property
    def local_jobs(self) -> Any:
        """This machine's latest JobsSnapshot, as local_snapshot."""
        if self.box.local:
            return self._jobs_feed.latest if self._jobs_feed is not None else None
        return self._local_last[1]

    @property
    def local_error(self) -> Optional[str]:
        """Why this machine's figures are not live (its own sampling failed, or another box is shown)."""
        if self.box.local:
            return self.sample_error
        return f"not sampled while the console shows box {self.box.name} (b to come back)"

    def box_specs(self) -> list:
        """local, then every hosts.toml host (--demo: local only; a broken hosts.toml: local, and why)."""
        from gpudeck.jobs.hosts.config import HostSpec
        if self.host_specs is not None:
            specs = list(self.host_specs)
        elif self.demo_replay:
            specs = []
        else:
            from gpudeck.jobs.hosts.config import HostConfigError, load_hosts
            try:
                specs = list(load_hosts().values())
            except HostConfigError as exc:
                self.notify(safe_text(str(exc), 400), severity="error", timeout=10, markup=False)
                specs = []
        if not any(spec.local for spec in specs):
            specs.insert(0, HostSpec("local"))
        return specs

    def box_link_state(self, spec: Any) -> str:
        """LIVE / STALE / DOWN / CONNECTING for a box whose link is watched (this one, or the hosts view's);
        "LIVE" for local (sampled here); "not watched" otherwise (opening it connects)."""
        name = spec.name
        if spec.local:
            return "LIVE"
        if self._box_link is not None and self._box_link.name == name:
            return self._box_link.view().state
        view = self._fleet.view(name) if self._fleet is not None else None
        return view.state if view is not None else "not watched"

    def switch_box(self, name: str) -> bool:
        """Show box `name` ("local" or a hosts.toml host) in every view: its telemetry, its jobs, its
        actions. A remote box is polled once a second with deltas (status and jobs in one round trip),
        through the app's one `fleet` (its hosts-view row reads the same poll; `fleet` says when it stops).
        False (and a notice) for a name that is no box."""
        name = (name or "").strip()
        if name == self.box.name:
            self.notify(f"already showing box {name}", timeout=2, markup=False)
            return True
        specs = {spec.name: spec for spec in self.box_specs()}
        spec = specs.get(name)
        if spec is None:
            self.notify(safe_text(f"no box named {name!r} (boxes: {', '.join(specs)})", 400),
                        severity="error", timeout=6, markup=False)
            return False
        old_box, old_link = self._box, self._box_link
        if self.box.local:                     # what the hosts view's local row keeps showing meanwhile
            self._local_last = (self.snapshot, self._jobs_feed.latest if self._jobs_feed is not None else None)
        if spec.local:
            from gpudeck.jobs.box.local import LocalBox
            box: Box = LocalBox(jobs_file=self.jobs_file, name=spec.name)
            link: Optional[BoxLink] = None
            sampler: Sampler = self._local_sampler
        else:
            import dataclasses

            from gpudeck.console.boxes import BoxLink, RemoteSampler
            from gpudeck.jobs.box.remote import RemoteBox
            if self.readonly and not spec.readonly:
                spec = dataclasses.replace(spec, readonly=True)   # its agent refuses to act, whatever is sent
            # A view's query waits 10 s, not a CLI command's 60: a box gone silent says so in every view soon.
            box = RemoteBox(spec, query_timeout_s=CONSOLE_QUERY_TIMEOUT_S)
            link = BoxLink(spec, self._poll_interval(), fleet=self.fleet).start()
            sampler = RemoteSampler(link)  # type: ignore[assignment]
        self._box, self._box_link = box, link
        self.sampler = sampler
        # Another box's figures are not this one's: no last snapshot, a history of its own.
        self.snapshot, self.sample_error = None, None
        if self.history is not None:
            from gpudeck.jobs.telemetry.history import History
            self.history = History(capacity=HISTORY_CAPACITY)
        if self._sampling_thread is not None:
            self._sampling_thread.set_sample(sampler.sample)
        elif self.is_running and self.start_sampling:
            self.action_sample_now()
        if self._jobs_feed is not None:
            self._jobs_feed.switch(self._home_source())
        self.initial_host = None if spec.local else spec.name     # the hosts view opens on its tab
        self._push_telemetry()
        self.box_feed.publish(box)
        self.notify(f"box: {name}" + ("" if spec.local else " (over SSH)"), timeout=2, markup=False)
        self._release_host(old_link)
        self._let_go(old_box, old_link)
        return True

    def _let_go(self, box: Optional[Box], link: Optional[BoxLink]) -> None:
        """Close a box's link off the UI thread (a wedged one takes seconds); its jobs are never touched."""
        if box is None and link is None:
            return
        import threading

        def close() -> None:
            for part in (link, box):
                if part is not None:
                    try:
                        part.close()
                    except Exception:  # noqa: BLE001 - a dead link must not fail the switch
                        pass
        threading.Thread(target=close, name="gpudeck-box-close", daemon=True).start()

    def action_pick_box(self) -> None:
        from gpudeck.console.screens.box_picker import BoxPickerScreen
        if isinstance(self.screen, BoxPickerScreen):
            self.screen.dismiss(None)
            return
        rows = [(spec.name, spec.ssh, self.box_link_state(spec)) for spec in self.box_specs()]

        def picked(name: Optional[str]) -> None:
            if name:
                self.switch_box(name)
        self.push_screen(BoxPickerScreen(rows, current=self.box.name), picked)

    def action_prompt(self) -> None:
        from gpudeck.console.screens.box_picker import PromptScreen
        if isinstance(self.screen, PromptScreen):
            return
        self.push_screen(PromptScreen(), self.run_prompt)

    def run_prompt(self, line: Optional[str]) -> None:
        """A `:` command: `box NAME` (also `ctx NAME`, k9s's word), `box` alone for the picker, or a view."""
        words = (line or "").split()
        if not words:
            return
        verb, rest = words[0].lower(), words[1:]
        if verb in ("box", "ctx", "context", "host"):
            if rest:
                self.switch_box(rest[0])
            else:
                self.action_pick_box()
            return
        for mode, _, title, _ in VIEWS:
            if verb in (mode, title.lower()):
                self.action_show_view(mode)
                return
        self.notify(safe_text(f"unknown command {line!r}: try `box NAME` or a view "
                              f"({', '.join(mode for mode, _, _, _ in VIEWS)})", 300),
                    severity="warning", timeout=4, markup=False)

    def _demo_source(self) -> JobsSource:
        from gpudeck.console.replay import NoJobsSource, ReplayJobsSource
        from gpudeck.jobs.replay import demo_session
        try:
            return ReplayJobsSource(demo_session(), demo=True)
        except Exception as exc:      # recordings missing from the install: no jobs, and why (never live ones)
            reason = f"demo recordings unavailable: {exc}"
            self.notify(reason, severity="warning", timeout=6, markup=False)
            return NoJobsSource(reason)

    # -- replay: the jobs view driven by recorded runs through the same feed --------------------------
    def replay_runs(self, paths: Sequence[Path]) -> None:
        """Play these run directories in the jobs view (opened off the UI thread: big runs take a moment)."""
        self.notify(f"opening the replay of {len(paths)} run{'s' if len(paths) != 1 else ''}…", timeout=2)
        self._open_replay([Path(p) for p in paths])

    @work(thread=True, exclusive=True, group="replay-open", exit_on_error=False)
    def _open_replay(self, paths: list[Path]) -> None:
        from gpudeck.console.replay import open_session
        try:
            session = open_session(paths)
        except Exception as exc:       # a deleted or unreadable run: one line, the view stays as it was
            self.call_from_thread(self.notify, f"cannot replay: {exc}", severity="error", timeout=6, markup=False)
            return
        self.call_from_thread(self._start_replay, session)

    def _start_replay(self, session: ReplaySession) -> None:
        from gpudeck.console.replay import ReplayJobsSource
        self.jobs_feed.switch(ReplayJobsSource(session))
        if self.current_mode != "jobs":
            self.switch_mode("jobs")

    @property
    def replaying(self) -> bool:
        return hasattr(self.jobs_feed.source, "session")

    def leave_replay(self) -> None:
        """Back to the live jobs of the jobs file; in --demo back to the demo's own recordings."""
        if not self.replaying:
            return
        if not self.demo_replay:
            self.jobs_feed.switch(self._home_source())
            self.notify("live jobs", timeout=2)
        elif getattr(self.jobs_feed.source, "demo", False):
            self.notify("demo: the recorded runs are all it shows (q quits)", timeout=3)
        else:
            self.jobs_feed.switch(self._home_source())
            self.notify("demo: back to the four recorded runs", timeout=2)

    @property
    def hosts_feed(self) -> HostsFeed:
        """Every host's overview row (remote ones polled over SSH by the core's Fleet, started on first follow)."""
        if self._hosts_feed is None:
            from gpudeck.console.hosts_feed import HostsFeed
            specs = self.host_specs
            if specs is None and self.demo_replay:
                specs = []            # a demo reaches no real host: hosts.toml's would be polled and acted on
            if specs is None:
                from gpudeck.jobs.hosts.config import HostConfigError, load_hosts
                try:
                    specs = list(load_hosts().values())
                except HostConfigError as exc:
                    self.notify(safe_text(str(exc), 400), severity="error", timeout=10, markup=False)
                    specs = []
            if self.readonly:
                import dataclasses
                # Every host is reached through an agent started read-only: it refuses to act on its own.
                specs = [dataclasses.replace(spec, readonly=True) for spec in specs]
            self._hosts_feed = HostsFeed(self, specs, max(0.5, float(self.refresh_s or 1.0)))
        return self._hosts_feed

    def on_unmount(self) -> None:
        if self._sampling_thread is not None:
            self._sampling_thread.stop()      # before the sampler is closed (run_console closes it)
        if self._hosts_feed is not None:
            self._hosts_feed.close()
        if self._box_link is not None:
            self._box_link.close()
            if self.sampler is not self._local_sampler:
                self.sampler = self._local_sampler       # run_console closes the one it made
        if self._fleet is not None:
            self._fleet.close()                           # every link, the box's and the hosts view's

    # -- sampling loop -----------------------------------------------------------------------

    def on_mount(self) -> None:
        if self.start_sampling:
            # The app's context: the callbacks it schedules read the active app from it, as Textual's own do.
            self._sampling_thread = SamplingThread(
                self.sampler.sample, self._show_sample, asyncio.get_running_loop(), contextvars.copy_context(),
                lambda: self.refresh_s, lambda: self.paused)
            self._sampling_thread.start()
        if self.demo_replay:
            self.notify("SIMULATED box. Press 2: the jobs view replays four recorded runs — an engine loading, "
                        "a relaunch that crashes, a build heading for OOM, a deadlocked engine.",
                        title="gpudeck --demo", timeout=12, markup=False)
        if self.readonly and not self.demo_replay:
            self.notify(f"read-only ({self.readonly}): nothing here starts, stops, restarts or pivots a job",
                        title="gpudeck --readonly", timeout=8, markup=False)
        self.box_feed.publish(self.box)
        if self.initial_box and self.initial_box != self.box.name:
            self.switch_box(self.initial_box)
        elif self.initial_host:
            self.switch_mode("hosts")

    def _show_sample(self, snapshot: Optional[Snapshot], error: Optional[str]) -> None:
        """UI thread: the sampling thread's result, shown; then the thread may take the next one."""
        try:
            if error is not None:
                self._sample_failed(error)
            elif snapshot is not None:
                self._sample_collected(snapshot)
            else:                              # a sampler that returned nothing: a failed tick, not a crash
                self._sample_failed("the sampler returned no snapshot")
        except Exception as exc:  # noqa: BLE001 - a bug in a panel: exit with its traceback, as a handler's would
            self._handle_exception(exc)
        finally:
            if self._sampling_thread is not None:
                self._sampling_thread.shown()

    async def _sample_once(self) -> None:
        self._sampling = True
        try:
            snapshot = await asyncio.get_running_loop().run_in_executor(None, self.sampler.sample)
        except Exception as exc:  # a broken source must show as stale data, never end the app
            self._sample_failed(f"{type(exc).__name__}: {exc}")
        else:
            self._sample_collected(snapshot)
        finally:
            self._sampling = False

    # The same facts as messages, for whoever samples elsewhere (tests, a replay of samples).
    def on_samples_collected(self, message: SamplesCollected) -> None:
        self._sample_collected(message.snapshot)

    def on_sample_failed(self, message: SampleFailed) -> None:
        self._sample_failed(message.error)

    def _sample_collected(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.sample_error = None
        if self.history is not None:
            self.history.add(snapshot)
        self._tick_done()

    def _sample_failed(self, error: str) -> None:
        self.sample_error = error
        self._tick_done()

    def _tick_done(self) -> None:
        self.ticks += 1
        self._push_telemetry()

    @property
    def telemetry(self) -> TelemetryView:
        return TelemetryView(
            snapshot=self.snapshot,
            history=self.history,
            stale=self.sample_error is not None and self.snapshot is not None,
            error=self.sample_error,
            paused=self.paused,
            refresh_s=self.refresh_s,
        )

    def _push_telemetry(self) -> None:
        self.telemetry_feed.publish(self.telemetry)

    # -- actions ----------------------------------------------------------------------------

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        # gpudeck's own keys (those with an id: app, then view) first; Textual's generic ones after.
        # Keys sharing an action (q and ctrl+q both quit) share a line: "q, ^q  Quit".
        by_action: dict[tuple[int, str, str], list[str]] = {}
        for active in self.screen.active_bindings.values():
            binding = active.binding
            if binding.description:
                rank = (0 if binding.id else 3) + (0 if active.node is self else 1 if active.node is self.screen else 2)
                by_action.setdefault((rank, binding.action, binding.description), []).append(self.get_key_display(binding))
        keys = [(", ".join(dict.fromkeys(displays)), description)
                for (_, _, description), displays in sorted(by_action.items(), key=lambda item: item[0][0])]
        self.push_screen(HelpScreen(keys))

    def action_cycle_theme(self) -> None:
        self.set_theme(next_theme(self.theme))

    def set_theme(self, name: str) -> None:
        self.theme = name
        self.notify(f"theme: {name}", timeout=2, markup=False)

    def action_sample_now(self) -> None:
        if self._sampling_thread is not None:
            self._sampling_thread.wake()   # a sample now, or right after the one under way
        elif not self._sampling:
            # Textual's WorkType union (coroutine function | function | awaitable) leaves mypy inferring
            # Never for the result of an async method.
            self.run_worker(self._sample_once, group="sampling-once", exit_on_error=False)  # type: ignore[arg-type]

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused and self._sampling_thread is not None:
            self._sampling_thread.wake()
        self._push_telemetry()

    def action_show_view(self, mode: str) -> None:
        if mode != self.current_mode:
            self.switch_mode(mode)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for name in THEME_CYCLE:
            yield SystemCommand(f"Theme: {name}", f"Switch the console to the {name} theme",
                                lambda name=name: self.set_theme(name))
        for mode, key, title, _ in VIEWS:
            yield SystemCommand(f"View: {title}", f"Show the {title.lower()} (key {key})",
                                lambda mode=mode: self.action_show_view(mode))
        for spec in self.box_specs():
            where = "this machine" if spec.local else f"over SSH ({spec.ssh})"
            yield SystemCommand(f"Box: {spec.name}", f"Show and act on box {spec.name}, {where}",
                                lambda name=spec.name: self.switch_box(name))
        yield SystemCommand("Sample now", "Take a telemetry sample immediately", self.action_sample_now)
        yield SystemCommand("Pause / resume sampling", "Freeze the display, or resume live updates",
                            self.action_toggle_pause)


def make_app(
    sampler: Optional[Sampler] = None,
    theme: str | None = None,
    refresh: float = 1.0,
    *,
    demo: bool = False,
    seed: int = 0,
    history: Optional[History] = None,
    start_sampling: bool = True,
    jobs_file: Optional[str] = None,
    demo_replay: bool = False,
    readonly: Optional[str] = None,
) -> GpuDeckApp:
    """The app factory that `gpudeck` and the tests share (no sampler given: build the real or demo one)."""
    if sampler is None:
        from gpudeck.jobs.telemetry.sampler import make_sampler
        sampler = make_sampler(demo=demo, seed=seed)
    if history is None:
        from gpudeck.jobs.telemetry.history import History
        history = History(capacity=HISTORY_CAPACITY)
    app = GpuDeckApp(sampler, theme=theme or DEFAULT_THEME, refresh=refresh,
                     history=history, start_sampling=start_sampling)
    app.jobs_file = jobs_file
    app.demo_replay = demo_replay
    app.readonly = readonly
    return app


def resolve_theme(cli_theme: str | None, config_theme: str | None) -> str:
    """--theme beats the config file beats the default; an unknown name is a one-line CLI error."""
    for source, name in (("--theme", cli_theme), ("config.toml theme", config_theme)):
        if name is None:
            continue
        if not is_known_theme(name):
            raise CliError(unknown_theme(name, source), code=2)
        return name
    return DEFAULT_THEME


def run_console(args: argparse.Namespace) -> int:
    """`gpudeck` with no subcommand: open the console on this box (or the simulated one with --demo)."""
    config = load_console_config()
    theme = resolve_theme(getattr(args, "theme", None), config.theme)
    from gpudeck.console.readonly import readonly_source
    readonly = readonly_source(args)
    refresh = float(getattr(args, "refresh", 1.0) or 1.0)
    if not 0.05 <= refresh <= 3600:
        raise CliError(f"--refresh must be between 0.05 and 3600 seconds, got {refresh:g}", code=2)
    from gpudeck.jobs.telemetry.sampler import make_sampler
    sampler = make_sampler(demo=bool(getattr(args, "demo", False)))
    try:
        app = make_app(sampler=sampler, theme=theme, refresh=refresh,
                       jobs_file=getattr(args, "jobs_file", None), demo_replay=bool(getattr(args, "demo", False)),
                       readonly=readonly)
        from gpudeck.console.commands._host import host_spec
        spec = host_spec(args)          # --host / $GPUDECK_HOST: a bad name is one line before the app opens
        if not spec.local:
            app.initial_box = spec.name     # the whole console on that box (`b` or `:box NAME` switches)
        result = app.run()
        # Invariant 1: quitting never stops a job, and the operator is told what still runs.
        note = live_jobs_note(app.jobs_file)
        if note:
            print(note)
    finally:
        sampler.close()
    return int(result or app.return_code or 0)
