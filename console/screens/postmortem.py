"""The post-mortem of one run in the console: verdict, phase timeline, alerts, sparkline charts, the lines that matter, and its log."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from gpudeck.console.format import human_age, human_bytes, safe_text, sparkline
from gpudeck.console.widgets.log_view import LogView, sanitize_for_display

CHART_WIDTH = 48


@dataclass(frozen=True)
class Chart:
    label: str
    values: tuple[Optional[float], ...]
    lo: float
    hi: float
    text: str                     # the numbers beside it: "peak 136.2G"


@dataclass(frozen=True)
class KeyLine:
    label: str                    # "root cause", "first error", "ready", "last line"
    line: int                     # 1-based
    text: str


@dataclass
class PostmortemView:
    """What the screen shows, built off the UI thread from the core's post-mortem report."""

    title: str
    verdict: str
    failed: bool
    log_path: Path
    timeline: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    lines: list[KeyLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # what is missing from the run, said plainly


def clock_text(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _read_lines(log_path: Path, wanted: list[int], context: int = 0) -> dict[int, str]:
    """Sanitised text of 1-based lines of a log of any size (indexed, never loaded whole)."""
    from gpudeck.console.widgets.log_index import LogIndex
    out: dict[int, str] = {}
    if not wanted:
        return out
    index = LogIndex(log_path)
    try:
        while index.update():
            pass
        count = index.line_count
        for line in wanted:
            if 1 <= line <= count:
                raw, _ = index.read_line(line - 1)
                out[line] = sanitize_for_display(raw)
    except (OSError, IndexError, ValueError):
        pass
    finally:
        index.close()
    return out


def _line_count(log_path: Path) -> int:
    from gpudeck.console.widgets.log_index import LogIndex
    index = LogIndex(log_path)
    try:
        while index.update():
            pass
        return index.line_count
    except OSError:
        return 0
    finally:
        index.close()


def build_view(run_dir: Path) -> PostmortemView:
    """The post-mortem of a run directory, from the run index's summary of it, its summary.json and events."""
    from gpudeck.jobs.history.index import summarize_run
    from gpudeck.jobs.history.recorder import read_summary, timeline_from_samples
    from gpudeck.jobs.runs import read_jsonl

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: the run directory is gone")
    row = summarize_run(run_dir)[0]
    summary = read_summary(run_dir) or {}
    notes = []
    started = row.get("started_at")
    log_path = run_dir / "output.log"
    if not log_path.exists():
        notes.append("no output.log: the log was not kept")
    # -- verdict --
    state = row.get("state") or "?"
    took = f" after {human_age(row['duration_s'])}" if isinstance(row.get("duration_s"), (int, float)) else ""
    if row.get("failed"):
        what = row.get("failure_cause") or "failed"
        where = f" (line {row['failure_line']:,})" if isinstance(row.get("failure_line"), int) else ""
        message = f": {row['failure_message']}" if row.get("failure_message") else ""
        hint = f" — {row['failure_hint']}" if row.get("failure_hint") else ""
        exit_words = row.get("signal") or (f"exit {row['exit_code']}" if row.get("exit_code") is not None else state)
        verdict = f"{exit_words}{took}: {what}{where}{message}{hint}"
    elif state in ("running", "starting", "stopping"):
        verdict = f"still {state}" + (f", {row['final_phase']}" if row.get("final_phase") else "")
    else:
        stop = f" (stopped by {row['stopped_by']})" if row.get("stopped_by") else ""
        exit_words = row.get("signal") or (f"exit {row['exit_code']}" if row.get("exit_code") is not None else state)
        verdict = f"{exit_words}{took}{stop}" + (f", last phase {row['final_phase']}" if row.get("final_phase") else "")
    # -- phase timeline --
    phases = [p for p in summary.get("phases") or [] if isinstance(p, dict)]
    timeline = []
    end = row.get("ended_at")
    for i, p in enumerate(phases):
        t = p.get("t")
        nxt = phases[i + 1].get("t") if i + 1 < len(phases) else end
        at = clock_text(t - started) if isinstance(t, (int, float)) and isinstance(started, (int, float)) else "?"
        dur = human_age(nxt - t) if isinstance(nxt, (int, float)) and isinstance(t, (int, float)) else "…"
        line = f" (line {p['line']:,})" if isinstance(p.get("line"), int) else ""
        timeline.append(f"{at:>8}  {str(p.get('phase')):<12} {dur:>7}{line}")
    if not phases:
        notes.append("no phase timeline: the run has no summary.json (an older runner, or it was killed early)")
    # -- alerts --
    alerts = []
    for e in read_jsonl(run_dir / "events.jsonl"):
        t = e.get("t")
        at = clock_text(t - started) if isinstance(t, (int, float)) and isinstance(started, (int, float)) else "?"
        if e.get("event") == "AlertRaised":
            alerts.append(f"{at:>8}  ⚠ {e.get('code')}: {e.get('message') or ''}")
        elif e.get("event") == "AlertCleared":
            alerts.append(f"{at:>8}  ✓ {e.get('code')} cleared")
        elif e.get("event") in ("StopRequested", "JobExited", "PivotRequested", "PivotStarted"):
            detail = ""
            if e.get("event") == "JobExited":
                detail = f" {e.get('signal') or e.get('exit_code')}"
            elif e.get("by"):
                detail = f" by {e.get('by')}"
            alerts.append(f"{at:>8}  · {e.get('event')}{detail}")
    # -- charts --
    series_doc = summary.get("timeline") if isinstance(summary.get("timeline"), dict) else None
    if not series_doc:
        samples = read_jsonl(run_dir / "samples.jsonl")
        if samples:
            series_doc, _ = timeline_from_samples(samples)
        else:
            notes.append("no samples.jsonl: no resource timeline")
    charts = _charts(series_doc or {})
    # -- the lines that matter --
    wanted: list[tuple[str, int]] = []
    if isinstance(row.get("failure_line"), int):
        wanted.append(("root cause", row["failure_line"]))
    analysis = summary.get("analysis") if isinstance(summary.get("analysis"), dict) else {}
    if isinstance(analysis.get("ready_line"), int):
        wanted.append(("ready", analysis["ready_line"]))
    for p in phases:
        if isinstance(p.get("line"), int) and p.get("phase") not in ("ready", "failed"):
            wanted.append((f"{p.get('phase')} began", p["line"]))
    total = _line_count(log_path) if log_path.exists() else 0
    for n in range(max(1, total - 2), total + 1):
        wanted.append(("last lines", n))
    texts = _read_lines(log_path, sorted({n for _, n in wanted}))
    seen: set[int] = set()
    lines = []
    for label, n in wanted:
        if n in texts and n not in seen:
            seen.add(n)
            lines.append(KeyLine(label, n, texts[n]))
    title = f"{row.get('job')} · run {row.get('run_id')}"
    return PostmortemView(title=title, verdict=verdict, failed=bool(row.get("failed")), log_path=log_path,
                          timeline=timeline, alerts=alerts, charts=charts, lines=lines, notes=notes)


def _charts(doc: dict) -> list[Chart]:
    series = doc.get("series") if isinstance(doc.get("series"), dict) else {}
    charts = []

    def add(key: str, label: str, fmt, hi: Optional[float] = None) -> None:
        values = series.get(key)
        if not isinstance(values, list):
            return
        nums = [v if isinstance(v, (int, float)) else None for v in values]
        known = [v for v in nums if v is not None]
        if not known:
            return
        peak = max(known)
        top = hi if hi is not None else (peak or 1.0)
        step = max(1, -(-len(nums) // CHART_WIDTH))
        # One cell per bucket group, at the group's peak: a spike must survive the narrowing.
        cells = [max((v for v in nums[i:i + step] if v is not None), default=None) for i in range(0, len(nums), step)]
        charts.append(Chart(label, tuple(cells), 0.0, top, f"peak {fmt(peak)}"))

    gpus = sorted({k.split(":")[0] for k in series if k.startswith("gpu") and ":" in k},
                  key=lambda g: int(g[3:]) if g[3:].isdigit() else 0)
    for gpu in gpus:
        add(f"{gpu}:mem", f"{gpu} mem", human_bytes)
        add(f"{gpu}:util", f"{gpu} util", lambda v: f"{v:.0f}%", 100.0)
    add("cpu_pct", "CPU", lambda v: f"{v:.0f}%")
    add("rss", "RSS", human_bytes)
    add("read_bps", "disk read", lambda v: f"{human_bytes(v)}/s")
    add("serving:gen_tokens_per_s", "gen tok/s", lambda v: f"{v:.1f}")
    add("serving:running", "running", lambda v: f"{v:.0f}")
    add("serving:kv_cache_pct", "KV cache", lambda v: f"{v:.0f}%", 100.0)
    return charts


class PostmortemBuilt(Message):
    def __init__(self, view: Optional[PostmortemView], error: Optional[str] = None) -> None:
        super().__init__()
        self.view = view
        self.error = error


class PostmortemScreen(Screen):
    """One run's post-mortem over its log; Enter on a line that matters shows it in the log pane."""

    DEFAULT_CSS = """
    PostmortemScreen #pm-verdict { height: auto; padding: 0 1; text-style: bold; }
    PostmortemScreen #pm-verdict.-failed { color: $error; background: $error 15%; }
    PostmortemScreen #pm-top { height: 1fr; }
    PostmortemScreen #pm-report { height: auto; max-height: 100%; border: round $primary; padding: 0 1;
                                  border-title-color: $foreground; border-title-style: bold; }
    PostmortemScreen #pm-lines { height: auto; max-height: 9; border: round $primary;
                                 border-title-color: $foreground; border-title-style: bold; }
    PostmortemScreen #pm-lines:focus { border: round $accent; }
    PostmortemScreen LogView { height: 1fr; border: round $primary; }
    PostmortemScreen LogView:focus-within { border: round $accent; }
    """

    BINDINGS = [
        Binding("escape", "close", "Back", id="postmortem.close"),
        Binding("R", "replay", "Replay", id="postmortem.replay", tooltip="play the run in the jobs view"),
        Binding("tab", "focus_next", "Lines / log", show=False, id="postmortem.focus"),
    ]

    def __init__(self, run_dir: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = Path(run_dir)
        self.view: Optional[PostmortemView] = None

    def compose(self) -> ComposeResult:
        yield Static(Text(f"post-mortem of {safe_text(str(self.run_dir), 200)} …"), id="pm-verdict")
        with Vertical(id="pm-top"):
            with VerticalScroll(id="pm-report"):
                yield Static("", id="pm-body")
            lines = OptionList(id="pm-lines")
            lines.border_title = "the lines that matter (Enter shows it in the log)"
            yield lines
        log = LogView(id="pm-log")
        yield log
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#pm-report").border_title = "timeline"
        self._build()

    @work(thread=True, exclusive=True, group="postmortem", exit_on_error=False)
    def _build(self) -> None:
        try:
            view = build_view(self.run_dir)
        except OSError as exc:          # a deleted or unreadable run dir
            self.post_message(PostmortemBuilt(None, str(exc)))
            return
        except Exception as exc:       # a broken run is said in one line
            self.post_message(PostmortemBuilt(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(PostmortemBuilt(view))

    @on(PostmortemBuilt)
    def _built(self, message: PostmortemBuilt) -> None:
        verdict = self.query_one("#pm-verdict", Static)
        if message.view is None:
            verdict.update(Text(safe_text(f"no post-mortem: {message.error}", 500)))
            verdict.add_class("-failed")
            return
        view = self.view = message.view
        verdict.update(Text(safe_text(view.verdict, 600)))
        verdict.set_class(view.failed, "-failed")
        self.query_one("#pm-report").border_title = safe_text(view.title, 80)
        self.query_one("#pm-body", Static).update(self._report_text(view))
        options = self.query_one("#pm-lines", OptionList)
        options.clear_options()
        for key_line in view.lines:
            # Job output: Text, never markup.
            label = Text(f"{key_line.line:>8,}  {key_line.label:<14} ", style="bold")
            label.append(safe_text(key_line.text, 300), style="")
            options.add_option(Option(label, id=str(key_line.line)))
        log = self.query_one(LogView)
        log.open(view.log_path, title=safe_text(view.title, 80))
        if view.lines:
            options.focus()
            options.highlighted = 0

    def _report_text(self, view: PostmortemView) -> Text:
        out = Text()
        variables = self.app.get_css_variables()
        accent = variables.get("accent", "")
        muted = variables.get("text-muted", "")
        if view.timeline:
            out.append("phases\n", style="bold")
            for line in view.timeline:
                out.append(safe_text(line, 200) + "\n")
        if view.alerts:
            out.append("alerts and events\n", style="bold")
            for line in view.alerts:
                out.append(safe_text(line, 300) + "\n")
        if view.charts:
            out.append("resources over the run\n", style="bold")
            width = max(len(c.label) for c in view.charts)
            for chart in view.charts:
                out.append(f"{chart.label:<{width}}  ")
                out.append(sparkline(chart.values, min(CHART_WIDTH, len(chart.values)), chart.lo, chart.hi),
                           style=accent if accent.startswith("#") else "")
                out.append(f"  {chart.text}\n")
        for note in view.notes:
            out.append(safe_text(note, 300) + "\n", style=muted if muted.startswith("#") else "dim")
        out.rstrip()
        return out

    @on(OptionList.OptionSelected, "#pm-lines")
    def _line_chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        line = int(event.option.id or 0)
        self.jump_to_line(line)

    def jump_to_line(self, line: int, attempts: int = 50) -> None:
        """Show 1-based `line` of the run's log in the log pane, marked."""
        pane = self.query_one(LogView).pane
        target = max(0, line - 1)
        if pane.line_count > target:
            pane.show_line(target)
        elif attempts > 0:
            # The log is still being indexed (a big one takes a moment): jump once it reaches that line.
            self.set_timer(0.1, lambda: self.jump_to_line(line, attempts - 1))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_replay(self) -> None:
        replay = getattr(self.app, "replay_runs", None)
        if replay is not None:
            self.dismiss(None)
            replay([self.run_dir])
