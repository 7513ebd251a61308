"""The hosts view, the fleet overview: one row per box (this one, then hosts.toml's) and one tab per box.

Each row: the link (LIVE, STALE or DOWN with the age of the data and why), GPUs busy of
total, jobs running / stalled / failed, alerts. Enter on a row (or in a box's tab) enters
that box — the console's views then show it (`app.switch_box`), as k9s enters a context.
A remote box's tab keeps its quick actions (`s` / `x` on a picked job, through the fleet).

Nothing here touches the network: the core's Fleet polls the remote hosts on its own
thread, the app publishes `fleet.views()` (instant) on a timer, and switching tabs only
re-draws what is already cached. A dead host shows DOWN with the age of its last data.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static, Tab, Tabs

from gpudeck.console.compositor import DeckScreen

from gpudeck.console.format import human_age, safe_text
from gpudeck.console.readonly import actions_off, refusal
from gpudeck.console.screens.confirm import ConfirmScreen
from gpudeck.console.widgets.rows_table import Cell, Column, RowsTable

OVERVIEW = "overview"
TAIL_JOBS = 3           # log tails under a remote host's jobs
TAIL_LINES = 20
TAIL_EVERY_S = 2.0      # a shown tab refreshes its tails this often (off the UI thread, from the fleet)
_GIB = 1 << 30
BUSY_UTIL = 10.0        # a GPU is busy when a process holds it or its utilisation is at least this (%)


def link_cell(summary: dict) -> tuple[str, str]:
    """LIVE; STALE 14s (amber past 10 s, red past 60 s); DOWN 2m (retry in 8s); CONNECTING."""
    link = summary["link"]
    age = summary.get("data_age_s")
    if link == "LIVE":
        return ("LIVE", "bold $success")
    if link == "CONNECTING":
        return ("CONNECTING", "$text-muted")
    text = link + (f" {human_age(age)}" if age is not None else "")
    if link == "DOWN" and summary.get("retry_in_s") is not None:
        text += f" (retry {summary['retry_in_s']:.0f}s)"
    level = summary.get("age_level")
    return (text, "bold $error" if level == "red" or link == "DOWN" else "bold $warning" if level == "amber" else "")


def fleet_counts(status: Optional[dict], jobs: Optional[dict]) -> dict:
    """What a fleet row counts from a box's cached payloads: GPUs busy of total, jobs running / stalled / failed
    (the jobs view's own health words). Whatever the box sent, this only counts: nothing here is shown raw."""
    from gpudeck.jobs.view import job_views
    gpus = [g for g in ((status or {}).get("gpus") or []) if isinstance(g, dict)]

    def busy(gpu: dict) -> bool:
        util = gpu.get("util")
        return bool(gpu.get("processes")) or (isinstance(util, (int, float)) and util >= BUSY_UTIL)
    views = job_views(jobs) if jobs is not None else []
    return {"gpus": len(gpus), "gpus_busy": sum(1 for g in gpus if busy(g)),
            "running": sum(1 for j in views if j.live), "stalled": sum(1 for j in views if j.health == "stalled"),
            "failed": sum(1 for j in views if j.health == "failed"), "jobs_known": jobs is not None}


def overview_cells(summary: dict, counts: Optional[dict] = None, current: bool = False) -> tuple[Cell, ...]:
    """A fleet row: box (▸ the one the console shows), link, GPUs busy/total, GPU memory, jobs running /
    stalled / failed, alerts, and why the link is not LIVE (else where the box is)."""
    counts = counts if counts is not None else {"gpus": summary.get("gpus") or 0, "gpus_busy": None,
                                                "running": summary.get("jobs_running") or 0, "stalled": 0,
                                                "failed": summary.get("jobs_failed") or 0, "jobs_known": True}
    gpus = counts["gpus"]
    busy = counts.get("gpus_busy")
    gpu_text = (f"{busy}/{gpus}" if busy is not None else f"{gpus}") if gpus else "-"
    mem = ("-" if not summary.get("gpu_mem_total") else
           f"{summary['gpu_mem_used'] / _GIB:.0f}/{summary['gpu_mem_total'] / _GIB:.0f} GiB")
    alerts = summary.get("alerts") or 0
    note = safe_text(summary.get("error") or summary.get("ssh") or "this machine", 200)
    if summary.get("simulated"):
        note = "SIMULATED · " + note
    name = safe_text(str(summary["host"]), 80)

    def count(n: int, style: str) -> Cell:
        if not counts.get("jobs_known"):
            return "-"
        return (str(n), style) if n else "0"
    return (("▸ " + name, "bold") if current else "  " + name, link_cell(summary), gpu_text, mem,
            count(counts["running"], ""), count(counts["stalled"], "bold $warning"),
            count(counts["failed"], "bold $error"), (str(alerts), "bold $warning") if alerts else "0",
            (note, "$error") if summary.get("error") else note)


class HostsTable(RowsTable):
    """One row per box: link, GPUs busy/total, GPU memory, jobs running / stalled / failed, alerts, why / where."""

    COLUMNS = (Column("box", 16), Column("link", 22), Column("GPUs", 6, right=True), Column("GPU mem", 14),
               Column("run", 4, right=True), Column("stall", 5, right=True), Column("fail", 4, right=True),
               Column("alerts", 6, right=True), Column("why / where"))
    EMPTY = "no boxes"


def shown_box(app: Any) -> str:
    """The name of the box the console shows (this machine until another is entered)."""
    box = getattr(app, "box", None)
    return str(getattr(box, "name", None) or "local")


def detail_text(summary: dict, status: Optional[dict], jobs: Optional[dict], agent: dict,
                tails: Optional[dict] = None) -> Text:
    """A host's tab: its link, its GPUs and host (as `status` prints them) and its jobs (as `jobs` prints them)."""
    from gpudeck.jobs.telemetry.status import render_status_text, snapshot_from_payload
    from gpudeck.console.commands.jobs_list import table_lines
    from gpudeck.jobs.view import job_views
    out = Text()
    link_text, link_style = link_cell(summary)
    out.append(f"{summary['host']}  ", style="bold")
    out.append(link_text, style=link_style.replace("$success", "green").replace("$error", "red")
               .replace("$warning", "yellow").replace("$text-muted", "dim"))
    if summary.get("ssh"):
        out.append(f"  {safe_text(summary['ssh'], 200)}")
    if agent:
        out.append(f"  agent {safe_text(str(agent.get('via')))} on Python {safe_text(str(agent.get('python')))}",
                   style="dim")
        if agent.get("readonly") is True:
            out.append("  READ-ONLY", style="bold")
    out.append("\n")
    if summary.get("error"):
        out.append(safe_text(summary["error"], 400) + "\n", style="red")
    if status:
        source = status.get("source") or {}
        if source:
            out.append(f"GPU via {safe_text(str(source.get('gpu')))}, host via {safe_text(str(source.get('host')))}\n",
                       style="dim")
        for line in render_status_text(snapshot_from_payload(status)).splitlines():
            out.append(safe_text(line, 400) + "\n")
    else:
        out.append("no telemetry yet\n", style="dim")
    out.append("\n")
    if jobs is not None:
        for line in table_lines(job_views(jobs), time.time()):
            out.append(safe_text(line, 400) + "\n")
    for (job, run_id), lines in (tails or {}).items():
        out.append(f"\n── {safe_text(job, 80)} (run {safe_text(run_id, 80)}): last {len(lines)} lines ──\n",
                   style="bold")
        for line in lines:
            out.append(line + "\n")
    return out


def _tail_jobs(jobs: Optional[dict]) -> list[dict]:
    """The jobs whose log tails a host tab shows: live ones first, at most TAIL_JOBS."""
    records = [j for j in (jobs or {}).get("jobs") or [] if j.get("run_id")]
    records.sort(key=lambda j: (j.get("state") not in ("starting", "running", "stopping"), -(j.get("started_at") or 0)))
    return records[:TAIL_JOBS]


class HostsScreen(DeckScreen):
    """Tabs: the fleet overview, then one per box (local first). Follows the app's hosts feed."""

    DEFAULT_CSS = """
    HostsScreen #host-detail-scroll { height: 1fr; }
    HostsScreen #host-detail { padding: 0 1; }
    HostsScreen.-overview #host-detail-scroll { display: none; }
    HostsScreen.-detail #hosts-table { display: none; }
    """

    BINDINGS = [
        Binding("enter", "enter_box", "Enter box", id="hosts.enter",
                tooltip="show this box in every view (dashboard, jobs, history, post-mortem, replay)"),
        Binding("left", "tab(-1)", "Prev host", id="hosts.tab.prev"),
        Binding("right", "tab(1)", "Next host", id="hosts.tab.next"),
        Binding("j", "pick_job(1)", "Next job", id="hosts.job.next"),
        Binding("k", "pick_job(-1)", "Prev job", id="hosts.job.prev"),
        Binding("s", "start_job", "Start", id="hosts.job.start"),
        Binding("x", "stop_job", "Stop", id="hosts.job.stop"),
        # With actions off (--demo, --readonly, a readonly host's tab) s and x say why they do nothing
        # (check_action hides the real ones then).
        Binding("s,x", "actions_refused", "", show=False, id="hosts.actions.refused"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.selected = OVERVIEW
        self.renders = 0                   # detail re-draws (tests)
        self._tails: dict[str, dict] = {}          # host -> {(job, run_id): [lines]}
        self.picked: dict[str, str] = {}           # host -> the job s / x act on
        self._tails_asked: dict[str, float] = {}   # host -> when its tails were last asked for

    def compose(self) -> ComposeResult:
        yield Tabs(Tab("fleet", id=f"tab-{OVERVIEW}"), id="host-tabs")
        yield HostsTable(id="hosts-table")
        with VerticalScroll(id="host-detail-scroll"):
            yield Static("", id="host-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.set_class(True, "-overview")
        self.query_one(HostsTable).focus()
        jobs = getattr(self.app, "jobs_feed", None)
        if jobs is not None:
            jobs.follow(self, lambda _snapshot: None)     # the local row counts this box's jobs
        feed = getattr(self.app, "hosts_feed", None)
        if feed is not None:
            feed.follow(self, self.apply_hosts)
        boxes = getattr(self.app, "box_feed", None)        # another box entered: its row gets the ▸ at once
        if boxes is not None:
            boxes.follow(self, lambda _box: self.apply_hosts(self._hosts) if hasattr(self, "_hosts") else None)
        wanted = getattr(self.app, "initial_host", None)
        if wanted:
            self.call_after_refresh(self.select, wanted)

    def apply_hosts(self, hosts: dict) -> None:
        tabs = self.query_one(Tabs)
        have = {tab.id for tab in tabs.query(Tab)}
        for name in hosts:
            if f"tab-{name}" not in have:
                tabs.add_tab(Tab(name, id=f"tab-{name}"))
        current = shown_box(self.app)
        table = self.query_one(HostsTable)
        table.sync({name: overview_cells(h["summary"], fleet_counts(h.get("status"), h.get("jobs")), name == current)
                    for name, h in hosts.items()}, f"fleet ({len(hosts)}) · Enter: enter a box", False)
        if table.cursor_key is None and hosts:
            keys = table.row_keys
            table.action_cursor_to(keys.index(current) if current in keys else 0)
        self._hosts = hosts
        if self.selected != OVERVIEW:
            self._draw_detail()

    def select(self, name: str) -> None:
        tabs = self.query_one(Tabs)
        if tabs.query(f"#tab-{name}"):
            tabs.active = f"tab-{name}"

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        self.selected = (event.tab.id or f"tab-{OVERVIEW}")[len("tab-"):]
        overview = self.selected == OVERVIEW
        self.set_class(overview, "-overview")
        self.set_class(not overview, "-detail")
        if not overview:
            self._draw_detail()
        self.refresh_bindings()           # a readonly host's tab offers no s / x

    def _draw_detail(self) -> None:
        host = getattr(self, "_hosts", {}).get(self.selected)
        widget = self.query_one("#host-detail", Static)
        if host is None:
            widget.update(Text(f"{self.selected}: no data yet", style="dim"))
        else:
            text = detail_text(host["summary"], host.get("status"), host.get("jobs"), host.get("agent") or {},
                               self._tails.get(self.selected))
            job = self._picked_job()
            if job is not None and self.selected != "local":
                keys = "j/k choose · actions off" if self._actions_off() else "j/k choose · s start · x stop"
                text.append(f"\nselected: {safe_text(job['name'], 80)} ({safe_text(str(job.get('state')), 32)})  "
                            f"{keys}\n", style="bold")
            widget.update(text)
            self._ask_tails(self.selected, host.get("jobs"))
        self.renders += 1

    def _ask_tails(self, name: str, jobs: Optional[dict]) -> None:
        """Ask the fleet (its thread, its link) for the shown host's log tails; the answer redraws the tab."""
        feed = getattr(self.app, "hosts_feed", None)
        fleet = getattr(feed, "fleet", None)
        if fleet is None or name not in fleet.specs_by_name or time.monotonic() - self._tails_asked.get(name, 0) < TAIL_EVERY_S:
            return
        self._tails_asked[name] = time.monotonic()
        wanted = _tail_jobs(jobs)
        if not wanted:
            self._tails.pop(name, None)
            return
        from gpudeck.jobs.logs.sanitize import sanitize_block
        futures = [(j["name"], fleet.call(name, "logs", {"job": j["name"], "run": j["run_id"], "tail": TAIL_LINES},
                                          timeout=10, retry=True, wake=False)) for j in wanted]

        def collect() -> None:
            tails = {}
            for job, fut in futures:
                try:
                    reply = fut.result(timeout=15)
                except Exception:  # noqa: BLE001 - a lost link: the tab keeps its last tails
                    return
                import base64
                tails[(job, reply["run_id"])] = sanitize_block(base64.b64decode(reply.get("data") or ""))[-TAIL_LINES:]
            self.app.call_later(self._store_tails, name, tails)

        self.run_worker(collect, thread=True, group="host-tails", exit_on_error=False)

    def _store_tails(self, name: str, tails: dict) -> None:
        self._tails[name] = tails
        if self.selected == name:
            host = getattr(self, "_hosts", {}).get(name)
            if host is None:
                return
            # (tails come from a worker thread: the screen may have been left, its widgets gone, meanwhile)
            for widget in self.query("#host-detail").results(Static):
                widget.update(detail_text(host["summary"], host.get("status"), host.get("jobs"),
                                          host.get("agent") or {}, tails))

    # -- entering a box: the console's views show it (the app's box switcher) -------------------
    def target_box(self) -> Optional[str]:
        """The box Enter enters: the overview's cursor row, or the box whose tab is shown."""
        if self.selected != OVERVIEW:
            return self.selected
        return self.query_one(HostsTable).cursor_key

    def action_enter_box(self) -> None:
        name = self.target_box()
        if name is None:
            self.notify("no box selected", severity="warning", timeout=3, markup=False)
            return
        switch = getattr(self.app, "switch_box", None)
        if switch is None:
            self.notify("this console cannot enter another box", severity="warning", timeout=4, markup=False)
            return
        switch(name)

    def action_tab(self, delta: int) -> None:
        tabs = self.query_one(Tabs)
        tabs.action_previous_tab() if delta < 0 else tabs.action_next_tab()

    # -- acting on a remote host's jobs (through the fleet: never on the UI thread) -----------
    def _actions_off(self) -> Optional[str]:
        """Why s / x do nothing on the shown tab (the console's demo / read-only, or the host's own), else None."""
        off = actions_off(self.app)
        if off is not None:
            return refusal(self.app, "a demo reaches no real host")
        feed = getattr(self.app, "hosts_feed", None)
        spec = next((s for s in getattr(feed, "specs", None) or [] if s.name == self.selected), None)
        if spec is not None and spec.readonly:
            return safe_text(f"actions off: read-only (host {spec.name} has readonly = true in hosts.toml)", 300)
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("start_job", "stop_job"):
            return self._actions_off() is None
        if action == "actions_refused":
            return self._actions_off() is not None
        return True

    def action_actions_refused(self) -> None:
        self.notify(self._actions_off() or "actions off", severity="warning", timeout=3, markup=False)

    def _jobs_of(self, name: str) -> list[dict]:
        host = getattr(self, "_hosts", {}).get(name) or {}
        return [j for j in (host.get("jobs") or {}).get("jobs") or [] if isinstance(j, dict) and j.get("name")]

    def _picked_job(self) -> Optional[dict]:
        jobs = self._jobs_of(self.selected)
        if not jobs:
            return None
        name = self.picked.get(self.selected)
        return next((j for j in jobs if j["name"] == name), jobs[0])

    def action_pick_job(self, delta: int) -> None:
        jobs = self._jobs_of(self.selected)
        current = self._picked_job()
        if not jobs or current is None:
            return
        names = [j["name"] for j in jobs]
        self.picked[self.selected] = names[(names.index(current["name"]) + delta) % len(names)]
        self._draw_detail()

    def _remote_target(self) -> Optional[tuple[Any, str, dict]]:
        if self._actions_off() is not None:       # no confirmation opens, no request is sent
            self.action_actions_refused()
            return None
        fleet = getattr(getattr(self.app, "hosts_feed", None), "fleet", None)
        if self.selected in (OVERVIEW, "local"):
            self.notify("local jobs are started and stopped in the jobs view (key 2)", timeout=4, markup=False)
            return None
        job = self._picked_job()
        if fleet is None or job is None:
            self.notify(safe_text(f"{self.selected}: no jobs known yet", 200), timeout=3, markup=False)
            return None
        return fleet, self.selected, job

    def action_start_job(self) -> None:
        target = self._remote_target()
        if target is not None:
            fleet, host, job = target
            self._act(fleet, host, "start", job["name"])

    def action_stop_job(self) -> None:
        target = self._remote_target()
        if target is None:
            return
        fleet, host, job = target
        name = job["name"]
        lines = [f"host {host}, run {job.get('run_id') or '-'}, pid {job.get('pid') or '-'} ({job.get('state')})",
                 "Stop signal to its process group, SIGKILL after its stop_timeout, then verified on the box:",
                 "no process of the run left, port free, GPU memory released."]
        self.app.push_screen(ConfirmScreen(safe_text(f"Stop {name} on {host}?", 200),
                                           [safe_text(line, 300) for line in lines],
                                           confirm_label="Stop"),
                             lambda yes: self._act(fleet, host, "stop", name) if yes else None)

    def _act(self, fleet: Any, host: str, op: str, job: str) -> None:
        # The job's name comes from the box: shown as written, never parsed as markup.
        self.notify(safe_text(f"{op} {job} on {host}…", 300), timeout=2, markup=False)
        future = fleet.call(host, op, {"job": job}, timeout=600, retry=False)

        def wait() -> None:
            try:
                reply = future.result(timeout=620)
            except Exception as exc:  # noqa: BLE001 - a lost link or a refusal: one line, the view stays
                self.app.call_later(self.notify, safe_text(f"{op} {job} on {host}: {exc}", 300),
                                    severity="error", timeout=8, markup=False)
                return
            if op == "start":
                text, severity = f"started {job} on {host} (run {reply.get('run_id')})", "information"
            else:
                text = "; ".join(reply.get("lines") or [f"stopped {job} on {host}"])
                severity = "information" if reply.get("clean") else "error"
            self.app.call_later(self.notify, safe_text(text, 400), severity=severity, timeout=6, markup=False)
            feed = getattr(self.app, "hosts_feed", None)
            if feed is not None:
                self.app.call_later(feed.publish_now)

        self.run_worker(wait, thread=True, group="host-action", exit_on_error=False)
