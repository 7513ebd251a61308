"""The jobs view: every job of jobs.toml with state and health, the keys that act on them, and their logs."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.cells import cell_len
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Footer, Static

from gpudeck.console.compositor import DeckScreen

from gpudeck.console.format import safe_text
from gpudeck.console.readonly import READ_ONLY, actions_off, refusal
from gpudeck.console.screens.confirm import ConfirmScreen
from gpudeck.console.screens.stacks import StacksScreen
from gpudeck.console.widgets.border_titles import set_border_titles
from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
from gpudeck.console.widgets.engine_panel import EnginePanel
from gpudeck.console.widgets.log_view import LogView, LogViewPane
from gpudeck.console.widgets.replay_bar import ReplayBar
from gpudeck.console.boxes import box_stacks, is_remote_log_ref
from gpudeck.console.feeds import JobsFeed, LiveJobsSource
from gpudeck.jobs.view import COLUMNS as VIEW_COLUMNS
from gpudeck.jobs.view import STATE_WORDS, JobsSnapshot, JobView
from gpudeck.jobs.watch import JobsWatcher

# Style per health level, by theme variable, so every theme colours the same meaning.
# (DataTable measures Rich renderables: the variables are resolved to colours per refresh.)
# A remote run's log pane starts from its last lines (not the whole log over SSH), then follows by offset;
# each read waits on the box this long for new bytes.
REMOTE_LOG_TAIL = 2000
REMOTE_LOG_WAIT_S = 2.0

HEALTH_STYLES = {
    "ok": "$success",
    "idle": "dim",
    "warning": "$warning",
    "stalled": "bold reverse $warning",
    "failed": "bold $error",
}


def resolve_style(style: str, variables: dict[str, str]) -> str:
    """'bold $error' -> 'bold #F7768E' with the app's current theme variables."""
    words = []
    for word in style.split():
        if word.startswith("$"):
            value = variables.get(word[1:], "")
            if not value.startswith("#"):
                continue
            word = value
        words.append(word)
    return " ".join(words)


# -- the table's columns for a width ---------------------------------------------------------------

@dataclass(frozen=True)
class TableColumn:
    key: str
    label: str
    width: int              # cells of text; each cell also carries CELL_GAP trailing blanks


@dataclass(frozen=True)
class TableLayout:
    columns: tuple[TableColumn, ...]
    compact: bool           # narrow: see JobView.progress_text


CELL_GAP = 1                # inside the cell, so a row's health style spans the row without gaps
PHASE_KEY = "phase"
# (key, cap on its width, priority): lower priority goes first when the width runs short,
# and goes when "phase / progress" would get fewer than `keep_while_phase` cells.
TABLE_COLUMNS = (
    ("name", 24, None),
    ("kind", 8, 4),
    ("state", 10, None),
    ("runtime", 8, 9),
    ("pid", 8, 3),
    ("run", 24, 1),
    ("port", 11, 8),
    ("gpus", 9, 6),
    ("exit", 8, 7),
    ("alerts", 24, 2),
    ("serving", 34, 0),
    ("slurm", 30, 5),
    (PHASE_KEY, None, None),     # last: it takes what is left
)
LABELS = dict(VIEW_COLUMNS)
KEEP_WHILE_PHASE = {"kind": 28, "gpus": 16, "exit": 14, "port": 14, "runtime": 12, "pid": 40, "alerts": 40,
                    "run": 40, "serving": 40, "slurm": 30}
COMPACT_BELOW = 110         # table widths under this leave out a phase that repeats the state


def table_layout(jobs: list[JobView], now: float, width: int) -> TableLayout:
    """Columns that fit `width` cells: low-value ones dropped first, "phase / progress" takes the rest."""
    compact = width < COMPACT_BELOW
    texts = [job.cells(now, compact) for job in jobs]

    def needed(key: str, cap: int) -> int:
        longest = max([cell_len(LABELS[key])] + [cell_len(t[key]) for t in texts])
        if key == "state":
            longest = max([longest] + [len(word) for word in STATE_WORDS])
        return min(longest, cap)

    sized = {key: needed(key, cap) for key, cap, _ in TABLE_COLUMNS if cap is not None}
    # A column with nothing in any row (serving on a box without engines, slurm without Slurm jobs) takes no room.
    kept = {key for key, cap, _ in TABLE_COLUMNS
            if key not in ("serving", "slurm") or any(t[key] for t in texts)}

    def phase_width() -> int:
        used = sum(sized[key] + CELL_GAP for key in kept if key != PHASE_KEY)
        return width - used - CELL_GAP

    for key, _, _priority in sorted((c for c in TABLE_COLUMNS if c[2] is not None), key=lambda c: c[2]):
        if phase_width() < KEEP_WHILE_PHASE[key]:
            kept.discard(key)
    columns = tuple(TableColumn(key, LABELS[key], sized[key] if key != PHASE_KEY else max(1, phase_width()))
                    for key, _, _ in TABLE_COLUMNS if key in kept)
    return TableLayout(columns, compact)


