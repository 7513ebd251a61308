"""The history view: every run of every job from the run index, newest first — filter, open a post-mortem, replay."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static

from gpudeck.console.compositor import DeckScreen

from gpudeck.console.format import human_age, human_bytes, safe_text

# A run that ends shows up within this long while the view is open (the index is synced lazily).
REFRESH_S = 5.0
REMOTE_REFRESH_S = 15.0
# The view lists this many runs at most (newest first); `gpudeck runs` lists them all.
MAX_ROWS = 2000
# (key, label, cap on its width); "why" is last and takes what is left, so the table never scrolls sideways.
COLUMNS = (("started", "started", 16), ("job", "job", 24), ("run", "run", 24), ("took", "took", 8),
           ("result", "result", 16), ("phase", "phase", 12), ("why", "why", None))
CELL_PADDING = 1


def column_widths(texts: list[dict[str, str]], width: int) -> tuple[int, ...]:
    """Each column as wide as its longest cell (capped); "why" gets the rest (at least 10)."""
    widths = []
    for key, label, cap in COLUMNS[:-1]:
        widths.append(min(cap, max([len(label)] + [len(t[key]) for t in texts])))
    used = sum(w + 2 * CELL_PADDING for w in widths) + 2 * CELL_PADDING
    return (*widths, max(10, width - used))


def result_text(row: dict) -> str:
    state = row.get("state") or "?"
    if state in ("exited", "stopped"):
        if row.get("signal"):
            text = str(row["signal"])
        elif row.get("exit_code") is not None:
            text = f"exit {row['exit_code']}"
        else:
            text = state
        return text + (" stopped" if state == "stopped" else "")
    return state


def why_text(row: dict) -> str:
    if row.get("failure_cause"):
        line = f" (line {row['failure_line']:,})" if isinstance(row.get("failure_line"), int) else ""
        message = f": {row['failure_message']}" if row.get("failure_message") else ""
        return f"{row['failure_cause']}{line}{message}"
    if row.get("stopped_by"):
        from gpudeck.jobs.history.index import stopper
        return f"stopped by {stopper(row['stopped_by'])}"
    alerts = [a for a in row.get("alerts") or [] if isinstance(a, str)]
    peak_mem = row.get("peak_gpu_mem")
    peak: dict = peak_mem if isinstance(peak_mem, dict) else {}
    parts = [", ".join(alerts)] if alerts else []
    top = row.get("peak_gpu_mem_max")
    if not isinstance(top, (int, float)) or isinstance(top, bool):
        top = max((v for v in peak.values() if isinstance(v, (int, float)) and not isinstance(v, bool)), default=None)
    if peak or top:
        parts.append(f"peak GPU {human_bytes(top or 0)}")
    return "; ".join(parts)


def row_texts(row: dict, now: float) -> dict[str, str]:
    started = row.get("started_at")
    took = row.get("duration_s")
    if took is None and isinstance(started, (int, float)) and row.get("state") in ("starting", "running", "stopping"):
        took = now - started
    phase = row.get("final_phase")
    return {
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if isinstance(started, (int, float)) else "—",
        "job": safe_text(str(row.get("job") or "?"), 40), "run": safe_text(str(row.get("run_id") or "?"), 32),
        "took": human_age(took) if isinstance(took, (int, float)) else "—",
        "result": safe_text(result_text(row), 20),
        "phase": safe_text(phase, 16) if isinstance(phase, str) and phase != "unknown" else "—",
        "why": safe_text(why_text(row), 200) or "—",
    }


class RunsListed(Message):
    def __init__(self, rows: list[dict], error: Optional[str] = None, box: Any = None) -> None:
        super().__init__()
        self.rows = rows
        self.error = error
        self.box = box                       # the box asked (a listing of a box since left is dropped)


def run_rows(rows: list[dict]) -> list[dict]:
    """The job runs of a listing (pipelines and pivots have views of their own), each with a unique key:
    a remote box's rows are its words, and two rows of one key would break the table."""
    out, seen = [], set()
    for row in rows:
        if not isinstance(row, dict) or row.get("kind", "job") != "job":
            continue
        key = str(row.get("key") or f"job/{row.get('job')}/{row.get('run_id')}")
        while key in seen:
            key += "'"
        seen.add(key)
        out.append({**row, "key": key})
    return out


