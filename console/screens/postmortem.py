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
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from gpudeck.console.compositor import DeckScreen

from gpudeck.console.format import safe_text
from gpudeck.console.widgets.log_view import LogView

CHART_WIDTH = 48


@dataclass(frozen=True)
class Chart:
    label: str
    spark: str                    # the sparkline (or the phase strip), CHART_WIDTH cells at most
    text: str                     # the numbers beside it: "peak 136.2 GiB"


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
    log_path: Optional[Path]
    timeline: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    lines: list[KeyLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # what is missing from the run, said plainly
    stacks: list[str] = field(default_factory=list)     # each stack dump: when, on which alert, its verdict, its groups


def view_of(report: dict) -> PostmortemView:
    """The screen's words for a post-mortem report (gpudeck.jobs.history.postmortem), the same data
    `gpudeck postmortem` prints; every text from the job passes safe_text where it is shown."""
    from gpudeck.jobs.history.charts import chart_groups, fmt_value, phase_strip, stall_stacks_note
    from gpudeck.jobs.history.charts import sparkline as spark
    from gpudeck.jobs.history.postmortem import clock, span

    source = report.get("source") or {}
    outcome = report.get("outcome") or {}
    title = f"{source.get('job') or '?'} · run {source.get('run_id') or '?'}"
    timeline = []
    for p in report.get("phases") or []:
        line = f" (line {p['line']:,})" if isinstance(p.get("line"), int) else ""
        dur = span(p["duration_s"]) if p.get("duration_s") is not None else ""
        timeline.append(f"{clock(p.get('start_s')):>8}  {str(p.get('phase')):<12} {dur:>12}{line}")
    for st in report.get("stalls") or []:
        how = "" if st.get("cleared") else " (never cleared)"
        timeline.append(f"{clock(st.get('start_s')):>8}  {st.get('code')} for {span(st.get('duration_s'))}{how}")
        note = stall_stacks_note(st)
        if note:
            timeline.append(f"          {note}")
    for gap in report.get("silences") or []:
        timeline.append(f"{clock(gap.get('start_s')):>8}  log silent for {span(gap.get('duration_s'))}")
    alerts = []
    for a in report.get("alerts") or []:
        cleared = " (cleared)" if a.get("cleared") is not None else ""
        alerts.append(f"{clock(a.get('at_s')):>8}  ⚠ {a.get('code')}{cleared}: {a.get('message') or ''}")
    for e in report.get("events") or []:
        if e.get("event") in ("JobStarted",):
            continue
        alerts.append(f"{clock(e.get('at_s')):>8}  · {e.get('event')} {e.get('detail') or ''}")
    context = report.get("context") or {}
    for key in ("pivot", "stopped_by"):
        if context.get(key):
            alerts.append(f"{key.replace('_', ' ')}: {context[key]}")
    pipeline = context.get("pipeline")
    if isinstance(pipeline, dict) and pipeline.get("target"):
        alerts.append(f"pipeline {pipeline.get('id')} to {pipeline.get('target')}: "
                      f"{', '.join(pipeline.get('stages') or [])}")
    history = report.get("history") or {}
    if history.get("same_failure") and history["same_failure"][0]:
        k, n = history["same_failure"]
        alerts.append(f"same failure in {k} of the last {n} runs")
    if history.get("median_load_s") is not None and history.get("load_s") is not None:
        alerts.append(f"load time {clock(history['load_s'])} vs median {clock(history['median_load_s'])} "
                      f"of {history.get('load_runs')} earlier runs")
    stacks = []
    for d in report.get("stacks") or []:
        what = d.get("verdict") or f"no verdict: {d.get('error') or '?'}"
        stacks.append(f"{clock(d.get('at_s')):>8}  stacks on {d.get('code')}: {what}")
        stacks += [f"          {line}" for line in d.get("lines") or []]
        if d.get("lines_left_out"):
            stacks.append(f"          … {d['lines_left_out']} more lines in {d.get('path')}")
    charts = []
    groups = chart_groups(report)
    if groups:
        strip = phase_strip(report, groups[0].get("t") or [], CHART_WIDTH)
        if strip:
            charts.append(Chart("phases", strip, ""))
    for group in groups:
        for label, values in group["lines"]:
            present = [v for v in values if v is not None]
            if not present or not max(present):
                continue                  # a flat zero (no GPU memory taken) says nothing
            hi = 100.0 if group["unit"] == "pct" else (1.0 if group["unit"] == "ratio" else None)
            text = spark(list(values), CHART_WIDTH, 0.0, hi)
            charts.append(Chart(f"{group['title']} {label}" if label not in group["title"] else group["title"],
                                text, f"peak {fmt_value(max(present), group['unit'])}"))
    lines = []
    for item in report.get("lines") or []:
        text = next((c.get("text") for c in item.get("context") or [] if c.get("key")), "")
        lines.append(KeyLine(str(item.get("label") or "line"), int(item["line"]), str(text or "")))
    known = {k.line for k in lines}
    for item in report.get("last_lines") or []:
        if isinstance(item.get("line"), int) and item["line"] not in known:
            lines.append(KeyLine("last lines", item["line"], str(item.get("text") or "")))
    lines.sort(key=lambda k: k.line)
    log = source.get("log") or (str(Path(str(source.get("path") or "")) / "output.log") if source.get("path") else "")
    return PostmortemView(title=title, verdict=str(report.get("verdict") or ""), failed=bool(outcome.get("failed")),
                          log_path=Path(log) if log else None, timeline=timeline, alerts=alerts, charts=charts,
                          lines=lines, notes=[str(m) for m in report.get("missing") or []], stacks=stacks)


def build_view(run_dir: Path) -> PostmortemView:
    """The post-mortem of a run directory from the core (blocking: the screen calls it in a worker)."""
    from gpudeck.jobs.history.postmortem import build_run
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: the run directory is gone")
    return view_of(build_run(run_dir))


def box_view(box: Any, target: str) -> PostmortemView:
    """The post-mortem of `target` (a run's path on the box, or its run id) as the box reports it
    (`box.postmortem`, built on the box that holds the run; blocking). A remote box's report names
    files of that box: its log is never opened here (the screen fetches the run's record instead)."""
    view = view_of(box.postmortem(target).report)
    if not getattr(box, "local", True):
        view.log_path = None
    return view


class PostmortemBuilt(Message):
    def __init__(self, view: Optional[PostmortemView], error: Optional[str] = None) -> None:
        super().__init__()
        self.view = view
        self.error = error


class RecordFetched(Message):
    """A remote run's record copied here: its log can be shown (and the run replayed from it)."""
    def __init__(self, path: Optional[Path], error: Optional[str] = None) -> None:
        super().__init__()
        self.path = path
        self.error = error


class PostmortemScreen(DeckScreen):
    """One run's post-mortem over its log; Enter on a line that matters shows it in the log pane."""

    DEFAULT_CSS = """
    PostmortemScreen #pm-verdict { height: auto; padding: 0 1; text-style: bold; }
    PostmortemScreen #pm-verdict.-failed { color: $error; background: $error 15%; }
    PostmortemScreen #pm-left { height: auto; padding: 0 1; color: $warning; display: none; }
    PostmortemScreen #pm-left.-shown { display: block; }
    PostmortemScreen #pm-top { height: 1fr; }
    PostmortemScreen #pm-report { height: 1fr; border: round $primary; padding: 0 1;
                                  border-title-color: $foreground; border-title-style: bold; }
    PostmortemScreen #pm-lines { height: auto; max-height: 10; border: round $primary; text-wrap: nowrap;
                                 text-overflow: ellipsis; border-title-color: $foreground; border-title-style: bold; }
    PostmortemScreen #pm-lines:focus { border: round $accent; }
    PostmortemScreen LogView { height: 1fr; border: round $primary; }
    PostmortemScreen LogView:focus-within { border: round $accent; }
    """

    BINDINGS = [
        Binding("escape", "close", "Back", id="postmortem.close"),
        Binding("R", "replay", "Replay", id="postmortem.replay", tooltip="play the run in the jobs view"),
        Binding("tab", "focus_next", "Lines / log", show=False, id="postmortem.focus"),
    ]

    def __init__(self, run_dir: Optional[Path] = None, *, box: Any = None, job: Optional[str] = None,
                 run_id: Optional[str] = None, path: Optional[str] = None, **kwargs: Any) -> None:
        """The post-mortem of a run directory read here (`run_dir`: --demo's recorded runs), or of the run
        `job`/`run_id` of `box` (its `path` there names it exactly), reported by the box itself."""
        super().__init__(**kwargs)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.box = box
        self.job = job
        self.run_id = run_id
        self.path = path
        self.view: Optional[PostmortemView] = None
        self.record: Optional[Path] = None        # a remote run's record, copied here (its log, its replay)
        self.left_for: Optional[str] = None       # the box the console switched to, away from this run's box

    @property
    def remote(self) -> bool:
        return self.box is not None and not getattr(self.box, "local", True)

    def compose(self) -> ComposeResult:
        if self.run_dir is not None:
            what = str(self.run_dir)
        else:
            what = f"{self.job} run {self.run_id}" + (f" on {self.box.name}" if self.remote else "")
        yield Static(Text(f"post-mortem of {safe_text(what, 200)} …"), id="pm-verdict")
        yield Static("", id="pm-left", markup=False)
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
        feed = getattr(self.app, "box_feed", None)      # the box switcher's: this run's box may be left
        if feed is not None and self.box is not None:
            feed.follow(self, self._box_switched, while_hidden=True)

    def _box_switched(self, box: Any) -> None:
        """The console now shows another box: this run stays shown (it is still that box's), said so, and
        nothing more is asked of the box left (its link may be closed): R refuses until it is back."""
        mine, shown = getattr(self.box, "name", None), getattr(box, "name", None)
        self.left_for = shown if box is not None and shown != mine else None
        line = self.query_one("#pm-left", Static)
        line.update(safe_text(f"a run of box {mine}; the console now shows box {self.left_for} "
                              f"(Esc: {self.left_for}'s runs, b: back to {mine})", 300) if self.left_for else "")
        line.set_class(self.left_for is not None, "-shown")

    @work(thread=True, exclusive=True, group="postmortem", exit_on_error=False)
    def _build(self) -> None:
        from gpudeck.jobs.box import BoxError
        try:
            if self.box is None:
                view = build_view(self.run_dir or Path())
            else:
                if not self.remote and self.path and not Path(self.path).is_dir():
                    raise FileNotFoundError(f"{self.path}: the run directory is gone")
                view = box_view(self.box, self.path or self.run_id or str(self.job))
        except BoxError as exc:         # a run the box does not know, a dead link, a bad reply: one line
            self.post_message(PostmortemBuilt(None, str(exc)))
            return
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
        self.query_one("#pm-report").border_title = Text(safe_text(view.title, 80))   # a str would be markup
        self.query_one("#pm-body", Static).update(self._report_text(view))
        options = self.query_one("#pm-lines", OptionList)
        options.clear_options()
        for key_line in view.lines:
            # Job output: Text, never markup.
            label = Text(no_wrap=True, overflow="ellipsis")
            label.append(f"{key_line.line:>8,}  ", style="bold")
            label.append(f"{safe_text(key_line.label, 20):<14} ", style="bold" if key_line.label != "last lines" else "")
            label.append(safe_text(key_line.text, 300))
            options.add_option(Option(label, id=str(key_line.line)))
        if view.log_path is not None:
            self.query_one(LogView).open(view.log_path, title=safe_text(view.title, 80))
        elif self.remote:
            self._fetch_record()
        if view.lines:
            options.focus()
            # The cursor starts on the line an operator wants first: the root cause, if the log names one.
            ranked = [i for word in ("root cause", "first error") for i, k in enumerate(view.lines) if word in k.label]
            options.highlighted = ranked[0] if ranked else 0
            self.call_after_refresh(options.scroll_to_highlight)

    # -- a remote run: its record fetched here (off the UI thread) for the log pane and a replay ----------
    def _fetch_record(self) -> None:
        self.notify(safe_text(f"fetching the log of {self.job} run {self.run_id} from {self.box.name}…", 300),
                    timeout=3, markup=False)
        self._fetch(self.box, str(self.job), str(self.run_id))

    @work(thread=True, exclusive=True, group="postmortem-record", exit_on_error=False)
    def _fetch(self, box: Any, job: str, run_id: str) -> None:
        try:
            path = Path(box.run_record(job, run_id))
        except Exception as exc:  # noqa: BLE001 - BoxError (the link, a refusal) or a local OSError: one line
            self.post_message(RecordFetched(None, str(exc)))
            return
        self.post_message(RecordFetched(path))

    @on(RecordFetched)
    def _record_fetched(self, message: RecordFetched) -> None:
        if message.path is None:
            self.notify(safe_text(f"the log of {self.job} run {self.run_id}: {message.error}", 400),
                        severity="error", timeout=6, markup=False)
            return
        self.record = message.path
        title = safe_text(self.view.title if self.view is not None else f"{self.job} run {self.run_id}", 80)
        self.query_one(LogView).open(message.path / "output.log", title=title)

    def _report_text(self, view: PostmortemView) -> Text:
        out = Text()
        variables = self.app.get_css_variables()
        accent = variables.get("accent", "")
        muted = variables.get("text-muted", "")
        if view.timeline:
            out.append("phases\n", style="bold")
            for line in view.timeline:
                out.append(safe_text(line, 600) + "\n")       # a stall's dump verdict can be long
        if view.alerts:
            out.append("alerts and events\n", style="bold")
            for line in view.alerts:
                out.append(safe_text(line, 300) + "\n")
        if view.stacks:
            out.append("stack dumps\n", style="bold")
            for line in view.stacks:
                out.append(safe_text(line, 300) + "\n")
        if view.charts:
            out.append("resources over the run\n", style="bold")
            width = max(len(c.label) for c in view.charts)
            for chart in view.charts:
                out.append(f"{safe_text(chart.label, 40):<{width}}  ")
                out.append(chart.spark, style=accent if accent.startswith("#") and chart.label != "phases" else "")
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
        if getattr(self.app, "replay_runs", None) is None:
            return
        if self.box is None:
            self.dismiss(None)
            getattr(self.app, "replay_runs")([self.run_dir])
            return
        if self.left_for is not None:
            self.notify(safe_text(f"the console shows box {self.left_for}: b back to {self.box.name} "
                                  "to replay this run", 300), severity="warning", timeout=4, markup=False)
            return
        from gpudeck.console.replay import replay_from_box
        self.dismiss(None)
        # A remote run's record was fetched for the log pane: the replay's fetch takes only what grew.
        replay_from_box(self.app, self.box, [(str(self.job), str(self.run_id), self.path)])
