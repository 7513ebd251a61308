"""A post-mortem report from anywhere (a remote host's JSON above all) renders inert: hostile text in any field, or a field of the wrong type, adds no element, attribute, link, table cell or section to the HTML and the Markdown."""
from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from gpudeck.jobs.history import render_html, render_md

from browsersupport import browser  # noqa: F401  (session fixture)

T0 = 1_764_000_000.0

HTML_PAYLOADS = ('<meta http-equiv="refresh" content="0;url=https://evil.example/">',
                 '"><script>alert(1)</script>', "</code></pre></td><img src=x onerror=alert(1)>",
                 "'><svg onload=alert(1)>")
MD_PAYLOADS = ("a | b | c", "``` x ```", "`tick", "[x](javascript:alert(1))", "<img src=x onerror=alert(1)>",
               "line1\n## injected\n| a | b |\n- item", "*bold* </pre> ~~~")


def full_report() -> dict:
    """Every section a run's report has, with a few points of timeline (the shape `build_run` returns)."""
    t = [0.0, 5.0, 10.0, 15.0, 20.0]
    return {
        "version": 1, "verdict": "crashed after 12 s of loading: CUDA out of memory (line 8)", "build_s": 0.01,
        "source": {"kind": "run", "job": "engine", "run_id": "20251201-000000-00000", "path": "/r",
                   "log": "/r/output.log", "host": "box", "backend": "ssh", "command": "vllm serve m \\\n  --port 8000",
                   "gpus": [0, 1], "job_kind": "engine", "engine": "vllm"},
        "outcome": {"state": "exited", "exit_code": 1, "signal": "SIGTERM", "stopped_by": None, "failed": True,
                    "started_at": T0, "ended_at": T0 + 20, "duration_s": 20.0, "final_phase": "failed",
                    "load_s": None, "note": "a note", "slurm": {"job_id": "12", "state": "FAILED", "nodes": "n1"}},
        "failure": {"cause": "cuda_oom", "line": 8, "message": "CUDA out of memory", "hint": "lower it"},
        "analysis": {},
        "phases": [{"phase": "loading", "start_s": 0.0, "at": T0, "duration_s": 12.0, "line": 2},
                   {"phase": "ready", "start_s": 12.0, "at": T0 + 12, "duration_s": 8.0, "line": 5,
                    "recovered_errors": 2, "error_lines": [6, 7]},
                   {"phase": "failed", "start_s": 20.0, "at": T0 + 20, "duration_s": None, "line": 8}],
        "alerts": [{"code": "crashed", "raised": T0 + 20, "since": T0 + 20, "cleared": None, "message": "died",
                    "severity": "error", "cause": "cuda_oom", "hint": "h", "at_s": 20.0},
                   {"code": "stalled", "raised": T0 + 13, "since": T0 + 13, "cleared": T0 + 15, "message": "quiet",
                    "severity": "warning", "cause": None, "hint": None, "at_s": 13.0}],
        "stalls": [{"code": "stalled", "start_s": 13.0, "duration_s": 2.0, "cleared": True, "message": "quiet",
                    "stacks": "2 of 2 processes in a collective (torch.distributed.barrier) at train.py:20 (main)",
                    "stacks_at_s": 14.0}],
        "silences": [{"start": T0, "end": T0 + 400, "start_s": 0.0, "duration_s": 400.0}],
        "context": {"pipeline": {"id": "p1", "target": "serve", "state": "failed", "stages": ["a [ok]", "b [failed]"]},
                    "pivot": "started by pivot", "pivot_steps": ["stop x: ok (2 s)"], "stopped_by": "pipeline"},
        "resources": {"t": t, "width_s": 5.0,
                      "series": {"gpu0:mem": [1e9, 2e9, 3e9, 3e9, 1e9], "gpu1:mem": [1e9, 2e9, 3e9, 3e9, 2e9],
                                 "gpu0:util": [0, 50, 90, None, 0], "cpu_pct": [10, 20, 30, 40, 50],
                                 "rss": [1e8, 2e8, 3e8, 4e8, 5e8]},
                      "peaks": {"gpu_mem": {"0": 3e9, "1": 3e9}, "rss": 5e8}},
        "serving": {"t": t, "width_s": 5.0, "series": {"gen_tokens_per_s": [None, None, 50.0, 60.0, 0.0],
                                                       "running": [0, 0, 3, 4, 0]}},
        "lines": [{"label": "root cause", "line": 8, "context": [
            {"line": 7, "text": "before", "key": False}, {"line": 8, "text": "torch.OutOfMemoryError", "key": True}]}],
        "last_lines": [{"line": 7, "text": "before"}, {"line": 8, "text": "torch.OutOfMemoryError"}],
        "history": {"earlier_runs": 2, "last": [{"run_id": "r1", "failed": True, "cause": "cuda_oom", "load_s": 11.0},
                                                {"run_id": "r2", "failed": False, "cause": None, "load_s": 12.0}],
                    "failed_of_last": [1, 2], "same_failure": [1, 2], "median_load_s": 11.5, "load_runs": 2,
                    "load_s": 12.0},
        "missing": ["nothing"],
    }