def fitted(text: str, width: int, style: str = "") -> Text:
    """`text` cut with an ellipsis or padded to `width`, plus the gap, all in `style`."""
    cell = Text(text, style=style, no_wrap=True)
    cell.truncate(width, overflow="ellipsis", pad=True)
    cell.append(" " * CELL_GAP)
    return cell


def layout_cells(job: JobView, now: float, layout: TableLayout, variables: Optional[dict[str, str]] = None) -> list[Text]:
    style = resolve_style(HEALTH_STYLES[job.health], variables or {})
    # The phase column's own width: its label is shortened to fit, so the numbers and the ETA stay whole.
    phase_width = next((column.width for column in layout.columns if column.key == PHASE_KEY), None)
    texts = job.cells(now, layout.compact, phase_width)
    return [fitted(texts[column.key], column.width, style) for column in layout.columns]


def banner_lines(jobs: list[JobView], now: float) -> list[str]:
    return [line for job in jobs for line in job.notice_lines(now)]


# -- messages: facts the workers report --------------------------------------------------------

class JobActionFinished(Message):
    """start/stop/restart/pivot ended: `lines` say what happened; `ok` False is an error."""

    def __init__(self, job: str, action: str, ok: bool, lines: list[str]) -> None:
        super().__init__()
        self.job = job
        self.action = action
        self.ok = ok
        self.lines = lines


@dataclass
class StopPlan:
    job: str
    run_id: Optional[str]
    pgid: Optional[int]
    processes: list[tuple[int, str]]       # (pid, command line)
    how: str = ""                          # the signal line: "SIGTERM to the group, SIGKILL after 10s."
    where: str = ""                        # " on NAME" for a remote box


class StopPlanned(Message):
    def __init__(self, plan: StopPlan, restart: bool) -> None:
        super().__init__()
        self.plan = plan
        self.restart = restart


class PivotPlanned(Message):
    def __init__(self, target: str, lines: list[str], error: Optional[str] = None, plan: Any = None) -> None:
        super().__init__()
        self.target = target
        self.lines = lines
        self.error = error
        self.plan = plan           # executed exactly as shown: nothing re-planned after the confirmation


class PivotStepped(Message):
    def __init__(self, target: str, line: str, ok: bool) -> None:
        super().__init__()
        self.target = target
        self.line = line
        self.ok = ok


# -- the screen ----------------------------------------------------------------------------------