class HistoryScreen(DeckScreen):
    """Runs of every job on the console's box (its run index), failed ones in red; Enter: post-mortem, R: replay."""

    DEFAULT_CSS = """
    HistoryScreen #history-reason { height: auto; color: $warning; padding: 0 1; display: none; }
    HistoryScreen #history-reason.-shown { display: block; }
    HistoryScreen #history-table { height: 1fr; border: round $primary; border-title-color: $foreground;
                                   border-title-style: bold; padding: 0 1; background: $background; }
    HistoryScreen #history-table:focus { border: round $accent; }
    """

    BINDINGS = [
        Binding("enter", "postmortem", "Post-mortem", id="history.postmortem"),
        Binding("R", "replay", "Replay", id="history.replay", tooltip="play the run in the jobs view"),
        Binding("f", "toggle_failed", "Failed only", id="history.failed"),
        Binding("j", "toggle_job", "This job", id="history.job", tooltip="only the selected run's job (again: all)"),
        Binding("escape", "clear_filters", "All runs", show=False, id="history.clear"),
    ]

    def __init__(self, *, run_dirs: Optional[list[Path]] = None, clock: Any = time.time, **kwargs: Any) -> None:
        """The runs of the app's box (`app.box.runs`); `run_dirs` lists those run directories instead (in
        --demo: the demo's recorded runs, so the view never shows this box's real runs under SIMULATED)."""
        super().__init__(**kwargs)
        self.run_dirs = run_dirs
        self.clock = clock
        self.rows: list[dict] = []
        self.failed_only = False
        self.job_filter: Optional[str] = None
        self.loads = 0                      # completed loads (tests wait on it)
        self.listed_box: Any = None         # the box the rows are of
        self.asked_box: Any = None          # the box the last load asked (its listing may be on its way)
        self._timer: Optional[Timer] = None
        self._shown: Optional[list[tuple]] = None
        self._widths: Optional[tuple[int, ...]] = None

    def compose(self) -> ComposeResult:
        try:
            from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
            yield BoxHeaderPanel("history", id="header")
        except ImportError:  # pragma: no cover - the header is the dashboard's; the view works without it
            pass
        yield Static("", id="history-reason", markup=False)
        table: DataTable = DataTable(id="history-table", cursor_type="row", zebra_stripes=False,
                                     cell_padding=CELL_PADDING)
        table.border_title = "runs"
        yield table
        yield Footer()

    def on_mount(self) -> None:
        if self.run_dirs is None and getattr(self.app, "demo_replay", False):
            from gpudeck.jobs.replay import demo_run_dirs
            self.run_dirs = demo_run_dirs()
        self.query_one(DataTable).focus()
        self._load()
        feed = getattr(self.app, "box_feed", None)       # the box switcher's: another box, its runs
        if feed is not None:
            feed.follow(self, self._box_switched)

    def on_resize(self) -> None:
        self._shown = None
        self.call_after_refresh(self._render_rows)

    def on_screen_resume(self) -> None:
        self._load()

    @property
    def box(self) -> Any:
        """The box this view lists: the console's (`app.box`)."""
        return getattr(self.app, "box")

    def _box_switched(self, box: Any) -> None:
        """The console shows another box: its runs, at once (also when the first listing of the box
        left is still on its way: that one is dropped when it lands)."""
        if self.run_dirs is None and box is not self.asked_box:
            self._load()

    # -- loading (a worker asks the box; the handler owns the rows) ------------------------------
    def _load(self) -> None:
        box = self.box if self.run_dirs is None else None
        if box is not None and self.listed_box is not None and box is not self.listed_box:
            # Another box's rows (and a job filter of its jobs) are not this one's: cleared while it lists.
            self.rows, self._shown, self.job_filter = [], None, None
            self._render_rows()
        self.asked_box = box
        self._load_from(box, self.job_filter, self.failed_only)

    @work(thread=True, exclusive=True, group="history-load", exit_on_error=False)
    def _load_from(self, box: Any, job: Optional[str], failed: bool) -> None:
        try:
            if box is None:
                from gpudeck.jobs.history.index import rows_of
                rows = rows_of(self.run_dirs or [], job=job, failed=failed)[:MAX_ROWS]
            else:
                rows = run_rows(box.runs(job=job, failed=failed, limit=MAX_ROWS).rows)
        except Exception as exc:        # a broken index or a dead link is a line on screen, never a crash
            from gpudeck.jobs.box import BoxError
            why = str(exc) if isinstance(exc, BoxError) else f"{type(exc).__name__}: {exc}"
            where = f" on {box.name}" if box is not None and not getattr(box, "local", True) else ""
            self.post_message(RunsListed(self.rows, error=f"run index{where} unavailable: {why}", box=box))
            return
        self.post_message(RunsListed(rows, box=box))

    @on(RunsListed)
    def _listed(self, message: RunsListed) -> None:
        if message.box is not None and message.box is not self.box:
            return                        # asked before the console switched box
        self.loads += 1
        self.listed_box = message.box
        reason = self.query_one("#history-reason", Static)
        reason.update(safe_text(message.error or "", 500))
        reason.set_class(bool(message.error), "-shown")
        self.rows = list(message.rows)
        self._render_rows()
        if self._timer is not None:
            self._timer.stop()
        # Re-armed after each load completes, so a slow index never stacks loads up; a remote box's
        # listing crosses the link, so it is asked for less often.
        remote = message.box is not None and not getattr(message.box, "local", True)
        self._timer = self.set_timer(REMOTE_REFRESH_S if remote else REFRESH_S, self._reload_if_shown,
                                     name="history-refresh")

    def _reload_if_shown(self) -> None:
        if self.is_current:
            self._load()

    def _render_rows(self) -> None:
        table = self.query_one(DataTable)
        now = self.clock()
        shown = [(r.get("key"), r.get("state"), r.get("ended_at"), r.get("failed"), r.get("final_phase"))
                 for r in self.rows]
        filters = ["SIMULATED demo runs"] if getattr(self.app, "demo_replay", False) and self.run_dirs is not None else []
        box = self.listed_box
        if box is not None and not getattr(box, "local", True):
            filters.insert(0, f"box {safe_text(str(box.name), 60)}")
        if self.job_filter:
            filters.append(f"job {self.job_filter}")
        if self.failed_only:
            filters.append("failed")
        title = f"runs ({len(self.rows)})" + (f" · {' · '.join(filters)}" if filters else "")
        if str(table.border_title) != title:
            table.border_title = Text(title)          # the job name is job text: never markup
        if shown == self._shown and not any(r.get("state") in ("starting", "running", "stopping") for r in self.rows):
            return                     # nothing changed: no repaint
        self._shown = shown
        cursor = table.cursor_row
        texts = [row_texts(row, now) for row in self.rows]
        width = table.scrollable_content_region.width or max(40, self.size.width - 4)
        widths = column_widths(texts, width)
        table.clear(columns=widths != self._widths)
        if widths != self._widths:
            self._widths = widths
            for (key, label, _), w in zip(COLUMNS, widths):
                table.add_column(label, key=key, width=w)
        error = self.app.get_css_variables().get("error", "red")
        for row, text in zip(self.rows, texts):
            style = f"bold {error}" if row.get("failed") else ""
            # Job-derived text is Text, never markup.
            table.add_row(*(Text(text[key], style=style, no_wrap=True, overflow="ellipsis")
                            for key, _, _ in COLUMNS), key=str(row.get("key")))
        if self.rows:
            table.move_cursor(row=min(max(cursor, 0), len(self.rows) - 1))

    # -- actions --------------------------------------------------------------------------------
    @property
    def selected_run(self) -> Optional[dict]:
        table = self.query_one(DataTable)
        if not self.rows or table.row_count == 0:
            return None
        return self.rows[min(max(table.cursor_row, 0), len(self.rows) - 1)]

    def action_toggle_failed(self) -> None:
        self.failed_only = not self.failed_only
        self._shown = None
        self._load()

    def action_toggle_job(self) -> None:
        if self.job_filter is not None:
            self.job_filter = None
        else:
            run = self.selected_run
            if run is None:
                return
            self.job_filter = str(run.get("job"))
        self._shown = None
        self._load()

    def action_clear_filters(self) -> None:
        if self.job_filter is None and not self.failed_only:
            return
        self.job_filter = None
        self.failed_only = False
        self._shown = None
        self._load()

    def _selected(self) -> Optional[tuple[str, str, Optional[str]]]:
        """The selected run as (job, run_id, path): the path is the box's (on a remote box, not this machine's)."""
        run = self.selected_run
        if run is None:
            self.notify("no run selected", severity="warning", timeout=3, markup=False)
            return None
        path = run.get("path")
        job, run_id = str(run.get("job") or ""), str(run.get("run_id") or "")
        box = self.listed_box
        local = box is None or getattr(box, "local", True)
        if local and not (isinstance(path, str) and path and Path(path).is_dir()):
            self.notify(safe_text(f"{job} run {run_id}: its directory is gone ({path})", 300),
                        severity="error", timeout=5, markup=False)
            return None
        return job, run_id, str(path) if isinstance(path, str) and path else None

    def action_replay(self) -> None:
        selected = self._selected()
        if selected is not None:
            from gpudeck.console.replay import replay_from_box
            replay_from_box(self.app, self.listed_box or self.box, [selected])

    def action_postmortem(self) -> None:
        selected = self._selected()
        if selected is None:
            return
        job, run_id, path = selected
        from gpudeck.console.screens.postmortem import PostmortemScreen
        box = self.listed_box
        if box is None:                       # --demo's recorded runs: their directories, read here
            self.app.push_screen(PostmortemScreen(Path(str(path))))
        else:
            self.app.push_screen(PostmortemScreen(box=box, job=job, run_id=run_id, path=path))

    @on(DataTable.RowSelected, "#history-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_postmortem()