def paths(value, prefix=()):
    """Every place a value sits in the report (containers too: a list can arrive as a string); long lists by their first items."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k)
            yield from paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield (*prefix, i)
            yield from paths(v, (*prefix, i))


def replaced(report: dict, path: tuple, payload) -> dict:
    out = copy.deepcopy(report)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = payload
    return out


def every_string(value, payload):
    """The report with every leaf (string, number, bool) replaced by `payload`."""
    if isinstance(value, dict):
        return {k: every_string(v, payload) for k, v in value.items()}
    if isinstance(value, list):
        return [every_string(v, payload) for v in value]
    return payload


def only_strings(value, payload):
    """The report with every string replaced by `payload`, numbers left (the layout the renderer draws stays)."""
    if isinstance(value, dict):
        return {k: only_strings(v, payload) for k, v in value.items()}
    if isinstance(value, list):
        return [only_strings(v, payload) for v in value]
    return payload if isinstance(value, str) else value


class Elements(HTMLParser):
    """The elements of a page: (tag, attribute names) of each, and every attribute's value."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, tuple[str, ...]]] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, tuple(sorted(name for name, _ in attrs))))
        self.attrs += [(tag, name, value or "") for name, value in attrs]

    handle_startendtag = handle_starttag


def _own_html() -> tuple[set, list]:
    own = Elements(render_html.render(full_report()))
    return set(own.elements), [a for a in own.attrs if a[0] == "meta"]


def check_html(page: str, own: set, own_meta: list, where) -> None:
    found = Elements(page)
    foreign = set(found.elements) - own
    assert not foreign, (where, foreign)
    # The renderer's own <meta>s only (charset, viewport, the CSP): none from job text.
    assert [a for a in found.attrs if a[0] == "meta"] == own_meta, where
    for tag, name, value in found.attrs:
        assert not name.startswith("on"), (where, tag, name)
        # Text in a title or aria-label is shown, never followed; nothing anywhere is fetched or navigated to.
        assert name not in ("href", "src", "xlink:href", "action", "formaction", "srcdoc"), (where, tag, name)


def test_html_every_field_hostile_or_of_the_wrong_type_adds_no_element_or_attribute():
    base = full_report()
    own, own_meta = _own_html()
    for path in paths(base):
        for payload in HTML_PAYLOADS:
            check_html(render_html.render(replaced(base, path, payload)), own, own_meta, path)
    for payload in HTML_PAYLOADS:
        check_html(render_html.render(every_string(base, payload)), own, own_meta, "every leaf")
        page = render_html.render(only_strings(base, payload))
        check_html(page, own, own_meta, "every string")
        assert "&lt;" in page


def test_html_line_numbers_from_a_remote_report_are_escaped():
    # The fields that were printed raw: a phase's log line, a context line's number, a last line's number.
    base = full_report()
    evil = HTML_PAYLOADS[0]
    report = replaced(replaced(replaced(base, ("phases", 0, "line"), evil), ("lines", 0, "context", 0, "line"), evil),
                      ("last_lines", 0, "line"), evil)
    page = render_html.render(report)
    assert "<meta http-equiv=\"refresh\"" not in page and "http-equiv=\"refresh\"" not in page