class JobsScreen(DeckScreen):
    """Jobs table over a log pane; everything it shows comes from the core, polled off the UI thread."""

    # Panels look like the dashboard's: round $primary borders with bold titles, $accent when focused.
    DEFAULT_CSS = """
    JobsScreen #jobs-reason { height: auto; color: $warning; padding: 0 1; display: none; }
    JobsScreen #jobs-reason.-shown { display: block; }
    JobsScreen #jobs-stale { height: 1; color: $error; text-style: bold; padding: 0 1; display: none;
                             text-wrap: nowrap; text-overflow: ellipsis; }
    JobsScreen #jobs-stale.-shown { display: block; }
    JobsScreen #jobs-banner { height: auto; max-height: 4; color: $error; background: $error 15%;
                              padding: 0 1; display: none; text-wrap: nowrap; text-overflow: ellipsis; }
    JobsScreen #jobs-banner.-shown { display: block; }
    JobsScreen #jobs-table, JobsScreen #engines, JobsScreen LogView, JobsScreen #jobs-log-hint {
        border: round $primary; border-title-color: $foreground; border-title-style: bold; }
    JobsScreen #jobs-table { height: auto; max-height: 60%; padding: 0 1; overflow-x: hidden;
                             background: $background; }
    JobsScreen #jobs-table:focus { border: round $accent; }
    JobsScreen.-log-open #jobs-table { max-height: 40%; }
    JobsScreen #engines { padding: 0 1; }
    JobsScreen LogView { display: none; }
    JobsScreen LogView:focus-within { border: round $accent; }
    JobsScreen.-log-open LogView { display: block; }
    JobsScreen #jobs-log-hint { height: 1fr; color: $text-muted; padding: 0 1; }
    JobsScreen.-log-open #jobs-log-hint { display: none; }
    """

    BINDINGS = [
        Binding("s", "start_job", "Start", id="jobs.start"),
        Binding("x", "stop_job", "Stop", id="jobs.stop"),
        Binding("r", "restart_job", "Restart", id="jobs.restart"),
        Binding("l", "open_log", "Log", id="jobs.log", tooltip="or Enter on a row"),
        Binding("p", "pivot", "Pivot", id="jobs.pivot", tooltip="stop the running engines, start this one"),
        Binding("escape", "close_log", "Close log", show=False, id="jobs.log.close"),
        Binding("R", "replay_selected", "Replay", id="jobs.replay", tooltip="play the selected job's latest run"),
        # Not in the footer (its snapshot stays as it is); `?` lists it.
        Binding("D", "stack_dump", "Stacks", show=False, id="jobs.stacks",
                tooltip="py-spy stack dump of the selected job's processes, grouped, with a verdict"),
        # The player's keys: only while the view shows a replay (check_action hides them otherwise).
        Binding("space", "replay_pause", "Play/pause", id="jobs.replay.pause"),
        Binding("plus,equals_sign", "replay_faster", "Faster", key_display="+", id="jobs.replay.faster"),
        Binding("minus", "replay_slower", "Slower", key_display="-", id="jobs.replay.slower"),
        Binding("left_square_bracket", "replay_seek(-60)", "-1 min", key_display="[", id="jobs.replay.back"),
        Binding("right_square_bracket", "replay_seek(60)", "+1 min", key_display="]", id="jobs.replay.forward"),
        Binding("n", "replay_next", "Next event", id="jobs.replay.next"),
        Binding("N", "replay_previous", "Prev event", show=False, id="jobs.replay.previous"),
        Binding("a", "replay_next_alert", "Next alert", show=False, id="jobs.replay.alert"),
        # With actions off (--demo, --readonly) the acting keys say why they do nothing (check_action
        # hides the real ones then).
        Binding("s,x,r,p", "actions_refused", "", show=False, id="jobs.actions.refused"),
    ]
    REPLAY_ACTIONS = {"replay_pause", "replay_faster", "replay_slower", "replay_seek", "replay_next",
                      "replay_previous", "replay_next_alert"}
    # D is not among them: on a replay (the demo's too) it shows the dump the replayed run recorded;
    # live, reading where a job waits (py-spy) is no action on it, so read-only offers it too.
    LIVE_ACTIONS = {"start_job", "stop_job", "restart_job", "pivot"}

    def __init__(
        self,
        jobs_file: Optional[str] = None,
        refresh_s: Optional[float] = None,
        *,
        supervisor: Any = None,
        payload: Any = None,
        clock: Any = time.time,
        feed: Optional[JobsFeed] = None,
        **kwargs: Any,
    ) -> None:
        """By default the view follows the app's jobs feed (live from --jobs, or a replay the app set).
        `feed` follows that one instead; `jobs_file`, `supervisor`, `payload(supervisor) -> {"jobs": [...]}`
        or `refresh_s` give the view its own live feed (snapshot tests show a fixed state), and `clock`
        is the time runtimes are counted to."""
        super().__init__(**kwargs)
        self.clock = clock
        self._feed = feed
        if feed is None and (jobs_file is not None or supervisor is not None or payload is not None
                             or refresh_s is not None):
            watcher = JobsWatcher(jobs_file, supervisor=supervisor, payload=payload, clock=clock)
            self._feed = JobsFeed(self, LiveJobsSource(watcher, refresh_s if refresh_s is not None else 1.0))
        self.jobs: list[JobView] = []
        self.log_paths: dict[str, str] = {}
        self.reason: Optional[str] = None
        self.refreshes = 0                       # snapshots shown (tests wait on it)
        self._seen_alerts: Optional[set[tuple]] = None
        self._log_job: Optional[str] = None
        self._log_path: Optional[str] = None
        self._busy: set[str] = set()             # jobs with an action in flight
        self._layout: Optional[TableLayout] = None
        self.replay: Any = None                  # the SessionFrame of the replayed snapshot shown; None: live
        self._log_limits: dict[str, int] = {}
        self._jobs_file = jobs_file
        self._own_box: Any = None                # a LocalBox of `jobs_file` for a view with its own feed
        self.stale: Optional[str] = None         # why the jobs shown are not fresh (a box STALE / DOWN)
        self._mirror_dir: Optional[str] = None   # where a remote box's followed logs are written
        self._mirror_seq = 0

    def compose(self) -> ComposeResult:
        yield BoxHeaderPanel("jobs", id="header")
        yield ReplayBar(id="jobs-replay")
        yield Static("", id="jobs-reason", markup=False)
        yield Static("", id="jobs-stale", markup=False)
        yield Static("", id="jobs-banner", markup=False)
        with Vertical(id="jobs-body"):
            # No cell padding: each cell carries its own gap, so a row's style has no holes.
            table: DataTable = DataTable(id="jobs-table", cursor_type="row", zebra_stripes=False, cell_padding=0)
            table.border_title = "jobs"
            yield table
            engines = EnginePanel(clock=self.now, id="engines")
            engines.border_title = "engines"
            yield engines
            log = LogView(id="jobs-log")
            log.border_title = "log"
            yield log
            hint = Static("Enter or l on a job follows its log here; Esc closes it", id="jobs-log-hint", markup=False)
            hint.border_title = "log"
            yield hint
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.focus()
        # A vertical scrollbar (the log pane opened on a short screen) narrows the table: re-fit the columns.
        def refit(_shown: bool) -> None:
            self.call_after_refresh(self._render_table)

        self.watch(table, "show_vertical_scrollbar", refit, init=False)
        # Alerts ring and logs re-attach while another view is shown: follow the feed even when hidden.
        self.feed.follow(self, self._show_snapshot, while_hidden=True)

    @property
    def feed(self) -> JobsFeed:
        if self._feed is None:
            feed = getattr(self.app, "jobs_feed", None)
            if isinstance(feed, JobsFeed):
                self._feed = feed
            else:          # an app of its own (tests): a live feed from the jobs file, like the CLI
                watcher = JobsWatcher(getattr(self.app, "jobs_file", None), clock=self.clock)
                self._feed = JobsFeed(self, LiveJobsSource(watcher, 1.0))
        return self._feed

    @property
    def demo(self) -> bool:
        """`gpudeck --demo`: the view shows the demo's recorded runs and never acts on a job."""
        return bool(getattr(self.app, "demo_replay", False))

    @property
    def supervisor(self) -> Any:
        """What start/stop/pivot act through (read-only reads through it too); None while no jobs file is
        loaded, for a replay, and in a demo."""
        if self.demo:
            return None
        return self.feed.supervisor

    @property
    def actions_off(self) -> Optional[str]:
        """"demo" or "read-only": the view acts on no job (keys hidden, each says why), else None.
        A remote box with readonly = true in hosts.toml is read-only too (its agent refuses anyway)."""
        off = actions_off(self.app)
        if off is None and getattr(getattr(self.box, "spec", None), "readonly", False):
            return READ_ONLY
        return off

    @property
    def box(self) -> Any:
        """The Box these jobs are on and every action goes through: the live source's (the app's box),
        else the app's box, else (a view with its own feed) a LocalBox of its jobs file."""
        box = getattr(getattr(self.feed, "source", None), "box", None)
        if box is not None:
            return box
        app_box = getattr(self.app, "box", None)
        if app_box is not None and (self._feed is getattr(self.app, "_jobs_feed", None)):
            return app_box
        if self._own_box is None:
            from gpudeck.jobs.box.local import LocalBox
            self._own_box = LocalBox(jobs_file=self._jobs_file or getattr(self.app, "jobs_file", None))
        return self._own_box

    @property
    def remote(self) -> bool:
        """The jobs shown are on a remote box (read and acted on over SSH)."""
        return not getattr(getattr(getattr(self.feed, "source", None), "box", None), "local", True)

    @property
    def live(self) -> bool:
        """The jobs shown are live ones an action can reach (not a replay, not a jobs file that failed to load)."""
        if self.demo or self.replay is not None:
            return False
        return self.remote or self.feed.supervisor is not None

    def _acting(self) -> Any:
        """The Box a worker acts through, or an error that says why there is none."""
        if self.actions_off:                  # read-only still reads; it never acts
            raise RuntimeError(refusal(self.app))
        if not self.live:
            raise RuntimeError("read-only: these jobs are not live here")
        return self.box

    def on_resize(self, event: events.Resize) -> None:
        # The columns depend on the width: lay them out again once the table has its new size.
        self.call_after_refresh(self._render_table)

    def _say(self, message: str, **kwargs: Any) -> None:
        """A toast; job names, alerts and errors in it are shown as written, never parsed as markup."""
        lines = [safe_text(line, 300) for line in message.split("\n")[:20]]
        self.notify("\n".join(lines), markup=False, **kwargs)

    @property
    def selected_job(self) -> Optional[JobView]:
        table = self.query_one(DataTable)
        if not self.jobs or table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), len(self.jobs) - 1)
        return self.jobs[row]

    # -- snapshots from the feed (the core did the work off the UI thread) -------------------------
    def now(self) -> float:
        """The instant the rows are shown for: the replay's position, else the clock."""
        return self.replay.t if self.replay is not None else self.clock()

    def _show_snapshot(self, snapshot: JobsSnapshot) -> None:
        self.refreshes += 1
        was_replay = self.replay is not None
        self.replay = snapshot.replay
        if (snapshot.replay is not None) != was_replay:
            # Live <-> replay: other jobs, other alerts; none of them is new to the operator.
            self._seen_alerts = None
            self.query_one(EnginePanel).reset_history()
            self.refresh_bindings()
        self.set_class(snapshot.replay is not None, "-replay")
        self.query_one(ReplayBar).show_frame(snapshot.replay)
        self.query_one(BoxHeaderPanel).show_replay(snapshot.replay.t if snapshot.replay is not None else None)
        self._log_limits = dict(snapshot.log_limits)
        reason_box = self.query_one("#jobs-reason", Static)
        self.reason = snapshot.reason
        if snapshot.reason is not None:
            reason_box.update(safe_text(snapshot.reason, 500))
        reason_box.set_class(snapshot.reason is not None, "-shown")
        stale_box = self.query_one("#jobs-stale", Static)
        if snapshot.error:
            if self.stale is None:            # said once as it happens; the line stays while it lasts
                self._say(f"jobs refresh failed: {snapshot.error}", severity="error", timeout=4)
            stale_box.update(safe_text(f"STALE: {snapshot.error} — the jobs shown are the last ones seen", 300))
        self.stale = snapshot.error
        stale_box.set_class(snapshot.error is not None, "-shown")
        self.jobs = list(snapshot.jobs)
        self.log_paths = dict(snapshot.log_paths)
        panel = self.query_one(EnginePanel)
        panel.update_engines(list(snapshot.engines), at=snapshot.taken_at)
        set_border_titles(panel, f"engines ({len(snapshot.engines)})")
        self._render_table()
        self._announce_alerts()
        self._reattach_log()
        if self._log_job is not None and self.replay is not None:
            self.query_one(LogView).pane.set_limit(self._log_limits.get(self._log_job))

    def _table_width(self, table: DataTable) -> int:
        width = table.scrollable_content_region.width
        # Before the first layout the table has no size: the screen less the border and padding.
        return width if width > 0 else max(20, self.size.width - 4)

    def _render_table(self) -> None:
        table = self.query_one(DataTable)
        now = self.now()
        variables = self.app.get_css_variables()
        layout = table_layout(self.jobs, now, self._table_width(table))
        names = [job.name for job in self.jobs]
        current = [str(key.value) for key in table.rows]
        set_border_titles(table, f"jobs ({len(self.jobs)})")
        if layout != self._layout or names != current:
            cursor = table.cursor_row
            table.clear(columns=layout != self._layout)
            if layout != self._layout:
                self._layout = layout
                for column in layout.columns:
                    table.add_column(fitted(column.label, column.width), width=column.width + CELL_GAP,
                                     key=column.key)
            for job in self.jobs:
                table.add_row(*layout_cells(job, now, layout, variables), key=job.name)
            if self.jobs:
                table.move_cursor(row=min(max(cursor, 0), len(self.jobs) - 1))
            return
        for job in self.jobs:
            for column, cell in zip(layout.columns, layout_cells(job, now, layout, variables)):
                table.update_cell(job.name, column.key, cell)

    def _announce_alerts(self) -> None:
        lines = banner_lines(self.jobs, self.now())
        banner = self.query_one("#jobs-banner", Static)
        banner.update("\n".join(lines))
        banner.set_class(bool(lines), "-shown")
        current = {(job.name, a.code, a.since): (job, a) for job in self.jobs for a in job.alerts}
        if self._seen_alerts is None:
            # Alerts that were already up when the console opened are shown, not rung.
            self._seen_alerts = set(current)
            return
        for key in current.keys() - self._seen_alerts:
            job, alert = current[key]
            severity = "error" if alert.is_failure else "warning"
            if self.replay is not None:
                # A replayed alert is history, not an emergency: said, never rung.
                self._say(f"{job.name}: {alert.code} — {alert.message}", title="replayed alert",
                          severity=severity, timeout=6)
                continue
            self._say(f"{job.name}: {alert.code} — {alert.message}",
                        title="gpudeck alert", severity=severity, timeout=10)
            self.app.bell()
        self._seen_alerts = set(current)

    # -- the log pane ------------------------------------------------------------------------------
    def _reattach_log(self) -> None:
        """After a restart the job has a new run: follow its log, not the finished one."""
        if self._log_job is None:
            return
        path = self.log_paths.get(self._log_job)
        if path and path != self._log_path:
            self._open_log(self._log_job, path)
        elif self.jobs and all(job.name != self._log_job for job in self.jobs) and self.has_class("-log-open"):
            self._close_log()         # another source (a replay of other runs): its job is not shown any more

    def _open_log(self, job: str, path: str) -> None:
        self._log_job = job
        self._log_path = path
        run_id = Path(path).parent.name
        if is_remote_log_ref(path):
            # A remote run's output is read through the box by offset into a local file the pane follows
            # (search, wrap and the index work as on a local log); the last lines first, not the whole log.
            box = self.box
            self._mirror_seq += 1
            mirror = self._mirror_path(f"{job}-{run_id}-{self._mirror_seq}.log")
            self._follow_remote_log(box, job, run_id, mirror)
            self.query_one(LogView).open(str(mirror), title=f"{job} · run {run_id} · on {box.name}")
            return
        self.workers.cancel_group(self, "log-mirror")
        replayed = " · REPLAY" if self.replay is not None else ""
        limit = self._log_limits.get(job) if self.replay is not None else None
        self.query_one(LogView).open(path, title=f"{job} · run {run_id}{replayed}", limit=limit)

    def _mirror_path(self, name: str) -> Path:
        import tempfile
        if self._mirror_dir is None:
            self._mirror_dir = tempfile.mkdtemp(prefix="gpudeck-boxlog-")
        path = Path(self._mirror_dir) / name.replace("/", "_")
        path.write_bytes(b"")
        return path

    @work(thread=True, exclusive=True, group="log-mirror", exit_on_error=False)
    def _follow_remote_log(self, box: Any, job: str, run_id: str, dest: Path) -> None:
        """Append the run's bytes to `dest` as they arrive on the box: the last REMOTE_LOG_TAIL lines, then
        every read by offset (waiting on the box for new bytes), until the run ended or the pane moved on.
        A dropped link is retried where it left off: no gap, no repeat."""
        from textual.worker import get_current_worker

        from gpudeck.jobs.box import BoxError
        worker = get_current_worker()
        offset: Optional[int] = None
        failed = False
        with open(dest, "ab") as out:
            while not worker.is_cancelled:
                try:
                    chunk = box.read_log(job, run=run_id, offset=offset,
                                         tail=REMOTE_LOG_TAIL if offset is None else None,
                                         wait_s=0.0 if offset is None else REMOTE_LOG_WAIT_S)
                except BoxError as exc:
                    if worker.is_cancelled:
                        return
                    if not failed:
                        failed = True
                        self.app.call_from_thread(self._say, f"{job}'s log on {box.name}: {exc}; retrying",
                                                  severity="warning", timeout=4)
                    time.sleep(1.0)
                    continue
                failed = False
                if worker.is_cancelled:
                    return
                if chunk.data:
                    out.write(chunk.data)
                    out.flush()
                offset = chunk.next_offset
                if chunk.ended and not chunk.data:
                    return

    def on_unmount(self) -> None:
        self.workers.cancel_group(self, "log-mirror")
        if self._mirror_dir is not None:
            import shutil
            shutil.rmtree(self._mirror_dir, ignore_errors=True)

    def action_open_log(self) -> None:
        job = self.selected_job
        if job is None:
            return
        name = job.name
        path = self.log_paths.get(name)
        if path is None:
            advice = "at this point of the replay" if self.replay is not None else "press s to start it"
            self._say(f"{name} has no run yet: {advice}", severity="warning", timeout=3)
            return
        self.add_class("-log-open")
        self._open_log(name, path)
        # Focus once the pane is displayed: a widget still hidden by CSS may refuse it.
        self.call_after_refresh(self.query_one(LogViewPane).focus)

    @on(DataTable.RowSelected, "#jobs-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_log()

    def action_close_log(self) -> None:
        # Esc closes the pane at once, wherever the focus is, as the hint under the table says
        # (the search box's Esc is the LogView's own: it only cancels the search).
        if self.has_class("-log-open"):
            self._close_log()
        elif self.replay is not None:
            leave = getattr(self.app, "leave_replay", None)
            if leave is not None:
                leave()

    def _close_log(self) -> None:
        self.workers.cancel_group(self, "log-mirror")
        self.remove_class("-log-open")
        self._log_job = None
        self._log_path = None
        self.query_one(DataTable).focus()

    # -- replay ----------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The player's keys exist only in a replay; starting and stopping only on live jobs.
        if action in self.REPLAY_ACTIONS:
            return self._replay_source() is not None
        if action in self.LIVE_ACTIONS:
            return self.replay is None and not self.actions_off
        if action == "actions_refused":
            return self.actions_off is not None
        return True

    def action_actions_refused(self) -> None:
        self._say(refusal(self.app), severity="warning", timeout=3)

    def _replay_source(self) -> Any:
        source = getattr(self.feed, "source", None)
        return source if hasattr(source, "session") else None

    def _player(self, verb: str, *args: Any) -> Any:
        source = self._replay_source()
        if source is None:
            return None
        return getattr(source, verb)(*args)

    def action_replay_pause(self) -> None:
        self._player("toggle_pause")

    def action_replay_faster(self) -> None:
        self._player("faster")

    def action_replay_slower(self) -> None:
        self._player("slower")

    def action_replay_seek(self, seconds: float) -> None:
        self._player("seek", float(seconds))

    def action_replay_next(self) -> None:
        source = self._replay_source()
        if source is not None and source.next_mark() is None:
            self._say("no later event in this replay", severity="warning", timeout=2)

    def action_replay_next_alert(self) -> None:
        source = self._replay_source()
        if source is not None and source.next_mark({"alert"}) is None:
            self._say("no later alert in this replay", severity="warning", timeout=2)

    def action_replay_previous(self) -> None:
        source = self._replay_source()
        if source is not None and source.previous_mark() is None:
            self._say("no earlier event in this replay", severity="warning", timeout=2)

    def action_replay_selected(self) -> None:
        """The selected job's latest run, played through this view."""
        job = self.selected_job
        if job is None:
            return
        path = self.log_paths.get(job.name)
        if path is None:
            self._say(f"{job.name} has no run to replay yet", severity="warning", timeout=3)
            return
        replay = getattr(self.app, "replay_runs", None)
        if replay is None:
            self._say("replay is not available in this console", severity="warning", timeout=3)
            return
        if self.has_class("-log-open"):
            # The open log follows: the replay's first frame re-attaches it to this job's replayed run.
            self._log_job = job.name
        if is_remote_log_ref(path):
            self._say(f"fetching {job.name}'s run {Path(path).parent.name} from {self.box.name}…", timeout=2)
            self._fetch_and_replay(self.box, job.name, Path(path).parent.name)
            return
        replay([Path(path).parent])

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _fetch_and_replay(self, box: Any, job: str, run_id: str) -> None:
        """A remote run's record copied here by offset (a second time only what grew), then replayed."""
        try:
            record = box.run_record(job, run_id)
        except Exception as exc:
            self.app.call_from_thread(self._say, f"cannot replay {job}: {exc}", severity="error", timeout=6)
            return
        replay = getattr(self.app, "replay_runs", None)
        if replay is not None:
            self.app.call_from_thread(replay, [record])

    # -- actions -------------------------------------------------------------------------------------
    def _selected_name(self) -> Optional[str]:
        if self.actions_off:
            self.action_actions_refused()
            return None
        if not self.live:
            self._say(self.reason or ("read-only: these jobs are not live here" if self.jobs else "no jobs loaded"),
                      severity="warning", timeout=3)
            return None
        job = self.selected_job
        return None if job is None else job.name

    def _selected_idle_name(self) -> Optional[str]:
        """The selected job, unless an action on it is still in progress (then say so)."""
        name = self._selected_name()
        if name is not None and name in self._busy:
            self._say(f"{name}: an action is already in progress", severity="warning", timeout=3)
            return None
        return name

    def action_stack_dump(self) -> None:
        """Where the selected job's processes wait: the dump runs in the modal's worker thread. On a
        replay (and in --demo) no process is touched: the replayed run's latest recorded dump is shown."""
        source = self._replay_source()
        if source is not None:
            self._recorded_stack_dump(source)
            return
        name = self._selected_name()
        if name is None:
            return
        box = self.box
        self.app.push_screen(StacksScreen(name, lambda: box_stacks(box, name)))

    def _recorded_stack_dump(self, source: Any) -> None:
        from gpudeck.jobs.stacks import read_stored_dump
        job = self.selected_job
        if job is None:
            return
        at = self.replay.t if self.replay is not None else source.session.position
        run = next((r for r in source.session.runs if r.recording.job == job.name), None)
        entry = run.recording.stacks_at(at) if run is not None else None
        if run is None or entry is None:
            self._say(f"{job.name}: no stack dump recorded by this point of the replay", severity="warning", timeout=3)
            return
        run_dir, path = run.recording.path, entry["path"]
        self.app.push_screen(StacksScreen(job.name, lambda: read_stored_dump(run_dir, path), recorded=True))

    def action_start_job(self) -> None:
        name = self._selected_idle_name()
        if name is None:
            return
        self._busy.add(name)
        self._say(f"starting {name}…", timeout=2)
        self._start(name)

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _start(self, name: str) -> None:
        try:
            box = self._acting()
            started = box.start(name)
        except Exception as exc:
            self.post_message(JobActionFinished(name, "start", False, [str(exc)]))
        else:
            self.post_message(JobActionFinished(name, "start", True,
                                                [f"started {name}{_on(box)} (run {started.run_id})"]))

    def action_stop_job(self) -> None:
        self._plan_stop_for_selected(restart=False)

    def action_restart_job(self) -> None:
        self._plan_stop_for_selected(restart=True)

    def _plan_stop_for_selected(self, restart: bool) -> None:
        name = self._selected_idle_name()
        if name is None:
            return
        job = self.selected_job
        self._plan_stop(name, restart, dict(job.payload) if job is not None else {})

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _plan_stop(self, name: str, restart: bool, shown: Optional[dict] = None) -> None:
        try:
            plan = box_stop_plan(self._acting(), name, shown or {})
        except Exception as exc:
            self.post_message(JobActionFinished(name, "stop", False, [f"cannot stop {name}: {exc}"]))
            return
        self.post_message(StopPlanned(plan, restart))

    @on(StopPlanned)
    def _stop_planned(self, message: StopPlanned) -> None:
        plan, restart = message.plan, message.restart
        if self.actions_off:              # no confirmation opens while actions are off
            self.action_actions_refused()
            return
        if not plan.processes:
            if restart:
                # Nothing to destroy: a restart of a job that is not running is a start.
                self._busy.add(plan.job)
                self._start(plan.job)
            else:
                self._say(f"{plan.job} is not running", severity="warning", timeout=3)
            return
        verb = "Restart" if restart else "Stop"
        lines = [f"Job {plan.job}{plan.where} (run {plan.run_id}), process group {plan.pgid}:"]
        lines += [f"  pid {pid}  {safe_text(cmd, 90)}" for pid, cmd in plan.processes[:12]]
        if len(plan.processes) > 12:
            lines.append(f"  … and {len(plan.processes) - 12} more")
        lines.append(plan.how)
        if restart:
            lines.append("Then a new run starts (only if the stop was clean).")

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            self._busy.add(plan.job)
            self._say(f"{'restarting' if restart else 'stopping'} {plan.job}…", timeout=2)
            self._stop(plan.job, restart)

        self.app.push_screen(ConfirmScreen(f"{verb} {plan.job}{plan.where}?", lines, confirm_label=verb), answered)

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _stop(self, name: str, restart: bool) -> None:
        action = "restart" if restart else "stop"
        try:
            box = self._acting()
            if restart:
                restarted = box.restart(name)
                stopped = restarted.stopped
                lines = list(stopped.lines) or [f"stopped {name}{_on(box)}"]
                lines.append(f"started {name}{_on(box)} (run {restarted.run_id})" if restarted.run_id else
                             f"{name} was not started again: the stop was not clean")
                ok = stopped.clean and restarted.run_id is not None
            else:
                stopped = box.stop(name)
                lines = list(stopped.lines) or [f"stopped {name}{_on(box)}"]
                ok = stopped.clean
        except Exception as exc:
            self.post_message(JobActionFinished(name, action, False, [str(exc)]))
            return
        self.post_message(JobActionFinished(name, action, ok, lines))

    @on(JobActionFinished)
    def _action_finished(self, message: JobActionFinished) -> None:
        self._busy.discard(message.job)
        self._say("\n".join(message.lines), title=f"{message.action} {message.job}",
                    severity="information" if message.ok else "error", timeout=6 if message.ok else 12)
        self.feed.poll_now()

    # -- pivot -----------------------------------------------------------------------------------------
    def action_pivot(self) -> None:
        name = self._selected_name()
        if name is None:
            return
        job = self.selected_job
        if job is None or job.kind != "engine":
            self._say(f"{name} is not an engine job: pivot targets an engine (kind = \"engine\")",
                        severity="warning", timeout=4)
            return
        self._plan_pivot(name)

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _plan_pivot(self, target: str) -> None:
        try:
            plan = self._acting().pivot_plan(target)
        except Exception as exc:      # BoxError says why in words; anything else too
            self.post_message(PivotPlanned(target, [], error=str(exc)))
            return
        self.post_message(PivotPlanned(target, list(plan.lines), plan=plan))

    @on(PivotPlanned)
    def _pivot_planned(self, message: PivotPlanned) -> None:
        if message.error:
            self._say(f"pivot to {message.target}: {message.error}", severity="error", timeout=8)
            return
        if self.actions_off:              # no confirmation opens while actions are off
            self.action_actions_refused()
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._busy.add(message.target)
                self._say(f"pivoting to {message.target}…", timeout=3)
                self._pivot(message.target, message.plan)

        self.app.push_screen(ConfirmScreen(f"Pivot to {message.target}?", message.lines, confirm_label="Pivot"),
                             answered)

    @work(thread=True, group="jobs-action", exit_on_error=False)
    def _pivot(self, target: str, plan: Any) -> None:
        def stepped(step: dict) -> None:
            self.post_message(PivotStepped(target, step_line(step), bool(step.get("ok"))))

        try:
            result = self._acting().pivot(plan, on_step=stepped)
        except Exception as exc:
            self.post_message(JobActionFinished(target, "pivot", False, [str(exc)]))
            return
        lines = [result.message or ("pivot done" if result.ok else "pivot failed")]
        lines += [step_line(step) for step in result.steps]
        self.post_message(JobActionFinished(target, "pivot", result.ok, lines))

    @on(PivotStepped)
    def _pivot_stepped(self, message: PivotStepped) -> None:
        self._say(message.line, title=f"pivot to {message.target}",
                    severity="information" if message.ok else "error", timeout=6)


# -- core calls used by the workers (no widget access) ----------------------------------------------

def _on(box: Any) -> str:
    return "" if getattr(box, "local", True) else f" on {box.name}"


def step_line(step: dict) -> str:
    """A pivot step ({name, ok, duration_s, detail}) as the core's PivotStep.line() writes it."""
    from gpudeck.jobs.engines.pivot import PivotStep
    duration = step.get("duration_s")
    return PivotStep(name=str(step.get("name") or "?"), ok=bool(step.get("ok")),
                     duration_s=float(duration) if isinstance(duration, (int, float)) else 0.0,
                     detail=str(step.get("detail") or "")).line()


def box_stop_plan(box: Any, name: str, shown: dict) -> StopPlan:
    """What a stop will signal. This machine: exactly its processes, named, and the job's signal; a remote
    box: the run, its pid and process group as the box last reported them (the box verifies the stop)."""
    local_supervisor = getattr(box, "supervisor", None) if getattr(box, "local", True) else None
    if callable(local_supervisor):
        supervisor = local_supervisor()
        plan = stop_plan(supervisor, name)
        spec = supervisor.spec(name)
        plan.how = f"SIG{spec.stop_signal.removeprefix('SIG')} to the group, SIGKILL after {spec.stop_timeout:g}s."
        return plan
    state = shown.get("state")
    pid = shown.get("pid")
    live = state in ("starting", "running", "stopping")
    processes = [(pid, "(as last reported by the box)")] if live and isinstance(pid, int) else []
    pgid = shown.get("pgid") if isinstance(shown.get("pgid"), int) else None
    return StopPlan(name, shown.get("run_id") if live else None, pgid, processes,
                    how="Stop signal to its process group, SIGKILL after its stop_timeout, then verified on the box.",
                    where=_on(box))


def stop_plan(supervisor: Any, name: str) -> StopPlan:
    """Exactly the processes a stop will signal, named (pid and command line)."""
    from gpudeck.jobs.procs import cmdline
    from gpudeck.jobs.supervisor import run_processes
    supervisor.spec(name)
    run = supervisor.latest(name)
    if run is None:
        return StopPlan(name, None, None, [])
    procs = sorted(run_processes(run), key=lambda st: st.pid)
    pgid = run.meta().get("pgid")
    return StopPlan(name, run.run_id, pgid, [(st.pid, cmdline(st.pid) or "?") for st in procs])
