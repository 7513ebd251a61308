"""Issue 9, markup: no job-derived text is ever Textual markup — log lines, log search queries, alert toasts."""
from __future__ import annotations

from pathlib import Path

from textual.app import App

from gpudeck.console.screens.jobs import JobsScreen
from gpudeck.console.widgets.log_view import LogViewPane

from runsupport import pilot_test
from runsupport import pilot_wait_for as wait_for
from appsupport import LogApp

HOSTILE_LINES = [
    "[red]RED[/red] plain",
    "[@click=app.quit]click me[/]",
    "ValueError: bad path [/data/x]",
    "[b]bold?[/b] [link=https://evil.example]link[/link]",
]


@pilot_test
async def test_log_lines_and_search_queries_are_never_markup(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_text("\n".join(HOSTILE_LINES) + "\n")
    app = LogApp(path)
    async with app.run_test(size=(80, 12)) as pilot:
        pane = app.query_one(LogViewPane)
        await wait_for(pilot, lambda: pane.line_count == len(HOSTILE_LINES), "lines indexed")
        rows = [r.rstrip() for r in pane.visible_text()]
        for line in HOSTILE_LINES:
            assert line in rows, rows                     # shown as written, brackets and all
        # A query that is broken markup: searching and "no match" must not raise MarkupError.
        for query in ("[/zz]", "[@click=app.quit]nothing[/]", "[red]"):
            pane.start_search(query)
            await pilot.pause(0.2)
            pane.action_next_match()
            await pilot.pause(0.2)
        assert app.is_running and app.return_code is None
        shown = [n for n in app._notifications if "No match" in n.message]
        assert len(shown) == 2 and "[/zz]" in shown[0].message      # "[red]" matches line 1
        # Rendered as written: a toast with markup=True would run [@click=…] and eat [red].
        assert not any(n.markup for n in shown), [(n.message, n.markup) for n in shown]


ALERTING = [{"name": "crashy", "kind": "stage", "state": "exited", "pid": None, "run_id": "r1", "exit_code": 1,
             "started_at": 1.0, "ended_at": 2.0, "port": None, "port_open": None, "gpus": [], "phase": "failed",
             "progress": None, "alerts": [{"code": "crashed", "since": 1.5, "severity": "error",
                                           "message": "ValueError: bad path [/data/x] [@click=app.quit]q[/] [red]"}]}]


class _Sup:
    def latest(self, name: str):
        return None

    def spec(self, name: str):
        from gpudeck.jobs.spec import JobSpec
        return JobSpec(name=name, cmd="true")


@pilot_test
async def test_alert_toasts_with_markup_like_text_do_not_crash_the_console() -> None:
    payloads = iter([{"jobs": []}])

    def payload(_):
        return next(payloads, {"jobs": ALERTING})

    class JobsApp(App):
        def on_mount(self) -> None:
            self.push_screen(JobsScreen(supervisor=_Sup(), payload=payload, refresh_s=0.2, clock=lambda: 3.0))

    app = JobsApp()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: any("bad path" in str(getattr(n, "message", ""))
                                          for n in app._notifications), "the crash toast")
        await pilot.pause(0.3)
        assert app.is_running
        assert not any(n.markup for n in app._notifications if "bad path" in n.message)