def _md_html(md: str) -> str:
    # GitHub-like: CommonMark with raw HTML allowed, GFM tables and strikethrough.
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)


def _table_cells(md: str) -> list[tuple[int, int]]:
    """(cells in the row, cells in its table's header) for every table row of the Markdown."""
    out, header = [], None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = len(re.findall(r"(?<!\\)\|", line)) - 1
        if header is None:
            header = cells
        out.append((cells, header))
    return out


def check_md(md: str, own: set, own_counts: dict, where) -> None:
    page = _md_html(md)
    found = Elements(page)
    foreign = set(found.elements) - own
    assert not foreign, (where, foreign)
    for tag in ("h2", "pre", "table", "tr", "ul"):
        extra = 1 if tag == "pre" else 0          # a command of several lines is fenced below the facts
        assert sum(1 for e in found.elements if e[0] == tag) <= own_counts[tag] + extra, (where, tag)
    assert not any(tag in ("a", "img", "script", "meta", "svg") for tag, _ in found.elements), where
    for cells, header in _table_cells(md):
        assert cells == header, (where, cells, header)


def test_markdown_every_field_hostile_or_of_the_wrong_type_stays_text():
    base = full_report()
    own_page = _md_html(render_md.render(base))
    own = Elements(own_page)
    own_set = set(own.elements)
    counts = {tag: sum(1 for e in own.elements if e[0] == tag) for tag in ("h2", "pre", "table", "tr", "ul")}
    for path in paths(base):
        for payload in MD_PAYLOADS:
            check_md(render_md.render(replaced(base, path, payload)), own_set, counts, path)
    for payload in MD_PAYLOADS:
        check_md(render_md.render(every_string(base, payload)), own_set, counts, "every leaf")
        check_md(render_md.render(only_strings(base, payload)), own_set, counts, "every string")


def test_markdown_fields_that_were_raw_are_escaped():
    # Phase names, GPU keys, run ids, error lines, signal, exit code, GPUs: each printed as text.
    base = full_report()
    evil = "<img src=x onerror=alert(1)>|[x](javascript:alert(1))"
    for path in (("phases", 0, "phase"), ("resources", "peaks", "gpu_mem"), ("history", "last", 0, "run_id"),
                 ("phases", 1, "error_lines"), ("outcome", "signal"), ("outcome", "exit_code"), ("source", "gpus")):
        value = {evil: 3e9} if path[-1] == "gpu_mem" else ([evil] if path[-1] in ("error_lines", "gpus") else evil)
        md = render_md.render(replaced(base, path, value))
        page = _md_html(md)
        assert "<img" not in page and "<a " not in page, path
        if path[-1] in ("phase", "gpu_mem", "run_id", "signal", "gpus"):
            assert r"\<img src=x onerror=alert(1)\>\|\[x\](javascript:alert(1))" in md, path


# --------------------------------------------------------------------------- item 16: the Markdown's own layout

def test_markdown_command_with_a_pipe_keeps_its_table_cell():
    report = replaced(full_report(), ("source", "command"), "python gen.py | tee out.log")
    md = render_md.render(report)
    assert r"| command | `python gen.py \| tee out.log` |" in md
    page = _md_html(md)
    assert "<code>python gen.py | tee out.log</code>" in page
    assert all(cells == header for cells, header in _table_cells(md))


def test_markdown_multi_line_command_keeps_its_lines():
    script = "set -e\ncd /work && make -j20\n./serve --port 8000"
    md = render_md.render(replaced(full_report(), ("source", "command"), script))
    assert "| command | 3 lines, below |" in md
    assert "```sh\nset -e\ncd /work && make -j20\n./serve --port 8000\n```" in md


def test_markdown_log_path_with_backticks_stays_in_its_code_span():
    md = render_md.render(replaced(full_report(), ("source", "log"), "/runs/a`b``c/output.log"))
    assert "| log | ```/runs/a`b``c/output.log``` |" in md
    assert "<code>/runs/a`b``c/output.log</code>" in _md_html(md)


@pytest.mark.parametrize("points", [14, 45, 60, 200])
def test_markdown_time_axis_is_as_wide_as_the_charts(points):
    report = full_report()
    t = [float(i * 10) for i in range(points)]
    report["resources"] = {"t": t, "width_s": 10.0, "series": {"cpu_pct": [float(i % 7) for i in range(points)],
                                                               "rss": [1e8 + i for i in range(points)]},
                           "peaks": {"rss": 1e8 + points}}
    report["serving"] = None
    md = render_md.render(report)
    block = md.split("## Timeline", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    chart = next(line for line in block if line.startswith("CPU"))
    axis = block[-1]
    spark = re.search(r"[▁▂▃▄▅▆▇█ ]+(?=  peak)", chart).group().strip(" ")
    start = chart.index(spark[0])
    width = min(points, 60)
    assert len(spark) <= width
    assert axis[:start].strip() == "" and len(axis) == start + width, (axis, chart)
    assert axis.rstrip().endswith(render_md.clock(t[-1])) and axis[start:].startswith("0:00")


# --------------------------------------------------------------------------- Chromium: the page stays put

def test_chromium_a_hostile_report_does_not_navigate(tmp_path, browser):  # noqa: F811
    away = tmp_path / "away.html"
    away.write_text("<html><body><p id=away>NAVIGATED-AWAY</p></body></html>")
    refresh = f'<meta http-equiv="refresh" content="0;url={away.as_uri()}">'
    # The check can fail: a page that carries the payload raw is navigated away.
    raw = tmp_path / "raw.html"
    raw.write_text(f"<html><head>{refresh}</head><body><p id=verdict>x</p></body></html>")
    assert "NAVIGATED-AWAY" in browser.load(raw).dom
    base = full_report()
    for name, report in (("every-string", only_strings(base, refresh)),
                         ("lines", replaced(replaced(replaced(base, ("phases", 0, "line"), refresh),
                                                     ("lines", 0, "context", 0, "line"), refresh),
                                            ("last_lines", 0, "line"), refresh))):
        page = tmp_path / f"{name}.html"
        page.write_text(render_html.render(report))
        loaded = browser.load(page)
        assert "NAVIGATED-AWAY" not in loaded.dom and 'id="verdict"' in loaded.dom, name
        assert loaded.problems == [], loaded.problems


# --------------------------------------------------------------------------- the remote path of the CLI

class _HostileBox:
    """A remote box whose agent answered `postmortem` with a hostile report (shape-valid, every string a payload)."""
    report: dict = {}
    local = False
    name = "box"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def postmortem(self, target=None):
        from gpudeck.jobs.box.results import Postmortem
        return Postmortem(report=self.report)


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_cli_postmortem_host_renders_the_remote_report_escaped(monkeypatch, tmp_path, fmt):
    import argparse

    from gpudeck.console.commands import _host
    from gpudeck.console.commands.postmortem import run_postmortem
    payload = HTML_PAYLOADS[0] if fmt == "html" else MD_PAYLOADS[4]
    base = full_report()
    _HostileBox.report = replaced(replaced(only_strings(base, payload), ("phases", 0, "line"), payload),
                                  ("last_lines", 0, "line"), payload)
    monkeypatch.setattr(_host, "open_box", lambda args: _HostileBox())
    out = tmp_path / f"r.{fmt}"
    args = argparse.Namespace(target="engine", format=fmt, output=str(out), host="box")
    assert run_postmortem(args) == 0
    body = out.read_text()
    if fmt == "html":
        own, own_meta = _own_html()
        check_html(body, own, own_meta, "remote")
    else:
        own = Elements(_md_html(render_md.render(base)))
        counts = {tag: sum(1 for e in own.elements if e[0] == tag) for tag in ("h2", "pre", "table", "tr", "ul")}
        check_md(body, set(own.elements), counts, "remote")
